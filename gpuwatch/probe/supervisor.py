"""The probe's process supervision: start one worker per GPU of a round (the launcher's command plus the probe's
settings, pinned to its GPU), watch them until they end, kill each with its process group at the timeout, at the
memory limit or when the agent stops, and remember those that survived SIGKILL until they exit.

While the children run it reads the store's fresh samples: it tells a worker when its GPU reached the power limit
(so warm-up ends at steady state), keeps every sample taken meanwhile (the telemetry) and spots processes other than
our own children on the GPU (NVML reports host PIDs, so ours are known by every PID of their NSpid line).
gpuwatch/probe/runner.py decides when a round runs; gpuwatch/probe/conclude.py what its children's output means.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable

from gpuwatch.config.settings import ProbeSection
from gpuwatch.core.model import GpuIdentity, GpuSample
from gpuwatch.probe.children import _Child, _drain, _kill_group, _pids_of, _rss
from gpuwatch.probe.launch import WORKER_CWD, WorkerLauncher
from gpuwatch.probe.protocol import CAPPED_LINE
from gpuwatch.probe.readings import _at_power_cap, _power_observable
from gpuwatch.state.store import SampleStore

log = logging.getLogger(__name__)

WATCH_INTERVAL_SECONDS = 0.05
# A worker whose resident host memory passes this is killed (a runaway must not push the node into the OOM killer).
# RSS, not RLIMIT_AS: CUDA and ROCm reserve terabytes of virtual address space, which an address-space limit breaks.
WORKER_MEMORY_LIMIT_BYTES = 16 * 2**30


def worker_arguments(settings: ProbeSection, identity: GpuIdentity, *, power_signal: bool) -> list[str]:
    """The probe's settings on the worker's command line (the contract of gpuwatch/probe/worker.py)."""
    s = settings
    argv = [
        "--uuid", identity.uuid,
        "--vendor", identity.vendor,
        "--engine", s.engine,
        "--dtype", s.dtype,
        "--size", str(s.matrix_size),
        "--warmup-min", str(s.warmup_min_seconds),
        "--warmup-max", str(s.warmup_max_seconds),
        "--measure", str(s.measure_seconds),
        "--copy-mib", str(s.copy_mib),
    ]  # fmt: skip
    return [*argv, "--power-signal"] if power_signal else argv


def worker_environment(identity: GpuIdentity, sample: GpuSample) -> dict[str, str]:
    """This process's environment with only the worker's GPU visible, by a token its vendor's runtime takes."""
    env = dict(os.environ)
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        env.pop(name, None)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    # ROCr takes an index or GPU-<unique id>, not amdsmi's UUID: the backend's token (an AMD GPU without one gets
    # its UUID, which ROCr matches to no GPU: the worker fails rather than probe another GPU).
    pin = sample.runtime_device or identity.uuid
    env["ROCR_VISIBLE_DEVICES" if identity.vendor == "amd" else "CUDA_VISIBLE_DEVICES"] = pin
    return env


