"""AMD SMI's numbers for the AMD backend (gpuwatch/backends/amdsmi.py): status codes and what the operator should do
about each, the residency keys and their throttle reasons, the per-GPU record, loading the library, and the small
conversions of AMD SMI's answers."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import io
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.backends.tiered import TieredGpu

# amdsmi_wrapper.AMDSMI_STATUS_*: the same numbers in 6.x and 7.x.
_NOT_SUPPORTED = 2
_NO_DATA = 40
# The library as a whole cannot be used; what the operator should do about each.
_LIBRARY_PROBLEMS: dict[int, str] = {
    4: "libamd_smi.so could not load a module it needs: reinstall amd-smi-lib (ROCm)",
    5: "libamd_smi.so lacks a symbol the amdsmi package needs: install the amdsmi package of the host's ROCm version",
    18: "AMD SMI failed to initialise: check that the amdgpu driver is loaded (lsmod | grep amdgpu) and see dmesg",
    32: "AMD SMI is not initialised (it was shut down underneath the agent); the agent reopens it",
    34: "the amdgpu kernel driver is not loaded: modprobe amdgpu, or reboot; see dmesg",
}
# The value is not available now (or ever, for the first two: remembered per GPU until the driver changes).
_PERMANENT = frozenset({2, 3})  # NOT_SUPPORTED, NOT_YET_IMPLEMENTED
_UNAVAILABLE = frozenset({1, 9, 10, 30, _NO_DATA}) | _PERMANENT  # INVAL, RETRY, NO_PERM, BUSY, NO_DATA
_PCIE_GENERATION_MTS = ((1, 2500), (2, 5000), (3, 8000), (4, 16000), (5, 32000), (6, 64000))

# gpu_metrics / violation-status residency keys and the schema's reason for each (see the module docstring).
_RESIDENCY = (
    ("ppt_residency_acc", "acc_ppt_pwr", "sw_power_cap"),
    ("prochot_residency_acc", "acc_prochot_thrm", "hw_slowdown"),
    ("socket_thm_residency_acc", "acc_socket_thrm", "sw_thermal"),
    ("hbm_thm_residency_acc", "acc_hbm_thrm", "sw_thermal"),
    ("vr_thm_residency_acc", "acc_vr_thrm", "sw_thermal"),
)
THROTTLE_REASONS: tuple[str, ...] = ("sw_power_cap", "hw_slowdown", "sw_thermal")
# The share of the time between two polls a reason must have held the clocks to be ``throttle_active``. AMD's own
# "active" (amd_smi.cc amdsmi_get_violation_status: active_* = per_* > 0, whole per cent over a ~100 ms window) is
# set by a single firmware tick, and a busy MI300X's firmware regulates at its temperature and power limits a few
# per cent of the time as a matter of course: a flag that any tick sets would read "throttled" on every healthy
# GPU, which is not what the same flag means on NVIDIA (a reason asserted at the moment of the poll). 5 %: clocks
# held down less than that cannot cost the GPU more than that share of its throughput, and gpuwatch judges a GPU
# slow only from 5 % below its own baseline (gpuwatch:threshold:probe_baseline_ratio 0.95; the probe repeats within
# 1 %). The seconds (gpuwatch_gpu_throttle_seconds_total) count every tick; only the flag has this floor.
ACTIVE_SHARE = 0.05


@dataclass
class _Residency:
    """The last residency counters of a GPU and the seconds the agent has made of them."""

    accumulation: int | None = None
    counters: dict[str, int] = field(default_factory=dict)
    at: float = 0.0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(THROTTLE_REASONS, 0.0))
    active: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(THROTTLE_REASONS, False))
    from_metrics: bool = True  # False: gpu_metrics lacks them, violation status (slow tier) feeds them


@dataclass
class _Gpu(TieredGpu):
    """What the backend keeps about one processor handle between polls."""

    primary: bool = True  # partition 0 of its socket: the one that exports socket-level readings
    residency: _Residency = field(default_factory=_Residency)
    xgmi_links: int = 0
    edge_limit_zero: bool = False  # an edge limit of 0: amd-smi shows the edge temperature as N/A (see _celsius)
    unique_id: int | None = None  # the driver's unique id (asic_serial), which ROCr names the GPU by
    kfd_node: int | None = None  # the GPU's KFD node: ROCr enumerates GPUs in node order
    partitions: int = 1  # processor handles of this GPU (compute partitions), known once all are enumerated


def load_amdsmi(importer: Callable[[], Any] | None = None) -> Any:
    """``import amdsmi``, never a crash: without ROCm's libamd_smi.so the import prints to stdout and raises
    KeyError('libamd_smi.so'), not ImportError, so every exception becomes BackendUnavailable."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            return importer() if importer is not None else importlib.import_module("amdsmi")
    except ModuleNotFoundError as exc:
        if exc.name == "amdsmi":
            raise BackendUnavailable(
                "the amdsmi Python package is not installed: pip install 'gpuwatch-agent[amd]'"
            ) from exc
        raise BackendUnavailable(f"AMD SMI library not found: {exc}") from exc
    except Exception as exc:
        said = " ".join(captured.getvalue().split())
        raise BackendUnavailable(
            "AMD SMI library not found (libamd_smi.so): install ROCm's amd-smi-lib on this host, or set "
            f"ROCM_PATH to where it lives ({type(exc).__name__}: {exc}{'; ' + said if said else ''})"
        ) from exc


