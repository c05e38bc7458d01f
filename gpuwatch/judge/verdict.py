"""What is wrong with a GPU or the host's power, judged as the alert rules judge it, in words a person acts on.

The status page, `gpuwatch snapshot` and `/health/gpus` all read their verdicts from here, and every number comes
from gpuwatch.core.thresholds (the same values as the rules' ``gpuwatch:threshold:*`` records). Each finding names the
alert whose condition it is, so its "what to do" line links that alert's runbook (/runbooks#<alert> on the agent).

The rules judge over time (``for:`` durations, rates over a window); a single reading cannot, so a finding here is the
condition *now* — what the alert fires on once it has held for its duration.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from gpuwatch.core.model import GpuIdentity, GpuSample, HostPsu, HostSample, HostVoltage, UnusableGpu
from gpuwatch.core.thresholds import runbook_url, threshold, xid_class, xid_meaning
from gpuwatch.core.xid_catalogue import immediate_action

__all__ = [
    "BENIGN_REASONS",
    "Finding",
    "judge_gpu",
    "judge_host",
    "judge_psu",
    "judge_rail",
    "judge_unusable",
    "judge_xids",
    "rail_limit",
    "recent_xids",
    "reference_limit",
]

# Reasons that are normal and say nothing about health (an idle GPU, a GPU at its power cap under load).
BENIGN_REASONS = frozenset(
    {"gpu_idle", "sw_power_cap", "applications_clocks", "display_clock", "sync_boost", "low_utilization"}
)
Level = Literal["bad", "warn", "info"]  # bad: a critical alert's condition; warn: a warning's; info: no alert
LEVELS: tuple[Level, ...] = get_args(Level)  # worst first


@dataclass(frozen=True, slots=True)
class Finding:
    """One condition: how bad (bad, warn, info), the alert it is, what is wrong (now against its limit), what to do."""

    level: Level
    alert: str
    text: str
    remedy: str

    @property
    def runbook(self) -> str:
        return runbook_url(self.alert)

    @property
    def attention(self) -> bool:
        return self.level in ("bad", "warn")


def judge_gpu(identity: GpuIdentity, sample: GpuSample, configured_limit_watts: float | None = None) -> list[Finding]:
    """Every alert condition one fresh reading shows, worst first."""
    out: list[Finding] = []
    _thermal(identity, sample, out)
    _throttle(sample, out)
    _power(identity, sample, configured_limit_watts, out)
    _pcie(sample, out)
    _memory_health(sample, out)
    _board(sample, out)
    _mig(identity, sample, out)
    return sorted(out, key=lambda f: LEVELS.index(f.level))


def _thermal(identity: GpuIdentity, s: GpuSample, out: list[Finding]) -> None:
    core = s.temperature_celsius.get("core")
    slowdown = s.temperature_threshold_celsius.get(("core", "slowdown"))
    hw_thermal = bool(s.throttle_active.get("hw_thermal"))
    margin = threshold("core_temperature_margin_celsius")
    nvidia_limit = threshold("nvidia_core_temperature_celsius")
    limit_words = f"slowdown at {slowdown:.0f} °C" if slowdown is not None else "no slowdown threshold read"
    if core is not None and ((slowdown is not None and core >= slowdown) or hw_thermal):
        why = " (hardware thermal slowdown)" if hw_thermal else ""
        out.append(
            Finding(
                "bad",
                "GpuOverheating",
                f"overheating: {core:.0f} °C, {limit_words}{why}",
                "check the cooling (fans, airflow, inlet temperature); drain the GPU if it keeps overheating",
            )
        )
    elif hw_thermal:
        out.append(
            Finding("bad", "GpuOverheating", "hardware thermal slowdown", "check the cooling (fans, airflow, inlet)")
        )
    elif core is not None and (
        (slowdown is not None and core >= slowdown - margin) or (identity.vendor == "nvidia" and core > nvidia_limit)
    ):
        limit = f"{limit_words} (warns {margin:.0f} °C before it)" if slowdown is not None else ""
        if identity.vendor == "nvidia" and core > nvidia_limit:
            # gpuwatch's own threshold (GpuTemperatureHigh's), named as such; the device's limits by its own values.
            max_operating = s.temperature_threshold_celsius.get(("core", "max_operating"))
            device = [f"max operating {max_operating:.0f} °C"] if max_operating is not None else []
            device += [limit_words] if slowdown is not None else []
            limit = ", ".join([f"above gpuwatch's {nvidia_limit:.0f} °C threshold", *device])
        out.append(
            Finding(
                "warn",
                "GpuTemperatureHigh",
                f"runs hot: {core:.0f} °C, {limit}",
                "look for a cooling problem before it throttles: fans, airflow, a hot neighbour, room temperature",
            )
        )
    memory = s.temperature_celsius.get("memory")
    memory_max = s.temperature_threshold_celsius.get(("memory", "max_operating"))
    memory_margin = threshold("memory_temperature_margin_celsius")
    if memory is not None and memory_max is not None and memory >= memory_max - memory_margin:
        out.append(
            Finding(
                "warn",
                "GpuMemoryTemperatureHigh",
                f"memory hot: {memory:.0f} °C, limit {memory_max:.0f} °C (warns {memory_margin:.0f} °C before it)",
                "check the cooling over the HBM (airflow, fans); drain the GPU if it stays at its limit",
            )
        )


def _throttle(s: GpuSample, out: list[Finding]) -> None:
    active = {r for r, on in s.throttle_active.items() if on}
    if "sw_thermal" in active and "hw_thermal" not in active:
        out.append(
            Finding(
                "warn",
                "GpuThermalThrottling",
                "thermal throttling: software thermal slowdown holds the clocks down",
                "improve the cooling; the GPU computes slower while it lasts",
            )
        )
    if "hw_power_brake" in active:
        out.append(
            Finding(
                "bad",
                "GpuPowerBrakeSlowdown",
                "power brake: the hardware power brake holds the clocks down",
                "check the node's power supplies and their feeds (an external brake signal: a PSU sagging or failing)",
            )
        )
    if "hw_slowdown" in active and not active & {"hw_thermal", "hw_power_brake"}:
        out.append(
            Finding(
                "warn",  # GpuHwSlowdown is a warning: the GPU computes, slower (docs/verdicts.md: degraded)
                "GpuHwSlowdown",
                "hardware slowdown (neither thermal nor power brake)",
                "check power delivery and the GPU's board; reset the GPU, replace it if it persists",
            )
        )
    other = sorted(active - BENIGN_REASONS - {"sw_thermal", "hw_thermal", "hw_power_brake", "hw_slowdown"})
    if other:
        out.append(
            Finding(
                "info",
                "GpuHwSlowdown",
                "throttling: " + ", ".join(r.replace("_", " ") for r in other),
                "no alert on its own; watch whether it persists",
            )
        )


def reference_limit(s: GpuSample, configured: float | None) -> tuple[float | None, str]:
    """The limit an enforced power limit is judged against: the configured one, else the GPU's default."""
    if configured is not None:
        return configured, "configured"
    return s.power_limit_watts.get("default"), "default"


