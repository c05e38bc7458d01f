"""`gpuwatch diag`'s runner: deep tests on idle GPUs, each GPU's in a child process pinned to it as the probe worker
is, under deadlines the runner enforces (a child past its test's deadline is killed with its process group).

Per GPU, one child (gpuwatch/probe/diag_worker.py, or the launcher's) runs the level's tests in turn and says when
each starts; the runner gives the child `start` seconds to import its engine, then each test its own deadline, and
the GPU as a whole the level's budget (level 1: 30 s). A child killed in a test fails that test, and a new child runs
the tests left while the budget allows. While the sustained matmul runs, the runner keeps the vendor library's
readings of the GPU (SM clock, power, temperature, throttle reasons): the throttling the probe's one second cannot
see. The child measures; this module judges (HBM mismatches, bandwidth against the link's nominal, throughput
against the GPU's peers and its probe baseline, thermal or power-brake throttling).

Node-wide tests: the all-reduce (PyTorch with NCCL or RCCL and two GPUs or more), p2p copies, `dcgmi diag` where
DCGM is installed and `rvs` where RVS is (gpuwatch/probe/diag_node.py); each is "skip" with its reason where it
cannot run. It takes the probe's per-GPU locks (gpuwatch/probe/locks.py) so it never overlaps the agent's probe, and
refuses a busy GPU (the probe's idle rule) unless forced.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwatch.core.model import GpuIdentity, GpuSample
from gpuwatch.probe.baseline import Baselines
from gpuwatch.probe.children import _kill_group
from gpuwatch.probe.diag_launch import DiagLauncher
from gpuwatch.probe.diag_results import GpuRecord, Result, TestRecord
from gpuwatch.probe.launch import WORKER_CWD
from gpuwatch.probe.locks import try_lock, unlock
from gpuwatch.probe.supervisor import worker_environment
from gpuwatch.state.store import SampleStore

log = logging.getLogger(__name__)

GPU_TESTS = ("hbm", "pcie", "sustained")
WATCH_SECONDS = 0.05
LOCK_WAIT_SECONDS = 30.0  # the agent's probe holds a GPU for a few seconds at most
# What a healthy link moves of its nominal: an H100 on PCIe gen 5 x16 copies 52-54 GB/s pinned of 63 GB/s (~84 %),
# a gen 4 x16 link ~25 of 31.5 (~80 %). Below 70 % something is wrong with the link (a link trained at half its
# width moves under 45 % of its nominal).
BANDWIDTH_SHARE_MIN = 0.70
THROUGHPUT_SHARE_MIN = 0.90  # of the peers' median or the GPU's own probe baseline
# Throttle reasons that say the GPU is held down by something wrong around it, not by its power cap.
BAD_THROTTLE = ("sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake")
# GB/s per lane of each PCIe generation after line coding (8b/10b to gen 2, 128b/130b from gen 3).
PCIE_LANE_BYTES_PER_SECOND = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}


@dataclass(frozen=True, slots=True)
class LevelPlan:
    """One level: how much memory the pattern test covers, how long the matmul runs, each phase's deadline and the
    GPU's whole budget (seconds)."""

    fraction: float
    sustained_seconds: float
    deadlines: dict[str, float]
    budget: float


LEVELS: dict[int, LevelPlan] = {
    1: LevelPlan(0.25, 3.0, {"start": 12.0, "hbm": 8.0, "pcie": 4.0, "sustained": 8.0}, 30.0),
    2: LevelPlan(0.5, 30.0, {"start": 20.0, "hbm": 60.0, "pcie": 10.0, "sustained": 45.0}, 150.0),
    3: LevelPlan(0.9, 120.0, {"start": 20.0, "hbm": 600.0, "pcie": 20.0, "sustained": 150.0}, 900.0),
}


@dataclass(slots=True)
class TestOutcome:
    name: str
    result: Result
    detail: str
    seconds: float
    values: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "result": self.result, "detail": self.detail, "seconds": round(self.seconds, 3)}


