"""The registry's run side (node_exporter's execute()): build the registered collectors (gpuwatch/registry.py),
register and schedule them, and time every run. `execute` is the one place that writes the meta-metrics
gpuwatch_collector_success, _duration_seconds, _errors_total and _last_run_timestamp_seconds, and
`Collectors.register` the one place that writes gpuwatch_collector_interval_seconds.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuwatch.collectors.base import Collector, CollectorContext, Every, Threads
from gpuwatch.registry import REGISTRY
from gpuwatch.state.store import SampleStore

log = logging.getLogger(__name__)


def execute(store: SampleStore, name: str, run: Callable[[], bool], monotonic: Callable[[], float]) -> bool:
    """One run of a collector, timed into its meta-metrics."""
    ok, seconds = timed_run(name, run, monotonic)
    store.record_collector_run(name, success=ok, duration_seconds=seconds)
    return ok


def timed_run(name: str, run: Callable[[], bool], monotonic: Callable[[], float]) -> tuple[bool, float]:
    """(whether the run succeeded, how long it took); an exception is a failed run, logged with its traceback."""
    started = monotonic()
    try:
        ok = run()
    except Exception:
        log.exception("collector %s failed unexpectedly", name)
        ok = False
    return ok, monotonic() - started


@dataclass(slots=True)
class Collectors:
    """The enabled registered collectors of one agent, in registry order."""

    context: CollectorContext
    all: list[Collector] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def build(cls, context: CollectorContext) -> Collectors:
        disabled = context.config().agent.disable_collectors
        built: list[Collector] = []
        for registration in REGISTRY:
            if registration.name not in disabled:
                built.extend(importlib.import_module(registration.module).collectors(context, registration.name))
        return cls(context, built)

    def __iter__(self) -> Iterator[Collector]:
        return iter(self.all)

    def named(self, name: str) -> list[Collector]:
        return [c for c in self.all if c.name == name]

    def of_type(self, kind: type[Any]) -> Any | None:
        return next((c for c in self.all if isinstance(c, kind)), None)

    def register(self, *, threads: bool = True) -> None:
        """Every collector's gpuwatch_collector_interval_seconds; `threads=False` leaves out those on their own
        threads (an in-process test agent that runs their reads itself)."""
        for collector in self.all:
            if threads or not isinstance(collector.schedule, Threads):
                self.context.store.register_collector(collector.name, collector.interval_seconds)

    def execute(self, collector: Collector, run: Callable[[], bool] | None = None) -> bool:
        return execute(self.context.store, collector.name, run or collector.update, self.context.monotonic)

    def run_job(self, job: str) -> bool:
        """One run of every collector on the scheduler job `job`, one after another; True when all succeeded."""
        ok = True
        for collector in self.all:
            if isinstance(collector.schedule, Every) and collector.schedule.job == job:
                ok = self.execute(collector) and ok
        return ok

    def jobs(self) -> dict[str, tuple[float, bool]]:
        """job id -> (interval, first run at once), for the scheduler; a shared job takes its first collector's."""
        out: dict[str, tuple[float, bool]] = {}
        for collector in self.all:
            if isinstance(collector.schedule, Every):
                out.setdefault(collector.schedule.job, (collector.interval_seconds, collector.schedule.first_run_now))
        return out

    def add_jobs(
        self, scheduler: Any, *, except_jobs: tuple[str, ...] = (), after_job: Callable[[], None] | None = None
    ) -> None:
        run = self.run_job if after_job is None else then(self.run_job, after_job)
        for job, (seconds, now) in self.jobs().items():
            if job not in except_jobs:
                first = datetime.now().astimezone() if now else None
                kwargs = {"next_run_time": first} if first is not None else {}
                scheduler.add_job(run, "interval", args=(job,), seconds=seconds, id=job, **kwargs)

    def start_scheduler(
        self, poll: Callable[[], None], poll_seconds: float, after_job: Callable[[], None] | None = None
    ) -> Any:
        """An APScheduler BackgroundScheduler running `poll` (first at once, so the first scrape is complete) and
        every other job (hwmon, ipmi, probe: their own intervals, never on the scrape path); one run of a job at a
        time, missed runs coalesced, so a hung vendor call delays only its own job. `after_job` runs in the job's
        thread after each run (the exposition's prerender)."""
        from apscheduler.schedulers.background import BackgroundScheduler

        scheduler = BackgroundScheduler(job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None})
        job = poll if after_job is None else then(poll, after_job)
        scheduler.add_job(job, "interval", seconds=poll_seconds, id="poll", next_run_time=None)
        self.add_jobs(scheduler, except_jobs=("poll",), after_job=after_job)
        scheduler.start()
        first = scheduler.get_job("poll")
        if first is not None:
            first.modify(next_run_time=datetime.now().astimezone())
        return scheduler

    def start_threads(self) -> None:
        for collector in self.all:
            if isinstance(collector.schedule, Threads):
                for thread_name, run in collector.schedule.runs.items():
                    thread = threading.Thread(target=self._loop, args=(collector, run), name=thread_name, daemon=True)
                    thread.start()
                    self.threads.append(thread)

    def _loop(self, collector: Collector, run: Callable[[], bool]) -> None:
        """Runs back to back. A failed run is always recorded; a good one when the last recorded one failed, and
        otherwise once per the collector's interval: a thread that wakes every second with nothing to report must not
        change the store (and so the exposition, rendered again for it) between polls."""
        store, monotonic = self.context.store, self.context.monotonic
        recorded_ok: bool | None = None
        recorded_at = float("-inf")
        while not self.context.stopping.is_set():
            ok, seconds = timed_run(collector.name, run, monotonic)
            ended = monotonic()
            if not ok or recorded_ok is not True or ended - recorded_at >= collector.interval_seconds:
                store.record_collector_run(collector.name, success=ok, duration_seconds=seconds)
                recorded_ok, recorded_at = ok, ended

    def join_threads(self, timeout_s: float) -> list[str]:
        """Wait (bounded) for the collectors' own threads after stop is set; the names of those still running."""
        deadline = time.monotonic() + timeout_s  # real time: a test's clock may stand still
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]


def then(job: Callable[..., Any], after: Callable[[], None]) -> Callable[..., Any]:
    """`job`, then `after` in the same thread, whatever the job did; `after` failing is logged, never the job's
    failure."""

    def run(*args: Any) -> Any:
        try:
            return job(*args)
        finally:
            try:
                after()
            except Exception:
                log.exception("after the %s job", getattr(job, "__name__", "scheduler"))

    return run
