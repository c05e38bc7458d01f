"""One source of thresholds: gpuwatch.core.thresholds (what the status page, `snapshot` and /health/gpus judge with)
holds the same numbers as the rules' `gpuwatch:threshold:*` records, the same XID classes as
GpuXidCritical/GpuXidWarning, and every finding's runbook link lands on a section of docs/runbooks.md."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from promrules import threshold_records

from gpuwatch.core import xid_catalogue
from gpuwatch.core.model import GpuIdentity, GpuSample, HostPsu, HostSample, HostVoltage, UnusableGpu
from gpuwatch.core.thresholds import (
    RUNBOOK_PATH,
    THRESHOLDS,
    XID_APPLICATION,
    XID_CRITICAL,
    XID_NOTICE,
    XID_SOLO_NOTICE,
    runbook_url,
    xid_class,
)
from gpuwatch.judge.verdict import Finding, judge_gpu, judge_host, judge_unusable, judge_xids

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy/prometheus/gpuwatch-rules.yml"
ALERTS = ROOT / "deploy/prometheus/gpuwatch-alerts.yml"


def _records() -> dict[str, float]:
    return threshold_records(RULES)


def _alerts() -> dict[str, dict[str, object]]:
    return {r["alert"]: r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if "alert" in r}


def test_thresholds_are_the_rules_records() -> None:
    assert _records() == {k: float(v) for k, v in THRESHOLDS.items()}


def test_xid_classes_are_the_alerts_regexes() -> None:
    alerts = _alerts()
    critical = re.search(r'xid=~"([0-9|]+)"', str(alerts["GpuXidCritical"]["expr"]))
    warning = re.search(r'xid!~"([0-9|]+)"', str(alerts["GpuXidWarning"]["expr"]))
    assert critical and warning
    assert {int(c) for c in critical.group(1).split("|")} == XID_CRITICAL
    excluded = XID_CRITICAL | XID_APPLICATION | XID_NOTICE | {XID_SOLO_NOTICE}
    assert {int(c) for c in warning.group(1).split("|")} == excluded
    notice = {int(c) for c in re.findall(r'xid="([0-9]+)"', str(alerts["GpuXidNotice"]["expr"]))}
    assert notice == XID_NOTICE | {XID_SOLO_NOTICE} == {159, 45}  # 45 by its arm for 45 alone
    # The catalogue (gpuwatch/core/xid_catalogue.py, 2025-10-29): 13 RESTART_APP, 63 IGNORE, 79 RESTART_BM, 151
    # RESTART_VM, 78 UPDATE_SWFW, 159 CHECK_UVM; 173 is past its last code (172); -1 is xid="other".
    codes = (13, 63, 79, 151, 78, 173, -1, 159)
    expected = ["application", "application", *["critical"] * 2, *["warning"] * 3, "notice"]
    assert [xid_class(c) for c in codes] == expected
    assert (xid_class(45), xid_class(45, alone=False)) == ("notice", "application")


def test_the_catalogue_is_the_one_recorded() -> None:
    """Spot checks of gpuwatch/core/xid_catalogue.py against NVIDIA's catalogue (the rows as the 2025-10-29 spreadsheet
    has them: code, mnemonic, immediate action)."""
    assert xid_catalogue.CATALOGUE[79][0::2] == ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM")
    assert xid_catalogue.CATALOGUE[94][0::2] == ("ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP")
    assert xid_catalogue.CATALOGUE[151][0::2] == ("ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM")
    assert xid_catalogue.CATALOGUE[167][0::2] == ("PCIE_FATAL_TIMEOUT", "")
    assert sorted(xid_catalogue.CATALOGUE) == list(range(1, 173))
    assert xid_catalogue.immediate_action(173) is None


def _all_findings() -> list[Finding]:
    """One of every finding gpuwatch.judge.verdict can give."""
    identity = GpuIdentity("GPU-1", "nvidia", 1, model="H100")
    bad = GpuSample(
        "GPU-1",
        0.0,
        temperature_celsius={"core": 90.0, "memory": 95.0},
        temperature_threshold_celsius={("core", "slowdown"): 89.0, ("memory", "max_operating"): 95.0},
        throttle_active={"hw_thermal": True, "sw_thermal": False, "hw_power_brake": True, "board_limit": True},
        power_limit_watts={"enforced": 500.0, "default": 700.0},
        power_supply_undersized=True,
        utilization_ratio=1.0,
        pcie_link_generation={"current": 3, "max": 5},
        pcie_link_width={"current": 8, "max": 16},
        ecc_errors_total={"uncorrected": 2},
        row_remap_failed=True,
        row_remap_banks={"low": 1, "none": 1, "high": 100},
        sram_ecc_threshold_exceeded=True,
        retired_pages=95,
        retired_pages_limit=100,
        recovery_action=1,
        inforom_valid=False,
        fabric_healthy=False,
        nvlink_up={"0": True, "1": False},
    )
    warm = GpuSample(
        "GPU-1",
        0.0,
        temperature_celsius={"core": 86.0},
        temperature_threshold_celsius={("core", "slowdown"): 89.0, ("core", "max_operating"): 87.0},
        throttle_active={"sw_thermal": True, "hw_slowdown": True},
        row_remap_pending=True,
    )
    host = HostSample(
        "ipmi",
        0.0,
        voltages=(
            HostVoltage("ipmi", "12V", 11.2, 12.0, 11.4),
            HostVoltage("ipmi", "-12V", -10.7, -12.0, None),
            HostVoltage("legacy", "-12V", -11.3, -12.0, None),
        ),
        psus=(HostPsu("PS1", False, "Failure detected"),),
        psu_redundancy_lost=True,
    )
    return [
        *judge_gpu(identity, bad),
        *judge_gpu(identity, warm),
        *judge_xids([(79, 1, 100.0), (63, 2, 100.0), (13, 1, 100.0)], now=110.0),
        *judge_host([host]),
        judge_unusable(UnusableGpu(3, "insufficient_power", "0000:3b:00.0")),
    ]


def test_every_finding_names_an_alert_with_a_runbook_section() -> None:
    alerts = _alerts()
    sections = {m.group(1).lower() for m in re.finditer(r"^## (\w+)$", (ROOT / "docs/runbooks.md").read_text(), re.M)}
    findings = _all_findings()
    names = {f.alert for f in findings}
    assert len(names) >= 25, names
    for f in findings:
        assert f.alert in alerts, f
        # the agent's own /runbooks, at the section the alert's runbook_url ends in (the rules' base is the operator's)
        rule_url = alerts[f.alert]["annotations"]["runbook_url"]  # type: ignore[index]
        assert f.runbook == runbook_url(f.alert) == f"{RUNBOOK_PATH}#{f.alert.lower()}", f
        assert rule_url.endswith("#" + f.alert.lower()) and f.alert.lower() in sections, f
        assert f.remedy and f.level in ("bad", "warn", "info"), f


def test_findings_carry_now_and_limit_with_units() -> None:
    texts = [f.text for f in _all_findings()]
    assert "overheating: 90 °C, slowdown at 89 °C (hardware thermal slowdown)" in texts
    assert "power-capped: limit 500 W, default 700 W (warns below 95%)" in texts
    assert "PCIe link downtrained: gen 3 x8 of gen 5 x16 while busy" in texts
    assert "rail 12V (ipmi) 11.20 V, below its limit 11.40 V" in texts
    # no min exported: the nominal less its sign's ratio, by magnitude (ATX12V design guide: -12 V ±10 %, so -10.7 V
    # is under 10.80 V, and -11.3 V is not)
    assert "rail -12V (ipmi) -10.70 V, below its limit 10.80 V" in texts
    assert not [t for t in texts if t.startswith("rail -12V (legacy) -11.30 V")]
    assert "XID 79 (GPU has fallen off the bus) 10 s ago" in texts
    assert "XID 63 ×2 (row remap recorded) 10 s ago" in texts
    assert "2 memory banks with low or no spare rows" in texts
    # 84 °C is gpuwatch's rule (gpuwatch:threshold:nvidia_core_temperature_celsius), not a limit NVIDIA reports: it is
    # named as gpuwatch's, and the device's own limits by the values it reports (NVML GPU_MAX, SLOWDOWN)
    assert "runs hot: 86 °C, above gpuwatch's 84 °C threshold, max operating 87 °C, slowdown at 89 °C" in texts
    remedies = {f.alert: f.remedy for f in _all_findings()}
    assert "nvidia-smi -i 1 -pl 700" in remedies["GpuPowerLimitBelowDefault"]  # the GPU's index, no placeholder


def test_an_xid_older_than_the_window_and_an_idle_downshifted_link_judge_nothing() -> None:
    assert judge_xids([(79, 1, 0.0)], now=THRESHOLDS["xid_window_seconds"] + 1) == []
    idle = GpuSample(
        "GPU-1",
        0.0,
        utilization_ratio=0.0,
        pcie_link_generation={"current": 1, "max": 5},
        pcie_link_width={"current": 16, "max": 16},
    )
    assert judge_gpu(GpuIdentity("GPU-1", "nvidia", 1), idle) == []
