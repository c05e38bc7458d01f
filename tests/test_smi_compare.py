"""benchmarks/hardware/smi_compare.py against the real H100 fixtures and the real simulated node.

The parser is pinned to the `nvidia-smi -q` text read from an H100 (driver 580); the comparison runs the real
`gpuwatch snapshot --json` of the simulated node (seeded from the same GPU) against it, and the NVML reading taken at
the same moment as that text (nvml-idle.json) must come out as a full match.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from repofiles import REPO, load_script

SCRIPT = REPO / "benchmarks" / "hardware" / "smi_compare.py"
FIXTURES = REPO / "tests" / "fixtures" / "h100"
SMI_TEXT = (FIXTURES / "nvidia-smi-q.txt").read_text()
NVML = json.loads((FIXTURES / "nvml-idle.json").read_text())["calls"]
GPUWATCH = (sys.executable, "-m", "gpuwatch")
UUID = "GPU-edaa9d68-a820-baa4-66f3-e07b41c6c0d3"
# The rows that do not move: the simulated node must reproduce every one of them from the fixture's GPU.
STATIC = (
    "threshold core shutdown",
    "threshold core slowdown",
    "threshold core max operating",
    "power limit enforced",
    "power limit default",
    "power limit min",
    "power limit max",
    "max clock graphics",
    "max clock sm",
    "max clock memory",
    "max clock video",
    "PCIe generation max",
    "PCIe width max",
    "ECC mode",
    "persistence mode",
    "MIG mode",
    "compute mode",
    "memory total",
)


def _load() -> ModuleType:
    return load_script(SCRIPT, "smi_compare")


sc = _load()


def _nvml(name: str) -> Any:
    return NVML[name]["value"]


@pytest.fixture(scope="module")
def simulated() -> dict[str, Any]:
    """The real `gpuwatch snapshot --json` of the simulated healthy one-GPU node."""
    done = subprocess.run(
        [*GPUWATCH, "snapshot", "--json", "--backend", "simulated", "--scenario", "healthy", "--gpus", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=True,
    )
    return json.loads(done.stdout)


def _as_fixture_gpu(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The simulated snapshot under the fixture GPU's UUID."""
    snapshot = copy.deepcopy(snapshot)
    gpu = snapshot["gpus"][0]
    gpu["identity"]["uuid"] = gpu["sample"]["uuid"] = UUID
    return snapshot


