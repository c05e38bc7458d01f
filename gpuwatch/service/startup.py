"""What the agent claims before it starts, and what it keeps across a reload: start-up checks with their exit codes
(ConfigError: 78, StartupError: 69; a full state dir is neither: state is kept in memory) and the settings that take
effect only after a restart."""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatch.collectors.configuration import load_config
from gpuwatch.config.settings import Config, ConfigError
from gpuwatch.files.statedir import (
    AgentLock,
    StateDirBusy,
    StateDirUnsafe,
    clean_stale_temp_files,
    require_safe_state_dir,
)
from gpuwatch.files.statefile import StateDirError, check_state_dir
from gpuwatch.state.store import StoreSnapshot

log = logging.getLogger(__name__)

# How often an agent whose state dir takes no writes (full, over quota) tries a write again.
STATE_DIR_RETRY_SECONDS = 10.0
RESTART_ONLY = ("listen", "web_config", "backend", "state_dir", "disable_collectors")


class StartupError(Exception):
    """A resource the agent cannot work without is unavailable (exit 69)."""


def poll_health(snap: StoreSnapshot, slot_names: list[str], stale_after_polls: int) -> tuple[bool, str]:
    """/healthz: healthy while every vendor poll finished a run recently and no GPU's readings went stale."""
    limit = stale_after_polls * snap.poll_interval_seconds
    for name in slot_names:
        status = snap.collectors.get(name)
        last = status.last_run_timestamp if status else None
        if last is None:
            return False, f"starting: the first {name} poll has not finished"
        if snap.now - last > limit:
            return False, f"{name} poll has not finished for {snap.now - last:.1f} s (a hung vendor call?)"
    for uuid, sample in snap.samples.items():
        if uuid not in snap.gpu_errors and snap.now - sample.timestamp > limit:
            return False, f"GPU {uuid} readings are {snap.now - sample.timestamp:.1f} s old"
    return True, "ok"


def watchdog_problem(watchdog_seconds: float | None, config: Config) -> str | None:
    """Why systemd's watchdog would kill this agent between polls, or None (pings follow each poll only)."""
    poll = config.agent.poll_interval_seconds
    if watchdog_seconds is None or poll <= watchdog_seconds / 2:
        return None
    return (
        f"{poll:g} s exceeds half the systemd watchdog period "
        f"(WatchdogSec={watchdog_seconds:g}s, from $WATCHDOG_USEC): the agent pings the watchdog after each poll, "
        f"so systemd would kill and restart it between polls; set agent.poll_interval_seconds to at most "
        f"{watchdog_seconds / 2:g} or raise WatchdogSec= above {2 * poll:g}s in a drop-in (systemctl edit gpuwatch)"
    )


def claim_state_dir(config: Config, lock: AgentLock) -> bool:
    """Only ours (exit 78), not another agent's (exit 69) and writable (exit 69), then clear a killed agent's temp
    files; True when state files can be written, False when the filesystem or quota is full: the agent then starts
    with its state in memory (said here, once), since a full /var that any local user can cause must not keep it
    down, and writes its state again once there is room (Agent, after each poll)."""
    try:
        require_safe_state_dir(config.state_dir)
    except StateDirUnsafe as exc:
        raise ConfigError(str(config.source), "agent.state_dir", str(exc)) from None
    full: StateDirError | None = None
    try:
        try:
            check_state_dir(config.state_dir)
        except StateDirError as exc:
            if not exc.no_space or not config.state_dir.is_dir():
                raise
            full = exc
        lock.acquire()
    except StateDirBusy as exc:
        raise StartupError(str(exc)) from None
    except (StateDirError, OSError) as exc:
        raise StartupError(
            f"state dir {config.state_dir} is not writable ({exc}); create it for the agent's user or pass --state-dir"
        ) from None
    if full is not None:
        log.error(
            "state dir %s: %s. STARTING WITH STATE KEPT IN MEMORY ONLY: known GPUs, probe baselines and the power "
            "supplies seen are not written, and what is learnt now is lost if the agent restarts before there is "
            "room. Free space (or quota) on the filesystem of %s (df -h %s; df -i for inodes): the agent retries "
            "every %g s and writes its state again by itself (gpuwatch_state_dir_writable goes back to 1)",
            config.state_dir,
            os.strerror(full.errno or errno.ENOSPC),
            config.state_dir,
            config.state_dir,
            STATE_DIR_RETRY_SECONDS,
        )
    clean_stale_temp_files(config.state_dir)
    return full is None


def live_part(old: Config, new: Config) -> Config:
    """`new` with what the running sockets, backends and threads were built from kept from `old`; says which
    settings changed but take effect only after a restart."""
    for key in RESTART_ONLY:
        if getattr(old.agent, key) != getattr(new.agent, key):
            log.warning("agent.%s changed: takes effect after a restart", key)
    if old.xid != new.xid:
        log.warning("[xid] changed: takes effect after a restart")
    new = dataclasses.replace(
        new,
        agent=dataclasses.replace(new.agent, **{key: getattr(old.agent, key) for key in RESTART_ONLY}),
        xid=old.xid,
    )
    if old.simulated != new.simulated:
        log.warning("[simulated] changed: takes effect after a restart")
    if old.probe != new.probe:
        log.warning("[probe] changed: takes effect after a restart")
    if old.host != new.host:
        log.warning("[host] changed: takes effect after a restart")
    if old.compat != new.compat:
        log.warning("[compat] changed: takes effect after a restart")
        new = dataclasses.replace(new, compat=old.compat)
    return new


def load_for_reload(path: Path | None, overrides: dict[str, dict[str, Any]]) -> Callable[[], Config]:
    """SIGHUP's configuration: the same file and command-line overrides, read again."""
    return lambda: load_config(path, overrides)
