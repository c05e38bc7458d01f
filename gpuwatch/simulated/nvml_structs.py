"""The C structures of nvml.h that the simulated libnvidia-ml fills through the pointers pynvml passes.

These are the library's side of the ABI: plain ctypes layouts of the header's structs, independent of the
binding's own classes (pynvml hands over `byref(its_struct)`; the library only sees an address). The layout
test (tests/test_nvml_conformance.py) holds each one to every tested nvidia-ml-py's struct, size and offsets.
"""

from __future__ import annotations

from ctypes import (
    Structure,
    Union,
    c_char,
    c_double,
    c_int,
    c_int64,
    c_longlong,
    c_ubyte,
    c_uint,
    c_uint32,
    c_ulong,
    c_ulonglong,
    c_ushort,
    c_void_p,
)

from gpuwatch.simulated import nvml_constants as c


class nvmlMemory_t(Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class nvmlMemory_v2_t(Structure):
    _fields_ = [
        ("version", c_uint),
        ("total", c_ulonglong),
        ("reserved", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    ]


class nvmlUtilization_t(Structure):
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class nvmlPciInfo_t(Structure):
    _fields_ = [
        ("busIdLegacy", c_char * c.NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * c.NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]


class nvmlViolationTime_t(Structure):
    _fields_ = [("referenceTime", c_ulonglong), ("violationTime", c_ulonglong)]


class nvmlValue_t(Union):
    _fields_ = [
        ("dVal", c_double),
        ("uiVal", c_uint),
        ("ulVal", c_ulong),
        ("ullVal", c_ulonglong),
        ("sllVal", c_longlong),
        ("siVal", c_int),
        ("usVal", c_ushort),
    ]


class nvmlFieldValue_t(Structure):
    _fields_ = [
        ("fieldId", c_uint32),
        ("scopeId", c_uint32),
        ("timestamp", c_int64),
        ("latencyUsec", c_int64),
        ("valueType", c_uint),
        ("nvmlReturn", c_uint),
        ("value", nvmlValue_t),
    ]


class nvmlEventData_t(Structure):
    _fields_ = [
        ("device", c_void_p),  # nvmlDevice_t
        ("eventType", c_ulonglong),
        ("eventData", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]


class nvmlProcessInfo_t(Structure):
    """nvmlProcessInfo_v2_t; the _v3 calls fill the same layout."""

    _fields_ = [
        ("pid", c_uint),
        ("usedGpuMemory", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]


class nvmlTemperature_t(Structure):
    """nvmlTemperature_v1_t, the argument of nvmlDeviceGetTemperatureV."""

    _fields_ = [("version", c_uint), ("sensorType", c_uint), ("temperature", c_int)]


class nvmlMarginTemperature_t(Structure):
    _fields_ = [("version", c_uint), ("marginTemperature", c_int)]


class nvmlRowRemapperHistogramValues_t(Structure):
    _fields_ = [("max", c_uint), ("high", c_uint), ("partial", c_uint), ("low", c_uint), ("none", c_uint)]


class nvmlGpuFabricInfo_t(Structure):
    """nvmlDeviceGetGpuFabricInfo's unversioned struct (nvml.h, NVIDIA/go-nvml pkg/nvml/nvml.h 3834-3840 at
    2f9e261: clusterUuid[NVML_GPU_FABRIC_UUID_LEN 16], status, cliqueId, state; nvmlGpuFabricState_t is an unsigned
    char, 3829): 28 bytes. nvidia-ml-py 12.570.86 sizes clusterUuid by NVML_DEVICE_UUID_BUFFER_SIZE (80) instead:
    MISLAID_IN_OLDEST."""

    _fields_ = [("clusterUuid", c_ubyte * 16), ("status", c_uint), ("cliqueId", c_uint32), ("state", c_ubyte)]


class nvmlGpuFabricInfo_v2_t(Structure):
    """nvmlGpuFabricInfoV_t at version 2 (nvmlGpuFabricInfo_v2 = 0x02000024: version 2, 36 bytes)."""

    _fields_ = [
        ("version", c_uint),
        ("clusterUuid", c_ubyte * 16),
        ("status", c_uint),
        ("cliqueId", c_uint32),
        ("state", c_ubyte),
        ("healthMask", c_uint32),
    ]


class nvmlGpuFabricInfo_v3_t(Structure):
    """nvmlGpuFabricInfoV_t at version 3 (nvmlGpuFabricInfo_v3 = 0x3000028: version 3, 40 bytes): v2 and the
    one-byte healthSummary (nvidia-ml-py 13.615.71 pynvml.py c_nvmlGpuFabricInfo_v3_t, from nvml.h)."""

    _fields_ = [*nvmlGpuFabricInfo_v2_t._fields_, ("healthSummary", c_ubyte)]


class nvmlEccSramErrorStatus_v1_t(Structure):
    _fields_ = [
        ("version", c_uint),
        ("aggregateUncParity", c_ulonglong),
        ("aggregateUncSecDed", c_ulonglong),
        ("aggregateCor", c_ulonglong),
        ("volatileUncParity", c_ulonglong),
        ("volatileUncSecDed", c_ulonglong),
        ("volatileCor", c_ulonglong),
        ("aggregateUncBucketL2", c_ulonglong),
        ("aggregateUncBucketSm", c_ulonglong),
        ("aggregateUncBucketPcie", c_ulonglong),
        ("aggregateUncBucketMcu", c_ulonglong),
        ("aggregateUncBucketOther", c_ulonglong),
        ("bThresholdExceeded", c_uint),
    ]


class nvmlGpmMetricInfo_t(Structure):
    """The anonymous ``metricInfo`` struct of nvmlGpmMetric_t: three ``char *`` the library points at its names."""

    _fields_ = [("shortName", c_void_p), ("longName", c_void_p), ("unit", c_void_p)]


class nvmlGpmMetric_t(Structure):
    _fields_ = [
        ("metricId", c_uint),
        ("nvmlReturn", c_uint),
        ("value", c_double),
        ("metricInfo", nvmlGpmMetricInfo_t),
    ]


class nvmlGpmMetricsGetHeader_t(Structure):
    """nvmlGpmMetricsGet_t up to its ``metrics[NVML_GPM_METRIC_MAX]`` array, whose length each nvml.h release
    changes (98 in nvidia-ml-py 12.570, 477 in 13.615): the library reads only ``numMetrics`` entries after it."""

    _fields_ = [
        ("version", c_uint),
        ("numMetrics", c_uint),
        ("sample1", c_void_p),  # nvmlGpmSample_t: the address nvmlGpmSampleAlloc wrote
        ("sample2", c_void_p),
    ]


class nvmlGpmSupport_t(Structure):
    _fields_ = [("version", c_uint), ("isSupportedDevice", c_uint)]


class nvmlGpuInstancePlacement_t(Structure):
    _fields_ = [("start", c_uint), ("size", c_uint)]


_GPU_INSTANCE_PROFILE_FIELDS = [
    ("id", c_uint),
    ("isP2pSupported", c_uint),
    ("sliceCount", c_uint),
    ("instanceCount", c_uint),
    ("multiprocessorCount", c_uint),
    ("copyEngineCount", c_uint),
    ("decoderCount", c_uint),
    ("encoderCount", c_uint),
    ("jpegCount", c_uint),
    ("ofaCount", c_uint),
    ("memorySizeMB", c_ulonglong),
]


class nvmlGpuInstanceProfileInfo_t(Structure):
    """nvml.h 13.3.29 lines 12558-12571."""

    _fields_ = _GPU_INSTANCE_PROFILE_FIELDS


class nvmlGpuInstanceProfileInfo_v2_t(Structure):
    """nvml.h lines 12581-12596: a version first, the profile's name last."""

    _fields_ = [
        ("version", c_uint),
        *_GPU_INSTANCE_PROFILE_FIELDS,
        ("name", c_char * c.NVML_DEVICE_NAME_V2_BUFFER_SIZE),
    ]


class nvmlGpuInstanceInfo_t(Structure):
    """nvml.h lines 12631-12637: the parent nvmlDevice_t, the instance's ID, its profile ID and placement."""

    _fields_ = [
        ("device", c_void_p),
        ("id", c_uint),
        ("profileId", c_uint),
        ("placement", nvmlGpuInstancePlacement_t),
    ]


class nvmlComputeInstancePlacement_t(Structure):
    _fields_ = [("start", c_uint), ("size", c_uint)]


_COMPUTE_INSTANCE_PROFILE_FIELDS = [
    ("id", c_uint),
    ("sliceCount", c_uint),
    ("instanceCount", c_uint),
    ("multiprocessorCount", c_uint),
    ("sharedCopyEngineCount", c_uint),
    ("sharedDecoderCount", c_uint),
    ("sharedEncoderCount", c_uint),
    ("sharedJpegCount", c_uint),
    ("sharedOfaCount", c_uint),
]


class nvmlComputeInstanceProfileInfo_t(Structure):
    """nvml.h lines 12668-12679."""

    _fields_ = _COMPUTE_INSTANCE_PROFILE_FIELDS


class nvmlComputeInstanceProfileInfo_v2_t(Structure):
    """nvml.h lines 12689-12702."""

    _fields_ = [
        ("version", c_uint),
        *_COMPUTE_INSTANCE_PROFILE_FIELDS,
        ("name", c_char * c.NVML_DEVICE_NAME_V2_BUFFER_SIZE),
    ]


class nvmlComputeInstanceInfo_t(Structure):
    """nvml.h lines 12736-12743: parent device, parent GPU instance, ID, profile ID, placement in the GPU instance."""

    _fields_ = [
        ("device", c_void_p),
        ("gpuInstance", c_void_p),
        ("id", c_uint),
        ("profileId", c_uint),
        ("placement", nvmlComputeInstancePlacement_t),
    ]


class nvmlDeviceAttributes_t(Structure):
    """nvml.h lines 362-373 (nvmlDeviceGetAttributes_v2, which "currently only supports MIG device handles")."""

    _fields_ = [
        ("multiprocessorCount", c_uint),
        ("sharedCopyEngineCount", c_uint),
        ("sharedDecoderCount", c_uint),
        ("sharedEncoderCount", c_uint),
        ("sharedJpegCount", c_uint),
        ("sharedOfaCount", c_uint),
        ("gpuInstanceSliceCount", c_uint),
        ("computeInstanceSliceCount", c_uint),
        ("memorySizeMB", c_ulonglong),
    ]


# Structs only the newer nvidia-ml-py releases define: the layout test checks them where the release has them.
NEWER_BINDING_NAMES = frozenset({"c_nvmlGpuFabricInfo_v3_t"})
# Structs the oldest release defines at another layout than nvml.h's: the layout test holds them to the newest
# release and shows the oldest's differs (the backend passes its own copy: gpuwatch/backends/nvml_tables.py).
MISLAID_IN_OLDEST = frozenset({"c_nvmlGpuFabricInfo_t"})
# Each struct and the name the binding gives its own copy of it (for the layout test).
BINDING_NAMES: dict[type[Structure] | type[Union], str] = {
    nvmlMemory_t: "c_nvmlMemory_t",
    nvmlMemory_v2_t: "c_nvmlMemory_v2_t",
    nvmlUtilization_t: "c_nvmlUtilization_t",
    nvmlPciInfo_t: "nvmlPciInfo_t",
    nvmlViolationTime_t: "c_nvmlViolationTime_t",
    nvmlValue_t: "c_nvmlValue_t",
    nvmlFieldValue_t: "c_nvmlFieldValue_t",
    nvmlEventData_t: "c_nvmlEventData_t",
    nvmlProcessInfo_t: "c_nvmlProcessInfo_v3_t",
    nvmlTemperature_t: "c_nvmlTemperature_v1_t",
    nvmlMarginTemperature_t: "c_nvmlMarginTemperature_v1_t",
    nvmlRowRemapperHistogramValues_t: "c_nvmlRowRemapperHistogramValues",
    nvmlGpuFabricInfo_t: "c_nvmlGpuFabricInfo_t",  # MISLAID_IN_OLDEST
    nvmlGpuFabricInfo_v2_t: "c_nvmlGpuFabricInfoV_t",
    nvmlGpuFabricInfo_v3_t: "c_nvmlGpuFabricInfo_v3_t",  # releases from 12.575 on; NEWER_BINDING_NAMES
    nvmlEccSramErrorStatus_v1_t: "c_nvmlEccSramErrorStatus_v1_t",
    nvmlGpmMetricInfo_t: "c_metricInfo_t",
    nvmlGpmMetric_t: "c_nvmlGpmMetric_t",
    nvmlGpmSupport_t: "c_nvmlGpmSupport_t",
    nvmlGpuInstancePlacement_t: "c_nvmlGpuInstancePlacement_t",
    nvmlGpuInstanceProfileInfo_t: "c_nvmlGpuInstanceProfileInfo_t",
    nvmlGpuInstanceProfileInfo_v2_t: "c_nvmlGpuInstanceProfileInfo_v2_t",
    nvmlGpuInstanceInfo_t: "c_nvmlGpuInstanceInfo_t",
    nvmlComputeInstancePlacement_t: "c_nvmlComputeInstancePlacement_t",
    nvmlComputeInstanceProfileInfo_t: "c_nvmlComputeInstanceProfileInfo_t",
    nvmlComputeInstanceProfileInfo_v2_t: "c_nvmlComputeInstanceProfileInfo_v2_t",
    nvmlComputeInstanceInfo_t: "c_nvmlComputeInstanceInfo_t",
    nvmlDeviceAttributes_t: "c_nvmlDeviceAttributes",
}
