"""One verdict per GPU: a state (healthy, degraded, unhealthy) and the one action that mends it, with its evidence.

Built on the findings /health/gpus and the status page already judge (gpuwatch.judge.findings, with the alert rules'
thresholds), so the verdict and the 200/503 of /health/gpus never disagree: a GPU's state follows its findings' levels
(a critical alert's condition: unhealthy; a warning's: degraded; no alert: healthy), and its action is the worst any
signal asks for. XIDs take their action from NVIDIA's catalogue (gpuwatch.core.xid_catalogue, the "Resolution Bucket
(Immediate Action)" column); the driver's recovery action from its value (nvml.h nvmlGpuRecoveryAction_t). The
mapping is docs/verdicts.md's table; tests/test_gpu_verdict.py holds each scenario to it.

A pure function of a store snapshot, which carries the fault ledger (gpuwatch.state.ledger): a fault the ledger
holds until it is repaired is one more step, judged the same way (gpuwatch.judge.held decides what it holds).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from gpuwatch.core.model import UnusableGpu
from gpuwatch.core.thresholds import xid_meaning
from gpuwatch.core.xid_catalogue import CATALOGUE_DATE, immediate_action
from gpuwatch.judge.findings import (
    GpuView,
    diag_failures,
    gpu_health,
    health_flags,
    node_findings,
    unrepaired_xids,
    views,
    xid_key,
)
from gpuwatch.judge.verdict import Finding, Level, ago, recent_xids
from gpuwatch.state.ledger import HELD_ACTIONS, Fault
from gpuwatch.state.store import StoreSnapshot

__all__ = [
    "ACTIONS",
    "STATES",
    "Action",
    "GpuVerdict",
    "State",
    "Step",
    "gpu_verdicts",
    "health_document",
    "held_step",
    "live_steps",
    "verdict_of",
    "view_verdict",
]

State = Literal["healthy", "degraded", "unhealthy"]
STATES: tuple[State, ...] = get_args(State)  # mildest first
# Mildest first; the worst a GPU's signals ask for wins. A reboot mends more than a reset; inspecting the hardware
# takes the node down and a person to it; replacing the GPU is the last step (the ledger's later escalation:
# reset_gpu -> inspect_hardware -> replace_gpu).
Action = Literal["none", "restart_app", "reset_gpu", "reboot_node", "inspect_hardware", "replace_gpu"]
ACTIONS: tuple[Action, ...] = get_args(Action)

_STATE_OF_LEVEL: dict[Level, State] = {"bad": "unhealthy", "warn": "degraded", "info": "healthy"}
_STATE_OF_XID_CLASS: dict[str, State] = {
    "critical": "unhealthy",
    "warning": "degraded",
    "notice": "healthy",
    "application": "healthy",
}

# What each alert's condition asks of the GPU (docs/verdicts.md), and for inspect_hardware what to inspect.
_ACTION_OF_ALERT: dict[str, tuple[Action, str]] = {
    "GpuLost": ("reboot_node", ""),
    "GpuwatchVendorCallHung": ("reboot_node", ""),  # the driver is stuck (the GPU's own call; another's: none)
    "GpuOverheating": ("inspect_hardware", "cooling"),
    "GpuTemperatureHigh": ("inspect_hardware", "cooling"),
    "GpuMemoryTemperatureHigh": ("inspect_hardware", "cooling"),
    "GpuThermalThrottling": ("inspect_hardware", "cooling"),
    "GpuPowerBrakeSlowdown": ("inspect_hardware", "power supplies and their feeds"),
    "GpuHwSlowdown": ("inspect_hardware", "power delivery"),
    "GpuPowerSupplyUndersized": ("inspect_hardware", "power cables"),
    "GpuPowerCablesNotAttached": ("inspect_hardware", "power cables"),
    "GpuPowerLimitBelowDefault": ("none", ""),  # a setting: restore the limit
    "GpuMigWithoutInstances": ("none", ""),  # a setting: create the instances (or disable MIG)
    "GpuPcieLinkDegraded": ("inspect_hardware", "seating (GPU, riser, slot)"),
    # Rates over a window the agent does not keep: no finding of its own, the rules judge them (docs/verdicts.md).
    "GpuPcieErrors": ("inspect_hardware", "seating (GPU, riser, slot)"),
    "GpuPcieNonFatalErrors": ("inspect_hardware", "seating (GPU, riser, slot)"),
    "GpuPcieFatalErrors": ("reboot_node", ""),
    "GpuNvlinkErrors": ("reset_gpu", ""),
    "GpuReset": ("none", ""),  # the reset happened; find out why
    "GpuEccUncorrectable": ("reset_gpu", ""),
    "GpuRowRemapPending": ("reset_gpu", ""),
    "GpuRowRemapFailure": ("replace_gpu", ""),
    "GpuRowRemapBanksLow": ("none", ""),  # plan a replacement; nothing to do now
    "GpuRetiredPagesNearLimit": ("none", ""),  # plan a replacement; nothing to do now
    "GpuSramEccThresholdExceeded": ("reset_gpu", ""),
    "GpuInforomCorrupted": ("replace_gpu", ""),
    "GpuFabricNotRegistered": ("reset_gpu", ""),
    "GpuFabricDegraded": ("reset_gpu", ""),  # the fabric reroutes around a fault; a reset retrains the GPU's links
    "GpuNvlinkDown": ("reset_gpu", ""),
    "GpuUnderperforming": ("reset_gpu", ""),
    "GpuSlowerThanFleet": ("reset_gpu", ""),
    "GpuProbeFailing": ("none", ""),  # read the agent's log first: the probe itself may be what fails
    "GpuComputeErrors": ("reset_gpu", ""),  # a wrong result; the ledger escalates a repeat (inspect, then replace)
    "GpuDiagFailed": ("reset_gpu", ""),  # gpuwatch diag: memory, the sustained matmul, DCGM's own diag
    "GpuDiagBandwidthLow": ("inspect_hardware", "seating (GPU, riser, slot)"),  # below the link's nominal
}
# nvml.h nvmlGpuRecoveryAction_t: 1 GPU_RESET, 2 NODE_REBOOT, 3 DRAIN_P2P, 4 DRAIN_AND_RESET (5: IMEX, newer drivers).
_ACTION_OF_RECOVERY: dict[int, Action] = {1: "reset_gpu", 2: "reboot_node", 3: "reset_gpu", 4: "reset_gpu"}
# NVIDIA's XID catalogue (gpuwatch/core/xid_catalogue.py, as of CATALOGUE_DATE): each resolution bucket's action.
_ACTION_OF_BUCKET: dict[str, tuple[Action, str]] = {
    "IGNORE": ("none", ""),
    "RESTART_APP": ("restart_app", ""),
    "CHECK_UVM": ("restart_app", ""),  # the application's unified-memory use
    "WORKFLOW_XID_45": ("restart_app", ""),  # cleanup after an earlier error; that error's XID speaks for the GPU
    "RESET_GPU": ("reset_gpu", ""),
    "WORKFLOW_XID_48": ("reset_gpu", ""),  # double-bit ECC: the workflow ends in a reset (row remap)
    "WORKFLOW_NVLINK_ERR": ("reset_gpu", ""),
    "WORKFLOW_NVLINK5_ERR": ("reset_gpu", ""),
    "XID_154": ("reset_gpu", ""),  # recovery action changed: the driver's recovery action, judged too, says more
    "CONTACT_SUPPORT": ("reset_gpu", ""),  # and open a case with NVIDIA; the ledger escalates a repeat
    "RESTART_BM": ("reboot_node", ""),  # 79: fallen off the bus
    "RESTART_VM": ("reboot_node", ""),
    "UPDATE_SWFW": ("reboot_node", ""),  # a driver or firmware update takes a reboot
    "CHECK_MECHANICALS": ("inspect_hardware", "power cables"),  # 54: auxiliary power not connected
}
_UNLISTED_XID: tuple[Action, str] = ("reset_gpu", "")  # a code or bucket the catalogue does not name (yet)
# Conditions that ask for an action while only degraded, and do not mend by themselves: the ledger holds them as it
# holds every unhealthy condition and every XID that asks for more than restarting the application. A degraded
# condition that comes and goes with the load or the weather (a GPU running hot, a slow probe, a downtrained link
# while busy) is judged as it is now and not held.
_HELD_WHILE_DEGRADED = frozenset(
    {
        "GpuEccUncorrectable",
        "GpuRowRemapPending",
        "GpuRowRemapFailure",
        "GpuSramEccThresholdExceeded",
        "GpuInforomCorrupted",
        "GpuDiagBandwidthLow",  # measured by a diag run, which stays the last one until the next run
    }
)
# A vendor call that hangs says the readings stopped, not yet what is wrong: once it returns the GPU is judged by what
# it reads (an XID 79 or a lost GPU that follows a hang is held on its own).
_NEVER_HELD = frozenset({"GpuwatchVendorCallHung"})


@dataclass(frozen=True, slots=True)
class Step:
    """One signal's judgement: the state and action it asks for and the evidence (the signal and its value)."""

    state: State
    action: Action
    evidence: str
    key: str = ""  # the signal: an alert's name or "XID 79" (the ledger's key for a fault)
    holds: bool = False  # the fault ledger keeps it until it is repaired
    at: float = 0.0  # the signal's own time (an XID's last event; a condition's: the snapshot's)
    kept: str = ""  # the evidence as the ledger keeps it (no "ago" that goes stale); empty: the evidence itself


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    """A GPU's state and recommended action; evidence lists every signal that asked for more than healthy/none."""

    index: int
    uuid: str  # empty for a GPU the library counts but cannot open (no UUID read)
    serial: str
    state: State
    action: Action
    evidence: tuple[str, ...]
    held: tuple[Fault, ...] = ()  # the faults the ledger holds for it until repaired

    @property
    def needs_action(self) -> bool:
        """More than restarting an application: the GPU (or the node around it) must be acted on."""
        return ACTIONS.index(self.action) > ACTIONS.index("restart_app")

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "serial": self.serial,
            "state": self.state,
            "action": self.action,
            "evidence": list(self.evidence),
            "held": [
                {
                    "fault": f.key,
                    "action": f.action,
                    "since": round(f.opened, 3),
                    "returns": f.returns,
                    "evidence": f.evidence,
                }
                for f in self.held
            ],
        }


