"""What a simulated MI300X writes into each amdsmi.h struct: the node's state in the units and "not available"
markers of libamd_smi.so (amdsmi.h), one function per struct.

Layouts differ between releases (amdsmi_power_info_t gained ``socket_power`` and 64-bit voltages in 7.0,
amdsmi_version_t lost ``year``, amdsmi_violation_status_t gained per-XCP arrays); the struct the caller passes is
the layout of its release, and ``put`` fills the fields that layout has (names in ``optional`` may be absent).
Unavailable values are all-ones (0xFFFF…), which the vendor's Python turns into "N/A"
(amdsmi 7.0.2 amdsmi_interface.py:751 ``_validate_if_max_uint``, :2343 and :2911 for 0xFFFF).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

from gpuwatch.simulated.scenarios import GpuSpec, GpuState

PCIE_MTS = {1: 2500, 2: 5000, 3: 8000, 4: 16000, 5: 32000, 6: 64000}
ENERGY_RESOLUTION_UJ = 15.3  # µJ per energy-accumulator count on an MI300X
ACC_HZ = 1000  # gpu_metrics accumulation_counter ticks per second
NA16, NA32, NA64 = 0xFFFF, 0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF
COMPUTE_UNITS = 304
# The amdsmi.h enum values this library reads or writes (tests/test_amdsmi_conformance.py holds them to each
# release's wrapper).
C: dict[str, int] = {
    "AMDSMI_TEMPERATURE_TYPE_EDGE": 0,
    "AMDSMI_TEMPERATURE_TYPE_HOTSPOT": 1,
    "AMDSMI_TEMPERATURE_TYPE_VRAM": 2,
    "AMDSMI_TEMP_CURRENT": 0,
    "AMDSMI_TEMP_CRITICAL": 5,
    "AMDSMI_TEMP_EMERGENCY": 7,
    "AMDSMI_CLK_TYPE_GFX": 0,
    "AMDSMI_CLK_TYPE_MEM": 4,
    "AMDSMI_CLK_TYPE_VCLK0": 6,
    "AMDSMI_XGMI_LINK_DOWN": 0,
    "AMDSMI_XGMI_LINK_UP": 1,
    "AMDSMI_CARD_FORM_FACTOR_OAM": 1,
    "AMDSMI_EVT_NOTIF_GPU_PRE_RESET": 3,
    "AMDSMI_EVT_NOTIF_GPU_POST_RESET": 4,
}
RESET_EVENTS = (C["AMDSMI_EVT_NOTIF_GPU_PRE_RESET"], C["AMDSMI_EVT_NOTIF_GPU_POST_RESET"])


class Processor:
    """What one processor handle stands for: a socket (GPU) of the node and a compute partition of it."""

    __slots__ = ("index", "partition", "partitions")

    def __init__(self, index: int, partition: int, partitions: int) -> None:
        self.index = index
        self.partition = partition
        self.partitions = partitions

    @property
    def primary(self) -> bool:
        return self.partition == 0


def put(struct: Any, values: dict[str, Any], optional: Iterable[str] = ()) -> None:
    """Set fields of a ctypes struct; a name the layout lacks is a bug unless it is ``optional``."""
    known = {f[0] for f in type(struct)._fields_}
    allowed = set(optional)
    for name, value in values.items():
        if name in known:
            setattr(struct, name, value)
        elif name not in allowed:
            raise AttributeError(f"{type(struct).__name__} has no field {name!r}")


def fill_ones(struct: Any) -> None:
    """memset(0xFF): every field "not available" until set, as the driver hands over gpu_metrics."""
    ctypes.memset(ctypes.addressof(struct), 0xFF, ctypes.sizeof(struct))


def uuid(spec: GpuSpec, proc: Processor) -> str:
    return spec.uuid if proc.primary else f"{spec.uuid[:-2]}{proc.partition:02x}"


def bdf(struct: Any, spec: GpuSpec, proc: Processor) -> None:
    fields = struct.struct_amdsmi_bdf_t
    fields.domain_number = spec.pci_domain
    fields.bus_number = spec.pci_bus
    fields.device_number = 0
    fields.function_number = proc.partition  # partitions differ in the PCI function


def kfd_info(struct: Any, proc: Processor) -> None:
    n = proc.index * proc.partitions + proc.partition
    put(struct, {"kfd_id": 18000 + 1000 * n, "node_id": 2 + n, "current_partition_id": proc.partition})


def asic_info(struct: Any, spec: GpuSpec, proc: Processor) -> None:
    """asic_serial is the driver's unique id as libamd_smi reads it from the device's unique_id file (amd_smi.cc
    amdsmi_get_gpu_asic_info: 16 hex digits, no 0x; the package formats it "0x{:016X}"). Here every partition of a
    socket shares its socket's (whether a real partition has one of its own is not known here)."""
    put(struct, {"market_name": spec.model.encode(), "vendor_id": 0x1002, "subvendor_id": 0x1002,
                 "vendor_name": b"Advanced Micro Devices, Inc. [AMD/ATI]", "device_id": 0x74A1, "rev_id": 0,
                 "asic_serial": f"{int(spec.serial, 16):016x}".encode(), "oam_id": spec.index,
                 "num_of_compute_units": COMPUTE_UNITS // proc.partitions, "target_graphics_version": 0x942,
                 "subsystem_id": 0x74A1}, optional=("subsystem_id",))  # fmt: skip


