"""MIG (issue #35): each MIG device of a MIG-enabled GPU watched as what it is, through the real agent, the NVML
backend and the simulated libnvidia-ml, whose MIG calls follow nvml.h 13.3.29 (tests/test_nvml_mig_conformance.py).
Scenario `mig`: GPU 2 split into a 3g.40gb (a training job in it) and two 2g.20gb; the other GPUs without MIG."""

from __future__ import annotations

from pathlib import Path

import pytest
from simnode import SimAgent

from gpuwatch.backends.amdsmi import AmdSmiBackend
from gpuwatch.backends.nvml import NvmlBackend
from gpuwatch.collectors.vendors import _mig_lines
from gpuwatch.judge.gpu_verdict import GpuVerdict, gpu_verdicts
from gpuwatch.judge.verdict import judge_gpu
from gpuwatch.simulated.amdsmi_sim import simulated_amdsmi
from gpuwatch.simulated.bindings import simulated_pynvml
from gpuwatch.simulated.mig import SCENARIO_LAYOUT, MigInstanceSpec, MigLayout
from gpuwatch.simulated.scenarios import SimulatedNode
from gpuwatch.web.status_page import render_status_page

MIG_GPU = 2
SLOW_POLL = 31.0  # MIG devices are enumerated on slow polls (agent.slow_poll_interval_seconds, 30 s)
GIB = 2**30
ACTIVITY = ("gpuwatch_mig_sm_active_ratio", "gpuwatch_mig_tensor_active_ratio", "gpuwatch_mig_dram_active_ratio")


def _devices(sim: SimAgent, gpu: int) -> dict[str, dict[str, str]]:
    """gpu_instance_id -> the labels of its gpuwatch_mig_device_info series."""
    parent = sim.gpu(gpu)
    found = {}
    for name, labels in sim.samples():
        label = dict(labels)
        if name == "gpuwatch_mig_device_info" and label["uuid"] == parent["uuid"]:
            assert label["gpu"] == parent["gpu"]  # the parent's labels: sums by (gpu, uuid) are the GPU's
            found[label["gpu_instance_id"]] = label
    return found


def _memory(sim: SimAgent, name: str, gpu: int, gi: str, profile: str) -> float | None:
    return sim.value(name, gpu, gpu_instance_id=gi, compute_instance_id="0", mig_profile=profile)


@pytest.fixture
def sim(tmp_path: Path):  # type: ignore[no-untyped-def]
    agent = SimAgent(tmp_path, "mig")
    yield agent
    agent.close()


def test_each_instance_is_served_with_its_ids_profile_and_memory(sim: SimAgent) -> None:
    sim.run(2)
    devices = _devices(sim, MIG_GPU)
    assert {gi: d["mig_profile"] for gi, d in devices.items()} == {"1": "3g.40gb", "5": "2g.20gb", "6": "2g.20gb"}
    assert all(d["compute_instance_id"] == "0" and d["mig_uuid"].startswith("MIG-") for d in devices.values())
    assert len({d["mig_uuid"] for d in devices.values()}) == 3
    big = _memory(sim, "gpuwatch_mig_memory_total_bytes", MIG_GPU, "1", "3g.40gb")
    small = _memory(sim, "gpuwatch_mig_memory_total_bytes", MIG_GPU, "5", "2g.20gb")
    assert big is not None and 39 * GIB < big < 40 * GIB and small is not None and 19 * GIB < small < 20 * GIB
    gpu_total = sim.value("gpuwatch_gpu_memory_total_bytes", MIG_GPU)
    assert gpu_total is not None and big + 2 * small <= gpu_total
    used = _memory(sim, "gpuwatch_mig_memory_used_bytes", MIG_GPU, "1", "3g.40gb")
    assert used is not None and used > 30 * GIB  # the training job's
    assert _memory(sim, "gpuwatch_mig_memory_used_bytes", MIG_GPU, "6", "2g.20gb") == 0.0
    for other in (0, 1, 3):  # no MIG: no MIG series
        assert _devices(sim, other) == {}
    modes = [dict(labels) for name, labels in sim.samples() if name == "gpuwatch_gpu_modes_info"]
    assert {m["gpu"]: m["mig"] for m in modes}[str(MIG_GPU)] == "1"