class WorkerSupervisor:
    """The worker processes of one runner: those of the running round, and those that survived SIGKILL."""

    def __init__(
        self,
        launcher: WorkerLauncher,
        store: SampleStore,
        *,
        clock: Callable[[], float],
        memory_limit_bytes: int = WORKER_MEMORY_LIMIT_BYTES,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.launcher = launcher
        self.memory_limit_bytes = memory_limit_bytes
        self._store = store
        self._clock = clock
        self._say = say
        self._children: list[_Child] = []
        self._children_lock = threading.Lock()
        self.stopping = threading.Event()
        self.stuck: list[_Child] = []  # children that survived SIGKILL, reaped with poll() in later rounds

    @property
    def running(self) -> list[_Child]:
        """The children of the round now running (empty between rounds)."""
        with self._children_lock:
            return list(self._children)

    def stop(self) -> None:
        """Kill every running child (the agent is stopping); a round running now ends at once."""
        self.stopping.set()
        with self._children_lock:
            for child in self._children:
                _kill_group(child.proc)

    def reap_stuck(self) -> dict[str, int]:
        """Reap the children that survived SIGKILL in an earlier round; the UUIDs of those still alive, with PIDs."""
        alive: list[_Child] = []
        for child in self.stuck:
            if child.proc.poll() is None:
                alive.append(child)
            else:
                log.warning(
                    "the probe worker of GPU %d (PID %d) that survived SIGKILL has exited (status %s)",
                    child.identity.index,
                    child.proc.pid,
                    child.proc.returncode,
                )
        self.stuck = alive
        return {c.identity.uuid: c.proc.pid for c in alive}

    def run_round(self, settings: ProbeSection, runnable: list[tuple[GpuIdentity, GpuSample, bool]]) -> list[_Child]:
        """Start a worker for each (GPU, its last sample, probed although busy), watch them all until each ended;
        nothing of theirs outlives the round except a child stuck in the driver (kept in `stuck`)."""
        started = time.monotonic()
        uuids = [identity.uuid for identity, _, _ in runnable]
        self._store.probe.probing(uuids, self._clock())  # until they end, the GPUs' load is the probe's own
        try:
            children = [self._spawn(settings, identity, sample, busy) for identity, sample, busy in runnable]
            with self._children_lock:
                self._children = children
            try:
                self._watch(children, started)
            finally:
                with self._children_lock:
                    self._children = []
                for child in children:
                    if not child.unkillable:  # a stuck one was SIGKILLed already and is reaped by a later round
                        _kill_group(child.proc)  # nothing of ours outlives the round (grandchildren included)
        finally:
            self._store.probe.probed(uuids, self._clock())
        return children

    def _spawn(self, settings: ProbeSection, identity: GpuIdentity, sample: GpuSample, busy: bool) -> _Child:
        power_signal = _power_observable(sample)
        argv = [*self.launcher.command(identity), *worker_arguments(settings, identity, power_signal=power_signal)]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=worker_environment(identity, sample),
            cwd=WORKER_CWD,
            start_new_session=True,  # its own process group: the timeout kills everything it started
        )
        child = _Child(
            identity=identity,
            proc=proc,
            started_wall=self._clock(),
            deadline=time.monotonic() + settings.timeout_seconds,
            own_pids=_pids_of(proc.pid),
            power_signal=power_signal,
            explicit_busy=busy,
        )
        for stream, sink in ((proc.stdout, child.stdout), (proc.stderr, child.stderr)):
            reader = threading.Thread(target=_drain, args=(stream, sink), daemon=True, name="probe-output")
            reader.start()
            child.readers.append(reader)
        return child

    def _watch(self, children: list[_Child], started: float) -> None:
        """Until every child ended: signal power caps, collect telemetry, spot foreign processes, enforce limits."""
        last_said = time.monotonic()
        last_pid_scan = 0.0
        while True:
            now = time.monotonic()
            running = [c for c in children if c.ended is None]
            if not running:
                return
            if now - last_pid_scan >= 0.5:
                last_pid_scan = now
                for child in running:
                    child.own_pids |= _pids_of(child.proc.pid, recursive=True)
            own = set().union(*(c.own_pids for c in children))
            snap = self._store.snapshot()
            for child in children:
                self._look(child, snap.fresh(child.identity.uuid), own)
            for child in running:
                self._enforce(child, now)
            if self._say is not None and now - last_said >= 1.0:
                last_said = now
                waiting = ", ".join(str(c.identity.index) for c in children if c.ended is None)
                if waiting:
                    self._say(f"  … {now - started:.0f} s (GPU {waiting})")
            time.sleep(WATCH_INTERVAL_SECONDS)

    def _enforce(self, child: _Child, now: float) -> None:
        """Mark a child that exited as ended; kill one past its memory limit, its deadline, or the agent's stop."""
        if child.proc.poll() is not None:
            child.ended = now
        elif (rss := _rss(child.proc.pid)) > self.memory_limit_bytes:
            child.memory_exceeded = rss
            _kill_group(child.proc)
            if child.proc.poll() is None:  # reaped in a later round, as a timed-out one stuck in the driver
                child.unkillable = True
                self.stuck.append(child)
            child.ended = now
        elif now >= child.deadline or self.stopping.is_set():
            child.timed_out = not self.stopping.is_set()
            _kill_group(child.proc)  # waits a bounded time: a worker stuck in the driver may not die
            if child.proc.poll() is None:
                child.unkillable = True
                self.stuck.append(child)
                log.error(
                    "the probe worker of GPU %d (PID %d) could not be killed (stuck in the driver?); "
                    "its lock is released and it is reaped when it exits",
                    child.identity.index,
                    child.proc.pid,
                )
            child.ended = now

    def _look(self, child: _Child, sample: GpuSample | None, own: set[int]) -> None:
        """Take one fresh sample taken while the child ran into account (each sample once)."""
        if child.ended is not None or sample is None:
            return
        if sample.timestamp < child.started_wall or sample.timestamp in child.seen:
            return
        child.seen[sample.timestamp] = sample
        if sample.process_pids and not child.explicit_busy:
            child.foreign_pids |= set(sample.process_pids) - own
        if child.power_signal and not child.signalled and child.ended is None and _at_power_cap(sample):
            child.signalled = True
            with contextlib.suppress(OSError, ValueError):
                assert child.proc.stdin is not None
                child.proc.stdin.write(f"{CAPPED_LINE}\n".encode())
                child.proc.stdin.flush()
