#!/usr/bin/env python3
"""Issue #4's hardware Show in one command: the matmul probe on a real GPU, measured against its own targets.

Run by hand on a GPU node (read-only there: it never changes clocks, power limits or any other GPU setting):

1. environment: `nvidia-smi -q` header, the GPU's PCIe link, power limit, driver and engine versions (NVML, read-only);
2. N probes (default 10), each a separate `gpuwatch probe --gpu I --json` child as the agent runs them, each after
   the GPU sat idle (utilization 0, no compute process, core within 3 °C of the start, at least --idle-min s after the
   last probe): per-probe throughput, spread, GPU time, wall times, copies, telemetry; CV over all and over 2..N;
3. an independent sustained matmul (torch, this script's own code, in a child) for --sustain s: the probe beside it;
4. a competing matmul child on the same GPU while one more probe runs: the drop the probe reports.

Everything raw goes to one JSON file (--out, rewritten after each phase with "complete": false); a Markdown summary
is printed last. `--dry-run` runs the same flow without a GPU: the simulated backend and worker, and the torch parts
on the CPU at a small size. Exit status: 0 every phase measured, 1 a phase failed (the JSON says which and why),
130/143 interrupted (the children are always stopped).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO, Any

import psutil

REPO = Path(__file__).resolve().parents[2]

# References quoted beside our numbers (not inputs to any verdict).
PUBLISHED_BF16_TFLOPS = 794.5  # mamf-finder, maximum achievable bf16 matmul on H100 SXM (989 theoretical)
FIXTURE = {  # tests/fixtures/h100/probe-measurements.json: one H100 80GB HBM3 SXM, 700 W, driver 580.159.04
    "sustained_20s_8192_bf16_tflops": 688.0,
    "probe_8192_bf16_tflops_at_cap": "686-718",
    "probe_cv_pct": "0.14-0.42",
    "with_a_competing_matmul_stream_tflops_median": 365.0,
    "first_probe_on_a_cold_gpu_tflops": 808.0,
}
TARGET_CV_PCT = 0.5
TARGET_GPU_TIME_S = 3.0
TARGET_WALL_S = 5.0
IDLE_TEMP_MARGIN_C = 3.0
SW_POWER_CAP = 0x4  # NVML clocks event reason bit

WARMED_LINE = "probe_study competitor warmed"
PCIE_GT_PER_LANE = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}

EXIT_OK, EXIT_FAILED = 0, 1


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: stop measuring, still stop the children and write what was measured."""


class PhaseError(Exception):
    """An expected failure of one phase (no GPU, a child that failed): one message, no traceback."""


# --------------------------------------------------------------------------------------------------------------------
# PCIe arithmetic


def pcie_nominal_bytes_per_second(gen: int | None, width: int | None) -> float | None:
    """One direction's nominal payload rate of a PCIe link: GT/s per lane × encoding efficiency × lanes / 8.

    Encoding: 8b/10b for gen 1-2, 128b/130b for gen 3-5, and for gen 6 (PAM4, FLIT mode) ~242/256 (a 256-byte
    FLIT carries 242 bytes of TLP/DLLP payload). Gen 5 x16 = 32 × 128/130 × 16 / 8 = 63.0 GB/s. Packet headers are
    not counted, so a healthy link moves about 80-90 % of this in a large pinned copy."""
    if gen not in PCIE_GT_PER_LANE or not width:
        return None
    efficiency = 8 / 10 if gen <= 2 else 128 / 130 if gen <= 5 else 242 / 256
    return PCIE_GT_PER_LANE[gen] * 1e9 * efficiency * width / 8


# --------------------------------------------------------------------------------------------------------------------
# Children: every process we start is registered, and stopped (its whole tree) on any way out


_CHILDREN: list[subprocess.Popen[str]] = []


def spawn(argv: list[str], env: dict[str, str], *, stdin: int | None = None) -> subprocess.Popen[str]:
    """Start a child in its own session (so it is stopped as a tree), text pipes for its output, registered."""
    proc = subprocess.Popen(
        argv,
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(REPO),
        start_new_session=True,
    )
    _CHILDREN.append(proc)
    return proc


def stop_child(proc: subprocess.Popen[str], grace: float = 5.0) -> dict[str, Any]:
    """SIGTERM the child and everything it started (the probe worker runs in a session of its own), SIGKILL after
    `grace` s; returns its exit status (negative: the signal) and whether it had to be killed."""
    killed = False
    if proc.poll() is None:
        try:
            descendants = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            descendants = []
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        for p in descendants:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        try:
            proc.wait(timeout=grace)  # Popen reaps its own child, so its exit status is kept
        except subprocess.TimeoutExpired:
            killed = True
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        _, alive = psutil.wait_procs(descendants, timeout=max(0.1, grace / 2))
        for p in alive:
            killed = True
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=grace)
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)
    return {"exit_status": proc.returncode, "killed": killed}


def stop_all_children() -> None:
    for proc in list(_CHILDREN):
        stop_child(proc, grace=3.0)


def child_env(cuda_device: str | None = None) -> dict[str, str]:
    """Our environment with the repository importable (children run from its root) and, for the torch children,
    pinned to the GPU by UUID as the probe worker is."""
    env = dict(os.environ)
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO) not in path:
        env["PYTHONPATH"] = os.pathsep.join([*path, str(REPO)])
    if cuda_device is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = cuda_device
    return env


