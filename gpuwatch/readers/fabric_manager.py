"""Whether NVIDIA's fabric manager runs on this node: from the process table where the agent can see it whole, else
from the daemon's own API socket, else unknown.

NVIDIA's Fabric Manager (package nvidia-fabricmanager-<driver branch>, unit nvidia-fabricmanager.service) runs the
daemon /usr/bin/nv-fabricmanager with /usr/share/nvidia/nvswitch/fabricmanager.cfg (NVIDIA Fabric Manager User
Guide, "Installing Fabric Manager", "Starting Fabric Manager"). A process of that name is the daemon running.

The agent cannot always see it. The shipped unit's ProtectProc=invisible (hidepid) hides root's processes from the
gpuwatch user, and a container without the host's PID namespace (the DaemonSet's hostPID: false) sees only its own:
there an empty process table is no evidence, and calling the daemon down paged every HGX node. So, in order:
1. a process table that shows every process of the host (the host's PID namespace, nothing hidden from this
   reader: procfs.Procfs tells) answers alone;
2. else the daemon's API socket: FM listens for its SDK on FM_CMD_BIND_INTERFACE:FM_CMD_PORT_NUMBER (127.0.0.1:6666
   by default; User Guide, "The Fabric Manager API TCP Port"), or on FM_CMD_UNIX_SOCKET_PATH when that is set, and
   the socket is in /proc/net/tcp or /proc/net/unix whatever hidepid says. gpud judges the daemon by this port alone
   (leptonai/gpud components/accelerator/nvidia/fabric-manager/component.go, checkFMActive). A listening socket is
   the daemon running; no socket is the daemon down only where the agent shares the host's PID namespace (a systemd
   service, which shares the host's network too);
3. else unknown (None): a container of its own sees neither the host's processes nor its loopback.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.readers.procfs import Procfs

log = logging.getLogger(__name__)

DAEMON = "nv-fabricmanager"
CONFIG = Path("/usr/share/nvidia/nvswitch/fabricmanager.cfg")
DEFAULT_PORT = 6666  # FM_CMD_PORT_NUMBER's default (nv_fm_types.h: #define FM_CMD_PORT_NUMBER 6666)
_COMM_LENGTH = 15  # TASK_COMM_LEN 16 with its NUL: the kernel keeps 15 characters of a process's name
_TCP_LISTEN = "0A"  # include/net/tcp_states.h TCP_LISTEN = 10, as /proc/net/tcp prints st (%02X)
_SO_ACCEPTCON = 0x10000  # include/linux/net.h __SO_ACCEPTCON: /proc/net/unix's Flags for a listening socket
_MAX_CONFIG_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class ApiSocket:
    """Where the fabric manager listens for its API: a TCP port, or a Unix socket path where one is configured."""

    port: int = DEFAULT_PORT
    unix_path: str = ""

    def __str__(self) -> str:
        return f"unix:{self.unix_path}" if self.unix_path else f"TCP port {self.port}"


def api_socket(config: Path = CONFIG) -> ApiSocket:
    """The API socket fabricmanager.cfg configures (KEY=VALUE lines, # comments); the defaults where the file or a
    key is missing or unreadable: a node without the package has no daemon to listen, which is what is checked."""
    try:
        with open(config, encoding="utf-8", errors="replace") as f:
            text = f.read(_MAX_CONFIG_BYTES)
    except OSError:
        return ApiSocket()
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            values[key.strip()] = value.strip()
    port = values.get("FM_CMD_PORT_NUMBER", "")
    return ApiSocket(
        int(port) if port.isdigit() and 0 < int(port) < 65536 else DEFAULT_PORT,
        values.get("FM_CMD_UNIX_SOCKET_PATH", ""),
    )


def listening(socket: ApiSocket, net_root: Path = Path("/proc/net")) -> bool:
    """Whether a socket of this network namespace listens where the daemon would (proc(5): /proc/net/tcp, tcp6 and
    unix)."""
    if socket.unix_path:
        return any(
            len(fields) >= 8 and fields[7] == socket.unix_path and int(fields[3], 16) & _SO_ACCEPTCON
            for fields in _table(net_root / "unix")
        )
    port = f"{socket.port:04X}"
    return any(
        len(fields) >= 4 and fields[1].rpartition(":")[2] == port and fields[3] == _TCP_LISTEN
        for name in ("tcp", "tcp6")
        for fields in _table(net_root / name)
    )


def process_running(procfs_root: Path = Path("/proc"), name: str = DAEMON) -> bool:
    """Whether a process named `name` is in this procfs. Its name is its comm, unless the comm fills all 15
    characters the kernel keeps: then the file its command line started, where that begins with the comm (psutil's
    Process.name and `ps -C` read a truncated name so)."""
    try:
        pids = [entry for entry in os.listdir(procfs_root) if entry.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            comm = (procfs_root / pid / "comm").read_text(errors="replace").rstrip("\n")
            if comm != name[: len(comm)] or len(comm) not in (len(name), _COMM_LENGTH):
                continue  # cheap: only a candidate's command line is read
            full = comm
            if len(comm) == _COMM_LENGTH:
                argv0 = (procfs_root / pid / "cmdline").read_bytes().split(b"\0", 1)[0]
                started = os.path.basename(argv0.decode(errors="replace"))
                full = started if started.startswith(comm) else comm
        except OSError:
            continue  # exited while we looked, or hidden: not running as far as this table can say
        if full == name:
            return True
    return False


@dataclass(frozen=True, slots=True)
class ManagerState:
    """The daemon running (True), down (False) or unknown (None), and how that was found out."""

    running: bool | None
    how: str


def manager_state(procfs: Procfs, config: Path = CONFIG, net_root: Path = Path("/proc/net")) -> ManagerState:
    """The fabric manager's state as far as this agent can see it (the module's docstring gives the order)."""
    host_pids = procfs.pids_are_host()
    hidden = procfs.hides_others()
    if host_pids and hidden is None:
        return ManagerState(process_running(procfs.root), f"the process table ({procfs.root})")
    socket = api_socket(config)
    if listening(socket, net_root):
        return ManagerState(True, f"its API socket ({socket}) listens")
    if host_pids:
        return ManagerState(False, f"no {DAEMON} API socket ({socket}, from {config}); hidepid={hidden} hides it")
    return ManagerState(
        None,
        f"{procfs.root} is not the host's process table and no API socket ({socket}) listens here: run the agent "
        "with the host PID namespace (hostPID: true, --pid=host) or set workloads.procfs_root to the host's /proc",
    )


class ManagerWatch:
    """The collector's view of the daemon: manager_state each time asked, with one log line when the answer cannot
    be known, and another when it can again (the agent says why it exports nothing rather than a guess)."""

    def __init__(self, procfs: Procfs, config: Path = CONFIG, net_root: Path = Path("/proc/net")) -> None:
        self._procfs, self._config, self._net_root = procfs, config, net_root
        self._said_unknown = False

    def __call__(self) -> bool | None:
        state = manager_state(self._procfs, self._config, self._net_root)
        if state.running is None and not self._said_unknown:
            log.warning("whether nv-fabricmanager runs is unknown: %s", state.how)
        elif state.running is not None and self._said_unknown:
            log.info("nv-fabricmanager is seen again: %s", state.how)
        self._said_unknown = state.running is None
        return state.running


def _table(path: Path) -> Iterator[list[str]]:
    """The rows of a /proc/net table, header left out, one at a time (a busy node's tcp table runs to megabytes and
    the search stops at the first match); none where it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            next(f, None)
            for line in f:
                yield line.split()
    except OSError:
        return
