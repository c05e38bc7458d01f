"""The state dir under attack and after accidents: planted links and FIFOs, another user's dir, a second agent, a
killed writer's temp files, a deleted dir, and `gpuwatch check`, which must write nothing there."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuwatch.cli.commands import check
from gpuwatch.config.settings import load_config
from gpuwatch.files.statedir import (
    AgentLock,
    StateDirBusy,
    clean_stale_temp_files,
    state_dir_problem,
)
from gpuwatch.files.statefile import KNOWN_GPUS_FILE, MAX_STATE_FILE_BYTES, KnownGpus, atomic_write_json
from gpuwatch.probe.baseline import BASELINES_FILE, Baselines
from gpuwatch.probe.locks import LockUnavailable, lock_path, try_lock, unlock

UUID = "GPU-edaa9d68-a820-baa4-66f3-e07b41c6c0d3"
GPUWATCH = [sys.executable, "-m", "gpuwatch"]


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o750)
    return path


def known_gpus_doc() -> dict[str, object]:
    identity = {"uuid": UUID, "vendor": "nvidia", "index": 0, "model": "H100"}
    return {"kind": "known_gpus", "version": 1, "gpus": {UUID: identity}}


# --- links and FIFOs ------------------------------------------------------------------------------------------


def test_a_probe_lock_that_is_a_symlink_never_creates_its_target(state: Path, tmp_path: Path) -> None:
    """Another user's link in a predictable dir made root create files at chosen paths (/etc/nologin)."""
    target = tmp_path / "nologin"
    lock_path(state, UUID).symlink_to(target)
    with pytest.raises(LockUnavailable, match="symbolic link"):
        try_lock(state, UUID, wait=False)
    assert not target.exists()


def test_the_baselines_lock_that_is_a_symlink_never_creates_its_target(state: Path, tmp_path: Path) -> None:
    target = tmp_path / "nologin"
    (state / f".{BASELINES_FILE}.lock").symlink_to(target)
    assert Baselines(state).load() == {}
    assert not target.exists()


def test_a_state_file_that_is_a_symlink_is_not_followed(state: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(known_gpus_doc()))
    (state / KNOWN_GPUS_FILE).symlink_to(elsewhere)
    assert KnownGpus(state).load() == {}
    assert json.loads(elsewhere.read_text()) == known_gpus_doc()  # the link was moved aside, its target untouched
    assert not (state / KNOWN_GPUS_FILE).is_symlink()


def test_a_fifo_planted_as_a_state_file_never_hangs_start_up(state: Path, caplog: pytest.LogCaptureFixture) -> None:
    fifo = state / KNOWN_GPUS_FILE
    os.mkfifo(fifo)
    result: list[object] = []
    reader = threading.Thread(target=lambda: result.append(KnownGpus(state).load()), daemon=True)
    reader.start()
    reader.join(timeout=5.0)
    if reader.is_alive():  # the old code blocks in open(): give it a writer so the thread ends, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a FIFO planted as known_gpus.json blocked")
    assert result == [{}]
    assert "FIFO" in caplog.text


def test_a_fifo_planted_as_a_probe_lock_is_refused_not_waited_on(state: Path) -> None:
    os.mkfifo(lock_path(state, UUID))
    with pytest.raises(LockUnavailable, match="FIFO"):
        try_lock(state, UUID, wait=False)


