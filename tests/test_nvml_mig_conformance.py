"""The simulated libnvidia-ml answers NVML's MIG calls as nvml.h documents them, through the real pynvml of the oldest
and the newest nvidia-ml-py the project allows.

"nvml.h" below is go-nvml's gen/nvml/nvml.h, NVML 13.3.29 (cuda_nvml_dev 13.3.29), and its line numbers; the H100
80GB's profiles are its driver's `nvidia-smi mig -lgip` (gpuwatch/simulated/mig.py). The node is the issue's scenario
`mig` (mig.SCENARIO_LAYOUT): GPU 0 split into a 3g.40gb (memory slices 4-7, a training job in it) and two 2g.20gb
(slices 0-1 and 2-3); GPU 1 without MIG, as every simulated GPU was before.
"""

from __future__ import annotations

import ctypes
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from nvml_bindings import RELEASES, binding_path

from gpuwatch.backends.nvml import NvmlBackend
from gpuwatch.simulated.bindings import simulated_pynvml
from gpuwatch.simulated.libnvml import PROTOTYPES
from gpuwatch.simulated.mig import SCENARIO_LAYOUT, MigInstanceSpec, MigLayout
from gpuwatch.simulated.procfs import SimulatedProcfs
from gpuwatch.simulated.scenarios import SimulatedNode

NO_INSTANCE = 0xFFFFFFFF  # nvml.h lines 310-313: a process's instance IDs without MIG
MIB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 5.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=RELEASES)
def release(request: pytest.FixtureRequest) -> Path:
    return binding_path(request.param)


def mig_node(
    clock: Clock | None = None, layout: MigLayout = SCENARIO_LAYOUT, scenario: str = "healthy"
) -> SimulatedNode:
    return SimulatedNode(scenario, gpus=2, mig={0: layout}, clock=clock or Clock(), wall_clock=lambda: 1.8e9)


def opened(node: SimulatedNode, release: Path, **options: Any) -> ModuleType:
    lib = simulated_pynvml(node, binding=release, **options)
    lib.nvmlInit()
    return lib


def address(handle: Any) -> int:
    return ctypes.addressof(handle.contents)


def text(value: str | bytes) -> str:
    """pynvml 12.570 returns bytes where 13.x decodes."""
    return value.decode() if isinstance(value, bytes) else value


def mig_handles(lib: ModuleType, parent: Any) -> list[Any]:
    """Every MIG device of a GPU, as go-nvlib's VisitMigDevices walks them: every index below the maximum count,
    NotFound meaning no device there."""
    found = []
    for index in range(lib.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            found.append(lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, index))
        except lib.NVMLError_NotFound:
            continue
    return found


def test_the_mig_functions_take_nvml_h_arguments() -> None:
    """Every MIG symbol's C prototype as nvml.h declares it (lines 4593, 12803, 12827, 12858, 12889, 13037, 13059,
    13076, 13101, 13135, 13292, 13314, 13332, 13354, 13374, 13395, 13414, 13440, 13459): handles and out-pointers are
    addresses, profiles, IDs and indices `unsigned int`."""
    p, u = ctypes.c_void_p, ctypes.c_uint
    expected = {
        "nvmlDeviceGetAttributes_v2": (p, p),
        "nvmlDeviceGetMigMode": (p, p, p),
        "nvmlDeviceGetGpuInstanceProfileInfo": (p, u, p),
        "nvmlDeviceGetGpuInstanceProfileInfoV": (p, u, p),
        "nvmlDeviceGetGpuInstanceProfileInfoByIdV": (p, u, p),
        "nvmlDeviceGetGpuInstances": (p, u, p, p),
        "nvmlDeviceGetGpuInstanceById": (p, u, p),
        "nvmlGpuInstanceGetInfo": (p, p),
        "nvmlGpuInstanceGetComputeInstanceProfileInfo": (p, u, u, p),
        "nvmlGpuInstanceGetComputeInstanceProfileInfoV": (p, u, u, p),
        "nvmlGpuInstanceGetComputeInstances": (p, u, p, p),
        "nvmlGpuInstanceGetComputeInstanceById": (p, u, p),
        "nvmlComputeInstanceGetInfo_v2": (p, p),
        "nvmlDeviceIsMigDeviceHandle": (p, p),
        "nvmlDeviceGetGpuInstanceId": (p, p),
        "nvmlDeviceGetComputeInstanceId": (p, p),
        "nvmlDeviceGetMaxMigDeviceCount": (p, p),
        "nvmlDeviceGetMigDeviceHandleByIndex": (p, u, p),
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": (p, p),
    }
    assert {name: PROTOTYPES[name][0] for name in expected} == expected