def communicate(
    proc: subprocess.Popen[str], timeout: float, every: Callable[[], None] | None = None
) -> tuple[str, str]:
    """Wait for the child's output (calling `every` about twice a second meanwhile); stop it after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            out, err = proc.communicate(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            if every is not None:
                every()
            if time.monotonic() >= deadline:
                stop_child(proc)
                out, err = proc.communicate()
                err = (err or "") + f"\n[probe_study: stopped after {timeout:.0f} s]"
                break
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)
    return out or "", err or ""


def last_json(text: str) -> dict[str, Any] | None:
    """The last line of `text` that is a JSON object (a child prints its result last)."""
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict):
                return doc
    return None


def tail(text: str, chars: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= chars else "…" + text[-chars:]


# --------------------------------------------------------------------------------------------------------------------
# Reading the GPU (read-only): NVML on a real node, the simulated backend's snapshot in a dry run


class GpuReader:
    """What the idle wait, the environment record and the sustained phase read; None where a reading failed."""

    kind = "none"

    def __init__(self) -> None:
        self.available = False
        self.why = "no GPU reader"
        self.errors: dict[str, str] = {}

    def environment(self) -> dict[str, Any]:
        return {}

    def sample(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        return None


class NvmlReader(GpuReader):
    """pynvml (nvidia-ml-py), read-only calls only: nothing here sets anything."""

    kind = "nvml"

    def __init__(self, index: int) -> None:
        super().__init__()
        self._nv: Any = None
        self._h: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
        except ImportError:
            self.why = f"pynvml is not importable by {sys.executable}: pip install nvidia-ml-py"
            return
        except Exception as exc:  # NVMLError and its driver-specific subclasses
            self.why = f"NVML does not start ({exc}): is the NVIDIA driver loaded? (or run with --dry-run)"
            return
        self._nv = pynvml
        try:
            self._h = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            self.why = f"NVML has no GPU {index}: {exc}"
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
            self._nv = None
            return
        self.available, self.why = True, ""

    def _call(self, name: str, *args: Any, device: bool = True) -> Any:
        fn = getattr(self._nv, name, None)
        if fn is None:
            self.errors[name] = "not in this pynvml"
            return None
        try:
            value = fn(self._h, *args) if device else fn(*args)
        except Exception as exc:
            self.errors[name] = str(exc)
            return None
        return value.decode() if isinstance(value, bytes) else value

    def _temperature(self) -> float | None:
        nv = self._nv
        value = self._call("nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU)
        if value is None:
            value = self._call("nvmlDeviceGetTemperatureV", nv.NVML_TEMPERATURE_GPU)
        return None if value is None else float(value)

    def environment(self) -> dict[str, Any]:
        if not self.available:
            return {"available": False, "why": self.why}
        nv = self._nv
        pci = self._call("nvmlDeviceGetPciInfo")
        cuda = self._call("nvmlSystemGetCudaDriverVersion_v2", device=False)
        limits = self._call("nvmlDeviceGetPowerManagementLimitConstraints")
        mig = self._call("nvmlDeviceGetMigMode")
        mem = self._call("nvmlDeviceGetMemoryInfo")
        modes = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
        compute_mode = self._call("nvmlDeviceGetComputeMode")
        bus_id = getattr(pci, "busId", None)
        env = {
            "available": True,
            "name": self._call("nvmlDeviceGetName"),
            "uuid": self._call("nvmlDeviceGetUUID"),
            "pci_bus_id": bus_id.decode() if isinstance(bus_id, bytes) else bus_id,
            "driver_version": self._call("nvmlSystemGetDriverVersion", device=False),
            "cuda_driver_version": None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}",
            "nvml_version": self._call("nvmlSystemGetNVMLVersion", device=False),
            "vbios_version": self._call("nvmlDeviceGetVbiosVersion"),
            "persistence_mode": self._call("nvmlDeviceGetPersistenceMode"),
            "compute_mode": modes.get(compute_mode, compute_mode),
            "mig_mode_current": None if mig is None else mig[0],
            "memory_total_bytes": getattr(mem, "total", None),
            "pcie_gen_current": self._call("nvmlDeviceGetCurrPcieLinkGeneration"),
            "pcie_gen_max": self._call("nvmlDeviceGetMaxPcieLinkGeneration"),
            "pcie_gen_gpu_max": self._call("nvmlDeviceGetGpuMaxPcieLinkGeneration"),
            "pcie_width_current": self._call("nvmlDeviceGetCurrPcieLinkWidth"),
            "pcie_width_max": self._call("nvmlDeviceGetMaxPcieLinkWidth"),
            "pcie_speed_mbps_per_lane": self._call("nvmlDeviceGetPcieSpeed"),
            "power_limit_enforced_watts": _milli(self._call("nvmlDeviceGetEnforcedPowerLimit")),
            "power_limit_watts": _milli(self._call("nvmlDeviceGetPowerManagementLimit")),
            "power_limit_default_watts": _milli(self._call("nvmlDeviceGetPowerManagementDefaultLimit")),
            "power_limit_min_max_watts": None if limits is None else [x / 1000 for x in limits],
            "sm_clock_max_mhz": self._call("nvmlDeviceGetMaxClockInfo", nv.NVML_CLOCK_SM),
            "memory_clock_max_mhz": self._call("nvmlDeviceGetMaxClockInfo", nv.NVML_CLOCK_MEM),
            "temperature_slowdown_c": self._call(
                "nvmlDeviceGetTemperatureThreshold", nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            "now": self.sample(),
        }
        return env

    def sample(self) -> dict[str, Any]:
        if not self.available:
            return {}
        nv = self._nv
        util = self._call("nvmlDeviceGetUtilizationRates")
        procs = self._call("nvmlDeviceGetComputeRunningProcesses")
        reasons = self.clocks_event_reasons()
        return {
            "t": time.time(),
            "utilization_pct": getattr(util, "gpu", None),
            "compute_processes": None if procs is None else len(procs),
            "temperature_c": self._temperature(),
            "power_watts": _milli(self._call("nvmlDeviceGetPowerUsage")),
            "sm_clock_mhz": self._call("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM),
            "clocks_event_reasons": reasons,
            "pcie_gen_current": self._call("nvmlDeviceGetCurrPcieLinkGeneration"),
            "pcie_width_current": self._call("nvmlDeviceGetCurrPcieLinkWidth"),
        }

    def clocks_event_reasons(self) -> int | None:
        """The clocks event reasons bitmask: the current call, else its older name (drivers before R535)."""
        reasons = self._call("nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None:
            reasons = self._call("nvmlDeviceGetCurrentClocksThrottleReasons")
        return None if reasons is None else int(reasons)

    def close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()
            self._nv = None


class SimulatedReader(GpuReader):
    """The dry run's GPU: `gpuwatch snapshot --backend simulated --json` (the same simulated node the probes see)."""

    kind = "simulated"

    def __init__(self, python: str, index: int, sim_args: list[str]) -> None:
        super().__init__()
        self._argv = [python, "-m", "gpuwatch", "snapshot", "--json", "--backend", "simulated", *sim_args]
        self._index = index
        self.available, self.why = True, ""
        if self._read() is None:
            self.available = False
            self.why = self.errors.get("snapshot", "the simulated snapshot failed")

    def _read(self) -> dict[str, Any] | None:
        try:
            done = subprocess.run(
                self._argv, capture_output=True, text=True, timeout=60, env=child_env(), cwd=str(REPO), check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.errors["snapshot"] = str(exc)
            return None
        try:
            doc = json.loads(done.stdout)
            gpu = next(g for g in doc["gpus"] if g["identity"]["index"] == self._index)
        except (ValueError, KeyError, TypeError, StopIteration):
            self.errors["snapshot"] = f"exit {done.returncode}: {tail(done.stderr or done.stdout, 300)}"
            return None
        return dict(gpu)

    def environment(self) -> dict[str, Any]:
        gpu = self._read()
        if gpu is None:
            return {"available": False, "why": self.errors.get("snapshot")}
        ident, s = gpu["identity"], gpu.get("sample") or {}
        gen, width = s.get("pcie_link_generation", {}), s.get("pcie_link_width", {})
        limits = s.get("power_limit_watts", {})
        return {
            "available": True,
            "simulated": True,
            "name": ident.get("model"),
            "uuid": ident.get("uuid"),
            "pci_bus_id": ident.get("pci_bus_id"),
            "driver_version": ident.get("driver_version"),
            "vbios_version": ident.get("vbios_version"),
            "persistence_mode": s.get("persistence_mode_enabled"),
            "compute_mode": s.get("compute_mode"),
            "pcie_gen_current": gen.get("current"),
            "pcie_gen_max": gen.get("max"),
            "pcie_width_current": width.get("current"),
            "pcie_width_max": width.get("max"),
            "power_limit_enforced_watts": limits.get("enforced"),
            "power_limit_default_watts": limits.get("default"),
            "now": self._sample_of(gpu),
        }

    def _sample_of(self, gpu: dict[str, Any]) -> dict[str, Any]:
        s = gpu.get("sample") or {}
        util = s.get("utilization_ratio")
        sm = (s.get("clock_hertz") or {}).get("sm")
        return {
            "t": time.time(),
            "utilization_pct": None if util is None else round(util * 100),
            "compute_processes": len(s.get("process_pids") or []),
            "temperature_c": (s.get("temperature_celsius") or {}).get("core"),
            "power_watts": s.get("power_watts"),
            "sm_clock_mhz": None if sm is None else sm / 1e6,
            "clocks_event_reasons": None,
            "pcie_gen_current": (s.get("pcie_link_generation") or {}).get("current"),
            "pcie_width_current": (s.get("pcie_link_width") or {}).get("current"),
        }

    def sample(self) -> dict[str, Any]:
        gpu = self._read()
        return {} if gpu is None else self._sample_of(gpu)


def _milli(value: Any) -> float | None:
    return None if value is None else float(value) / 1000


# --------------------------------------------------------------------------------------------------------------------
# Phase 1: environment


def run_text(argv: list[str], timeout: float = 30.0) -> tuple[int | None, str]:
    """A short read-only command's exit status and output (None and the reason when it could not run)."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=str(REPO), check=False
        )
    except FileNotFoundError:
        return None, f"{argv[0]} not found"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    return done.returncode, (done.stdout + ("\n" + done.stderr if done.returncode else "")).strip()


NVIDIA_SMI_KEYS = (
    "Driver Version",
    "CUDA Version",
    "Product Name",
    "Product Architecture",
    "Persistence Mode",
    "VBIOS Version",
    "GPU UUID",
    "Bus Id",
    "Current Power Limit",
    "Default Power Limit",
    "Max Power Limit",
    "Compute Mode",
)


def nvidia_smi_header(index: int) -> dict[str, Any]:
    """A few lines of `nvidia-smi -q -i INDEX` (read-only), as the user would compare them."""
    if shutil.which("nvidia-smi") is None:
        return {"available": False, "why": "nvidia-smi not found on PATH"}
    code, text = run_text(["nvidia-smi", "-q", "-i", str(index)])
    if code != 0:
        return {"available": False, "why": f"nvidia-smi -q exited {code}: {tail(text, 300)}"}
    lines: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key in NVIDIA_SMI_KEYS and key not in lines:
            lines[key] = value.strip()
    return {"available": True, "lines": lines}


def versions(python: str) -> dict[str, Any]:
    """Package versions without importing the engines, and `gpuwatch version` as the probe's interpreter sees it."""
    dists = ("torch", "cupy-cuda13x", "cupy-cuda12x", "cupy", "nvidia-ml-py", "psutil", "prometheus-client", "gpuwatch")
    found: dict[str, str | None] = {}
    for name in dists:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    code, text = run_text([python, "-m", "gpuwatch", "version"], timeout=60)
    return {
        "python": sys.version.split()[0],
        "python_executable": python,
        "packages_of_this_interpreter": found,
        "gpuwatch_version": {"exit_status": code, "output": text},
    }


def phase_environment(args: argparse.Namespace, reader: GpuReader) -> dict[str, Any]:
    gpu: dict[str, Any] = reader.environment() if reader.available else {"available": False, "why": reader.why}
    link_max = pcie_nominal_bytes_per_second(gpu.get("pcie_gen_max"), gpu.get("pcie_width_max"))
    link_now = pcie_nominal_bytes_per_second(gpu.get("pcie_gen_current"), gpu.get("pcie_width_current"))
    env = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "reader": reader.kind,
        "gpu": gpu,
        "nvidia_smi": nvidia_smi_header(args.gpu) if not args.dry_run else {"available": False, "why": "dry run"},
        "versions": versions(args.python),
        "pcie_nominal": {
            "formula": "GT/s per lane × efficiency × lanes / 8; efficiency 8/10 (gen 1-2), 128/130 (gen 3-5), "
            "242/256 (gen 6, PAM4 FLIT); one direction, packet headers not counted",
            "at_max_bytes_per_second": link_max,
            "at_idle_current_bytes_per_second": link_now,
        },
    }
    if not reader.available:
        env["error"] = reader.why
    return env


