"""The probe worker runs as root: nothing planted where it was started may run in it, and a worker that cannot
start is a `failed` result naming the error, never a quiet `skipped_unsupported`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from simnode import SimAgent
from test_probe_runner import QUICK, production, runner

from gpuwatch.core.model import GpuIdentity
from gpuwatch.probe.launch import WorkerLauncher, worker_argv

# The production worker, told an engine is there: it starts, parses its arguments, looks for the engine and answers
# with its own JSON (no_engine here: the simulated GPU's UUID pins no real device), so it imports what _plant plants.
REAL_WORKER = production(engines=["torch"])


@pytest.fixture
def sim(tmp_path: Path):  # type: ignore[no-untyped-def]
    agent = SimAgent(tmp_path / "state", scenario="healthy", gpus=1, probe={"interval_seconds": 60.0})
    agent.run(2.0)
    yield agent
    agent.close()


def _plant(directory: Path, marker: Path) -> None:
    """Modules the worker imports (directly or through the standard library), each leaving a marker if run."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("argparse", "json", "random", "select"):
        (directory / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")


def _answered(sim: SimAgent, tmp_path: Path, real: bool) -> None:
    """One probe of GPU 0 by the real or the simulated node's worker; the result, which must be the worker's own."""
    (outcome,) = runner(sim, tmp_path / "state", launcher=REAL_WORKER if real else None).run(gpus={0})
    if real:  # the worker's own no_engine answer (never the runner's "no probe engine installed"), or a measurement
        assert outcome.result in ("skipped_unsupported", "ok"), outcome.reason
        assert not outcome.reason.startswith("no probe engine installed"), outcome.reason
    else:
        assert outcome.result == "ok", outcome.reason


@pytest.mark.parametrize("real", [True, False], ids=["real-worker", "simulated-worker"])
def test_modules_planted_in_the_working_directory_never_run_in_the_worker(
    sim: SimAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real: bool
) -> None:
    """`python -m` puts the cwd first on sys.path: an argparse.py in /tmp ran as root under `gpuwatch probe`."""
    planted, marker = tmp_path / "cwd", tmp_path / "ran"
    _plant(planted, marker)
    monkeypatch.chdir(planted)
    _answered(sim, tmp_path, real)
    assert not marker.exists(), f"planted code ran in the probe worker: {marker.read_text()!r}"


@pytest.mark.parametrize("real", [True, False], ids=["real-worker", "simulated-worker"])
def test_modules_on_pythonpath_never_run_in_the_worker(
    sim: SimAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real: bool
) -> None:
    planted, marker = tmp_path / "pp", tmp_path / "ran"
    _plant(planted, marker)
    monkeypatch.setenv("PYTHONPATH", str(planted))
    monkeypatch.setenv("PYTHONSTARTUP", str(planted / "argparse.py"))
    _answered(sim, tmp_path, real)
    assert not marker.exists(), f"planted code ran in the probe worker: {marker.read_text()!r}"


def test_the_worker_command_is_isolated_and_still_imports_gpuwatch() -> None:
    argv = worker_argv()
    assert argv[0] == sys.executable and "-I" in argv and "-m" not in argv
    assert "gpuwatch.probe.worker import main" in argv[argv.index("-c") + 1]
    gpu = GpuIdentity(uuid="GPU-0", vendor="nvidia", index=0)
    assert list(WorkerLauncher().command(gpu)) == argv  # what the agent and `gpuwatch probe` start by default


def test_a_worker_that_dies_on_import_is_failed_with_the_error(sim: SimAgent, tmp_path: Path) -> None:
    command = [sys.executable, "-I", "-c", "import gpuwatch_no_such_module"]
    outcomes = runner(sim, tmp_path / "state", command=command).run(gpus={0})
    assert outcomes[0].result == "failed"
    assert "ModuleNotFoundError" in outcomes[0].reason and "gpuwatch_no_such_module" in outcomes[0].reason


def test_an_exit_status_of_3_without_the_workers_answer_is_failed_not_skipped(sim: SimAgent, tmp_path: Path) -> None:
    """Only the worker's own no_engine document (with status 3) is skipped_unsupported; a bare status 3 or a
    no_engine line from a process that then failed is something broken, and says so."""
    bare = [sys.executable, "-I", "-c", "import sys; sys.exit(3)"]
    assert runner(sim, tmp_path / "state", command=bare).run(gpus={0})[0].result == "failed"
    doc = '{"ok": false, "error": "no_engine", "message": "no probe engine"}'
    mixed = [sys.executable, "-I", "-c", f"import sys; print({doc!r}); sys.exit(1)"]
    assert runner(sim, tmp_path / "state", command=mixed).run(gpus={0})[0].result == "failed"


def test_the_worker_runs_in_a_fixed_working_directory(
    sim: SimAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "cwd.txt"
    monkeypatch.chdir(tmp_path)
    command = [sys.executable, "-I", "-c", f"import os; open({str(out)!r}, 'w').write(os.getcwd())"]
    runner(sim, tmp_path / "state", QUICK, command=command).run(gpus={0})
    assert out.read_text() == "/"
