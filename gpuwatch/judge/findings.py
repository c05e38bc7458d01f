"""What the status page and /health/gpus judge: a finding per condition an alert rule pages on, for each GPU and for
the node, with the rules' own thresholds (gpuwatch.core.thresholds) and the verdicts `snapshot` shares
(gpuwatch.judge.verdict). The page's HTML is gpuwatch/web/status_page.py; this module decides, that one draws.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpuwatch.collectors.fabric import Fabric
from gpuwatch.collectors.network import NetworkPorts
from gpuwatch.core.model import GpuIdentity, GpuSample, StuckCall
from gpuwatch.core.thresholds import threshold
from gpuwatch.judge.verdict import LEVELS, Finding, ago, judge_gpu, judge_host, judge_unusable, judge_xids
from gpuwatch.probe.baseline import median
from gpuwatch.probe.diag_results import TestRecord
from gpuwatch.state.store import StoreSnapshot

# The thresholds are the alert rules' (gpuwatch.core.thresholds, checked against gpuwatch-rules.yml by the tests).
HOT_MARGIN_CELSIUS = threshold("core_temperature_margin_celsius")
POWER_CAPPED_RATIO = threshold("power_limit_ratio")
SLOW_PROBE_RATIO = threshold("probe_baseline_ratio")  # GpuUnderperforming
FLEET_PROBE_RATIO = threshold("probe_fleet_ratio")  # GpuSlowerThanFleet, here against the node's GPUs of a model
PEER_MIN_GPUS = int(threshold("probe_fleet_min_gpus"))
PROBE_FRESH_INTERVALS = threshold("probe_fresh_intervals")


@dataclass(frozen=True, slots=True)
class GpuView:
    """Everything a row needs: the GPU, its fresh sample (None when lost) and the node's configured power limit."""

    identity: GpuIdentity
    sample: GpuSample | None
    error: str
    configured_limit_watts: float | None
    snap: StoreSnapshot


def xid_key(code: int) -> str:
    """An XID's name as a signal ("XID 79"; "XID other" for a code the driver did not give): the fault ledger's key."""
    return "XID other" if code < 0 else f"XID {code}"


def unrepaired_xids(view: GpuView) -> list[tuple[int, int, float]]:
    """(code, count, last unix time) of the GPU's XIDs, less those a repair came after: `gpuwatch repair` says the
    GPU was mended since, so an XID 79 before it no longer speaks for the GPU, even within the rules' window."""
    record = view.snap.ledger.record(view.identity.uuid)
    out = []
    for (uuid, code), count in view.snap.xids.items():
        if uuid != view.identity.uuid:
            continue
        last = record.last(xid_key(code)) if record is not None else None
        if last is not None and last.closed is not None and count.last_timestamp <= last.closed.time:
            continue
        out.append((code, count.total, count.last_timestamp))
    return out


def health_flags(view: GpuView) -> list[Finding]:
    """What is wrong with this GPU, worst first (info findings last); empty when healthy and without recent XIDs."""
    s = view.sample
    xids = judge_xids(unrepaired_xids(view), view.snap.now)
    if s is None and (call := frozen_by(view.snap, view.identity.uuid)) is not None:
        return [_not_readable(view, call), *xids]
    if s is None:
        lost = Finding(
            "bad",
            "GpuLost",
            f"lost: {view.error}",
            "drain the node and reset the GPU or reboot; reseat or replace it if it does not come back",
        )
        return [lost, *xids]
    gpu = [f for f in judge_gpu(view.identity, s, view.configured_limit_watts) if not repaired_reading(view, f)]
    if view.snap.probe.under_probe(view.identity.uuid, s.timestamp):
        # Busy with our own probe: its PCIe link was read (slow tier) before the load raised it, not while busy.
        gpu = [f for f in gpu if f.alert != "GpuPcieLinkDegraded"]
    flags = [*gpu, *xids, *_probe_flags(view), *diag_flags(view)]
    return sorted(flags, key=lambda f: LEVELS.index(f.level))


# Findings on a lifetime count, which no reset or reboot takes back (NVML's aggregate ECC counters): the same count
# after a repair is the one the repair covered, and in a new boot the same fault, not one that came back.
LIFETIME_COUNTS = frozenset({"GpuEccUncorrectable"})


