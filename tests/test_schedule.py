"""The agent's interval jobs (gpuwatch.schedule): first run now or after one interval, one run of a job at a time,
runs missed while a run took long coalesced into the next slot, a new interval on reload, a failing run kept going,
and shutdown never waiting for a hung run. Real threads and real time, with intervals of tens of milliseconds."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from gpuwatch.schedule import IntervalScheduler


def runs_of(scheduler: IntervalScheduler, job: str, seconds: float, first_run_now: bool = True) -> list[float]:
    times: list[float] = []
    scheduler.add_job(job, seconds, lambda: times.append(time.monotonic()), first_run_now=first_run_now)
    return times


def test_first_run_now_then_every_interval_and_later_jobs_wait_one_interval() -> None:
    scheduler = IntervalScheduler()
    now_job = runs_of(scheduler, "poll", 0.1)
    later_job = runs_of(scheduler, "host-hwmon", 0.1, first_run_now=False)
    started = time.monotonic()
    scheduler.start()
    time.sleep(0.35)
    scheduler.shutdown()
    assert now_job[0] - started < 0.05 and later_job[0] - started >= 0.09
    assert 3 <= len(now_job) <= 5 and 2 <= len(later_job) <= 4
    gaps = [b - a for a, b in itertools.pairwise(now_job)]
    assert all(0.07 <= gap <= 0.2 for gap in gaps), gaps


def test_a_long_run_is_never_overlapped_and_its_missed_slots_are_coalesced() -> None:
    scheduler = IntervalScheduler()
    running = threading.Lock()
    starts: list[float] = []
    overlapped: list[bool] = []

    def run() -> None:
        overlapped.append(not running.acquire(blocking=False))
        starts.append(time.monotonic())
        time.sleep(0.25 if len(starts) == 1 else 0.0)  # the first run spans five slots
        running.release()

    scheduler.add_job("poll", 0.05, run)
    scheduler.start()
    time.sleep(0.4)
    scheduler.shutdown()
    assert not any(overlapped)
    assert starts[1] - starts[0] >= 0.25  # not five catch-up runs in a burst after the long one
    assert len(starts) <= 6


def test_reschedule_takes_the_new_interval_and_a_failing_run_does_not_stop_the_job() -> None:
    scheduler = IntervalScheduler()
    times: list[float] = []

    def run() -> None:
        times.append(time.monotonic())
        raise RuntimeError("a collector bug")

    scheduler.add_job("poll", 10.0, run)
    scheduler.start()
    time.sleep(0.05)
    scheduler.reschedule("poll", 0.05)
    time.sleep(0.3)
    scheduler.shutdown()
    assert len(times) >= 4  # the first run, then every 0.05 s despite the exceptions


def test_shutdown_does_not_wait_for_a_hung_run() -> None:
    scheduler = IntervalScheduler()
    release = threading.Event()
    scheduler.add_job("poll", 0.05, release.wait)
    scheduler.start()
    time.sleep(0.05)
    started = time.monotonic()
    scheduler.shutdown()
    assert time.monotonic() - started < 0.05
    release.set()


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("nan"), float("inf")])
def test_an_interval_that_is_not_a_positive_number_is_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match="positive number of seconds"):
        IntervalScheduler().add_job("poll", seconds, lambda: None)
