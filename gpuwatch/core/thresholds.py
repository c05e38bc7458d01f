"""The numbers the alert rules page on, for the agent's own judgements (status page, snapshot, /health/gpus).

One source for both: every ``gpuwatch:threshold:<name>`` recording rule of deploy/prometheus/gpuwatch-rules.yml is a
key of ``THRESHOLDS`` with the same value, and the XID classes are the regexes of GpuXidCritical, GpuXidWarning and
GpuXidNotice in deploy/prometheus/gpuwatch-alerts.yml; tests/test_thresholds.py fails when the two drift apart. Change
a number in both places (the rules file is what Prometheus reads; this module is what a person at the node reads).
"""

from __future__ import annotations

from gpuwatch.core import xid_catalogue

__all__ = [
    "RUNBOOK_FILE",
    "RUNBOOK_PATH",
    "THRESHOLDS",
    "XID_APPLICATION",
    "XID_CRITICAL",
    "XID_NOTICE",
    "XID_SOLO_NOTICE",
    "runbook_reference",
    "runbook_url",
    "threshold",
    "xid_class",
    "xid_meaning",
]

THRESHOLDS: dict[str, float] = {
    "core_temperature_margin_celsius": 5,
    "nvidia_core_temperature_celsius": 84,
    "memory_temperature_margin_celsius": 5,
    "thermal_throttle_ratio": 0.1,
    "hw_slowdown_ratio": 0.01,
    "power_limit_ratio": 0.95,
    "rail_voltage_ratio": 0.95,
    "negative_rail_voltage_ratio": 0.9,
    "probe_fresh_intervals": 2,
    "probe_baseline_ratio": 0.95,
    "probe_slow_probes": 3,
    "probe_fleet_ratio": 0.9,
    "probe_fleet_min_gpus": 3,
    "probe_regression_share": 0.5,
    "probe_failures": 2,
    "pcie_busy_utilization_ratio": 0.5,
    "pcie_replays_per_second": 0.1,
    "pcie_link_recoveries_per_second": 0.01,
    "nvlink_errors_per_second": 0,
    "nvlink_crc_errors_per_second": 100,
    "retired_pages_ratio": 0.9,
    "xid_window_seconds": 600,
    "collector_missed_intervals": 3,
    "collector_late_min_seconds": 60,
    "allocated_idle_sm_active_ratio": 0.05,
}


def threshold(name: str) -> float:
    """The value of ``gpuwatch:threshold:<name>``."""
    return THRESHOLDS[name]