@dataclass(slots=True)
class GpuDiag:
    identity: GpuIdentity
    tests: list[TestOutcome] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"index": self.identity.index, "uuid": self.identity.uuid, "tests": [t.as_json() for t in self.tests]}

    def record(self, level: int, at: float) -> GpuRecord:
        tests = {t.name: TestRecord(t.name, t.result, t.detail, t.seconds, at, level) for t in self.tests}
        return GpuRecord(self.identity.uuid, self.identity.index, tests)


class DiagRefused(Exception):
    """The diag cannot run: a busy GPU without --force, a lock held too long."""


class NoSuchGpu(DiagRefused):
    """--gpu names a GPU the node does not have (bad usage)."""


@dataclass(slots=True)
class _Running:
    """One GPU's child now: the tests it has still to run, the one it runs, its deadlines and what it said."""

    identity: GpuIdentity
    sample: GpuSample
    pending: list[str]
    gpu_started: float
    proc: subprocess.Popen[bytes] | None = None
    lines: queue.Queue[bytes | None] = field(default_factory=queue.Queue)
    current: str | None = None
    current_started: float = 0.0
    deadline: float = 0.0
    stderr: list[bytes] = field(default_factory=list)
    hello: dict[str, Any] = field(default_factory=dict)
    telemetry: list[GpuSample] = field(default_factory=list)
    seen: set[float] = field(default_factory=set)
    sustained: list[GpuSample] = field(default_factory=list)  # the readings of its sustained run, kept to judge it
    latest: GpuSample | None = None  # the last reading taken while its child ran (the link as trained under load)
    done: bool = False


def busy_reason(
    sample: GpuSample, idle_utilization_ratio: float, describe: Callable[[int], str] = lambda pid: f"PID {pid}"
) -> str | None:
    """Why a GPU is not idle (the probe's rule: compute processes, or utilization above the idle share), naming the
    processes that hold it (`describe`: a PID's workload and user, from the node's procfs); None when idle."""
    if sample.process_pids:
        return "held by " + ", ".join(describe(pid) for pid in sample.process_pids)
    util = sample.utilization_ratio
    if util is not None and util > idle_utilization_ratio:
        return f"utilization {util:.0%}"
    return None


def nominal_bytes_per_second(sample: GpuSample) -> tuple[float | None, str]:
    """The link's nominal bandwidth per direction from its maximum generation and width, and how it was read."""
    gen = sample.pcie_link_generation.get("max")
    width = sample.pcie_link_width.get("max")
    if not gen or not width or gen not in PCIE_LANE_BYTES_PER_SECOND:
        return None, "no PCIe link maximum read"
    return PCIE_LANE_BYTES_PER_SECOND[gen] * width, f"gen {gen} x{width}"


