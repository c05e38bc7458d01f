"""The simulated libnvidia-ml's GPM, driven through each tested release of the vendor's own pynvml.

nvml.h (go-nvml gen/nvml/nvml.h, NVML 13.3.29, "GPM Functions"): allocate two sample buffers, take two samples
(nvmlGpmSampleGet) at least 100 ms apart, fill metricId / numMetrics / version and call nvmlGpmMetricsGet, which
"calculate[s] GPM metrics from two samples"; every function is "for Hopper or newer fully supported devices".
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from nvml_bindings import RELEASES, binding_path

from gpuwatch.simulated.bindings import simulated_pynvml
from gpuwatch.simulated.scenarios import SimulatedNode

SM_UTIL, ANY_TENSOR, HMMA, PCIE_RX_PER_SEC, NVLINK_TOTAL_RX = 2, 5, 7, 21, 60
SM_CYCLES_ELAPSED, SM_CYCLES_ACTIVE = 248, 249  # nvml.h 13.2 on: "since reboot"


@pytest.fixture(params=RELEASES)
def release(request: pytest.FixtureRequest) -> Path:
    return binding_path(request.param)


class _Clock:
    def __init__(self) -> None:
        self.t = 5.0

    def __call__(self) -> float:
        return self.t


def _metrics(lib: Any, first: Any, second: Any, ids: list[int]) -> dict[int, tuple[int, float]]:
    request = lib.c_nvmlGpmMetricsGet_t()
    request.version = lib.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = first, second
    for i, metric in enumerate(ids):
        request.metrics[i].metricId = metric
    lib.nvmlGpmMetricsGet(request)
    return {m.metricId: (m.nvmlReturn, m.value) for m in request.metrics[: len(ids)]}


def _two_samples(lib: Any, clock: _Clock, gpu: int, seconds: float = 10.0) -> tuple[Any, Any]:
    handle = lib.nvmlDeviceGetHandleByIndex(gpu)
    first, second = lib.nvmlGpmSampleAlloc(), lib.nvmlGpmSampleAlloc()
    lib.nvmlGpmSampleGet(handle, first)
    clock.t += seconds
    lib.nvmlGpmSampleGet(handle, second)
    return first, second


def test_metrics_from_two_samples_tell_starved_from_training(release: Path) -> None:
    """In dataloader_starved GPU 2 runs a kernel all the time (utilization 100 %) on few SMs; the others train.
    SM_UTIL and ANY_TENSOR_UTIL are percentages (nvml.h: "0.0 - 100.0"), PCIe and NVLink rates MiB/s."""
    clock = _Clock()
    node = SimulatedNode("dataloader_starved", gpus=4, clock=clock, wall_clock=lambda: 1.8e9, nvlink=True)
    lib = simulated_pynvml(node, binding=release)
    lib.nvmlInit()
    starved = _metrics(lib, *_two_samples(lib, clock, 2), [SM_UTIL, ANY_TENSOR, HMMA, PCIE_RX_PER_SEC])
    training = _metrics(lib, *_two_samples(lib, clock, 1), [SM_UTIL, ANY_TENSOR, NVLINK_TOTAL_RX])
    assert lib.nvmlDeviceGetUtilizationRates(lib.nvmlDeviceGetHandleByIndex(2)).gpu == 100
    assert all(code == 0 for code, _ in (*starved.values(), *training.values()))
    assert 8 < starved[SM_UTIL][1] < 20 and starved[ANY_TENSOR][1] < 8
    assert training[SM_UTIL][1] > 85 and 70 < training[ANY_TENSOR][1] <= training[SM_UTIL][1]
    assert starved[HMMA][1] == pytest.approx(starved[ANY_TENSOR][1])  # the only tensor pipe that workload uses
    assert 500 < starved[PCIE_RX_PER_SEC][1] < 1500  # ~0.95 GB/s host-to-device while busy
    assert training[NVLINK_TOTAL_RX][1] > 100_000  # 18 links of ~18 GB/s


def test_counters_since_reboot_need_a_driver_that_has_them(release: Path) -> None:
    """The since-reboot metrics came with NVML 13.2 (present in go-nvml's nvml.h 13.2.82, absent in 13.1.115):
    the 580 driver answers InvalidArgument for them, per metric (an H100 on 580.159.04 did, for ids 248-260:
    tests/fixtures/h100/nvml-backend-calls.json), and still fills the windowed ones. A newer driver answers the
    counters; their difference over the window is the windowed SM_UTIL."""
    clock = _Clock()
    node = SimulatedNode("training", gpus=2, clock=clock, wall_clock=lambda: 1.8e9)
    old = simulated_pynvml(node, binding=release)
    old.nvmlInit()
    ids = [SM_UTIL, SM_CYCLES_ELAPSED, SM_CYCLES_ACTIVE]
    answers = _metrics(old, *_two_samples(old, clock, 0), ids)
    assert answers[SM_UTIL][0] == 0
    assert answers[SM_CYCLES_ELAPSED][0] == answers[SM_CYCLES_ACTIVE][0] == old.NVML_ERROR_INVALID_ARGUMENT
    new = simulated_pynvml(node, binding=release, driver_version="595.45.04")
    new.nvmlInit()
    first, second = _two_samples(new, clock, 0)
    before = _metrics(new, first, first, [SM_CYCLES_ELAPSED, SM_CYCLES_ACTIVE])
    after = _metrics(new, first, second, ids)
    share = (after[SM_CYCLES_ACTIVE][1] - before[SM_CYCLES_ACTIVE][1]) / (
        after[SM_CYCLES_ELAPSED][1] - before[SM_CYCLES_ELAPSED][1]
    )
    assert after[SM_CYCLES_ELAPSED][1] > before[SM_CYCLES_ELAPSED][1] > 0
    assert share * 100 == pytest.approx(after[SM_UTIL][1], rel=1e-9)


def test_pre_hopper_gpus_have_no_gpm(release: Path) -> None:
    """nvmlGpmQueryDeviceSupport says whether the device supports GPM; the sample calls are "for Hopper or newer":
    an A100 (compute capability 8.0) answers isSupportedDevice 0 and NotSupported."""
    lib = simulated_pynvml(SimulatedNode("busy", gpus=1), binding=release, compute_capability=(8, 0))
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    assert lib.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 0
    with pytest.raises(lib.NVMLError_NotSupported):
        lib.nvmlGpmSampleGet(handle, lib.nvmlGpmSampleAlloc())


def test_samples_are_memory_the_library_owns(release: Path) -> None:
    """nvmlGpmSampleFree: InvalidArgument "if an invalid pointer is provided" (a sample freed already); a lost
    GPU answers GpuIsLost; two samples of different GPUs, or one never taken, make no metric."""
    clock = _Clock()
    node = SimulatedNode("busy", gpus=2, clock=clock, wall_clock=lambda: 1.8e9)
    lib = simulated_pynvml(node, binding=release)
    lib.nvmlInit()
    first, second = _two_samples(lib, clock, 0)
    other, _ = _two_samples(lib, clock, 1)
    with pytest.raises(lib.NVMLError_InvalidArgument):
        _metrics(lib, first, other, [SM_UTIL])
    with pytest.raises(lib.NVMLError_InvalidArgument):
        _metrics(lib, first, lib.nvmlGpmSampleAlloc(), [SM_UTIL])
    lib.nvmlGpmSampleFree(second)
    with pytest.raises(lib.NVMLError_InvalidArgument):
        lib.nvmlGpmSampleFree(second)
    handle = lib.nvmlDeviceGetHandleByIndex(0)  # taken before the GPU is lost
    node.faults.lose_gpu(0)
    with pytest.raises(lib.NVMLError_GpuIsLost):
        lib.nvmlGpmSampleGet(handle, first)


def test_the_version_is_checked(release: Path) -> None:
    """nvmlGpmMetricsGet_t.version: "Set to NVML_GPM_METRICS_GET_VERSION"; another is refused."""
    clock = _Clock()
    lib = simulated_pynvml(SimulatedNode("busy", gpus=1, clock=clock, wall_clock=lambda: 1.8e9), binding=release)
    lib.nvmlInit()
    first, second = _two_samples(lib, clock, 0)
    request = lib.c_nvmlGpmMetricsGet_t()
    request.version, request.numMetrics, request.sample1, request.sample2 = 2, 1, first, second
    with pytest.raises(lib.NVMLError_ArgumentVersionMismatch):
        lib.nvmlGpmMetricsGet(request)


def test_mig_samples_need_a_gpu_instance(release: Path) -> None:
    """nvmlGpmMigSampleGet(device, gpuInstanceId, sample) samples one MIG GPU instance; with MIG disabled (the
    simulated H100s, as the fixture's: tests/fixtures/h100/nvidia-smi-q.txt:18-19, MIG Mode Current Disabled) there
    is none of any id to sample: the library answers InvalidArgument (nvml.h names no code for it; unverified)."""
    lib = simulated_pynvml(SimulatedNode("busy", gpus=1), binding=release)
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(lib.NVMLError_InvalidArgument):
        lib.nvmlGpmMigSampleGet(handle, 0, lib.nvmlGpmSampleAlloc())


def test_a_reused_request_reads_what_the_bindings_structures_say(release: Path) -> None:
    """The backend keeps one request per GPU and reads its answers from the array's bytes at the offsets the
    binding's own nvmlGpmMetric_t declares (gpuwatch/backends/nvml_gpm_request.py): over two intervals, the same
    request gives exactly what reading each metric through pynvml's structures gives, errors left out."""
    from gpuwatch.backends.nvml_gpm_request import MetricsRequest

    clock = _Clock()
    node = SimulatedNode("training", gpus=1, clock=clock, wall_clock=lambda: 1.8e9)
    lib = simulated_pynvml(node, binding=release)
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    ids = [SM_UTIL, ANY_TENSOR, HMMA, PCIE_RX_PER_SEC, SM_CYCLES_ELAPSED]  # the last: InvalidArgument on 580
    request = MetricsRequest(lib, ids)
    samples = [lib.nvmlGpmSampleAlloc() for _ in range(3)]
    lib.nvmlGpmSampleGet(handle, samples[0])
    for first, second in itertools.pairwise(samples):
        clock.t += 5.0
        lib.nvmlGpmSampleGet(handle, second)
        lib.nvmlGpmMetricsGet(request.prepare(first, second))
        through_pynvml = {
            int(m.metricId): float(m.value) for m in request.request.metrics[: len(ids)] if int(m.nvmlReturn) == 0
        }
        assert request.answers() == through_pynvml
        assert set(through_pynvml) == {SM_UTIL, ANY_TENSOR, HMMA, PCIE_RX_PER_SEC} and through_pynvml[SM_UTIL] > 50


def test_samples_closer_than_the_refresh_hold_the_same_counters(release: Path) -> None:
    """nvml.h (go-nvml gen/nvml/nvml.h, NVML 13.3, lines 13861 and 13911): "The interval between two
    nvmlGpmSampleGet() calls should be greater than 100ms due to the internal sample refresh rate". Two samples 50 ms
    apart copy the same refresh, so they measure no interval and no share; 150 ms apart they do."""
    clock = _Clock()
    lib = simulated_pynvml(SimulatedNode("training", gpus=1, clock=clock, wall_clock=lambda: 1.8e9), binding=release)
    lib.nvmlInit()
    too_soon = _metrics(lib, *_two_samples(lib, clock, 0, seconds=0.05), [SM_UTIL])
    assert too_soon[SM_UTIL][0] == lib.NVML_ERROR_INVALID_ARGUMENT
    clock.t += 1.0
    apart = _metrics(lib, *_two_samples(lib, clock, 0, seconds=0.15), [SM_UTIL])
    assert apart[SM_UTIL][0] == lib.NVML_SUCCESS and 88.0 < apart[SM_UTIL][1] <= 100.0