def _restore_power_limit(identity: GpuIdentity, watts: float) -> str:
    """The vendor's command that sets this GPU's power limit back: nvidia-smi -pl, or amd-smi set --power-cap WATTS
    (ROCm/amdsmi amdsmi_cli/amdsmi_parser.py, the set subcommand)."""
    if identity.vendor == "amd":
        return f"amd-smi set -g {identity.index} --power-cap {watts:.0f}"
    return f"nvidia-smi -i {identity.index} -pl {watts:.0f}"


def _power(identity: GpuIdentity, s: GpuSample, configured: float | None, out: list[Finding]) -> None:
    enforced = s.power_limit_watts.get("enforced")
    reference, which = reference_limit(s, configured)
    ratio = threshold("power_limit_ratio")
    if enforced is not None and reference is not None and enforced < ratio * reference:
        out.append(
            Finding(
                "warn",
                "GpuPowerLimitBelowDefault",
                f"power-capped: limit {enforced:.0f} W, {which} {reference:.0f} W (warns below {ratio:.0%})",
                f"restore the limit: {_restore_power_limit(identity, reference)} (or find who lowered it)",
            )
        )
    if s.power_supply_undersized:
        out.append(
            Finding(
                "bad",
                "GpuPowerSupplyUndersized",
                "power supply undersized: the driver reports the GPU's power source as too small",
                "check the GPU's power cables and the node's supplies",
            )
        )


def _pcie(s: GpuSample, out: list[Finding]) -> None:
    gen, width = s.pcie_link_generation, s.pcie_link_width
    busy = threshold("pcie_busy_utilization_ratio")
    low_gen = "current" in gen and "max" in gen and gen["current"] < gen["max"]
    low_width = "current" in width and "max" in width and width["current"] < width["max"]
    if not (low_gen or low_width):
        return
    now = f"gen {gen.get('current', '?')} x{width.get('current', '?')}"
    link = f"{now} of gen {gen.get('max', '?')} x{width.get('max', '?')}"
    if s.utilization_ratio is not None and s.utilization_ratio > busy:
        out.append(
            Finding(
                "warn",
                "GpuPcieLinkDegraded",
                f"PCIe link downtrained: {link} while busy",
                "reseat the GPU or its riser, check the slot; a link that keeps downtraining means replacing it",
            )
        )