# --------------------------------------------------------------------------------------------------------------------
# Phase 2: the probes


def probe_argv(args: argparse.Namespace, state_dir: str, *, update_baseline: bool) -> list[str]:
    argv = [args.python, "-m", "gpuwatch", "probe", "--gpu", str(args.gpu), "--json", "--state-dir", state_dir]
    argv += ["--backend", args.backend]
    if args.backend == "simulated":
        argv += args.sim_args
    if args.config:
        argv += ["--config", args.config]
    if update_baseline:
        argv.append("--update-baseline")
    return argv


def run_probe(args: argparse.Namespace, state_dir: str, *, update_baseline: bool) -> dict[str, Any]:
    """One `gpuwatch probe` child, timed from the outside; its result for our GPU, flattened for the tables."""
    argv = probe_argv(args, state_dir, update_baseline=update_baseline)
    rec: dict[str, Any] = {"argv": argv[1:], "update_baseline": update_baseline}
    started = time.monotonic()
    try:
        proc = spawn(argv, child_env())
    except OSError as exc:
        rec["error"] = f"cannot start {argv[0]}: {exc}"
        return rec
    out, err = communicate(proc, args.probe_timeout)
    rec["cli_wall_seconds"] = time.monotonic() - started
    rec["exit_status"] = proc.returncode
    doc = None
    with contextlib.suppress(ValueError):
        doc = json.loads(out)
    results = doc.get("results") if isinstance(doc, dict) else None
    result = next((r for r in results or [] if isinstance(r, dict) and r.get("gpu") == args.gpu), None)
    if result is None:
        rec["error"] = (
            f"`gpuwatch probe` exited {proc.returncode} without a JSON result for GPU {args.gpu}: "
            f"{tail(err or out, 400) or 'no output'}"
        )
        return rec
    if proc.returncode != 0:
        rec["stderr_tail"] = tail(err, 600)
    rec["result"] = result
    m, t = result.get("measured") or {}, result.get("telemetry") or {}
    reason = str(result.get("reason") or "")
    sm = t.get("sm_clock_hertz")
    rec.update(
        status=result.get("result"),
        reason=reason,
        busy="was busy" in reason,
        engine=f"{m.get('engine')} {m.get('engine_version')}, {m.get('blas_version')}" if m else None,
        flops_median=m.get("flops_median"),
        spread_ratio=m.get("spread_ratio"),
        iterations=m.get("iterations"),
        gpu_time_seconds=m.get("gpu_time_seconds"),
        power_capped=m.get("power_capped"),
        h2d_bytes_per_second=m.get("h2d_bytes_per_second"),
        d2h_bytes_per_second=m.get("d2h_bytes_per_second"),
        copy_kind=m.get("copy_kind"),
        worker_wall_seconds=result.get("wall_seconds"),
        sm_clock_mhz=None if sm is None else sm / 1e6,
        power_watts=t.get("power_watts"),
        peak_temperature_c=t.get("temperature_celsius"),
        baseline_flops=result.get("baseline_flops"),
        ratio_to_baseline=result.get("ratio_to_baseline"),
    )
    if rec["flops_median"] is None:
        rec["error"] = f"the probe did not measure: {result.get('result')}: {reason or 'no reason given'}"
    return rec


