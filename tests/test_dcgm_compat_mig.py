"""`[compat] dcgm` on a MIG node (issue #35): dcgm-exporter's series for a MIG-enabled GPU, through the real agent,
backend and simulated libnvidia-ml on scenario `mig` (GPU 2: a 3g.40gb with a training job, two 2g.20gb).

What dcgm-exporter writes (NVIDIA/dcgm-exporter d5e5f51): its default device option, flex (pkg/cmd/app.go:204-210),
watches each GPU instance of a MIG-enabled GPU instead of the GPU (internal/pkg/devicemonitoring/
device_monitoring.go:97-129), and each series of an instance carries GPU_I_PROFILE and GPU_I_ID after modelName
(internal/pkg/rendermetrics/render_metrics.go:47; the values: the instance's profile name and NVML's GPU instance ID
in decimal, internal/pkg/collector/gpu_collector.go:350-356); a GPU without MIG carries neither. DCGM answers the
framebuffer and profiling fields for the instance and repeats the GPU's clocks, temperatures and power on each
(issues #50, #317 and #736 of NVIDIA/dcgm-exporter show such scrapes).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from simnode import SimAgent

from gpuwatch.simulated.mig import MigInstanceSpec

MIG_GPU = "2"
MIB = 2**20
PER_INSTANCE_GPM = {
    "DCGM_FI_PROF_SM_ACTIVE": "gpuwatch_mig_sm_active_ratio",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gpuwatch_mig_tensor_active_ratio",
    "DCGM_FI_PROF_DRAM_ACTIVE": "gpuwatch_mig_dram_active_ratio",
}

Scrape = list[tuple[str, dict[str, str], float]]


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimAgent]:
    agent = SimAgent(tmp_path, "mig", probe={"interval_seconds": 0}, sections={"compat": {"dcgm": True}})
    yield agent
    agent.close()


def scrape(sim: SimAgent) -> Scrape:
    """Every sample of one GET /metrics, as Prometheus parses it."""
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(sim.text())
        for sample in family.samples
    ]


def dcgm(samples: Scrape, gpu: str) -> Scrape:
    return [
        (name, labels, value) for name, labels, value in samples if name.startswith("DCGM_") and labels["gpu"] == gpu
    ]


def own(samples: Scrape, name: str, gpu: str, **labels: str) -> float | None:
    found = [v for n, got, v in samples if n == name and got["gpu"] == gpu and labels.items() <= got.items()]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def test_a_mig_gpu_s_families_are_one_series_per_gpu_instance_with_its_id_and_profile(sim: SimAgent) -> None:
    sim.run(3)
    samples = scrape(sim)
    series = dcgm(samples, MIG_GPU)
    names = {name for name, _, _ in series}
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED"} <= names
    for name in names:  # no series of the GPU itself: each of its instances, once
        instances = sorted(
            (labels.get("GPU_I_ID"), labels.get("GPU_I_PROFILE")) for n, labels, _ in series if n == name
        )
        assert instances == [("1", "3g.40gb"), ("5", "2g.20gb"), ("6", "2g.20gb")], name
    parent = next(labels for name, labels, _ in samples if name == "gpuwatch_gpu_info" and labels["gpu"] == MIG_GPU)
    assert all(labels["UUID"] == parent["uuid"] and labels["device"] == "nvidia2" for _, labels, _ in series)
    for gpu in ("0", "1", "3"):  # without MIG: neither label, one series per family as before
        plain = dcgm(samples, gpu)
        assert plain and not [labels for _, labels, _ in plain if {"GPU_I_ID", "GPU_I_PROFILE"} & labels.keys()]
        assert len({name for name, _, _ in plain}) == len(plain)


def test_memory_and_activity_are_the_instance_s_and_the_rest_the_gpu_s(sim: SimAgent) -> None:
    sim.run(3)
    samples = scrape(sim)
    series = {(name, labels["GPU_I_ID"]): value for name, labels, value in dcgm(samples, MIG_GPU)}
    for gi, profile in (("1", "3g.40gb"), ("5", "2g.20gb"), ("6", "2g.20gb")):
        at = {"gpu_instance_id": gi, "compute_instance_id": "0", "mig_profile": profile}
        used = own(samples, "gpuwatch_mig_memory_used_bytes", MIG_GPU, **at)
        total = own(samples, "gpuwatch_mig_memory_total_bytes", MIG_GPU, **at)
        assert used is not None and total is not None
        assert series[("DCGM_FI_DEV_FB_USED", gi)] == math.floor(used / MIB)  # whole MiB, as DCGM shifts bytes
        assert series[("DCGM_FI_DEV_FB_TOTAL", gi)] == math.floor(total / MIB)
        assert series[("DCGM_FI_DEV_FB_FREE", gi)] == math.floor((total - used) / MIB)
        for field, source in PER_INSTANCE_GPM.items():
            assert series[(field, gi)] == own(samples, source, MIG_GPU, **at)
        # The GPU's own values on each instance, as DCGM answers a GPU instance's device fields.
        assert series[("DCGM_FI_DEV_GPU_TEMP", gi)] == own(
            samples, "gpuwatch_gpu_temperature_celsius", MIG_GPU, sensor="core"
        )
        assert series[("DCGM_FI_DEV_POWER_USAGE", gi)] == own(samples, "gpuwatch_gpu_power_watts", MIG_GPU)
    assert series[("DCGM_FI_PROF_SM_ACTIVE", "1")] > 0.5 and series[("DCGM_FI_PROF_SM_ACTIVE", "5")] == 0.0
    assert series[("DCGM_FI_DEV_FB_USED", "1")] > 30 * 1024 and series[("DCGM_FI_DEV_FB_USED", "6")] == 0.0
    # Profiling without a per-instance source: absent on the instances, never the whole GPU's value.
    assert own(samples, "gpuwatch_gpu_sm_occupancy_ratio", MIG_GPU) is not None
    assert not [key for key in series if key[0] == "DCGM_FI_PROF_SM_OCCUPANCY"]


def test_compute_instances_of_one_gpu_instance_are_one_series_under_its_gpu_instance_profile(sim: SimAgent) -> None:
    """A 2g.20gb split into two 1-slice compute instances: two MIG devices (1c.2g.20gb), one DCGM GPU instance."""
    sim.run(2)
    sim.node.destroy_gpu_instance(2, 6)
    created = sim.node.create_gpu_instance(2, MigInstanceSpec("2g.20gb", start=2, compute_slices=(1, 1)))
    sim.run(31)  # the next slow poll finds the instances
    samples = scrape(sim)
    devices = [labels for name, labels, _ in samples if name == "gpuwatch_mig_device_info" and labels["gpu"] == MIG_GPU]
    assert sorted((d["gpu_instance_id"], d["compute_instance_id"], d["mig_profile"]) for d in devices) == sorted(
        [
            ("1", "0", "3g.40gb"),
            ("5", "0", "2g.20gb"),
            (str(created), "0", "1c.2g.20gb"),
            (str(created), "1", "1c.2g.20gb"),
        ]
    )
    fb = [labels for name, labels, _ in dcgm(samples, MIG_GPU) if name == "DCGM_FI_DEV_FB_TOTAL"]
    assert sorted((labels["GPU_I_ID"], labels["GPU_I_PROFILE"]) for labels in fb) == sorted(
        [("1", "3g.40gb"), ("5", "2g.20gb"), (str(created), "2g.20gb")]
    )