def test_a_gpu_without_mig_answers_as_the_fixtures_h100(release: Path) -> None:
    """MIG disabled (the default, tests/fixtures/h100/nvml-idle.json: MigMode [0, 0], MaxMigDeviceCount 0): no MIG
    device at any index (NotSupported: the device does not support the query with MIG off, nvml.h line 13436), a GPU's
    handle is no MIG device handle (line 13351), has no instance IDs (NotSupported, lines 13371 and 13392) and no
    attributes (line 4578: "only supports MIG device handles"), the profile and instance calls answer NotSupported "if
    device doesn't have MIG mode enabled" (lines 12855, 13034); its processes carry 0xFFFFFFFF as instance IDs (lines
    310-313); utilization, compute mode and remapped rows answer as before."""
    node = SimulatedNode("busy", gpus=1, clock=Clock(), wall_clock=lambda: 1.8e9)
    lib = opened(node, release)
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    assert lib.nvmlDeviceGetMigMode(handle) == [lib.NVML_DEVICE_MIG_DISABLE, lib.NVML_DEVICE_MIG_DISABLE]
    assert lib.nvmlDeviceGetMaxMigDeviceCount(handle) == 0
    assert mig_handles(lib, handle) == []
    with pytest.raises(lib.NVMLError_NotSupported):
        lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    assert lib.nvmlDeviceIsMigDeviceHandle(handle).value == 0
    for call in (lib.nvmlDeviceGetGpuInstanceId, lib.nvmlDeviceGetComputeInstanceId, lib.nvmlDeviceGetAttributes):
        with pytest.raises(lib.NVMLError_NotSupported):
            call(handle)
    with pytest.raises(lib.NVMLError_InvalidArgument):
        lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    with pytest.raises(lib.NVMLError_NotSupported):
        lib.nvmlDeviceGetGpuInstanceProfileInfo(handle, lib.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    with pytest.raises(lib.NVMLError_NotSupported):
        lib.nvmlDeviceGetGpuInstanceById(handle, 1)
    count = ctypes.c_uint()
    with pytest.raises(lib.NVMLError_NotSupported):
        lib.nvmlDeviceGetGpuInstances(handle, 9, (lib.c_nvmlGpuInstance_t * 2)(), ctypes.byref(count))
    [process] = lib.nvmlDeviceGetComputeRunningProcesses(handle)
    assert (process.gpuInstanceId, process.computeInstanceId) == (NO_INSTANCE, NO_INSTANCE)
    assert lib.nvmlDeviceGetUtilizationRates(handle).gpu == 100
    assert lib.nvmlDeviceGetComputeMode(handle) == lib.NVML_COMPUTEMODE_DEFAULT
    assert lib.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)


def test_a_gpu_before_ampere_does_not_support_mig(release: Path) -> None:
    """Every MIG call is "For Ampere or newer fully supported devices"; nvmlDeviceGetMigMode answers NotSupported "if
    device doesn't support MIG mode" (line 12800), nvmlDeviceGetMaxMigDeviceCount zero "if MIG is not supported"
    (line 13400). A Volta (compute capability 7.0) with a MIG layout shows none of it."""
    lib = opened(mig_node(), release, compute_capability=(7, 0))
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(lib.NVMLError_NotSupported):
        lib.nvmlDeviceGetMigMode(handle)
    assert lib.nvmlDeviceGetMaxMigDeviceCount(handle) == 0
    with pytest.raises(lib.NVMLError_NotSupported):
        lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)


