"""The one warn-once / log-recovery latch (gpuwatch/core/latch.py): a problem seen at every poll is one line when it
starts, one when it clears, and one again when it comes back — per key, so one GPU never silences another."""

from __future__ import annotations

import logging
import threading

import pytest

from gpuwatch.core.latch import Latch

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


def test_a_vendor_library_down_is_said_once_and_its_return_once(caplog: pytest.LogCaptureFixture) -> None:
    """The nvml collector over the real NVML backend: the simulated libnvml missing (scenario backend_down: nvmlInit
    fails with NVML_ERROR_LIBRARY_NOT_FOUND) at every retry is one ERROR, the library loading later one INFO, and a
    new outage after that an ERROR again."""
    from gpuwatch.collectors.sources import BackendSlot
    from gpuwatch.collectors.vendors import VendorCollectors
    from gpuwatch.config.settings import load_config
    from gpuwatch.simulated.node import simulated_slot
    from gpuwatch.simulated.scenarios import SimulatedNode
    from gpuwatch.state.store import SampleStore

    down = simulated_slot(SimulatedNode("backend_down", gpus=2))
    up = simulated_slot(SimulatedNode("healthy", gpus=2))
    state = {"driver_loaded": False, "now": 0.0}
    slot = BackendSlot("nvml", "nvidia", lambda: (up if state["driver_loaded"] else down).factory())
    config = load_config(None, {"agent": {"backend": "simulated"}})
    store = SampleStore(poll_interval_seconds=1.0)
    vendors = VendorCollectors([slot], store, lambda: config, lambda: float(state["now"]), threading.Event())
    with caplog.at_level(logging.INFO, logger="gpuwatch.collectors.nvml"):
        for now in (0.0, 1.0, 3.0, 7.0):  # every retry of the backoff finds it missing
            state["now"] = now
            assert not vendors.poll(slot)
        state.update(driver_loaded=True, now=100.0)
        assert vendors.poll(slot)
        assert vendors.poll(slot)
        vendors.close()  # the library gone from under the agent: the next poll opens it again
        state.update(driver_loaded=False, now=200.0)
        assert not vendors.poll(slot)
    said = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records if r.name == "gpuwatch.collectors.nvml"]
    assert said == [("ERROR", "nvml unavailable"), ("INFO", "nvml is available again"), ("ERROR", "nvml unavailable")]
