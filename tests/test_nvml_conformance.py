"""The simulated libnvidia-ml holds to nvml.h as nvidia-ml-py sees it, in the oldest and the newest release.

The simulation sits under the vendor's own Python: pynvml's wrappers build the structs, pass pointers and raise
the errors. What is left to hold is the C side: the library exports only symbols pynvml looks up, fills structs
laid out as pynvml's, and uses nvml.h's numbers. The backend then runs over each release (test_backend_nvml.py).
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path
from typing import Any

import pytest
from nvml_bindings import OLDEST, RELEASES, binding_path

from gpuwatch.backends.nvml import NvmlBackend
from gpuwatch.backends.nvml_slow import _fabric_health
from gpuwatch.core.model import GpuSample
from gpuwatch.simulated import nvml_constants
from gpuwatch.simulated.bindings import load_module_copy, simulated_pynvml
from gpuwatch.simulated.libnvml import ERROR_STRINGS, PROTOTYPES
from gpuwatch.simulated.nvml_structs import (
    BINDING_NAMES,
    MISLAID_IN_OLDEST,
    NEWER_BINDING_NAMES,
    nvmlGpmMetric_t,
    nvmlGpmMetricsGetHeader_t,
)
from gpuwatch.simulated.scenarios import SimulatedNode


def _symbols_looked_up(path: Path) -> set[str]:
    return set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', path.read_text()))


@pytest.fixture(params=RELEASES)
def release(request: pytest.FixtureRequest) -> Path:
    return binding_path(request.param)


def test_every_exported_symbol_is_one_pynvml_looks_up() -> None:
    """A symbol no release of pynvml asks for could only be reached by our own code (pynvml.py:
    ``_nvmlGetFunctionPointer(name)`` is the only door to the library)."""
    looked_up = set().union(*(_symbols_looked_up(binding_path(r)) for r in RELEASES))
    assert len(PROTOTYPES) > 60
    assert set(PROTOTYPES) <= looked_up, sorted(set(PROTOTYPES) - looked_up)


def test_structs_are_laid_out_as_the_bindings_structs(release: Path) -> None:
    """pynvml hands over ``byref(its_struct)``; the library writes at its own offsets: sizes and offsets agree."""
    module = load_module_copy(release, "layout")
    for ours, name in BINDING_NAMES.items():
        if name in NEWER_BINDING_NAMES and f"nvidia-ml-py-{OLDEST}" in str(release):
            assert not hasattr(module, name), f"{name} is in {OLDEST} after all: drop it from NEWER_BINDING_NAMES"
            continue
        theirs = getattr(module, name)
        if name in MISLAID_IN_OLDEST and f"nvidia-ml-py-{OLDEST}" in str(release):
            assert ctypes.sizeof(ours) != ctypes.sizeof(theirs), f"{name} fixed in {OLDEST}: drop MISLAID_IN_OLDEST"
            continue
        assert ctypes.sizeof(ours) == ctypes.sizeof(theirs), name
        for field_name, *_ in theirs._fields_:
            assert getattr(ours, field_name).offset == getattr(theirs, field_name).offset, (name, field_name)


def test_gpm_metrics_get_is_laid_out_as_the_bindings(release: Path) -> None:
    """nvmlGpmMetricsGet_t ends in ``metrics[NVML_GPM_METRIC_MAX]`` and each release has its own MAX (nvml.h:
    98 in 12.570, 477 in 13.615): the header's fields sit where the binding's do, the array starts right after it,
    and the binding's size is header + its MAX metrics, so the library, reading ``numMetrics`` entries, fits both."""
    module = load_module_copy(release, "gpm_layout")
    theirs = module.c_nvmlGpmMetricsGet_t
    for field_name, *_ in nvmlGpmMetricsGetHeader_t._fields_:
        assert getattr(nvmlGpmMetricsGetHeader_t, field_name).offset == getattr(theirs, field_name).offset
    assert theirs.metrics.offset == ctypes.sizeof(nvmlGpmMetricsGetHeader_t)
    expected = ctypes.sizeof(nvmlGpmMetricsGetHeader_t) + module.NVML_GPM_METRIC_MAX * ctypes.sizeof(nvmlGpmMetric_t)
    assert ctypes.sizeof(theirs) == expected
    assert ctypes.sizeof(module.c_nvmlGpmSample_t) == ctypes.sizeof(ctypes.c_void_p)  # an opaque pointer


