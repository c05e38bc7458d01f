"""`nvmlDeviceGetFieldValues` of the simulated NVML: which fields an H100 fills, how, and which it leaves empty.

Reproduces what the H100 fixture showed: a per-field `nvmlReturn` (NotSupported for NVLink, C2C and retired-page
fields; the call itself raises only when the whole call fails), and the timestamp-0 quirk: the power-limit and
temperature-limit fields, and the hardware thermal / power-brake reason counters, come back with nvmlReturn 0,
valueType 0, value 0.0 and timestamp 0, i.e. "success" without data. Tests change single answers with
``node.faults.field(...)`` (faults.py), applied last, to the field id as the caller asked for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal

from gpuwatch.simulated import nvml_constants as c
from gpuwatch.simulated.nvml_structs import nvmlFieldValue_t
from gpuwatch.simulated.scenarios import GpuSpec, GpuState

if TYPE_CHECKING:
    from gpuwatch.simulated.faults import FaultInjector

# How the hardware thermal / power-brake reason counter fields behave:
#  until_active: timestamp-0 while the counter is still 0 (as the idle fixture read), filled once it counts
#  always: never filled (the backend must fall back to accumulating from the reason bitmask)
#  never: always filled
HwCounterQuirk = Literal["until_active", "always", "never"]

_U32 = c.NVML_VALUE_TYPE_UNSIGNED_INT
_U64 = c.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
# The member of the nvmlValue_t union each nvmlValueType_t is read from (nvml.h).
_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

# Fields that answer success with no data (the fixture's idle read).
_EMPTY_FIELDS: frozenset[int] = frozenset(
    {
        c.NVML_FI_DEV_POWER_MIN_LIMIT,
        c.NVML_FI_DEV_POWER_MAX_LIMIT,
        c.NVML_FI_DEV_POWER_DEFAULT_LIMIT,
        c.NVML_FI_DEV_POWER_CURRENT_LIMIT,
        c.NVML_FI_DEV_POWER_REQUESTED_LIMIT,
        c.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT,
        c.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT,
        c.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT,
        c.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT,
        c.NVML_FI_DEV_POWER_SYNC_BALANCING_FREQ,
        c.NVML_FI_DEV_POWER_SYNC_BALANCING_AF,
    }
)
# Deprecated status fields: type 1, value 0, timestamp 0.
_DEPRECATED_STATUS: frozenset[int] = frozenset({c.NVML_FI_DEV_RESET_STATUS, c.NVML_FI_DEV_DRAIN_AND_RESET_STATUS})

_HW_REASON_COUNTERS: dict[int, str] = {
    c.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: "hw_thermal",
    c.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: "hw_power_brake",
}

_POLICY_FIELDS: dict[int, str] = {
    c.NVML_FI_DEV_PERF_POLICY_POWER: "power",  # = CLOCKS_EVENT_REASON_SW_POWER_CAP
    c.NVML_FI_DEV_PERF_POLICY_THERMAL: "thermal",
    c.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: "sync_boost",  # = CLOCKS_EVENT_REASON_SYNC_BOOST
    c.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: "board_limit",
    c.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: "low_utilization",
    c.NVML_FI_DEV_PERF_POLICY_RELIABILITY: "reliability",
    c.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS: "total_app_clocks",
    c.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS: "total_base_clocks",
}

_Getter = Callable[[GpuSpec, GpuState], int]


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


# field id -> (value type, getter, latency µs as the fixture measured)
_FILLED: dict[int, tuple[int, _Getter, int]] = {
    c.NVML_FI_DEV_ECC_CURRENT: (_U32, lambda s, g: 1, 0),
    c.NVML_FI_DEV_ECC_PENDING: (_U32, lambda s, g: 1, 0),
    c.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (_U64, lambda s, g: g.counters.ecc_corrected, 0),
    c.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (_U64, lambda s, g: g.counters.ecc_uncorrected, 3),
    c.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (_U64, lambda s, g: g.counters.ecc_corrected, 0),
    c.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (_U64, lambda s, g: g.counters.ecc_uncorrected, 0),
    c.NVML_FI_DEV_MEMORY_TEMP: (_U32, lambda s, g: int(g.temperature_memory_celsius), 0),
    c.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (_U64, lambda s, g: int(g.energy_joules * 1000), 2774),
    c.NVML_FI_DEV_ENERGY: (_U64, lambda s, g: int(g.energy_joules * 1000), 2988),
    c.NVML_FI_DEV_POWER_AVERAGE: (_U32, lambda s, g: int(g.power_watts * 1000), 2),
    c.NVML_FI_DEV_POWER_INSTANT: (_U32, lambda s, g: int(g.power_watts * 1000) + 248, 0),
    c.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (_U32, lambda s, g: g.counters.pcie_replays, 169),
    c.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER: (_U32, lambda s, g: 0, 180),
    c.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER: (_U32, lambda s, g: g.counters.pcie_l0_recoveries, 168),
    c.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS: (_U32, lambda s, g: g.counters.pcie_replays, 178),
    c.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (_U32, lambda s, g: g.pcie_tx_bytes & 0xFFFFFFFF, 170),
    c.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (_U32, lambda s, g: g.pcie_rx_bytes & 0xFFFFFFFF, 169),
    c.NVML_FI_DEV_REMAPPED_COR: (_U64, lambda s, g: g.counters.remapped_correctable, 1),
    c.NVML_FI_DEV_REMAPPED_UNC: (_U64, lambda s, g: g.counters.remapped_uncorrectable, 0),
    c.NVML_FI_DEV_REMAPPED_PENDING: (_U64, lambda s, g: int(g.counters.remap_pending), 0),
    c.NVML_FI_DEV_REMAPPED_FAILURE: (_U64, lambda s, g: int(g.counters.remap_failed), 0),
    c.NVML_FI_DEV_REMAPPED_ROWS_COR_INACTIVE: (_U64, lambda s, g: 0, 0),
    c.NVML_FI_DEV_REMAPPED_ROWS_UNC_INACTIVE: (_U64, lambda s, g: 0, 0),
    c.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: (_U32, lambda s, g: g.counters.recovery_action, 0),
    c.NVML_FI_DEV_PCIE_OUTBOUND_ATOMICS_MASK: (_U32, lambda s, g: 0, 167),
    c.NVML_FI_DEV_PCIE_INBOUND_ATOMICS_MASK: (_U32, lambda s, g: 0, 4),
    c.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: (_U64, lambda s, g: _ns(g.throttle_seconds["sw_thermal"]), 0),
}
for _fid in (
    c.NVML_FI_DEV_PCIE_COUNT_NAKS_RECEIVED,
    c.NVML_FI_DEV_PCIE_COUNT_RECEIVER_ERROR,
    c.NVML_FI_DEV_PCIE_COUNT_BAD_TLP,
    c.NVML_FI_DEV_PCIE_COUNT_NAKS_SENT,
    c.NVML_FI_DEV_PCIE_COUNT_BAD_DLLP,
    c.NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR,
    c.NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR,
    c.NVML_FI_DEV_PCIE_COUNT_UNSUPPORTED_REQ,
    c.NVML_FI_DEV_PCIE_COUNT_LCRC_ERROR,
    c.NVML_FI_DEV_PCIE_COUNT_LANE_ERROR,
):
    _FILLED[_fid] = (_U32, lambda s, g: 0, 172)
for _fid, _policy in _POLICY_FIELDS.items():
    _FILLED[_fid] = (_U64, lambda s, g, p=_policy: _ns(g.policy_seconds[p]), 0)  # type: ignore[misc]

# NVLink fields answered when the node has NVLink: the link count, link state (scopeId = link) and error counters.
_NVLINK_ERROR_FIELDS: frozenset[int] = frozenset(
    getattr(c, name)
    for name in dir(c)
    if name.startswith("NVML_FI_DEV_NVLINK_")
    and "_ERROR_COUNT_" in name
    and any(kind in name for kind in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY", "ECC_DATA"))
)
_NVLINK_FIELDS: frozenset[int] = frozenset(
    getattr(c, name) for name in dir(c) if name.startswith("NVML_FI_DEV_NVLINK_") and isinstance(getattr(c, name), int)
)


# The throttle-time fields moved between drivers (nvml.h): R570 has none of them (its last id is 268, the power-
# smoothing block starts at 251); R575 up to 580.65 put them at 251-253 and moved power smoothing to 256; from
# 580.82 power smoothing is back at 251 and the three counters are 269-271 (nvidia-ml-py 12.570.86, 12.575.51,
# 13.580.65 and 13.580.82 carry those headers). The table below speaks the newest numbering.
_R575_THROTTLE_IDS: dict[int, int] = {
    251: c.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    252: c.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    253: c.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
}


def field_numbering(driver_version: str) -> tuple[int, dict[int, int | None]]:
    """(NVML_FI_MAX, driver id -> id of the newest numbering, None for "no such field here") of a driver."""
    release = _release(driver_version)
    if release < (575,):
        return 269, {}
    if release < (580, 82):
        moved: dict[int, int | None] = {**_R575_THROTTLE_IDS, **dict.fromkeys(_R575_THROTTLE_IDS.values())}
        return 274, moved
    return c.NVML_FI_MAX, {}


def _release(driver_version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in driver_version.split(".")[:2])
    except ValueError:
        return (0,)


def fill_field_values(
    values: Iterable[nvmlFieldValue_t],
    spec: GpuSpec,
    state: GpuState,
    hw_counter_quirk: HwCounterQuirk,
    numbering: tuple[int, dict[int, int | None]],
    faults: FaultInjector | None = None,
) -> None:
    """Answer each requested (fieldId, scopeId) in place, as nvmlDeviceGetFieldValues does."""
    now_us = int(state.timestamp * 1e6)
    field_max, moved = numbering
    for n, fv in enumerate(values):
        fid = int(fv.fieldId)
        canonical = moved.get(fid, fid) if 0 < fid < field_max else -1
        _fill(fv, canonical, spec, state, hw_counter_quirk, now_us + 3 * n)
        rule = faults.field_rule(fid, spec.index) if faults is not None else None
        if rule is not None:
            _override(fv, rule.code, rule.value, rule.value_type, rule.timestamp, now_us + 3 * n)


def _override(
    fv: nvmlFieldValue_t,
    code: int | None,
    value: float | None,
    value_type: int | None,
    timestamp: int | None,
    now_us: int,
) -> None:
    """An injected answer (faults.FieldRule): a per-field error, or success with the given parts."""
    if code is not None and code != c.NVML_SUCCESS:
        fv.nvmlReturn = code
        return
    filled = fv.nvmlReturn == c.NVML_SUCCESS
    fv.nvmlReturn = c.NVML_SUCCESS
    fv.valueType = value_type if value_type is not None else (int(fv.valueType) if filled else _U64)
    if timestamp is None:
        timestamp = int(fv.timestamp) if filled and value is None else now_us
    fv.timestamp = timestamp
    if (value is not None or not filled) and 0 <= fv.valueType < len(_MEMBERS):
        member = _MEMBERS[int(fv.valueType)]
        kind = type(getattr(fv.value, member))
        setattr(fv.value, member, kind(value if value is not None else 0))


def _fill(
    fv: nvmlFieldValue_t, fid: int | None, spec: GpuSpec, state: GpuState, quirk: HwCounterQuirk, now_us: int
) -> None:
    fv.nvmlReturn = c.NVML_SUCCESS
    if fid is None:
        fv.nvmlReturn = c.NVML_ERROR_NOT_SUPPORTED
    elif fid <= 0:
        fv.nvmlReturn = c.NVML_ERROR_INVALID_ARGUMENT
    elif fid in _EMPTY_FIELDS:
        _set(fv, c.NVML_VALUE_TYPE_DOUBLE, 0, timestamp=0)
    elif fid in _DEPRECATED_STATUS:
        _set(fv, _U32, 0, timestamp=0)
    elif fid in _HW_REASON_COUNTERS:
        seconds = state.throttle_seconds[_HW_REASON_COUNTERS[fid]]
        if quirk == "always" or (quirk == "until_active" and seconds == 0.0):
            _set(fv, c.NVML_VALUE_TYPE_DOUBLE, 0, timestamp=0)
        else:
            _set(fv, _U64, _ns(seconds), timestamp=now_us)
    elif fid in _FILLED:
        value_type, getter, latency = _FILLED[fid]
        _set(fv, value_type, getter(spec, state), timestamp=now_us, latency=latency)
    elif fid in _NVLINK_FIELDS and spec.nvlink_links > 0:
        _fill_nvlink(fv, fid, spec, state, now_us)
    else:
        fv.nvmlReturn = c.NVML_ERROR_NOT_SUPPORTED


def _fill_nvlink(fv: nvmlFieldValue_t, fid: int, spec: GpuSpec, state: GpuState, now_us: int) -> None:
    if fid == c.NVML_FI_DEV_NVLINK_LINK_COUNT:
        _set(fv, _U32, spec.nvlink_links, timestamp=now_us)
    elif fid == c.NVML_FI_DEV_NVLINK_GET_STATE:
        link = int(fv.scopeId)
        if link >= spec.nvlink_links:
            fv.nvmlReturn = c.NVML_ERROR_INVALID_ARGUMENT
        else:
            _set(fv, _U32, int(state.nvlink_up[link]), timestamp=now_us)
    elif fid in _NVLINK_ERROR_FIELDS:
        _set(fv, _U64, 0, timestamp=now_us)
    else:
        fv.nvmlReturn = c.NVML_ERROR_NOT_SUPPORTED


def _set(fv: nvmlFieldValue_t, value_type: int, value: int, *, timestamp: int, latency: int = 0) -> None:
    fv.valueType = value_type
    fv.timestamp = timestamp
    fv.latencyUsec = latency
    if value_type == c.NVML_VALUE_TYPE_DOUBLE:
        fv.value.dVal = float(value)
    elif value_type == _U32:
        fv.value.uiVal = value
    else:
        fv.value.ullVal = value