def decide(steps: Iterable[Step]) -> tuple[State, Action, tuple[str, ...]]:
    """The worst state and the worst action of the steps, with the evidence of every step that asked for either."""
    steps = list(steps)
    state: State = max((s.state for s in steps), key=STATES.index, default="healthy")
    action: Action = max((s.action for s in steps), key=ACTIONS.index, default="none")
    evidence = tuple(s.evidence for s in steps if s.state != "healthy" or s.action != "none")
    return state, action, evidence


def finding_step(finding: Finding, recovery_action: int | None = None, at: float = 0.0) -> Step | None:
    """The step a finding of gpuwatch.judge.findings asks for; None for one that pages nobody (info)."""
    if not finding.attention:
        return None
    state = _STATE_OF_LEVEL[finding.level]
    if finding.alert == "GpuRecoveryActionRequired":
        action = _ACTION_OF_RECOVERY.get(recovery_action or 0, "reset_gpu")
        part = ""
    elif finding.alert == "GpuwatchVendorCallHung" and finding.level != "bad":
        action, part = "none", ""  # another GPU's call freezes this one's readings: nothing wrong with it known
    else:
        action, part = _ACTION_OF_ALERT.get(finding.alert, ("reset_gpu" if finding.level == "bad" else "none", ""))
    inspect = f", inspect the {part}" if part else ""
    holds = (
        action in HELD_ACTIONS
        and (state == "unhealthy" or finding.alert in _HELD_WHILE_DEGRADED)
        and finding.alert not in _NEVER_HELD
    )
    return Step(state, action, f"{finding.alert}: {finding.text} -> {action}{inspect}", finding.alert, holds, at)


