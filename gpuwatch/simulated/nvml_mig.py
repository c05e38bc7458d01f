"""MIG in the simulated libnvidia-ml: MIG device handles, GPU and compute instances, as nvml.h's "Multi Instance GPU
Management" group documents them (go-nvml gen/nvml/nvml.h, NVML 13.3.29, lines 12474-13461; line numbers below are
that file's).

A MIG device handle is an nvmlDevice_t like a GPU's (line 13337: "A MIG device handle is an NVML abstraction which maps
to a MIG compute instance ... can be used (with some restrictions) interchangeably with a GPU device handle"): the
address of a small block of memory the library keeps per MIG device for its lifetime, so a second look-up gives an
identical handle (line 4818) and a destroyed instance's handle answers InvalidArgument ("the MIG device handle would
remain invalid and must be requested again", line 13421). GPU instance and compute instance handles
(nvmlGpuInstance_t, nvmlComputeInstance_t) are made the same way. Which calls take a MIG device handle, and what the
others answer on one, is libnvml.py's gate (`_Driver._enter`): the calls whose nvml.h entry names "the device handle or
MIG device handle" answer for the instance, every other device call answers NotSupported.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from ctypes import POINTER, c_uint, c_void_p, cast
from typing import Any, TypeVar

from gpuwatch.simulated import mig as mig_model
from gpuwatch.simulated import nvml_constants as c
from gpuwatch.simulated.mig import ComputeInstance, GpuInstance, GpuInstanceProfile, MigDevice
from gpuwatch.simulated.nvml_errors import NvmlFailure
from gpuwatch.simulated.nvml_structs import (
    nvmlComputeInstanceInfo_t,
    nvmlComputeInstanceProfileInfo_t,
    nvmlComputeInstanceProfileInfo_v2_t,
    nvmlDeviceAttributes_t,
    nvmlGpuInstanceInfo_t,
    nvmlGpuInstanceProfileInfo_t,
    nvmlGpuInstanceProfileInfo_v2_t,
)
from gpuwatch.simulated.scenarios import GpuSpec, SimulatedNode

_P = c_void_p
_Impl = TypeVar("_Impl", bound=Callable[..., Any])
MIG_PROTOTYPES: dict[str, tuple[tuple[Any, ...], str]] = {}
_MIG_CAPABLE_MAJOR = 8  # "For Ampere or newer fully supported devices" (every MIG call's entry)


def _export(*argtypes: Any) -> Callable[[_Impl], _Impl]:
    def register(method: _Impl) -> _Impl:
        MIG_PROTOTYPES[method.__name__] = (argtypes, method.__name__)
        return method

    return register


class _Handles:
    """Opaque handles the library gives out: one block of memory per key, its address the handle, for as long as
    the library lives (an address is never reused for another key)."""

    def __init__(self) -> None:
        self._memory: dict[tuple[int, ...], ctypes.Array[ctypes.c_char]] = {}
        self._keys: dict[int, tuple[int, ...]] = {}

    def address(self, key: tuple[int, ...]) -> int:
        memory = self._memory.get(key)
        if memory is None:
            memory = self._memory[key] = ctypes.create_string_buffer(8)
            self._keys[ctypes.addressof(memory)] = key
        return ctypes.addressof(memory)

    def key(self, address: int | None) -> tuple[int, ...] | None:
        return self._keys.get(address or 0)


class MigFunctions:
    """The MIG C functions, mixed into the library's driver (libnvml._Driver), which provides the gate every call
    passes (`_enter`, `_enter_any`), the node and each GPU's handle."""

    node: SimulatedNode
    compute_capability_override: tuple[int, int] | None = None

    def _enter(
        self, names: tuple[str, ...], device: int | None = None, *, needs_device: bool = False, about: int | None = None
    ) -> int:
        raise NotImplementedError

    def _enter_any(
        self, names: tuple[str, ...], device: int | None = None, *, about: int | None = None
    ) -> tuple[int, MigDevice | None]:
        raise NotImplementedError

    def device_handle_address(self, index: int) -> int:
        raise NotImplementedError

    @property
    def _mig_handles(self) -> tuple[_Handles, _Handles, _Handles]:
        """MIG devices, GPU instances and compute instances given out, by key."""
        found: tuple[_Handles, _Handles, _Handles] | None = self.__dict__.get("_mig_handle_tables")
        if found is None:
            found = self.__dict__["_mig_handle_tables"] = (_Handles(), _Handles(), _Handles())
        return found

    # --- resolving handles ------------------------------------------------------------------------------------
    def mig_device_at(self, address: int | None) -> MigDevice | None:
        """The MIG device whose handle `address` is, None when it is none or its instance is gone."""
        key = self._mig_handles[0].key(address)
        if key is None:
            return None
        return next((d for d in self.node.mig_devices(key[0]) if d.key == key), None)

    def mig_device_address(self, device: MigDevice) -> int:
        return self._mig_handles[0].address(device.key)

    def _gpu_instance(self, name: str, address: int | None) -> tuple[int, GpuInstance]:
        """The live GPU instance an nvmlGpuInstance_t points at (InvalidArgument for anything else), through the gate:
        faults and a lost parent GPU apply."""
        key = self._mig_handles[1].key(address)
        self._enter((name,), about=key[0] if key else None)
        gi = self._live_gpu_instance(key)
        if key is None or gi is None:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        if self.node.is_lost(key[0]):
            raise NvmlFailure(c.NVML_ERROR_GPU_IS_LOST)
        return key[0], gi

    def _live_gpu_instance(self, key: tuple[int, ...] | None) -> GpuInstance | None:
        if key is None:
            return None
        view = self.node.mig(key[0])
        return None if view is None else next((gi for gi in view.instances if gi.serial == key[1]), None)

    def _gpu_instance_address(self, gpu: int, gi: GpuInstance) -> int:
        return self._mig_handles[1].address((gpu, gi.serial))

    def _compute_instance_address(self, gpu: int, gi: GpuInstance, ci: ComputeInstance) -> int:
        return self._mig_handles[2].address((gpu, gi.serial, ci.serial))

    def _mig_capable(self, index: int) -> bool:
        major = (self.compute_capability_override or self.node.spec(index).compute_capability)[0]
        return major >= _MIG_CAPABLE_MAJOR

    def mig_enabled(self, index: int) -> bool:
        """Whether GPU `index` runs in MIG mode now (its current mode)."""
        view = self.node.mig(index)
        return view is not None and view.enabled

    def _enabled_view(self, index: int) -> mig_model.MigView:
        """GPU `index`'s MIG state; NotSupported "if device doesn't have MIG mode enabled" (lines 12855, 13034)."""
        view = self.node.mig(index)
        if view is None or not view.enabled or not self._mig_capable(index):
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        return view

    # --- MIG mode and MIG devices ---------------------------------------------------------------------------------
    @_export(_P, _P, _P)
    def nvmlDeviceGetMigMode(self, device: int, current: int, pending: int) -> None:
        """Lines 12783-12803: the current mode and the one after the next reset; NotSupported "if device doesn't
        support MIG mode" (before Ampere)."""
        index = self._enter(("nvmlDeviceGetMigMode",), device, needs_device=True)
        if not self._mig_capable(index):
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        view = self.node.mig(index)
        modes = (False, False) if view is None else (view.enabled, view.pending)
        _write(current, c_uint, c.NVML_DEVICE_MIG_ENABLE if modes[0] else c.NVML_DEVICE_MIG_DISABLE)
        _write(pending, c_uint, c.NVML_DEVICE_MIG_ENABLE if modes[1] else c.NVML_DEVICE_MIG_DISABLE)

    @_export(_P, _P)
    def nvmlDeviceGetMaxMigDeviceCount(self, device: int, out: int) -> None:
        """Lines 13398-13414: how many MIG devices can exist under the GPU, "zero if MIG is not supported or enabled"
        (the fixture's idle H100: 0)."""
        index = self._enter(("nvmlDeviceGetMaxMigDeviceCount",), device, needs_device=True)
        enabled = self.mig_enabled(index) and self._mig_capable(index)
        _write(out, c_uint, mig_model.MAX_MIG_DEVICES if enabled else 0)

    @_export(_P, c_uint, _P)
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: int, index: int, out: int) -> None:
        """Lines 13417-13441: NotSupported while MIG is off, InvalidArgument for an index past the maximum count,
        NotFound "if no valid MIG device was found at index". The simulated driver numbers MIG devices 0..n-1 by GPU
        instance ID, then compute instance ID, so NotFound answers every index from n on."""
        gpu = self._enter(("nvmlDeviceGetMigDeviceHandleByIndex",), device, needs_device=True)
        self._enabled_view(gpu)
        if not 0 <= index < mig_model.MAX_MIG_DEVICES or not out:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        found = next((d for d in self.node.mig_devices(gpu) if d.index == index), None)
        if found is None:
            raise NvmlFailure(c.NVML_ERROR_NOT_FOUND)
        _write(out, c_void_p, self.mig_device_address(found))

    @_export(_P, _P)
    def nvmlDeviceIsMigDeviceHandle(self, device: int, out: int) -> None:
        """Lines 13335-13354: 1 for a MIG device handle, 0 for a GPU's."""
        _, mig = self._enter_any(("nvmlDeviceIsMigDeviceHandle",), device)
        _write(out, c_uint, int(mig is not None))

    @_export(_P, _P)
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, device: int, out: int) -> None:
        """Lines 13444-13459: the parent GPU's handle; a GPU's own handle is not a MIG device handle: InvalidArgument
        ("if migDevice or device is invalid")."""
        gpu, mig = self._enter_any(("nvmlDeviceGetDeviceHandleFromMigDeviceHandle",), device)
        if mig is None:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        _write(out, c_void_p, self.device_handle_address(gpu))

    @_export(_P, _P)
    def nvmlDeviceGetGpuInstanceId(self, device: int, out: int) -> None:
        """Lines 13357-13374: the GPU instance ID of a MIG device; a GPU's handle: NotSupported ("if this query is
        not supported by the device")."""
        _write(out, c_uint, self._mig_only("nvmlDeviceGetGpuInstanceId", device).gpu_instance.id)

    @_export(_P, _P)
    def nvmlDeviceGetComputeInstanceId(self, device: int, out: int) -> None:
        """Lines 13377-13395: the compute instance ID, unique within its GPU instance."""
        _write(out, c_uint, self._mig_only("nvmlDeviceGetComputeInstanceId", device).compute_instance.id)

    @_export(_P, _P)
    def nvmlDeviceGetAttributes_v2(self, device: int, out: int) -> None:
        """Lines 4575-4593 ("This API currently only supports MIG device handles"), nvmlDeviceAttributes_t lines
        362-373: the compute instance's SMs, the GPU instance's engines (shared by its compute instances), both slice
        counts and the GPU instance's memory."""
        mig = self._mig_only("nvmlDeviceGetAttributes_v2", device)
        attributes = _struct(out, nvmlDeviceAttributes_t)
        profile = mig.gpu_instance.profile
        attributes.multiprocessorCount = mig.multiprocessors
        attributes.sharedCopyEngineCount = profile.copy_engines
        attributes.sharedDecoderCount = profile.decoders
        attributes.sharedEncoderCount = profile.encoders
        attributes.sharedJpegCount = profile.jpegs
        attributes.sharedOfaCount = profile.ofas
        attributes.gpuInstanceSliceCount = profile.slices
        attributes.computeInstanceSliceCount = mig.compute_instance.slices
        attributes.memorySizeMB = profile.memory_mib

    def _mig_only(self, name: str, device: int) -> MigDevice:
        _, mig = self._enter_any((name,), device)
        if mig is None:
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        return mig

    # --- GPU instance profiles and GPU instances ------------------------------------------------------------------
    @_export(_P, c_uint, _P)
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: int, profile: int, out: int) -> None:
        """Lines 12806-12828 (the unversioned struct)."""
        found = self._profile("nvmlDeviceGetGpuInstanceProfileInfo", device, profile=profile)
        _fill_gpu_instance_profile(_struct(out, nvmlGpuInstanceProfileInfo_t), found)

    @_export(_P, c_uint, _P)
    def nvmlDeviceGetGpuInstanceProfileInfoV(self, device: int, profile: int, out: int) -> None:
        """Lines 12830-12859: the versioned struct, its version set by the caller; InvalidArgument "if ... info->version
        [is] invalid", NotSupported "if device doesn't have MIG mode enabled or profile isn't supported"."""
        found = self._profile("nvmlDeviceGetGpuInstanceProfileInfoV", device, profile=profile)
        self._fill_v2(out, found)

    @_export(_P, c_uint, _P)
    def nvmlDeviceGetGpuInstanceProfileInfoByIdV(self, device: int, profile_id: int, out: int) -> None:
        """Lines 12861-12890: the same by profile ID (9 for 3g.40gb) instead of NVML_GPU_INSTANCE_PROFILE_*."""
        found = self._profile("nvmlDeviceGetGpuInstanceProfileInfoByIdV", device, profile_id=profile_id)
        self._fill_v2(out, found)

    def _fill_v2(self, out: int, profile: GpuInstanceProfile) -> None:
        info = _struct(out, nvmlGpuInstanceProfileInfo_v2_t)
        if info.version != c.nvmlGpuInstanceProfileInfo_v2:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        _fill_gpu_instance_profile(info, profile)
        info.name = f"MIG {profile.name}".encode()

    def _profile(
        self, name: str, device: int, *, profile: int | None = None, profile_id: int | None = None
    ) -> GpuInstanceProfile:
        """A GPU instance profile by enum (InvalidArgument past NVML_GPU_INSTANCE_PROFILE_COUNT: line 12811, "invoking
        it on profile values starting from 0, until the API returns NVML_ERROR_INVALID_ARGUMENT"; NotSupported for one
        an H100 lacks) or by ID (InvalidArgument for an ID it lacks)."""
        index = self._enter((name,), device, needs_device=True)
        self._enabled_view(index)
        if profile is not None:
            if not 0 <= profile < c.NVML_GPU_INSTANCE_PROFILE_COUNT:
                raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
            found = mig_model.PROFILES_BY_ENUM.get(profile)
            if found is None:
                raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
            return found
        found = mig_model.PROFILES_BY_ID.get(profile_id if profile_id is not None else -1)
        if found is None:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        return found

    @_export(_P, c_uint, _P, _P)
    def nvmlDeviceGetGpuInstances(self, device: int, profile_id: int, out: int, count: int) -> None:
        """Lines 13017-13038: the GPU instances of one profile ID, in a buffer the caller sized for the profile's
        instanceCount; *count is how many were written."""
        index = self._enter(("nvmlDeviceGetGpuInstances",), device, needs_device=True)
        view = self._enabled_view(index)
        if profile_id not in mig_model.PROFILES_BY_ID or not out or not count:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        found = [gi for gi in view.instances if gi.profile.id == profile_id]
        for i, gi in enumerate(found):
            cast(out, POINTER(c_void_p))[i] = self._gpu_instance_address(index, gi)
        _write(count, c_uint, len(found))

    @_export(_P, c_uint, _P)
    def nvmlDeviceGetGpuInstanceById(self, device: int, gi_id: int, out: int) -> None:
        """Lines 13040-13059: NotFound "if the GPU instance is not found"."""
        index = self._enter(("nvmlDeviceGetGpuInstanceById",), device, needs_device=True)
        gi = self._enabled_view(index).gpu_instance(gi_id)
        if gi is None:
            raise NvmlFailure(c.NVML_ERROR_NOT_FOUND)
        _write(out, c_void_p, self._gpu_instance_address(index, gi))

    @_export(_P, _P)
    def nvmlGpuInstanceGetInfo(self, gpu_instance: int, out: int) -> None:
        """Lines 13061-13076, nvmlGpuInstanceInfo_t lines 12631-12637: the parent device, the ID, the profile ID and
        the placement (first memory slice, memory slices)."""
        gpu, gi = self._gpu_instance("nvmlGpuInstanceGetInfo", gpu_instance)
        info = _struct(out, nvmlGpuInstanceInfo_t)
        info.device = self.device_handle_address(gpu)
        info.id = gi.id
        info.profileId = gi.profile.id
        info.placement.start = gi.start
        info.placement.size = gi.profile.memory_slices

    # --- compute instances ------------------------------------------------------------------------------------
    @_export(_P, c_uint, c_uint, _P)
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: int, profile: int, engines: int, out: int) -> None:
        """Lines 13078-13103 (the unversioned struct)."""
        info = _struct(out, nvmlComputeInstanceProfileInfo_t)
        _fill_compute_instance_profile(
            info, *self._ci_profile("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, profile, engines)
        )

    @_export(_P, c_uint, c_uint, _P)
    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(self, gi: int, profile: int, engines: int, out: int) -> None:
        """Lines 13105-13137: versioned, with the profile's name (`MIG 1c.3g.40gb`; `MIG 3g.40gb` for the whole)."""
        found, slices = self._ci_profile("nvmlGpuInstanceGetComputeInstanceProfileInfoV", gi, profile, engines)
        info = _struct(out, nvmlComputeInstanceProfileInfo_v2_t)
        if info.version != c.nvmlComputeInstanceProfileInfo_v2:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        _fill_compute_instance_profile(info, found, slices)
        name = found.profile.name if slices == found.profile.slices else f"{slices}c.{found.profile.name}"
        info.name = f"MIG {name}".encode()

    def _ci_profile(self, name: str, address: int, profile: int, engines: int) -> tuple[GpuInstance, int]:
        """(the GPU instance, the compute slices of profile `profile`): InvalidArgument past the enums' counts,
        NotSupported for a profile larger than the GPU instance or one an H100 lacks."""
        _, gi = self._gpu_instance(name, address)
        if not 0 <= profile < c.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= engines < c.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        slices = next((s for s, p in mig_model.CI_PROFILE_BY_SLICES.items() if p == profile), None)
        if slices is None or slices > gi.profile.slices:
            raise NvmlFailure(c.NVML_ERROR_NOT_SUPPORTED)
        return gi, slices

    @_export(_P, c_uint, _P, _P)
    def nvmlGpuInstanceGetComputeInstances(self, gpu_instance: int, profile_id: int, out: int, count: int) -> None:
        """Lines 13270-13293: the compute instances of one profile ID (NVML_COMPUTE_INSTANCE_PROFILE_*: the compute
        profile IDs equal the enum, as `nvidia-smi mig -lci` shows profile ID 0 for a 1-slice one)."""
        gpu, gi = self._gpu_instance("nvmlGpuInstanceGetComputeInstances", gpu_instance)
        if not 0 <= profile_id < c.NVML_COMPUTE_INSTANCE_PROFILE_COUNT or not out or not count:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        found = [ci for ci in gi.compute_instances if mig_model.CI_PROFILE_BY_SLICES[ci.slices] == profile_id]
        for i, ci in enumerate(found):
            cast(out, POINTER(c_void_p))[i] = self._compute_instance_address(gpu, gi, ci)
        _write(count, c_uint, len(found))

    @_export(_P, c_uint, _P)
    def nvmlGpuInstanceGetComputeInstanceById(self, gpu_instance: int, ci_id: int, out: int) -> None:
        """Lines 13295-13315: NotFound "if the compute instance is not found"."""
        gpu, gi = self._gpu_instance("nvmlGpuInstanceGetComputeInstanceById", gpu_instance)
        ci = next((ci for ci in gi.compute_instances if ci.id == ci_id), None)
        if ci is None:
            raise NvmlFailure(c.NVML_ERROR_NOT_FOUND)
        _write(out, c_void_p, self._compute_instance_address(gpu, gi, ci))

    @_export(_P, _P)
    def nvmlComputeInstanceGetInfo_v2(self, compute_instance: int, out: int) -> None:
        """Lines 13317-13332, nvmlComputeInstanceInfo_t lines 12736-12743: parent device and GPU instance, the ID, the
        profile ID and the placement within the GPU instance's compute slices."""
        key = self._mig_handles[2].key(compute_instance)
        self._enter(("nvmlComputeInstanceGetInfo_v2", "nvmlComputeInstanceGetInfo"), about=key[0] if key else None)
        gi = self._live_gpu_instance(key[:2] if key else None)
        ci = None if gi is None or key is None else next((x for x in gi.compute_instances if x.serial == key[2]), None)
        if key is None or gi is None or ci is None:
            raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
        if self.node.is_lost(key[0]):
            raise NvmlFailure(c.NVML_ERROR_GPU_IS_LOST)
        info = _struct(out, nvmlComputeInstanceInfo_t)
        info.device = self.device_handle_address(key[0])
        info.gpuInstance = self._gpu_instance_address(key[0], gi)
        info.id = ci.id
        info.profileId = mig_model.CI_PROFILE_BY_SLICES[ci.slices]
        info.placement.start = ci.start
        info.placement.size = ci.slices


def mig_name(spec: GpuSpec, device: MigDevice) -> str:
    """nvmlDeviceGetName of a MIG device (line 4769: "MIG device names which can be used to identify devices based on
    their attributes"): the GPU's name and the profile, as nvidia-smi -L lists `MIG 3g.40gb Device 0`."""
    return f"{spec.model} MIG {device.name}"


def _fill_gpu_instance_profile(info: Any, profile: GpuInstanceProfile) -> None:
    info.id = profile.id
    info.isP2pSupported = 0  # nvidia-smi mig -lgip: P2P "No" for every H100 profile
    info.sliceCount = profile.slices
    info.instanceCount = profile.instance_count
    info.multiprocessorCount = profile.multiprocessors
    info.copyEngineCount = profile.copy_engines
    info.decoderCount = profile.decoders
    info.encoderCount = profile.encoders
    info.jpegCount = profile.jpegs
    info.ofaCount = profile.ofas
    info.memorySizeMB = profile.memory_mib


def _fill_compute_instance_profile(info: Any, gi: GpuInstance, slices: int) -> None:
    profile = gi.profile
    info.id = mig_model.CI_PROFILE_BY_SLICES[slices]
    info.sliceCount = slices
    info.instanceCount = profile.slices // slices
    info.multiprocessorCount = mig_model.compute_multiprocessors(gi, slices)
    info.sharedCopyEngineCount = profile.copy_engines
    info.sharedDecoderCount = profile.decoders
    info.sharedEncoderCount = profile.encoders
    info.sharedJpegCount = profile.jpegs
    info.sharedOfaCount = profile.ofas


_S = TypeVar("_S", bound=ctypes.Structure)


def _struct(address: int | None, struct: type[_S]) -> _S:
    if not address:
        raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
    return struct.from_address(address)


def _write(address: int | None, ctype: Any, value: int) -> None:
    if not address:
        raise NvmlFailure(c.NVML_ERROR_INVALID_ARGUMENT)
    cast(address, POINTER(ctype))[0] = value