def test_gpm_prototypes_take_the_arguments_pynvml_passes() -> None:
    """nvml.h: nvmlGpmSampleGet(device, sample), nvmlGpmMigSampleGet(device, unsigned gpuInstanceId, sample),
    nvmlGpmQueryDeviceSupport(device, nvmlGpmSupport_t *), nvmlGpmSampleAlloc(nvmlGpmSample_t *),
    nvmlGpmSampleFree(sample), nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *) (go-nvml gen/nvml/nvml.h, 13.3.29)."""
    pointer, uint = ctypes.c_void_p, ctypes.c_uint
    expected = {
        "nvmlGpmSampleGet": (pointer, pointer),
        "nvmlGpmMigSampleGet": (pointer, uint, pointer),
        "nvmlGpmQueryDeviceSupport": (pointer, pointer),
        "nvmlGpmSampleAlloc": (pointer,),
        "nvmlGpmSampleFree": (pointer,),
        "nvmlGpmMetricsGet": (pointer,),
    }
    assert {name: PROTOTYPES[name][0] for name in expected} == expected


def test_constants_have_the_header_values() -> None:
    """nvml_constants is nvml.h of the newest release: every value as the installed pynvml defines it."""
    module = load_module_copy(binding_path("installed"), "constants")
    names = [n for n in dir(nvml_constants) if not n.startswith("_") and isinstance(getattr(nvml_constants, n), int)]
    assert len(names) > 300
    for name in names:
        assert getattr(module, name) == getattr(nvml_constants, name), name


def test_error_strings_and_classes_come_from_pynvml(release: Path) -> None:
    """NVMLError.__str__ asks the library (pynvml.py: nvmlErrorString sets restype c_char_p on the pointer);
    the class per code is pynvml's own (_extractNVMLErrorsAsClasses)."""
    lib = simulated_pynvml(SimulatedNode("healthy", gpus=1), binding=release)
    for code, text in ERROR_STRINGS.items():
        assert lib.nvmlErrorString(code) in (text, text.encode())
    lib.nvmlInit()
    with pytest.raises(lib.NVMLError_NotSupported, match="Not Supported"):
        lib.nvmlDeviceGetFanSpeed(lib.nvmlDeviceGetHandleByIndex(0))
    with pytest.raises(lib.NVMLError_FunctionNotFound):
        lib.nvmlDeviceGetGpuOperationMode(lib.nvmlDeviceGetHandleByIndex(0))  # a symbol this library lacks


def test_handles_and_event_sets_are_unhashable_ctypes_pointers(release: Path) -> None:
    """pynvml returns ``c_nvmlDevice_t()`` / ``c_nvmlEventSet_t()`` (POINTER(struct)), a fresh object per call:
    two handles of one GPU compare unequal and neither can be a dict key; only their address identifies them."""
    lib = simulated_pynvml(SimulatedNode("healthy", gpus=2), binding=release)
    lib.nvmlInit()
    first, again = lib.nvmlDeviceGetHandleByIndex(0), lib.nvmlDeviceGetHandleByIndex(0)
    event_set = lib.nvmlEventSetCreate()
    for pointer in (first, event_set):
        assert isinstance(pointer, ctypes._Pointer)
        with pytest.raises(TypeError):
            hash(pointer)
    assert first != again
    assert ctypes.addressof(first.contents) == ctypes.addressof(again.contents)


