"""What the probe runner makes of the store's samples and the baselines: whether a GPU can be probed at all,
whether its power limit is observable and reached, the telemetry of a run, and the baseline a GPU had before."""

from __future__ import annotations

import logging
import math

from gpuwatch.core.latch import Latch
from gpuwatch.core.model import GpuSample
from gpuwatch.core.thresholds import runbook_reference, threshold
from gpuwatch.probe.baseline import Baseline
from gpuwatch.state.probebook import Telemetry

log = logging.getLogger(__name__)

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
        sm_clock_hertz=math.fsum(sm) / len(sm) if sm else None,  # statistics.fmean
        power_watts=math.fsum(power) / len(power) if power else None,
        temperature_celsius=max(temps) if temps else None,
        samples=len(samples),
    )


def _previous(baseline: Baseline | None) -> tuple[str, float] | None:
    """(dtype, FLOP/s) of the baseline a GPU had before its current key (a driver or library roll-out)."""
    if baseline is None or baseline.previous_key is None or baseline.previous_flops is None:
        return None
    return baseline.previous_key.dtype, baseline.previous_flops


# Reasons that hold a GPU's clocks down for something other than the probe's own load: a probe now would measure
# the throttling (reported by the telemetry alerts already), and a baseline must never learn from it.
_HELD_DOWN = ("sw_thermal", "hw_thermal", "hw_power_brake", "hw_slowdown")


def held_down(sample: GpuSample) -> str | None:
    """Why this GPU is not probed now: a thermal or power slowdown holds its clocks down at idle."""
    active = [reason for reason in _HELD_DOWN if sample.throttle_active.get(reason)]
    if not active:
        return None
    return f"clocks held down ({', '.join(active)}): a probe would measure the slowdown, not the GPU"


class SpeedLog:
    """A GPU slower than its baseline is the operator's to act on: a warning once, and a line when it recovers
    (the same ratio as GpuUnderperforming, gpuwatch.core.thresholds)."""

    def __init__(self) -> None:
        self._slow = Latch(log)  # by UUID

    def judge(self, index: int, uuid: str, ratio: float) -> None:
        if ratio < threshold("probe_baseline_ratio"):
            self._slow.fail(
                "probe on GPU %d computes %.0f %% of its own baseline: check its clocks, power and temperature (%s)",
                index,
                ratio * 100,
                runbook_reference("GpuUnderperforming"),
                key=uuid,
            )
        else:
            self._slow.recover("probe on GPU %d is back at %.0f %% of its baseline", index, ratio * 100, key=uuid)