def test_mig_devices_have_dense_indices_and_their_instances_ids_with_gaps(release: Path) -> None:
    """nvmlDeviceGetMaxMigDeviceCount is how many MIG devices can exist (lines 13398-13414: an H100's seven compute
    slices), not how many do (go-nvml issue #60); indices past the last device answer NotFound (line 13437), past the
    maximum InvalidArgument. The simulated driver numbers its devices 0..n-1 by GPU instance ID: the 3g.40gb is GPU
    instance 1 (placement 4:4), the 2g.20gb ones 5 and 6 (0:2, 2:2): the IDs have gaps, the indices none. Each device
    answers its index to nvmlDeviceGetIndex, and the index gives back an identical handle (lines 4818-4819); it is a
    MIG device handle (line 13351) whose parent is GPU 0's handle (lines 13444-13459), its UUID a `MIG-` one of its
    own (line 5170) that nvmlDeviceGetHandleByUUID finds (line 4682: "The UUID of the target GPU or MIG instance"),
    its name the GPU's and its profile (line 4769)."""
    lib = opened(mig_node(), release)
    parent = lib.nvmlDeviceGetHandleByIndex(0)
    assert lib.nvmlDeviceGetMigMode(parent) == [lib.NVML_DEVICE_MIG_ENABLE, lib.NVML_DEVICE_MIG_ENABLE]
    assert lib.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    devices = mig_handles(lib, parent)
    assert len(devices) == 3
    for index in range(3, 7):
        with pytest.raises(lib.NVMLError_NotFound):
            lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
    with pytest.raises(lib.NVMLError_InvalidArgument):
        lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, 7)
    ids = [(lib.nvmlDeviceGetGpuInstanceId(d), lib.nvmlDeviceGetComputeInstanceId(d)) for d in devices]
    assert ids == [(1, 0), (5, 0), (6, 0)]
    gpu_uuid = text(lib.nvmlDeviceGetUUID(parent))
    uuids = [text(lib.nvmlDeviceGetUUID(d)) for d in devices]
    assert all(u.startswith("MIG-") and len(u) == len(gpu_uuid) for u in uuids) and len(set(uuids)) == 3
    assert gpu_uuid.startswith("GPU-") and gpu_uuid not in uuids
    assert [text(lib.nvmlDeviceGetName(d)) for d in devices] == [
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
        "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
    ]
    for index, device in enumerate(devices):
        assert lib.nvmlDeviceIsMigDeviceHandle(device).value == 1
        assert lib.nvmlDeviceGetIndex(device) == index
        assert address(lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)) == address(device)
        assert address(lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(device)) == address(parent)
        assert address(lib.nvmlDeviceGetHandleByUUID(uuids[index])) == address(device)
    assert lib.nvmlDeviceGetCount() == 2  # MIG devices are not GPUs
    with pytest.raises(lib.NVMLError_NotFound):
        lib.nvmlDeviceGetHandleByUUID("MIG-00000000-0000-0000-0000-000000000000")


def test_gpu_instance_profiles_give_the_h100s_names_slices_and_memory(release: Path) -> None:
    """nvmlDeviceGetGpuInstanceProfileInfo(V) enumerates the profiles "by invoking it on profile values starting from
    0, until the API returns NVML_ERROR_INVALID_ARGUMENT" (line 12811); one the GPU lacks answers NotSupported (line
    12855). Each is the H100 80GB's `nvidia-smi mig -lgip` line: profile ID, slices, instances, SMs, memory in MiB, and
    in the versioned struct (lines 12581-12596, version set by the caller, a wrong one InvalidArgument) its name. A
    monitor that reads the unversioned struct derives the same name from slices and memory (`3g.40gb`: 3 slices,
    40448 MiB)."""
    lib = opened(mig_node(), release)
    parent = lib.nvmlDeviceGetHandleByIndex(0)
    found: dict[str, tuple[int, int, int, int, int]] = {}
    profile = 0
    while True:
        try:
            info = lib.nvmlDeviceGetGpuInstanceProfileInfo(parent, profile)
            v1 = lib.nvmlDeviceGetGpuInstanceProfileInfo(parent, profile, version=1)
        except lib.NVMLError_NotSupported:
            profile += 1
            continue
        except lib.NVMLError_InvalidArgument:
            break
        name = text(info.name)
        assert name.startswith("MIG ")
        found[name[4:]] = (info.id, info.sliceCount, info.instanceCount, info.multiprocessorCount, info.memorySizeMB)
        assert (v1.id, v1.sliceCount, v1.memorySizeMB) == (info.id, info.sliceCount, info.memorySizeMB)
        if "+" not in name:
            assert name[4:] == f"{v1.sliceCount}g.{math.ceil(v1.memorySizeMB / 1024)}gb"
        profile += 1
    assert profile == 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT of nvml.h 13.3 (line 12529), whatever the binding's is
    assert found == {
        "1g.10gb": (19, 1, 7, 16, 9984),
        "1g.10gb+me": (20, 1, 1, 16, 9984),
        "1g.20gb": (15, 1, 4, 26, 20096),
        "2g.20gb": (14, 2, 3, 32, 20096),
        "3g.40gb": (9, 3, 2, 60, 40448),
        "4g.40gb": (5, 4, 1, 64, 40448),
        "7g.80gb": (0, 7, 1, 132, 81152),
    }
    wrong = lib.c_nvmlGpuInstanceProfileInfo_v2_t()
    wrong.version = 0x01000098
    get = lib._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
    assert get(parent, lib.NVML_GPU_INSTANCE_PROFILE_3_SLICE, ctypes.byref(wrong)) == lib.NVML_ERROR_INVALID_ARGUMENT
    if hasattr(lib, "nvmlDeviceGetGpuInstanceProfileInfoById"):  # nvidia-ml-py 13 on (nvml.h lines 12861-12890)
        assert text(lib.nvmlDeviceGetGpuInstanceProfileInfoById(parent, 9).name) == "MIG 3g.40gb"
        with pytest.raises(lib.NVMLError_InvalidArgument):
            lib.nvmlDeviceGetGpuInstanceProfileInfoById(parent, 1)