class DiagRunner:
    """Runs the level's tests on the chosen GPUs of a polled node (the store is kept fresh by the caller)."""

    def __init__(
        self,
        store: SampleStore,
        state_dir: Path,
        launcher: DiagLauncher,
        *,
        level: int,
        idle_utilization_ratio: float = 0.10,
        progress: Callable[[str], None] | None = None,
        plan: LevelPlan | None = None,
        node_tests: Callable[[list[tuple[GpuIdentity, GpuSample]], dict[str, Any], int], dict[str, list[TestOutcome]]]
        | None = None,
        describe: Callable[[int], str] = lambda pid: f"PID {pid}",
    ) -> None:
        self._describe = describe
        self._store = store
        self._state_dir = state_dir
        self._launcher = launcher
        self.level = level
        self.plan = plan or LEVELS[level]
        self._idle = idle_utilization_ratio
        self._progress = progress
        self._node_tests = node_tests
        # (model, enforced power limit) -> uuid -> sustained median, once all ran: a GPU is held to its peers at the
        # same power limit (a lower limit is a setting that its own finding reports, not a faulty GPU)
        self._peer_medians: dict[tuple[str, float | None], dict[str, float]] = {}
        self._hellos: dict[str, dict[str, Any]] = {}  # uuid -> its child's hello (engine, NCCL)

    def choose(self, gpus: Collection[int], *, force: bool) -> list[tuple[GpuIdentity, GpuSample]]:
        """The GPUs to test (all the node's when none named); DiagRefused for one that is not there or busy."""
        snap = self._store.snapshot()
        fresh = sorted(
            ((snap.identities[u], s) for u in snap.identities if (s := snap.fresh(u)) is not None),
            key=lambda pair: pair[0].index,
        )
        known = [i.index for i, _ in fresh]
        unknown = sorted(set(gpus) - set(known))
        if unknown:
            raise NoSuchGpu(f"no GPU {unknown} on this node (GPUs: {known})")
        chosen = [(i, s) for i, s in fresh if not gpus or i.index in gpus]
        busy = [(i, why) for i, s in chosen if (why := busy_reason(s, self._idle, self._describe)) is not None]
        if busy and not force:
            said = "; ".join(f"GPU {i.index} is busy: {why}" for i, why in busy)
            raise DiagRefused(f"{said}; run it on an idle GPU or a drained node, or pass --force")
        for identity, why in busy:
            self._say(f"GPU {identity.index} is busy ({why}): testing it anyway (--force)")
        return chosen

    def run(self, chosen: list[tuple[GpuIdentity, GpuSample]], *, tests: Iterable[str] = GPU_TESTS) -> list[GpuDiag]:
        """Take the GPUs' probe locks, run every GPU's tests at once, then the node's; one GpuDiag per GPU."""
        held: list[int] = []
        try:
            for identity, _ in sorted(chosen, key=lambda pair: pair[0].uuid):
                held.append(self._lock(identity))
            diags = self._run_children(chosen, list(tests))
            if self._node_tests is not None:
                hello = next(iter(self._hellos.values()), {})
                node = self._node_tests(chosen, hello, self.level)
                for diag in diags:
                    diag.tests.extend(node.get(diag.identity.uuid, []))
            return diags
        finally:
            for fd in held:
                unlock(fd)

    def _lock(self, identity: GpuIdentity) -> int:
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        said = False
        while (fd := try_lock(self._state_dir, identity.uuid, wait=False)) is None:
            if time.monotonic() >= deadline:
                raise DiagRefused(
                    f"GPU {identity.index}: the probe lock stayed held for {LOCK_WAIT_SECONDS:g} s (a probe stuck?)"
                )
            if not said:
                self._say(f"GPU {identity.index}: waiting for the probe running on it")
                said = True
            time.sleep(0.1)
        return fd

    # --- the children --------------------------------------------------------------------------------------------

    def _run_children(self, chosen: list[tuple[GpuIdentity, GpuSample]], tests: list[str]) -> list[GpuDiag]:
        started = time.monotonic()
        diags = {i.uuid: GpuDiag(i) for i, _ in chosen}
        running = [_Running(i, s, list(tests), started) for i, s in chosen]
        self._say(f"diag level {self.level} on GPU " + ", ".join(str(i.index) for i, _ in chosen))
        for r in running:
            self._spawn(r)
        last_said = started
        try:
            while any(not r.done for r in running):
                now = time.monotonic()
                snap = self._store.snapshot()
                for r in running:
                    if not r.done:
                        self._step(r, diags[r.identity.uuid], snap.fresh(r.identity.uuid), now)
                if now - last_said >= 2.0:
                    last_said = now
                    said = [f"GPU {r.identity.index}: {r.current or 'starting'}" for r in running if not r.done]
                    self._say(f"  … {now - started:.0f} s ({'; '.join(said)})")
                time.sleep(WATCH_SECONDS)
        finally:
            for r in running:
                if r.proc is not None:
                    _kill_group(r.proc)
        self._rejudge_sustained(running, diags)
        return [diags[i.uuid] for i, _ in chosen]

    def _rejudge_sustained(self, running: list[_Running], diags: dict[str, GpuDiag]) -> None:
        """Judge each sustained run now that every GPU's is known: against its peers of the same model."""
        medians: dict[tuple[str, float | None], dict[str, float]] = {}
        for r in running:
            for t in diags[r.identity.uuid].tests:
                if t.name == "sustained" and t.values.get("flops_per_window"):
                    per_model = medians.setdefault(_peer_key(r), {})
                    per_model[r.identity.uuid] = statistics.median(float(w) for w in t.values["flops_per_window"])
        self._peer_medians = medians
        for r in running:
            tests = diags[r.identity.uuid].tests
            for n, t in enumerate(tests):
                if t.name == "sustained" and t.values.get("flops_per_window"):
                    r.telemetry = r.sustained
                    result, detail = self._judge_sustained(r, t.values)
                    tests[n] = TestOutcome(t.name, result, detail, t.seconds, t.values)

    def _spawn(self, r: _Running) -> None:
        plan = self.plan
        argv = [
            *self._launcher.command(r.identity),
            "--uuid", r.identity.uuid,
            "--tests", ",".join(r.pending),
            "--level", str(self.level),
            "--fraction", str(plan.fraction),
            "--seconds", str(plan.sustained_seconds),
            "--seed", str(int(time.time())),
            *self._launcher.extra_arguments,
        ]  # fmt: skip
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=worker_environment(r.identity, r.sample),
            cwd=WORKER_CWD,
            start_new_session=True,  # its own process group: a deadline kills everything it started
        )
        r.proc, r.lines, r.stderr, r.current = proc, queue.Queue(), [], None
        r.deadline = time.monotonic() + plan.deadlines["start"]
        threading.Thread(target=_read_lines, args=(proc.stdout, r.lines), daemon=True, name="diag-out").start()
        threading.Thread(target=_read_all, args=(proc.stderr, r.stderr), daemon=True, name="diag-err").start()

    def _step(self, r: _Running, diag: GpuDiag, sample: GpuSample | None, now: float) -> None:
        """Take what the child said, keep the telemetry of a sustained run, enforce the deadlines."""
        assert r.proc is not None
        while True:
            try:
                line = r.lines.get_nowait()
            except queue.Empty:
                break
            if line is None:  # stdout closed: the child exited (or is about to)
                self._ended(r, diag, now)
                return
            self._event(r, diag, line, now)
        if sample is not None and r.proc.poll() is None:
            r.latest = sample
        if r.current == "sustained" and sample is not None and sample.timestamp not in r.seen:
            r.seen.add(sample.timestamp)
            r.telemetry.append(sample)
        budget_left = r.gpu_started + self.plan.budget - now
        if now >= r.deadline or budget_left <= 0:
            what = r.current or "start"
            limit = self.plan.deadlines.get(what, 0.0) if now >= r.deadline else self.plan.budget
            scope = f"its {limit:g} s deadline" if now >= r.deadline else f"the GPU's {self.plan.budget:g} s budget"
            _kill_group(r.proc)
            stuck = "" if r.proc.poll() is not None else " (it did not die: stuck in the driver?)"
            if r.current is not None:
                diag.tests.append(
                    TestOutcome(
                        r.current,
                        "fail",
                        f"did not finish within {scope}: the child was killed{stuck}",
                        now - r.current_started,
                    )
                )
                r.pending.remove(r.current)
            else:
                first = r.pending.pop(0)
                diag.tests.append(
                    TestOutcome(first, "fail", f"the diag child did not start within {scope}{stuck}", 0.0)
                )
            self._respawn_or_end(r, diag, now)

    def _event(self, r: _Running, diag: GpuDiag, line: bytes, now: float) -> None:
        try:
            doc = json.loads(line)
        except ValueError:
            return
        if not isinstance(doc, dict):
            return
        event = doc.get("event")
        if event == "hello":
            self._hellos[r.identity.uuid] = doc
        elif event == "start" and doc.get("test") in r.pending:
            r.current, r.current_started = str(doc["test"]), now
            r.deadline = now + self.plan.deadlines.get(r.current, self.plan.budget)
            r.telemetry, r.seen = [], set()
        elif event == "result" and doc.get("test") in r.pending:
            name = str(doc["test"])
            if name == "sustained":
                r.sustained = list(r.telemetry)
            seconds = now - r.current_started if r.current == name else 0.0
            diag.tests.append(self._judge(r, name, doc, seconds))
            r.pending.remove(name)
            r.current = None
            r.deadline = now + self.plan.deadlines["start"]  # until the next test says it started

    def _ended(self, r: _Running, diag: GpuDiag, now: float) -> None:
        assert r.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            r.proc.wait(timeout=5.0)
        code = r.proc.returncode
        if r.pending:
            tail = b"".join(r.stderr).decode(errors="replace").strip()[-300:]
            name = r.current or r.pending[0]
            diag.tests.append(
                TestOutcome(
                    name,
                    "fail",
                    f"the diag child exited with status {code} in this test: {tail or 'no output'}",
                    now - r.current_started if r.current else 0.0,
                )
            )
            r.pending.remove(name)
            self._respawn_or_end(r, diag, now)
        else:
            r.done = True

    def _respawn_or_end(self, r: _Running, diag: GpuDiag, now: float) -> None:
        """Run the tests left in a new child while the GPU's budget allows; the rest are skipped, saying why."""
        left = r.gpu_started + self.plan.budget - now
        if r.pending and left >= self.plan.deadlines["start"] + min(self.plan.deadlines[t] for t in r.pending):
            self._spawn(r)
            return
        for name in r.pending:
            diag.tests.append(TestOutcome(name, "skip", "not run: the GPU's time budget was spent", 0.0))
        r.pending = []
        r.done = True

    # --- judging -------------------------------------------------------------------------------------------------

    def _judge(self, r: _Running, name: str, doc: dict[str, Any], seconds: float) -> TestOutcome:
        if "skip" in doc:
            return TestOutcome(name, "skip", str(doc["skip"]), seconds)
        if "error" in doc:
            return TestOutcome(name, "fail", f"the test raised {doc['error']}", seconds)
        values = doc.get("values")
        if not isinstance(values, dict):
            return TestOutcome(name, "fail", "the diag child answered without values", seconds)
        judge = {"hbm": _judge_hbm, "pcie": _judge_pcie, "sustained": self._judge_sustained}.get(name)
        if judge is None:
            return TestOutcome(name, "fail", f"unknown test {name!r}", seconds)
        try:
            result, detail = judge(r, values)
        except (TypeError, ValueError, KeyError) as exc:
            result, detail = "fail", f"the diag child's values are unreadable ({exc})"
        return TestOutcome(name, result, detail, seconds, values)

    def _judge_sustained(self, r: _Running, values: dict[str, Any]) -> tuple[Result, str]:
        windows = [float(w) for w in values["flops_per_window"]]
        if not windows:
            return "fail", "no matmul window completed"
        median = statistics.median(windows)
        note = f"{median / 1e12:.1f} TFLOP/s {values.get('dtype', '')} {values.get('shape', '')}".rstrip()
        problems: list[str] = []
        reference, what = self._reference(r, values)
        if reference is not None and median < THROUGHPUT_SHARE_MIN * reference:
            problems.append(f"{median / reference:.0%} of {what} ({reference / 1e12:.1f} TFLOP/s)")
        elif reference is not None:
            note += f", {median / reference:.0%} of {what}"
        else:
            note += ", nothing to compare with (no peer of its model and power limit here, no probe baseline)"
        tele = r.telemetry
        throttled = sorted({k for s in tele for k, v in s.throttle_active.items() if v and k in BAD_THROTTLE})
        if throttled:
            problems.append("throttled by " + ", ".join(throttled))
        note += _telemetry_note(tele)
        if problems:
            return "fail", "; ".join(problems) + f" ({note})"
        return "pass", note

    def _reference(self, r: _Running, values: dict[str, Any]) -> tuple[float | None, str]:
        """What the GPU's throughput is held to: the median of its peers (same model and power limit) in this run,
        known once every GPU's run ended (_rejudge_sustained), else its own probe baseline for the same dtype."""
        peers = self._peer_medians.get(_peer_key(r))
        if peers is not None and len(peers) >= 2:
            others = [v for uuid, v in peers.items() if uuid != r.identity.uuid]
            if others:
                return statistics.median(others), f"its {len(others)} peer(s)' median"
        baseline = Baselines(self._state_dir).peek().get(r.identity.uuid)
        if baseline is not None and baseline.flops and baseline.key.dtype == values.get("dtype"):
            return baseline.flops, "its probe baseline"
        return None, ""

    def _say(self, text: str) -> None:
        if self._progress is not None:
            self._progress(text)