def same_reading(evidence: str, finding: Finding) -> bool:
    """Whether a ledger fault's evidence is this finding's, reading for reading (gpu_verdict.finding_step's form)."""
    return evidence.startswith(f"{finding.alert}: {finding.text} ->")


def repaired_reading(view: GpuView, finding: Finding) -> bool:
    """A lifetime count that has not grown since `gpuwatch repair` closed its fault: mended, not shown again."""
    if finding.alert not in LIFETIME_COUNTS:
        return False
    record = view.snap.ledger.record(view.identity.uuid)
    last = record.last(finding.alert) if record is not None else None
    return last is not None and last.closed is not None and same_reading(last.evidence, finding)


DIAG_BANDWIDTH_TESTS = frozenset({"pcie"})  # a link below its nominal: the seating, not the GPU


def diag_alert(test: str) -> str:
    """The alert a failed `gpuwatch diag` test is: a bandwidth below nominal asks for the seating to be inspected,
    every other failure for a reset (docs/diag.md)."""
    return "GpuDiagBandwidthLow" if test in DIAG_BANDWIDTH_TESTS else "GpuDiagFailed"


def diag_failures(view: GpuView) -> list[tuple[str, TestRecord]]:
    """The GPU's failed diag tests of its last run of each, with their alert; a failure that ended before the ledger
    closed its fault (`gpuwatch repair`) is mended, until a later run fails again."""
    part = view.snap.parts.get("diag_results") or {}
    record = part.get(view.identity.uuid)
    if record is None:
        return []
    ledger = view.snap.ledger.record(view.identity.uuid)
    out = []
    for test in record.tests.values():
        if test.result != "fail":
            continue
        alert = diag_alert(test.name)
        last = ledger.last(alert) if ledger is not None else None
        if last is not None and last.closed is not None and test.at <= last.closed.time:
            continue
        out.append((alert, test))
    return out


def diag_flags(view: GpuView) -> list[Finding]:
    """A failed `gpuwatch diag` test: a finding until the GPU is repaired or a later run passes."""
    out = []
    for alert, test in diag_failures(view):
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(test.at))
        text = f"diag {test.name} (level {test.level}) failed at {when}: {test.detail}"
        if alert == "GpuDiagBandwidthLow":
            out.append(
                Finding("warn", alert, text, "drain the node and reseat the GPU (riser, slot); run gpuwatch diag again")
            )
        else:
            out.append(
                Finding(
                    "bad",
                    alert,
                    text,
                    "drain the GPU and reset it; run gpuwatch diag again; replace it if it fails again",
                )
            )
    return out


def frozen_by(snap: StoreSnapshot, uuid: str) -> StuckCall | None:
    """The hung vendor call that keeps this GPU's readings stale, or None. A poll reads the vendors in turn, so while
    one call hangs no GPU of the node is read: a GPU the library last answered for (a sample, no error) is frozen, not
    lost, as gpuwatch_gpus_detected keeps it and GpuLost leaves it alone — also for the few poll intervals after the
    call returned, until the next poll reads it (else the fault ledger would hold a GpuLost that never was). The call
    on the GPU itself comes first."""
    calls = snap.stuck_calls or snap.thawing_calls  # just returned: the GPUs it froze are not read again yet
    if not calls or uuid not in snap.samples or uuid in snap.gpu_errors or snap.fresh(uuid) is not None:
        return None
    return next((c for c in calls if c.uuid == uuid), calls[0])


def _not_readable(view: GpuView, call: StuckCall) -> Finding:
    """A GPU frozen by a hung call: its state is unknown (no job belongs on it), and the node's finding says why."""
    s = view.snap.samples[view.identity.uuid]
    last = f"last read {ago(view.snap.now - s.timestamp)} ago"
    if call.uuid == view.identity.uuid:
        text = f"not readable: vendor call hung: {call.call} on this GPU for {ago(view.snap.now - call.since)}; {last}"
        return Finding("bad", "GpuwatchVendorCallHung", text, _hang_remedy(call))
    where = f" on GPU {call.gpu}" if call.gpu else ""
    return Finding(
        "warn",
        "GpuwatchVendorCallHung",
        f"not readable: vendor call hung: {call.call}{where}, so no GPU of the node is read; {last}",
        "see the node's hung call above: this GPU is read again once it returns (or the agent restarts)",
    )