def board_info(struct: Any, spec: GpuSpec) -> None:
    put(struct, {"model_number": spec.board_part_number.encode(), "product_serial": spec.serial.encode(),
                 "fru_id": b"", "product_name": b"AMD Instinct MI300X OAM", "manufacturer_name": b"AMD"})  # fmt: skip


def vbios_info(struct: Any, spec: GpuSpec) -> None:
    put(struct, {"name": b"AMD MI300X_HW_SRIOV_CVS_1VF", "build_date": b"2024/05/29 15:24",
                 "part_number": spec.vbios_version.encode(), "version": b"022.040.003.042.000001"})  # fmt: skip


def driver_info(struct: Any, spec: GpuSpec) -> None:
    put(struct, {"driver_name": b"amdgpu", "driver_version": spec.driver_version.encode(),
                 "driver_date": b"2015/01/01 00:00"})  # fmt: skip


def temperature(spec: GpuSpec, state: GpuState, sensor: int, metric: int) -> int | None:
    """°C of a sensor (hotspot, VRAM) and metric (current, critical, emergency); None (NOT_SUPPORTED) for the
    rest: an MI300X has no edge sensor."""
    hotspot, vram = C["AMDSMI_TEMPERATURE_TYPE_HOTSPOT"], C["AMDSMI_TEMPERATURE_TYPE_VRAM"]
    current, critical, emergency = C["AMDSMI_TEMP_CURRENT"], C["AMDSMI_TEMP_CRITICAL"], C["AMDSMI_TEMP_EMERGENCY"]
    table = {
        (hotspot, current): state.temperature_core_celsius,
        (hotspot, critical): spec.temp_slowdown_celsius,
        (hotspot, emergency): spec.temp_shutdown_celsius,
        (vram, current): state.temperature_memory_celsius,
        (vram, critical): spec.temp_memory_max_celsius,
        (vram, emergency): spec.temp_memory_max_celsius + 10,
    }
    value = table.get((sensor, metric))
    return None if value is None else round(value)


CLOCKS = {C["AMDSMI_CLK_TYPE_GFX"]: "graphics", C["AMDSMI_CLK_TYPE_MEM"]: "memory", C["AMDSMI_CLK_TYPE_VCLK0"]: "video"}


def clock_info(struct: Any, spec: GpuSpec, state: GpuState, name: str) -> None:
    current = round(state.clocks_mhz[name])
    floor = {"graphics": 500, "memory": 900}.get(name, 914)
    put(struct, {"clk": current, "min_clk": min(current, floor), "max_clk": spec.clock_max_mhz[name],
                 "clk_locked": 0, "clk_deep_sleep": int(current < 200)})  # fmt: skip


def power_info(struct: Any, state: GpuState) -> None:
    """W; an MI300X fills the current socket power, not the average (0xFFFF -> "N/A")."""
    watts = round(state.power_watts)
    put(struct, {"socket_power": watts, "current_socket_power": watts, "average_socket_power": NA16,
                 "gfx_voltage": NA16, "soc_voltage": NA16, "mem_voltage": NA16,
                 "power_limit": round(state.power_limit_enforced_watts)}, optional=("socket_power",))  # fmt: skip


def power_cap_info(struct: Any, spec: GpuSpec, state: GpuState) -> None:
    """µW (amdsmi.h amdsmi_power_cap_info_t)."""
    put(struct, {"power_cap": int(state.power_limit_enforced_watts * 1e6),
                 "default_power_cap": int(spec.power_limit_default_watts * 1e6), "dpm_cap": 1,
                 "min_power_cap": int(spec.power_limit_min_watts * 1e6),
                 "max_power_cap": int(spec.power_limit_max_watts * 1e6)})  # fmt: skip


