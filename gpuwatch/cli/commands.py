"""The one-shot commands: version, snapshot and check."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from gpuwatch import __version__
from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.cli.host_report import host_json, read_host
from gpuwatch.collectors.base import CheckLine, check_lines
from gpuwatch.collectors.sources import BackendSlot
from gpuwatch.config.settings import Config, ConfigError, parse_listen
from gpuwatch.core.exitcodes import EXIT_CONFIG, EXIT_OK, EXIT_UNAVAILABLE
from gpuwatch.core.model import GpuReading, HostSample
from gpuwatch.core.thresholds import runbook_reference
from gpuwatch.files.statedir import space_problem, state_dir_problem, writable_problem
from gpuwatch.judge.gpu_verdict import verdict_of
from gpuwatch.judge.verdict import Finding, judge_gpu, judge_host, judge_rail, rail_limit
from gpuwatch.service.nodes import build_sources
from gpuwatch.service.real_node import amd_versions
from gpuwatch.state.ledger import LedgerView, read_ledger

DISTRIBUTION = "gpuwatch-agent"  # what pip installs; PyPI's "gpuwatch" is an unrelated project


def version() -> int:
    print(f"gpuwatch {__version__} ({_distribution_note()}, Python {platform.python_version()})")
    for package in ("nvidia-ml-py", "amdsmi", "prometheus-client", "psutil"):
        print(f"  {package}: {_package_version(package) or 'not installed'}")
    try:
        from gpuwatch.backends.nvml import NvmlBackend, load_pynvml

        backend = NvmlBackend(load_pynvml())
        backend.open()
        try:
            for name, value in backend.versions().items():
                print(f"  {name}: {value}")
        finally:
            backend.close()
    except BackendUnavailable as exc:
        print(f"  NVIDIA driver: {exc}")

    for name, value in amd_versions().items():
        print(f"  {name}: {value}")
    return EXIT_OK


def _distribution_note() -> str:
    """Which distribution this is, and whether pip's record of it agrees with the code that runs: an editable install
    made before a version bump, or a checkout on sys.path beside another install, would not."""
    installed = _package_version(DISTRIBUTION)
    if installed is None:
        return f"not installed as {DISTRIBUTION}: running from a checkout"
    if installed != __version__:
        return f"pip's metadata says {DISTRIBUTION} {installed}: reinstall it"
    return DISTRIBUTION


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _read_all(slots: list[BackendSlot]) -> tuple[list[GpuReading], dict[str, str]]:
    """Open every backend the node needs, read all tiers once, close."""
    readings: list[GpuReading] = []
    problems: dict[str, str] = {}
    for slot in slots:
        try:
            backend = slot.factory()
            backend.open()
        except BackendUnavailable as exc:
            problems[slot.name] = str(exc)
            continue
        try:
            readings.extend(backend.poll(slow=True))
        except BackendUnavailable as exc:
            problems[slot.name] = str(exc)
        finally:
            backend.close()
    return readings, problems


def snapshot(config: Config, *, as_json: bool) -> int:
    """One reading of every GPU and host sensor: the terminal twin of the status page (the same verdicts)."""
    sources = build_sources(config)  # once: a simulated node's GPUs and host sensors are the same node
    readings, problems = _read_all(sources.slots)
    host, host_problems = read_host(sources.host)  # rails, supplies, temperatures, fans
    ledger = read_ledger(config.state_dir)  # faults held until repaired; read only, a bad file left as it is
    if as_json:
        document = {"gpus": [_reading_json(r, config, ledger) for r in readings], "backend_errors": problems}
        print(json.dumps({**document, "host": host_json(host), "host_errors": host_problems}, indent=2))
    else:
        expected = {v: n for v in ("nvidia", "amd") if (n := _expected(config, sources, v))}
        paint = Paint.for_stdout()
        print_gpus(readings, problems, expected, config.gpus.power_limit_watts, paint, ledger)
        print_host(host, host_problems, paint)
    return EXIT_OK if not problems else EXIT_UNAVAILABLE


def _expected(config: Config, sources: Any, vendor: str) -> int:
    configured = config.expected_gpus(vendor)
    return configured if configured is not None else int(sources.pci_gpu_counts().get(vendor, 0))


class Paint:
    """ANSI colour for a terminal; none when stdout is piped or NO_COLOR is set (no-color.org)."""

    CODES: ClassVar[dict[str, str]] = {"bad": "1;31", "warn": "33", "ok": "32", "info": "2", "head": "1"}

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @staticmethod
    def for_stdout() -> Paint:
        return Paint(sys.stdout.isatty() and not os.environ.get("NO_COLOR"))

    def __call__(self, level: str, text: str) -> str:
        if not self.enabled or level not in self.CODES:
            return text
        return f"\033[{self.CODES[level]}m{text}\033[0m"


def gpu_findings(reading: GpuReading, configured_limit: float | None) -> list[Finding]:
    if reading.sample is None:
        return [
            Finding(
                "bad",
                "GpuLost",
                f"lost: {reading.error or 'unreadable'}",
                "drain the node and reset the GPU or reboot; reseat or replace it if it does not come back",
            )
        ]
    return judge_gpu(reading.identity, reading.sample, configured_limit)


def _pad(text: str, width: int, paint: Paint, level: str = "", right: bool = False) -> str:
    padded = f"{text:>{width}}" if right else f"{text:<{width}}"
    return paint(level, padded) if level else padded


def print_gpus(
    readings: list[GpuReading],
    problems: dict[str, str],
    expected: dict[str, int],
    configured_limit: float | None,
    paint: Paint,
    ledger: LedgerView | None = None,
) -> None:
    """A row per GPU with its readings against its limits and a verdict; each finding and each fault the ledger
    holds under it, with what to do."""
    ledger = ledger or LedgerView()
    for name, message in problems.items():
        print(paint("bad", f"{name}: unavailable: {message}"))
        print(f"    what to do: check the driver (nvidia-smi / amd-smi, dmesg) · {runbook_reference('GpuBackendDown')}")
    seen = len(readings)
    total = sum(expected.values())
    if total:
        counted = f"{seen} of {total} expected GPUs"
        print(paint("bad", counted + " read") if seen < total else counted)
    columns = (
        ("GPU", 3, True),
        ("model", 22, False),
        ("core °C", 9, True),
        ("mem °C", 9, True),
        ("power W", 11, True),
        ("SM MHz", 11, True),
        ("util", 5, True),
        ("PCIe", 13, True),
        ("health", 0, False),
    )
    if not readings:
        if not problems and not total:
            print("no NVIDIA or AMD GPU here (none on the PCI bus, no backend configured); the host sensors follow.")
            print("    to see gpuwatch on a simulated 8-GPU node: gpuwatch snapshot --backend simulated")
        return
    print(paint("head", "  ".join(_pad(h, w, Paint(False), right=r) for h, w, r in columns).rstrip()))
    print(
        paint(
            "info",
            "  ".join(
                _pad(h, w, Paint(False), right=r)
                for h, w, r in zip(
                    ("", "", "now/slow", "now/max", "now/limit", "now/max", "", "now/max", ""),
                    (w for _, w, _ in columns),
                    (r for _, _, r in columns),
                    strict=True,
                )
            ).rstrip(),
        )
    )
    for reading in readings:
        ident, s = reading.identity, reading.sample
        findings = gpu_findings(reading, configured_limit)
        attention = [f for f in findings if f.attention]
        worst = attention[0].level if attention else "ok"
        verdict = (
            "ok" if not attention else attention[0].text + (f" (+{len(attention) - 1})" if len(attention) > 1 else "")
        )
        cells = [_pad(str(ident.index), 3, paint, right=True), _pad(ident.model[:22], 22, paint)]
        if s is not None:
            gen, width = s.pcie_link_generation, s.pcie_link_width
            pcie = (
                f"{gen.get('current', '-')}x{width.get('current', '-')}/{gen.get('max', '-')}x{width.get('max', '-')}"
            )
            sm, sm_max = s.clock_hertz.get("sm"), s.clock_max_hertz.get("sm")
            util = None if s.utilization_ratio is None else s.utilization_ratio * 100
            cells += [
                _pad(
                    _pair(s.temperature_celsius.get("core"), s.temperature_threshold_celsius.get(("core", "slowdown"))),
                    9,
                    paint,
                    right=True,
                ),
                _pad(
                    _pair(
                        s.temperature_celsius.get("memory"),
                        s.temperature_threshold_celsius.get(("memory", "max_operating")),
                    ),
                    9,
                    paint,
                    right=True,
                ),
                _pad(_pair(s.power_watts, s.power_limit_watts.get("enforced")), 11, paint, right=True),
                _pad(_pair(_mhz(sm), _mhz(sm_max)), 11, paint, right=True),
                _pad(f"{_fmt(util)}%", 5, paint, right=True),
                _pad(pcie if gen or width else "-", 13, paint, right=True),
            ]
        else:
            cells += [_pad("no readings", 9 + 9 + 11 + 11 + 5 + 13 + 10, paint)]
        cells.append(paint(worst, verdict))
        print("  ".join(cells))
        held = ledger.open_faults(ident.uuid)
        state, action, _ = verdict_of(findings, _recovery_action(reading), held, time.time())
        if state != "healthy" or action != "none":
            print(f"     verdict: {paint(worst, state)}, action {action} (docs/verdicts.md)")
        for f in findings:
            if f.attention:
                print(f"     {paint(f.level, '!')} {f.text}")
                print(f"       what to do: {f.remedy} · {runbook_reference(f.alert)}")
        for fault in held:
            print(f"     {paint('bad', '!')} held until repaired: {fault.key} -> {fault.action}: {fault.evidence}")
            print(f"       once mended: gpuwatch repair --gpu {ident.index} --note '...'")


def print_host(samples: list[HostSample], problems: dict[str, str], paint: Paint) -> None:
    """Rails against their limits and supplies, each with its state, as the status page's host table."""
    for name, message in problems.items():
        print(paint("warn", f"host {name}: unavailable: {message}"))
    rails = [v for s in samples for v in s.voltages]
    psus = [p for s in samples for p in s.psus]
    power = {w.psu: w.watts for s in samples for w in s.psu_power}
    if not (rails or psus):
        print("host power: no rails or supplies" + ("" if problems else " (no hwmon chips, no BMC)"))
    if rails:
        print()
        print(paint("head", f"{'rail':<32} {'now V':>8} {'limit V':>8} {'nominal':>8}  state"))
        for v in rails:
            finding = judge_rail(v)
            limit = rail_limit(v)
            raised = [name for name, flag in v.alarms if flag]
            state, level = (
                ("BELOW LIMIT", "bad")
                if finding
                else (f"alarm ({', '.join(raised)})", "warn")
                if raised
                else ("ok", "ok")
            )
            print(
                f"{(v.chip + ' ' + v.sensor)[:32]:<32} {v.volts:>8.3f} {_volts(limit):>8} "
                f"{_volts(v.nominal_volts):>8}  {paint(level, state)}"
            )
    if psus:
        print()
        print(paint("head", f"{'power supply':<32} {'load W':>8}  state"))
        for p in psus:
            watts = power.get(p.psu)
            state = paint("ok", "up") if p.up else paint("bad", "FAILED")
            detail = f" ({p.states})" if p.states else ""
            print(f"{p.psu[:32]:<32} {_fmt(watts):>8}  {state}{detail}")
    for f in judge_host(samples):
        print(f"{paint(f.level, '!')} {f.text}")
        print(f"  what to do: {f.remedy} · {runbook_reference(f.alert)}")
    lost = [s.psu_redundancy_lost for s in samples if s.psu_redundancy_lost is not None]
    if lost:
        print(f"power-supply redundancy: {paint('warn', 'LOST') if any(lost) else paint('ok', 'ok')}")
    temps = [t for s in samples for t in s.temperatures]
    fans = [f for s in samples for f in s.fans]
    if temps:
        print("temperatures: " + ", ".join(f"{t.chip} {t.sensor} {t.value:.1f} °C" for t in temps))
    if fans:
        print("fans: " + ", ".join(f"{f.chip} {f.sensor} {f.value:.0f} RPM" for f in fans))