def test_gpu_and_compute_instances_read_as_nvidia_smi_lists_them(release: Path) -> None:
    """nvmlDeviceGetGpuInstances by profile ID (lines 13017-13038) and nvmlGpuInstanceGetInfo (lines 13061-13076):
    the parent device, the instance ID, the profile ID and the placement (lines 12631-12637); by ID, NotFound for none
    (line 13057). The compute instances of a GPU instance by compute profile (lines 13270-13293), their info (lines
    13317-13332: parent device and GPU instance, ID, profile, placement within the GPU instance's slices) and their
    profiles (lines 13105-13137): the whole-instance one named as the GPU instance, a one-slice one `1c.3g.40gb`, a
    profile larger than the instance NotSupported, one past the enum InvalidArgument."""
    lib = opened(mig_node(), release)
    parent = lib.nvmlDeviceGetHandleByIndex(0)
    listed = {}
    for profile_id, capacity in ((14, 3), (9, 2), (19, 7)):
        handles = (lib.c_nvmlGpuInstance_t * capacity)()
        count = ctypes.c_uint()
        lib.nvmlDeviceGetGpuInstances(parent, profile_id, handles, ctypes.byref(count))
        for gi in handles[: count.value]:
            info = lib.nvmlGpuInstanceGetInfo(gi)
            assert address(info.device) == address(parent) and info.profileId == profile_id
            listed[info.id] = (info.profileId, info.placement.start, info.placement.size)
    assert listed == {5: (14, 0, 2), 6: (14, 2, 2), 1: (9, 4, 4)}
    with pytest.raises(lib.NVMLError_NotFound):
        lib.nvmlDeviceGetGpuInstanceById(parent, 3)
    big = lib.nvmlDeviceGetGpuInstanceById(parent, 1)
    assert lib.nvmlGpuInstanceGetInfo(big).id == 1
    compute = (lib.c_nvmlComputeInstance_t * 3)()
    count = ctypes.c_uint()
    lib.nvmlGpuInstanceGetComputeInstances(big, lib.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, compute, ctypes.byref(count))
    assert count.value == 1
    ci = lib.nvmlComputeInstanceGetInfo(compute[0])
    assert address(ci.device) == address(parent) and address(ci.gpuInstance) == address(big)
    assert (ci.id, ci.profileId, ci.placement.start, ci.placement.size) == (0, 2, 0, 3)
    assert address(lib.nvmlGpuInstanceGetComputeInstanceById(big, 0)) == address(compute[0])
    with pytest.raises(lib.NVMLError_NotFound):
        lib.nvmlGpuInstanceGetComputeInstanceById(big, 1)
    shared = lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    whole = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(big, lib.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, shared)
    one = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(big, lib.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, shared)
    assert (text(whole.name), whole.sliceCount, whole.instanceCount, whole.multiprocessorCount) == (
        "MIG 3g.40gb",
        3,
        1,
        60,
    )
    assert (text(one.name), one.sliceCount, one.instanceCount, one.multiprocessorCount) == ("MIG 1c.3g.40gb", 1, 3, 16)
    with pytest.raises(lib.NVMLError_NotSupported):
        lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(big, lib.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE, shared)
    with pytest.raises(lib.NVMLError_InvalidArgument):
        lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(big, 0x9, shared)


