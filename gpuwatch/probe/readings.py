"""What the probe runner makes of the store's samples and the baselines: whether a GPU can be probed at all,
whether its power limit is observable and reached, the telemetry of a run, and the baseline a GPU had before."""

from __future__ import annotations

from statistics import fmean

from gpuwatch.model import GpuSample
from gpuwatch.probe.baseline import Baseline
from gpuwatch.probebook import Telemetry

UNSUPPORTED_COMPUTE_MODES = frozenset({"exclusive_thread", "exclusive_process", "prohibited"})
CAP_POWER_SHARE = 0.97  # at or above this share of the enforced limit the GPU is at its power cap


def _unsupported(sample: GpuSample) -> str | None:
    if sample.mig_enabled:
        return "MIG mode is enabled"
    if sample.compute_mode in UNSUPPORTED_COMPUTE_MODES:
        return f"compute mode is {sample.compute_mode}"
    return None


def _power_observable(sample: GpuSample) -> bool:
    return "sw_power_cap" in sample.throttle_active or (
        sample.power_watts is not None and sample.power_limit_watts.get("enforced") is not None
    )


def _at_power_cap(sample: GpuSample) -> bool:
    if sample.throttle_active.get("sw_power_cap"):
        return True
    limit = sample.power_limit_watts.get("enforced")
    return sample.power_watts is not None and bool(limit) and sample.power_watts >= CAP_POWER_SHARE * float(limit or 0)


def _telemetry(samples: list[GpuSample]) -> Telemetry:
    sm = [s.clock_hertz["sm"] for s in samples if s.clock_hertz.get("sm") is not None]
    power = [s.power_watts for s in samples if s.power_watts is not None]
    temps = [s.temperature_celsius["core"] for s in samples if s.temperature_celsius.get("core") is not None]
    return Telemetry(
        sm_clock_hertz=fmean(sm) if sm else None,
        power_watts=fmean(power) if power else None,
        temperature_celsius=max(temps) if temps else None,
        samples=len(samples),
    )


def _previous(baseline: Baseline | None) -> tuple[str, float] | None:
    """(dtype, FLOP/s) of the baseline a GPU had before its current key (a driver or library roll-out)."""
    if baseline is None or baseline.previous_key is None or baseline.previous_flops is None:
        return None
    return baseline.previous_key.dtype, baseline.previous_flops
