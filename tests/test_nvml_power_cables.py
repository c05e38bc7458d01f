"""A GPU whose external power cables are not attached: counted, unusable, and said so.

nvml.h, nvmlDeviceGetHandleByIndex_v2: "NVML_ERROR_INSUFFICIENT_POWER if any attached devices have improperly
attached external power cables". The GPU is on the bus and in nvmlDeviceGetCount, but NVML gives no handle, so it has
no UUID and no readings; before, the backend logged a debug line and the GPU simply vanished.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from simnode import SimAgent

from gpuwatch.backends.nvml import NvmlBackend
from gpuwatch.simulated.bindings import simulated_pynvml
from gpuwatch.simulated.nvml_constants import NVML_ERROR_INSUFFICIENT_POWER
from gpuwatch.simulated.scenarios import SimulatedNode


def test_the_backend_counts_an_unpowered_gpu_as_present_but_unusable(caplog: pytest.LogCaptureFixture) -> None:
    node = SimulatedNode("healthy", gpus=4, clock=lambda: 5.0, wall_clock=lambda: 1.8e9)
    node.faults.fail("nvmlDeviceGetHandleByIndex_v2", NVML_ERROR_INSUFFICIENT_POWER, gpu=2)
    backend = NvmlBackend(simulated_pynvml(node), index_offset=0)
    backend.open()
    try:
        assert [gpu.index for gpu in backend.gpus()] == [0, 1, 3]
        assert [(gpu.index, gpu.reason) for gpu in backend.unusable()] == [(2, "insufficient_power")]
        assert any("power cables are not properly attached" in r.getMessage() for r in caplog.records)
    finally:
        backend.close()
    assert backend.unusable() == []


def test_the_agent_exports_it_and_counts_it_as_detected(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, gpus=4)
    sim.node.faults.fail("nvmlDeviceGetHandleByIndex_v2", NVML_ERROR_INSUFFICIENT_POWER, gpu=1)
    try:
        sim.run(3)
        unpowered = {labels: v for (name, labels), v in sim.samples().items() if name.endswith("insufficient_power")}
        assert unpowered == {frozenset({("gpu", "1"), ("pci_bus_id", "")}): 1.0}  # no handle: no PCI bus id
        assert sim.value("gpuwatch_gpus_detected") == 4.0  # present (the cables, not a missing GPU)
        assert sim.value("gpuwatch_backend_up", backend="nvml") == 1.0
        assert {dict(labels)["gpu"] for name, labels in sim.samples() if name == "gpuwatch_gpu_up"} == {"0", "2", "3"}
    finally:
        sim.close()
