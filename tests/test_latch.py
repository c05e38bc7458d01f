"""The one warn-once / log-recovery latch (gpuwatch/latch.py): a problem seen at every poll is one line when it
starts, one when it clears, and one again when it comes back — per key, so one GPU never silences another."""

from __future__ import annotations

import logging
import threading

import pytest

from gpuwatch.latch import Latch

log = logging.getLogger("gpuwatch.test_latch")


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == log.name]


def test_warns_once_per_episode_logs_the_recovery_once_and_warns_again_after_a_new_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    latch = Latch(log)
    with caplog.at_level(logging.INFO, logger=log.name):
        assert not latch.recover("disk writable again")  # never failed: nothing to say
        assert latch.fail("disk full: %s", "ENOSPC")
        assert not latch.fail("disk full: %s", "ENOSPC")
        assert not latch.fail("disk full: %s", "EROFS")  # still the same episode
        assert latch.failing()
        assert latch.recover("disk writable again")
        assert not latch.recover("disk writable again")
        assert not latch.failing()
        assert latch.fail("disk full: %s", "ENOSPC")  # a new failure is a new episode
    assert lines(caplog) == [
        ("WARNING", "disk full: ENOSPC"),
        ("INFO", "disk writable again"),
        ("WARNING", "disk full: ENOSPC"),
    ]


def test_keys_are_independent(caplog: pytest.LogCaptureFixture) -> None:
    latch = Latch(log)
    with caplog.at_level(logging.INFO, logger=log.name):
        latch.fail("GPU %d slow", 3, key="GPU-3")
        latch.fail("GPU %d slow", 5, key="GPU-5")
        latch.fail("GPU %d slow", 3, key="GPU-3")
        latch.recover("GPU %d back", 5, key="GPU-5")
        latch.recover("GPU %d back", 3, key="GPU-3")
    assert [m for _, m in lines(caplog)] == ["GPU 3 slow", "GPU 5 slow", "GPU 5 back", "GPU 3 back"]


def test_levels_traceback_and_a_silent_recovery(caplog: pytest.LogCaptureFixture) -> None:
    latch = Latch(log)
    with caplog.at_level(logging.DEBUG, logger=log.name):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            latch.fail("nvml unavailable", level=logging.ERROR, exc_info=True)
        assert latch.recover()  # "" clears without a line
        latch.fail("hint", level=logging.INFO)
    records = [r for r in caplog.records if r.name == log.name]
    assert [(r.levelname, r.getMessage()) for r in records] == [("ERROR", "nvml unavailable"), ("INFO", "hint")]
    assert records[0].exc_info is not None and records[0].exc_info[0] is RuntimeError


def test_repeat_when_changed_says_a_different_problem(caplog: pytest.LogCaptureFixture) -> None:
    latch = Latch(log, repeat_when_changed=True)
    with caplog.at_level(logging.INFO, logger=log.name):
        for message in ("ipmi: timed out", "ipmi: timed out", "ipmi: /dev/ipmi0 gone", "ipmi: /dev/ipmi0 gone"):
            latch.fail("%s", message)
        latch.recover("ipmi reads again")
    assert [m for _, m in lines(caplog)] == ["ipmi: timed out", "ipmi: /dev/ipmi0 gone", "ipmi reads again"]


def test_one_line_when_threads_race(caplog: pytest.LogCaptureFixture) -> None:
    latch = Latch(log)
    start = threading.Barrier(8)

    def fail() -> None:
        start.wait()
        for _ in range(200):
            latch.fail("state dir gone")

    with caplog.at_level(logging.INFO, logger=log.name):
        threads = [threading.Thread(target=fail) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert lines(caplog) == [("WARNING", "state dir gone")]