def test_the_job_is_attributed_to_its_gpu_instance(sim: SimAgent) -> None:
    sim.run(2)
    (workload,) = [dict(labels) for name, labels in sim.samples() if name == "gpuwatch_gpu_workload_info"]
    assert workload["gpu"] == str(MIG_GPU) and workload["gpu_instance_id"] == "1"
    held = sim.value(
        "gpuwatch_gpu_workload_memory_bytes", MIG_GPU, kind=workload["kind"], id=workload["id"], gpu_instance_id="1"
    )
    assert held is not None and held > 30 * GIB


def test_instances_created_and_destroyed_while_the_agent_runs_come_and_go(sim: SimAgent) -> None:
    sim.run(2)
    sim.node.destroy_gpu_instance(MIG_GPU, 6)
    sim.run(SLOW_POLL)
    assert set(_devices(sim, MIG_GPU)) == {"1", "5"}
    assert _memory(sim, "gpuwatch_mig_memory_total_bytes", MIG_GPU, "6", "2g.20gb") is None
    created = sim.node.create_gpu_instance(MIG_GPU, MigInstanceSpec("1g.10gb", job="busy"))
    sim.run(SLOW_POLL)
    devices = _devices(sim, MIG_GPU)
    assert devices[str(created)]["mig_profile"] == "1g.10gb" and len(devices) == 3
    sample = sim.agent.store.snapshot().fresh(sim.gpu(MIG_GPU)["uuid"])
    assert sample is not None and sorted(sample.process_gpu_instance.values()) == sorted([1, created])


