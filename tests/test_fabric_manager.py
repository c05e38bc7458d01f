"""The node's side of the NVLink fabric (issue #34; gpuwatch/collectors/fabric.py): whether nv-fabricmanager runs
where NVSwitches need it, read from the real process table, from the daemon's real API socket where a hidepid
mount or a PID namespace hides the process, and what the agent makes of it."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import until
from simnode import SimAgent

from gpuwatch.collectors.configuration import load_config
from gpuwatch.collectors.fabric import check
from gpuwatch.collectors.sources import FabricSource
from gpuwatch.config.settings import ConfigError
from gpuwatch.judge.findings import gpu_health, node_findings
from gpuwatch.readers.fabric_manager import (
    DAEMON,
    ApiSocket,
    ManagerWatch,
    api_socket,
    listening,
    manager_state,
    process_running,
)
from gpuwatch.readers.procfs import Procfs

PROC = Path("/proc")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real process named as NVIDIA's package installs the daemon (/usr/bin/nv-fabricmanager): 16 characters, one
    more than the kernel keeps in a process's comm, so the name is read in full or not at all."""
    binary = tmp_path / DAEMON
    shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
    process = subprocess.Popen([str(binary), "60"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_the_daemon_is_found_by_its_full_name_and_gone_once_it_exits(daemon: subprocess.Popen[bytes]) -> None:
    assert len(DAEMON) == 16
    until("the daemon in the process table", lambda: process_running(PROC, DAEMON), 5)
    assert not process_running(PROC, DAEMON[:15])  # the truncated comm alone is not the daemon's name
    assert manager_state(Procfs(PROC)).running is (True if _sees_every_process() else None)
    daemon.kill()
    daemon.wait()
    assert not process_running(PROC, DAEMON)


def test_an_nvswitch_node_exports_the_daemons_state_and_its_absence_is_a_node_finding(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, "fabric_degraded")
    try:
        sim.run(2)
        assert sim.value("gpuwatch_host_nvswitches") == 4.0
        assert sim.value("gpuwatch_host_fabric_manager_running") == 1.0
        assert not [f for f in node_findings(sim.agent.store.snapshot()) if f.alert == "NvidiaFabricManagerDown"]
        sim.node.faults.stop_fabric_manager()
        sim.run(31)  # the collector's 30 s
        assert sim.value("gpuwatch_host_fabric_manager_running") == 0.0
        down = [f for f in node_findings(sim.agent.store.snapshot()) if f.alert == "NvidiaFabricManagerDown"]
        assert len(down) == 1 and down[0].level == "bad"
        assert "not running on a node with 4 NVSwitch(es)" in down[0].text
        healthy, why = gpu_health(sim.agent.store.snapshot())  # /health/gpus: 503, saying why
        assert not healthy and "nvidia-fabricmanager is not running" in why
    finally:
        sim.close()


def test_a_node_without_nvswitches_needs_no_fabric_manager(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, "healthy")
    try:
        sim.run(2)
        assert sim.value("gpuwatch_host_nvswitches") == 0.0
        assert sim.value("gpuwatch_host_fabric_manager_running") is None
    finally:
        sim.close()


def _sees_every_process() -> bool:
    """Whether this test's own /proc shows the host's every process (not in a container of its own, no hidepid)."""
    return Procfs(PROC).pids_are_host() and Procfs(PROC).hides_others() is None


def test_the_api_socket_is_the_one_the_packages_configuration_names(tmp_path: Path) -> None:
    """fabricmanager.cfg is KEY=VALUE lines with # comments: FM_CMD_PORT_NUMBER (6666 by default, nv_fm_types.h),
    FM_CMD_UNIX_SOCKET_PATH (empty: TCP). A missing file or a port out of range leaves the default."""
    cfg = tmp_path / "fabricmanager.cfg"
    assert api_socket(cfg) == ApiSocket(6666, "")
    cfg.write_text("# FM_CMD_PORT_NUMBER=1\nLOG_LEVEL=4\nFM_CMD_BIND_INTERFACE=127.0.0.1\nFM_CMD_PORT_NUMBER=16001\n")
    assert api_socket(cfg) == ApiSocket(16001, "")
    cfg.write_text("FM_CMD_PORT_NUMBER=70000\nFM_CMD_UNIX_SOCKET_PATH=\n")
    assert api_socket(cfg) == ApiSocket(6666, "")
    cfg.write_text("FM_CMD_PORT_NUMBER = 6666\nFM_CMD_UNIX_SOCKET_PATH = /run/nvidia-fabricmanager/fm.sock\n")
    assert str(api_socket(cfg)) == "unix:/run/nvidia-fabricmanager/fm.sock"


def test_a_listening_tcp_or_unix_socket_is_found_and_a_closed_one_is_not(tmp_path: Path) -> None:
    """/proc/net/tcp (st 0A: LISTEN) and /proc/net/unix (Flags __SO_ACCEPTCON) as the kernel writes them, from real
    sockets: a bound socket that does not listen is not the daemon's."""
    tcp = socket.create_server(("127.0.0.1", 0))
    port = tcp.getsockname()[1]
    try:
        assert listening(ApiSocket(port))
    finally:
        tcp.close()
    assert not listening(ApiSocket(port))
    path = str(tmp_path / "fm.sock")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        unix.bind(path)
        assert not listening(ApiSocket(unix_path=path))  # bound, not yet listening
        unix.listen()
        assert listening(ApiSocket(unix_path=path))
        assert not listening(ApiSocket(unix_path=path + "x"))
    finally:
        unix.close()
    assert not listening(ApiSocket(unix_path=path))


_STATE = (
    "import sys; from pathlib import Path; from gpuwatch.readers.fabric_manager import manager_state, "
    "process_running; from gpuwatch.readers.procfs import Procfs; root = Path(sys.argv[1]); "
    "s = manager_state(Procfs(root), Path(sys.argv[2]), root / 'net'); print(process_running(root), s.running)"
)


def _readable_copy() -> tuple[Path, Path]:
    """A world-readable directory for the procfs mount and the configuration, and a world-readable copy of gpuwatch
    (pytest's tmp_path and a CI clone may be root's alone) for the other user's interpreter (stdlib only)."""
    work = Path(tempfile.mkdtemp(prefix="gpuwatch-fm-"))
    shutil.copytree(
        Path(__file__).resolve().parent.parent / "gpuwatch",
        work / "code" / "gpuwatch",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (work / "proc").mkdir()
    for path in [work, *work.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return work, work / "code"


def _behind_hidepid(work: Path, cfg: Path) -> list[str]:
    """In a private mount namespace, a procfs mounted hidepid=invisible (systemd's ProtectProc=invisible): what
    uid 65534 reads of the daemon there, then what root (exempt) reads."""
    python = os.path.realpath(sys.executable)
    read = f"{python} -c {shlex.quote(_STATE)} {work / 'proc'} {cfg}"
    shell = (
        f"mount -t proc -o hidepid=invisible proc {work / 'proc'} || exit 3; export PYTHONPATH={work / 'code'}; "
        f"setpriv --reuid=65534 --regid=65534 --clear-groups {read} && {read}"
    )
    done = subprocess.run(["unshare", "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=60)
    if done.returncode == 3:
        pytest.skip(f"cannot mount a procfs here: {done.stderr.strip()}")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 2, done.stdout + done.stderr
    return done.stdout.splitlines()


_ROOT_TOOLS = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "setpriv")),
    reason="needs root, unshare and setpriv to mount a procfs with hidepid= and run as another user",
)


@_ROOT_TOOLS
def test_behind_hidepid_the_daemon_is_judged_by_its_api_socket(daemon: subprocess.Popen[bytes]) -> None:
    """The shipped unit's ProtectProc=invisible hides root's nv-fabricmanager from the gpuwatch user: an empty
    process table there is no evidence, and reading it as the daemon down paged every HGX node. Its API socket
    (the port fabricmanager.cfg names) listening is the daemon running; none is the daemon down, in the host's PID
    namespace (a systemd service's). Root, exempt from hidepid, sees the process itself."""
    until("the daemon in the process table", lambda: process_running(PROC, DAEMON), 5)
    work, _ = _readable_copy()
    api = socket.create_server(("127.0.0.1", 0))
    try:
        cfg = work / "fabricmanager.cfg"
        cfg.write_text(f"FM_CMD_BIND_INTERFACE=127.0.0.1\nFM_CMD_PORT_NUMBER={api.getsockname()[1]}\n")
        cfg.chmod(0o644)
        assert _behind_hidepid(work, cfg) == ["False True", "True True"]
        api.close()
        down = "False" if Procfs(PROC).pids_are_host() else "None"  # a test run inside a container: unknown
        assert _behind_hidepid(work, cfg) == [f"False {down}", "True True"]
    finally:
        api.close()
        shutil.rmtree(work)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare for a PID namespace"
)
def test_in_a_pid_namespace_of_its_own_the_daemon_is_unknown_unless_its_socket_listens(
    daemon: subprocess.Popen[bytes],
) -> None:
    """A container without hostPID (the DaemonSet's default) has a /proc of its own: the host's daemon is not in
    it, and no socket on its loopback says otherwise, so the state is unknown (None), never down."""
    work, code = _readable_copy()
    api = socket.create_server(("127.0.0.1", 0))
    try:
        cfg = work / "fabricmanager.cfg"
        cfg.write_text(f"FM_CMD_PORT_NUMBER={api.getsockname()[1]}\n")
        python = os.path.realpath(sys.executable)
        command = ["unshare", "--pid", "--fork", "--mount-proc", python, "-c", _STATE, "/proc", str(cfg)]
        env = {**os.environ, "PYTHONPATH": str(code)}
        assert subprocess.run(command, capture_output=True, text=True, env=env, timeout=60).stdout == "False True\n"
        api.close()  # the same network namespace here: the socket gone, the state cannot be known
        assert subprocess.run(command, capture_output=True, text=True, env=env, timeout=60).stdout == "False None\n"
    finally:
        api.close()
        shutil.rmtree(work)


def test_an_unknown_state_is_logged_once_exported_as_nothing_and_checked_as_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the agent cannot tell (a /proc of another PID namespace, no API socket), it exports no
    gpuwatch_host_fabric_manager_running, raises no NvidiaFabricManagerDown, logs why once, and `gpuwatch check`
    says how to make the daemon visible."""
    own = tmp_path / "own"  # a container's own /proc: one NSpid, a PID namespace that is not the host's
    (own / "self" / "ns").mkdir(parents=True)
    (own / "self" / "status").write_text("Name:\tgpuwatch\nNSpid:\t7\n")
    (own / "self" / "ns" / "pid").write_text("")
    watch = ManagerWatch(Procfs(own), tmp_path / "no.cfg", tmp_path / "no-net")
    sim = SimAgent(tmp_path / "state", "fabric_degraded")
    sim.sources.fabric = FabricSource(sim.node.nvswitch_count, watch)
    try:
        with caplog.at_level(logging.WARNING, logger="gpuwatch.readers.fabric_manager"):
            sim.run(65)  # three runs of the collector
        assert sim.value("gpuwatch_host_nvswitches") == 4.0
        assert sim.value("gpuwatch_host_fabric_manager_running") is None
        assert not [f for f in node_findings(sim.agent.store.snapshot()) if f.alert == "NvidiaFabricManagerDown"]
        said = [r.getMessage() for r in caplog.records if r.name == "gpuwatch.readers.fabric_manager"]
        assert len(said) == 1 and "unknown" in said[0] and "hostPID" in said[0]
        (line,) = check(sim.agent.config, sim.sources, "fabric")
        assert line.level == "warn" and "cannot be seen" in line.detail and "procfs_root" in line.fix
    finally:
        sim.close()


def test_the_fabric_managers_configuration_path_must_be_absolute(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[fabric]\nmanager_config = "fabricmanager.cfg"\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert "fabric.manager_config: must be an absolute path" in str(raised.value)
