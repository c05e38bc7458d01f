"""The numbers the alert rules page on, for the agent's own judgements (status page, snapshot, /health/gpus).

One source for both: every ``gpuwatch:threshold:<name>`` recording rule of deploy/prometheus/gpuwatch-rules.yml is a
key of ``THRESHOLDS`` with the same value, and the XID classes are the regexes of GpuXidCritical and GpuXidWarning in
deploy/prometheus/gpuwatch-alerts.yml; tests/test_thresholds.py fails when the two drift apart. Change a number in
both places (the rules file is what Prometheus reads; this module is what a person at the node reads).
"""

from __future__ import annotations

__all__ = [
    "RUNBOOK_FILE",
    "RUNBOOK_PATH",
    "THRESHOLDS",
    "XID_APPLICATION",
    "XID_CRITICAL",
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


# NVIDIA's XID catalogue, as GpuXidCritical / GpuXidWarning class it: application XIDs page nobody, the critical ones
# reset the GPU or reboot the node, every other code is a warning.
XID_APPLICATION = frozenset({13, 31, 43, 45, 68})
XID_CRITICAL = frozenset(
    {46, 48, 54, 61, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, *range(144, 151), 155, 156, 158}
)

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


def xid_class(code: int) -> str:
    """application, critical or warning: the alert an XID raises (application: none)."""
    if code in XID_APPLICATION:
        return "application"
    return "critical" if code in XID_CRITICAL else "warning"


def xid_meaning(code: int) -> str:
    if code in _XID_MEANINGS:
        return _XID_MEANINGS[code]
    if 144 <= code <= 150:
        return "NVLink error"
    return "see NVIDIA's XID catalogue"


# The agent serves docs/runbooks.md at this path (gpuwatch.web), an anchor per alert: a link that works inside a
# datacentre with no internet, and the default of the rules' runbook_url (docs/alerting.md, "Runbook links").
RUNBOOK_PATH = "/runbooks"
RUNBOOK_FILE = "docs/runbooks.md"


def runbook_url(alert: str) -> str:
    """The alert's runbook on the agent, as a path: each agent serves it, so a link needs no host of its own."""
    return f"{RUNBOOK_PATH}#{alert.lower()}"


def runbook_reference(alert: str) -> str:
    """The alert's runbook for text read away from a browser (the CLI, the journal): the agent's path and the file."""
    return f"runbook: {runbook_url(alert)} on the agent, {RUNBOOK_FILE}#{alert.lower()}"
