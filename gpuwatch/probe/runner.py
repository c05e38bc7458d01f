"""The probe policy: when to probe, on which GPUs, and what to make of what the worker reports.

By default the probe runs only when every GPU of the node is idle (no compute processes, low utilization), then on
all of them at once (one child each, so peers share thermal state). MIG, exclusive or prohibited compute mode and a
missing engine are skipped_unsupported; a busy node is skipped_busy; a result is discarded (skipped_busy) when a
process other than our own children appeared on the GPU while it ran — NVML reports host PIDs, so our children are
recognised by every PID of their ``/proc/<pid>/status`` NSpid line — which only holds the host PID in the host's PID
namespace, so in a container without it every probe is skipped_unsupported with that reason. Each child runs in its
own process group and is SIGKILLed with it at the timeout. While the children run, the runner reads the store's
fresh samples: it tells a worker when its GPU reached the power limit (so warm-up ends at steady state) and keeps
the mean SM clock, mean power and peak core temperature. A per-GPU lock file keeps a CLI probe and the agent's apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from gpuwatch.config import ProbeSection
from gpuwatch.model import GpuIdentity, GpuSample
from gpuwatch.probe.baseline import Baseline, BaselineKey, Baselines, Mode
from gpuwatch.probe.children import (
    PID_NAMESPACE_PATH,
    PROC_PID_INIT_INO,
    WORKER_CWD,
    _Child,
    _drain,
    _failure,
    _kill_group,
    _last_json,
    _pids_of,
    _rss,
    pid_namespace_inode,
    worker_argv,
)
from gpuwatch.probe.locks import try_lock, unlock
from gpuwatch.probe.protocol import CAPPED_LINE, EXIT_NO_ENGINE
from gpuwatch.probe.readings import (
    SpeedLog,
    _at_power_cap,
    _power_observable,
    _previous,
    _telemetry,
    _unsupported,
    held_down,
)
from gpuwatch.probebook import ProbeOutcome, WorkerResult
from gpuwatch.store import SampleStore

log = logging.getLogger(__name__)

WATCH_INTERVAL_SECONDS = 0.05
# A worker whose resident host memory passes this is killed (a runaway must not push the node into the OOM killer).
# RSS, not RLIMIT_AS: CUDA and ROCm reserve terabytes of virtual address space, which an address-space limit breaks.
WORKER_MEMORY_LIMIT_BYTES = 16 * 2**30
NOT_HOST_PID_NAMESPACE = (
    "the agent runs in its own PID namespace (a container without hostPID): NVML reports host PIDs that this "
    "/proc cannot map to the probe's children, so every probe would look busy; run it with the host PID namespace "
    "(Kubernetes: hostPID: true; docker: --pid=host)"
)


def _available_engines() -> list[str]:
    """The engines installed; probe/engines.py is imported only when asked, so the agent holds no engine code."""
    from gpuwatch.probe.engines import available_engines

    return available_engines()


class ProbeRunner:
    """Runs probes for the agent (scheduled) and for `gpuwatch probe`; results go to the store and the baselines."""

    def __init__(
        self,
        settings: ProbeSection,
        store: SampleStore,
        state_dir: Path,
        *,
        simulated_slowdown: Mapping[int, float] | None = None,
        worker_command: Sequence[str] | None = None,
        clock: Callable[[], float] = time.time,
        progress: Callable[[str], None] | None = None,
        engines: Callable[[], list[str]] | None = None,  # default: the engines installed (probe/engines.py)
        pid_namespace_inode: Callable[[], int | None] = lambda: pid_namespace_inode(PID_NAMESPACE_PATH),
        memory_limit_bytes: int = WORKER_MEMORY_LIMIT_BYTES,
    ) -> None:
        self.settings = settings
        self._memory_limit_bytes = memory_limit_bytes
        self._store = store
        self._state_dir = state_dir
        self._simulated = simulated_slowdown
        self._command = list(worker_command) if worker_command is not None else worker_argv()
        self._clock = clock
        self._progress = progress
        self._engines = engines or _available_engines
        self._pid_namespace_inode = pid_namespace_inode
        self._namespace_logged = False
        self._fallbacks_logged: set[str] = set()  # an engine fallback is logged once, then only noted per result
        self.baselines = Baselines(state_dir)
        self._children: list[_Child] = []
        self._children_lock = threading.Lock()
        self._stopping = threading.Event()
        self._stuck: list[_Child] = []  # children that survived SIGKILL, reaped with poll() in later rounds
        self._speed = SpeedLog()  # a slow GPU warned once, until it recovers

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
        snap = self._store.snapshot()
        stuck = self._reap_stuck()
        baselines = self._refresh_baselines()
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
            if why is None and self._simulated is None and not self._engines():
                why = "no probe engine installed: pip install 'gpuwatch[probe]' (CuPy) or PyTorch beside gpuwatch"
            if why is None and self._simulated is None and not self._in_host_pid_namespace():
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
        outcomes.extend(self._run_locked(to_run, baselines, baseline_mode, wait_for_locks))
        for outcome in outcomes:
            self._store.probe.record(outcome)
        return sorted(outcomes, key=lambda o: o.index)

    def stop(self) -> None:
        """Kill every running child (the agent is stopping)."""
        self._stopping.set()
        with self._children_lock:
            for child in self._children:
                _kill_group(child.proc)

    # --- policy ---------------------------------------------------------------------------------------------

    def _in_host_pid_namespace(self) -> bool:
        """False inside a PID namespace of its own, where NSpid cannot match NVML's host PIDs (logged once)."""
        inode = self._pid_namespace_inode()
        if inode is None or inode == PROC_PID_INIT_INO:  # unknown (no /proc/self/ns): assume the host's
            return True
        if not self._namespace_logged:
            log.warning("probe disabled: %s", NOT_HOST_PID_NAMESPACE)
            self._namespace_logged = True
        return False

    def _reap_stuck(self) -> dict[str, int]:
        """Reap the children that survived SIGKILL in an earlier round; the UUIDs of those still alive, with PIDs."""
        alive: list[_Child] = []
        for child in self._stuck:
            if child.proc.poll() is None:
                alive.append(child)
            else:
                log.warning(
                    "the probe worker of GPU %d (PID %d) that survived SIGKILL has exited (status %s)",
                    child.identity.index,
                    child.proc.pid,
                    child.proc.returncode,
                )
        self._stuck = alive
        return {c.identity.uuid: c.proc.pid for c in alive}

    def _busy(self, sample: GpuSample) -> str | None:
        if sample.process_pids:
            return f"{len(sample.process_pids)} compute process(es)"
        util = sample.utilization_ratio
        if util is not None and util > self.settings.idle_utilization_ratio:
            return f"utilization {util:.0%}"
        return None

    def load_baselines(self) -> None:
        """Export the persisted baselines now (agent start), not only from the first probe round an interval later."""
        try:
            self._refresh_baselines()
        except Exception:
            log.exception("cannot load the probe baselines; they are exported after the first probe round")

    def _refresh_baselines(self) -> dict[str, Baseline]:
        baselines = self.baselines.load()
        for uuid, baseline in baselines.items():
            self._store.probe.set_baseline(uuid, baseline.key.dtype, baseline.flops, _previous(baseline))
        return baselines

    def _outcome(self, identity: GpuIdentity, result: str, reason: str = "", **kw: object) -> ProbeOutcome:
        if result not in ("ok",):
            log.debug("probe on GPU %d: %s (%s)", identity.index, result, reason)
        return ProbeOutcome(identity.uuid, identity.index, result, reason, timestamp=self._clock(), **kw)  # type: ignore[arg-type]

    # --- running ----------------------------------------------------------------------------------------------

    def _run_locked(
        self,
        to_run: list[tuple[GpuIdentity, GpuSample, bool]],
        baselines: dict[str, Baseline],
        mode: Mode,
        wait: bool,
    ) -> list[ProbeOutcome]:
        outcomes: list[ProbeOutcome] = []
        held: list[int] = []
        runnable: list[tuple[GpuIdentity, GpuSample, bool]] = []
        try:
            for identity, sample, explicit_busy in sorted(to_run, key=lambda t: t[0].uuid):  # UUID order: no deadlock
                fd = try_lock(self._state_dir, identity.uuid, wait=False)
                if fd is None and wait:
                    self._say(f"GPU {identity.index}: waiting for the probe already running on it")
                    fd = try_lock(self._state_dir, identity.uuid, wait=True)
                if fd is None:
                    outcomes.append(self._outcome(identity, "skipped_busy", "another probe holds this GPU's lock"))
                    continue
                held.append(fd)
                runnable.append((identity, sample, explicit_busy))
            if runnable:
                outcomes.extend(self._run_children(sorted(runnable, key=lambda t: t[0].index), baselines, mode))
        finally:
            for fd in held:
                unlock(fd)
        return outcomes

    def _run_children(
        self,
        runnable: list[tuple[GpuIdentity, GpuSample, bool]],
        baselines: dict[str, Baseline],
        mode: Mode,
    ) -> list[ProbeOutcome]:
        self._say("probing GPU " + ", ".join(str(i.index) for i, _, _ in runnable))
        started = time.monotonic()
        children = [self._spawn(identity, sample, busy, baselines) for identity, sample, busy in runnable]
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
        samples_by_uuid = {i.uuid: s for i, s, _ in runnable}
        return [self._conclude(child, samples_by_uuid[child.identity.uuid], mode) for child in children]

    def _spawn(self, identity: GpuIdentity, sample: GpuSample, busy: bool, baselines: dict[str, Baseline]) -> _Child:
        s = self.settings
        argv = [
            *self._command,
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
        power_signal = self._simulated is None and _power_observable(sample)
        if power_signal:
            argv.append("--power-signal")
        if self._simulated is not None:
            # A simulated GPU computes healthy until its baseline is learned, then shows its scenario's slowdown,
            # as a real GPU degrades after its baseline was taken.
            known = baselines.get(identity.uuid)
            slowdown = self._simulated.get(identity.index, 0.0) if known is not None and known.flops else 0.0
            argv += [
                "--simulate",
                "--slowdown",
                str(slowdown),
                "--seed",
                str(int(self._clock() * 1000) + identity.index),
            ]
        env = dict(os.environ)
        for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
            env.pop(name, None)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        # ROCr takes an index or GPU-<unique id>, not amdsmi's UUID: the backend's token (an AMD GPU without one gets
        # its UUID, which ROCr matches to no GPU: the worker fails rather than probe another GPU).
        pin = sample.runtime_device or identity.uuid
        env["ROCR_VISIBLE_DEVICES" if identity.vendor == "amd" else "CUDA_VISIBLE_DEVICES"] = pin
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=WORKER_CWD,
            start_new_session=True,  # its own process group: the timeout kills everything it started
        )
        child = _Child(
            identity=identity,
            proc=proc,
            started_wall=self._clock(),
            deadline=time.monotonic() + s.timeout_seconds,
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
        """Until every child ended: signal power caps, collect telemetry, spot foreign processes, enforce timeouts."""
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
                if child.proc.poll() is not None:
                    child.ended = now
                elif (rss := _rss(child.proc.pid)) > self._memory_limit_bytes:
                    child.memory_exceeded = rss
                    _kill_group(child.proc)
                    if child.proc.poll() is None:  # reaped in a later round, as a timed-out one stuck in the driver
                        child.unkillable = True
                        self._stuck.append(child)
                    child.ended = now
                elif now >= child.deadline or self._stopping.is_set():
                    child.timed_out = not self._stopping.is_set()
                    _kill_group(child.proc)  # waits a bounded time: a worker stuck in the driver may not die
                    if child.proc.poll() is None:
                        child.unkillable = True
                        self._stuck.append(child)
                        log.error(
                            "the probe worker of GPU %d (PID %d) could not be killed (stuck in the driver?); "
                            "its lock is released and it is reaped when it exits",
                            child.identity.index,
                            child.proc.pid,
                        )
                    child.ended = now
            if self._progress is not None and now - last_said >= 1.0:
                last_said = now
                waiting = ", ".join(str(c.identity.index) for c in children if c.ended is None)
                if waiting:
                    self._say(f"  … {now - started:.0f} s (GPU {waiting})")
            time.sleep(WATCH_INTERVAL_SECONDS)

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

    def _conclude(self, child: _Child, sample: GpuSample, mode: Mode) -> ProbeOutcome:
        with contextlib.suppress(OSError):
            if child.proc.stdin is not None:
                child.proc.stdin.close()
        identity = child.identity
        if child.memory_exceeded:
            used, limit = child.memory_exceeded / 2**20, self._memory_limit_bytes / 2**20
            why = f"used {used:.0f} MiB of host memory, over the {limit:.0f} MiB limit; killed"
            log.warning("probe on GPU %d failed: %s", identity.index, why)
            return self._outcome(identity, "failed", why)
        if child.timed_out:
            killed = "could not be killed (stuck in the driver?)" if child.unkillable else "killed"
            return self._outcome(identity, "timeout", f"no result within {self.settings.timeout_seconds:g} s; {killed}")
        for reader in child.readers:
            reader.join(timeout=2.0)
        wall = (child.ended or time.monotonic()) - (child.deadline - self.settings.timeout_seconds)
        stderr = b"".join(child.stderr).decode(errors="replace").strip()
        if self._stopping.is_set():
            return self._outcome(identity, "failed", "the agent stopped while the probe ran")
        doc = _last_json(b"".join(child.stdout))
        code = child.proc.returncode
        if code == EXIT_NO_ENGINE and doc is not None and doc.get("error") == "no_engine":  # the worker's own answer
            return self._outcome(identity, "skipped_unsupported", str((doc or {}).get("message", "no probe engine")))
        if code != 0 or doc is None or not doc.get("ok"):
            why = _failure(code, doc, stderr)
            log.warning("probe on GPU %d failed: %s", identity.index, why)
            return self._outcome(identity, "failed", why)
        try:
            measured = WorkerResult.from_json(doc)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("probe on GPU %d returned a malformed result: %s", identity.index, exc)
            return self._outcome(identity, "failed", f"malformed worker result: {exc}")
        if child.foreign_pids:
            pids = ", ".join(str(p) for p in sorted(child.foreign_pids))
            return self._outcome(identity, "skipped_busy", f"result discarded: process {pids} appeared meanwhile")
        telemetry = _telemetry(list(child.seen.values()))
        key = BaselineKey(
            dtype=measured.dtype,
            shape=measured.shape,
            engine=measured.engine,
            engine_version=measured.engine_version,
            blas_version=measured.blas_version,
            driver_version=identity.driver_version,
            power_limit_watts=sample.power_limit_watts.get("enforced"),
        )
        steady = measured.power_capped is not False and not child.explicit_busy
        uncapped = measured.power_capped is False and not child.explicit_busy  # never reached the power limit
        baseline, note = self.baselines.observe(
            identity.uuid,
            key,
            measured.flops_median,
            steady=steady,
            mode=mode,
            timestamp=self._clock(),
            uncapped=uncapped,
        )
        same = baseline is not None and baseline.key in (key, dataclasses.replace(key, uncapped=True))
        flops = baseline.flops if baseline is not None and same else None
        self._store.probe.set_baseline(identity.uuid, key.dtype, flops, _previous(baseline) if same else None)
        if note:
            log.info("probe on GPU %d: %s", identity.index, note)
        if flops and not child.explicit_busy:
            self._speed.judge(identity.index, identity.uuid, measured.flops_median / flops)
        passed_over = doc.get("engines_passed_over")
        fallback = "; ".join(str(p) for p in passed_over) if isinstance(passed_over, list) else ""
        if fallback:
            note = f"ran on {measured.engine}, passed over {fallback}" + (f"; {note}" if note else "")
            if fallback not in self._fallbacks_logged:
                self._fallbacks_logged.add(fallback)
                log.warning("probe on GPU %d ran on %s, passed over %s", identity.index, measured.engine, fallback)
        if child.explicit_busy:
            note = "the GPU was busy: not comparable with its baseline" + (f"; {note}" if note else "")
        return self._outcome(
            identity,
            "ok",
            note,
            measured=measured,
            telemetry=telemetry,
            wall_seconds=wall,
            baseline_flops=flops,
            baseline_note=note,
        )

    def _say(self, text: str) -> None:
        if self._progress is not None:
            self._progress(text)


# --- helpers -----------------------------------------------------------------------------------------------------
