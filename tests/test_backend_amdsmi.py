"""The AMD SMI backend over AMD's own amdsmi package (7.0.2 and 6.4.3) on a simulated libamd_smi.so: AMD SMI's
quirks ("N/A" strings, 6.x vs 7.x, NotSupported calls, a library that goes away, violation status's sleep, compute
partitions, resets) and the agent's wiring (`--backend auto` with both vendors, AMD numbered after NVIDIA, no AMD
series on NVIDIA nodes). Line numbers are amdsmi 7.0.2's (amdsmi_interface.py, amdsmi_wrapper.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from amd_releases import over_releases
from simnode import SimAgent

from gpuwatch.backends.amdsmi import AmdSmiBackend, load_amdsmi
from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.config.settings import load_config
from gpuwatch.core.model import GpuSample
from gpuwatch.service.agent import Agent
from gpuwatch.service.nodes import build_sources
from gpuwatch.simulated import amdsmi_readings
from gpuwatch.simulated import node as simulation
from gpuwatch.simulated.amdsmi_clib import SimulatedLibAmdSmi, Status
from gpuwatch.simulated.amdsmi_sim import library_of, simulated_amdsmi
from gpuwatch.simulated.node import VERSION_ENV, simulated_amd_slot
from gpuwatch.simulated.scenarios import SimulatedNode


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@contextlib.contextmanager
def opened(
    release: str, scenario: str = "healthy", gpus: int = 2, **options: Any
) -> Iterator[tuple[AmdSmiBackend, SimulatedLibAmdSmi, SimulatedNode, Clock]]:
    clock = Clock()
    node = SimulatedNode(scenario, gpus=gpus, vendor="amd", clock=clock, wall_clock=lambda: 1_800_000_000.0)
    amdsmi = simulated_amdsmi(node, binding=release, **options)
    backend = AmdSmiBackend(amdsmi, clock=lambda: 1_800_000_000.0 + clock.t)
    backend.open()
    try:
        yield backend, library_of(amdsmi), node, clock
    finally:
        backend.close()


def sample(backend: AmdSmiBackend, gpu: int = 0, slow: bool = False) -> GpuSample:
    found = backend.poll(slow=slow)[gpu].sample
    assert found is not None
    return found


@over_releases
def test_both_releases_give_the_same_readings(release: str) -> None:
    """7.0.2 reads power_info's socket_power (amdsmi_interface.py:2887); 6.4.3 calls amdsmi_get_power_info_v2
    (its amdsmi_interface.py:2580) whose struct has current_socket_power only. Power caps in µW (amdsmi.h
    amdsmi_power_cap_info_t), energy in counts x counter_resolution µJ (amdsmi_interface.py:4123)."""
    with opened(release, "busy") as (backend, lib, _, clock):
        first = sample(backend, slow=True)
        clock.t = 5.0
        later = sample(backend)
    assert lib.calls["amdsmi_get_power_info_v2" if release.startswith("6.") else "amdsmi_get_power_info"] > 0
    assert 700 <= (later.power_watts or 0) <= 750
    assert later.clock_hertz["graphics"] > 1.5e9 and later.clock_hertz["sm"] == later.clock_hertz["graphics"]
    assert (later.energy_joules or 0) - (first.energy_joules or 0) == pytest.approx(5 * 748, rel=0.02)
    assert later.power_limit_watts == {"enforced": 750.0, "default": 750.0, "min": 0.0, "max": 750.0}
    assert later.memory_total_bytes == 192 * 2**30
    assert later.throttle_counter_seconds["sw_power_cap"] == pytest.approx(5.0, abs=0.3)
    assert later.throttle_active["sw_power_cap"]
    assert backend.versions()["amdsmi"] == release


@over_releases
def test_na_strings_are_left_out_never_zero(release: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library writes 0xFFFF where a value is unavailable and the vendor's Python answers "N/A"
    (amdsmi_interface.py:2343 activity, :2913 power_info); those readings are missing, not 0."""

    def no_activity(struct: Any, state: Any) -> None:
        amdsmi_readings.put(struct, {"gfx_activity": 0xFFFF, "umc_activity": 0xFFFF, "mm_activity": 0xFFFF})

    def no_power(struct: Any, state: Any) -> None:
        amdsmi_readings.put(struct, {"socket_power": 0xFFFF, "current_socket_power": 0xFFFF,
                                     "average_socket_power": 0xFFFF}, optional=("socket_power",))  # fmt: skip

    monkeypatch.setattr(amdsmi_readings, "engine_usage", no_activity)
    monkeypatch.setattr(amdsmi_readings, "power_info", no_power)
    with opened(release) as (backend, _, _, _clock):
        found = sample(backend)
    assert found.utilization_ratio is None and found.memory_utilization_ratio is None
    assert found.power_watts is None
    assert "edge" not in found.temperature_celsius  # MI300X has no edge sensor: NOT_SUPPORTED


