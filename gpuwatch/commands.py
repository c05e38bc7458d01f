"""The one-shot commands: version, snapshot and check."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import socket
from pathlib import Path
from typing import Any

from gpuwatch import __version__
from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.config import Config, ConfigError, parse_listen
from gpuwatch.host.report import check_host, host_json, print_host_table, read_host
from gpuwatch.kmsg import KernelLogXidReader
from gpuwatch.model import GpuReading
from gpuwatch.simulation import build_sources
from gpuwatch.sources import BackendSlot, amd_versions
from gpuwatch.statedir import state_dir_problem, writable_problem

EXIT_OK = 0
EXIT_UNAVAILABLE = 69
EXIT_CONFIG = 78


def version() -> int:
    print(f"gpuwatch {__version__} (Python {platform.python_version()})")
    for package in ("nvidia-ml-py", "amdsmi", "prometheus-client", "APScheduler", "psutil"):
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
    sources = build_sources(config)  # once: a simulated node's GPUs and host sensors are the same node
    readings, problems = _read_all(sources.slots)
    host, host_problems = read_host(sources.host)  # rails, supplies, temperatures, fans
    if as_json:
        document = {"gpus": [_reading_json(r) for r in readings], "backend_errors": problems}
        print(json.dumps({**document, "host": host_json(host), "host_errors": host_problems}, indent=2))
    else:
        _print_table(readings, problems)
        print_host_table(host, host_problems)
    return EXIT_OK if not problems else EXIT_UNAVAILABLE


def _reading_json(reading: GpuReading) -> dict[str, Any]:
    sample = None
    if reading.sample is not None:
        sample = {key: _jsonable(value) for key, value in dataclasses.asdict(reading.sample).items()}
    return {"identity": dataclasses.asdict(reading.identity), "sample": sample, "error": reading.error}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {"/".join(k) if isinstance(k, tuple) else k: v for k, v in value.items()}
    if isinstance(value, tuple):
        return list(value)
    return value


def _print_table(readings: list[GpuReading], problems: dict[str, str]) -> None:
    for name, message in problems.items():
        print(f"{name}: unavailable: {message}")
    header = f"{'GPU':>3}  {'model':<24} {'core':>5} {'mem':>5} {'power W':>13} {'SM MHz':>6} {'util':>5}  throttling"
    print(header)
    for reading in readings:
        ident, s = reading.identity, reading.sample
        if s is None:
            print(f"{ident.index:>3}  {ident.model[:24]:<24} LOST: {reading.error}")
            continue
        reasons = ",".join(sorted(r for r, on in s.throttle_active.items() if on)) or "-"
        power = f"{_fmt(s.power_watts)}/{_fmt(s.power_limit_watts.get('enforced'))}"
        sm = s.clock_hertz.get("sm")
        util = None if s.utilization_ratio is None else s.utilization_ratio * 100
        print(
            f"{ident.index:>3}  {ident.model[:24]:<24} {_fmt(s.temperature_celsius.get('core')):>5} "
            f"{_fmt(s.temperature_celsius.get('memory')):>5} {power:>13} "
            f"{_fmt(None if sm is None else sm / 1e6):>6} {_fmt(util):>4}%  {reasons}"
        )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def check(config: Config) -> int:
    """Say, line by line, whether the agent can run here; exit 0 only if it can."""
    failures = 0

    def report(ok: bool, what: str, detail: str) -> None:
        nonlocal failures
        failures += 0 if ok else 1
        print(f"[{'ok' if ok else 'FAIL'}] {what}: {detail}")

    print(f"[ok] configuration: {config.source}")
    sources = build_sources(config)
    print(f"[ok] PCI bus: {sources.pci_gpu_counts()}")
    if not sources.slots:
        report(False, "GPU backends", "none needed: no NVIDIA or AMD GPU on the PCI bus and none configured")
    for slot in sources.slots:
        report(*_check_backend(slot))
    for device in sorted(Path("/dev").glob("nvidia*")) if config.agent.backend != "simulated" else []:
        readable = os.access(device, os.R_OK | os.W_OK)
        report(readable, f"device {device}", "read/write" if readable else "no read/write access for this user")
    report(*_check_state_dir(config))
    report(*_check_port(config))
    web_config_ok = _check_web_config(config)
    failures += 0 if web_config_ok else 1
    for level, what, detail in check_host(sources.host, config.agent.disable_collectors):
        if level == "FAIL":
            report(False, what, detail)
        else:
            print(f"[{level}] {what}: {detail}")
    if config.xid.kernel_log and config.agent.backend != "simulated":
        with KernelLogXidReader(Path(config.xid.kernel_log)) as reader:
            # Optional: the NVML event stream still delivers XIDs without it.
            state = "readable" if reader.available else reader.reason
            print(f"[{'ok' if reader.available else 'warn'}] kernel log {config.xid.kernel_log}: {state}")
    from gpuwatch.probe.engines import describe_engines

    print(describe_engines(config))  # optional: without an engine every probe is skipped_unsupported
    for line in _uncapped_baselines(config):
        print(line)
    if not web_config_ok:
        return EXIT_CONFIG  # what `gpuwatch run` would exit with on the same file
    return EXIT_OK if failures == 0 else EXIT_UNAVAILABLE


def _check_web_config(config: Config) -> bool:
    """Load the web config as the agent would (certificates, keys, hashes), so a bad one fails here, not at start."""
    path = config.agent.web_config
    if not path:
        print("[ok] web config: none (plain HTTP, no authentication)")
        return True
    from gpuwatch.webconfig import load_web_config

    try:
        web = load_web_config(Path(path))
    except ConfigError as exc:
        print(f"[FAIL] web config {path}: {exc}")
        return False
    tls = "TLS" if web.tls is not None else "plain HTTP"
    if web.tls is not None and web.client_allowed_sans:
        tls += f", client certificates limited to {len(web.client_allowed_sans)} SAN(s)"
    users = f"basic auth for {len(web.users)} user(s)" if web.users else "no basic auth"
    print(f"[ok] web config {path}: {tls}, {users}")
    return True


def _uncapped_baselines(config: Config) -> list[str]:
    """A [warn] line per GPU whose probe baseline comes from probes that never reached the power limit."""
    from gpuwatch.probe.baseline import Baselines

    try:
        baselines = Baselines(config.state_dir).peek()  # no lock file made, nothing moved: check writes nothing
    except Exception:  # a state dir this user cannot read: the state dir line already says so
        return []
    return [
        f"[warn] probe baseline of GPU {uuid}: taken from probes that never reached the power limit within "
        f"probe.warmup_max_seconds = {config.probe.warmup_max_seconds:g} (uncapped; slow-GPU detection compares "
        "uncapped probes only)"
        for uuid, baseline in sorted(baselines.items())
        if baseline.key.uncapped and baseline.flops is not None
    ]


def _check_backend(slot: BackendSlot) -> tuple[bool, str, str]:
    try:
        backend = slot.factory()
        backend.open()
    except BackendUnavailable as exc:
        return False, f"backend {slot.name}", str(exc)
    try:
        gpus = len(backend.poll(slow=False))
        versions = ", ".join(f"{k} {v}" for k, v in backend.versions().items())
        mismatch = backend.version_problem()  # AMD: package vs host ROCm
    except Exception as exc:  # the driver failed between open and poll: a FAIL line, never a traceback
        return False, f"backend {slot.name}", f"opened, then failed: {exc}"
    finally:
        backend.close()
    if mismatch:
        return False, f"backend {slot.name}", f"{gpus} GPU(s); {versions}; {mismatch}"
    return True, f"backend {slot.name}", f"{gpus} GPU(s); {versions}"


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