def _code(exc: BaseException) -> int:
    getter = getattr(exc, "get_error_code", None)
    try:
        return abs(int(getter() if callable(getter) else getattr(exc, "err_code", -1)))
    except (TypeError, ValueError):
        return -1


def _number(value: Any) -> float | None:
    """A reading, or None for "N/A" strings, None and other non-numbers AMD SMI answers with."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _celsius(value: Any) -> float | None:
    """A temperature or temperature limit; 0 °C is not available. amd-smi prints a limit of 0 as N/A, and the edge
    temperature as N/A while its limit is 0 (ROCm/amdsmi amdsmi_cli/amdsmi_commands.py, `amd-smi static --limit`
    and `amd-smi metric --temperature`): a sensor or limit the board lacks reads 0. A 0 °C limit exported would make
    `temperature >= threshold` true on a healthy GPU."""
    celsius = _number(value)
    return None if celsius == 0 else celsius


def _text(value: Any) -> str:
    """A string reading, '' for "N/A" and non-strings."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value.strip() if isinstance(value, str) and value.strip() not in ("N/A", "") else ""


def _hex(value: Any) -> int | None:
    """A hex string ("0x0123456789ABCDEF", as amdsmi formats asic_serial) as a number; None for "N/A" and junk."""
    try:
        return int(_text(value), 16) if _text(value) else None
    except ValueError:
        return None


def _generation(speed: Any) -> int | None:
    """PCIe speed in MT/s (some releases say GT/s, some 0.1 GT/s) as the generation that runs at it."""
    mts = _number(speed)
    if mts is None or mts <= 0:
        return None
    if mts < 100:  # GT/s
        mts *= 1000
    elif mts < 1000:  # 0.1 GT/s
        mts *= 100
    return min(_PCIE_GENERATION_MTS, key=lambda row: abs(row[1] - mts))[0]


def _package_version(lib: Any) -> str:
    """The version of the amdsmi Python package the module came from."""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        if getattr(lib, "__name__", "") == "amdsmi":
            return importlib.metadata.version("amdsmi")
    return str(getattr(lib, "__version__", ""))


def _pci_device(gpu: _Gpu) -> str:
    """The PCI device of a processor: compute partitions of one GPU share it, with the partition in the function
    bits (kfd_topology.c kfd_topology_add_device: location_id |= node_id when the device has several nodes)."""
    return gpu.identity.pci_bus_id.lower().rpartition(".")[0] or gpu.identity.uuid


def _handle_key(handle: Any) -> Hashable:
    """A processor handle by the address it holds: two c_void_p of one GPU compare unequal, and amdsmi 6.x's event
    reader gives the bare address (an int) where 7.x wraps it in a c_void_p."""
    if isinstance(handle, int) and not isinstance(handle, bool):
        return handle
    value = getattr(handle, "value", None)
    return value if value is not None else id(handle)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def update_residency(gpu: _Gpu, accumulation: float | None, counters: dict[str, int], now: float, keys: int) -> None:
    """Share of the time since the last read each reason held the clocks, turned into seconds."""
    residency = gpu.residency
    if accumulation is None or not counters:
        return
    named = {row[keys]: row[2] for row in _RESIDENCY}
    before, before_counters, elapsed = residency.accumulation, residency.counters, now - residency.at
    shares: dict[str, float] = dict.fromkeys(THROTTLE_REASONS, 0.0)
    if before is not None and accumulation > before and elapsed > 0:
        for key, value in counters.items():
            if key in before_counters and value >= before_counters[key]:
                share = min(1.0, (value - before_counters[key]) / (accumulation - before))
                reason = named[key]
                shares[reason] = max(shares[reason], share)  # thermal causes overlap: the largest, not the sum
        for reason, share in shares.items():
            residency.seconds[reason] += share * elapsed
            residency.active[reason] = share >= ACTIVE_SHARE
    residency.accumulation, residency.counters, residency.at = int(accumulation), dict(counters), now
