"""NVLink per GPU by default (issue #34): each GPU serves its links summed, a link its own series only once it
misbehaved (down while the GPU expects it up, or an error counter grown since the agent started) and from then until
the agent restarts, every link when [nvml] nvlink_per_link asks. On the simulated HGX node (8 H100 × 18 NVLinks)
through the real agent, backend and simulated libnvidia-ml; NVLink readings are the slow tier's (every 30 s)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from simnode import SimAgent

from gpuwatch.core.model import GpuSample
from gpuwatch.simulated.nvml_constants import NVML_NVLINK_ERROR_DL_CRC_FLIT, NVML_NVLINK_ERROR_DL_REPLAY
from gpuwatch.state.nvlinks import LinkWatch

PER_LINK = ("gpuwatch_gpu_nvlink_up", "gpuwatch_gpu_nvlink_errors_total", "gpuwatch_gpu_nvlink_bytes_total")
SLOW_POLL = 31.0  # one slow-tier poll later


def _per_link(sim: SimAgent) -> Counter[tuple[str, str]]:
    """(gpu, link) -> how many per-link series the scrape has for it."""
    found: Counter[tuple[str, str]] = Counter()
    for name, labels in sim.samples():
        if name in PER_LINK:
            label = dict(labels)
            found[(label["gpu"], label["link"])] += 1
    return found


def test_a_healthy_hgx_node_serves_its_links_per_gpu_only(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, nvlink=True)
    try:
        sim.run(5)
        assert not _per_link(sim)
        for gpu in range(8):
            assert sim.value("gpuwatch_gpu_nvlinks_up", gpu) == 18.0
            assert sim.value("gpuwatch_gpu_nvlinks_expected", gpu) == 18.0
            for kind in ("replay", "recovery"):  # GpuNvlinkErrors' from 0, so increase() sees a first error
                assert sim.value("gpuwatch_gpu_nvlinks_errors_total", gpu, type=kind) == 0.0
            for kind in ("crc", "ecc"):  # no rule reads their sums from 0: served from their first count
                assert sim.value("gpuwatch_gpu_nvlinks_errors_total", gpu, type=kind) is None
            assert sim.value("gpuwatch_gpu_nvlinks_bytes_total", gpu, direction="rx") is not None
    finally:
        sim.close()


def test_a_link_that_goes_down_is_served_on_its_own_until_the_agent_restarts(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, nvlink=True)
    try:
        sim.run(5)
        sim.node.faults.set_nvlink_up(2, 7, False)
        sim.run(SLOW_POLL)
        assert sim.value("gpuwatch_gpu_nvlinks_up", 2) == 17.0
        assert sim.value("gpuwatch_gpu_nvlinks_expected", 2) == 18.0
        assert sim.value("gpuwatch_gpu_nvlink_up", 2, link="7") == 0.0
        # The link's state, its four DL error counters and its two byte counters: what one bad link costs.
        assert _per_link(sim) == {("2", "7"): 7}
        sim.node.faults.set_nvlink_up(2, 7, True)  # back up: still served, its history stays readable
        sim.run(SLOW_POLL)
        assert sim.value("gpuwatch_gpu_nvlink_up", 2, link="7") == 1.0
        assert sim.value("gpuwatch_gpu_nvlinks_up", 2) == 18.0
        assert _per_link(sim) == {("2", "7"): 7}
    finally:
        sim.close()
    restarted = SimAgent(tmp_path, nvlink=True)  # a new agent on the same node: the link is fine, so not served
    try:
        restarted.run(5)
        assert not _per_link(restarted)
    finally:
        restarted.close()


def test_a_link_whose_errors_grow_is_served_and_counted_in_the_gpus_sum(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, nvlink=True)
    faults = sim.node.faults
    faults.set_nvlink_errors(5, 3, NVML_NVLINK_ERROR_DL_CRC_FLIT, 1_000)  # counted before the agent started
    try:
        sim.run(5)
        assert not _per_link(sim)  # an old count is no misbehaviour: only growth since the agent started is
        assert sim.value("gpuwatch_gpu_nvlinks_errors_total", 5, type="crc") == 1_000.0
        faults.set_nvlink_errors(1, 11, NVML_NVLINK_ERROR_DL_REPLAY, 3)
        sim.run(SLOW_POLL)
        assert sim.value("gpuwatch_gpu_nvlinks_errors_total", 1, type="replay") == 3.0
        assert sim.value("gpuwatch_gpu_nvlink_errors_total", 1, link="11", type="replay") == 3.0
        assert sim.value("gpuwatch_gpu_nvlink_up", 1, link="11") == 1.0
        assert _per_link(sim) == {("1", "11"): 7}
        faults.set_nvlink_errors(5, 3, NVML_NVLINK_ERROR_DL_CRC_FLIT, 1_250)  # the old count grows now
        sim.run(SLOW_POLL)
        assert sim.value("gpuwatch_gpu_nvlink_errors_total", 5, link="3", type="crc") == 1_250.0
        assert set(_per_link(sim)) == {("1", "11"), ("5", "3")}
    finally:
        sim.close()


def test_nvlink_per_link_serves_every_link(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, nvlink=True, sections={"nvml": {"nvlink_per_link": True}})
    try:
        sim.run(5)
        per_link = _per_link(sim)
        assert len(per_link) == 8 * 18 and set(per_link.values()) == {7}
        assert sim.value("gpuwatch_gpu_nvlinks_up", 0) == 18.0  # the sums are served too: the rules read them
    finally:
        sim.close()


def test_a_gpu_without_nvlink_serves_no_link_series(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, gpus=2)
    try:
        sim.run(3)
        assert not [name for name, _ in sim.samples() if "nvlink" in name]
    finally:
        sim.close()


def _sample(up: dict[str, bool], errors: dict[tuple[str, str], int], expected: int | None = 2) -> GpuSample:
    sample = GpuSample("GPU-0", 0.0)
    sample.nvlink_up, sample.nvlink_errors_total, sample.nvlink_expected = up, errors, expected
    return sample


def test_a_failed_read_keeps_the_links_last_count_in_the_sum() -> None:
    """A sum that fell because one link's counters could not be read once would be a counter reset to rate(): the
    whole sum counted again as new errors. The link's last count stays in the sum; a real reset lowers it."""
    watch = LinkWatch()
    first = watch.update(_sample({"0": True, "1": True}, {("0", "replay"): 5, ("1", "replay"): 7}))
    assert first is not None and first.errors_total == {"replay": 12} and not first.misbehaved
    unread = watch.update(_sample({"0": True}, {("0", "replay"): 5}))  # link 1 did not answer this poll
    assert unread is not None and unread.errors_total == {"replay": 12}
    assert unread.up == 1 and unread.expected == 2  # a link that does not answer is not up
    reset = watch.update(_sample({"0": True, "1": True}, {("0", "replay"): 0, ("1", "replay"): 0}))
    assert reset is not None and reset.errors_total == {"replay": 0} and not reset.misbehaved
    grown = watch.update(_sample({"0": True, "1": True}, {("0", "replay"): 0, ("1", "replay"): 1}))
    assert grown is not None and grown.misbehaved == {"1"}  # growth after the reset is growth


def test_links_never_up_are_not_misbehaving_and_amd_links_are_counted_as_seen() -> None:
    """A GPU none of whose links ever came up (a PCIe card without its bridge) has nothing misbehaving; AMD's
    backend does not say how many XGMI links a GPU has, so the links seen since the start count."""
    unwired = LinkWatch().update(_sample({"0": False, "1": False}, {}))
    assert unwired is not None and unwired.up == 0 and not unwired.misbehaved
    amd = LinkWatch()
    amd.update(_sample({"0": True, "1": True}, {}, expected=None))
    later = amd.update(_sample({"0": True}, {}, expected=None))  # link 1 stopped answering: still the GPU's
    assert later is not None and later.expected == 2 and later.up == 1
    assert LinkWatch().update(_sample({}, {}, expected=None)) is None  # no links: no NVLink series at all