def test_a_mig_devices_memory_processes_and_attributes_are_its_own(release: Path) -> None:
    """Memory (lines 6678-6680, 6722-6724) and processes (lines 7378-7380): "In MIG mode, if device handle is provided,
    the API returns aggregate information ... Per-instance information can be queried by using specific MIG device
    handles". The 3g.40gb's device has its profile's 40448 MiB and the job's memory; the 2g.20gb ones their 20096 MiB
    and no process; GPU 0's handle the whole GPU and the job. The job's process names its GPU instance 1 and compute
    instance 0 (lines 310-313) from either handle. nvmlDeviceGetAttributes_v2 (lines 4575-4593, struct lines 362-373):
    the device's SMs, engines, slice counts and memory."""
    node = mig_node()
    lib = opened(node, release)
    parent = lib.nvmlDeviceGetHandleByIndex(0)
    big, small, other = mig_handles(lib, parent)
    job = node.mig_job_pids(0)
    assert len(job) == 1
    for memory in (lib.nvmlDeviceGetMemoryInfo(big), lib.nvmlDeviceGetMemoryInfo(big, version=lib.nvmlMemory_v2)):
        assert memory.total == 40448 * MIB
        assert memory.used == int(40448 * MIB * 0.9) and memory.free == memory.total - memory.used
    assert lib.nvmlDeviceGetMemoryInfo(small).total == 20096 * MIB and lib.nvmlDeviceGetMemoryInfo(small).used == 0
    whole = lib.nvmlDeviceGetMemoryInfo(parent, version=lib.nvmlMemory_v2)
    assert whole.total == node.spec(0).memory_total_bytes and whole.used == int(40448 * MIB * 0.9)
    for handle in (big, parent):
        [process] = lib.nvmlDeviceGetComputeRunningProcesses(handle)
        assert (process.pid, process.gpuInstanceId, process.computeInstanceId) == (job[0], 1, 0)
        assert process.usedGpuMemory == int(40448 * MIB * 0.9)
    assert lib.nvmlDeviceGetComputeRunningProcesses(small) == []
    assert lib.nvmlDeviceGetComputeRunningProcesses(other) == []
    attributes = lib.nvmlDeviceGetAttributes(big)
    assert (attributes.multiprocessorCount, attributes.gpuInstanceSliceCount, attributes.computeInstanceSliceCount) == (
        60,
        3,
        3,
    )
    assert (attributes.sharedCopyEngineCount, attributes.sharedDecoderCount, attributes.memorySizeMB) == (3, 3, 40448)
    assert lib.nvmlDeviceGetAttributes(small).multiprocessorCount == 32
    assert (SimulatedProcfs(node).root / str(job[0]) / "cgroup").is_file()  # the job's workload is readable


def test_whole_gpu_calls_on_a_mig_handle_answer_not_supported(release: Path) -> None:
    """A MIG device handle can be used "(with some restrictions) interchangeably with a GPU device handle" (line
    13338): the calls whose nvml.h entry takes "the device handle or MIG device handle" answer for the instance; the
    others are documented for "the target device" and name no code for a MIG handle: the simulation answers
    NotSupported (temperature, power, clocks, PCIe, ECC, field values, MIG mode). On GPU 0's own handle in MIG mode,
    utilization is NotSupported (line 7075), remapped rows too ("If MIG is enabled", line 8431), and compute mode
    ("device must be MIG device handle", line 6757), which the MIG device answers; temperature and power answer for
    the whole GPU."""
    lib = opened(mig_node(), release)
    parent = lib.nvmlDeviceGetHandleByIndex(0)
    device = mig_handles(lib, parent)[0]
    calls = {
        "temperature": lambda h: lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU),
        "power": lib.nvmlDeviceGetPowerUsage,
        "energy": lib.nvmlDeviceGetTotalEnergyConsumption,
        "clock": lambda h: lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM),
        "utilization": lib.nvmlDeviceGetUtilizationRates,
        "pcie": lib.nvmlDeviceGetCurrPcieLinkGeneration,
        "ecc": lambda h: lib.nvmlDeviceGetTotalEccErrors(
            h, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_VOLATILE_ECC
        ),
        "fields": lambda h: lib.nvmlDeviceGetFieldValues(h, [lib.NVML_FI_DEV_ECC_CURRENT]),
        "mig_mode": lib.nvmlDeviceGetMigMode,
        "max_mig": lib.nvmlDeviceGetMaxMigDeviceCount,
        "serial": lib.nvmlDeviceGetSerial,
    }
    for name, call in calls.items():
        with pytest.raises(lib.NVMLError_NotSupported):
            call(device)
            pytest.fail(f"{name} answered on a MIG device handle")
    for call in (lib.nvmlDeviceGetUtilizationRates, lib.nvmlDeviceGetRemappedRows, lib.nvmlDeviceGetComputeMode):
        with pytest.raises(lib.NVMLError_NotSupported):
            call(parent)
    assert lib.nvmlDeviceGetComputeMode(device) == lib.NVML_COMPUTEMODE_DEFAULT
    assert lib.nvmlDeviceGetTemperature(parent, lib.NVML_TEMPERATURE_GPU) > 0
    assert lib.nvmlDeviceGetPowerUsage(parent) > 0
    other = lib.nvmlDeviceGetHandleByIndex(1)  # GPU 1, MIG disabled, is unchanged
    assert lib.nvmlDeviceGetUtilizationRates(other).gpu == 0 and lib.nvmlDeviceGetMaxMigDeviceCount(other) == 0