def _hang_remedy(call: StuckCall) -> str:
    """docs/runbooks.md's GpuwatchVendorCallHung, with the vendor's tool and the GPU filled in."""
    smi = "amd-smi" if call.backend == "amdsmi" else "nvidia-smi"
    if not call.gpu:
        reset = "reset the GPU"
    elif call.backend == "amdsmi":
        reset = f"reset GPU {call.gpu} (amd-smi reset)"
    else:
        reset = f"reset GPU {call.gpu} (nvidia-smi -r -i {call.gpu})"
    return (
        f"the driver is stuck: run timeout 30 {smi} (it will likely hang too) and check dmesg for XIDs (79: fallen "
        f"off the bus); drain the node, {reset} if the driver still answers, else reboot the node; reseat or replace "
        "the GPU if it recurs"
    )


def _hang_findings(snap: StoreSnapshot) -> list[Finding]:
    """A poll hung in a vendor call: the call, for how long, and the GPU being read if it is known."""
    out = []
    for call in snap.stuck_calls:
        identity = snap.identities.get(call.uuid)
        if identity is not None:
            gpu = f" on GPU {call.gpu} ({identity.model or 'model unknown'}, {identity.uuid})"
        elif call.gpu:
            gpu = f" on GPU {call.gpu}" + (f" ({call.uuid})" if call.uuid else "")
        else:
            gpu = ""
        since = time.strftime("%H:%M:%S", time.localtime(call.since))
        out.append(
            Finding(
                "bad",
                "GpuwatchVendorCallHung",
                f"the {call.backend} call {call.call}{gpu} has not returned for {ago(snap.now - call.since)} "
                f"(since {since}): the node's GPU readings are frozen",
                _hang_remedy(call),
            )
        )
    return out


def _compute_errors(view: GpuView) -> list[Finding]:
    """A probe computed a wrong result (GpuComputeErrors): from the first one, until `gpuwatch repair` comes after
    the last (the fault ledger holds it meanwhile, across restarts)."""
    uuid = view.identity.uuid
    probe = view.snap.probe
    last = probe.last_compute_error.get(uuid)
    if last is None:
        return []
    record = view.snap.ledger.record(uuid)
    fault = record.last("GpuComputeErrors") if record is not None else None
    if fault is not None and fault.closed is not None and last.timestamp <= fault.closed.time:
        return []  # repaired since: a clean GPU until it errs again
    count = probe.runs.get(uuid, {}).get("compute_error", 0)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(last.timestamp))
    return [
        Finding(
            "bad",
            "GpuComputeErrors",
            f"{count} probe(s) computed a wrong result since the agent started, the last at {when}: {last.reason}",
            "drain the GPU (jobs on it may have wrong results), reset it, run gpuwatch probe --gpu N; "
            "replace it if it errs again",
        )
    ]


def _probe_flags(view: GpuView) -> list[Finding]:
    out = _compute_errors(view)
    fresh = _probe_fresh(view, view.identity.uuid)
    ratio = probe_ratio(view) if fresh else None
    peers = _peer_ratio(view) if fresh else None
    slow_probes = threshold("probe_slow_probes")
    if ratio is not None and ratio < SLOW_PROBE_RATIO:
        out.append(
            Finding(
                "warn",
                "GpuUnderperforming",
                f"slow probe: {ratio:.0%} of its baseline (below {SLOW_PROBE_RATIO:.0%}; alerts at {slow_probes:.0f} "
                "slow probes in a row)",
                "drain the GPU and compare with nvidia-smi -q -d PERFORMANCE; reset it, replace it if it stays slow",
            )
        )
    elif peers is not None and peers < FLEET_PROBE_RATIO:
        out.append(
            Finding(
                "warn",
                "GpuSlowerThanFleet",
                f"slow probe: {peers:.0%} of the median of this node's {view.identity.model}s "
                f"(below {FLEET_PROBE_RATIO:.0%})",
                "drain the GPU and compare its clocks and power with its peers; reset it, replace it if it stays slow",
            )
        )
    last = view.snap.probe.last_any.get(view.identity.uuid)
    if last is not None and last.result in ("failed", "timeout"):
        out.append(
            Finding(
                "warn",
                "GpuProbeFailing",
                f"probe {last.result.replace('_', ' ')}: {last.reason or 'no reason given'}",
                "read the agent's log for the probe's error; run gpuwatch probe --gpu N on the node",
            )
        )
    return out


