"""What an operator reads from the CLI: the scenarios one per line in --help, the probe's scenarios probing often
enough under `run` to show their fault, and `gpuwatch probe` on a node without a GPU exiting 69 as the README says."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuwatch.cli import probe_command
from gpuwatch.cli.main import PROBE_SCENARIO_INTERVAL_SECONDS, SCENARIO_SUMMARIES, _scenario_needs_probe
from gpuwatch.collectors.configuration import load_config
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.core.scenario_catalogue import SCENARIOS


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
    probed = {name for name in SCENARIOS if _scenario_needs_probe(_config(name))}
    assert probed == {"mixed", "underperforming", "corrupt"}
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


def _gpuwatch(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def _clean_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user whose cache is tmp_path/cache, without a systemd $STATE_DIRECTORY."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "STATE_DIRECTORY"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    return env


def test_probe_on_the_simulated_node_keeps_its_baselines_with_the_demo_not_in_var_lib(tmp_path: Path) -> None:
    """`gpuwatch probe --backend simulated` with no --state-dir probes the demo's node: its state goes to the demo's
    private dir in the user's cache, never to /var/lib/gpuwatch (as root, that made a system dir for a simulation)."""
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    before = Path("/var/lib/gpuwatch").exists()
    done = _gpuwatch("probe", "--backend", "simulated", "--gpu", "0", "--config", str(empty), env=_clean_env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    demo_dir = tmp_path / "cache" / "gpuwatch" / "demo-nvidia"
    assert demo_dir.is_dir() and (demo_dir.stat().st_mode & 0o077) == 0, sorted(tmp_path.rglob("*"))
    assert any(demo_dir.iterdir()), "the probe's lock and baseline files belong in the demo's dir"
    assert Path("/var/lib/gpuwatch").exists() == before


def test_check_on_the_simulated_node_says_its_bus_is_simulated(tmp_path: Path) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    from ports import free_port

    args = ("check", "--backend", "simulated", "--config", str(empty), "--state-dir", str(tmp_path / "state"))
    done = _gpuwatch(*args, "--listen", f"127.0.0.1:{free_port()}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[ok] PCI bus: simulated: 8 NVIDIA GPUs, no AMD GPU (this machine's is not read)" in done.stdout


def test_demo_help_shows_the_demos_own_defaults() -> None:
    out = " ".join(_gpuwatch("demo", "--help").stdout.split())
    assert "(default 127.0.0.1:9845, this machine only; with --alerting a free port)" in out
    assert "(default ~/.cache/gpuwatch/demo-<vendor>)" in out and "/var/lib/gpuwatch" not in out
    run = " ".join(_gpuwatch("run", "--help").stdout.split())
    assert "(default :9845)" in run and "else /var/lib/gpuwatch" in run


def test_snapshot_without_a_gpu_points_at_the_simulated_node(tmp_path: Path) -> None:
    """On a machine with no GPU (CI's, this one: pci.py reads none), the table says so and how to see one."""
    from gpuwatch.readers.pci import count_pci_gpus

    if any(count_pci_gpus().values()):
        pytest.skip("this machine has a GPU on its PCI bus")
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    done = _gpuwatch("snapshot", "--config", str(empty))
    assert "gpuwatch snapshot --backend simulated" in done.stdout, done.stdout + done.stderr


def test_the_demo_says_which_gpu_overheats(tmp_path: Path) -> None:
    """The demo's log names the scenario's faults as the status page does (gpuwatch/cli/demo_findings.py), once each."""
    from ports import free_port

    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuwatch", "demo", "--scenario", "overheating", "--probe-interval", "0"),
            *("--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(tmp_path)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    deadline = threading.Timer(90, proc.kill)  # a demo that never says it ends the read, and the test fails
    deadline.start()
    try:
        assert proc.stdout is not None
        while not any("(GpuOverheating)" in line for line in lines):
            line = proc.stdout.readline()
            assert line, lines  # the demo must not end before it says it
            lines.append(line)
    finally:
        deadline.cancel()
        proc.terminate()
        proc.wait(timeout=15)
    said = [line for line in lines if "(GpuOverheating)" in line]
    assert said[0].startswith("gpuwatch demo: GPU 2: overheating: "), said
