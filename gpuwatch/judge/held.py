"""What the fault ledger holds: which of a GPU's verdict steps open a fault, how a fault that returns escalates,
and when a fault closes without a person (a clean probe after a reboot).

Run by the agent after each poll against the ledger's records (gpuwatch.state.ledger.Records), so the verdict of
every later snapshot includes what is held (gpuwatch.judge.gpu_verdict.held_step):
- a step that asks for more than restarting the application and does not mend by itself (`Step.holds`) opens a
  fault under its key, unless one is open already; the same event read again (an XID after an agent restart, older
  than the repair that closed its fault) opens none;
- a fault of a key that was closed before, or an open one seen again in a new boot, has returned: every
  `escalate_after` returns take its action one step up the ladder (reset_gpu or reboot_node -> inspect_hardware ->
  replace_gpu), as gpud escalates an XID that survives reboots;
- a fault a reset or reboot cures (reset_gpu, reboot_node) closes by itself once the node has rebooted since the
  fault was last seen, its signal is gone, and the GPU's probe has run clean (ok, not slow) in the new boot. A GPU
  reset alone leaves nothing NVML reports, so after `nvidia-smi -r` it takes `gpuwatch repair`.
"""

from __future__ import annotations

from dataclasses import replace

from gpuwatch.judge.findings import LIFETIME_COUNTS, views
from gpuwatch.judge.gpu_verdict import Step, live_steps
from gpuwatch.state.ledger import (
    MAX_BOOTS_PER_FAULT,
    MAX_EVIDENCE_CHARS,
    Closure,
    Fault,
    GpuRecord,
    HeldAction,
    Records,
)
from gpuwatch.state.store import StoreSnapshot

DEFAULT_ESCALATE_AFTER = 2
ESCALATION: dict[HeldAction, HeldAction] = {
    "reset_gpu": "inspect_hardware",
    "reboot_node": "inspect_hardware",
    "inspect_hardware": "replace_gpu",
    "replace_gpu": "replace_gpu",
}
CURED_BY_REBOOT: frozenset[HeldAction] = frozenset({"reset_gpu", "reboot_node"})
SLOW_PROBE_ALERTS = frozenset({"GpuUnderperforming", "GpuSlowerThanFleet"})
AGENT = "gpuwatch agent"


def escalated(base: HeldAction, returns: int, every: int) -> HeldAction:
    """`base` taken one step up the ladder for each `every` returns."""
    action = base
    for _ in range(returns // max(every, 1)):
        action = ESCALATION[action]
    return action


def remember(
    records: Records,
    snap: StoreSnapshot,
    *,
    boot_id: str,
    boot_time: float | None,
    escalate_after: int = DEFAULT_ESCALATE_AFTER,
) -> None:
    """Bring the ledger up to date with one snapshot: open what is new, count what returned, close what a reboot and
    a clean probe cured. What changed is said in `records.notes` (logged once the change is written)."""
    for view in views(snap):
        identity = view.identity
        record = records.gpus.get(identity.uuid)
        if record is not None and record.serial != identity.serial:
            records.notes.append(
                f"GPU {identity.uuid} now reports serial {identity.serial!r}, the ledger knew it as {record.serial!r}: "
                "a different card, its history starts clean"
            )
            record = None
        record = record or GpuRecord(identity.uuid, identity.serial, identity.index)
        if record.index != identity.index:
            record = replace(record, index=identity.index)  # moved to another slot: its history goes with it
        steps = live_steps(view)
        for step in steps:
            if step.holds:
                record = _observe(record, step, snap, boot_id, identity.driver_version, escalate_after, records.notes)
        record = _close_cured(record, steps, snap, boot_id, boot_time, records.notes)
        if record.faults or identity.uuid in records.gpus:
            records.put(record)


def _observe(
    record: GpuRecord, step: Step, snap: StoreSnapshot, boot_id: str, driver: str, every: int, notes: list[str]
) -> GpuRecord:
    last = record.last(step.key)
    kept = (step.kept or step.evidence)[:MAX_EVIDENCE_CHARS]
    same_count = step.key in LIFETIME_COUNTS and last is not None and last.evidence == kept
    if last is not None and last.is_open:
        if boot_id in last.boots:
            return record
        if same_count:  # a lifetime count read in a new boot: the same fault, not one that came back
            return _swap(record, last, replace(last, boots=(*last.boots, boot_id)[-MAX_BOOTS_PER_FAULT:]))
        # Seen again in a new boot: the reboot did not cure it.
        returns = last.returns + 1
        again = replace(
            last,
            boots=(*last.boots, boot_id)[-MAX_BOOTS_PER_FAULT:],
            returns=returns,
            action=escalated(last.base_action, returns, every),
            at=max(last.at, step.at),
        )
        return _swap(record, last, again)
    if last is not None and last.closed is not None and step.at <= last.closed.time:
        return record  # the event its closing mended, read again (an XID after an agent restart)
    assert step.action in ("reset_gpu", "reboot_node", "inspect_hardware", "replace_gpu")
    assert step.state in ("degraded", "unhealthy")
    returns = record.closed_count(step.key)
    fault = Fault(
        key=step.key,
        state=step.state,
        base_action=step.action,
        action=escalated(step.action, returns, every),
        evidence=kept,
        opened=snap.now,
        at=step.at or snap.now,
        index=record.index,
        driver=driver,
        boots=(boot_id,),
        returns=returns,
    )
    escalation = f" (escalated: came back {returns}x)" if fault.action != fault.base_action else ""
    notes.append(f"GPU {record.index} ({record.uuid}): {step.key} held until repaired -> {fault.action}{escalation}")
    return replace(record, faults=(*record.faults, fault))


def _close_cured(
    record: GpuRecord,
    steps: list[Step],
    snap: StoreSnapshot,
    boot_id: str,
    boot_time: float | None,
    notes: list[str],
) -> GpuRecord:
    """Close the faults a reboot cures, once the GPU's probe ran clean in the new boot and their signal is gone."""
    live = {s.key for s in steps}
    outcome = snap.probe.last_ok.get(record.uuid)
    if outcome is None or live & SLOW_PROBE_ALERTS or boot_time is None or outcome.timestamp < boot_time:
        return record
    for fault in record.open_faults:
        if fault.action not in CURED_BY_REBOOT or boot_id in fault.boots or fault.key in live:
            continue
        closure = Closure(
            snap.now,
            "clean_probe",
            AGENT,
            f"the node rebooted since and the probe ran clean after it ({_probe_text(outcome.ratio)})",
        )
        notes.append(f"GPU {record.index} ({record.uuid}): {fault.key} closed in the ledger: {closure.note}")
        record = _swap(record, fault, replace(fault, closed=closure))
    return record


def _probe_text(ratio: float | None) -> str:
    return f"{ratio:.0%} of its baseline" if ratio is not None else "no baseline yet"


def repair(record: GpuRecord, *, now: float, by: str, note: str) -> tuple[GpuRecord, tuple[Fault, ...]]:
    """`gpuwatch repair`: close every open fault of the GPU, keeping who and why; the faults it closed."""
    closure = Closure(now, "repair", by, note)
    closed = record.open_faults
    faults = tuple(replace(f, closed=closure) if f.is_open else f for f in record.faults)
    return replace(record, faults=faults), closed


def _swap(record: GpuRecord, old: Fault, new: Fault) -> GpuRecord:
    return replace(record, faults=tuple(new if f is old else f for f in record.faults))
