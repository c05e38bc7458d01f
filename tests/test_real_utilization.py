"""Real utilization end to end: the NVML backend reads GPM through each tested pynvml over the simulated library,
the agent exports it, and the scenarios show what utilization_ratio cannot (issue 17). AMD: XGMI bytes only.

nvml.h (go-nvml gen/nvml/nvml.h 13.3.29, "GPM Functions"): two samples per metric computation, buffers from
nvmlGpmSampleAlloc freed with nvmlGpmSampleFree, GPM "for Hopper or newer fully supported devices".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from amd_releases import over_releases
from nvml_bindings import RELEASES, binding_path
from simnode import SimAgent

from gpuwatch.backends.amdsmi import AmdSmiBackend
from gpuwatch.backends.nvml import NvmlBackend
from gpuwatch.collectors.vendors import _activity_lines
from gpuwatch.core.model import GpuSample
from gpuwatch.exposition.exporter import families
from gpuwatch.simulated.amdsmi_sim import simulated_amdsmi
from gpuwatch.simulated.bindings import simulated_pynvml
from gpuwatch.simulated.scenarios import SimulatedNode
from gpuwatch.state.store import SampleStore

WALL = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = 5.0

    def __call__(self) -> float:
        return self.t


@contextlib.contextmanager
def nvml(
    release: str, scenario: str, gpus: int = 4, nvlink: bool = False, **options: Any
) -> Iterator[tuple[NvmlBackend, Any, SimulatedNode, Clock]]:
    clock = Clock()
    node = SimulatedNode(scenario, gpus=gpus, clock=clock, wall_clock=lambda: WALL, nvlink=nvlink)
    lib = simulated_pynvml(node, binding=binding_path(release), **options)
    backend = NvmlBackend(lib, clock=lambda: WALL + clock.t)
    backend.open()
    try:
        yield backend, lib.nvmlLib.driver, node, clock
    finally:
        backend.close()


def polls(backend: NvmlBackend, clock: Clock, count: int, step: float = 1.0) -> list[GpuSample]:
    """`count` polls `step` seconds apart; the samples of the last."""
    readings = []
    for i in range(count):
        if i:
            clock.t += step
        readings = backend.poll(slow=i == 0)
    return [r.sample for r in readings if r.sample is not None]


@pytest.mark.parametrize("release", RELEASES)
def test_starved_gpu_reads_busy_but_barely_works(release: str) -> None:
    """dataloader_starved: GPU 2 has a kernel in flight all the time (utilization 1.0) while its SMs are ~13 %
    active; the training GPUs beside it are ~94 % SM active with tensor pipes ~78 %. The first poll has one sample
    and no share yet; the second has the share of the interval between them."""
    with nvml(release, "dataloader_starved") as (backend, _, _, clock):
        first = polls(backend, clock, 1)
        assert first[2].sm_active_ratio is None and first[2].active_seconds_total == {}
        clock.t += 2.0
        samples = [r.sample for r in backend.poll(slow=False) if r.sample is not None]
    starved, training = samples[2], samples[1]
    assert starved.utilization_ratio == 1.0 and training.utilization_ratio == 1.0
    assert starved.sm_active_ratio is not None and 0.1 < starved.sm_active_ratio < 0.16
    assert starved.tensor_active_ratio is not None and starved.tensor_active_ratio < 0.08
    assert training.sm_active_ratio is not None and training.sm_active_ratio > 0.88
    assert training.tensor_active_ratio is not None and 0.7 < training.tensor_active_ratio < training.sm_active_ratio
    assert training.pipe_active_ratio["hmma"] > 0.7 and training.pipe_active_ratio["dmma"] == 0.0
    assert training.active_seconds_total["sm"] == pytest.approx(2.0 * training.sm_active_ratio)
    assert training.pcie_bytes_total["rx"] > training.pcie_bytes_total["tx"] > 0  # summed from MiB/s: driver 580


@pytest.mark.parametrize("release", RELEASES)
def test_seconds_counters_give_the_share_over_any_window(release: str) -> None:
    """sm_active_seconds_total sums share x interval, so its increase over a window divided by the window is the
    SM active share over it, whatever the poll interval: the mean of the windowed shares, weighted by time."""
    with nvml(release, "training", gpus=1) as (backend, _, _, clock):
        polls(backend, clock, 2)
        start = polls(backend, clock, 1)[0]
        shares, steps = [], [1.0, 3.0, 0.5, 2.5, 1.0]
        for step in steps:
            clock.t += step
            sample = next(r.sample for r in backend.poll(slow=False) if r.sample is not None)
            shares.append(sample.sm_active_ratio or 0.0)
    rate = (sample.active_seconds_total["sm"] - start.active_seconds_total["sm"]) / sum(steps)
    assert rate == pytest.approx(sum(s * d for s, d in zip(shares, steps, strict=True)) / sum(steps))
    assert 0.88 < rate < 0.99


@pytest.mark.parametrize("release", RELEASES)
def test_since_reboot_counters_where_the_driver_has_them(release: str) -> None:
    """NVML 13.2 added counters since reboot (SM cycles elapsed / active, MMA cycles, PCIe bytes; go-nvml
    commit 2976179): on such a driver the backend exports them as they are, and their rates give the same share
    as the windowed SM_UTIL. The ids are nvml.h's enum values, asked by number: nvidia-ml-py 12.570 does not name
    them, and its driver still answers them."""
    with nvml(release, "training", gpus=1, driver_version="595.45.04") as (backend, _, _, clock):
        before = polls(backend, clock, 2)[0]
        clock.t += 4.0
        after = next(r.sample for r in backend.poll(slow=False) if r.sample is not None)
    assert before.sm_cycles_total is not None and after.sm_cycles_total is not None
    share = (after.active_cycles_total["sm"] - before.active_cycles_total["sm"]) / (
        after.sm_cycles_total - before.sm_cycles_total
    )
    assert share == pytest.approx(after.sm_active_ratio, rel=1e-6)
    assert after.pcie_bytes_total["tx"] > 3e9  # the device's count since the driver loaded, not since gpuwatch
    assert after.active_cycles_total["tensor"] < after.active_cycles_total["sm"] < after.sm_cycles_total


@pytest.mark.parametrize("release", RELEASES)
def test_a_driver_without_since_reboot_counters_is_asked_once(release: str) -> None:
    """The 580 driver answers NotSupported for the since-reboot ids, per metric: no cycle series, the windowed
    shares are there, and after the first answer the backend stops asking for them."""
    with nvml(release, "training", gpus=1) as (backend, _, _, clock):
        sample = polls(backend, clock, 3)[0]
        state = backend._gpm_states()[0]
    assert sample.sm_cycles_total is None and sample.active_cycles_total == {}
    assert sample.sm_active_ratio is not None and state.cumulative is False


@pytest.mark.parametrize("release", RELEASES)
def test_no_gpm_no_series_and_check_says_why(release: str) -> None:
    """Before Hopper, nvmlGpmQueryDeviceSupport answers isSupportedDevice 0: no real-utilization series at all
    (never 0), utilization_ratio still there, and `check`'s lines name the GPUs and the reason."""
    with nvml(release, "busy", gpus=2, compute_capability=(8, 0)) as (backend, driver, _, clock):
        store = SampleStore(poll_interval_seconds=1.0, clock=lambda: WALL + clock.t)
        for i in range(3):
            clock.t += 1.0
            readings = backend.poll(slow=i == 0)
            store.record_poll(readings)
        samples = [r.sample for r in readings if r.sample is not None]
        able, missing = backend.activity_support()
        lines = _activity_lines(backend, 2, "real utilization (nvml)")
        assert driver._gpm_samples == {}  # nothing allocated for a GPU without GPM
    assert all(s.sm_active_ratio is None and not s.pipe_active_ratio and not s.active_seconds_total for s in samples)
    assert all(s.utilization_ratio == 1.0 for s in samples)
    assert able == 0 and [index for index, _ in missing] == [0, 1]
    assert len(lines) == 1 and lines[0].level == "warn" and "GPU 0, 1: " in lines[0].detail
    assert "Hopper" in lines[0].detail and lines[0].fix
    names = {metric.name for metric in families(store.snapshot())}
    assert "gpuwatch_gpu_utilization_ratio" in names
    ours = {
        n for n in names if n.endswith(("_active_ratio", "occupancy_ratio", "active_seconds_total", "cycles_total"))
    }
    assert not ours and not {n for n in names if n.endswith("_bytes_total")}