def _pair(now: float | None, limit: float | None) -> str:
    return f"{_fmt(now)}/{_fmt(limit)}"


def _mhz(hertz: float | None) -> float | None:
    return None if hertz is None else hertz / 1e6


def _volts(value: float | None) -> str:
    return "-" if value is None else f"{abs(value):.3f}"


def _reading_json(reading: GpuReading, config: Config, ledger: LedgerView) -> dict[str, Any]:
    sample = None
    if reading.sample is not None:
        sample = {key: _jsonable(value) for key, value in dataclasses.asdict(reading.sample).items()}
    judged = gpu_findings(reading, config.gpus.power_limit_watts)
    findings = [
        {"level": f.level, "alert": f.alert, "text": f.text, "remedy": f.remedy, "runbook": f.runbook} for f in judged
    ]
    held = ledger.open_faults(reading.identity.uuid)
    state, action, evidence = verdict_of(judged, _recovery_action(reading), held, time.time())
    return {
        "identity": dataclasses.asdict(reading.identity),
        "sample": sample,
        "error": reading.error,
        "findings": findings,
        "verdict": {"state": state, "action": action, "evidence": list(evidence)},
    }


def _recovery_action(reading: GpuReading) -> int | None:
    return reading.sample.recovery_action if reading.sample is not None else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {"/".join(k) if isinstance(k, tuple) else k: v for k, v in value.items()}
    if isinstance(value, tuple):
        return list(value)
    return value


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