def verdict_of(
    findings: Iterable[Finding],
    recovery_action: int | None = None,
    held: Iterable[Fault] = (),
    now: float = 0.0,
) -> tuple[State, Action, tuple[str, ...]]:
    """The state, action and evidence of one GPU's findings and the faults the ledger holds for it (`gpuwatch
    snapshot`: one reading, no XID window and no probe history)."""
    return decide(with_held([s for f in findings if (s := finding_step(f, recovery_action)) is not None], held, now))


def xid_step(code: int, total: int, age: float, cls: str, at: float = 0.0) -> Step:
    """An XID within the rules' window: its state from its alert class, its action from NVIDIA's catalogue; `at`
    is its last event's unix time."""
    bucket = immediate_action(code) if code >= 0 else None
    action, part = _ACTION_OF_BUCKET.get(bucket or "", _UNLISTED_XID)
    times = f" x{total}" if total > 1 else ""
    source = f"NVIDIA's catalogue ({CATALOGUE_DATE}): {bucket}" if bucket else "not in NVIDIA's catalogue"
    inspect = f", inspect the {part}" if part else ""
    what, why = f"{xid_key(code)}{times} ({xid_meaning(code)})", f"{source} -> {action}{inspect}"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)) if at else "earlier"
    return Step(
        _STATE_OF_XID_CLASS[cls],
        action,
        f"{what} {ago(age)} ago; {why}",
        xid_key(code),
        action in HELD_ACTIONS,
        at,
        f"{what} at {when}; {why}",
    )


