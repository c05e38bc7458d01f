"""`gpuwatch report`: one GPU's case file, what a vendor's RMA desk asks for, as `<uuid>.html` and `<uuid>.json`.

Its own process (the agent never imports it): it reads the GPU now through the backends (identity, including what
the agent does not keep: board part number, InfoROM versions), the state dir read only (the fault ledger, the
probe baseline, the last diag run; the agent need not run), and, given --prometheus, the history only Prometheus
keeps (the probe against the GPU's fleet peers, XID counts, temperature, power and clocks around each fault).
The JSON twin is the document; the HTML page is rendered from it (gpuwatch.web.case_file), self-contained: inline
CSS and SVG, no script, nothing fetched.

Exit 0 when both files are written; 2 for a GPU this node does not have (the message lists those it has) or a
bad --prometheus URL; 69 when the output directory cannot be written, the vendor library cannot be used for a GPU
the ledger does not know either, or Prometheus did not answer (the case file is written all the same, saying so).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuwatch import __version__
from gpuwatch.backends.base import Backend, BackendUnavailable
from gpuwatch.cli import case_history, case_prometheus
from gpuwatch.cli.commands import gpu_findings
from gpuwatch.cli.repair_command import NotFound, find_gpu
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.core.exitcodes import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from gpuwatch.core.model import GpuIdentity, GpuReading, Vendor
from gpuwatch.judge.gpu_verdict import verdict_of
from gpuwatch.readers.kmsg import normalize_pci_bus_id
from gpuwatch.service.nodes import build_sources
from gpuwatch.state.ledger import LedgerView, read_ledger
from gpuwatch.web.case_file import render_case_file

CASE_FILE_KIND = "gpuwatch_case_file"
CASE_FILE_VERSION = 1
MAX_FAULT_PLOTS = 8  # the newest faults get their temperature, power and clocks plotted


@dataclasses.dataclass
class Found:
    """The GPU as the backends read it now (or only as the ledger remembers it)."""

    identity: GpuIdentity
    reading: GpuReading | None = None
    case_identity: dict[str, str | None] = dataclasses.field(default_factory=dict)
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    backend: str = ""
    note: str | None = None


class Unavailable(Exception):
    """Nothing to report from: the message says why and what to do."""


def report(config: Config, gpu: str, out_dir: Path, prometheus_url: str | None) -> int:
    if prometheus_url is not None and (problem := case_prometheus.url_problem(prometheus_url)) is not None:
        print(f"gpuwatch report: {problem}", file=sys.stderr)
        return EXIT_USAGE
    problem = _out_dir_problem(out_dir)
    if problem is not None:
        print(f"gpuwatch report: {problem}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    ledger = read_ledger(config.state_dir)
    sources = build_sources(config)
    try:
        found = _find(sources, ledger, gpu)
    except NotFound as exc:
        print(f"gpuwatch report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Unavailable as exc:
        print(f"gpuwatch report: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    now = time.time()
    document, prometheus_failed = _document(config, sources, ledger, found, prometheus_url, now)
    uuid = found.identity.uuid
    try:
        _write(out_dir / f"{uuid}.json", json.dumps(document, indent=2, sort_keys=True) + "\n")
        _write(out_dir / f"{uuid}.html", render_case_file(document))
    except OSError as exc:
        print(f"gpuwatch report: cannot write into {out_dir}: {exc}; choose another --out", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(f"GPU {found.identity.index} ({uuid}), serial {found.identity.serial or 'unknown'}:")
    print(f"  {out_dir / (uuid + '.html')}")
    print(f"  {out_dir / (uuid + '.json')}")
    if prometheus_failed:
        print(f"gpuwatch report: Prometheus did not answer: {prometheus_failed}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return EXIT_OK


def _out_dir_problem(out_dir: Path) -> str | None:
    """Why the case file cannot go into `out_dir` (made when missing), or None."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot make --out {out_dir}: {exc.strerror or exc}; choose a directory you can write"
    if not out_dir.is_dir():
        return f"--out {out_dir} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        return f"cannot write into --out {out_dir}: {exc.strerror or exc}; choose a directory you can write"
    return None