def _as_fixture_reading(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The simulated snapshot turned into what gpuwatch read from the fixture GPU: its identity, and the moving
    readings NVML gave at the moment nvidia-smi -q was taken (nvml-idle.json)."""
    snapshot = _as_fixture_gpu(snapshot)
    gpu = snapshot["gpus"][0]
    gpu["identity"].update(serial=_nvml("Serial"), pci_bus_id=_nvml("PciInfo")["busId"])
    sample = gpu["sample"]
    sample["temperature_celsius"] = {"core": float(_nvml("Temperature.gpu")), "memory": 34.0}
    sample["power_watts"] = _nvml("PowerUsage") / 1000
    sample["clock_hertz"] = {c: _nvml(f"ClockInfo.{n}") * 1e6 for c, n in (("sm", "SM"), ("memory", "MEM"))}
    sample["clock_hertz"].update(graphics=_nvml("ClockInfo.GRAPHICS") * 1e6, video=_nvml("ClockInfo.VIDEO") * 1e6)
    return snapshot


def _rows(outcome: Any) -> dict[str, Any]:
    (gpu,) = outcome.comparisons
    return {row.quantity: row for row in gpu.rows}


def _differing(outcome: Any) -> set[str]:
    return {row.quantity for row in outcome.comparisons[0].rows if row.verdict == sc.DIFFERS}


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=180, cwd=REPO, env=env
    )


# ----- (a) the parser on the real H100 text -----


def test_parser_reads_the_real_h100_output() -> None:
    report = sc.parse_smi(SMI_TEXT)
    assert report.header["driver version"] == "580.159.04"
    assert report.header["cuda version"] == "13.0"
    (gpu,) = report.gpus
    assert gpu.bus_id == "00000000:00:06.0"
    assert gpu.uuid == UUID
    assert gpu.get("Product Name") == "NVIDIA H100 80GB HBM3"
    assert sc.smi_value(gpu.get("Temperature", "GPU Current Temp")) == 31.0
    assert sc.smi_value(gpu.get("Temperature", "Memory Current Temp")) == 34.0
    assert sc.smi_value(gpu.get("Temperature", "GPU Shutdown T.Limit Temp")) == -8.0
    assert sc.smi_value(gpu.get("Temperature", "GPU Slowdown T.Limit Temp")) == -2.0
    assert sc.smi_value(gpu.get("Temperature", "GPU T.Limit Temp")) == 56.0
    assert sc.smi_value(gpu.get("GPU Power Readings", "Average Power Draw")) == 71.98
    assert sc.smi_value(gpu.get("GPU Power Readings", "Instantaneous Power Draw")) == 71.09
    assert sc.smi_value(gpu.get("GPU Power Readings", "Current Power Limit")) == 700.0
    assert sc.smi_value(gpu.get("GPU Power Readings", "Min Power Limit")) == 200.0
    # The memory rail's readings are a section of their own and must not shadow the GPU's.
    assert sc.smi_value(gpu.get("GPU Memory Power Readings", "Average Power Draw")) == 41.99
    assert sc.smi_value(gpu.get("Max Clocks", "SM")) == 1980.0
    assert sc.smi_value(gpu.get("Max Clocks", "Video")) == 1545.0
    assert sc.smi_value(gpu.get("Clocks", "Memory")) == 2619.0
    # Reasons: the two HW lines indented under "HW Slowdown" belong to the same section.
    assert gpu.get("Clocks Event Reasons", "Idle") == "Active"
    assert sc.smi_value(gpu.get("Clocks Event Reasons", "HW Thermal Slowdown")) is False
    assert sc.smi_value(gpu.get("Clocks Event Reasons", "HW Power Brake Slowdown")) is False
    assert gpu.get("Clocks Event Reasons Counters", "SW Power Capping") == "0 us"
    assert sc.smi_value(gpu.get("PCI", "GPU Link Info", "PCIe Generation", "Max")) == 5.0
    assert sc.smi_value(gpu.get("PCI", "GPU Link Info", "Link Width", "Current")) == 16.0
    assert sc.smi_value(gpu.get("FB Memory Usage", "Total")) == 81559.0
    assert sc.smi_value(gpu.get("FB Memory Usage", "Reserved")) == 480.0
    assert sc.smi_value(gpu.get("MIG Mode", "Current")) is False
    assert sc.smi_value(gpu.get("Persistence Mode")) is True
    assert sc.smi_value(gpu.get("Fan Speed")) is None  # N/A
    assert sc.smi_value(gpu.get("Display Mode")) is None  # "Requested functionality has been deprecated"
    assert gpu.get("No Such Section", "Total") is None


def test_parser_keeps_every_gpu_of_a_multi_gpu_node() -> None:
    second = SMI_TEXT.split("GPU 00000000:00:06.0\n", 1)[1]
    second = second.replace("00000000:00:06.0", "00000000:1B:00.0").replace(UUID, "GPU-00000000-1111-2222-3333-4")
    report = sc.parse_smi(SMI_TEXT.replace("Attached GPUs", "Attached GPUs ") + "GPU 00000000:1B:00.0\n" + second)
    assert [g.bus_id for g in report.gpus] == ["00000000:00:06.0", "00000000:1B:00.0"]
    assert report.gpus[1].uuid == "GPU-00000000-1111-2222-3333-4"
    assert report.gpus[1].get("Max Clocks", "SM") == "1980 MHz"


# ----- (b) fidelity: the simulated node against the real GPU -----


def test_simulated_node_reproduces_the_h100s_static_readings(simulated: dict[str, Any]) -> None:
    outcome = sc.compare(_as_fixture_gpu(simulated), sc.parse_smi(SMI_TEXT))
    rows = _rows(outcome)
    wrong = {q: (rows[q].gpuwatch, rows[q].nvidia_smi, rows[q].verdict) for q in STATIC if rows[q].verdict != sc.MATCH}
    assert not wrong
    # nvidia-smi 580 prints the memory threshold relative to a memory T.Limit it does not give: NVML must say 95.
    assert rows["threshold memory max operating"].verdict == sc.ONLY_GW
    assert rows["threshold memory max operating"].gpuwatch_value == _nvml("TemperatureThreshold.MEM_MAX")
    # The memory total note tells how nvidia-smi's figures add up.
    assert "Reserved 480" in rows["memory total"].note


def test_the_nvml_reading_of_the_same_moment_matches_nvidia_smi(simulated: dict[str, Any], tmp_path: Path) -> None:
    snapshot = _as_fixture_reading(simulated)
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snapshot))
    done = _run("--snapshot", str(path), "--smi", str(FIXTURES / "nvidia-smi-q.txt"), "--json", str(tmp_path / "o"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Every compared row matches" in done.stdout
    document = json.loads((tmp_path / "o").read_text())
    rows = {row["quantity"]: row for row in document["gpus"][0]["rows"]}
    # Power: NVML's 71.864 W is compared with the 1 s average (71.98 W), the instantaneous one is shown.
    assert rows["power draw"]["nvidia_smi_value"] == 71.98
    assert "71.09 W" in rows["power draw"]["note"]
    assert rows["threshold core max operating"]["nvidia_smi_value"] == 87.0  # 31 C + margin 56 C
    assert document["summary"][sc.MATCH] >= 55
    assert document["raw"]["nvidia_smi_q"] == SMI_TEXT
    assert document["raw"]["snapshot"]["gpus"][0]["identity"]["uuid"] == UUID


# ----- (c) perturbations: exactly the changed rows differ -----


def test_a_changed_power_reason_and_pcie_width_are_the_rows_that_differ(
    simulated: dict[str, Any], tmp_path: Path
) -> None:
    snapshot = _as_fixture_reading(simulated)
    report = sc.parse_smi(SMI_TEXT)
    assert _differing(sc.compare(snapshot, report)) == set()
    sample = snapshot["gpus"][0]["sample"]
    sample["power_watts"] += 5
    sample["throttle_active"]["sw_power_cap"] = True
    sample["pcie_link_width"]["current"] = 8
    assert _differing(sc.compare(snapshot, report)) == {"power draw", "reason sw_power_cap", "PCIe width current"}
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snapshot))
    done = _run("--snapshot", str(path), "--smi", str(FIXTURES / "nvidia-smi-q.txt"))
    assert done.returncode == 1
    assert "power draw: gpuwatch 76.86 W, nvidia-smi 71.98 W" in done.stdout
    assert "PCIe width current: gpuwatch 8x, nvidia-smi 16x" in done.stdout


def test_counters_allow_drift_between_the_reads(simulated: dict[str, Any]) -> None:
    snapshot = _as_fixture_reading(simulated)
    counters = snapshot["gpus"][0]["sample"]["throttle_counter_seconds"]
    counters["sw_power_cap"] = 0.4
    report = sc.parse_smi(SMI_TEXT)
    assert _rows(sc.compare(snapshot, report, counter_drift_s=0.5))["throttle time sw_power_cap"].verdict == sc.MATCH
    counters["sw_power_cap"] = 3.0
    assert _rows(sc.compare(snapshot, report, counter_drift_s=0.5))["throttle time sw_power_cap"].verdict == sc.DIFFERS


def test_older_driver_layouts_and_missing_sections(simulated: dict[str, Any]) -> None:
    """Pre-550 names (throttle reasons, one Power Draw, absolute thresholds); a section that is gone is a row
    that says so, never a crash."""
    old = (
        SMI_TEXT.replace("Clocks Event Reasons Counters", "Unrelated Counters")
        .replace("Clocks Event Reasons", "Clocks Throttle Reasons")
        .replace("GPU Power Readings", "Power Readings")
        .replace("Average Power Draw                             : 71.98 W", "Power Draw : 71.50 W")
        .replace("Current Power Limit", "Enforced Power Limit")
        .replace("GPU Shutdown T.Limit Temp                      : -8 C", "GPU Shutdown Temp : 95 C")
        .replace("GPU Slowdown T.Limit Temp                      : -2 C", "GPU Slowdown Temp : 89 C")
        .replace("GPU Max Operating T.Limit Temp                 : 0 C", "GPU Max Operating Temp : 87 C")
        .replace("Memory Max Operating T.Limit Temp              : 0 C", "Memory Max Operating Temp : 95 C")
    )
    rows = _rows(sc.compare(_as_fixture_reading(simulated), sc.parse_smi(old)))
    assert rows["power draw"].nvidia_smi_value == 71.5 and rows["power draw"].verdict == sc.MATCH
    assert rows["reason gpu_idle"].verdict == sc.MATCH
    assert rows["power limit enforced"].verdict == sc.MATCH
    for key in ("core shutdown", "core slowdown", "core max operating", "memory max operating"):
        assert rows[f"threshold {key}"].verdict == sc.MATCH, key
    assert rows["throttle time sw_power_cap"].verdict == sc.ONLY_GW
    assert rows["throttle time sw_power_cap"].nvidia_smi == "(not in nvidia-smi)"

    gutted = "\n".join(
        line for line in SMI_TEXT.splitlines() if "Temp" not in line and "Clocks Event" not in line and "W" not in line
    )
    rows = _rows(sc.compare(_as_fixture_reading(simulated), sc.parse_smi(gutted)))
    assert rows["core temperature"].verdict == sc.ONLY_GW
    assert rows["power draw"].verdict == sc.ONLY_GW
    assert rows["reason gpu_idle"].verdict == sc.ONLY_GW


# ----- (d) --live end to end with a fake nvidia-smi and the simulated backend -----


def _fake_smi(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = -q ] || exit 9\nexec cat '{FIXTURES / 'nvidia-smi-q.txt'}'\n")
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_live_says_no_gpu_matched_when_the_uuids_differ(tmp_path: Path) -> None:
    env = _fake_smi(tmp_path)
    gw = f"{sys.executable} -m gpuwatch"
    args = ("--live", "--gpuwatch", gw, "--backend", "simulated", "--json", str(tmp_path / "o.json"))
    done = _run(*args, "--", "--scenario", "healthy", "--gpus", "1", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no GPU matched" in done.stdout and "--match-index" in done.stdout
    document = json.loads((tmp_path / "o.json").read_text())
    assert document["mode"] == "live"
    for name in ("gpuwatch", "nvidia-smi"):
        times = document["timestamps"][name]
        assert times["returncode"] == 0 and times["started"] <= times["ended"]
    assert document["timestamps"]["nvidia-smi"]["command"][1:] == ["-q"]
    assert document["timestamps"]["gpuwatch"]["command"][-4:] == ["--scenario", "healthy", "--gpus", "1"]


def test_live_pairs_by_position_with_match_index(tmp_path: Path) -> None:
    env = _fake_smi(tmp_path)
    gw = f"{sys.executable} -m gpuwatch"
    args = ("--live", "--gpuwatch", gw, "--backend", "simulated", "--match-index", "--json", str(tmp_path / "o.json"))
    done = _run(*args, "--", "--scenario", "healthy", "--gpus", "1", env=env)
    assert done.returncode == 1  # the UUID (and serial, bus id) of the simulated GPU are not the fixture's
    document = json.loads((tmp_path / "o.json").read_text())
    (gpu,) = document["gpus"]
    assert gpu["paired_by"] == "position"
    rows = {row["quantity"]: row for row in gpu["rows"]}
    assert rows["UUID"]["verdict"] == sc.DIFFERS
    assert all(rows[q]["verdict"] == sc.MATCH for q in STATIC)


def test_live_without_nvidia_smi_is_a_usage_error(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}
    done = _run("--live", "--gpuwatch", f"{sys.executable} -m gpuwatch", env=env)
    assert done.returncode == 2
    assert "nvidia-smi was not found on PATH" in done.stderr
    assert "Traceback" not in done.stderr


def test_usage_errors_exit_2_with_one_message(tmp_path: Path) -> None:
    assert _run("--live", "--smi", "x").returncode == 2
    done = _run("--snapshot", str(tmp_path / "missing.json"), "--smi", str(FIXTURES / "nvidia-smi-q.txt"))
    assert done.returncode == 2 and "cannot read the snapshot" in done.stderr
    not_smi = tmp_path / "smi.txt"
    not_smi.write_text("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps({"gpus": [], "backend_errors": {"nvml": "libnvidia-ml.so.1 was not found"}}))
    done = _run("--snapshot", str(snap), "--smi", str(not_smi))
    assert done.returncode == 2 and "gpuwatch found no GPU" in done.stderr and "libnvidia-ml" in done.stderr
    snap.write_text(json.dumps({"gpus": [{"identity": {"uuid": UUID}, "sample": None, "error": "x"}]}))
    done = _run("--snapshot", str(snap), "--smi", str(not_smi))
    assert done.returncode == 2 and "couldn't communicate" in done.stderr
    assert "Traceback" not in done.stderr
