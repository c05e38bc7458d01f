"""The probe policy: when to probe, on which GPUs, and in which order; gpuwatch/probe/supervisor.py runs the worker
processes and gpuwatch/probe/conclude.py makes each one's output a result.

By default the probe runs only when every GPU of the node is idle (no compute processes, low utilization), then on
all of them at once (one child each, so peers share thermal state). MIG, exclusive or prohibited compute mode and a
missing engine are skipped_unsupported; a busy node is skipped_busy; a result is discarded (skipped_busy) when a
process other than our own children appeared on the GPU while it ran — NVML reports host PIDs, so our children are
recognised by every PID of their ``/proc/<pid>/status`` NSpid line — which only holds the host PID in the host's PID
namespace, so in a container without it every probe is skipped_unsupported with that reason. A per-GPU lock file
keeps a CLI probe and the agent's apart. What a worker is, and whether one can run here, is the launcher's
(gpuwatch/probe/launch.py), which the composition layer gives it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

from gpuwatch.config.settings import ProbeSection
from gpuwatch.core.latch import Latch
from gpuwatch.core.model import GpuIdentity, GpuSample
from gpuwatch.probe.baseline import Baseline, Baselines, Mode
from gpuwatch.probe.children import PROC_PID_INIT_INO
from gpuwatch.probe.conclude import Conclusions, outcome
from gpuwatch.probe.launch import WorkerLauncher
from gpuwatch.probe.locks import LockNoRoom, try_lock, unlock
from gpuwatch.probe.readings import _previous, _unsupported, held_down
from gpuwatch.probe.supervisor import WORKER_MEMORY_LIMIT_BYTES, WorkerSupervisor
from gpuwatch.state.probebook import ProbeOutcome, ProbeResult
from gpuwatch.state.store import SampleStore

log = logging.getLogger(__name__)

STOP_WAIT_SECONDS = 1.0  # how long stop() waits for a round whose children it killed to record its results
NOT_HOST_PID_NAMESPACE = (
    "the agent runs in its own PID namespace (a container without hostPID): NVML reports host PIDs that this "
    "/proc cannot map to the probe's children, so every probe would look busy; run it with the host PID namespace "
    "(Kubernetes: hostPID: true; docker: --pid=host)"
)


class ProbeRunner:
    """Runs probes for the agent (scheduled) and for `gpuwatch probe`; results go to the store and the baselines."""

    def __init__(
        self,
        settings: ProbeSection,
        store: SampleStore,
        state_dir: Path,
        *,
        launcher: WorkerLauncher | None = None,
        clock: Callable[[], float] = time.time,
        progress: Callable[[str], None] | None = None,
        memory_limit_bytes: int = WORKER_MEMORY_LIMIT_BYTES,
    ) -> None:
        self.settings = settings
        self._store = store
        self._state_dir = state_dir
        self._launcher = launcher or WorkerLauncher()
        self._clock = clock
        self._progress = progress
        self._namespace = Latch(log)  # said once
        self._no_room = Latch(log)  # no room in the state dir for a probe lock: said once, and when there is again
        self._rounds = 0  # rounds running now (the agent's, or a test's beside it)
        self._rounds_changed = threading.Condition()
        self.workers = WorkerSupervisor(
            self._launcher, store, clock=clock, memory_limit_bytes=memory_limit_bytes, say=self._say
        )
        self._conclusions = Conclusions(
            Baselines(state_dir),
            store.probe,
            clock=clock,
            stopping=self.workers.stopping,
            memory_limit_bytes=memory_limit_bytes,
        )

    @property
    def baselines(self) -> Baselines:
        return self._conclusions.baselines

    # --- entry points ----------------------------------------------------------------------------------------

    def run(
        self,
        *,
        gpus: Collection[int] | None = None,
        explicit: bool = False,
        baseline_mode: Mode = "agent",
        wait_for_locks: bool = False,
    ) -> list[ProbeOutcome]:
        """One probe round; `explicit` (the CLI's --gpu) probes the named GPUs even when busy, marked as such."""
        with self._rounds_changed:
            self._rounds += 1
        try:
            return self._round(gpus, explicit, baseline_mode, wait_for_locks)
        finally:
            with self._rounds_changed:
                self._rounds -= 1
                self._rounds_changed.notify_all()

    def stop(self, timeout_s: float = STOP_WAIT_SECONDS) -> bool:
        """Kill every running child (the agent is stopping) and wait, at most `timeout_s`, for the round to record
        its results and release its locks: nothing of the probe runs on after the agent stopped. False if it did."""
        self.workers.stop()
        with self._rounds_changed:
            return self._rounds_changed.wait_for(lambda: self._rounds == 0, timeout=max(0.0, timeout_s))

    def _round(
        self, gpus: Collection[int] | None, explicit: bool, baseline_mode: Mode, wait: bool
    ) -> list[ProbeOutcome]:
        snap = self._store.snapshot()
        stuck = self.workers.reap_stuck()
        self._refresh_baselines()
        fresh = sorted(
            ((snap.identities[u], s) for u in snap.identities if (s := snap.fresh(u)) is not None),
            key=lambda pair: pair[0].index,
        )
        chosen = [(i, s) for i, s in fresh if gpus is None or i.index in gpus]
        outcomes: list[ProbeOutcome] = []
        candidates: list[tuple[GpuIdentity, GpuSample]] = []
        for identity, sample in chosen:
            why = _unsupported(sample)
            if identity.uuid in stuck:
                outcomes.append(
                    self._outcome(
                        identity,
                        "failed",
                        f"the previous probe worker (PID {stuck[identity.uuid]}) survived SIGKILL and is still "
                        "running (stuck in the driver?)",
                    )
                )
                continue
            if why is None and not self._launcher.engines():
                why = "no probe engine installed: pip install 'gpuwatch-agent[probe]' (CuPy) or PyTorch beside gpuwatch"
            if why is None and not self._in_host_pid_namespace():
                why = NOT_HOST_PID_NAMESPACE
            if why is not None:
                outcomes.append(self._outcome(identity, "skipped_unsupported", why))
            else:
                candidates.append((identity, sample))
        busy = {i.uuid: why for i, s in fresh if (why := self._busy(s)) is not None}
        node_busy = [f"GPU {i.index}: {busy[i.uuid]}" for i, _ in fresh if i.uuid in busy]
        to_run: list[tuple[GpuIdentity, GpuSample, bool]] = []
        for identity, sample in candidates:
            if explicit:
                to_run.append((identity, sample, identity.uuid in busy))
            elif identity.uuid in busy:
                outcomes.append(self._outcome(identity, "skipped_busy", busy[identity.uuid]))
            elif (held := held_down(sample)) is not None:  # this GPU only: its peers are still worth probing
                outcomes.append(self._outcome(identity, "skipped_busy", held))
            elif self.settings.require_idle_node and node_busy:
                outcomes.append(
                    self._outcome(identity, "skipped_busy", "the node is busy (" + "; ".join(node_busy) + ")")
                )
            else:
                to_run.append((identity, sample, False))
        outcomes.extend(self._run_locked(to_run, baseline_mode, wait))
        for result in outcomes:
            self._store.probe.record(result)
        return sorted(outcomes, key=lambda o: o.index)

    def load_baselines(self) -> None:
        """Export the persisted baselines now (agent start), not only from the first probe round an interval later."""
        try:
            self._refresh_baselines()
        except Exception:
            log.exception("cannot load the probe baselines; they are exported after the first probe round")

    # --- policy ---------------------------------------------------------------------------------------------

    def _in_host_pid_namespace(self) -> bool:
        """False inside a PID namespace of its own, where NSpid cannot match NVML's host PIDs (logged once)."""
        inode = self._launcher.pid_namespace_inode()
        if inode is None or inode == PROC_PID_INIT_INO:  # unknown (no /proc/self/ns): assume the host's
            return True
        self._namespace.fail("probe disabled: %s", NOT_HOST_PID_NAMESPACE)
        return False

    def _busy(self, sample: GpuSample) -> str | None:
        if sample.process_pids:
            return f"{len(sample.process_pids)} compute process(es)"
        util = sample.utilization_ratio
        if util is not None and util > self.settings.idle_utilization_ratio:
            return f"utilization {util:.0%}"
        return None

    def _refresh_baselines(self) -> dict[str, Baseline]:
        baselines = self.baselines.load()
        for uuid, baseline in baselines.items():
            self._store.probe.set_baseline(uuid, baseline.key.dtype, baseline.flops, _previous(baseline))
        return baselines

    def _outcome(self, identity: GpuIdentity, result: ProbeResult, reason: str = "") -> ProbeOutcome:
        return outcome(identity, result, reason, self._clock)

    # --- running ----------------------------------------------------------------------------------------------

    def _run_locked(
        self, to_run: list[tuple[GpuIdentity, GpuSample, bool]], mode: Mode, wait: bool
    ) -> list[ProbeOutcome]:
        """Take each GPU's lock (in UUID order: two runners never deadlock), run those taken, release them all."""
        outcomes: list[ProbeOutcome] = []
        held: list[int] = []
        runnable: list[tuple[GpuIdentity, GpuSample, bool]] = []
        try:
            for identity, sample, explicit_busy in sorted(to_run, key=lambda t: t[0].uuid):
                try:
                    fd = try_lock(self._state_dir, identity.uuid, wait=False)
                except LockNoRoom as exc:  # a full state dir: skipped, said once, as the rest of the state is kept
                    self._no_room.fail("probe rounds skip their GPUs: %s", exc)
                    outcomes.append(self._outcome(identity, "skipped_busy", str(exc)))
                    continue
                self._no_room.recover("probe locks can be made again: probe rounds run again")
                if fd is None and wait:
                    self._say(f"GPU {identity.index}: waiting for the probe already running on it")
                    fd = try_lock(self._state_dir, identity.uuid, wait=True)
                if fd is None:
                    outcomes.append(self._outcome(identity, "skipped_busy", "another probe holds this GPU's lock"))
                    continue
                held.append(fd)
                runnable.append((identity, sample, explicit_busy))
            if runnable:
                runnable.sort(key=lambda t: t[0].index)
                self._say("probing GPU " + ", ".join(str(i.index) for i, _, _ in runnable))
                settings = self.settings
                children = self.workers.run_round(settings, runnable)
                samples = {i.uuid: s for i, s, _ in runnable}
                outcomes += [self._conclusions.conclude(settings, c, samples[c.identity.uuid], mode) for c in children]
        finally:
            for fd in held:
                unlock(fd)
        return outcomes

    def _say(self, text: str) -> None:
        if self._progress is not None:
            self._progress(text)
