"""Regressions found in review: each test fails on the code before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from simnode import START_WALL, SimAgent

from gpuwatch.config import ConfigError, load_config
from gpuwatch.kmsg import KernelLogXidReader
from gpuwatch.model import GpuEvent, GpuIdentity, GpuReading
from gpuwatch.store import SampleStore


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_losing_gpu_0_never_stops_the_other_gpus(tmp_path: Path, vendor: str) -> None:
    sim = SimAgent(tmp_path, scenario="healthy", gpus=4, vendor=vendor)
    sim.run(2.0)
    sim.node.faults.lose_gpu(0)
    sim.run(70.0)  # past two slow polls: the driver-version check asks a GPU too
    assert sim.value("gpuwatch_gpu_up", 0) == 0.0
    for gpu in (1, 2, 3):
        assert sim.value("gpuwatch_gpu_up", gpu) == 1.0, gpu
    assert sim.agent.health()[0]
    sim.close()


def test_unknown_scenario_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {"simulated": {"scenario": "nosuch"}})
    assert info.value.key == "simulated.scenario"


def test_xids_stay_exported_after_the_gpu_is_lost() -> None:
    store = SampleStore(poll_interval_seconds=1.0, clock=lambda: 1000.0)
    gpu = GpuIdentity("GPU-x", "nvidia", 0)
    store.add_events([GpuEvent("GPU-x", "xid", 999.0, code=79, source="nvml")])
    store.record_poll([GpuReading(gpu, None, "the GPU is lost")])
    from prometheus_client import CollectorRegistry

    from gpuwatch.exporter import GpuwatchCollector

    registry = CollectorRegistry()
    registry.register(GpuwatchCollector(store))
    labels = {"gpu": "0", "uuid": "GPU-x", "xid": "79"}
    assert registry.get_sample_value("gpuwatch_gpu_up", {"gpu": "0", "uuid": "GPU-x"}) == 0.0
    assert registry.get_sample_value("gpuwatch_gpu_xid_last_timestamp_seconds", labels) == 999.0


def test_kernel_xids_logged_before_the_gpu_is_known_are_kept(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("")
    boot = START_WALL - 60.0
    sim = SimAgent(tmp_path / "state", scenario="backend_down", kernel_log=KernelLogXidReader(log, boot_time=boot))
    domain, bus, rest = sim.node.spec(2).pci_bus_id.split(":")
    kernel_bus = f"{domain[-4:]}:{bus.lower()}:{rest.split('.')[0].lower()}"
    log.write_text(f"3,1,{50 * 1_000_000},-;NVRM: Xid (PCI:{kernel_bus}): 79, pid=1, name=x, fell off\n")
    sim.run(3.0)  # the driver is not loaded: no GPU is known yet, the XID waits
    sim.node.faults.set_library_missing(False)
    sim.run(70.0)
    assert sim.value("gpuwatch_gpu_xid_errors_total", 2, xid="79") == 1.0
    assert sim.value("gpuwatch_gpu_xid_last_timestamp_seconds", 2, xid="79") == boot + 50.0
    sim.close()