class CheckReport:
    """`gpuwatch check`'s lines, all one format: `[level] what: detail`, level ok, warn or FAIL, and under every warn
    and FAIL line `    fix: ...`, what to do about it. FAIL is what stops the agent; warn is what it runs without."""

    def __init__(self) -> None:
        self.failures = 0

    def add(self, line: CheckLine) -> None:
        self.failures += line.level == "FAIL"
        print(f"[{line.level}] {line.what}: {line.detail}")
        if line.level != "ok":
            print(f"    fix: {line.fix}")

    def line(self, level: Literal["ok", "warn", "FAIL"], what: str, detail: str, fix: str = "") -> None:
        self.add(CheckLine(level, what, detail, fix))

    def result(self, ok: bool, what: str, detail: str, fix: str) -> None:
        self.line("ok" if ok else "FAIL", what, detail, fix)


def _gpu_words(counts: dict[str, int]) -> str:
    words = [
        f"{n} {label} GPU{'s' if n != 1 else ''}" if n else f"no {label} GPU"
        for vendor, label in (("nvidia", "NVIDIA"), ("amd", "AMD"))
        if (n := counts.get(vendor, 0)) is not None
    ]
    return ", ".join(words)


def check(config: Config) -> int:
    """Say, line by line, whether the agent can run here; exit 0 only if it can. The node's lines are here; each
    registered collector says its own (gpuwatch/collectors/base.py, check_lines)."""
    report = CheckReport()
    report.line("ok", "configuration", str(config.source))
    sources = build_sources(config)
    if config.agent.backend == "simulated":  # the simulated node's bus, not this machine's: said so
        report.line("ok", "PCI bus", f"simulated: {_gpu_words(sources.pci_gpu_counts())} (this machine's is not read)")
    else:
        report.line("ok", "PCI bus", _gpu_words(sources.pci_gpu_counts()))
    if not sources.slots:
        report.line(
            "warn",
            "GPUs",
            "no NVIDIA or AMD GPU on the PCI bus and no backend configured: the agent runs and exports host sensors "
            "only",
            "on a GPU node, check lspci and the driver; to try gpuwatch without a GPU: --backend simulated",
        )
    state_dir = _check_state_dir(config)
    report.result(*state_dir, "create it, writable for the agent's user, or choose another with --state-dir PATH")
    full = space_problem(config.state_dir)
    if full is not None:
        report.line(
            "warn",
            f"state dir {config.state_dir} space",
            full,
            f"free space on its filesystem (df -h {config.state_dir}; df -i for inodes); the agent then writes its "
            "state again by itself",
        )
    if state_dir[0]:
        _check_ledger(config, report)
    report.result(*_check_port(config), "stop what listens there (ss -ltnp) or choose another --listen HOST:PORT")
    web_config_ok = _check_web_config(config, report)
    for _collector, line in check_lines(config, sources):
        report.add(line)
    if not web_config_ok:
        return EXIT_CONFIG  # what `gpuwatch run` would exit with on the same file
    return EXIT_OK if report.failures == 0 else EXIT_UNAVAILABLE