def test_the_status_page_lists_the_instances_and_their_jobs(sim: SimAgent) -> None:
    sim.run(3)  # GPM: two samples, a poll apart
    page = render_status_page(sim.agent.store.snapshot())
    table = page[page.index('<table id="mig">') :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 4  # the header and three instances
    job = table[table.index("3g.40gb") :]
    job = job[: job.index("</tr>")]
    assert table.count("2g.20gb") == 2 and "k8s_pod" in job  # the job, in its instance's row
    # Its GPU instance's SM / tensor activity, as served: the busy 3g.40gb's, and an idle 2g.20gb at 0 %.
    busy = _activity(sim, "1", "3g.40gb")
    sm, tensor = busy["gpuwatch_mig_sm_active_ratio"], busy["gpuwatch_mig_tensor_active_ratio"]
    assert sm is not None and tensor is not None and sm > 0.5
    assert f"<td>{sm:.0%} / {tensor:.0%}</td>" in job
    idle = table[table.rindex("2g.20gb") :]
    assert "<td>0% / 0%</td>" in idle[: idle.index("</tr>")]


def test_the_probe_skips_the_mig_gpu_says_why_and_leaves_its_instances(sim: SimAgent) -> None:
    sim.run(2)
    before = _devices(sim, MIG_GPU)
    sim.probe_round()
    assert sim.value("gpuwatch_probe_runs_total", MIG_GPU, result="skipped_unsupported") == 1.0
    probed = sim.agent.store.snapshot().probe
    assert "MIG" in str(probed.last_any.get(sim.gpu(MIG_GPU)["uuid"]))
    sim.run(SLOW_POLL)
    assert _devices(sim, MIG_GPU) == before  # never created nor destroyed an instance


def _activity(sim: SimAgent, gi: str, profile: str) -> dict[str, float | None]:
    """metric -> the value of GPU instance `gi` of the MIG GPU (its compute instance 0)."""
    return {name: _memory(sim, name, MIG_GPU, gi, profile) for name in ACTIVITY}


def _gpm_buffers(sim: SimAgent) -> int:
    """GPM sample buffers the simulated libnvidia-ml holds allocated (nvmlGpmSampleAlloc, not yet freed)."""
    backend = sim.slot.backend
    assert backend is not None
    return len(backend._lib.nvmlLib.driver._gpm_samples)


def test_each_gpu_instance_has_its_own_gpm_activity(sim: SimAgent) -> None:
    """nvmlGpmMigSampleGet per GPU instance: the training job's 3g.40gb busy, the idle 2g.20gb at 0, not absent."""
    sim.run(3)
    busy = _activity(sim, "1", "3g.40gb")
    assert busy["gpuwatch_mig_sm_active_ratio"] is not None and busy["gpuwatch_mig_sm_active_ratio"] > 0.5
    assert busy["gpuwatch_mig_tensor_active_ratio"] is not None and busy["gpuwatch_mig_tensor_active_ratio"] > 0.3
    assert busy["gpuwatch_mig_dram_active_ratio"] is not None and busy["gpuwatch_mig_dram_active_ratio"] > 0.1
    for gi in ("5", "6"):
        assert _activity(sim, gi, "2g.20gb") == dict.fromkeys(ACTIVITY, 0.0)
    assert not [name for name, labels in sim.samples() if name in ACTIVITY and dict(labels)["gpu"] != str(MIG_GPU)]
    # Two buffers per GPU (8 GPUs of GPM) and two per GPU instance of the MIG GPU.
    assert _gpm_buffers(sim) == 2 * 8 + 2 * 3


def test_an_instance_s_gpm_buffers_go_with_it_and_a_new_one_measures_its_own_job(sim: SimAgent) -> None:
    sim.run(3)
    sim.node.destroy_gpu_instance(MIG_GPU, 6)
    sim.run(SLOW_POLL)
    assert _gpm_buffers(sim) == 2 * 8 + 2 * 2  # the destroyed instance's pair freed
    assert _activity(sim, "6", "2g.20gb") == dict.fromkeys(ACTIVITY, None)
    created = sim.node.create_gpu_instance(MIG_GPU, MigInstanceSpec("1g.10gb", job="busy"))
    sim.run(SLOW_POLL)
    assert _gpm_buffers(sim) == 2 * 8 + 2 * 3
    new = _activity(sim, str(created), "1g.10gb")
    assert new["gpuwatch_mig_sm_active_ratio"] is not None and new["gpuwatch_mig_sm_active_ratio"] > 0.5
    assert _activity(sim, "5", "2g.20gb")["gpuwatch_mig_sm_active_ratio"] == 0.0
    backend = sim.slot.backend
    assert backend is not None
    backend.close()
    assert backend._lib.nvmlLib.driver._gpm_samples == {}  # close frees every instance's buffers too


def test_a_gpu_without_gpm_has_no_instance_activity_and_allocates_nothing() -> None:
    """An A100 (compute capability 8.0) in MIG mode: nvmlGpmQueryDeviceSupport says no GPM, so no buffer is allocated
    and the instances have memory but no activity series (absent, never 0)."""
    node = SimulatedNode("mig", gpus=4, clock=lambda: 5.0, wall_clock=lambda: 1_800_000_000.0)
    lib = simulated_pynvml(node, compute_capability=(8, 0))
    backend = NvmlBackend(lib, clock=lambda: 1_800_000_000.0)
    backend.open()
    try:
        readings = [backend.poll(slow=i == 0) for i in range(3)]
        (mig_gpu,) = [r.sample for r in readings[-1] if r.sample is not None and r.sample.mig_devices]
        assert lib.nvmlLib.driver._gpm_samples == {}
    finally:
        backend.close()
    assert len(mig_gpu.mig_devices) == 3 and all(d.memory_total_bytes for d in mig_gpu.mig_devices)
    assert all(
        (d.sm_active_ratio, d.tensor_active_ratio, d.dram_active_ratio) == (None, None, None)
        for d in mig_gpu.mig_devices
    )


def test_gpuwatch_check_lists_the_mig_devices_and_warns_of_a_mig_gpu_without_an_instance() -> None:
    """With MIG enabled, CUDA runs only inside an instance (NVIDIA MIG User Guide, docs.nvidia.com/datacenter/tesla/
    mig-user-guide, "MIG Device Names" > "CUDA Device Enumeration": CUDA applications run on a MIG device given by
    its UUID), and nvmlDeviceGetMaxMigDeviceCount answers 0 devices on such a GPU (nvml.h 13.3.29, lines
    13398-13414): a MIG GPU with none takes no job, and `gpuwatch check` says so and what to do; a GPU with instances
    gets them listed, a GPU without MIG no line."""
    node = SimulatedNode("healthy", gpus=4, mig={1: MigLayout(()), 2: SCENARIO_LAYOUT}, wall_clock=lambda: 1.8e9)
    backend = NvmlBackend(simulated_pynvml(node), clock=lambda: 1.8e9)
    backend.open()
    try:
        lines = _mig_lines(backend.poll(slow=True), "MIG (nvml)")
    finally:
        backend.close()
    empty, split = lines
    assert (empty.level, split.level) == ("warn", "ok")
    assert empty.detail.startswith("GPU 1: MIG enabled, no instance") and "nvidia-smi mig" in empty.fix
    assert split.detail == (
        "GPU 2: 3 MIG device(s): 3g.40gb (GPU instance 1), 2g.20gb (GPU instance 5), 2g.20gb (GPU instance 6)"
    )


def test_an_amd_gpu_in_a_compute_partition_is_no_mig_gpu_without_instances() -> None:
    """An MI300X in CPX: the AMD backend sets mig_enabled for a non-default compute partition (docs/metrics.md,
    gpuwatch_gpu_modes_info). ROCm/amdsmi's amdsmi.h (amdsmi_compute_partition_type_t) defines CPX as "per-chip XCC
    with shared memory", each partition a GPU of its own: there are no instances to make, so neither `gpuwatch check`
    nor the verdict warns."""
    node = SimulatedNode("healthy", gpus=2, vendor="amd", wall_clock=lambda: 1.8e9)
    backend = AmdSmiBackend(simulated_amdsmi(node, partition="CPX"), clock=lambda: 1.8e9)
    backend.open()
    try:
        readings = backend.poll(slow=True)
    finally:
        backend.close()
    assert readings and all(r.sample is not None and r.sample.mig_enabled for r in readings)
    assert _mig_lines(readings, "MIG (amdsmi)") == []
    assert not [f for r in readings if r.sample for f in judge_gpu(r.identity, r.sample) if "Mig" in f.alert]


def test_a_mig_gpu_left_without_instances_is_degraded_and_says_what_to_do(sim: SimAgent) -> None:
    """The job ends and every instance is destroyed, MIG still enabled: the GPU takes no job (the MIG User Guide's
    "CUDA Device Enumeration", as above). The agent's verdict says
    so (degraded, action none: a setting) from the next slow poll; GpuMigWithoutInstances (promtool-tested in
    deploy/prometheus/tests) reads the same series: mig 1 in gpuwatch_gpu_modes_info and no gpuwatch_mig_device_info."""
    sim.run(2)
    assert _verdict(sim, MIG_GPU).state == "healthy"
    sim.node.set_mig_job(MIG_GPU, 1, None)
    for gi in (1, 5, 6):
        sim.node.destroy_gpu_instance(MIG_GPU, gi)
    sim.run(SLOW_POLL)
    verdict = _verdict(sim, MIG_GPU)
    assert (verdict.state, verdict.action) == ("degraded", "none")
    assert any("GpuMigWithoutInstances" in e and "no job can run" in e for e in verdict.evidence), verdict.evidence
    assert _devices(sim, MIG_GPU) == {}
    modes = [dict(labels) for name, labels in sim.samples() if name == "gpuwatch_gpu_modes_info"]
    assert {m["gpu"]: m["mig"] for m in modes}[str(MIG_GPU)] == "1"
    assert all(_verdict(sim, other).state == "healthy" for other in (0, 1, 3))
    sim.node.create_gpu_instance(MIG_GPU, MigInstanceSpec("7g.80gb"))
    sim.run(SLOW_POLL)
    assert _verdict(sim, MIG_GPU).state == "healthy"  # one instance again: it takes jobs


def _verdict(sim: SimAgent, gpu: int) -> GpuVerdict:
    (verdict,) = [v for v in gpu_verdicts(sim.agent.store.snapshot()) if v.index == gpu]
    return verdict


def test_an_amd_node_refuses_the_mig_scenario_and_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--vendor nvidia"):
        SimAgent(tmp_path, "mig", vendor="amd")
