"""The scheduler's job hook and the recording of collectors that run on their own threads
(gpuwatch.service.scheduling)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from gpuwatch.collectors.base import CollectorContext, Threads
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import load_config
from gpuwatch.service.scheduling import Collectors, then
from gpuwatch.state.store import SampleStore


def _collectors(tmp_path_str: str, stopping: threading.Event) -> Collectors:
    config = load_config(None, {"agent": {"state_dir": tmp_path_str}})
    store = SampleStore(poll_interval_seconds=1.0)
    context = CollectorContext(
        lambda: config, NodeSources([], dict, None), store, [], time.time, time.monotonic, stopping
    )
    return Collectors(context, [])


def test_then_runs_after_the_job_even_when_it_fails_and_never_fails_the_job() -> None:
    order: list[str] = []

    def job(x: int) -> int:
        order.append(f"job {x}")
        if x < 0:
            raise ValueError("poll failed")
        return x * 2

    def after() -> None:
        order.append("after")
        raise RuntimeError("render failed")  # logged, not the job's failure

    wrapped = then(job, after)
    assert wrapped(21) == 42
    with pytest.raises(ValueError):
        wrapped(-1)
    assert order == ["job 21", "after", "job -1", "after"]


def test_the_real_scheduler_calls_after_job_once_the_poll_has_run(tmp_path: object) -> None:
    """APScheduler runs the poll at once; the hook runs in the same job thread after it (the agent's prerender)."""
    stopping = threading.Event()
    collectors = _collectors(str(tmp_path), stopping)
    polled, after = threading.Event(), threading.Event()
    seen_poll_first: list[bool] = []

    def hook() -> None:
        seen_poll_first.append(polled.is_set())
        after.set()

    scheduler = collectors.start_scheduler(polled.set, 60.0, after_job=hook)
    try:
        assert after.wait(10)
        assert seen_poll_first[0] is True
    finally:
        scheduler.shutdown(wait=False)


@dataclass
class _Waiter:
    """A thread collector like xid_events: each run waits a little; `outcomes` says how each run ends."""

    outcomes: list[bool]
    stopping: threading.Event
    name: str = "waiter"
    interval_seconds: float = 3600.0
    runs: int = 0
    schedule: Threads = field(init=False)

    def __post_init__(self) -> None:
        self.schedule = Threads({"waiter": self.run})

    def run(self) -> bool:
        time.sleep(0.001)
        ok = self.outcomes[self.runs] if self.runs < len(self.outcomes) else True
        self.runs += 1
        if self.runs >= len(self.outcomes) + 5:
            self.stopping.set()
        return ok

    def update(self) -> bool:
        return True


def test_a_quiet_thread_collector_records_its_run_once_per_interval_and_every_failure(tmp_path: object) -> None:
    """Recording each wake-up would change the store — and the exposition, rendered again — every second between
    polls; a failure is still counted each time it happens (gpuwatch_collector_errors_total)."""
    stopping = threading.Event()
    collectors = _collectors(str(tmp_path), stopping)
    waiter = _Waiter([True, True, False, False, True, True], stopping)
    collectors.all.append(waiter)  # type: ignore[arg-type]
    records: list[bool] = []
    store = collectors.context.store
    original = store.record_collector_run

    def record(name: str, *, success: bool, duration_seconds: float) -> None:
        records.append(success)
        original(name, success=success, duration_seconds=duration_seconds)

    store.record_collector_run = record  # type: ignore[method-assign]
    collectors.start_threads()
    assert collectors.join_threads(10) == []
    # the first run; the two failures; the first good run after them; then nothing within the hour's interval
    assert records == [True, False, False, True]
    snap = store.snapshot()
    assert snap.collectors["waiter"].errors_total == 2 and snap.collectors["waiter"].success is True