def _memory_health(s: GpuSample, out: list[Finding]) -> None:
    uncorrectable = (s.ecc_errors_total.get("uncorrected") or 0) + (s.ecc_errors_total.get("deferred") or 0)
    if uncorrectable:
        # A lifetime count: the GpuEccUncorrectable alert judges its growth, so the count alone is a warning.
        out.append(
            Finding(
                "warn",
                "GpuEccUncorrectable",
                f"{uncorrectable:.0f} uncorrectable ECC errors (lifetime count)",
                "drain the GPU if the count grows, then reset it; replace it if errors return",
            )
        )
    if s.row_remap_failed:
        out.append(
            Finding("bad", "GpuRowRemapFailure", "row remap failed", "drain the GPU and replace it (RMA): no spare row")
        )
    elif s.row_remap_pending:
        out.append(
            Finding("warn", "GpuRowRemapPending", "row remap pending", "drain the GPU and reset it to apply the remap")
        )
    low_banks = (s.row_remap_banks.get("low") or 0) + (s.row_remap_banks.get("none") or 0)
    if low_banks > 0:
        out.append(
            Finding(
                "warn",
                "GpuRowRemapBanksLow",
                f"{low_banks} memory banks with low or no spare rows",
                "plan to replace the GPU: its next failing row may not remap",
            )
        )
    if s.sram_ecc_threshold_exceeded:
        out.append(
            Finding(
                "warn",
                "GpuSramEccThresholdExceeded",
                "SRAM ECC errors past the driver's threshold",
                "drain the GPU and reset it; replace it if it happens again",
            )
        )
    pages, limit = s.retired_pages, s.retired_pages_limit
    pages_ratio = threshold("retired_pages_ratio")
    if pages is not None and limit and pages / limit > pages_ratio:
        out.append(
            Finding(
                "warn",
                "GpuRetiredPagesNearLimit",
                f"retired pages {pages} of {limit} allowed (warns past {pages_ratio:.0%})",
                "plan to replace the GPU before the driver gives it up",
            )
        )


_RECOVERY = {1: "reset the GPU", 2: "reboot the node", 3: "drain peer-to-peer", 4: "drain and reset", 5: "recover IMEX"}


def _board(s: GpuSample, out: list[Finding]) -> None:
    if s.recovery_action:
        action = _RECOVERY.get(s.recovery_action, "see the runbook")
        out.append(
            Finding(
                "bad",
                "GpuRecoveryActionRequired",
                f"driver asks for recovery action {s.recovery_action} ({action})",
                f"drain the GPU, then {action}",
            )
        )
    if s.fabric_healthy is False:
        out.append(
            Finding(
                "bad",
                "GpuFabricNotRegistered",
                "not registered with the NVLink fabric",
                "check nvidia-fabricmanager on the node; restart it",
            )
        )
    holding = [condition for condition, holds in s.fabric_health.items() if holds]
    if holding:
        words = [
            f"incorrect configuration ({s.fabric_misconfiguration})"
            if c == "incorrect_configuration" and s.fabric_misconfiguration
            else c.replace("_", " ")
            for c in holding
        ]
        out.append(
            Finding(
                "warn",
                "GpuFabricDegraded",
                f"NVLink fabric health: {', '.join(words)}",
                "drain the GPU; check nvidia-fabricmanager's log and the NVSwitch trays, then reset the GPU",
            )
        )
    down = sorted(link for link, up in s.nvlink_up.items() if not up)
    if down and any(s.nvlink_up.values()):  # some links up, some down: links that exist and dropped
        out.append(
            Finding(
                "bad",
                "GpuNvlinkDown",
                f"NVLink {', '.join(down)} down of {len(s.nvlink_up)}",
                "drain the GPU and reset it; reseat or replace the GPU or its NVLink bridge if the link stays down",
            )
        )
    if s.inforom_valid is False:
        out.append(
            Finding(
                "warn",
                "GpuInforomCorrupted",
                "InfoROM corrupted (checksum fails)",
                "drain the GPU; reflash the InfoROM with NVIDIA's tools or replace the GPU",
            )
        )


def _mig(identity: GpuIdentity, s: GpuSample, out: list[Finding]) -> None:
    """A MIG-enabled GPU with no MIG device takes no job: with MIG enabled, CUDA runs only inside an instance (NVIDIA
    MIG User Guide, "CUDA Device Enumeration"; docs/mig.md). The instances are read on slow polls, so the finding
    waits for one (mig_enabled unknown before)."""
    if identity.vendor == "nvidia" and s.mig_enabled and not s.mig_devices:  # AMD's "MIG" is a compute partition
        out.append(
            Finding(
                "warn",
                "GpuMigWithoutInstances",
                "MIG enabled with no instance: no job can run on it",
                f"create its instances (nvidia-smi mig -i {identity.index} -cgi PROFILES -C, or the node's MIG "
                f"manager), or disable MIG (nvidia-smi -i {identity.index} -mig 0)",
            )
        )