def test_compute_instances_inside_a_gpu_instance_are_mig_devices_of_their_own(release: Path) -> None:
    """ "A MIG device handle ... maps to a MIG compute instance" (line 13337): a 3g.40gb split into three one-slice
    compute instances is three MIG devices of GPU instance 1, compute instances 0-2, named `1c.3g.40gb`, 16 SMs each,
    sharing the GPU instance's memory and engines (nvmlDeviceAttributes_t, lines 362-373); the job runs in the first."""
    layout = MigLayout((MigInstanceSpec("3g.40gb", start=4, compute_slices=(1, 1, 1), job="busy"),))
    lib = opened(mig_node(layout=layout), release)
    parent = lib.nvmlDeviceGetHandleByIndex(0)
    devices = mig_handles(lib, parent)
    ids = [(lib.nvmlDeviceGetGpuInstanceId(d), lib.nvmlDeviceGetComputeInstanceId(d)) for d in devices]
    assert ids == [(1, 0), (1, 1), (1, 2)]
    assert {text(lib.nvmlDeviceGetName(d)) for d in devices} == {"NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb"}
    for d in devices:
        attributes = lib.nvmlDeviceGetAttributes(d)
        assert (attributes.multiprocessorCount, attributes.computeInstanceSliceCount) == (16, 1)
        assert (attributes.gpuInstanceSliceCount, attributes.memorySizeMB) == (3, 40448)
    assert [len(lib.nvmlDeviceGetComputeRunningProcesses(d)) for d in devices] == [1, 0, 0]
    [process] = lib.nvmlDeviceGetComputeRunningProcesses(parent)
    assert (process.gpuInstanceId, process.computeInstanceId) == (1, 0)


