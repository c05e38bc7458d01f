"""A full filesystem under the state dir at start-up (issue 31, item 7): a local user who fills a shared /var must not
keep the agent down. The agent starts with its state in memory, says so once, exports gpuwatch_state_dir_writable 0,
and writes its state as soon as there is room again; what must be refused (another agent, an unsafe dir, a read-only
one) still is. Real filesystems: a small tmpfs filled up, by blocks and by inodes (the tests run as root; skipped,
saying why, where mounting is not permitted)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ports import free_port
from processes import stop, wait_until_ready
from test_sdnotify import NotifySocket

from gpuwatch.cli.commands import check
from gpuwatch.collectors.configuration import load_config
from gpuwatch.files.statedir import AgentLock
from gpuwatch.files.statefile import KNOWN_GPUS_FILE, StateDirError, atomic_write_json
from gpuwatch.service.startup import StartupError, claim_state_dir

GPUWATCH = [sys.executable, "-m", "gpuwatch"]
IN_MEMORY = "STARTING WITH STATE KEPT IN MEMORY ONLY"
BACK = "takes writes again"


@contextlib.contextmanager
def small_tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)]
    result = subprocess.run(mount, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up (needs root or CAP_SYS_ADMIN): {result.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True)


def fill_blocks(directory: Path) -> Path:
    """Write a file until the filesystem says ENOSPC; the file, to delete when room is wanted again."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def fill_inodes(directory: Path) -> list[Path]:
    """Create empty files until the filesystem has no inode left."""
    made: list[Path] = []
    while True:
        path = directory / f"inode-{len(made)}"
        try:
            path.touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            return made
        made.append(path)