def _peer_key(r: _Running) -> tuple[str, float | None]:
    """Peers compute alike: the same model at the same enforced power limit."""
    limit = r.sample.power_limit_watts.get("enforced")
    return r.identity.model, None if limit is None else round(limit)


def _judge_hbm(r: _Running, values: dict[str, Any]) -> tuple[Result, str]:
    mismatches = {str(k): int(v) for k, v in values["mismatches"].items()}
    size = f"{int(values['bytes']) / 2**30:.2f} GiB, {len(mismatches)} patterns"
    bad = {k: v for k, v in mismatches.items() if v}
    if bad:
        words = ", ".join(f"{k}: {v}" for k, v in bad.items())
        return "fail", f"{sum(bad.values())} words read back wrong ({words}) over {size}"
    return "pass", f"{size}, no mismatch"


def _judge_pcie(r: _Running, values: dict[str, Any]) -> tuple[Result, str]:
    if "unmeasured" in values:
        return "skip", str(values["unmeasured"])
    h2d, d2h = float(values["h2d_bytes_per_second"]), float(values["d2h_bytes_per_second"])
    nominal, link = nominal_bytes_per_second(r.sample)
    measured = f"H2D {h2d / 1e9:.1f} GB/s, D2H {d2h / 1e9:.1f} GB/s"
    if nominal is None:
        return "skip", f"{measured}; {link}, so no nominal to hold it to"
    worst = min(h2d, d2h)
    share = worst / nominal
    current = ""
    now = r.latest or r.sample
    gen, width = now.pcie_link_generation.get("current"), now.pcie_link_width.get("current")
    if gen and width:
        current = f"; link now gen {gen} x{width}"
    text = f"{measured} of {nominal / 1e9:.1f} GB/s nominal ({link}): {share:.0%}{current}"
    if share < BANDWIDTH_SHARE_MIN:
        return "fail", f"below {BANDWIDTH_SHARE_MIN:.0%} of nominal: {text}"
    return "pass", text