def test_instances_created_and_destroyed_while_running_change_the_next_enumeration(release: Path) -> None:
    """MIG devices come and go with their instances. The scenario's layout fills the GPU (its seven compute slices and
    eight memory slices); a 2g.20gb destroyed while the
    library runs is gone at the next enumeration, the indices close up, and the handle it had "would remain invalid
    and must be requested again" (line 13421): InvalidArgument, as its GPU instance handle's. Two 1g.10gb created in its
    memory slices are two more devices (GPU instances 11 and 12, slices 0 and 1). A GPU instance with a process cannot
    be destroyed (nvmlGpuInstanceDestroy: IN_USE "if processes ... are active", line 13010). Created anew, a 2g.20gb at
    slice 0 is GPU instance 5 again, with a new UUID ("UUIDs are immutable for the lifetime of a MIG device", line
    5171)."""
    node = mig_node()
    lib = opened(node, release)
    parent = lib.nvmlDeviceGetHandleByIndex(0)
    doomed = mig_handles(lib, parent)[1]
    doomed_uuid = text(lib.nvmlDeviceGetUUID(doomed))
    doomed_gi = lib.nvmlDeviceGetGpuInstanceById(parent, 5)
    with pytest.raises(ValueError, match="not enough free compute slices"):
        node.create_gpu_instance(0, MigInstanceSpec("1g.10gb"))
    node.destroy_gpu_instance(0, 5)
    after = mig_handles(lib, parent)
    assert [lib.nvmlDeviceGetGpuInstanceId(d) for d in after] == [1, 6]
    assert [lib.nvmlDeviceGetIndex(d) for d in after] == [0, 1]
    for stale in (lambda: lib.nvmlDeviceGetUUID(doomed), lambda: lib.nvmlGpuInstanceGetInfo(doomed_gi)):
        with pytest.raises(lib.NVMLError_InvalidArgument):
            stale()
    assert [node.create_gpu_instance(0, MigInstanceSpec("1g.10gb")) for _ in range(2)] == [11, 12]
    grown = mig_handles(lib, parent)
    assert [lib.nvmlDeviceGetGpuInstanceId(d) for d in grown] == [1, 6, 11, 12]
    assert [text(lib.nvmlDeviceGetName(d))[-7:] for d in grown] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    with pytest.raises(ValueError, match="in use"):
        node.destroy_gpu_instance(0, 1)
    node.destroy_gpu_instance(0, 11)
    node.destroy_gpu_instance(0, 12)
    assert node.create_gpu_instance(0, MigInstanceSpec("2g.20gb", start=0)) == 5
    recreated = mig_handles(lib, parent)[1]
    assert lib.nvmlDeviceGetGpuInstanceId(recreated) == 5
    assert text(lib.nvmlDeviceGetUUID(recreated)) != doomed_uuid
    node.set_mig_job(0, 1, None)
    node.destroy_gpu_instance(0, 1)
    assert lib.nvmlDeviceGetComputeRunningProcesses(parent) == []
    assert len(mig_handles(lib, parent)) == 2


def test_a_pending_mig_mode_takes_effect_only_after_a_reset(release: Path) -> None:
    """nvmlDeviceGetMigMode's pending mode is "the target mode following the next activation trigger" (line 12787):
    MIG enabled but not yet active answers [0, 1], and the GPU has no MIG devices (zero "if MIG is not ... enabled",
    line 13400)."""
    lib = opened(mig_node(layout=MigLayout((), enabled=False, pending=True)), release)
    parent = lib.nvmlDeviceGetHandleByIndex(0)
    assert lib.nvmlDeviceGetMigMode(parent) == [lib.NVML_DEVICE_MIG_DISABLE, lib.NVML_DEVICE_MIG_ENABLE]
    assert lib.nvmlDeviceGetMaxMigDeviceCount(parent) == 0
    with pytest.raises(lib.NVMLError_NotSupported):
        lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert lib.nvmlDeviceGetUtilizationRates(parent).gpu == 0  # not in MIG mode yet: the whole GPU answers


def test_gpm_samples_one_gpu_instance_at_a_time(release: Path) -> None:
    """nvmlGpmMigSampleGet(device, gpuInstanceId, sample) samples one GPU instance (lines 13925-13943),
    nvmlGpmSampleGet a MIG device by its handle (line 13913: "supports the device handle and MIG device handle"): the
    3g.40gb with the training job shows its SMs busy, a 2g.20gb none; the MIG device's sample is its compute
    instance's, here the whole GPU instance. Two samples of different instances make no metric (InvalidArgument), an
    instance has no PCIe traffic of its own (NotSupported: the simulation's choice), and a GPU instance ID the GPU
    lacks answers InvalidArgument (nvml.h names no code: unverified)."""
    clock = Clock()
    lib = opened(mig_node(clock), release)
    parent = lib.nvmlDeviceGetHandleByIndex(0)
    device = mig_handles(lib, parent)[0]
    samples = {key: (lib.nvmlGpmSampleAlloc(), lib.nvmlGpmSampleAlloc()) for key in ("gi1", "gi5", "device")}
    for n in (0, 1):
        lib.nvmlGpmMigSampleGet(parent, 1, samples["gi1"][n])
        lib.nvmlGpmMigSampleGet(parent, 5, samples["gi5"][n])
        lib.nvmlGpmSampleGet(device, samples["device"][n])
        clock.now += 2.0

    def metrics(first: Any, second: Any) -> list[Any]:
        request = lib.c_nvmlGpmMetricsGet_t()
        request.version, request.numMetrics = lib.NVML_GPM_METRICS_GET_VERSION, 2
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = lib.NVML_GPM_METRIC_SM_UTIL
        request.metrics[1].metricId = lib.NVML_GPM_METRIC_PCIE_TX_PER_SEC
        lib.nvmlGpmMetricsGet(request)
        return [request.metrics[0], request.metrics[1]]

    busy, pcie = metrics(*samples["gi1"])
    assert busy.nvmlReturn == lib.NVML_SUCCESS and 85.0 < busy.value < 100.0  # training: SM active ~0.94
    assert pcie.nvmlReturn == lib.NVML_ERROR_NOT_SUPPORTED
    idle, _ = metrics(*samples["gi5"])
    assert idle.nvmlReturn == lib.NVML_SUCCESS and idle.value == 0.0
    same, _ = metrics(*samples["device"])
    assert same.value == pytest.approx(busy.value)
    with pytest.raises(lib.NVMLError_InvalidArgument):
        metrics(samples["gi1"][0], samples["gi5"][1])
    with pytest.raises(lib.NVMLError_InvalidArgument):
        lib.nvmlGpmMigSampleGet(parent, 2, lib.nvmlGpmSampleAlloc())
    support = lib.nvmlGpmQueryDeviceSupport(device)
    assert support.isSupportedDevice == 1


