"""Interval jobs on threads of their own: what the agent used APScheduler's BackgroundScheduler for, without it.

The agent needs only this much: a job every N seconds, never two runs of one job at once, runs a job missed while
it was still running (or while the machine was suspended) coalesced into the next slot of its grid, the first run now
or one interval after the start, and a new interval on reload. APScheduler brought asyncio, multiprocessing,
zoneinfo and tzlocal with it: 4.2 MiB of the agent's RSS (benchmarks/README.md, "What the agent's memory is").

A job is a daemon thread that sleeps on an Event until its next slot: a slow or hung run (a vendor call stuck in the
driver) delays only its own job's next run, and `shutdown` never waits for it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class _Job:
    def __init__(self, job_id: str, seconds: float, run: Callable[[], Any], first_run_now: bool) -> None:
        self.id = job_id
        self.seconds = seconds
        self.run = run
        self.first_run_now = first_run_now
        self.wake = threading.Event()  # a new interval, or shutdown
        self.thread: threading.Thread | None = None


class IntervalScheduler:
    """Jobs on a fixed grid (start + k x interval, on the monotonic clock), each on its own daemon thread."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._jobs: dict[str, _Job] = {}
        self._stopped = threading.Event()

    def add_job(
        self, job_id: str, seconds: float, func: Callable[..., Any], *args: Any, first_run_now: bool = True
    ) -> None:
        """Run `func(*args)` every `seconds`: at once when `first_run_now`, else one interval after `start`."""
        if seconds <= 0 or not math.isfinite(seconds):
            raise ValueError(f"job {job_id}: interval must be a positive number of seconds, not {seconds!r}")
        if job_id in self._jobs:
            raise ValueError(f"job {job_id} is already scheduled")
        self._jobs[job_id] = _Job(job_id, seconds, lambda: func(*args), first_run_now)

    def start(self) -> None:
        for job in self._jobs.values():
            job.thread = threading.Thread(target=self._loop, args=(job,), name=f"job-{job.id}", daemon=True)
            job.thread.start()

    def reschedule(self, job_id: str, seconds: float) -> None:
        """A new interval for `job_id`, its grid starting now: the next run one new interval from now."""
        if seconds <= 0 or not math.isfinite(seconds):
            raise ValueError(f"job {job_id}: interval must be a positive number of seconds, not {seconds!r}")
        job = self._jobs[job_id]
        job.seconds = seconds
        job.wake.set()

    def shutdown(self) -> None:
        """Stop every job after its current run; never waits for a run that hangs."""
        self._stopped.set()
        for job in self._jobs.values():
            job.wake.set()

    def _loop(self, job: _Job) -> None:
        origin = self._monotonic()
        due = origin if job.first_run_now else origin + job.seconds
        while not self._stopped.is_set():
            if job.wake.wait(max(0.0, due - self._monotonic())):
                job.wake.clear()
                if self._stopped.is_set():
                    return
                origin = self._monotonic()  # rescheduled: the new grid starts now
                due = origin + job.seconds
                continue
            try:
                job.run()
            except Exception:  # a job reports its own failures; this keeps the thread alive for the next slot
                log.exception("scheduled job %s failed", job.id)
            # The next slot of the grid after now: slots missed while this run took long are coalesced into it.
            now = self._monotonic()
            due = origin + (math.floor((now - origin) / job.seconds) + 1) * job.seconds
