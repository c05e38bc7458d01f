"""Memory, board and link health an operator acts on: spare rows left, the InfoROM, the NVSwitch fabric and PCIe
errors, read through the real pynvml from the simulated libnvidia-ml."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuwatch.backends.nvml import NvmlBackend
from gpuwatch.core.model import GpuSample
from gpuwatch.simulated.bindings import simulated_pynvml
from gpuwatch.simulated.nvml_constants import NVML_ERROR_CORRUPTED_INFOROM
from gpuwatch.simulated.scenarios import SimulatedNode


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def samples(node: SimulatedNode) -> Iterator[list[GpuSample]]:
    backend = NvmlBackend(simulated_pynvml(node))
    backend.open()
    try:
        while True:
            readings = backend.poll(slow=True)
            yield [r.sample for r in readings if r.sample is not None]
    finally:
        backend.close()


def first_poll(scenario: str = "healthy", gpus: int = 2, **options: object) -> list[GpuSample]:
    node = SimulatedNode(scenario, gpus=gpus, clock=Clock(), wall_clock=lambda: 1.8e9, **options)  # type: ignore[arg-type]
    return next(samples(node))


def test_healthy_h100_reads_like_its_nvidia_smi() -> None:
    """tests/fixtures/h100/nvidia-smi-q.txt: "Bank Remap Availability Histogram: Max 2560 bank(s)", the rest 0;
    "Fabric State: N/A" on a GPU outside an NVSwitch system (nvmlGpuFabricState NOT_SUPPORTED: no series);
    NVML_FI_DEV_PCIE_COUNT_{CORRECTABLE_ERRORS,NON_FATAL_ERROR,FATAL_ERROR} (nvml.h ids 173, 179, 180) filled."""
    sample = first_poll()[0]
    assert sample.row_remap_banks == {"max": 2560, "high": 0, "partial": 0, "low": 0, "none": 0}
    assert sample.inforom_valid is True
    assert sample.fabric_healthy is None
    assert sample.pcie_errors_total == {"correctable": 0, "non_fatal": 0, "fatal": 0}


def test_a_failed_row_remap_leaves_a_bank_without_spares() -> None:
    """nvml.h, nvmlRowRemapperHistogramValues_t: banks by remaining spare rows; a failed remap is a bank with none."""
    faulty = first_poll("row_remap_failure", gpus=3)[2]
    assert faulty.row_remap_failed is True
    assert faulty.row_remap_banks["none"] == 1 and sum(faulty.row_remap_banks.values()) == 2560


def test_a_corrupted_inforom_is_reported_on_its_gpu_only() -> None:
    """nvml.h, nvmlDeviceValidateInforom: NVML_ERROR_CORRUPTED_INFOROM if the device's infoROM is corrupted."""
    node = SimulatedNode("healthy", gpus=2, clock=Clock(), wall_clock=lambda: 1.8e9)
    node.faults.fail("nvmlDeviceValidateInforom", NVML_ERROR_CORRUPTED_INFOROM, gpu=1)
    assert [s.inforom_valid for s in next(samples(node))] == [True, False]


def test_an_nvswitch_system_reports_fabric_registration() -> None:
    """nvml.h, nvmlGpuFabricInfoV_t: state NVML_GPU_FABRIC_STATE_COMPLETED (3) with status NVML_SUCCESS once the
    fabric manager registered the GPU; an HGX node (NVLink) has a fabric."""
    assert [s.fabric_healthy for s in first_poll(nvlink=True)] == [True, True]


def test_pcie_errors_grow_on_a_degraded_link() -> None:
    node = SimulatedNode("pcie_degraded", gpus=3, clock=(clock := Clock()), wall_clock=lambda: 1.8e9)
    polls = samples(node)
    before = next(polls)[2].pcie_errors_total["correctable"]
    clock.now += 30
    after = next(polls)[2].pcie_errors_total
    assert after["correctable"] > before and after["fatal"] == after["non_fatal"] == 0


@pytest.mark.parametrize("release", ["installed", "12.570.86"])
def test_the_signals_read_the_same_under_the_oldest_binding(release: str) -> None:
    """pynvml 12.570.86 has nvmlDeviceGetRowRemapperHistogram, nvmlDeviceValidateInforom and c_nvmlGpuFabricInfoV_t
    (version 2) too: the same answers through it."""
    from nvml_bindings import binding_path

    node = SimulatedNode("healthy", gpus=1, clock=Clock(), wall_clock=lambda: 1.8e9, nvlink=True)
    backend = NvmlBackend(simulated_pynvml(node, binding=binding_path(release)))
    backend.open()
    try:
        sample = backend.poll(slow=True)[0].sample
        assert sample is not None
        assert (sample.row_remap_banks["max"], sample.inforom_valid, sample.fabric_healthy) == (2560, True, True)
    finally:
        backend.close()


def test_links_without_dl_counters_count_errors_in_the_nvlink_count_fields() -> None:
    """Blackwell answers NotSupported for the per-link DL counters (nvmlDeviceGetNvLinkErrorCounter) and counts
    link errors in the NVML_FI_DEV_NVLINK_COUNT_* fields instead, scoped to the link (nvml.h: "scopeId: link
    index"; LINK_RECOVERY_EVENTS 215, LINK_RECOVERY_FAILED_EVENTS 214, EFFECTIVE_ERRORS 219, SYMBOL_ERRORS 221)."""
    node = SimulatedNode("healthy", gpus=1, clock=Clock(), wall_clock=lambda: 1.8e9, nvlink=True)
    for link in range(18):
        for counter in range(5):  # nvmlNvLinkErrorCounter_t: DL_REPLAY .. DL_ECC_DATA
            node.faults.set_nvlink_errors(0, link, counter, None)
    for field_id, count in ((215, 4), (214, 1), (219, 2), (221, 96)):
        node.faults.field(field_id, value=count, value_type=3)  # unsigned long long
    errors = next(samples(node))[0].nvlink_errors_total
    assert errors[("0", "recovery")] == 4 and errors[("0", "recovery_failed")] == 1
    assert errors[("17", "effective")] == 2 and errors[("17", "symbol")] == 96
    assert ("0", "replay") not in errors  # nothing from the counters the driver does not keep


def test_hopper_links_keep_their_dl_counters_and_ask_no_fields() -> None:
    """An H100's links answer the DL counters; the COUNT fields are not asked for (no second source, no double
    count)."""
    node = SimulatedNode("healthy", gpus=1, clock=Clock(), wall_clock=lambda: 1.8e9, nvlink=True)
    node.faults.set_nvlink_errors(0, 3, 0, 7)  # DL_REPLAY on link 3
    node.faults.field(215, value=99, value_type=3)  # would show if the fields were read
    errors = next(samples(node))[0].nvlink_errors_total
    assert errors[("3", "replay")] == 7 and ("3", "recovery_failed") not in errors
    assert {kind for _link, kind in errors} == {"replay", "recovery", "crc", "ecc"}


def test_sram_ecc_threshold_is_read_per_gpu() -> None:
    """nvml.h, nvmlDeviceGetSramEccErrorStatus (nvmlEccSramErrorStatus_v1_t.bThresholdExceeded): the fixture H100
    reads "SRAM Threshold Exceeded: No" (tests/fixtures/h100/nvidia-smi-q.txt); a GPU past it reads 1."""
    node = SimulatedNode("healthy", gpus=2, clock=Clock(), wall_clock=lambda: 1.8e9)
    node.faults.exceed_sram_ecc_threshold(1)
    assert [s.sram_ecc_threshold_exceeded for s in next(samples(node))] == [False, True]