def test_a_lost_gpus_mig_devices_are_lost_too(release: Path) -> None:
    """Every call on a MIG device of a GPU that fell off the bus answers GpuIsLost, as the GPU's own handle does."""
    node = mig_node()
    lib = opened(node, release)
    parent = lib.nvmlDeviceGetHandleByIndex(0)
    device = mig_handles(lib, parent)[0]
    gi = lib.nvmlDeviceGetGpuInstanceById(parent, 1)
    node.faults.lose_gpu(0)
    for call in (lib.nvmlDeviceGetUUID, lib.nvmlDeviceGetMemoryInfo, lib.nvmlDeviceGetComputeRunningProcesses):
        with pytest.raises(lib.NVMLError_GpuIsLost):
            call(device)
    with pytest.raises(lib.NVMLError_GpuIsLost):
        lib.nvmlGpuInstanceGetInfo(gi)


def test_the_backend_still_polls_a_mig_node(release: Path) -> None:
    """Today's backend (which reads no instance yet) opens and polls a node with a MIG GPU without an error or a
    missing function: GPU 0 reports MIG enabled, its utilization and compute mode unknown (NotSupported in MIG mode),
    its memory and process the aggregate; GPU 1 as before."""
    node = mig_node()
    backend = NvmlBackend(simulated_pynvml(node, binding=release))
    backend.open()
    try:
        readings = backend.poll(slow=True)
        missing: Any = backend._missing
        assert not missing, missing
    finally:
        backend.close()
    mig, plain = (r.sample for r in readings)
    assert mig is not None and plain is not None
    assert mig.mig_enabled is True and plain.mig_enabled is False
    assert mig.utilization_ratio is None and mig.compute_mode is None
    assert mig.process_pids == node.mig_job_pids(0) and mig.memory_used_bytes == int(40448 * MIB * 0.9)
    assert plain.utilization_ratio == 0.0 and plain.compute_mode == "default"


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (MigLayout((MigInstanceSpec("5g.50gb"),)), "unknown MIG profile '5g.50gb'"),
        (MigLayout((MigInstanceSpec("3g.40gb", start=2),)), "cannot start at memory slice 2"),
        (MigLayout((MigInstanceSpec("3g.40gb", start=4), MigInstanceSpec("2g.20gb", start=4))), "no free placement"),
        (MigLayout(tuple(MigInstanceSpec("3g.40gb") for _ in range(3))), "at most 2"),
        (MigLayout((MigInstanceSpec("2g.20gb", compute_slices=(1, 2)),)), "do not fit"),
    ],
)
def test_a_layout_the_driver_would_refuse_is_named(layout: MigLayout, message: str) -> None:
    """A layout no H100 could have is refused when the node is made, naming the GPU and what is wrong."""
    with pytest.raises(ValueError, match=f"GPU 0: .*{message}"):
        SimulatedNode("healthy", gpus=1, mig={0: layout})
    with pytest.raises(ValueError, match="GPU 3, but the node has GPUs 0-0"):
        SimulatedNode("healthy", gpus=1, mig={3: SCENARIO_LAYOUT})
    with pytest.raises(ValueError, match="NVIDIA"):
        SimulatedNode("healthy", gpus=1, vendor="amd", mig={0: SCENARIO_LAYOUT})
