"""How much of a simulated GPU's silicon works: SM, tensor and other pipes, DRAM and NVLink, by workload.

`utilization` (NVML's utilization.gpu) only says a kernel was running; these are the hardware activity counters
GPM reads (nvml.h, nvmlGpmMetricId_t). Each GPU's shares are its workload's profile times one slow, seeded
modulation m(t) = 1 + A·sin(2πt/P + φ), shared by every channel so that the physical orderings hold at every moment
(tensor ≤ SM active, any-tensor = the sum of its pipes). Its integral is closed-form, so the counters since boot
that GPM samples hold are exact at any t, however rarely anyone looked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuwatch.simulated.physics import GpuPlan, Jitter, probing

# Channels of a GPM sample's counters: every share below, then the per-link NVLink bytes.
PIPES: tuple[str, ...] = ("hmma", "dmma", "imma", "dfma", "fp64", "fp32", "fp16", "integer")
CHANNELS: tuple[str, ...] = ("sm_active", "sm_occupancy", "tensor_active", *PIPES, "dram_active")

_A = 0.04  # modulation depth: busy shares wander ±4 %
_PERIOD_S = 9.0
_CH_PHASE = 17  # Jitter channel of the modulation's phase
BOOT_UPTIME_S = 3600.0  # the GPU was up (idle) this long before the node started: counters since boot are not 0

# Shares 0-1 by workload; absent channels are 0. "busy" is the generic full load of the `busy` scenario.
PROFILES: dict[str, dict[str, float]] = {
    "busy": {
        "sm_active": 0.82,
        "sm_occupancy": 0.44,
        "hmma": 0.36,
        "fp32": 0.24,
        "fp16": 0.05,
        "integer": 0.14,
        "dram_active": 0.48,
    },
    # A transformer training step: tensor pipes (HMMA, BF16/FP16) busy most of the time, HBM well used.
    "training": {
        "sm_active": 0.94,
        "sm_occupancy": 0.52,
        "hmma": 0.78,
        "imma": 0.02,
        "fp32": 0.16,
        "fp16": 0.07,
        "integer": 0.11,
        "dram_active": 0.63,
    },
    # Always a kernel in flight (utilization 100 %), but small ones on few SMs while the GPU waits for input.
    "dataloader_starved": {
        "sm_active": 0.13,
        "sm_occupancy": 0.06,
        "hmma": 0.05,
        "fp32": 0.03,
        "integer": 0.02,
        "dram_active": 0.06,
    },
    # A process holds its memory, no kernel runs.
    "idle_allocated": {},
    # The probe's large bf16 matmul on an otherwise idle GPU: tensor pipes busy nearly all the time, few warps per SM.
    "probe": {
        "sm_active": 0.97,
        "sm_occupancy": 0.12,
        "hmma": 0.88,
        "fp32": 0.02,
        "integer": 0.03,
        "dram_active": 0.35,
    },
}
# NVLink bytes per second per link and direction while the workload runs (an all-reduce on every step in training).
NVLINK_BYTES_PER_S: dict[str, float] = {"busy": 6e9, "training": 18e9, "dataloader_starved": 0.4e9}


def workload(plan: GpuPlan) -> str | None:
    """The plan's workload profile: its own, else `busy` for a busy GPU; None for an idle one."""
    if plan.work is not None:
        return plan.work
    return "busy" if plan.busy else None


def _base(plan: GpuPlan) -> dict[str, float]:
    return _profile(workload(plan))


def _profile(name: str | None) -> dict[str, float]:
    shares = dict(PROFILES.get(name, {})) if name is not None else {}
    shares["tensor_active"] = sum(shares.get(p, 0.0) for p in ("hmma", "dmma", "imma", "dfma"))
    return shares


def _phase(jitter: Jitter) -> float:
    return math.pi * (1.0 + jitter.constant(_CH_PHASE))


def shares(plan: GpuPlan, jitter: Jitter, t: float) -> dict[str, float]:
    """Every channel's share 0-1 at `t` seconds after the node started."""
    m = 1.0 + _A * math.sin(2 * math.pi * t / _PERIOD_S + _phase(jitter))
    name = workload(plan)
    base = _profile("probe" if name is None and probing(plan, t) else name)
    return {ch: base.get(ch, 0.0) * m for ch in CHANNELS}


def probe_area(plan: GpuPlan, jitter: Jitter, t: float) -> float:
    """∫ m over every probe's load on this idle GPU until `t`: the earlier probes' (plan.probe_area_before) and the
    last one's, so the counters since boot keep what each probe added."""
    if workload(plan) is not None or plan.probe_load is None:
        return plan.probe_area_before
    since, until = plan.probe_load
    end = t if until is None else min(t, until)
    if end <= since:
        return plan.probe_area_before
    return plan.probe_area_before + _modulation_integral(jitter, end) - _modulation_integral(jitter, since)


def _modulation_integral(jitter: Jitter, t: float) -> float:
    """∫₀ᵗ m(s) ds."""
    phi = _phase(jitter)
    return t + _A * _PERIOD_S / (2 * math.pi) * (math.cos(phi) - math.cos(2 * math.pi * t / _PERIOD_S + phi))


@dataclass(frozen=True, slots=True)
class ActivityTotals:
    """Seconds each channel was active since boot (share-weighted), seconds since boot, NVLink bytes per link."""

    uptime_s: float
    active_s: dict[str, float]
    nvlink_rx_bytes: tuple[float, ...]
    nvlink_tx_bytes: tuple[float, ...]


def totals(plan: GpuPlan, jitter: Jitter, t: float, links: int) -> ActivityTotals:
    """The counters since boot at `t`: the workload ran from the node's start; before it, the GPU sat idle."""
    area = _modulation_integral(jitter, max(0.0, t))
    base = _base(plan)
    name = workload(plan)
    per_link = NVLINK_BYTES_PER_S.get(name, 0.0) * area if name is not None else 0.0
    boot_traffic = 1.5e6  # link training and keep-alive traffic before the node started
    rx = tuple(boot_traffic + per_link * (1.0 + 0.01 * link) for link in range(links))
    tx = tuple(boot_traffic + per_link * (1.0 - 0.01 * link) for link in range(links))
    probe, under_probe = _profile("probe"), probe_area(plan, jitter, t)
    return ActivityTotals(
        uptime_s=BOOT_UPTIME_S + max(0.0, t),
        active_s={ch: base.get(ch, 0.0) * area + probe.get(ch, 0.0) * under_probe for ch in CHANNELS},
        nvlink_rx_bytes=rx,
        nvlink_tx_bytes=tx,
    )


def job_totals(work: str | None, jitter: Jitter, since: float, t: float) -> ActivityTotals:
    """The counters since boot at `t` of a share of a GPU (a MIG instance) whose job, of workload `work` (None: no
    job), ran from `since`: the same shares and wobble as a whole GPU's, integrated over the job's time only."""
    area = _modulation_integral(jitter, max(0.0, t)) - _modulation_integral(jitter, max(0.0, min(since, t)))
    base = _profile(work) if work is not None else {}
    return ActivityTotals(
        uptime_s=BOOT_UPTIME_S + max(0.0, t),
        active_s={ch: base.get(ch, 0.0) * area for ch in CHANNELS},
        nvlink_rx_bytes=(),
        nvlink_tx_bytes=(),
    )