def _write(path: Path, text: str) -> None:
    """Atomically: a reader (a browser, a ticket system's upload) never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            os.fchmod(f.fileno(), 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ----- the GPU -----------------------------------------------------------------------------------------------------


def _matches(identity: GpuIdentity, gpu: str) -> bool:
    return identity.uuid == gpu or (gpu.isdigit() and identity.index == int(gpu))


def _find(sources: NodeSources, ledger: LedgerView, gpu: str) -> Found:
    """The GPU `gpu` names (an index or a UUID), read now; else as the ledger remembers it (a GPU lost or gone)."""
    seen: list[GpuIdentity] = []
    problems: list[str] = []
    for slot in sources.slots:
        try:
            backend: Backend = slot.factory()
            backend.open()
        except BackendUnavailable as exc:
            problems.append(f"{slot.name}: {exc}")
            continue
        try:
            readings = backend.poll(slow=True)
            seen += [r.identity for r in readings]
            reading = next((r for r in readings if _matches(r.identity, gpu)), None)
            if reading is not None:
                extra = backend.case_identity(reading.identity.uuid)
                return Found(reading.identity, reading, extra, backend.versions(), slot.name)
        except BackendUnavailable as exc:
            problems.append(f"{slot.name}: {exc}")
        finally:
            backend.close()
    try:
        record = find_gpu(ledger, gpu)
    except NotFound as exc:
        if problems:
            raise Unavailable("; ".join(problems) + " (and the fault ledger does not know the GPU)") from exc
        listing = ", ".join(f"{i.index} ({i.uuid})" for i in seen) or "none"
        raise NotFound(f"--gpu {gpu}: no such GPU on this node (GPUs read now: {listing}; the ledger: {exc})") from exc
    why = "; ".join(problems) if problems else "the backends do not read it now (lost, or moved out of this node)"
    vendor: Vendor = "nvidia" if record.uuid.startswith("GPU-") else "amd"  # NVML's UUIDs are GPU-<hex>
    identity = GpuIdentity(uuid=record.uuid, vendor=vendor, index=record.index, serial=record.serial)
    return Found(identity, note=f"no reading now: {why}; identity from the fault ledger")


# ----- the document ------------------------------------------------------------------------------------------------


def _document(
    config: Config,
    sources: NodeSources,
    ledger: LedgerView,
    found: Found,
    prometheus_url: str | None,
    now: float,
) -> tuple[dict[str, Any], str | None]:
    ident = found.identity
    record = ledger.record(ident.uuid)
    reading = found.reading
    held = ledger.open_faults(ident.uuid)
    findings = gpu_findings(reading, config.gpus.power_limit_watts) if reading is not None else []
    recovery = reading.sample.recovery_action if reading is not None and reading.sample is not None else None
    state, action, evidence = verdict_of(findings, recovery, held, now)
    counted: dict[str, dict[int, dict[str, float]]] = {}
    kernel = _kernel_log_xids(sources, ident)
    if kernel:
        counted["kernel log"] = kernel
    history: dict[str, Any] = {"note": "the probe against its fleet peers needs --prometheus URL"}
    around: list[dict[str, Any]] = []
    failed: str | None = None
    faults = record.faults if record is not None else ()
    if prometheus_url is not None:
        prom = case_prometheus.Prometheus(prometheus_url)
        try:
            counted["prometheus"] = case_prometheus.xids(prom, ident.uuid, now)
            history = case_prometheus.probe_history(prom, ident.uuid, ident.model, now)
            for fault in sorted(faults, key=lambda f: f.at)[-MAX_FAULT_PLOTS:]:
                around.append(
                    {"fault": fault.key, "at": fault.at, **case_prometheus.around(prom, ident.uuid, fault.at, now)}
                )
        except case_prometheus.PrometheusError as exc:
            failed = str(exc)
            history = {"note": f"Prometheus did not answer: {exc}"}
    document: dict[str, Any] = {
        "kind": CASE_FILE_KIND,
        "version": CASE_FILE_VERSION,
        "generated_timestamp": now,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now)),
        "gpuwatch_version": __version__,
        "node": socket.gethostname(),
        "backend": config.agent.backend,
        "library": found.backend or None,
        "scenario": config.simulated.scenario if config.agent.backend == "simulated" else None,
        "state_dir": str(config.state_dir),
        "prometheus": prometheus_url,
        "identity": _identity(found),
        "verdict": {"state": state, "action": action, "evidence": list(evidence)},
        "reading": _reading(reading, found.note),
        "ledger": case_history.ledger_json(record),
        "xids": case_history.merge_xids(record, counted),
        "memory": _memory(reading),
        "probe": {
            "own": case_history.baseline_json(config.state_dir, ident.uuid),
            "fleet": history,
        },
        "around_faults": {
            "note": None
            if prometheus_url is not None and failed is None
            else (
                "temperature, power and clocks around each fault need --prometheus URL (the agent keeps only "
                "the present): the current reading follows"
                if prometheus_url is None
                else f"Prometheus did not answer: {failed}"
            ),
            "faults": around,
        },
        "diag": case_history.diag_json(config.state_dir, ident.uuid, ident.index),
    }
    return document, failed


def _identity(found: Found) -> dict[str, Any]:
    """Keyed as NVML names them (nvmlDeviceGetSerial -> serial, …); None where the library cannot give it."""
    ident = found.identity
    out: dict[str, Any] = {
        "index": ident.index,
        "uuid": ident.uuid,
        "serial": ident.serial or None,
        "name": ident.model or None,
        "vendor": ident.vendor,
        "pci_bus_id": ident.pci_bus_id or None,
        "vbios_version": ident.vbios_version or None,
        "driver_version": ident.driver_version or found.versions.get("driver") or None,
    }
    out.update(found.case_identity)
    if ident.vendor == "nvidia":
        for key in ("board_part_number", "inforom_image_version"):
            out.setdefault(key, None)
        out["nvml_version"] = found.versions.get("nvml")
        out["cuda_driver_version"] = found.versions.get("cuda_driver")
    else:
        out.setdefault("board_part_number", None)
        out["inforom_image_version"] = None  # AMD GPUs have no InfoROM
    return out


def _reading(reading: GpuReading | None, note: str | None) -> dict[str, Any]:
    if reading is None or reading.sample is None:
        return {"timestamp": None, "error": note or (reading.error if reading is not None else None)}
    s = reading.sample
    return {
        "timestamp": s.timestamp,
        "error": None,
        "temperature_celsius": dict(s.temperature_celsius),
        "power_watts": s.power_watts,
        "power_limit_watts": dict(s.power_limit_watts),
        "clock_hertz": dict(s.clock_hertz),
        "clock_max_hertz": dict(s.clock_max_hertz),
        "utilization_ratio": s.utilization_ratio,
        "performance_state": s.performance_state,
        "pcie_link_generation": dict(s.pcie_link_generation),
        "pcie_link_width": dict(s.pcie_link_width),
        "pcie_replays_total": s.pcie_replays_total,
        "throttle_active": sorted(reason for reason, on in s.throttle_active.items() if on),
    }


def _memory(reading: GpuReading | None) -> dict[str, Any]:
    """Row remaps and ECC from this reading (NVML: nvmlDeviceGetRemappedRows, nvmlDeviceGetTotalEccErrors, …)."""
    if reading is None or reading.sample is None:
        return {"note": "no reading now: row remaps and ECC need the GPU to answer"}
    s = reading.sample
    return {
        "ecc_enabled": s.ecc_enabled,
        "ecc_errors_total": dict(s.ecc_errors_total),
        "remapped_rows_total": dict(s.remapped_rows_total),
        "row_remap_pending": s.row_remap_pending,
        "row_remap_failed": s.row_remap_failed,
        "row_remap_banks": dict(s.row_remap_banks),
        "retired_pages": s.retired_pages,
        "retired_pages_limit": s.retired_pages_limit,
        "sram_ecc_threshold_exceeded": s.sram_ecc_threshold_exceeded,
        "inforom_valid": s.inforom_valid,
        "note": None,
    }


def _kernel_log_xids(sources: NodeSources, identity: GpuIdentity) -> dict[int, dict[str, float]]:
    """The GPU's XIDs still in the kernel's log buffer (a real node, where the log can be read)."""
    reader = sources.kernel_log
    if reader is None or not reader.available or not identity.pci_bus_id:
        return {}
    bus = normalize_pci_bus_id(identity.pci_bus_id)
    found: dict[int, dict[str, float]] = {}
    try:
        for xid in reader.read_new():
            if xid.pci_bus_id == bus:
                seen = found.setdefault(xid.xid, {"count": 0.0, "last": 0.0})
                seen["count"] += 1
                seen["last"] = max(seen["last"], xid.timestamp)
    finally:
        reader.close()
    return found