def wait_idle(
    reader: GpuReader, temp_ref: float | None, last_end: float | None, idle_min: float, idle_max: float
) -> dict[str, Any]:
    """Wait until the GPU is idle and cool (utilization 0, no compute process, core ≤ start + 3 °C) and at least
    `idle_min` s passed since the last probe; give up after `idle_max` s and say what was not met."""
    start = time.monotonic()
    since = last_end if last_end is not None else start
    min_until = since + (idle_min if last_end is not None else 0.0)
    max_until = since + max(idle_max, idle_min if last_end is not None else 0.0)
    last: dict[str, Any] = {}
    while True:
        now = time.monotonic()
        if not reader.available:
            if now < min_until:
                time.sleep(min_until - now)
            return {"checked": False, "why": reader.why, "waited_seconds": time.monotonic() - since, "idle": None}
        last = reader.sample()
        unmet = []
        util, procs, temp = last.get("utilization_pct"), last.get("compute_processes"), last.get("temperature_c")
        if util:
            unmet.append(f"utilization {util} %")
        if procs:
            unmet.append(f"{procs} compute process(es)")
        if temp_ref is not None and temp is not None and temp > temp_ref + IDLE_TEMP_MARGIN_C:
            unmet.append(f"core {temp:.0f} °C, over {temp_ref:.0f} + {IDLE_TEMP_MARGIN_C:.0f} °C")
        now = time.monotonic()
        if not unmet and now >= min_until:
            return _idle_record(True, since, last, [])
        if now >= max_until:
            return _idle_record(not unmet, since, last, unmet)
        time.sleep(0.5)


def _idle_record(idle: bool, since: float, s: dict[str, Any], unmet: list[str]) -> dict[str, Any]:
    return {
        "checked": True,
        "idle": idle,
        "unmet": unmet,
        "waited_seconds": time.monotonic() - since,
        "utilization_pct": s.get("utilization_pct"),
        "compute_processes": s.get("compute_processes"),
        "temperature_c": s.get("temperature_c"),
    }


def phase_probes(
    args: argparse.Namespace, reader: GpuReader, state_dir: str, deadline: float, out: dict[str, Any]
) -> None:
    """N probes, each after an idle wait; the first ones (until a baseline exists) with --update-baseline."""
    ref = reader.sample() if reader.available else {}
    temp_ref = ref.get("temperature_c")
    out.update(temperature_at_start_c=temp_ref, idle_at_start=ref, probes=[])
    probes: list[dict[str, Any]] = out["probes"]
    try:
        _probe_loop(args, reader, state_dir, deadline, temp_ref, probes)
    finally:
        out["stats"] = probe_stats(probes)  # also of the probes run before a failure or an interruption


def _probe_loop(
    args: argparse.Namespace,
    reader: GpuReader,
    state_dir: str,
    deadline: float,
    temp_ref: float | None,
    probes: list[dict[str, Any]],
) -> None:
    last_end: float | None = None
    failed_in_row = 0
    for i in range(args.probes):
        left = args.probes - i
        expected = max((p.get("cli_wall_seconds") or 0.0 for p in probes), default=args.probe_estimate)
        share = (deadline - time.monotonic()) / left - expected  # the time budget left to each idle wait
        idle_max = min(args.idle_max, max(args.idle_min, share))
        idle = wait_idle(reader, temp_ref, last_end, args.idle_min, idle_max)
        have_baseline = bool(probes and probes[-1].get("baseline_flops"))
        rec = run_probe(args, state_dir, update_baseline=i < args.baseline_probes or not have_baseline)
        last_end = time.monotonic()
        rec["index"] = i + 1
        rec["idle"] = idle
        rec["idle_wait_limit_seconds"] = idle_max
        probes.append(rec)
        say(f"probe {i + 1}/{args.probes}: " + probe_line(rec))
        if rec.get("flops_median") is None:
            failed_in_row += 1
            if failed_in_row >= 2:
                raise PhaseError(f"two probes in a row gave no measurement; the last: {rec.get('error')}")
        else:
            failed_in_row = 0


def probe_line(rec: dict[str, Any]) -> str:
    if rec.get("flops_median") is None:
        return f"no measurement: {rec.get('error')}"
    idle = rec.get("idle") or {}
    cooled = "not checked" if not idle.get("checked") else "idle" if idle.get("idle") else "NOT idle"
    return (
        f"{rec['flops_median'] / 1e12:.1f} TFLOP/s, GPU {_f(rec.get('gpu_time_seconds'), 2)} s, worker "
        f"{_f(rec.get('worker_wall_seconds'), 2)} s, CLI {_f(rec.get('cli_wall_seconds'), 2)} s "
        f"(waited {_f(idle.get('waited_seconds'), 0)} s, {cooled})"
    )


def spread_stats(values: list[float]) -> dict[str, Any]:
    """Mean, sample stdev (n−1) and CV in %, with the population (n) CV beside (the fixture's cv_pct is that)."""
    if not values:
        return {"n": 0}
    mean = statistics.fmean(values)
    stdev = statistics.stdev(values) if len(values) > 1 else None
    pstdev = statistics.pstdev(values)
    return {
        "n": len(values),
        "mean": mean,
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "stdev": stdev,
        "cv_pct": None if stdev is None or not mean else 100 * stdev / mean,
        "cv_pct_population": 100 * pstdev / mean if mean else None,
    }