def unusable_step(gpu: UnusableGpu) -> Step:
    """A GPU the library counts but cannot open: no job can run on it."""
    if gpu.reason == "insufficient_power":
        return Step(
            "unhealthy",
            "inspect_hardware",
            "GpuPowerCablesNotAttached: insufficient power, external power cables not properly attached "
            "-> inspect_hardware, inspect the power cables",
        )
    return Step("unhealthy", "reboot_node", f"GpuCountBelowExpected: unusable ({gpu.reason}) -> reboot_node")


def live_steps(view: GpuView) -> list[Step]:
    """What the GPU's signals ask for now: its findings (XIDs judged apart, by their codes) and its XIDs within
    the rules' window."""
    snap = view.snap
    recovery = view.sample.recovery_action if view.sample is not None else None
    flags = [f for f in health_flags(view) if f.alert not in ("GpuXidCritical", "GpuXidWarning")]
    diag_at = {alert: max(t.at for a, t in diag_failures(view) if a == alert) for alert, _ in diag_failures(view)}
    # A diag failure's time is its run's, so that `gpuwatch repair` after it is not undone by the same result.
    steps = [s for f in flags if (s := finding_step(f, recovery, diag_at.get(f.alert, snap.now))) is not None]
    xids = unrepaired_xids(view)
    steps += [
        xid_step(code, total, snap.now - last, cls, last) for code, total, last, cls in recent_xids(xids, snap.now)
    ]
    return steps


def held_step(fault: Fault, now: float, live: Step | None = None) -> Step:
    """A fault the ledger holds: what it asked for when it opened, escalated for each time it returned; its
    evidence the live signal's while that shows (`live`), else the ledger's."""
    escalated = (
        f"; came back {fault.returns}x: {fault.base_action} escalated to {fault.action}" if fault.returns else ""
    )
    held = f"held until repaired (since {ago(now - fault.opened)} ago){escalated}"
    return Step(
        fault.state, fault.action, f"{live.evidence if live else fault.evidence}; {held}", fault.key, True, fault.at
    )


def with_held(steps: list[Step], held: Iterable[Fault], now: float) -> list[Step]:
    """The live steps and the held faults, one step per signal: a held fault that also shows now takes the live
    step's place (its action may be escalated)."""
    out = list(steps)
    for fault in held:
        at = next((i for i, s in enumerate(out) if s.key == fault.key), None)
        if at is None:
            out.append(held_step(fault, now))
        else:
            out[at] = held_step(fault, now, out[at])  # in its place: the evidence keeps its order
    return out


def view_verdict(view: GpuView) -> GpuVerdict:
    """One GPU's verdict: what its signals ask for now, and the faults the ledger holds for it (one evidence line
    for a fault both held and showing)."""
    snap, uuid = view.snap, view.identity.uuid
    held = snap.ledger.open_faults(uuid)
    steps = with_held(live_steps(view), held, snap.now)
    return GpuVerdict(view.identity.index, uuid, view.identity.serial, *decide(steps), held)


def gpu_verdicts(snap: StoreSnapshot) -> list[GpuVerdict]:
    """Every GPU's verdict, by index: the GPUs the store knows, then the ones a library counts but cannot open."""
    out = [view_verdict(view) for view in views(snap)]
    for gpu in snap.unusable:
        out.append(GpuVerdict(gpu.index, "", "", *decide([unusable_step(gpu)])))
    return sorted(out, key=lambda v: (v.index, v.uuid))


def health_document(snap: StoreSnapshot, node: str) -> tuple[bool, dict[str, Any]]:
    """/health/gpus as JSON: `healthy` is the plain answer's 200 (so the two never disagree), the GPUs' verdicts,
    and the node's own problems (a vendor library down, GPUs missing, the host's power) as `node_findings`."""
    ok, _ = gpu_health(snap)  # held faults included
    document = {
        "node": node,
        "healthy": ok,
        "gpus": [v.as_json() for v in gpu_verdicts(snap)],
        "node_findings": [f"{f.alert}: {f.text}" for f in node_findings(snap) if f.attention],
    }
    return ok, document