def _telemetry_note(samples: list[GpuSample]) -> str:
    """The vendor library's readings over the run: SM clock, power against the limit, peak temperature."""
    if not samples:
        return "; no readings during the run"
    clocks = [c for s in samples if (c := s.clock_hertz.get("sm")) is not None]
    power = [p for s in samples if (p := s.power_watts) is not None]
    temps = [
        t for s in samples if (t := s.temperature_celsius.get("core", s.temperature_celsius.get("edge"))) is not None
    ]
    limit = next((s.power_limit_watts.get("enforced") for s in reversed(samples) if s.power_limit_watts), None)
    parts = [f"{len(samples)} readings"]
    if clocks:
        parts.append(
            f"SM {min(clocks) / 1e6:.0f}-{max(clocks) / 1e6:.0f} MHz (mean {statistics.mean(clocks) / 1e6:.0f})"
        )
    if power:
        cap = f" of {limit:.0f} W" if limit else ""
        parts.append(f"power mean {statistics.mean(power):.0f} W{cap}")
    if temps:
        parts.append(f"peak {max(temps):.0f} °C")
    return "; " + ", ".join(parts)


def _read_lines(stream: Any, lines: queue.Queue[bytes | None]) -> None:
    with contextlib.suppress(OSError, ValueError):
        for line in iter(stream.readline, b""):
            lines.put(line)
    lines.put(None)


def _read_all(stream: Any, sink: list[bytes]) -> None:
    with contextlib.suppress(OSError, ValueError):
        while chunk := stream.read(65536):
            sink.append(chunk)
            if len(sink) > 64:
                del sink[:-8]