@pytest.mark.parametrize("release", RELEASES)
def test_samples_are_freed_on_close_and_gpu_loss(release: str) -> None:
    """Two buffers per GPU while it answers; a lost GPU's are freed (nvmlGpmSampleFree) and allocated afresh when
    it answers again; close frees the rest before nvmlShutdown."""
    with nvml(release, "training", gpus=2) as (backend, driver, node, clock):
        polls(backend, clock, 2)
        assert len(driver._gpm_samples) == 4
        node.faults.lose_gpu(1)
        clock.t += 1.0
        backend.poll(slow=False)
        assert len(driver._gpm_samples) == 2
        node.faults.restore_gpu(1)
        again = polls(backend, clock, 3)
        assert len(driver._gpm_samples) == 4 and again[1].sm_active_ratio is not None
        backend.close()
        assert driver._gpm_samples == {}


def test_the_agent_exports_real_utilization_per_scenario(tmp_path: Path) -> None:
    """Through the real agent and exposition: idle_allocated GPU 2 holds memory with SM active 0; a training GPU
    shows tensor activity; NVLink bytes per link where the node has NVLink (here: none, so none)."""
    sim = SimAgent(tmp_path, scenario="idle_allocated", gpus=4)
    try:
        sim.run(3.0)
        assert sim.value("gpuwatch_gpu_processes", 2) == 1.0
        assert (sim.value("gpuwatch_gpu_memory_used_bytes", 2) or 0) > 70 * 2**30
        assert sim.value("gpuwatch_gpu_sm_active_ratio", 2) == 0.0
        assert sim.value("gpuwatch_gpu_utilization_ratio", 2) == 0.0
        assert sim.value("gpuwatch_gpu_sm_active_seconds_total", 2) == 0.0
        assert sim.value("gpuwatch_gpu_pipe_active_ratio", 2, pipe="hmma") is None  # opt-in: [nvml] gpm_per_pipe
        nvlink_bytes = ("gpuwatch_gpu_nvlink_bytes_total", "gpuwatch_gpu_nvlinks_bytes_total")
        assert not [name for name, _ in sim.samples() if name in nvlink_bytes]
    finally:
        sim.close()
    sim = SimAgent(tmp_path / "training", scenario="training", gpus=2, sections={"nvml": {"gpm_per_pipe": True}})
    try:
        sim.run(3.0)
        tensor = sim.value("gpuwatch_gpu_tensor_active_ratio", 0)
        assert tensor is not None and tensor > 0.7
        hmma = sim.value("gpuwatch_gpu_pipe_active_ratio", 0, pipe="hmma")  # asked for: each pipe
        assert hmma is not None and hmma > 0.7 and sim.value("gpuwatch_gpu_pipe_active_ratio", 0, pipe="fp64") == 0.0
        seconds = sim.value("gpuwatch_gpu_tensor_active_seconds_total", 0)
        assert seconds is not None and 1.4 < seconds < 2.0  # two intervals of 1 s at ~0.78
    finally:
        sim.close()