def test_events_carry_the_device_pointer(release: Path) -> None:
    """nvmlEventData_t.device is the nvmlDevice_t of the GPU (nvml.h), equal by address to its handle."""
    node = SimulatedNode("healthy", gpus=2, clock=lambda: 5.0, wall_clock=lambda: 1.8e9)
    lib = simulated_pynvml(node, binding=release)
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(1)
    event_set = lib.nvmlEventSetCreate()
    node.faults.emit_xid(1, 79)  # before registration: never delivered
    lib.nvmlDeviceRegisterEvents(handle, lib.nvmlEventTypeXidCriticalError, event_set)
    node.faults.emit_xid(1, 48)
    data = lib.nvmlEventSetWait_v2(event_set, 1000)
    assert (data.eventType, data.eventData) == (lib.nvmlEventTypeXidCriticalError, 48)
    assert ctypes.addressof(data.device.contents) == ctypes.addressof(handle.contents)
    with pytest.raises(lib.NVMLError_Timeout):
        lib.nvmlEventSetWait_v2(event_set, 10)


def test_the_backend_finds_every_function_it_uses(release: Path) -> None:
    """Over a release's pynvml the backend opens, polls both tiers and never meets a missing function: every
    symbol it reaches is one the simulated library has (a gap would hide a path from the tests)."""
    node = SimulatedNode("busy", gpus=2, clock=lambda: 5.0, wall_clock=lambda: 1.8e9)
    backend = NvmlBackend(simulated_pynvml(node, binding=release))
    backend.open()
    try:
        readings = backend.poll(slow=True)
        assert [r.sample is not None for r in readings] == [True, True]
        missing: Any = backend._missing  # functions that answered FunctionNotFound
        assert not missing, missing
    finally:
        backend.close()


def test_inforom_versions_follow_nvml_h(release: Path) -> None:
    """nvml.h 13.3.29 (cuda_nvml_dev), line 5281: nvmlDeviceGetInforomImageVersion(device, char *version, unsigned
    int length); line 5254: nvmlDeviceGetInforomVersion(device, nvmlInforomObject_t object, char *version, unsigned
    int length), InsufficientSize when `length` is too small, NotSupported for what the board lacks. The simulated
    H100 answers as the fixture's card (nvidia-smi -q: image G520.0200.00.05, OEM 2.1, ECC 7.16, Power N/A), through
    the release's own wrappers; the backend reads them for `gpuwatch report`, keyed as nvidia-smi names them."""
    pointer, uint = ctypes.c_void_p, ctypes.c_uint
    assert PROTOTYPES["nvmlDeviceGetInforomImageVersion"][0] == (pointer, pointer, uint)
    assert PROTOTYPES["nvmlDeviceGetInforomVersion"][0] == (pointer, uint, pointer, uint)
    node = SimulatedNode("healthy", gpus=2)
    lib = simulated_pynvml(node, binding=release)
    lib.nvmlInit()
    try:
        handle = lib.nvmlDeviceGetHandleByIndex(1)
        assert lib.nvmlDeviceGetInforomImageVersion(handle) in ("G520.0200.00.05", b"G520.0200.00.05")
        assert lib.nvmlDeviceGetInforomVersion(handle, lib.NVML_INFOROM_OEM) in ("2.1", b"2.1")
        assert lib.nvmlDeviceGetInforomVersion(handle, lib.NVML_INFOROM_ECC) in ("7.16", b"7.16")
        with pytest.raises(lib.NVMLError_NotSupported):
            lib.nvmlDeviceGetInforomVersion(handle, lib.NVML_INFOROM_POWER)
        with pytest.raises(lib.NVMLError_InvalidArgument):
            lib.nvmlDeviceGetInforomVersion(handle, 99)
        # The C side: a buffer of 4 bytes cannot hold "G520.0200.00.05" and its NUL.
        small = ctypes.create_string_buffer(4)
        image = lib._nvmlGetFunctionPointer("nvmlDeviceGetInforomImageVersion")
        assert image(handle, small, ctypes.c_uint(4)) == lib.NVML_ERROR_INSUFFICIENT_SIZE
        node.faults.lose_gpu(1)
        with pytest.raises(lib.NVMLError_GpuIsLost):
            lib.nvmlDeviceGetInforomVersion(handle, lib.NVML_INFOROM_ECC)
    finally:
        lib.nvmlShutdown()
    lost = SimulatedNode("healthy", gpus=2)
    backend = NvmlBackend(simulated_pynvml(lost, binding=release))
    backend.open()
    expected = {
        "board_part_number": "695-2G520-0200-000",
        "inforom_image_version": "G520.0200.00.05",
        "inforom_oem_object_version": "2.1",
        "inforom_ecc_object_version": "7.16",
        "inforom_power_object_version": None,
    }
    try:
        uuid = backend.gpus()[1].uuid
        assert backend.case_identity(uuid) == expected
        assert backend.case_identity("GPU-not-here") == {}
        lost.faults.lose_gpu(1)
        gone = backend.case_identity(uuid)
        assert set(gone) == {*expected, "unavailable"} and not any(gone[k] for k in expected)
        assert "lost" in str(gone["unavailable"]).lower()
    finally:
        backend.close()


