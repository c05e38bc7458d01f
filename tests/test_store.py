"""SampleStore and the collector: accumulation, staleness, de-duplication — asserted through real families."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry

from gpuwatch.core.model import GpuEvent, GpuIdentity, GpuReading, GpuSample
from gpuwatch.exposition.exporter import SnapshotExporter
from gpuwatch.state.store import SampleStore

GPU0 = GpuIdentity("GPU-0", "nvidia", 0, "NVIDIA H100 80GB HBM3", "1", "00000000:18:00.0", "580.159.04", "96")
GPU1 = GpuIdentity("GPU-1", "nvidia", 1, "NVIDIA H100 80GB HBM3", "2", "00000000:2A:00.0", "580.159.04", "96")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def setup() -> tuple[SampleStore, Clock, CollectorRegistry]:
    clock = Clock()
    store = SampleStore(poll_interval_seconds=1.0, clock=clock)
    registry = CollectorRegistry()
    registry.register(SnapshotExporter(store))
    return store, clock, registry


def sample(uuid: str, ts: float, **kw: object) -> GpuSample:
    return GpuSample(uuid=uuid, timestamp=ts, **kw)  # type: ignore[arg-type]


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_throttle_time_accumulates_from_flags_between_polls() -> None:
    store, clock, registry = setup()
    for i in range(6):
        active = {"hw_power_brake": 2 <= i <= 4, "gpu_idle": i < 2}
        store.record_poll([GpuReading(GPU0, sample("GPU-0", clock.now, throttle_active=active))])
        clock.now += 1.0
    clock.now -= 1.0
    got = value(registry, "gpuwatch_gpu_throttle_seconds_total", gpu="0", uuid="GPU-0", reason="hw_power_brake")
    assert got == 3.0
    assert value(registry, "gpuwatch_gpu_throttle_seconds_total", gpu="0", uuid="GPU-0", reason="gpu_idle") == 1.0


def test_device_counters_win_and_counter_resets_fall_back_to_flags() -> None:
    store, clock, registry = setup()
    counters = [100.0, 100.9, 101.8, 0.5]  # the driver reloaded before the last poll
    for c in counters:
        s = sample(
            "GPU-0", clock.now, throttle_active={"sw_power_cap": True}, throttle_counter_seconds={"sw_power_cap": c}
        )
        store.record_poll([GpuReading(GPU0, s)])
        clock.now += 1.0
    clock.now -= 1.0
    got = value(registry, "gpuwatch_gpu_throttle_seconds_total", gpu="0", uuid="GPU-0", reason="sw_power_cap")
    assert got is not None and abs(got - (0.9 + 0.9 + 1.0)) < 1e-9


def test_known_reasons_exist_from_start_at_zero() -> None:
    store, clock, registry = setup()
    store.record_poll([GpuReading(GPU0, sample("GPU-0", clock.now, throttle_active={"hw_thermal": False}))])
    assert value(registry, "gpuwatch_gpu_throttle_seconds_total", gpu="0", uuid="GPU-0", reason="hw_thermal") == 0.0


def test_gap_the_agent_did_not_watch_is_not_counted() -> None:
    store, clock, registry = setup()
    store.record_poll([GpuReading(GPU0, sample("GPU-0", clock.now, throttle_active={"hw_thermal": True}))])
    clock.now += 100.0  # the poll hung for 100 s
    store.record_poll([GpuReading(GPU0, sample("GPU-0", clock.now, throttle_active={"hw_thermal": True}))])
    assert value(registry, "gpuwatch_gpu_throttle_seconds_total", gpu="0", uuid="GPU-0", reason="hw_thermal") == 3.0


def test_stale_readings_are_never_served() -> None:
    store, clock, registry = setup()
    store.record_poll([GpuReading(GPU0, sample("GPU-0", clock.now, power_watts=70.0))])
    assert value(registry, "gpuwatch_gpu_up", gpu="0", uuid="GPU-0") == 1.0
    assert value(registry, "gpuwatch_gpu_power_watts", gpu="0", uuid="GPU-0") == 70.0
    clock.now += 3.5
    assert value(registry, "gpuwatch_gpu_up", gpu="0", uuid="GPU-0") == 0.0
    assert value(registry, "gpuwatch_gpu_power_watts", gpu="0", uuid="GPU-0") is None
    assert value(registry, "gpuwatch_gpus_detected") == 0.0
    info = dict(
        gpu="0",
        uuid="GPU-0",
        vendor="nvidia",
        model=GPU0.model,
        serial="1",
        pci_bus_id=GPU0.pci_bus_id,
        driver_version="580.159.04",
        vbios_version="96",
    )
    assert value(registry, "gpuwatch_gpu_info", **info) == 1.0


def test_lost_gpu_keeps_only_up_and_info_while_others_read() -> None:
    store, clock, registry = setup()
    store.record_poll(
        [
            GpuReading(GPU0, None, "GPU is lost"),
            GpuReading(GPU1, sample("GPU-1", clock.now, power_watts=71.0)),
        ]
    )
    assert value(registry, "gpuwatch_gpu_up", gpu="0", uuid="GPU-0") == 0.0
    assert value(registry, "gpuwatch_gpu_up", gpu="1", uuid="GPU-1") == 1.0
    assert value(registry, "gpuwatch_gpus_detected") == 1.0


def test_known_gpu_from_an_earlier_run_is_lost_until_found() -> None:
    store, _clock, registry = setup()
    store.add_known([GPU0])
    assert value(registry, "gpuwatch_gpu_up", gpu="0", uuid="GPU-0") == 0.0


def test_missing_readings_are_absent_not_zero() -> None:
    store, clock, registry = setup()
    store.record_poll([GpuReading(GPU0, sample("GPU-0", clock.now))])
    for name in ("gpuwatch_gpu_power_watts", "gpuwatch_gpu_retired_pages", "gpuwatch_gpu_processes"):
        assert value(registry, name, gpu="0", uuid="GPU-0") is None


def test_configured_power_limit_is_exported_beside_the_device_limits() -> None:
    store, clock, registry = setup()
    store.configure(store.poll_interval_seconds, 650.0)
    store.record_poll([GpuReading(GPU0, sample("GPU-0", clock.now, power_limit_watts={"enforced": 700.0}))])
    assert value(registry, "gpuwatch_gpu_power_limit_watts", gpu="0", uuid="GPU-0", limit="configured") == 650.0
    assert value(registry, "gpuwatch_gpu_power_limit_watts", gpu="0", uuid="GPU-0", limit="enforced") == 700.0


def test_xid_from_nvml_and_kernel_log_counts_once() -> None:
    store, clock, registry = setup()
    store.record_poll([GpuReading(GPU0, sample("GPU-0", clock.now))])
    store.add_events([GpuEvent("GPU-0", "xid", clock.now - 1.0, code=79, source="kmsg")])
    store.add_events([GpuEvent("GPU-0", "xid", clock.now, code=79, source="nvml")])  # the same event
    store.add_events([GpuEvent("GPU-0", "xid", clock.now - 1.0, code=79, source="kmsg")])  # re-read
    store.add_events([GpuEvent("GPU-0", "xid", clock.now - 500.0, code=13, source="kmsg")])
    labels = dict(gpu="0", uuid="GPU-0")
    assert value(registry, "gpuwatch_gpu_xid_errors_total", xid="79", **labels) == 1.0
    assert value(registry, "gpuwatch_gpu_xid_last_timestamp_seconds", xid="79", **labels) == clock.now - 1.0
    assert value(registry, "gpuwatch_gpu_xid_last_timestamp_seconds", xid="13", **labels) == clock.now - 500.0
    store.add_events([GpuEvent("GPU-0", "xid", clock.now + 60.0, code=79, source="nvml")])
    assert value(registry, "gpuwatch_gpu_xid_errors_total", xid="79", **labels) == 2.0


def test_collector_status_and_backend_up() -> None:
    store, clock, registry = setup()
    store.register_collector("nvml", 1.0)
    assert value(registry, "gpuwatch_collector_interval_seconds", collector="nvml") == 1.0
    # Failures are counted from the first (no rule reads the count from 0: the series budget).
    assert value(registry, "gpuwatch_collector_errors_total", collector="nvml") is None
    assert value(registry, "gpuwatch_collector_success", collector="nvml") is None
    # a first run that hangs still ages: the start time stands in for a last run
    started = clock.now
    assert value(registry, "gpuwatch_collector_last_run_timestamp_seconds", collector="nvml") == started
    clock.now += 30.0
    store.register_collector("nvml", 1.0)  # a reload re-registers: the start time stays
    assert value(registry, "gpuwatch_collector_last_run_timestamp_seconds", collector="nvml") == started
    store.record_collector_run("nvml", success=False, duration_seconds=0.002)
    store.set_backend("nvml", False, "driver not loaded")
    assert value(registry, "gpuwatch_collector_success", collector="nvml") == 0.0
    assert value(registry, "gpuwatch_collector_errors_total", collector="nvml") == 1.0
    assert value(registry, "gpuwatch_collector_last_run_timestamp_seconds", collector="nvml") == clock.now
    assert value(registry, "gpuwatch_backend_up", backend="nvml") == 0.0


def test_xids_stay_exported_after_the_gpu_is_lost() -> None:
    """Found in review: a lost GPU's XID series vanished with its readings, though an XID 79 usually comes with the GPU
    going lost."""
    store, _clock, registry = setup()
    gpu = GpuIdentity("GPU-x", "nvidia", 0)
    store.add_events([GpuEvent("GPU-x", "xid", 999_999.0, code=79, source="nvml")])
    store.record_poll([GpuReading(gpu, None, "the GPU is lost")])
    labels = {"gpu": "0", "uuid": "GPU-x", "xid": "79"}
    assert value(registry, "gpuwatch_gpu_up", gpu="0", uuid="GPU-x") == 0.0
    assert registry.get_sample_value("gpuwatch_gpu_xid_last_timestamp_seconds", labels) == 999_999.0


def test_a_reload_changes_the_store_under_its_lock() -> None:
    """A reload (the main thread) changes the poll interval and the configured power limit that the poll thread and
    every scrape read: under the store's lock, so a snapshot sees the old pair or the new one, never one of each."""
    store, _clock, _registry = setup()
    store.configure(1.0, 500.0)
    reload = threading.Thread(target=store.configure, args=(5.0, 650.0), name="reload")
    with store._lock:  # a poll or a snapshot in progress
        reload.start()
        reload.join(0.2)
        assert reload.is_alive(), "configure() wrote without the store's lock"
        assert (store.poll_interval_seconds, store.configured_power_limit_watts) == (1.0, 500.0)
    reload.join(5)
    snap = store.snapshot()
    assert (snap.poll_interval_seconds, snap.configured_power_limit_watts) == (5.0, 650.0)
    with pytest.raises(AttributeError):
        store.poll_interval_seconds = 2.0  # type: ignore[misc]  # read-only: configure() is the one way in


