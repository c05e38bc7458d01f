"""The hardware kit (benchmarks/hardware) runs here before it runs on a GPU: a slip in it costs a lease.

A GPU machine comes by chance, for 15 minutes (benchmarks/hardware/README.md, "Issue #36 on an H200 in one lease"), so
the parts issue #36 added are dry-run here on the simulated node and torch's CPU build, as `DRY_RUN=1` runs them: the
summaries must carry the rows the issue asks for. The CV floor's analysis is checked on trials made to order, where
the answer is known: throughput that follows the clock, and throughput that does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from repofiles import REPO, load_script
from test_probe_worker import torch_installed  # noqa: F401 (the fixture)

KIT = REPO / "benchmarks" / "hardware"
cv_floor = load_script(KIT / "cv_floor.py", "cv_floor")


@pytest.mark.usefixtures("torch_installed")
def test_the_parts_issue_36_adds_dry_run_with_the_rows_it_asks_for(tmp_path: Path) -> None:
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path), "TMPDIR": str(tmp_path)}
    env["GPUWATCH_HW_STATE"] = str(tmp_path / "state")
    done = subprocess.run(
        ["bash", str(KIT / "device-run.sh"), "fabric", "check", "cvfloor"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    check = (tmp_path / "summary-check.md").read_text()
    fabric = (tmp_path / "summary-fabric.md").read_text()
    floor = (tmp_path / "summary-cvfloor.md").read_text()
    for summary in (check, fabric, floor):  # every step ended, in time
        assert ": exit 0," in summary, summary
    # The checked probe's two rows (issue #36): "compute errors over N probes" and "corrupted result caught: yes|no".
    assert "compute errors over 2 probes: 0" in check and "corrupted result caught: yes" in check, check
    # MIG only as reported disabled: every GPU row of the fabric table says so.
    rows = [line for line in fabric.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows and all("reported disabled (0, 0)" in line for line in rows), fabric
    # The CV floor: a row per trial, the probe's own window and the cut windows, from 4 trials of device times.
    assert "| the probe's own (from the cap" in floor and "| 0.5-1 s |" in floor, floor
    with tarfile.open(tmp_path / "raw-fabric-check-cvfloor.tar.gz") as archive:
        member = archive.extractfile("./cv_floor.json")
        assert member is not None
        doc = json.loads(member.read())
    assert len(doc["trials"]) == 4 and all(t["times"] and t["samples"] for t in doc["trials"])


def trial(index: int, rate_tflops: float, clock_mhz: float, seconds: float = 4.0) -> dict[str, Any]:
    """A trial made to order: 2 ms matmuls at `rate_tflops` throughout, the SM clock read every 20 ms at
    `clock_mhz`, capped from 0.8 s on."""
    flop = 2.0 * 8192**3
    times = [flop / (rate_tflops * 1e12)] * int(seconds / (flop / (rate_tflops * 1e12)))
    samples = [
        {"rel": k * 0.02, "sm_mhz": clock_mhz, "watts": 700.0, "reasons": cv_floor.SW_POWER_CAP if k >= 40 else 0}
        for k in range(int(seconds / 0.02))
    ]
    return {
        "index": index,
        "timeline": cv_floor.timeline(times, flop),
        "samples": samples,
        "seconds_to_cap": 0.8,
    }


def test_the_cv_floor_names_the_clock_when_throughput_follows_it() -> None:
    clocks = [1300.0, 1460.0, 1380.0, 1420.0, 1330.0, 1450.0]
    trials = [trial(i + 1, 0.5 * mhz, mhz) for i, mhz in enumerate(clocks)]  # 650-730 TFLOP/s, 0.5 per MHz
    rows = cv_floor.analyse(trials, 4.0)
    own = rows[0]
    assert own["trials"] == len(clocks) - 1  # trial 1 left out, as #4's probes 2..N
    assert own["cv_pct"] > 0.5 and own["cv_per_clock_pct"] < 0.01 and own["r_tflops_clock"] > 0.99
    assert "the clock explains the spread" in "\n".join(cv_floor.reading(rows))


def test_the_cv_floor_does_not_blame_a_steady_clock() -> None:
    rates = [700.0, 690.0, 710.0, 695.0, 705.0, 688.0]
    trials = [trial(i + 1, rate, 1400.0) for i, rate in enumerate(rates)]
    rows = cv_floor.analyse(trials, 4.0)
    assert rows[0]["cv_pct"] == pytest.approx(rows[0]["cv_per_clock_pct"])  # per GHz changes nothing
    assert "the clock does not explain it all" in "\n".join(cv_floor.reading(rows))


def test_the_probes_window_starts_at_the_cap_within_the_workers_warm_up() -> None:
    # gpuwatch/probe/worker.py: at least --warmup-min (0.5 s), at most --warmup-max (1.5 s), then --measure (1 s).
    assert cv_floor.production_start({"seconds_to_cap": 0.1}) == 0.5
    assert cv_floor.production_start({"seconds_to_cap": 0.9}) == 0.9
    assert cv_floor.production_start({"seconds_to_cap": None}) == 1.5
