"""Whether NVIDIA's fabric manager runs on this node, from the process table.

NVIDIA's Fabric Manager (package nvidia-fabricmanager-<driver branch>, unit nvidia-fabricmanager.service) runs the
daemon /usr/bin/nv-fabricmanager (NVIDIA Fabric Manager User Guide, "Installing Fabric Manager" and "Starting
Fabric Manager"). The process table answers where systemd is not PID 1 (containers, CI) as well as where it is, and
needs no D-Bus: a process of that name is the daemon running.
"""

from __future__ import annotations

import psutil

DAEMON = "nv-fabricmanager"


def process_running(name: str = DAEMON) -> bool:
    """Whether a process named `name` (its comm, as `ps -C` matches it) runs; one that exits while we look is
    not."""
    return any(process.info.get("name") == name for process in psutil.process_iter(["name"]))