def test_gpus_a_hung_call_froze_are_not_lost_until_the_next_poll_could_read_them() -> None:
    """A poll hung in a vendor call reads no GPU; once the call returns, the GPUs it froze stay "frozen", not lost,
    for STALE_AFTER_POLLS poll intervals: long enough for the next poll to read them. Without that, the moment
    between the call's return and that poll judged them lost, and the fault ledger held a GpuLost that never was."""
    from gpuwatch.core.model import StuckCall
    from gpuwatch.judge.findings import frozen_by, health_flags, views

    store, clock, registry = setup()
    store.record_poll([GpuReading(GPU0, sample("GPU-0", clock.now)), GpuReading(GPU1, sample("GPU-1", clock.now))])
    hung = StuckCall("nvml", "nvmlDeviceGetPowerUsage", "1", "GPU-1", clock.now)
    store.set_stuck_calls((hung,))
    clock.now += 10.0  # both GPUs' readings long stale
    assert frozen_by(store.snapshot(), "GPU-0") == hung
    store.set_stuck_calls(())  # the call returned; the poll has not stored its readings yet
    clock.now += 1.0
    snap = store.snapshot()
    assert [f.alert for v in views(snap) for f in health_flags(v)] == ["GpuwatchVendorCallHung"] * 2
    assert value(registry, "gpuwatch_gpus_detected") == 2.0
    clock.now += 3.0  # past STALE_AFTER_POLLS poll intervals and still no reading: now they are lost
    snap = store.snapshot()
    assert [f.alert for v in views(snap) for f in health_flags(v)] == ["GpuLost"] * 2
    assert value(registry, "gpuwatch_gpus_detected") == 0.0