def energy_count(state: GpuState) -> tuple[int, float, int]:
    """(accumulator counts, µJ per count, timestamp ns)."""
    return int(state.energy_joules * 1e6 / ENERGY_RESOLUTION_UJ), ENERGY_RESOLUTION_UJ, int(state.timestamp * 1e9)


def engine_usage(struct: Any, state: GpuState) -> None:
    put(struct, {"gfx_activity": round(state.utilization * 100),
                 "umc_activity": round(state.memory_utilization * 100), "mm_activity": NA16})  # fmt: skip


def vram_usage(struct: Any, spec: GpuSpec, state: GpuState, proc: Processor) -> None:
    """MiB, each partition its share."""
    total = spec.memory_total_bytes // proc.partitions
    used = (spec.memory_reserved_bytes + state.memory_used_bytes) // proc.partitions
    put(struct, {"vram_total": total // 2**20, "vram_used": used // 2**20})


def error_count(struct: Any, state: GpuState) -> None:
    c = state.counters  # HBM poison is deferred before it is consumed
    put(struct, {"correctable_count": c.ecc_corrected, "uncorrectable_count": c.ecc_uncorrected,
                 "deferred_count": c.ecc_uncorrected})  # fmt: skip


def bad_pages(state: GpuState) -> list[tuple[int, int, int]]:
    """(address, size, status) of retired pages: AMD retires pages where NVIDIA remaps rows."""
    count = state.counters.remapped_uncorrectable + state.counters.remapped_correctable
    return [(0x3_F000_0000 + 4096 * i, 4096, 0) for i in range(count)]


def bad_page_threshold(spec: GpuSpec) -> int:
    """amdgpu's default bad-page threshold (module parameter bad_page_threshold=-1): one retired page per 100 MiB of
    VRAM (amdgpu_ras.c, amdgpu_ras_validate_threshold: mc_vram_size / RAS_BAD_PAGE_COVER); 1966 on an MI300X. Past
    it the driver marks the GPU bad in its EEPROM and refuses it at the next boot."""
    return spec.memory_total_bytes // (100 * 2**20)


def pcie_info(struct: Any, spec: GpuSpec, state: GpuState) -> None:
    """Speeds in MT/s; bandwidth and the link partner's recoveries are not available."""
    put(struct.pcie_static, {"max_pcie_width": spec.pcie_max_width,
                             "max_pcie_speed": PCIE_MTS[spec.pcie_max_generation],
                             "pcie_interface_version": spec.pcie_max_generation,
                             "slot_type": C["AMDSMI_CARD_FORM_FACTOR_OAM"],
                             "max_pcie_interface_version": spec.pcie_gpu_max_generation},
        optional=("max_pcie_interface_version",))  # fmt: skip
    c = state.counters
    put(struct.pcie_metric, {"pcie_width": state.pcie_width, "pcie_speed": PCIE_MTS.get(state.pcie_generation, 0),
                             "pcie_bandwidth": NA32, "pcie_replay_count": c.pcie_replays,
                             "pcie_l0_to_recovery_count": c.pcie_l0_recoveries, "pcie_replay_roll_over_count": 0,
                             "pcie_nak_sent_count": 0, "pcie_nak_received_count": 0,
                             "pcie_lc_perf_other_end_recovery_count": NA32})  # fmt: skip


def xgmi_link_status(struct: Any, spec: GpuSpec, state: GpuState) -> None:
    struct.total_links = spec.nvlink_links
    for link, up in enumerate(state.nvlink_up[: len(struct.status)]):
        struct.status[link] = C["AMDSMI_XGMI_LINK_UP" if up else "AMDSMI_XGMI_LINK_DOWN"]


def processes(state: GpuState, proc: Processor) -> list[tuple[int, int]]:
    """(pid, VRAM bytes) of the processes on this processor; the socket's all show on partition 0."""
    return [(p.pid, p.used_memory_bytes) for p in state.processes] if proc.primary else []


def process_info(struct: Any, pid: int, vram: int) -> None:
    put(struct, {"name": b"python3", "pid": pid, "mem": vram, "cu_occupancy": NA32})
    struct.memory_usage.vram_mem = vram


def residency(state: GpuState) -> tuple[int, dict[str, int], dict[str, bool]]:
    """gpu_metrics residency counters (ticks of the accumulation counter) from the node's throttle time.

    The node keeps time per schema reason; AMD counts PPT (power cap), PROCHOT (external slowdown, which the
    node's power brake asserts), socket thermal (the node's software and hardware thermal slowdown: MI300X has one
    socket thermal limit), HBM thermal and VR thermal.
    """
    s, active = state.throttle_seconds, state.throttle_active
    seconds = {"ppt": s["sw_power_cap"], "prochot": s["hw_slowdown"], "socket_thm": s["sw_thermal"],
               "hbm_thm": 0.0, "vr_thm": 0.0}  # fmt: skip
    on = {"ppt": "sw_power_cap" in active, "prochot": "hw_slowdown" in active,
          "socket_thm": bool({"sw_thermal", "hw_thermal"} & active), "hbm_thm": False, "vr_thm": False}  # fmt: skip
    base = 5_000_000  # ticks since the driver loaded, before the node started
    return base + int(state.elapsed * ACC_HZ), {k: int(v * ACC_HZ) for k, v in seconds.items()}, on


def gpu_metrics(struct: Any, spec: GpuSpec, state: GpuState, proc: Processor) -> None:
    """gpu_metrics v1.6 of an MI300X: everything else stays all-ones ("N/A")."""
    fill_ones(struct)
    acc, ticks, active = residency(state)
    struct.common_header.structure_size = ctypes.sizeof(struct)
    struct.common_header.format_revision = 1
    struct.common_header.content_revision = 6
    put(struct, {
        "temperature_hotspot": round(state.temperature_core_celsius),
        "temperature_mem": round(state.temperature_memory_celsius),
        "average_gfx_activity": round(state.utilization * 100),
        "average_umc_activity": round(state.memory_utilization * 100),
        "current_socket_power": round(state.power_watts),
        "energy_accumulator": int(state.energy_joules * 1e6 / ENERGY_RESOLUTION_UJ),
        "system_clock_counter": int(state.elapsed * 1e8),
        "current_gfxclk": round(state.clocks_mhz["graphics"]),
        "current_uclk": round(state.clocks_mhz["memory"]),
        "throttle_status": int(any(active.values())),
        "pcie_link_width": state.pcie_width,
        "pcie_link_speed": PCIE_MTS.get(state.pcie_generation, 0) // 100,  # 0.1 GT/s units
        "pcie_l0_to_recov_count_acc": state.counters.pcie_l0_recoveries,
        "pcie_replay_count_acc": state.counters.pcie_replays,
        "accumulation_counter": acc,
        "prochot_residency_acc": ticks["prochot"],
        "ppt_residency_acc": ticks["ppt"],
        "socket_thm_residency_acc": ticks["socket_thm"],
        "vr_thm_residency_acc": ticks["vr_thm"],
        "hbm_thm_residency_acc": ticks["hbm_thm"],
        "num_partition": proc.partitions,
    })  # fmt: skip
    if spec.nvlink_links:
        put(struct, {"xgmi_link_width": 16, "xgmi_link_speed": 32})
        # "XGMI accumulated data transfer size (KiloBytes)" per link (amdsmi.h, amdsmi_gpu_metrics_t v1.4 on)
        for link in range(min(spec.nvlink_links, len(struct.xgmi_read_data_acc))):
            struct.xgmi_read_data_acc[link] = int(state.activity.nvlink_rx_bytes[link] // 1024)
            struct.xgmi_write_data_acc[link] = int(state.activity.nvlink_tx_bytes[link] // 1024)


def violation_status(struct: Any, state: GpuState) -> None:
    """The same residency as gpu_metrics, with its percentages and active flags; per-XCP arrays "N/A"."""
    fill_ones(struct)
    acc, ticks, active = residency(state)
    values: dict[str, Any] = {"reference_timestamp": int(state.timestamp * 1e6), "violation_timestamp": 100_000,
                              "acc_counter": acc}  # fmt: skip
    for ours, theirs in (("prochot", "prochot_thrm"), ("ppt", "ppt_pwr"), ("socket_thm", "socket_thrm"),
                         ("vr_thm", "vr_thrm"), ("hbm_thm", "hbm_thrm")):  # fmt: skip
        values[f"acc_{theirs}"] = ticks[ours]
        values[f"per_{theirs}"] = 100 if active[ours] else 0
        values[f"active_{theirs}"] = int(active[ours])
    put(struct, values)