def node_findings(snap: StoreSnapshot) -> list[Finding]:
    """What is wrong with the node rather than one GPU: a poll hung in a vendor call (first), a vendor library down,
    GPUs missing against the expected count, GPUs the library counts but cannot open, host rails and supplies,
    collectors failing."""
    out: list[Finding] = _hang_findings(snap)  # the first: the cause of the stale readings everything else shows
    vendor_of = {"nvml": "nvidia", "amdsmi": "amd"}
    down = {vendor_of.get(b, b): (b, msg) for b, (up, msg) in snap.backends.items() if not up}
    for vendor, (backend, message) in sorted(down.items()):
        expected = snap.gpus_expected.get(vendor, 0)
        if expected:
            out.append(
                Finding(
                    "bad",
                    "GpuBackendDown",
                    f"the {backend} library is down ({message}): none of the {expected} expected {vendor.upper()} "
                    "GPUs can be read",
                    "check the driver: nvidia-smi / amd-smi, dmesg; reinstall or reload the driver (the agent retries)",
                )
            )
    detected = len(
        {
            _physical(i)
            for uuid, i in snap.identities.items()
            if snap.fresh(uuid) is not None or frozen_by(snap, uuid) is not None
        }
    )
    detected += len(snap.unusable)
    expected_total = sum(snap.gpus_expected.values())
    if detected < expected_total and not down:
        out.append(
            Finding(
                "bad",
                "GpuCountBelowExpected",
                f"{detected} of {expected_total} expected GPUs detected",
                "lspci | grep -i -e nvidia -e amd; dmesg for XID 79 or PCIe errors; reseat or replace the missing GPU",
            )
        )
    out += [judge_unusable(gpu) for gpu in snap.unusable]
    out += judge_host(snap.host)
    out += _fabric_manager(snap.parts.get("fabric"))
    out += _network_ports(snap.parts.get("network") or ())
    for name, status in sorted(snap.collectors.items()):
        if name in snap.backends and not snap.backends[name][0]:
            continue  # GpuBackendDown's
        if status.success is False:
            out.append(
                Finding(
                    "warn",
                    "GpuwatchCollectorFailing",
                    f"collector {name}: its last run failed",
                    "read the agent's log (journalctl -u gpuwatch) for the collector's error",
                )
            )
    return sorted(out, key=lambda f: LEVELS.index(f.level))


def _fabric_manager(fabric: Fabric | None) -> list[Finding]:
    """An NVSwitch node whose fabric manager is not running: its GPUs read, CUDA on them fails."""
    if fabric is None or fabric.manager_running is not False:
        return []
    return [
        Finding(
            "bad",
            "NvidiaFabricManagerDown",
            f"nvidia-fabricmanager is not running on a node with {fabric.nvswitches} NVSwitch(es): CUDA work fails",
            "systemctl restart nvidia-fabricmanager; its version must equal the driver's (journalctl -u "
            "nvidia-fabricmanager, /var/log/fabricmanager.log)",
        )
    ]