@pytest.fixture
def full_state_dir(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(the state dir, the filler file) on a 1 MiB tmpfs whose blocks are all taken."""
    with small_tmpfs(tmp_path / "var", "size=1m,mode=0755") as mount:
        state = mount / "gpuwatch"
        state.mkdir(mode=0o750)
        yield state, fill_blocks(mount)


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def wait_for(what: str, condition: Callable[[], bool], seconds: float = 40.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds:g} s"
        time.sleep(0.3)


def start_agent(state: Path, port: int, log: Path, notify: str | None = None, *extra: str) -> subprocess.Popen[bytes]:
    argv = [*GPUWATCH, "run", "--backend", "simulated", "--gpus", "2", "--listen", f"127.0.0.1:{port}", *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    if notify is not None:
        env["NOTIFY_SOCKET"] = notify
    with open(log, "wb") as out:
        return subprocess.Popen([*argv, "--state-dir", str(state)], stdout=out, stderr=subprocess.STDOUT, env=env)


def test_an_agent_on_a_full_filesystem_starts_in_memory_and_writes_its_state_once_there_is_room(
    full_state_dir: tuple[Path, Path], tmp_path: Path
) -> None:
    state, filler = full_state_dir
    port, log = free_port(), tmp_path / "agent.log"
    systemd = NotifySocket(str(tmp_path / "notify"), str(tmp_path / "notify"))
    agent = start_agent(state, port, log, systemd.path)
    try:
        # systemctl status says it too, beside the health
        assert "state kept in memory only" in systemd.wait_for("READY", timeout=60)[-1]["STATUS"]
        wait_until_ready(f"http://127.0.0.1:{port}/metrics", agent, "the agent on a full filesystem")
        text = metrics(port)
        assert "gpuwatch_state_dir_writable 0.0" in text
        assert "gpuwatch_gpu_up{" in text  # it polls and serves as ever
        assert not (state / KNOWN_GPUS_FILE).exists()
        time.sleep(12)  # more than one retry: still full, still said once
        assert agent.poll() is None

        filler.unlink()
        wait_for("known_gpus.json written after space was freed", (state / KNOWN_GPUS_FILE).is_file)
        wait_for("gpuwatch_state_dir_writable 1", lambda: "gpuwatch_state_dir_writable 1.0" in metrics(port))
        assert (state / "agent.lock").read_text().strip() == str(agent.pid)  # found no room at start
    finally:
        stop(agent)
        systemd.sock.close()
    said = log.read_text()
    assert said.count(IN_MEMORY) == 1, said
    assert said.count(BACK) == 1, said
    line = next(line for line in said.splitlines() if IN_MEMORY in line)
    # What is lost, and what to do: named in the one line.
    assert "No space left on device" in line and "lost if the agent restarts" in line and f"df -h {state}" in line
    assert [p.name for p in state.iterdir() if p.name.endswith(".tmp")] == []


def test_with_no_inode_left_the_directory_lock_still_keeps_a_second_agent_out(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "var", "size=4m,nr_inodes=64,mode=0755") as mount:
        state = mount / "gpuwatch"
        state.mkdir(mode=0o750)
        fill_inodes(mount)
        port, log = free_port(), tmp_path / "first.log"
        first = start_agent(state, port, log, None, "--probe-interval", "1")
        try:
            wait_until_ready(f"http://127.0.0.1:{port}/metrics", first, "the agent with no inode left")
            assert "gpuwatch_state_dir_writable 0.0" in metrics(port)
            assert not (state / "agent.lock").exists()  # no room for it: the directory's own lock holds
            second = subprocess.run(
                [
                    *GPUWATCH,
                    "run",
                    "--backend",
                    "simulated",
                    "--gpus",
                    "1",
                    "--listen",
                    "127.0.0.1:0",
                    "--state-dir",
                    str(state),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert second.returncode == 69, second.stderr
            assert "already uses the state dir" in second.stderr and "--state-dir" in second.stderr
            # No room for the probe's per-GPU locks either: its rounds skip the GPUs, said once, never a traceback.
            wait_for("a probe round", lambda: "probe rounds skip their GPUs" in log.read_text())
            time.sleep(3)  # more rounds
            assert 'gpuwatch_probe_runs_total{gpu="0"' in metrics(port) and first.poll() is None
        finally:
            stop(first)
        said = log.read_text()
        assert said.count(IN_MEMORY) == 1 and said.count("probe rounds skip their GPUs") == 1, said
        assert "Traceback" not in said and said.count("reading baselines without the lock") <= 1, said


def test_check_warns_about_a_full_state_dir_with_the_remedy(
    full_state_dir: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    state, _filler = full_state_dir
    config = load_config(None, {"agent": {"backend": "simulated", "state_dir": str(state), "listen": "127.0.0.1:0"}})
    assert check(config) == 0  # the agent runs: a warn, not a FAIL
    out = capsys.readouterr().out
    warn = out[out.index(f"[warn] state dir {state} space") :].splitlines()
    assert "is full (no free blocks)" in warn[0] and "keeps its state in memory" in warn[0], out
    assert warn[1].startswith("    fix: free space") and f"df -h {state}" in warn[1], out
    assert "[FAIL]" not in out


# --- what a full disk is, and what it is not: the same start-up path, the errors where the kernel gives them --------


def failing_fsync(code: int) -> Callable[..., Any]:
    def fail(*_args: object, **_kwargs: object) -> Any:
        raise OSError(code, os.strerror(code))

    return fail


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_no_space_or_over_quota_starts_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    config = load_config(None, {"agent": {"backend": "simulated", "state_dir": str(state), "listen": "127.0.0.1:0"}})
    lock = AgentLock(state)
    monkeypatch.setattr(os, "fsync", failing_fsync(code))
    try:
        assert claim_state_dir(config, lock) is False
        assert lock.file_held
    finally:
        lock.release()


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.EIO])
def test_other_write_failures_still_refuse_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    config = load_config(None, {"agent": {"backend": "simulated", "state_dir": str(state), "listen": "127.0.0.1:0"}})
    monkeypatch.setattr(os, "fsync", failing_fsync(code))
    with pytest.raises(StartupError, match="not writable"):
        claim_state_dir(config, AgentLock(state))


def test_a_full_state_dir_held_by_another_agent_is_still_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    config = load_config(None, {"agent": {"backend": "simulated", "state_dir": str(state), "listen": "127.0.0.1:0"}})
    first = AgentLock(state)
    first.acquire()
    monkeypatch.setattr(os, "fsync", failing_fsync(errno.ENOSPC))
    try:
        with pytest.raises(StartupError, match=f"PID {os.getpid()}"):
            claim_state_dir(config, AgentLock(state))
    finally:
        first.release()
    assert IN_MEMORY not in caplog.text  # it does not start: no word of memory


def test_a_no_space_error_is_no_space_and_a_read_only_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for code, no_space in ((errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EROFS, False)):
        monkeypatch.setattr(os, "fsync", failing_fsync(code))
        with pytest.raises(StateDirError) as raised:
            atomic_write_json(tmp_path / "x.json", {"kind": "x", "version": 1})
        assert raised.value.no_space is no_space