def test_an_oversized_state_file_is_not_read(state: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A link to /dev/zero read 5.4 GB, then MemoryError; a huge (sparse) regular file is refused by its size."""
    with open(state / KNOWN_GPUS_FILE, "wb") as f:
        f.truncate(MAX_STATE_FILE_BYTES + 1)
    assert KnownGpus(state).load() == {}
    assert "larger than" in caplog.text


def test_a_state_file_linked_to_dev_zero_is_not_read(state: Path) -> None:
    (state / KNOWN_GPUS_FILE).symlink_to("/dev/zero")
    started = time.monotonic()
    assert KnownGpus(state).load() == {}
    assert time.monotonic() - started < 1.0


def test_an_atomic_write_replaces_a_planted_link_and_never_writes_through_it(state: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (state / KNOWN_GPUS_FILE).symlink_to(victim)
    atomic_write_json(state / KNOWN_GPUS_FILE, known_gpus_doc())
    assert victim.read_text() == "precious\n"
    assert not (state / KNOWN_GPUS_FILE).is_symlink()


# --- whose dir ------------------------------------------------------------------------------------------------


def test_a_state_dir_that_others_may_write_is_refused(state: Path) -> None:
    state.chmod(0o777)
    problem = state_dir_problem(state)
    assert problem is not None and "chmod go-w" in problem


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the dir to another user")
def test_a_state_dir_owned_by_another_user_is_refused(state: Path) -> None:
    os.chown(state, 65534, 65534)
    problem = state_dir_problem(state)
    assert problem is not None and "owned by UID 65534" in problem


def test_the_agent_refuses_an_unsafe_state_dir_with_exit_78(state: Path) -> None:
    state.chmod(0o777)
    run = subprocess.run(
        [*GPUWATCH, "run", "--backend", "simulated", "--listen", "127.0.0.1:0", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 78, run.stderr
    assert "agent.state_dir" in run.stderr and "chmod go-w" in run.stderr


def test_the_probe_command_refuses_an_unsafe_state_dir_with_exit_78(state: Path) -> None:
    state.chmod(0o777)
    run = subprocess.run(
        [*GPUWATCH, "probe", "--backend", "simulated", "--gpus", "1", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 78, run.stderr
    assert "chmod go-w" in run.stderr
    assert os.listdir(state) == []


# --- one agent, its leftovers, a deleted dir ------------------------------------------------------------------


def test_a_second_agent_on_the_same_state_dir_is_refused_naming_the_first(state: Path) -> None:
    first = AgentLock(state)
    first.acquire()
    try:
        with pytest.raises(StateDirBusy, match=f"PID {os.getpid()}"):
            AgentLock(state).acquire()
    finally:
        first.release()
    second = AgentLock(state)
    second.acquire()  # released with the first agent
    second.release()


def test_a_second_agent_process_exits_69_naming_the_first(state: Path) -> None:
    argv = [*GPUWATCH, "run", "--backend", "simulated", "--gpus", "1", "--listen", "127.0.0.1:0"]
    first = subprocess.Popen([*argv, "--state-dir", str(state)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (state / "agent.lock").exists() or not (state / "agent.lock").read_text().strip():
            assert first.poll() is None and time.monotonic() < deadline, "the first agent did not start"
            time.sleep(0.1)
        second = subprocess.run([*argv, "--state-dir", str(state)], capture_output=True, text=True, timeout=60)
        assert second.returncode == 69, second.stderr
        assert f"PID {first.pid}" in second.stderr and "--state-dir" in second.stderr
    finally:
        first.terminate()
        first.wait(timeout=30)


def test_temp_files_left_by_a_killed_writer_are_removed_at_start_up(state: Path) -> None:
    old = time.time() - 3600
    leftovers = [state / f".{KNOWN_GPUS_FILE}.{n:08d}.tmp" for n in range(31)]
    for path in leftovers:
        path.write_text("{")
        os.utime(path, (old, old))
    fresh = state / f".{BASELINES_FILE}.abcd_123.tmp"  # a write in progress right now
    fresh.write_text("{")
    foreign = state / "notes.tmp"
    foreign.write_text("mine")
    os.utime(foreign, (old, old))
    assert clean_stale_temp_files(state) == 31
    assert sorted(os.listdir(state)) == sorted([fresh.name, foreign.name])


def test_a_state_dir_deleted_while_running_is_made_again_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "gone"
    state.mkdir()
    baselines = Baselines(state)
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        for path in state.iterdir():
            path.unlink()
        state.rmdir()
        fd = try_lock(state, UUID, wait=False)  # a probe round
        assert fd is not None
        unlock(fd)
        assert baselines.load() == {}
    assert state.is_dir()
    assert caplog.text.count("made it again") == 1


# --- check writes nothing -------------------------------------------------------------------------------------


def test_check_writes_nothing_in_the_state_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    config = load_config(None, {"agent": {"backend": "simulated", "state_dir": str(state), "listen": "127.0.0.1:0"}})
    check(config)
    assert os.listdir(state) == []
    assert "[ok] state dir" in capsys.readouterr().out
    missing = tmp_path / "missing"
    check(load_config(None, {"agent": {"backend": "simulated", "state_dir": str(missing), "listen": "127.0.0.1:0"}}))
    assert not missing.exists()