# The XID classes of GpuXidCritical, GpuXidWarning and GpuXidNotice, derived from NVIDIA's XID catalogue
# (gpuwatch/core/xid_catalogue.py) by its "Resolution Bucket (Immediate Action)":
# - application: RESTART_APP or IGNORE. The program's fault or nothing to do: no XID alert. 63 (row remap recorded),
#   92 (high single-bit ECC rate) and 94 (contained ECC error) are among them; their hardware side pages through
#   GpuRowRemapPending, GpuRowRemapFailure and GpuEccUncorrectable.
# - notice: CHECK_UVM (the application's unified memory) and 45 alone. The GPU's verdict asks for restart_app at most
#   (gpuwatch/judge/gpu_verdict.py), so the alert is a notice (severity info, docs/verdicts.md), never a page.
# - critical: the GPU must be reset, the node or VM restarted, or a person must act on the hardware at once.
# - warning: everything else, codes the catalogue does not list (yet) included, so no new code is ever silent.
_CRITICAL_ACTIONS = frozenset(
    {
        "RESET_GPU",
        "RESTART_BM",  # 79: fallen off the bus
        "RESTART_VM",  # 151: key rotation error
        "CHECK_MECHANICALS",  # 54: auxiliary power not connected; the GPU runs power-reduced until someone acts
        "WORKFLOW_XID_48",  # double-bit ECC: the workflow ends in a GPU reset
        "WORKFLOW_NVLINK_ERR",  # 74
        "WORKFLOW_NVLINK5_ERR",  # 144-150
    }
)
_NO_ALERT_ACTIONS = frozenset({"RESTART_APP", "IGNORE"})
_NOTICE_ACTIONS = frozenset({"CHECK_UVM"})
# Codes the catalogue gives no immediate action that resets (or no action yet), decided here:
_CRITICAL_BY_DECISION = {
    61: "PMU_BREAKPOINT: unused on Ampere and newer; the older GPUs' catalogue resets the GPU for it",
    167: "PCIE_FATAL_TIMEOUT: no bucket yet; a fatal PCIe timeout leaves the GPU unreachable, as XID 79 does",
    169: "SEC2_HALT_ERROR: no bucket yet; 'Internal micro-controller halt', the description of 62 (RESET_GPU)",
}
# 45 (WORKFLOW_XID_45) is "preemptive cleanup, due to previous errors"; the catalogue's investigatory action reads
# "Solo: RESTART_FM / Not Solo: IGNORE (follow other Xid)". Alone it is a notice (GpuXidNotice): most often the
# cleanup after a killed or failed job, and the verdict's restart_app; with another XID on the GPU in the window,
# that XID's own class speaks for both.
XID_SOLO_NOTICE = 45
XID_APPLICATION = frozenset(
    code for code, (_, _, action) in xid_catalogue.CATALOGUE.items() if action in _NO_ALERT_ACTIONS
)
XID_NOTICE = frozenset(code for code, (_, _, action) in xid_catalogue.CATALOGUE.items() if action in _NOTICE_ACTIONS)
XID_CRITICAL = frozenset(
    {code for code, (_, _, action) in xid_catalogue.CATALOGUE.items() if action in _CRITICAL_ACTIONS}
    | set(_CRITICAL_BY_DECISION)
)


def xid_meaning(code: int) -> str:
    if code in _XID_MEANINGS:
        return _XID_MEANINGS[code]
    row = xid_catalogue.CATALOGUE.get(code)
    if row is not None and row[1] != "Unused":
        return row[1]
    return "see NVIDIA's XID catalogue"


_XID_MEANINGS = {
    13: "graphics engine exception (an application's fault)",
    31: "GPU memory page fault (an application's fault)",
    43: "GPU stopped processing (an application's fault)",
    45: "preemptive cleanup after an earlier error",
    46: "GPU stopped processing (timeout)",
    48: "double-bit ECC error",
    54: "auxiliary power not connected",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "row remap recorded",
    64: "row remap or page retirement failure",
    68: "video decoder (NVDEC) exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context-switch timeout",
    110: "security fault",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link error",
    136: "link training failed",
    140: "unrecovered ECC error",
    143: "GPU initialisation error",
    154: "recovery action changed",
    155: "NVLink software-defined error",
    156: "resource retirement event",
    158: "GPU fatal timeout",
}


def xid_class(code: int, alone: bool = True) -> str:
    """application, notice, critical or warning: the alert an XID raises (application: none). `alone`: no other XID
    came with it (45, the cleanup after another error, is a notice only then)."""
    if code in XID_APPLICATION:
        return "application"
    if code == XID_SOLO_NOTICE:
        return "notice" if alone else "application"
    if code in XID_NOTICE:
        return "notice"
    return "critical" if code in XID_CRITICAL else "warning"


# The agent serves docs/runbooks.md at this path (gpuwatch.web.server), an anchor per alert: a link that works inside a
# datacentre with no internet, and the default of the rules' runbook_url (docs/alerting.md, "Runbook links").
RUNBOOK_PATH = "/runbooks"
RUNBOOK_FILE = "docs/runbooks.md"


def runbook_url(alert: str) -> str:
    """The alert's runbook on the agent, as a path: each agent serves it, so a link needs no host of its own."""
    return f"{RUNBOOK_PATH}#{alert.lower()}"


def runbook_reference(alert: str) -> str:
    """The alert's runbook for text read away from a browser (the CLI, the journal): the agent's path and the file."""
    return f"runbook: {runbook_url(alert)} on the agent, {RUNBOOK_FILE}#{alert.lower()}"