def _network_ports(ports: NetworkPorts) -> list[Finding]:
    """RDMA ports down after having been up, below their expected rate, flapping, or counting errors: a job's rail,
    judged as the rules judge it (the collector keeps the last 15 minutes of each port's counters)."""
    out: list[Finding] = []
    for view in ports:
        port = view.reading
        beside = f" (beside GPU {view.gpu})" if view.gpu else ""
        if view.down:
            out.append(
                Finding(
                    "bad",
                    "HostNetworkPortDown",
                    f"network port {port.device}/{port.port}{beside} is down (state {port.state}, physical state "
                    f"{port.phys_state}) after having been up",
                    "check the cable, transceiver and switch port; ibstat, mlxlink -d <device> -m",
                )
            )
        elif view.slow and view.expected_rate_bits_per_second and port.rate_bits_per_second:
            out.append(
                Finding(
                    "warn",
                    "HostNetworkPortRateLow",
                    f"network port {port.device}/{port.port}{beside} runs at "
                    f"{port.rate_bits_per_second / 1e9:g} Gb/s of {view.expected_rate_bits_per_second / 1e9:g}",
                    "reseat or replace the cable or transceiver; check the switch port's speed",
                )
            )
        if view.flapping:
            out.append(
                Finding(
                    "warn",
                    "HostNetworkPortFlapping",
                    f"network port {port.device}/{port.port}{beside} went down {view.flaps} times in 15 minutes",
                    "replace the cable or transceiver; mlxlink -d <device> -m -c for its errors",
                )
            )
        erring = view.erring
        if erring:
            counts = ", ".join(f"{grown} {kind}" for kind, grown in sorted(erring.items()))
            out.append(
                Finding(
                    "warn",
                    "HostNetworkPortErrors",
                    f"network port {port.device}/{port.port}{beside} counted {counts} in 10 minutes",
                    "read the link's bit error rate (mlxlink -d <device> -m -c); replace the cable or transceiver",
                )
            )
    return out


def gpu_health(snap: StoreSnapshot) -> tuple[bool, str]:
    """/health/gpus: ok while every expected GPU is present, nothing the alert rules page on (critical or warning)
    shows and the fault ledger holds no fault; otherwise a line per problem."""
    problems = [f"node: {f.text}" for f in node_findings(snap) if f.attention]
    for view in views(snap):
        problems += [f"GPU {view.identity.index}: {f.text}" for f in health_flags(view) if f.attention]
        problems += [
            f"GPU {view.identity.index}: {fault.key} held until repaired ({fault.action}; gpuwatch repair --gpu "
            f"{view.identity.index} --note WHAT-WAS-DONE clears it)"
            for fault in snap.ledger.open_faults(view.identity.uuid)
        ]
    if not problems:
        gpus = len(snap.identities)
        return True, f"ok: {gpus} GPU{'s' if gpus != 1 else ''} healthy"
    return False, "\n".join(problems)


def _physical(identity: GpuIdentity) -> str:
    """One per PCI device (AMD compute partitions share their GPU's device), as gpuwatch_gpus_detected counts."""
    return identity.pci_bus_id.lower().rpartition(".")[0] or identity.uuid


def _probe_fresh(view: GpuView, uuid: str) -> bool:
    """Whether the GPU's last successful probe is younger than PROBE_FRESH_INTERVALS probe intervals."""
    probe = view.snap.probe
    outcome = probe.last_ok.get(uuid)
    if outcome is None:
        return False
    return view.snap.now - outcome.timestamp <= PROBE_FRESH_INTERVALS * probe.interval_seconds


def _peer_ratio(view: GpuView) -> float | None:
    """The last successful probe over the median of the node's GPUs of the same model and dtype (at least 3): a GPU
    can be slow from its first probe on, and then its own baseline is slow too."""
    probe = view.snap.probe
    mine = probe.last_ok.get(view.identity.uuid)
    if mine is None or mine.measured is None:
        return None
    peers = [
        o.measured.flops_median
        for uuid, o in probe.last_ok.items()
        if o.measured is not None
        and o.measured.dtype == mine.measured.dtype
        and (ident := view.snap.identities.get(uuid)) is not None
        and ident.model == view.identity.model
        and _probe_fresh(view, uuid)
    ]
    if len(peers) < PEER_MIN_GPUS:
        return None
    return mine.measured.flops_median / median(peers)


def probe_ratio(view: GpuView) -> float | None:
    """The last successful probe over this GPU's baseline; None without a probe result or baseline."""
    outcome = view.snap.probe.last_ok.get(view.identity.uuid)
    return outcome.ratio if outcome is not None else None


def views(snap: StoreSnapshot) -> list[GpuView]:
    return [
        GpuView(
            i,
            snap.fresh(i.uuid),
            snap.gpu_errors.get(i.uuid, "no fresh readings"),
            snap.configured_power_limit_watts,
            snap,
        )
        for i in sorted(snap.identities.values(), key=lambda i: (i.index, i.uuid))
    ]