def probe_stats(probes: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [p for p in probes if p.get("flops_median") and not p.get("busy")]

    def col(key: str, rows: list[dict[str, Any]] | None = None) -> list[float]:
        return [float(p[key]) for p in (ok if rows is None else rows) if p.get(key) is not None]

    all_ = spread_stats(col("flops_median"))
    later = spread_stats(col("flops_median", [p for p in ok if p["index"] >= 2]))
    gpu_time, worker, cli = col("gpu_time_seconds"), col("worker_wall_seconds"), col("cli_wall_seconds")
    h2d, d2h = col("h2d_bytes_per_second"), col("d2h_bytes_per_second")
    checked = [p for p in probes if (p.get("idle") or {}).get("checked")]
    return {
        "probes": len(probes),
        "measured": len(ok),
        "busy_marked": sum(1 for p in probes if p.get("busy")),
        # Issue #33: each probe checks its result; a wrong one is result compute_error, never a measurement.
        "compute_errors": sum(1 for p in probes if p.get("status") == "compute_error"),
        "checked": sum(
            1 for p in probes if (((p.get("result") or {}).get("measured") or {}).get("compute_check") or {}).get("ran")
        ),
        "flops_all": all_,
        "flops_from_2": later,
        "gpu_time_seconds": {"max": max(gpu_time, default=None), "median": median_or_none(gpu_time)},
        "worker_wall_seconds": {"max": max(worker, default=None), "median": median_or_none(worker)},
        "cli_wall_seconds": {"max": max(cli, default=None), "median": median_or_none(cli)},
        "h2d_bytes_per_second_median": median_or_none(h2d),
        "d2h_bytes_per_second_median": median_or_none(d2h),
        "copy_kind": next((p.get("copy_kind") for p in ok if p.get("copy_kind")), None),
        "power_capped": sum(1 for p in ok if p.get("power_capped")),
        "idle_checked": len(checked),
        "idle_met": sum(1 for p in checked if p["idle"].get("idle")),
        "idle_wait_seconds_median": median_or_none([p["idle"]["waited_seconds"] for p in probes if p.get("idle")]),
        "baseline_flops": next((p["baseline_flops"] for p in reversed(probes) if p.get("baseline_flops")), None),
        "baseline_probes": sum(1 for p in probes if p.get("update_baseline")),
        "engine": next((p["engine"] for p in ok if p.get("engine")), None),
        "verdicts": {
            "cv_all": _verdict(all_.get("cv_pct"), TARGET_CV_PCT),
            "cv_from_2": _verdict(later.get("cv_pct"), TARGET_CV_PCT),
            "gpu_time": _verdict(max(gpu_time, default=None), TARGET_GPU_TIME_S),
            "worker_wall": _verdict(max(worker, default=None), TARGET_WALL_S),
        },
    }


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _verdict(value: float | None, target: float) -> str:
    return "n/a" if value is None else "pass" if value <= target else "FAIL"


# --------------------------------------------------------------------------------------------------------------------
# The torch children: a sustained matmul, and a competing workload (this script re-invoked in a hidden mode)


def _torch_setup(args: argparse.Namespace) -> tuple[Any, Any, Callable[[int], float], dict[str, Any]]:
    """Import torch, allocate random-normal operands and a preallocated output, warm up 3 times; returns torch, a
    function that runs k matmuls and returns their device time, the k-matmul enqueuer, and what ran where."""
    try:
        import torch
    except ImportError as exc:
        raise PhaseError(f"torch is not importable by {sys.executable} ({exc}): install PyTorch") from None
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    info: dict[str, Any] = {"torch": str(torch.__version__), "cuda_runtime": torch.version.cuda, "dtype": args.dtype}
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise PhaseError(f"torch {torch.__version__} sees no CUDA GPU (a CPU-only build, or none visible)")
        dev = torch.device("cuda", 0)
        torch.backends.cuda.matmul.allow_tf32 = False
        info["device"] = torch.cuda.get_device_name(dev)
        info["capability"] = ".".join(str(x) for x in torch.cuda.get_device_capability(dev))
    else:
        dev = torch.device("cpu")
        info["device"] = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    n = args.size
    gen = torch.Generator(device=dev).manual_seed(1)
    a = torch.randn((n, n), generator=gen, device=dev, dtype=torch.float32).to(dt)
    b = torch.randn((n, n), generator=gen, device=dev, dtype=torch.float32).to(dt)
    c = torch.empty((n, n), device=dev, dtype=dt)
    matmul = torch.matmul

    def run(k: int) -> None:
        for _ in range(k):
            matmul(a, b, out=c)

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize(dev)

    run(3)
    sync()

    def timed(k: int) -> float:
        """Host-timed k matmuls, synchronized (only for calibrating the batch size)."""
        t0 = time.perf_counter()
        run(k)
        sync()
        return time.perf_counter() - t0

    info["n"] = n
    return torch, run, timed, info


def _batch_size(timed: Callable[[int], float], batch_seconds: float) -> int:
    per = max(timed(3) / 3, 1e-6)
    return max(1, min(4096, int(batch_seconds / per)))


def _emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def sustain_child(args: argparse.Namespace) -> int:
    """Batches of k matmuls for `--sustain` s, each batch timed with CUDA events (perf_counter on the CPU); two
    batches stay queued so the GPU never waits on us."""
    try:
        torch, run, timed, info = _torch_setup(args)
        k = _batch_size(timed, args.batch_seconds)
        flop = 2.0 * args.size**3
        batches: list[list[float]] = []
        started = time.perf_counter()
        if args.device == "cuda":
            pending: list[tuple[Any, Any, float]] = []
            while True:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                at = time.perf_counter() - started
                s.record()
                run(k)
                e.record()
                pending.append((s, e, at))
                if len(pending) >= 2:
                    s0, e0, at0 = pending.pop(0)
                    e0.synchronize()
                    batches.append([at0, s0.elapsed_time(e0) / 1000.0])
                if time.perf_counter() - started >= args.sustain:
                    break
            for s0, e0, at0 in pending:
                e0.synchronize()
                batches.append([at0, s0.elapsed_time(e0) / 1000.0])
        else:
            while time.perf_counter() - started < args.sustain:
                at = time.perf_counter() - started
                batches.append([at, timed(k)])
        _emit({"ok": True, **info, "batch_iterations": k, "flop_per_matmul": flop, "batches": batches})
        return EXIT_OK
    except PhaseError as exc:
        _emit({"ok": False, "error": str(exc)})
        return EXIT_FAILED
    except Exception as exc:
        _emit({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return EXIT_FAILED


def compete_child(args: argparse.Namespace) -> int:
    """A matmul loop on the same GPU for `--compete` s after warming up; says WARMED_LINE once it computes."""
    try:
        _, _, timed, info = _torch_setup(args)
        k = _batch_size(timed, 0.05)
        print(WARMED_LINE, flush=True)
        started = time.monotonic()
        count = 0
        while time.monotonic() - started < args.compete:
            timed(k)
            count += k
        _emit({"ok": True, **info, "matmuls": count, "seconds": time.monotonic() - started})
        return EXIT_OK
    except PhaseError as exc:
        _emit({"ok": False, "error": str(exc)})
        return EXIT_FAILED
    except Exception as exc:
        _emit({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return EXIT_FAILED


def torch_child_argv(args: argparse.Namespace, mode: list[str]) -> list[str]:
    return [
        args.python,
        str(Path(__file__).resolve()),
        *mode,
        "--size",
        str(args.size),
        "--dtype",
        args.dtype,
        "--device",
        args.device,
        "--batch-seconds",
        str(args.batch_seconds),
    ]


def cuda_pin(env: dict[str, Any]) -> str | None:
    """CUDA_VISIBLE_DEVICES for the torch children: the GPU's UUID (as the probe worker pins), else its index."""
    uuid = (env.get("gpu") or {}).get("uuid")
    return str(uuid) if uuid else None


# --------------------------------------------------------------------------------------------------------------------
# Phase 3: sustained matmul


def phase_sustained(args: argparse.Namespace, reader: GpuReader, pin: str | None, res: dict[str, Any]) -> None:
    """The torch child for --sustain s while we sample the GPU (power, clocks, cap, PCIe link under load)."""
    argv = torch_child_argv(args, ["--sustain-child", "--sustain", str(args.sustain)])
    telemetry: list[dict[str, Any]] = []
    res.update(argv=argv[1:], telemetry=telemetry)
    proc = spawn(argv, child_env(pin if args.device == "cuda" else None))
    out, err = communicate(proc, args.sustain + 120, every=lambda: telemetry.append(reader.sample()))
    doc = last_json(out)
    res["exit_status"] = proc.returncode
    if doc is None or not doc.get("ok"):
        why = (doc or {}).get("error") or f"exit {proc.returncode}, no result: {tail(err, 400) or 'no output'}"
        res["stderr_tail"] = tail(err, 600)
        raise PhaseError(f"the sustained matmul failed: {why}")
    flop = float(doc["flop_per_matmul"]) * int(doc["batch_iterations"])
    rates = [(at, flop / sec / 1e12) for at, sec in doc.pop("batches") if sec > 0]
    later = [r for _, r in rates[len(rates) // 2 :]]
    res.update(
        child=doc,
        batches=len(rates),
        tflops_by_batch=[[round(at, 3), round(r, 2)] for at, r in rates],
        median_tflops_last_half=median_or_none(later),
        best_batch_tflops=max((r for _, r in rates), default=None),
        median_tflops_first_2s=median_or_none([r for at, r in rates if at < 2.0]),
        load_telemetry=_load_telemetry(telemetry),
    )


def _load_telemetry(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Power, SM clock, temperature, power-cap share and PCIe link seen over the second half of a load."""
    later = [s for s in samples[len(samples) // 2 :] if s]
    power = [s["power_watts"] for s in later if s.get("power_watts") is not None]
    sm = [s["sm_clock_mhz"] for s in later if s.get("sm_clock_mhz") is not None]
    temps = [s["temperature_c"] for s in samples if s and s.get("temperature_c") is not None]
    reasons = [s["clocks_event_reasons"] for s in later if s.get("clocks_event_reasons") is not None]
    gens = [s["pcie_gen_current"] for s in samples if s and s.get("pcie_gen_current") is not None]
    widths = [s["pcie_width_current"] for s in samples if s and s.get("pcie_width_current") is not None]
    return {
        "samples": len(samples),
        "power_watts_mean_last_half": statistics.fmean(power) if power else None,
        "sm_clock_mhz_mean_last_half": statistics.fmean(sm) if sm else None,
        "temperature_c_peak": max(temps, default=None),
        "sw_power_cap_share_last_half": (
            sum(1 for r in reasons if r & SW_POWER_CAP) / len(reasons) if reasons else None
        ),
        "pcie_gen_max_seen": max(gens, default=None),
        "pcie_width_max_seen": max(widths, default=None),
    }


# --------------------------------------------------------------------------------------------------------------------
# Phase 4: a probe under a competing workload


def _read_lines(stream: IO[str], sink: queue.Queue[str | None]) -> None:
    with contextlib.suppress(OSError, ValueError):
        for line in stream:
            sink.put(line)
    sink.put(None)


def phase_competing(
    args: argparse.Namespace, state_dir: str, pin: str | None, idle_flops: float | None, res: dict[str, Any]
) -> None:
    """A competitor child computing on the same GPU, then one explicit probe; the competitor is always stopped."""
    argv = torch_child_argv(args, ["--compete", str(args.compete_seconds)])
    res.update(argv=argv[1:], idle_reference_flops=idle_flops)
    proc = spawn(argv, child_env(pin if args.device == "cuda" else None))
    lines: queue.Queue[str | None] = queue.Queue()
    err_chunks: list[str] = []
    assert proc.stdout is not None and proc.stderr is not None
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    threading.Thread(target=lambda: err_chunks.append(proc.stderr.read() if proc.stderr else ""), daemon=True).start()
    out_lines: list[str] = []
    try:
        started = time.monotonic()
        warmed = False
        while not warmed:
            left = args.compete_start_timeout - (time.monotonic() - started)
            if left <= 0:
                raise PhaseError(f"the competitor did not start computing within {args.compete_start_timeout:.0f} s")
            try:
                line = lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                proc.wait(timeout=10)
                doc = last_json("".join(out_lines))
                why = (doc or {}).get("error") or tail("".join(err_chunks), 400) or "no output"
                raise PhaseError(f"the competitor exited ({proc.returncode}) before it warmed up: {why}")
            out_lines.append(line)
            warmed = line.strip() == WARMED_LINE
        res["competitor_start_seconds"] = time.monotonic() - started
        time.sleep(args.compete_settle)
        if proc.poll() is not None:
            raise PhaseError(f"the competitor ended (exit {proc.returncode}) before the probe could start")
        say("probe under the competing workload …")
        probe = run_probe(args, state_dir, update_baseline=False)
        res["probe"] = probe
        res["competitor_alive_through_probe"] = proc.poll() is None
        if not res["competitor_alive_through_probe"]:
            res["warning"] = "the competitor ended before the probe finished: the drop understates"
        if probe.get("flops_median") is None:
            raise PhaseError(f"the probe under load did not measure: {probe.get('error')}")
        flops = float(probe["flops_median"])
        res["probe_flops"] = flops
        res["ratio_to_baseline"] = probe.get("ratio_to_baseline")
        res["marked_busy"] = probe.get("busy")
        res["drop_vs_idle"] = None if not idle_flops else 1.0 - flops / idle_flops
    finally:
        res["competitor_stop"] = stop_child(proc)
        time.sleep(0.2)
        while True:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                out_lines.append(line)
        res["competitor_result"] = last_json("".join(out_lines))
        res["competitor_stderr_tail"] = tail("".join(err_chunks), 400)


# --------------------------------------------------------------------------------------------------------------------
# Report


def _f(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{float(value):.{digits}f}"


def _tf(flops: Any) -> str:
    return "-" if flops is None else _tfl(float(flops) / 1e12)


def _tfl(tflops: Any) -> str:
    """TFLOP/s with one decimal, or 3 significant digits for the small numbers of a CPU dry run."""
    if tflops is None:
        return "-"
    return f"{tflops:.1f}" if abs(tflops) >= 10 else f"{tflops:.3g}"


def _gb(rate: Any) -> str:
    return "-" if rate is None else f"{float(rate) / 1e9:.1f}"


def _pct(share: Any, digits: int = 1) -> str:
    return "-" if share is None else f"{100 * float(share):.{digits}f} %"


def probe_table(probes: list[dict[str, Any]]) -> list[str]:
    rows = [
        "| # | TFLOP/s | spread | GPU s | worker s | CLI s | capped | H2D GB/s | D2H GB/s | SM MHz | W | peak °C "
        "| idle wait s | idle | baseline | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in probes:
        idle = p.get("idle") or {}
        state = "-" if not idle.get("checked") else "yes" if idle.get("idle") else "no: " + "; ".join(idle["unmet"])
        capped = {True: "yes", False: "no", None: "-"}[p.get("power_capped")]
        status = "" if p.get("flops_median") is not None else f" ({p.get('status') or 'error'})"
        rows.append(
            f"| {p.get('index')}{'u' if p.get('update_baseline') else ''}{status} | {_tf(p.get('flops_median'))} "
            f"| {_f(p.get('spread_ratio'), 3)} | {_f(p.get('gpu_time_seconds'), 2)} "
            f"| {_f(p.get('worker_wall_seconds'), 2)} | {_f(p.get('cli_wall_seconds'), 2)} | {capped} "
            f"| {_gb(p.get('h2d_bytes_per_second'))} | {_gb(p.get('d2h_bytes_per_second'))} "
            f"| {_f(p.get('sm_clock_mhz'), 0)} | {_f(p.get('power_watts'), 0)} | {_f(p.get('peak_temperature_c'), 0)} "
            f"| {_f(idle.get('waited_seconds'), 1)} | {state} | {_tf(p.get('baseline_flops'))} "
            f"| {_f(p.get('ratio_to_baseline'), 3)} |"
        )
    return rows


def summary_table(doc: dict[str, Any]) -> list[str]:
    env = doc.get("environment") or {}
    gpu = env.get("gpu") or {}
    st = (doc.get("probes") or {}).get("stats") or {}
    sus = doc.get("sustained") or {}
    comp = doc.get("competing") or {}
    nominal = (env.get("pcie_nominal") or {}).get("at_max_bytes_per_second")
    a, b = st.get("flops_all") or {}, st.get("flops_from_2") or {}
    v = st.get("verdicts") or {}
    idle_ref = _idle_reference(doc)
    sus_med = sus.get("median_tflops_last_half")
    lt = sus.get("load_telemetry") or {}
    h2d, d2h = st.get("h2d_bytes_per_second_median"), st.get("d2h_bytes_per_second_median")
    cprobe = comp.get("probe") or {}

    def share(rate: Any) -> str:
        return "" if rate is None or not nominal else f" ({_pct(float(rate) / nominal, 0)})"

    link = f"gen {gpu.get('pcie_gen_max', '-')} x{gpu.get('pcie_width_max', '-')}"
    rows = [
        f"GPU {doc.get('args', {}).get('gpu')}: {gpu.get('name', '-')}, driver {gpu.get('driver_version', '-')}, "
        f"power limit {_f(gpu.get('power_limit_enforced_watts'), 0)} W, PCIe {link} "
        f"(idle now gen {gpu.get('pcie_gen_current', '-')} x{gpu.get('pcie_width_current', '-')}); "
        f"probe engine {st.get('engine') or '-'}",
        "",
        "| measure | value | target / reference | verdict |",
        "|---|---|---|---|",
        f"| idle probes measured (busy-marked) | {st.get('measured', 0)} of {st.get('probes', 0)} "
        f"({st.get('busy_marked', 0)}) | | |",
        f"| compute errors over {st.get('checked', 0)} checked probes | {st.get('compute_errors', 0)} | 0 "
        f"| {'ok' if not st.get('compute_errors') else 'WRONG RESULTS'} |",
        f"| probe TFLOP/s, mean ± stdev, all | {_tf(a.get('mean'))} ± {_tf(a.get('stdev'))} "
        f"(min {_tf(a.get('min'))}, max {_tf(a.get('max'))}) "
        f"| H100 fixture {FIXTURE['probe_8192_bf16_tflops_at_cap']} | |",
        f"| CV of per-probe medians, all | {_f(a.get('cv_pct'), 2)} % (population {_f(a.get('cv_pct_population'), 2)}"
        f" %) | ≤ {TARGET_CV_PCT} % | {v.get('cv_all', 'n/a')} |",
        f"| CV, probes 2..N | {_f(b.get('cv_pct'), 2)} % (population {_f(b.get('cv_pct_population'), 2)} %), "
        f"mean {_tf(b.get('mean'))} | ≤ {TARGET_CV_PCT} % | {v.get('cv_from_2', 'n/a')} |",
        f"| GPU time per probe, max (median) | {_f((st.get('gpu_time_seconds') or {}).get('max'), 2)} s "
        f"({_f((st.get('gpu_time_seconds') or {}).get('median'), 2)}) | ≤ {TARGET_GPU_TIME_S:g} s "
        f"| {v.get('gpu_time', 'n/a')} |",
        f"| worker wall incl. child start, max (median) | {_f((st.get('worker_wall_seconds') or {}).get('max'), 2)} s"
        f" ({_f((st.get('worker_wall_seconds') or {}).get('median'), 2)}) | ≤ {TARGET_WALL_S:g} s "
        f"| {v.get('worker_wall', 'n/a')} |",
        f"| whole `gpuwatch probe` CLI, max (median) | {_f((st.get('cli_wall_seconds') or {}).get('max'), 2)} s "
        f"({_f((st.get('cli_wall_seconds') or {}).get('median'), 2)}) | | |",
        f"| probes that started idle and cool | {st.get('idle_met', 0)} of {st.get('idle_checked', 0)} checked, "
        f"median wait {_f(st.get('idle_wait_seconds_median'), 1)} s | util 0, ≤ start + 3 °C | |",
        f"| power-capped probes | {st.get('power_capped', 0)} of {st.get('measured', 0)} | | |",
        f"| baseline (from {st.get('baseline_probes', 0)} probes with --update-baseline) "
        f"| {_tf(st.get('baseline_flops'))} TFLOP/s | | |",
        f"| H2D / D2H, median ({st.get('copy_kind') or '-'}) | {_gb(h2d)}{share(h2d)} / {_gb(d2h)}{share(d2h)} GB/s "
        f"| nominal {_gb(nominal)} GB/s per direction ({link}) | |",
        f"| sustained torch matmul, median of last half ({_f(doc.get('args', {}).get('sustain'), 0)} s) "
        f"| {_tfl(sus_med)} TFLOP/s | H100 fixture {FIXTURE['sustained_20s_8192_bf16_tflops']:g} | |",
        f"| sustained: best batch; first 2 s median | {_tfl(sus.get('best_batch_tflops'))}; "
        f"{_tfl(sus.get('median_tflops_first_2s'))} TFLOP/s | published ~{PUBLISHED_BF16_TFLOPS:g} | |",
        f"| sustained: power, SM clock (last half), peak °C, SW power cap share | "
        f"{_f(lt.get('power_watts_mean_last_half'), 0)} W, {_f(lt.get('sm_clock_mhz_mean_last_half'), 0)} MHz, "
        f"{_f(lt.get('temperature_c_peak'), 0)} °C, {_pct(lt.get('sw_power_cap_share_last_half'), 0)} | | |",
        f"| probe (median of idle probes 2..N) / sustained | "
        f"{_f(None if not (idle_ref and sus_med) else idle_ref / 1e12 / sus_med, 3)} | ~1 | |",
        f"| probe under a competing matmul | {_tf(comp.get('probe_flops'))} TFLOP/s, ratio to baseline "
        f"{_f(comp.get('ratio_to_baseline'), 3)}, busy-marked {cprobe.get('busy', '-')} "
        f"| H100 fixture {FIXTURE['with_a_competing_matmul_stream_tflops_median']:g} | |",
        f"| drop vs idle median | {_pct(comp.get('drop_vs_idle'))} | H100 fixture ~47 % | |",
    ]
    errors = doc.get("errors") or []
    if errors:
        rows += ["", "Errors:", *(f"- {e}" for e in errors)]
    return rows


def _idle_reference(doc: dict[str, Any]) -> float | None:
    """The idle probe throughput the others are compared with: median of probes 2..N (the first may run cold-fast),
    else of all."""
    st = (doc.get("probes") or {}).get("stats") or {}
    return (st.get("flops_from_2") or {}).get("median") or (st.get("flops_all") or {}).get("median")


# --------------------------------------------------------------------------------------------------------------------
# Driver


def say(text: str) -> None:
    print(f"[probe_study {time.strftime('%H:%M:%S')}] {text}", flush=True)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Atomic: a reader (or a cut-off run) sees the previous whole file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def interrupts_as_exceptions() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C: raise in the main thread so every `finally` runs and the children are stopped."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_phase(doc: dict[str, Any], name: str, fn: Callable[[dict[str, Any]], None], write: Callable[[], None]) -> bool:
    """Run one phase into doc[name], which is in the report from the start: whatever it measured stays there through
    a failure or an interruption. An expected failure is one line; a bug keeps its traceback in the JSON."""
    say(f"{name} …")
    res: dict[str, Any] = {}
    doc[name] = res
    ok = True
    try:
        fn(res)
        if res.get("error"):
            doc["errors"].append(f"{name}: {res['error']}")
            ok = False
    except PhaseError as exc:
        res["error"] = str(exc)
        doc["errors"].append(f"{name}: {exc}")
        say(f"{name} FAILED: {exc}")
        ok = False
    except (Interrupted, KeyboardInterrupt) as exc:
        res["error"] = f"interrupted ({exc or 'SIGINT'})"
        raise
    except Exception as exc:  # a bug in this script: keep going with the other phases, keep the evidence
        res.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        doc["errors"].append(f"{name}: unexpected {type(exc).__name__}: {exc} (traceback in the JSON)")
        say(f"{name} FAILED unexpectedly: {type(exc).__name__}: {exc}")
        ok = False
    write()
    return ok


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="JSON report (default $OUT/probe_study.json, else ./probe_study.json)")
    p.add_argument("--markdown", type=Path, help="also write the printed tables to this Markdown file")
    p.add_argument("--state-dir", type=Path, help="gpuwatch state dir for the probes (default: a temporary one)")
    p.add_argument("--gpu", type=int, default=0, help="GPU index (NVML order; default 0)")
    p.add_argument("--backend", help="gpuwatch probe --backend (default nvml; simulated in --dry-run)")
    p.add_argument("--config", help="gpuwatch config file passed to the probe (default: the built-in defaults)")
    p.add_argument("--python", default=sys.executable, help="interpreter for gpuwatch and the torch children")
    p.add_argument("--dry-run", action="store_true", help="no GPU: simulated backend, torch on the CPU, short waits")
    p.add_argument("--probes", type=int, default=10, help="idle probes (default 10)")
    p.add_argument("--baseline-probes", type=int, default=5, help="first probes with --update-baseline (default 5)")
    p.add_argument("--idle-min", type=float, help="seconds between probes at least (default 10; dry run 1)")
    p.add_argument("--idle-max", type=float, help="give up waiting for idle and cool after (default 30; dry run 3)")
    p.add_argument(
        "--budget", type=float, help="seconds the study should take; idle waits shrink to fit (300; dry run 110)"
    )
    p.add_argument("--probe-timeout", type=float, default=180.0, help="a `gpuwatch probe` child is stopped after")
    p.add_argument("--size", type=int, help="n of the torch matmuls (default 8192; dry run 512)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--device", choices=("cuda", "cpu"), help="torch device (default cuda; dry run cpu)")
    p.add_argument("--sustain", type=float, help="sustained matmul seconds (default 20; dry run 4)")
    p.add_argument("--compete-seconds", type=float, help="competing workload seconds (default 25; dry run 8)")
    p.add_argument("--compete-settle", type=float, default=2.0, help="seconds after the competitor warmed")
    p.add_argument("--compete-start-timeout", type=float, default=120.0, help="give up on the competitor after")
    p.add_argument("--batch-seconds", type=float, default=0.15, help="length of a timed batch (sustained)")
    p.add_argument("--sustain-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compete", type=float, metavar="SECONDS", help=argparse.SUPPRESS)  # the competitor child
    return p


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    dry = args.dry_run
    defaults = {
        "backend": "simulated" if dry else "nvml",
        "idle_min": 1.0 if dry else 10.0,
        "idle_max": 3.0 if dry else 30.0,
        "budget": 110.0 if dry else 300.0,
        "size": 512 if dry else 8192,
        "device": "cpu" if dry else "cuda",
        "sustain": 4.0 if dry else 20.0,
        "compete_seconds": 8.0 if dry else 25.0,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.sim_args = ["--scenario", "healthy", "--gpus", str(args.gpu + 1)] if args.backend == "simulated" else []
    args.probe_estimate = 1.0 if args.backend == "simulated" else 8.0
    if args.out is None:
        args.out = Path(os.environ["OUT"]) / "probe_study.json" if os.environ.get("OUT") else Path("probe_study.json")
    return args


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.sustain_child or args.compete is not None:  # one of our own children
        args = resolve(args)
        return sustain_child(args) if args.sustain_child else compete_child(args)
    args = resolve(args)
    started = time.monotonic()
    doc: dict[str, Any] = {
        "what": "gpuwatch matmul probe study (issue #4 hardware Show)",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "complete": False,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "targets": {"cv_pct": TARGET_CV_PCT, "gpu_time_seconds": TARGET_GPU_TIME_S, "wall_seconds": TARGET_WALL_S},
        "references": {"published_bf16_tflops_h100_sxm": PUBLISHED_BF16_TFLOPS, "fixture": FIXTURE},
        "errors": [],
    }

    def write() -> None:
        doc["elapsed_seconds"] = time.monotonic() - started
        try:
            write_json(args.out, doc)
        except OSError as exc:
            say(f"cannot write {args.out}: {exc}")

    if args.state_dir is not None:
        args.state_dir.mkdir(parents=True, exist_ok=True)
    state_dir = str(args.state_dir) if args.state_dir is not None else tempfile.mkdtemp(prefix="probe_study-state-")
    reader: GpuReader = GpuReader()
    code = EXIT_OK
    try:
        with interrupts_as_exceptions():
            say(f"{'dry run: ' if args.dry_run else ''}backend {args.backend}, GPU {args.gpu}, JSON to {args.out}")
            reader = (
                SimulatedReader(args.python, args.gpu, args.sim_args)
                if args.backend == "simulated"
                else NvmlReader(args.gpu)
            )
            if not reader.available:
                say(f"cannot read the GPU: {reader.why}")
            oks = [run_phase(doc, "environment", lambda res: res.update(phase_environment(args, reader)), write)]
            pin = cuda_pin(doc.get("environment") or {})
            reserve = args.sustain + 50.0  # sustained (torch import, allocation) and competing phases after the probes
            deadline = started + args.budget - reserve
            probing = lambda res: phase_probes(args, reader, state_dir, deadline, res)  # noqa: E731
            oks.append(run_phase(doc, "probes", probing, write))
            oks.append(run_phase(doc, "sustained", lambda res: phase_sustained(args, reader, pin, res), write))
            idle_ref = _idle_reference(doc)
            oks.append(
                run_phase(doc, "competing", lambda res: phase_competing(args, state_dir, pin, idle_ref, res), write),
            )
            code = EXIT_OK if all(oks) else EXIT_FAILED
            doc["complete"] = True
    except (Interrupted, KeyboardInterrupt) as exc:
        name = str(exc) if isinstance(exc, Interrupted) else "SIGINT"
        doc["interrupted"] = name
        doc["errors"].append(f"interrupted by {name}: the report holds what was measured until then")
        code = 143 if name == "SIGTERM" else 130
    finally:
        quiet = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGINT)}  # clean up whole
        stop_all_children()
        for s, h in quiet.items():
            signal.signal(s, h)
        reader.close()
        if args.state_dir is None:
            shutil.rmtree(state_dir, ignore_errors=True)
        if reader.errors:
            doc["reader_errors"] = reader.errors
        write()
        try:
            probes = ((doc.get("probes") or {}).get("probes")) or []
            text = "\n".join(["## probe_study", "", *probe_table(probes), "", *summary_table(doc)])
        except Exception as exc:  # the JSON is written; a table bug must not hide that
            text = f"(cannot make the tables: {type(exc).__name__}: {exc}; the JSON is complete)"
        if args.markdown is not None:
            try:
                args.markdown.parent.mkdir(parents=True, exist_ok=True)
                args.markdown.write_text(text + "\n")
            except OSError as exc:
                say(f"cannot write {args.markdown}: {exc}")
        print()
        print(text)
        print(f"\nJSON: {args.out}  ({time.monotonic() - started:.0f} s, exit {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