def test_fabric_info_answers_versions_2_and_3_and_the_backend_reads_what_each_release_asks(release: Path) -> None:
    """nvmlDeviceGetGpuFabricInfoV takes nvmlGpuFabricInfo_v2 (0x02000024: the health mask) or _v3 (0x3000028: and
    healthSummary), other versions ArgumentVersionMismatch (nvidia-ml-py 13.615.71 pynvml.py 7260-7290). The mask
    packs two-bit fields, NOT_SUPPORTED 0 / TRUE 1 / FALSE 2: DEGRADED_BW at shift 0, ROUTE_RECOVERY 2,
    ROUTE_UNHEALTHY 4, ACCESS_TIMEOUT_RECOVERY 6, and INCORRECT_CONFIGURATION's four bits at 8 (NONE 1) (nvml.h,
    NVIDIA/go-nvml pkg/nvml/nvml.h 3845-3896 at 2f9e261)."""
    node = SimulatedNode("fabric_degraded", gpus=4)
    lib = simulated_pynvml(node, binding=release)
    lib.nvmlInit()
    try:
        handle = lib.nvmlDeviceGetHandleByIndex(2)
        v2 = lib.c_nvmlGpuFabricInfoV_t()
        lib.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(v2))
        assert v2.state == lib.NVML_GPU_FABRIC_STATE_COMPLETED and v2.status == lib.NVML_SUCCESS
        assert v2.healthMask & 0x3 == lib.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
        assert (v2.healthMask >> 4) & 0x3 == lib.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE
        wrong = lib.c_nvmlGpuFabricInfoV_t()
        wrong.version = 0x04000000 | ctypes.sizeof(wrong)
        with pytest.raises(lib.NVMLError_ArgumentVersionMismatch):
            lib.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(wrong))
        if hasattr(lib, "c_nvmlGpuFabricInfo_v3_t"):
            v3 = lib.c_nvmlGpuFabricInfo_v3_t()
            lib.nvmlDeviceGetGpuFabricInfoV(lib.nvmlDeviceGetHandleByIndex(0), ctypes.byref(v3))
            assert v3.healthSummary == lib.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
            assert (v3.healthMask >> 8) & 0xF == lib.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE
    finally:
        lib.nvmlShutdown()
    backend = NvmlBackend(simulated_pynvml(node, binding=release))
    backend.open()
    try:
        faulted = next(r.sample for r in backend.poll(slow=True) if r.identity.index == 2)
    finally:
        backend.close()
    mask_conditions = {
        "degraded_bandwidth": True,
        "route_recovery": False,
        "route_unhealthy": False,
        "access_timeout_recovery": False,
        "incorrect_configuration": False,
    }
    # The oldest release has no v3 struct: the backend reads the mask alone, and no summary condition.
    summary = {"unhealthy": False, "limited_capacity": True} if f"nvidia-ml-py-{OLDEST}" not in str(release) else {}
    assert faulted is not None and faulted.fabric_health == {**mask_conditions, **summary}