@over_releases
def test_zero_degrees_is_not_available_never_a_reading_or_limit(release: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """amd-smi shows 0 °C as N/A: `amd-smi static --limit` turns an edge slowdown or shutdown limit of 0 into "N/A"
    (ROCm/amdsmi amdsmi_cli/amdsmi_commands.py:487-502 at 0ceca28, `if slowdown_temp_edge_limit == 0: ... "N/A"`), and
    `amd-smi metric --temperature` shows the edge temperature as N/A while its limit is 0 (:1800-1802, "If edge limit
    is reporting 0 then set the current edge temp to N/A"). amdsmi_get_temp_metric hands the library's int64 through
    unchecked (amdsmi_interface.py:4361-4382), so the backend must: a 0 °C slowdown limit would make `temperature >=
    threshold` (GpuOverheating) true on a healthy GPU, and a 0 °C reading is a sensor that is not there."""
    c = amdsmi_readings.C
    edge, hotspot, vram = (c[f"AMDSMI_TEMPERATURE_TYPE_{n}"] for n in ("EDGE", "HOTSPOT", "VRAM"))
    current, critical = c["AMDSMI_TEMP_CURRENT"], c["AMDSMI_TEMP_CRITICAL"]
    answers = {(hotspot, critical): 0, (vram, current): 0, (edge, current): 41, (edge, critical): 0}
    read = amdsmi_readings.temperature

    def zeros(spec: Any, state: Any, sensor: int, metric: int) -> int | None:
        return answers.get((sensor, metric), read(spec, state, sensor, metric))

    monkeypatch.setattr(amdsmi_readings, "temperature", zeros)
    with opened(release) as (backend, _, _, _clock):
        found = sample(backend, slow=True)
    assert ("core", "slowdown") not in found.temperature_threshold_celsius
    assert found.temperature_threshold_celsius[("core", "shutdown")] > 0  # the others are read as before
    assert found.temperature_threshold_celsius[("memory", "max_operating")] > 0
    assert "memory" not in found.temperature_celsius and "edge" not in found.temperature_celsius
    assert found.temperature_celsius["core"] > 0
    assert 0.0 not in found.temperature_celsius.values() and 0.0 not in found.temperature_threshold_celsius.values()


@over_releases
def test_bytes_amdsmi_cannot_decode_cost_that_value_not_the_gpu(release: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """amdsmi's Python decodes the library's strings itself (amdsmi_interface.py:2748 board_info's product_serial
    ``.decode("utf-8")``): a corrupt FRU EEPROM raises UnicodeDecodeError, not an AmdSmiException. The GPU is still
    enumerated and read; its serial comes from asic_info instead."""
    fill = amdsmi_readings.board_info

    def corrupt(struct: Any, spec: Any) -> None:
        fill(struct, spec)
        struct.product_serial = b"\xff\xfe\x01"

    monkeypatch.setattr(amdsmi_readings, "board_info", corrupt)
    with opened(release) as (backend, _, _, _clock):
        assert [g.serial.startswith("0x") for g in backend.gpus()] == [True, True]
        assert sample(backend).temperature_celsius["core"] > 0


@over_releases
def test_each_gpu_has_a_rocr_visible_devices_token_rocr_takes(release: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ROCR_VISIBLE_DEVICES takes device indices or GPU-<16 hex> (ROCR-Runtime amd_filter_device.cpp,
    RvdFilter::BuildDeviceUuidList: "GPU-" + the KFD node's UniqueID in 16 hex digits, upper-cased; ProcessUuidToken:
    a token that matches two devices selects none; a UniqueID of 0 never matches). amdsmi's asic_serial is that unique
    id: libamd_smi reads the driver's unique_id file into it (amd_smi.cc amdsmi_get_gpu_asic_info) and
    amdsmi_interface.py:2076-2081 formats it "0x{:016X}". amdsmi's own UUID (RFC 4122 form, amd_smi_uuid.cc) is no
    token ROCr takes. Without a unique id ("N/A", 0), or where partitions share one, the index in ROCr's enumeration:
    GPU nodes in KFD node order (amdsmi_get_gpu_kfd_info's node_id, amdsmi_interface.py:2089)."""
    with opened(release, gpus=2) as (backend, _, node, _clock):
        tokens = [r.sample.runtime_device for r in backend.poll(slow=True) if r.sample is not None]
        assert tokens == [f"GPU-{int(node.spec(i).serial, 16):016X}" for i in range(2)]
        assert all(not g.uuid.upper().startswith("GPU-") for g in backend.gpus())  # what was pinned before
    with opened(release, gpus=2, partition="CPX") as (backend, _, _, _clock):  # 8 partitions share a unique id
        tokens = [r.sample.runtime_device for r in backend.poll(slow=True) if r.sample is not None]
        assert tokens == [str(i) for i in range(16)]
    fill = amdsmi_readings.asic_info

    def no_unique_id(struct: Any, spec: Any, proc: Any) -> None:
        fill(struct, spec, proc)
        if proc.index < 2:
            struct.asic_serial = (b"0000000000000000", b"")[proc.index]  # 0, and none ("N/A")

    monkeypatch.setattr(amdsmi_readings, "asic_info", no_unique_id)
    with opened(release, gpus=3) as (backend, _, node, _clock):
        tokens = [r.sample.runtime_device for r in backend.poll(slow=True) if r.sample is not None]
        assert tokens == ["0", "1", f"GPU-{int(node.spec(2).serial, 16):016X}"]


@over_releases
def test_not_supported_is_remembered_and_not_asked_again(release: str) -> None:
    """NOT_SUPPORTED (amdsmi.h 2) raises AmdSmiLibraryException(2) (amdsmi_interface.py:698)."""
    with opened(release) as (backend, lib, node, _clock):
        node.faults.fail("amdsmi_get_gpu_vram_usage", Status.NOT_SUPPORTED, gpu=0)
        for _ in range(3):
            assert sample(backend, 0).memory_total_bytes is None
        asked = lib.calls["amdsmi_get_gpu_vram_usage"]
        sample(backend, 0)
        assert lib.calls["amdsmi_get_gpu_vram_usage"] == asked + 1  # GPU 1 only: GPU 0's answer is remembered
        assert sample(backend, 1).memory_total_bytes is not None


@over_releases
def test_violation_status_is_never_called_in_the_fast_poll(release: str) -> None:
    """It sleeps ~100 ms per call; the residency counters come from gpu_metrics instead (amdsmi_interface.py:4695,
    accumulation_counter and *_residency_acc)."""
    with opened(release, "busy", gpus=2, latency_scale=1.0) as (backend, lib, _, clock):
        for step in range(5):
            clock.t = float(step)
            backend.poll(slow=step == 0)
        assert lib.calls["amdsmi_get_violation_status"] == 0
        assert lib.calls["amdsmi_get_gpu_metrics_info"] == 10


class _SocketThermal:
    """gpu_metrics with the socket held at its thermal limit ``share`` of the time (the rest as the node says)."""

    def __init__(self, share: float) -> None:
        self.share, self.ticks, self.at = share, 0.0, 0.0
        self.fill = amdsmi_readings.residency

    def __call__(self, state: Any) -> tuple[int, dict[str, int], dict[str, bool]]:
        accumulation, ticks, active = self.fill(state)
        self.ticks += self.share * (state.elapsed - self.at) * amdsmi_readings.ACC_HZ
        self.at = state.elapsed
        ticks["socket_thm"], active["socket_thm"] = int(self.ticks), self.share > 0
        return accumulation, ticks, active


@over_releases
def test_socket_thermal_residency_is_the_firmwares_thermal_control_not_hardware_slowdown(
    release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """amdsmi.h (amdsmi_gpu_metrics_t): socket_thm_residency_acc is TVIOL, "Socket thermal violation %" =
    Δsocket_thm_residency_acc x 100 / Δaccumulation_counter: the firmware holding the socket at its own thermal limit,
    NVIDIA's sw_thermal, not hardware thermal slowdown (NVIDIA's hw_thermal: clocks cut by half or more). amd_smi.cc
    amdsmi_get_violation_status calls any per_socket_thrm > 0 "active"; a busy MI300X at 92 °C, under its 100 °C
    limit, sits there a few per cent of the time. So 3 % is counted as sw_thermal seconds but is not active (the
    backend's floor is 5 % of the poll window), and hw_thermal is never reported; 50 % is active."""
    residency = _SocketThermal(0.03)
    monkeypatch.setattr(amdsmi_readings, "residency", residency)
    hotspot, current = amdsmi_readings.C["AMDSMI_TEMPERATURE_TYPE_HOTSPOT"], amdsmi_readings.C["AMDSMI_TEMP_CURRENT"]
    read = amdsmi_readings.temperature

    def at_92(spec: Any, state: Any, sensor: int, metric: int) -> int | None:
        return 92 if (sensor, metric) == (hotspot, current) else read(spec, state, sensor, metric)

    monkeypatch.setattr(amdsmi_readings, "temperature", at_92)
    with opened(release, "busy", gpus=1) as (backend, _, _, clock):
        samples = []
        for step in range(11):
            clock.t = float(step)
            samples.append(sample(backend, slow=step == 0))
        assert samples[-1].temperature_celsius["core"] == 92.0
        assert samples[-1].temperature_celsius["core"] < samples[-1].temperature_threshold_celsius[("core", "slowdown")]
        assert samples[-1].throttle_counter_seconds["sw_thermal"] == pytest.approx(0.3, abs=0.02)
        assert all(s.throttle_active.get("sw_thermal") is False for s in samples[1:])
        assert all("hw_thermal" not in s.throttle_active for s in samples)
        assert all("hw_thermal" not in s.throttle_counter_seconds for s in samples)
        residency.share = 0.5
        for step in range(11, 14):
            clock.t = float(step)
            hot = sample(backend)
        assert hot.throttle_active["sw_thermal"] is True and "hw_thermal" not in hot.throttle_active
        assert hot.throttle_counter_seconds["sw_thermal"] == pytest.approx(0.3 + 1.5, abs=0.03)


@over_releases
def test_a_failing_gpu_is_unreadable_while_the_others_are_read(release: str) -> None:
    """A lost GPU answers AMDSMI_STATUS_NOT_FOUND (31) to every call."""
    with opened(release, gpus=3) as (backend, _, node, _clock):
        node.faults.lose_gpu(1)
        readings = backend.poll(slow=False)
    assert readings[1].sample is None and "does not answer" in (readings[1].error or "")
    assert readings[0].sample is not None and readings[2].sample is not None


@over_releases
def test_the_library_disappearing_mid_run_makes_the_backend_unavailable(release: str) -> None:
    """DRIVER_NOT_LOADED (34) from a running library; then the import itself fails: the wrapper prints and
    raises KeyError('libamd_smi.so') (amdsmi_wrapper.py:203-211)."""
    with opened(release) as (backend, _, node, _clock):
        sample(backend)
        node.faults.set_library_missing(True)  # amdgpu unloaded under the running agent
        with pytest.raises(BackendUnavailable, match="amdgpu kernel driver is not loaded"):
            backend.poll(slow=False)
        with pytest.raises(BackendUnavailable, match=r"AMD SMI library not found.*KeyError"):
            load_amdsmi(lambda: simulated_amdsmi(node, binding=release))


def test_the_agent_reports_the_library_gone_then_back(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, scenario="healthy", vendor="amd")
    try:
        sim.run(3.0)
        assert sim.value("gpuwatch_backend_up", backend="amdsmi") == 1.0
        sim.node.faults.set_library_missing(True)
        sim.run(5.0)
        assert sim.value("gpuwatch_backend_up", backend="amdsmi") == 0.0
        assert sim.value("gpuwatch_gpu_up", 0) == 0.0  # stale readings are not served
        assert "AMD SMI library not found" in sim.agent.store.snapshot().backends["amdsmi"][1]
        sim.node.faults.set_library_missing(False)
        sim.run(70.0)
        assert sim.value("gpuwatch_backend_up", backend="amdsmi") == 1.0
        assert sim.value("gpuwatch_gpu_up", 0) == 1.0
    finally:
        sim.close()


@over_releases
def test_compute_partitions_do_not_repeat_socket_readings(release: str) -> None:
    """CPX: one socket handle with 8 processor handles (amdsmi_interface.py:969 lists processors per socket);
    kfd_info's current_partition_id (:2089) tells partition 0."""
    with opened(release, "busy", gpus=2, partition="CPX") as (backend, _, _, clock):
        backend.poll(slow=True)
        clock.t = 2.0
        readings = backend.poll(slow=False)
        resets = backend.reset_uuids()
    assert len(readings) == 16 and len({r.identity.uuid for r in readings}) == 16
    assert [r.identity.index for r in readings] == list(range(16))
    with_power = [r for r in readings if r.sample is not None and r.sample.power_watts is not None]
    assert [r.identity.index for r in with_power] == [0, 8]  # partition 0 of each socket
    assert [r.sample.compute_partitions for r in with_power if r.sample is not None] == [8, 8]
    for r in readings:
        assert r.sample is not None and r.sample.mig_enabled is True
        assert r.sample.memory_total_bytes == 192 * 2**30 // 8
        if r.identity.index not in (0, 8):
            assert not r.sample.temperature_celsius and not r.sample.ecc_errors_total
            assert not r.sample.throttle_counter_seconds and r.sample.energy_joules is None
            assert r.sample.compute_partitions is None
    assert resets == [readings[0].identity.uuid, readings[8].identity.uuid]


def test_cpx_partitions_count_once_as_their_gpu_and_are_exported_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPX: 8 processor handles per socket (amdsmi_interface.py:969), each a `gpu` of its own, all behind one PCI
    device: the kernel gives each partition's KFD node the GPU's PCI address with the partition in the function bits
    (kfd_topology.c kfd_topology_add_device: `location_id |= node_id` when the device has several nodes), and the
    PCI bus (gpuwatch_gpus_expected) still has one function per GPU. gpuwatch_gpus_detected counts GPUs, so a lost
    GPU is one fewer than expected (GpuCountBelowExpected: detected < expected); partition 0 says how many partitions
    its GPU has (gpuwatch_gpu_partitions), every partition keeps its own series."""

    def cpx(node: SimulatedNode, *, clock: Callable[[], float] | None = None) -> AmdSmiBackend:
        assert clock is not None
        return AmdSmiBackend(load_amdsmi(lambda: simulated_amdsmi(node, partition="CPX")), clock=clock)

    monkeypatch.setattr(simulation, "simulated_amd_backend", cpx)
    sim = SimAgent(tmp_path, scenario="healthy", gpus=2, vendor="amd")
    try:
        sim.run(3.0)
        assert sim.value("gpuwatch_gpus_expected", vendor="amd") == 2.0
        assert sim.value("gpuwatch_gpus_detected") == 2.0
        assert [sim.value("gpuwatch_gpu_up", gpu) for gpu in range(16)] == [1.0] * 16
        partitions = {
            dict(labels)["gpu"]: value for (name, labels), value in sim.samples().items()
            if name == "gpuwatch_gpu_partitions"
        }  # fmt: skip
        assert partitions == {"0": 8.0, "8": 8.0}
        sim.node.faults.lose_gpu(1)
        sim.run(3.0)
        assert sim.value("gpuwatch_gpus_detected") == 1.0
        assert [sim.value("gpuwatch_gpu_up", gpu) for gpu in range(16)] == [1.0] * 8 + [0.0] * 8
    finally:
        sim.close()


def test_without_partitions_each_gpu_has_one(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, scenario="healthy", gpus=2, vendor="amd")
    try:
        sim.run(2.0)
        assert sim.value("gpuwatch_gpus_detected") == 2.0
        assert [sim.value("gpuwatch_gpu_partitions", gpu) for gpu in range(2)] == [1.0, 1.0]
    finally:
        sim.close()


@over_releases
def test_reset_events_from_the_event_reader_no_data_is_no_event(release: str) -> None:
    """AmdSmiEventReader.read (amdsmi_interface.py:587) raises NO_DATA (40) when nothing came. Its events name the
    GPU by a c_void_p in 7.0.2 (:603) but by the raw int address in 6.4.3 (its amdsmi_interface.py:560): both
    must find the GPU."""
    with opened(release, gpus=2) as (backend, _, node, _clock):
        assert backend.wait_events(0.0) == []
        node.faults.emit_reset(1)
        events = backend.wait_events(0.5)
        assert [(e.kind, e.uuid, e.source) for e in events] == [("reset", backend.gpus()[1].uuid, "amdsmi")]


@over_releases
def test_amd_gpus_are_numbered_after_nvidia_when_both_are_on_the_node(release: str) -> None:
    nvidia = SimulatedNode("healthy", gpus=4, vendor="nvidia")
    amd = SimulatedNode("healthy", gpus=2, vendor="amd")
    offset: Callable[[], int] = lambda: nvidia.gpu_count  # noqa: E731 - the PCI count, as build_sources asks it
    backend = AmdSmiBackend(load_amdsmi(lambda: simulated_amdsmi(amd, binding=release)), index_offset=offset)
    backend.open()
    try:
        assert [g.index for g in backend.gpus()] == [4, 5]
    finally:
        backend.close()


def test_the_simulated_agent_runs_the_release_it_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPUWATCH_SIM_AMDSMI_VERSION picks the amdsmi release of `--backend simulated`; one that is not there fails
    at start-up, naming where it should be."""
    node = SimulatedNode("healthy", gpus=1, vendor="amd")
    monkeypatch.setenv(VERSION_ENV, "6.1.2")
    with pytest.raises(ValueError, match=r"GPUWATCH_SIM_AMDSMI_VERSION='6.1.2'.*amdsmi-6.1.2"):
        simulated_amd_slot(node)
    monkeypatch.setenv(VERSION_ENV, "7.0.2")
    backend = simulated_amd_slot(node).factory()
    backend.open()
    try:
        assert backend.versions()["amdsmi"] == "7.0.2"
    finally:
        backend.close()


def _sysfs(root: Path, nvidia: int, amd: int) -> Path:
    for i in range(nvidia):
        _device(root, f"0000:{0x18 + i:02x}:00.0", "0x10de", "0x030200")
    for i in range(amd):
        _device(root, f"0000:{0x85 + i:02x}:00.0", "0x1002", "0x038000")
    return root


def _device(root: Path, address: str, vendor: str, pci_class: str) -> None:
    device = root / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    (device / "vendor").write_text(f"{vendor}\n")
    (device / "class").write_text(f"{pci_class}\n")


def test_auto_on_a_mixed_node_exports_both_backends(tmp_path: Path) -> None:
    """Both vendors on the bus, neither library installed here: both are needed, both say why they are down."""
    config = load_config(None, {"agent": {"backend": "auto", "state_dir": str(tmp_path / "state")}})
    sources = build_sources(config, sysfs_root=_sysfs(tmp_path / "sys", nvidia=2, amd=2))
    assert [(s.name, s.vendor) for s in sources.slots] == [("nvml", "nvidia"), ("amdsmi", "amd")]
    agent = Agent(config, sources)
    agent.poll_once()
    backends = agent.store.snapshot().backends
    assert backends["amdsmi"][0] is False and "AMD SMI" in backends["amdsmi"][1]
    assert backends["nvml"][0] is False
    assert agent.store.snapshot().gpus_expected == {"amd": 2, "nvidia": 2}


def test_auto_on_an_nvidia_node_has_no_amd_backend(tmp_path: Path) -> None:
    config = load_config(None, {"agent": {"backend": "auto", "state_dir": str(tmp_path / "state")}})
    sources = build_sources(config, sysfs_root=_sysfs(tmp_path / "sys", nvidia=2, amd=0))
    assert [s.name for s in sources.slots] == ["nvml"]


@over_releases
def test_the_bad_page_threshold_is_the_drivers_own_limit(release: str) -> None:
    """amdsmi 7.0.2 amdsmi_interface.py:2406 amdsmi_get_gpu_bad_page_threshold (a uint32 through a pointer; 6.4.3
    has no such function): amdgpu's default is one page per 100 MiB of VRAM (amdgpu_ras.c
    amdgpu_ras_validate_threshold), 1966 on a 192 GiB MI300X; past it the driver refuses the GPU at the next boot."""
    with opened(release, "row_remap_failure", gpus=3) as (backend, _, _, _):
        faulty = sample(backend, gpu=2, slow=True)
    assert faulty.retired_pages is not None and faulty.retired_pages > 0
    assert faulty.retired_pages_limit == (1966 if release.startswith("7.") else None)
