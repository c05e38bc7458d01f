"""What an operator reads from the CLI: the scenarios one per line in --help, the probe's scenarios probing often
enough under `run` to show their fault, and `gpuwatch probe` on a node without a GPU exiting 69 as the README says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch import probe_command
from gpuwatch.cli import PROBE_SCENARIO_INTERVAL_SECONDS, SCENARIO_SUMMARIES, _scenario_needs_probe
from gpuwatch.config import load_config
from gpuwatch.scenario_catalogue import SCENARIOS
from gpuwatch.sources import NodeSources


@pytest.mark.parametrize("command", ["demo", "simulate-fleet"])
def test_help_lists_every_scenario_on_its_own_line(command: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpuwatch", command, "--help"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    for name in SCENARIOS:
        assert re.search(rf"^  {name} +\S", out, re.M), (name, out)
    assert set(SCENARIO_SUMMARIES) == set(SCENARIOS)
    assert all(len(words) <= 90 for words in SCENARIO_SUMMARIES.values())


def _config(scenario: str, **probe: float) -> object:
    overrides = {"agent": {"backend": "simulated"}, "simulated": {"scenario": scenario}}
    return load_config(None, {**overrides, "probe": probe} if probe else overrides)


def test_the_probe_scenarios_probe_often_under_run() -> None:
    assert {name for name in SCENARIOS if _scenario_needs_probe(_config(name))} == {"mixed", "underperforming"}
    assert not _scenario_needs_probe(_config("underperforming", interval_seconds=60))  # an operator's choice stands
    assert PROBE_SCENARIO_INTERVAL_SECONDS <= 10


def test_run_says_what_to_expect_from_the_probe(tmp_path: Path) -> None:
    from ports import free_port

    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--scenario", "underperforming"),
            *("--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(tmp_path)),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert "shows its fault in the probe: probing every 10 s" in first, first


def test_probe_without_a_gpu_exits_69(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(probe_command, "build_sources", lambda config: NodeSources([], lambda: {}, None))
    config = load_config(None, {"agent": {"state_dir": str(tmp_path / "state")}})
    rc = probe_command.probe(config, gpus=[], as_json=False, update_baseline=False, reset_baseline=False)
    assert rc == 69
    assert "no GPU on this node to probe" in capsys.readouterr().err