def _fabric_sample(release: Path, index: int, **library: Any) -> GpuSample:
    """GPU `index` of a fabric_degraded node as the backend reads it on a slow poll, over `library`'s driver."""
    backend = NvmlBackend(simulated_pynvml(SimulatedNode("fabric_degraded", gpus=4), binding=release, **library))
    backend.open()
    try:
        sample = next(r.sample for r in backend.poll(slow=True) if r.identity.index == index)
    finally:
        backend.close()
    assert sample is not None
    return sample


def test_a_driver_before_580_refuses_version_3_and_the_backend_reads_the_mask(release: Path) -> None:
    """nvmlGpuFabricInfo_v3 came with nvml.h 13.0 (driver 580): a 570 driver answers ArgumentVersionMismatch to it
    and version 2 as before; the backend falls back and reads the mask's conditions, no summary."""
    lib = simulated_pynvml(SimulatedNode("fabric_degraded", gpus=4), binding=release, driver_version="570.172.08")
    lib.nvmlInit()
    try:
        if hasattr(lib, "c_nvmlGpuFabricInfo_v3_t"):
            with pytest.raises(lib.NVMLError_ArgumentVersionMismatch):
                lib.nvmlDeviceGetGpuFabricInfoV(
                    lib.nvmlDeviceGetHandleByIndex(0), ctypes.byref(lib.c_nvmlGpuFabricInfo_v3_t())
                )
    finally:
        lib.nvmlShutdown()
    sample = _fabric_sample(release, 2, driver_version="570.172.08")
    assert sample.fabric_healthy is True
    assert sample.fabric_health["degraded_bandwidth"] is True and "limited_capacity" not in sample.fabric_health


def test_a_driver_without_the_versioned_call_is_read_by_the_unversioned_one(release: Path) -> None:
    """Drivers 525-545 (R535 among them) have nvmlDeviceGetGpuFabricInfo and not ...InfoV (NVML 12.4): the
    registration state is read from nvmlGpuFabricInfo_t (nvml.h 3834-3840: 28 bytes, state an unsigned char) into
    the backend's own struct, since 12.570.86's binding lays it out wrong; no health conditions are invented."""
    lib = simulated_pynvml(SimulatedNode("fabric_degraded", gpus=4), binding=release)
    lib.nvmlInit()
    try:
        if f"nvidia-ml-py-{OLDEST}" not in str(release):
            info = lib.c_nvmlGpuFabricInfo_t()
            lib.nvmlDeviceGetGpuFabricInfo(lib.nvmlDeviceGetHandleByIndex(1), ctypes.byref(info))
            assert (info.state, info.status) == (lib.NVML_GPU_FABRIC_STATE_COMPLETED, lib.NVML_SUCCESS)
    finally:
        lib.nvmlShutdown()
    old = {"driver_version": "535.261.03", "missing_symbols": {"nvmlDeviceGetGpuFabricInfoV"}}
    sample = _fabric_sample(release, 2, **old)
    assert sample.fabric_healthy is True and sample.fabric_health == {}
    pcie = NvmlBackend(simulated_pynvml(SimulatedNode("healthy", gpus=1), binding=release, **old))  # no NVLink
    pcie.open()
    try:
        plain = pcie.poll(slow=True)[0].sample
        assert plain is not None and plain.fabric_healthy is None  # state NOT_SUPPORTED: no fabric, no series
    finally:
        pcie.close()


def test_an_incorrect_fabric_configuration_is_named() -> None:
    """INCORRECT_CONFIGURATION's values (nvidia-ml-py 13.615.71 pynvml.py 7230-7239): 5 INSUFFICIENT_NVLINKS."""
    sample = GpuSample("GPU-x", 0.0)
    _fabric_health((2 << 0) | (2 << 2) | (2 << 4) | (2 << 6) | (5 << 8), 2, sample)
    assert sample.fabric_health["incorrect_configuration"] is True and sample.fabric_health["unhealthy"] is True
    assert sample.fabric_misconfiguration == "insufficient NVLinks"
    none_supported = GpuSample("GPU-y", 0.0)
    _fabric_health(0, 0, none_supported)
    assert none_supported.fabric_health == {} and none_supported.fabric_misconfiguration is None