def _check_web_config(config: Config, report: CheckReport) -> bool:
    """Load the web config as the agent would (certificates, keys, hashes), so a bad one fails here, not at start."""
    path = config.agent.web_config
    if not path:
        report.line("ok", "web config", "none (plain HTTP, no authentication)")
        return True
    from gpuwatch.web.webconfig import load_web_config

    try:
        web = load_web_config(Path(path))
    except ConfigError as exc:
        report.line("FAIL", f"web config {path}", str(exc), f"correct the file: gpuwatch run exits {EXIT_CONFIG} on it")
        return False
    tls = "TLS" if web.tls is not None else "plain HTTP"
    if web.tls is not None and web.client_allowed_sans:
        tls += f", client certificates limited to {len(web.client_allowed_sans)} SAN(s)"
    users = f"basic auth for {len(web.users)} user(s)" if web.users else "no basic auth"
    report.line("ok", f"web config {path}", f"{tls}, {users}")
    return True


def _check_ledger(config: Config, report: CheckReport) -> None:
    """The faults the ledger holds until repaired (a warning: the node stays out of service until then)."""
    view = read_ledger(config.state_dir)
    held = [(r, f) for r in sorted(view.gpus.values(), key=lambda r: r.index) for f in r.open_faults]
    if not held:
        report.line("ok", "fault ledger", "no fault held")
        return
    report.line(
        "warn",
        "fault ledger",
        "; ".join(f"GPU {r.index} ({r.uuid}): {f.key} held -> {f.action}" for r, f in held),
        "act on each, then: gpuwatch repair --gpu INDEX --note WHAT-WAS-DONE (docs/verdicts.md)",
    )


def _check_state_dir(config: Config) -> tuple[bool, str, str]:
    """Whether the agent could use its state dir, found without writing anything there (checking changes nothing)."""
    path = config.state_dir
    problem = state_dir_problem(path) or writable_problem(path)
    if problem is not None:
        return False, f"state dir {path}", problem
    return True, f"state dir {path}", "writable" if path.exists() else "does not exist yet; the agent makes it"


def _check_port(config: Config) -> tuple[bool, str, str]:
    host, port = parse_listen(config.agent.listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return False, f"listen {config.agent.listen}", f"cannot bind: {exc.strerror}"
    return True, f"listen {config.agent.listen}", "free"