@over_releases
def test_amd_xgmi_bytes_and_no_sm_activity(release: str) -> None:
    """MI300X: gpu_metrics' xgmi_read_data_acc / xgmi_write_data_acc count KiB per link (ROCm/amdsmi
    include/amd_smi/amdsmi.h:1576-1578): exported as NVLink/XGMI bytes; gfx_activity is engine-busy, already
    utilization_ratio, so there is no SM active series and check says so."""
    clock = Clock()
    node = SimulatedNode("training", gpus=2, vendor="amd", clock=clock, wall_clock=lambda: WALL)
    backend = AmdSmiBackend(simulated_amdsmi(node, binding=release), clock=lambda: WALL + clock.t)
    backend.open()
    try:
        first = backend.poll(slow=True)[0].sample
        clock.t += 2.0
        second = backend.poll(slow=False)[0].sample
        able, missing = backend.activity_support()
    finally:
        backend.close()
    assert first is not None and second is not None
    assert set(second.nvlink_bytes_total) == {("0", "rx"), ("0", "tx")}  # two GPUs: one XGMI link each
    grown = second.nvlink_bytes_total[("0", "rx")] - first.nvlink_bytes_total[("0", "rx")]
    assert grown == pytest.approx(2.0 * 18e9, rel=0.06)  # ~18 GB/s per link while training, within the wobble
    assert second.sm_active_ratio is None and second.utilization_ratio == 1.0
    assert able == 0 and [index for index, _ in missing] == [0, 1]


@pytest.mark.parametrize("code", [3, 4])
def test_a_gpu_that_refuses_samples_is_not_asked_again(code: int) -> None:
    """nvmlGpmSampleGet answering NotSupported (3) or NoPermission (4: the driver keeps performance counters to
    administrators) stops the sampling of that GPU: its buffers freed, no series, and `check` names the cause."""
    with nvml("installed", "training", gpus=2) as (backend, driver, node, clock):
        node.faults.fail("nvmlGpmSampleGet", code=code, gpu=1)
        samples = polls(backend, clock, 3)
        able, missing = backend.activity_support()
        assert len(driver._gpm_samples) == 2  # GPU 0's pair only
    assert samples[0].sm_active_ratio is not None and samples[1].sm_active_ratio is None
    assert able == 1 and [index for index, _ in missing] == [1]
    assert ("NVreg_RestrictProfilingToAdminUsers" in missing[0][1]) == (code == 4)


@pytest.mark.parametrize("release", RELEASES)
def test_polls_faster_than_nvmls_sample_floor_keep_the_last_interval(release: str) -> None:
    """The poll interval may be 0.05 s, but two nvmlGpmSampleGet calls must be more than 100 ms apart ("due to the
    internal sample refresh rate": nvml.h of NVML 13.3, go-nvml gen/nvml/nvml.h 13861 and 13911). A poll sooner than
    that after the last sample takes none and keeps the last interval's share; the one after measures the whole
    time since that sample, so the seconds counter still sums share x time with nothing lost."""
    with nvml(release, "training", gpus=1, driver_version="595.45.04") as (backend, _, _, clock):
        measured = polls(backend, clock, 2)[0]
        assert measured.sm_active_ratio is not None
        for _ in range(6):  # 0.05 s apart: a sample every other poll at most
            clock.t += 0.05
            sample = polls(backend, clock, 1)[0]
            assert sample.sm_active_ratio is not None and 0.88 < sample.sm_active_ratio < 0.99
            assert sample.sm_cycles_total is not None  # the since-reboot counters were never given up
        state = backend._gpm_states()[0]
    assert state.cumulative is True
    assert sample.active_seconds_total["sm"] > measured.active_seconds_total["sm"]