def judge_xids(xids: Iterable[tuple[int, int, float]], now: float) -> list[Finding]:
    """(code, count, last unix time) per XID code: a finding per code within the rules' XID window, worst first.
    Application and notice XIDs are listed (info) and page nobody, as in the rules (GpuXidNotice is a notice)."""
    out = []
    for code, total, last, cls in recent_xids(xids, now):
        age = now - last
        label = "other" if code < 0 else str(code)
        times = f" ×{total}" if total > 1 else ""
        text = f"XID {label}{times} ({xid_meaning(code)}) {ago(age)} ago"
        if cls == "critical":
            out.append(Finding("bad", "GpuXidCritical", text, "drain the GPU and reset it (or reboot the node)"))
        elif cls == "warning":
            action = immediate_action(code) if code >= 0 else None
            remedy = (
                f"NVIDIA's catalogue: {action}" if action else "read it in dmesg; NVIDIA's catalogue names no action"
            )
            out.append(Finding("warn", "GpuXidWarning", text, f"{remedy}; drain the GPU when convenient"))
        elif cls == "notice":
            out.append(
                Finding(
                    "info",
                    "GpuXidNotice",
                    text,
                    f"NVIDIA's catalogue: {immediate_action(code)}; restart the job if it failed: no action on the GPU",
                )
            )
        else:
            out.append(Finding("info", "GpuXidWarning", text, "an application's fault or none: no action on the GPU"))
    return sorted(out, key=lambda f: LEVELS.index(f.level))


def recent_xids(xids: Iterable[tuple[int, int, float]], now: float) -> list[tuple[int, int, float, str]]:
    """(code, count, last unix time, alert class) of each XID within the rules' XID window, newest first: the XIDs
    judge_xids and the GPU's verdict (gpuwatch.judge.gpu_verdict) both judge."""
    window = threshold("xid_window_seconds")
    recent = [(code, total, last) for code, total, last in xids if now - last < window]
    return [
        (code, total, last, xid_class(code, alone=all(other == code for other, _, _ in recent)))
        for code, total, last in sorted(recent, key=lambda x: -x[2])
    ]


def judge_unusable(gpu: UnusableGpu) -> Finding:
    where = f" (PCI {gpu.pci_bus_id})" if gpu.pci_bus_id else ""
    if gpu.reason == "insufficient_power":
        return Finding(
            "bad",
            "GpuPowerCablesNotAttached",
            f"GPU {gpu.index}{where}: insufficient power, its external power cables are not properly attached",
            "attach the GPU's power cables (the node must be powered off)",
        )
    return Finding(
        "bad", "GpuCountBelowExpected", f"GPU {gpu.index}{where}: unusable ({gpu.reason})", "see the runbook"
    )


def rail_limit(v: HostVoltage) -> float | None:
    """The rail's lower limit by magnitude, as HostPsuRailUndervoltage takes it: its own min, else nominal × the
    ratio of its sign (ATX: ±5 % positive, ±10 % negative)."""
    if v.min_volts is not None:
        return abs(v.min_volts)
    if v.nominal_volts is not None:
        ratio = "negative_rail_voltage_ratio" if v.nominal_volts < 0 else "rail_voltage_ratio"
        return abs(v.nominal_volts) * threshold(ratio)
    return None


def judge_rail(v: HostVoltage) -> Finding | None:
    limit = rail_limit(v)
    if limit is None or abs(v.volts) >= limit:
        return None
    return Finding(
        "bad",
        "HostPsuRailUndervoltage",
        f"rail {v.sensor} ({v.chip}) {v.volts:.2f} V, below its limit {limit:.2f} V",
        "check the power supplies and their feeds; a 12 V rail sagging under GPU load is a failing or small supply",
    )


def judge_psu(p: HostPsu) -> Finding | None:
    if p.up:
        return None
    states = f" ({p.states})" if p.states else ""
    return Finding(
        "bad", "HostPsuFailed", f"power supply {p.psu} failed{states}", "check its feed and cable; replace the supply"
    )


def judge_host(samples: Iterable[HostSample]) -> list[Finding]:
    """Rails below their limits, failed supplies, lost redundancy, across the host sources."""
    out: list[Finding] = []
    redundancy: list[bool] = []
    for sample in samples:
        out += [f for v in sample.voltages if (f := judge_rail(v)) is not None]
        out += [f for p in sample.psus if (f := judge_psu(p)) is not None]
        if sample.psu_redundancy_lost is not None:
            redundancy.append(sample.psu_redundancy_lost)
    if any(redundancy):
        out.append(
            Finding(
                "warn",
                "HostPsuRedundancyLost",
                "power-supply redundancy lost: one more failure takes the node down",
                "restore the failed supply or feed",
            )
        )
    return out


def ago(seconds: float) -> str:
    """A duration as a person reads it: 45 s, 12 min, 3 h."""
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"
