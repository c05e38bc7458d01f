#!/usr/bin/env python3
"""`gpuwatch snapshot --json` beside `nvidia-smi -q` on the same GPUs at the same moment (issue #2's hardware check).

nvidia-smi is the reference an operator trusts; every reading gpuwatch exports should agree with it, converted to
nvidia-smi's units, within a tolerance that says why two reads a few hundred milliseconds apart may differ. The
script parses the TEXT output of `nvidia-smi -q` (the indented "Key : Value" tree, one section per GPU), pairs
GPUs by UUID (or by position with --match-index), and prints one Markdown table per GPU with a verdict per row:
match, differs, only gpuwatch, only nvidia-smi, neither.

    python benchmarks/hardware/smi_compare.py --snapshot snap.json --smi smi.txt        # saved outputs
    python benchmarks/hardware/smi_compare.py --live [--gpuwatch 'python3 -m gpuwatch'] [--backend nvml]

Exit status: 0 every compared row matches, 1 a row differs or a GPU is on one side only, 2 usage errors and
inputs that cannot be had (no nvidia-smi, a command that fails, a file that is not what it should be).
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MATCH, DIFFERS, ONLY_GW, ONLY_SMI, NEITHER = "match", "differs", "only gpuwatch", "only nvidia-smi", "neither"
VERDICTS = (MATCH, DIFFERS, ONLY_GW, ONLY_SMI, NEITHER)
MIB = 1024 * 1024

# nvidia-smi strings that mean "no value": the row then reads "only gpuwatch" (or "neither").
_NO_VALUE = re.compile(
    r"^\[?(n/a|not supported|not available|unknown error|insufficient permissions|gpu requires reset|"
    r"requested functionality has been deprecated|unknown)\]?$",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)\s*([A-Za-z%/]*)$")
_KEY_VALUE = re.compile(r"^(\s*)(\S.*?)\s+:(?:\s(.*))?$")
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$")

# nvidia-smi's clock event ("throttle") reason lines -> gpuwatch's throttle_active keys.
REASONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gpu_idle", ("Idle",)),
    ("applications_clocks", ("Applications Clocks Setting",)),
    ("sw_power_cap", ("SW Power Cap",)),
    ("hw_slowdown", ("HW Slowdown",)),
    ("hw_thermal", ("HW Thermal Slowdown",)),
    ("hw_power_brake", ("HW Power Brake Slowdown",)),
    ("sync_boost", ("Sync Boost",)),
    ("sw_thermal", ("SW Thermal Slowdown",)),
    ("display_clock", ("Display Clock Setting",)),
)
# "Clocks Event Reasons Counters" lines (µs) -> gpuwatch's throttle_counter_seconds keys.
COUNTERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sw_power_cap", ("SW Power Capping", "SW Power Cap")),
    ("sync_boost", ("Sync Boost",)),
    ("sw_thermal", ("SW Thermal Slowdown",)),
    ("hw_thermal", ("HW Thermal Slowdown",)),
    ("hw_power_brake", ("HW Power Braking", "HW Power Brake Slowdown")),
)
REASON_SECTIONS = ("Clocks Event Reasons", "Clocks Throttle Reasons")
COUNTER_SECTIONS = ("Clocks Event Reasons Counters", "Clocks Throttle Reasons Counters")
POWER_SECTIONS = ("GPU Power Readings", "Power Readings")
# gpuwatch's temperature_threshold_celsius keys -> nvidia-smi's absolute line, its T.Limit-relative line (550+).
THRESHOLDS: tuple[tuple[str, str, str], ...] = (
    ("core/shutdown", "GPU Shutdown Temp", "GPU Shutdown T.Limit Temp"),
    ("core/slowdown", "GPU Slowdown Temp", "GPU Slowdown T.Limit Temp"),
    ("core/max_operating", "GPU Max Operating Temp", "GPU Max Operating T.Limit Temp"),
    ("memory/max_operating", "Memory Max Operating Temp", "Memory Max Operating T.Limit Temp"),
)
RECOVERY_ACTIONS = ("none", "gpu reset", "node reboot", "drain p2p", "drain and reset", "recover imex domain")


class UsageError(Exception):
    """An input cannot be had or read; the message says what is wrong and what to do (exit 2)."""


# ----- the nvidia-smi -q parser -----


def _norm(key: str) -> str:
    return " ".join(key.split()).lower()


@dataclass
class SmiGpu:
    """One `GPU 0000xxxx:xx:xx.x` section of nvidia-smi -q: its bus id and its tree of sections and values."""

    bus_id: str
    tree: dict[str, Any]

    def get(self, *path: str | tuple[str, ...]) -> str | None:
        """The raw text of a value by its section path (each step a name or alternatives), None where absent."""
        node: Any = self.tree
        for step in path:
            if not isinstance(node, dict):
                return None
            names = (step,) if isinstance(step, str) else step
            node = next((node[_norm(name)] for name in names if _norm(name) in node), None)
            if node is None:
                return None
        return node if isinstance(node, str) else None

    def section(self, *names: str) -> dict[str, Any] | None:
        """The first of the named top-level sections present."""
        found = next((self.tree[_norm(name)] for name in names if _norm(name) in self.tree), None)
        return found if isinstance(found, dict) else None

    @property
    def uuid(self) -> str:
        return self.get("GPU UUID") or ""


@dataclass
class SmiReport:
    """The whole nvidia-smi -q output: its header lines (Timestamp, Driver Version…) and its GPUs in order."""

    header: dict[str, str]
    gpus: list[SmiGpu]


def parse_smi(text: str) -> SmiReport:
    """Parse `nvidia-smi -q` text: indentation nests sections; 'Key : Value' lines are leaves.

    Lines indented under a leaf (HW Thermal Slowdown under HW Slowdown) belong to the leaf's section; a key
    repeated in one section (one block per process) is kept as 'key#2', 'key#3'."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("==="):
            continue
        line = line.rstrip()
        indent = len(line) - len(line.lstrip(" "))
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        match = _KEY_VALUE.match(line)
        if match is not None:
            key, value = match.group(2), (match.group(3) or "").strip()
            _put(parent, _norm(key), value)
            continue
        child: dict[str, Any] = {}
        _put(parent, _norm(line.strip()), child)
        stack.append((indent, child))
    header = {key: value for key, value in root.items() if isinstance(value, str)}
    gpus = []
    for key, value in root.items():
        found = _GPU_HEADER.match(key.upper()) if isinstance(value, dict) else None
        if found is not None:
            gpus.append(SmiGpu(found.group(1).upper(), value))
    return SmiReport(header, gpus)


def _put(node: dict[str, Any], key: str, value: Any) -> None:
    name, n = key, 1
    while name in node:
        n += 1
        name = f"{key}#{n}"
    node[name] = value


def smi_value(raw: str | None) -> float | bool | str | None:
    """'350.00 W' -> 350.0, '16x' -> 16, 'Active'/'Enabled'/'Yes' -> True, 'N/A' -> None, else the text."""
    if raw is None:
        return None
    text = raw.strip()
    if not text or _NO_VALUE.match(text):
        return None
    lowered = text.lower()
    if lowered in ("active", "enabled", "yes"):
        return True
    if lowered in ("not active", "disabled", "no"):
        return False
    width = re.match(r"^(\d+)x$", text)
    if width:
        return float(width.group(1))
    number = _NUMBER.match(text)
    if number:
        return float(number.group(1))
    return text


def _text(raw: str | None) -> str | None:
    """A string value as printed (serials stay strings), None where nvidia-smi has none."""
    return raw.strip() if raw is not None and smi_value(raw) is not None else None


def _scaled(values: dict[str, Any], key: str, factor: float) -> float | None:
    """gpuwatch's value converted to nvidia-smi's unit, None where gpuwatch has none."""
    value = values.get(key)
    return float(value) * factor if value is not None else None


def _number(raw: str | None) -> float | None:
    value = smi_value(raw)
    return float(value) if isinstance(value, float) else None


def _flag(raw: str | None) -> bool | None:
    value = smi_value(raw)
    return value if isinstance(value, bool) else None


# ----- the comparison -----


@dataclass
class Row:
    """One quantity read by both tools; values are in nvidia-smi's units (W, MHz, °C, MiB, µs, %)."""

    section: str
    quantity: str
    gpuwatch: str
    nvidia_smi: str
    tolerance: str
    verdict: str
    note: str = ""
    gpuwatch_value: Any = None
    nvidia_smi_value: Any = None


@dataclass
class GpuComparison:
    """The rows of one pair: gpuwatch's GPU (index, UUID, model) and nvidia-smi's section (bus id, UUID)."""

    index: int | None
    uuid: str
    model: str
    smi_bus_id: str
    smi_uuid: str
    paired_by: str
    rows: list[Row] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(1 for row in self.rows if row.verdict == verdict)


def exact(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), abs_tol=1e-6)
    return bool(a == b)


def within(tolerance: float) -> Callable[[Any, Any], bool]:
    return lambda a, b: abs(float(a) - float(b)) <= tolerance + 1e-9


def within_ratio(ratio: float) -> Callable[[Any, Any], bool]:
    return lambda a, b: a == b or abs(float(a) - float(b)) <= ratio * max(abs(float(a)), abs(float(b)))


def _fmt(value: Any, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float | int):
        text = f"{float(value):.{digits}f}"
        return f"{text} {unit}".strip()
    return str(value)


class _Builder:
    """Collects the rows of one GPU pair."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows
        self.section = ""

    def add(
        self,
        quantity: str,
        gw: Any,
        smi_raw: str | None,
        smi: Any,
        *,
        tolerance: str,
        same: Callable[[Any, Any], bool] = exact,
        show: Callable[[Any], str] = _fmt,
        note: str = "",
    ) -> Row:
        """A row: verdict from the two parsed values; nvidia-smi shown as it printed it."""
        if gw is None and smi is None:
            verdict = NEITHER
        elif gw is None:
            verdict = ONLY_SMI
        elif smi is None:
            verdict = ONLY_GW
        else:
            verdict = MATCH if same(gw, smi) else DIFFERS
        smi_shown = smi_raw if smi_raw is not None else "(not in nvidia-smi)"
        row = Row(self.section, quantity, show(gw), smi_shown, tolerance, verdict, note, gw, smi)
        self.rows.append(row)
        return row


def compare_gpu(
    gpu: dict[str, Any], smi: SmiGpu, report: SmiReport, *, counter_drift_s: float, paired_by: str = "uuid"
) -> GpuComparison:
    """Every row for one gpuwatch GPU and one nvidia-smi GPU section."""
    identity = gpu.get("identity") or {}
    sample = gpu.get("sample")
    result = GpuComparison(
        identity.get("index"), identity.get("uuid", ""), identity.get("model", ""), smi.bus_id, smi.uuid, paired_by
    )
    b = _Builder(result.rows)
    b.section = "identity"
    b.add("UUID", identity.get("uuid") or None, smi.get("GPU UUID"), _text(smi.get("GPU UUID")), tolerance="exact")
    for quantity, key, path in (
        ("product name", "model", ("Product Name",)),
        ("serial", "serial", ("Serial Number",)),
        ("VBIOS", "vbios_version", ("VBIOS Version",)),
        ("PCI bus id", "pci_bus_id", ("PCI", "Bus Id")),
    ):
        raw = smi.get(*path)
        b.add(
            quantity,
            identity.get(key) or None,
            raw,
            _text(raw),
            tolerance="exact",
            same=lambda a, c: str(a).strip().lower() == str(c).strip().lower(),
        )
    driver = report.header.get(_norm("Driver Version"))
    b.add("driver version", identity.get("driver_version") or None, driver, _text(driver), tolerance="exact")
    if sample is None:
        b.section = "reading"
        b.add(
            "gpuwatch reading",
            None,
            "(a GPU section)",
            "present",
            tolerance="a sample",
            note=f"gpuwatch has no sample for this GPU: {gpu.get('error') or 'no reason given'}",
        )
        result.rows[-1].verdict = DIFFERS
        return result
    _thermal(b, sample, smi)
    _power(b, sample, smi)
    _clocks(b, sample, smi)
    _throttle(b, sample, smi, counter_drift_s)
    _usage(b, sample, smi)
    _memory_health(b, sample, smi)
    _pcie(b, sample, smi)
    return result


def _thermal(b: _Builder, sample: dict[str, Any], smi: SmiGpu) -> None:
    b.section = "thermal"
    temps = sample.get("temperature_celsius") or {}
    thresholds = dict(sample.get("temperature_threshold_celsius") or {})
    two = "±2 °C (two reads)"
    for quantity, key, line in (
        ("core temperature", "core", "GPU Current Temp"),
        ("memory temperature", "memory", "Memory Current Temp"),
    ):
        raw = smi.get("Temperature", line)
        b.add(quantity, temps.get(key), raw, _number(raw), tolerance=two, same=within(2), show=lambda v: _fmt(v, "C"))
    current = _number(smi.get("Temperature", "GPU Current Temp"))
    margin_raw = smi.get("Temperature", "GPU T.Limit Temp")
    margin = _number(margin_raw)
    # nvidia-smi >= 550 prints thresholds relative to T.Limit (the max operating temperature: current + margin).
    t_limit = current + margin if current is not None and margin is not None else None
    gw_max_op = thresholds.get("core/max_operating")
    for key, absolute_line, relative_line in THRESHOLDS:
        quantity = "threshold " + key.replace("/", " ").replace("_", " ")
        gw = thresholds.pop(key, None)
        show = lambda v: _fmt(v, "C")  # noqa: E731
        absolute_raw = smi.get("Temperature", absolute_line)
        if _number(absolute_raw) is not None or smi.get("Temperature", relative_line) is None:
            b.add(quantity, gw, absolute_raw, _number(absolute_raw), tolerance="exact", show=show)
            continue
        relative_raw = smi.get("Temperature", relative_line)
        relative = _number(relative_raw)
        shown = f"{relative_raw} (T.Limit-relative)"
        if key.startswith("memory/"):
            b.add(
                quantity,
                gw,
                shown,
                None,
                tolerance="exact",
                show=show,
                note="nvidia-smi prints this relative to the memory T.Limit and gives no memory margin, so it has "
                "no absolute value to compare",
            )
        elif key != "core/max_operating" and gw is not None and gw_max_op is not None and relative is not None:
            b.add(
                quantity,
                gw_max_op - gw,
                shown,
                relative,
                tolerance="exact",
                show=_t_limit_view(gw),
                note="compared as max operating − threshold, which is what nvidia-smi prints",
            )
        else:
            derived = t_limit - relative if t_limit is not None and relative is not None else None
            b.add(
                quantity,
                gw,
                f"{shown}; {_fmt(current, 'C')} + margin {margin_raw} → {_fmt(derived, 'C')}",
                derived,
                tolerance="±1 °C (derived from two nvidia-smi reads)",
                same=within(1),
                show=show,
                note="absolute = GPU Current Temp + GPU T.Limit Temp − this line",
            )
    for key, value in sorted(thresholds.items()):
        b.add("threshold " + key, value, None, None, tolerance="exact", show=lambda v: _fmt(v, "C"))
    fans = sample.get("fan_speed_ratio") or {}
    raw = smi.get("Fan Speed")
    gw_fan = _scaled(fans, "0", 100)
    b.add("fan speed", gw_fan, raw, _number(raw), tolerance="±5 %", same=within(5), show=lambda v: _fmt(v, "%"))


def _t_limit_view(absolute: float) -> Callable[[Any], str]:
    """Show gpuwatch's absolute threshold with the T.Limit-relative value it was compared as."""
    return lambda relative: f"{_fmt(absolute, 'C')} (T.Limit {_fmt(relative, 'C')})"


def _power(b: _Builder, sample: dict[str, Any], smi: SmiGpu) -> None:
    b.section = "power"
    watts = lambda v: _fmt(v, "W", 2)  # noqa: E731
    average_raw = smi.get(POWER_SECTIONS, "Average Power Draw")
    instant_raw = smi.get(POWER_SECTIONS, "Instantaneous Power Draw")
    if average_raw is not None:
        b.add(
            "power draw",
            sample.get("power_watts"),
            average_raw,
            _number(average_raw),
            tolerance="±2 W",
            same=within(2),
            show=watts,
            note="NVML's power usage is the 1 s average on Ampere and later, nvidia-smi's Average Power Draw; "
            f"Instantaneous Power Draw: {instant_raw or 'not printed'}",
        )
    else:
        raw = smi.get(POWER_SECTIONS, "Power Draw")
        b.add(
            "power draw",
            sample.get("power_watts"),
            raw,
            _number(raw),
            tolerance="±2 W",
            same=within(2),
            show=watts,
            note="older nvidia-smi: one Power Draw line",
        )
    limits = sample.get("power_limit_watts") or {}
    for key, lines in (
        ("enforced", ("Enforced Power Limit", "Current Power Limit")),
        ("default", ("Default Power Limit",)),
        ("min", ("Min Power Limit",)),
        ("max", ("Max Power Limit",)),
    ):
        raw = smi.get(POWER_SECTIONS, lines)
        b.add(
            f"power limit {key}", limits.get(key), raw, _number(raw), tolerance="±0.01 W", same=within(0.01), show=watts
        )
    raw = smi.get("Performance State")
    pstate = int(raw[1:]) if raw and re.fullmatch(r"P\d+", raw.strip()) else None
    b.add(
        "performance state",
        sample.get("performance_state"),
        raw,
        pstate,
        tolerance="exact",
        show=lambda v: f"P{v}" if v is not None else "—",
    )


def _clocks(b: _Builder, sample: dict[str, Any], smi: SmiGpu) -> None:
    b.section = "clocks"
    mhz = lambda v: _fmt(v, "MHz")  # noqa: E731
    current, maximum = sample.get("clock_hertz") or {}, sample.get("clock_max_hertz") or {}
    for clock, line in (("graphics", "Graphics"), ("sm", "SM"), ("memory", "Memory"), ("video", "Video")):
        raw = smi.get("Clocks", line)
        gw = _scaled(current, clock, 1e-6)
        b.add(f"clock {clock}", gw, raw, _number(raw), tolerance="equal or ±5 %", same=within_ratio(0.05), show=mhz)
    for clock, line in (("graphics", "Graphics"), ("sm", "SM"), ("memory", "Memory"), ("video", "Video")):
        raw = smi.get("Max Clocks", line)
        gw = _scaled(maximum, clock, 1e-6)
        b.add(f"max clock {clock}", gw, raw, _number(raw), tolerance="exact", show=mhz)


def _throttle(b: _Builder, sample: dict[str, Any], smi: SmiGpu, drift_s: float) -> None:
    b.section = "throttle"
    active = dict(sample.get("throttle_active") or {})
    reasons_present = smi.section(*REASON_SECTIONS) is not None
    for reason, lines in REASONS:
        raw = smi.get(REASON_SECTIONS, lines)
        b.add(
            f"reason {reason}",
            active.pop(reason, None),
            raw if reasons_present else None,
            _flag(raw),
            tolerance="exact",
            show=lambda v: "Active" if v else "Not Active" if v is not None else "—",
        )
    for reason, value in sorted(active.items()):
        b.add(
            f"reason {reason}",
            value,
            None,
            None,
            tolerance="exact",
            show=lambda v: "Active" if v else "Not Active",
            note="nvidia-smi -q has no line for this reason",
        )
    counters = dict(sample.get("throttle_counter_seconds") or {})
    micro = lambda v: _fmt(v, "us")  # noqa: E731
    for reason, lines in COUNTERS:
        raw = smi.get(COUNTER_SECTIONS, lines)
        seconds = counters.pop(reason, None)
        note = ""
        if seconds is None and raw is not None:
            note = "gpuwatch has no value: NVML returned its field unfilled (timestamp 0, as on the fixture H100)"
        b.add(
            f"throttle time {reason}",
            seconds * 1e6 if seconds is not None else None,
            raw,
            _number(raw),
            tolerance=f"±{drift_s:g} s (the counter moves between the two reads)",
            same=within(drift_s * 1e6),
            show=micro,
            note=note,
        )
    for reason, seconds in sorted(counters.items()):
        b.add(
            f"throttle time {reason}",
            seconds * 1e6,
            None,
            None,
            tolerance="—",
            show=micro,
            note="a violation-status policy counter; nvidia-smi -q does not print it",
        )


def _usage(b: _Builder, sample: dict[str, Any], smi: SmiGpu) -> None:
    b.section = "usage"
    percent = lambda v: _fmt(v, "%")  # noqa: E731
    for quantity, key, line in (
        ("utilization gpu", "utilization_ratio", "GPU"),
        ("utilization memory", "memory_utilization_ratio", "Memory"),
    ):
        raw = smi.get("Utilization", line)
        gw = _scaled(sample, key, 100)
        b.add(
            quantity,
            gw,
            raw,
            _number(raw),
            tolerance="±5 % points (sample windows differ)",
            same=within(5),
            show=percent,
        )
    mib = lambda v: _fmt(v, "MiB")  # noqa: E731
    total_raw = smi.get("FB Memory Usage", "Total")
    reserved = _number(smi.get("FB Memory Usage", "Reserved"))
    used_raw = smi.get("FB Memory Usage", "Used")
    free = _number(smi.get("FB Memory Usage", "Free"))
    total, used = _number(total_raw), _number(used_raw)
    gw_total = _scaled(sample, "memory_total_bytes", 1 / MIB)
    gw_used = _scaled(sample, "memory_used_bytes", 1 / MIB)
    accounting = (
        f"nvidia-smi: Total {_fmt(total)} = Reserved {_fmt(reserved)} + Used {_fmt(used)} + Free {_fmt(free)} MiB"
        if reserved is not None
        else ""
    )

    def total_same(a: float, c: float) -> bool:
        return abs(a - c) < 1 or (reserved is not None and abs(abs(a - c) - reserved) < 1)

    note = accounting + "; NVML's total (memory_info v1 on the fixture H100) is nvidia-smi's Total"
    if gw_total is not None and total is not None and reserved and abs(abs(gw_total - total) - reserved) < 1:
        note = accounting + "; gpuwatch's total differs from Total by exactly Reserved (memory_info v2 accounting)"
    b.add(
        "memory total",
        gw_total,
        total_raw,
        total,
        tolerance="exact (1 MiB), or ± Reserved",
        same=total_same,
        show=mib,
        note=note,
    )
    note = "nvidia-smi's Used leaves Reserved out, as NVML's memory_info v2 does"
    if gw_used is not None and used is not None and reserved and abs(gw_used - used - reserved) < 1:
        note = "gpuwatch's used = Used + Reserved: it read memory_info v1 (the binding has no nvmlMemory_v2)"
    b.add(
        "memory used",
        gw_used,
        used_raw,
        used,
        tolerance="±1 MiB or ±1 %",
        same=lambda a, c: abs(a - c) <= max(1.0, 0.01 * max(a, c)),
        show=mib,
        note=note,
    )
    processes = sample.get("process_pids")
    raw = smi.get("Processes")
    section = smi.section("Processes")
    count = (
        float(sum(1 for key in section if key.split("#")[0] == "process id"))
        if section is not None
        else (0.0 if raw is not None and raw.strip().lower() == "none" else None)
    )
    b.add(
        "processes",
        float(len(processes)) if processes is not None else None,
        raw if raw is not None else (f"{_fmt(count)} listed" if count is not None else None),
        count,
        tolerance="exact",
        note="gpuwatch counts compute processes, nvidia-smi lists compute and graphics ones",
    )
    b.section = "modes"
    for quantity, key, path in (
        ("persistence mode", "persistence_mode_enabled", ("Persistence Mode",)),
        ("ECC mode", "ecc_enabled", ("ECC Mode", "Current")),
        ("MIG mode", "mig_enabled", ("MIG Mode", "Current")),
    ):
        raw = smi.get(*path)
        b.add(quantity, sample.get(key), raw, _flag(raw), tolerance="exact")
    raw = smi.get("Compute Mode")
    mode = smi_value(raw)
    b.add(
        "compute mode",
        sample.get("compute_mode"),
        raw,
        str(mode).lower().replace(" ", "_") if isinstance(mode, str) else None,
        tolerance="exact",
    )


def _ecc_sum(smi: SmiGpu, counter: str) -> tuple[float | None, float | None, str]:
    """(corrected, uncorrected, how) for the Volatile or Aggregate block, in either nvidia-smi layout."""
    errors = smi.section("ECC Errors")
    block = errors.get(_norm(counter)) if errors is not None else None
    if not isinstance(block, dict):
        return None, None, ""
    if isinstance(block.get("single bit"), dict):  # pre-Ampere: Single Bit / Double Bit, each with a Total
        single, double = block["single bit"].get("total"), block["double bit"].get("total")
        return _number(single), _number(double), "Single Bit Total / Double Bit Total"
    corrected: list[float | None] = []
    uncorrected: list[float | None] = []
    for key, raw in block.items():
        if not isinstance(raw, str) or "threshold" in key:
            continue
        if "uncorrectable" in key:
            uncorrected.append(_number(raw))
        elif "correctable" in key:
            corrected.append(_number(raw))

    def total(values: list[float | None]) -> float | None:
        found = [v for v in values if v is not None]
        return float(sum(found)) if found else None

    return total(corrected), total(uncorrected), "sum of the SRAM and DRAM lines"


def _memory_health(b: _Builder, sample: dict[str, Any], smi: SmiGpu) -> None:
    b.section = "errors"
    ecc = sample.get("ecc_errors_total") or {}
    aggregate = _ecc_sum(smi, "Aggregate")
    volatile = _ecc_sum(smi, "Volatile")
    for i, kind in enumerate(("corrected", "uncorrected")):
        value = aggregate[i]
        b.add(
            f"ECC errors {kind} (aggregate)",
            float(ecc[kind]) if ecc.get(kind) is not None else None,
            _fmt(value) if value is not None else None,
            value,
            tolerance="exact",
            note=f"gpuwatch exports NVML's aggregate (lifetime) count; nvidia-smi: {aggregate[2] or 'no Aggregate'}"
            f"; volatile: {_fmt(volatile[i])}",
        )
    rows = sample.get("remapped_rows_total") or {}
    for key, line in (("correctable", "Correctable Error"), ("uncorrectable", "Uncorrectable Error")):
        raw = smi.get("Remapped Rows", line)
        b.add(
            f"remapped rows {key}",
            float(rows[key]) if rows.get(key) is not None else None,
            raw,
            _number(raw),
            tolerance="exact",
        )
    for quantity, key, line in (
        ("row remap pending", "row_remap_pending", "Pending"),
        ("row remap failed", "row_remap_failed", "Remapping Failure Occurred"),
    ):
        raw = smi.get("Remapped Rows", line)
        b.add(quantity, sample.get(key), raw, _flag(raw), tolerance="exact")
    single = _number(smi.get("Retired Pages", "Single Bit ECC"))
    double = _number(smi.get("Retired Pages", "Double Bit ECC"))
    retired = None if single is None and double is None else (single or 0) + (double or 0)
    retired_gw = sample.get("retired_pages")
    b.add(
        "retired pages",
        float(retired_gw) if retired_gw is not None else None,
        f"{smi.get('Retired Pages', 'Single Bit ECC')} + {smi.get('Retired Pages', 'Double Bit ECC')}"
        if smi.section("Retired Pages") is not None
        else None,
        retired,
        tolerance="exact",
    )
    raw = smi.get("GPU Recovery Action")
    action = sample.get("recovery_action")
    b.add(
        "recovery action",
        RECOVERY_ACTIONS[action] if isinstance(action, int) and 0 <= action < len(RECOVERY_ACTIONS) else action,
        raw,
        _norm(raw) if raw is not None and smi_value(raw) is not None else None,
        tolerance="same action",
        same=lambda a, c: str(a).replace(" ", "") == str(c).replace(" ", "").replace("_", ""),
    )


def _pcie(b: _Builder, sample: dict[str, Any], smi: SmiGpu) -> None:
    b.section = "pcie"
    generation, width = sample.get("pcie_link_generation") or {}, sample.get("pcie_link_width") or {}
    link = ("PCI", "GPU Link Info")
    device_max = smi.get(*link, "PCIe Generation", "Device Max")
    for key, line in (("current", "Current"), ("max", "Max")):
        raw = smi.get(*link, "PCIe Generation", line)
        b.add(
            f"PCIe generation {key}",
            float(generation[key]) if generation.get(key) is not None else None,
            raw,
            _number(raw),
            tolerance="exact",
            show=lambda v: _fmt(v),
            note=f"the GPU's own max (Device Max): {device_max}" if key == "max" and device_max else "",
        )
    for key, line in (("current", "Current"), ("max", "Max")):
        raw = smi.get(*link, "Link Width", line)
        b.add(
            f"PCIe width {key}",
            float(width[key]) if width.get(key) is not None else None,
            raw,
            _number(raw),
            tolerance="exact",
            show=lambda v: f"{_fmt(v)}x",
        )
    raw = smi.get("PCI", "Replays Since Reset")
    replays = sample.get("pcie_replays_total")
    b.add("PCIe replays", float(replays) if replays is not None else None, raw, _number(raw), tolerance="exact")


# ----- pairing, report -----


@dataclass
class Outcome:
    """Everything one comparison produced: the pairs, what stayed unpaired, and why."""

    comparisons: list[GpuComparison]
    only_gpuwatch: list[str]
    only_smi: list[str]
    problems: list[str]

    @property
    def differs(self) -> bool:
        return bool(self.problems) or any(c.count(DIFFERS) for c in self.comparisons)


def compare(
    snapshot: dict[str, Any], report: SmiReport, *, match_index: bool = False, counter_drift_s: float = 2.0
) -> Outcome:
    """Pair GPUs by UUID (by position with match_index) and compare each pair."""
    gw_gpus = sorted(snapshot.get("gpus") or [], key=lambda g: (g.get("identity") or {}).get("index", 0))
    pairs: list[tuple[dict[str, Any], SmiGpu, str]] = []
    if match_index:
        pairs = [(g, s, "position") for g, s in zip(gw_gpus, report.gpus, strict=False)]
        rest_gw, rest_smi = gw_gpus[len(pairs) :], report.gpus[len(pairs) :]
    else:
        by_uuid = {s.uuid: s for s in report.gpus}
        rest_gw = []
        for g in gw_gpus:
            found = by_uuid.pop((g.get("identity") or {}).get("uuid", ""), None)
            if found is None:
                rest_gw.append(g)
            else:
                pairs.append((g, found, "uuid"))
        rest_smi = [s for s in report.gpus if s.uuid in by_uuid]
    outcome = Outcome(
        [compare_gpu(g, s, report, counter_drift_s=counter_drift_s, paired_by=how) for g, s, how in pairs],
        [(g.get("identity") or {}).get("uuid", "?") for g in rest_gw],
        [f"{s.uuid or '?'} ({s.bus_id})" for s in rest_smi],
        [],
    )
    if not pairs:
        outcome.problems.append(
            "no GPU matched: gpuwatch has "
            + (", ".join(outcome.only_gpuwatch) or "no GPU")
            + "; nvidia-smi has "
            + (", ".join(outcome.only_smi) or "no GPU")
            + (
                ". They are not the same GPUs; pass --match-index to pair them by position anyway"
                if not match_index and gw_gpus and report.gpus
                else ""
            )
        )
    else:
        if outcome.only_gpuwatch:
            outcome.problems.append("only gpuwatch sees " + ", ".join(outcome.only_gpuwatch))
        if outcome.only_smi:
            outcome.problems.append("only nvidia-smi sees " + ", ".join(outcome.only_smi))
    return outcome


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(outcome: Outcome, context: list[str]) -> str:
    """One table per GPU pair, a header with the read times, and the differences listed at the end."""
    lines = ["## gpuwatch snapshot beside nvidia-smi -q", ""]
    lines += [f"- {line}" for line in context]
    lines.append("")
    for c in outcome.comparisons:
        counts = ", ".join(f"{c.count(v)} {v}" for v in VERDICTS if c.count(v))
        lines += [
            f"### gpuwatch GPU {c.index} `{c.uuid}` ({c.model or '?'}) ↔ nvidia-smi GPU {c.smi_bus_id}"
            + (f" `{c.smi_uuid}`" if c.smi_uuid != c.uuid else "")
            + f" (paired by {c.paired_by})",
            "",
            counts,
            "",
            "| section | quantity | gpuwatch | nvidia-smi | tolerance | verdict | note |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in c.rows:
            verdict = f"**{r.verdict}**" if r.verdict == DIFFERS else r.verdict
            cells = (r.section, r.quantity, r.gpuwatch, r.nvidia_smi, r.tolerance, verdict, r.note)
            lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
        lines.append("")
    differing = [(c, r) for c in outcome.comparisons for r in c.rows if r.verdict == DIFFERS]
    if outcome.problems or differing:
        lines.append("**Differences:**")
        lines += [f"- {p}" for p in outcome.problems]
        lines += [
            f"- GPU {c.index} {r.quantity}: gpuwatch {r.gpuwatch}, nvidia-smi {r.nvidia_smi}" for c, r in differing
        ]
    else:
        lines.append("**Every compared row matches.**")
    return "\n".join(lines) + "\n"


# ----- inputs -----


@dataclass
class Captured:
    """One command's run: when it started and ended (unix time), its exit status and output."""

    command: list[str]
    started: float = 0.0
    ended: float = 0.0
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str = ""


def _capture(command: list[str], slot: Captured, start: threading.Barrier, timeout_s: float) -> None:
    start.wait()
    slot.started = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
        slot.returncode, slot.stdout, slot.stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        slot.error = f"did not finish within {timeout_s:g} s (killed)"
    except OSError as exc:
        slot.error = f"could not be started: {exc}"
    slot.ended = time.time()


def run_live(gw_command: list[str], smi_command: list[str], timeout_s: float) -> tuple[Captured, Captured]:
    """Start both commands together (two threads released by one barrier) so their reads are close in time."""
    gw, smi = Captured(gw_command), Captured(smi_command)
    barrier = threading.Barrier(2)
    threads = [
        threading.Thread(target=_capture, args=(cmd, slot, barrier, timeout_s), daemon=True)
        for cmd, slot in ((gw_command, gw), (smi_command, smi))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return gw, smi


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def load_snapshot(text: str, source: str) -> dict[str, Any]:
    """The snapshot JSON; a UsageError naming the source when it is not one, or holds no GPU."""
    try:
        snapshot = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source} is not JSON ({exc}): give the output of `gpuwatch snapshot --json`") from exc
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("gpus"), list):
        raise UsageError(f"{source} has no 'gpus' list: give the output of `gpuwatch snapshot --json`")
    if not snapshot["gpus"]:
        errors = "; ".join(f"{k}: {v}" for k, v in (snapshot.get("backend_errors") or {}).items())
        raise UsageError(f"gpuwatch found no GPU in {source}" + (f" ({errors})" if errors else ""))
    return snapshot


def load_smi(text: str, source: str) -> SmiReport:
    report = parse_smi(text)
    if not report.gpus:
        raise UsageError(
            f"{source} has no 'GPU 0000xxxx:xx:xx.x' section: give the text output of `nvidia-smi -q` "
            f"(it begins: {chr(10).join(text.strip().splitlines()[:2])[:200]!r})"
        )
    return report


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read the {what} {path}: {exc.strerror or exc}") from exc


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(
        description="gpuwatch snapshot --json beside nvidia-smi -q, per GPU; exit 1 when a reading differs.",
        epilog="Arguments after -- are added to `gpuwatch snapshot` in --live mode (e.g. -- --scenario healthy).",
    )
    parser.add_argument("--snapshot", metavar="FILE", help="saved `gpuwatch snapshot --json` output")
    parser.add_argument("--smi", metavar="FILE", help="saved `nvidia-smi -q` output")
    parser.add_argument("--live", action="store_true", help="run both now, at the same moment, and compare")
    parser.add_argument("--gpuwatch", default=f"{sys.executable} -m gpuwatch", help="how to run gpuwatch (--live)")
    parser.add_argument("--backend", default="nvml", help="gpuwatch snapshot --backend (--live; default nvml)")
    parser.add_argument("--nvidia-smi", dest="smi_cmd", default="nvidia-smi", help="the nvidia-smi program (--live)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds each command may take (--live)")
    parser.add_argument("--match-index", action="store_true", help="pair GPUs by position instead of by UUID")
    parser.add_argument(
        "--counter-drift",
        type=float,
        default=None,
        metavar="S",
        help="seconds a throttle counter may move between the two reads (default: the live reads' span + 0.5, "
        "2 for files)",
    )
    parser.add_argument("--json", metavar="FILE", help="write every row and the raw inputs here")
    parser.add_argument("--markdown", metavar="FILE", help="write the Markdown tables here too")
    args = parser.parse_args(argv)
    if args.live == bool(args.snapshot or args.smi) or (not args.live and not (args.snapshot and args.smi)):
        parser.print_usage(sys.stderr)
        print("smi_compare.py: give either --live, or both --snapshot FILE and --smi FILE", file=sys.stderr)
        return 2
    try:
        return _run(args, extra)
    except UsageError as exc:
        print(f"smi_compare.py: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, extra: list[str]) -> int:
    timestamps: dict[str, Any] = {}
    context: list[str] = []
    if args.live:
        smi_path = shutil.which(args.smi_cmd)
        if smi_path is None:
            raise UsageError(
                f"{args.smi_cmd} was not found on PATH: this check needs the NVIDIA driver's nvidia-smi "
                "(or compare saved outputs with --snapshot FILE --smi FILE)"
            )
        gw_command = [*shlex.split(args.gpuwatch), "snapshot", "--json", "--backend", args.backend, *extra]
        gw_run, smi_run = run_live(gw_command, [smi_path, "-q"], args.timeout)
        for name, done in (("gpuwatch", gw_run), ("nvidia-smi", smi_run)):
            timestamps[name] = {
                "command": done.command,
                "started": done.started,
                "ended": done.ended,
                "returncode": done.returncode,
                "stderr_tail": _tail(done.stderr, 20),
            }
            if done.error:
                raise UsageError(f"{shlex.join(done.command)} {done.error}")
        smi_text = smi_run.stdout
        report = parse_smi(smi_text)
        if not report.gpus:  # a non-zero exit with GPU sections still printed is compared, and said below
            raise UsageError(
                f"nvidia-smi -q printed no GPU (exit {smi_run.returncode}): {_tail(smi_text + smi_run.stderr, 4)}"
            )
        if not gw_run.stdout.strip():
            raise UsageError(
                f"{shlex.join(gw_command)} printed nothing (exit {gw_run.returncode}): {_tail(gw_run.stderr, 6)}"
            )
        snapshot = load_snapshot(gw_run.stdout, "the gpuwatch snapshot")
        for name, done in (("gpuwatch snapshot", gw_run), ("nvidia-smi -q", smi_run)):
            if done.returncode != 0:
                context.append(f"{name} exited {done.returncode}: {_tail(done.stderr, 2) or 'no message'}")
        start = min(gw_run.started, smi_run.started)
        span = max(gw_run.ended, smi_run.ended) - start
        drift = args.counter_drift if args.counter_drift is not None else round(span + 0.5, 2)
        context.append(
            f"live: gpuwatch ran {gw_run.started - start:+.3f}…{gw_run.ended - start:+.3f} s, nvidia-smi -q "
            f"{smi_run.started - start:+.3f}…{smi_run.ended - start:+.3f} s after {_iso(start)}"
        )
        sample_times = [g["sample"]["timestamp"] for g in snapshot["gpus"] if g.get("sample")]
        if sample_times:
            context.append(
                f"gpuwatch's sample was read at {min(sample_times) - start:+.3f} s; nvidia-smi's reads fall in its "
                "window above"
            )
    else:
        smi_text = _read(args.smi, "nvidia-smi -q output")
        snapshot = load_snapshot(_read(args.snapshot, "snapshot"), args.snapshot)
        report = load_smi(smi_text, args.smi)
        drift = args.counter_drift if args.counter_drift is not None else 2.0
        sample_times = [g["sample"]["timestamp"] for g in snapshot["gpus"] if g.get("sample")]
        context.append(f"files: snapshot {args.snapshot}, nvidia-smi -q {args.smi}")
        if sample_times:
            context.append(f"gpuwatch sample read at {_iso(min(sample_times))}")
    context.append(
        f"nvidia-smi: {report.header.get('timestamp', '?')}, driver {report.header.get('driver version', '?')}, "
        f"CUDA {report.header.get('cuda version', '?')}; throttle counters may drift ±{drift:g} s"
    )
    outcome = compare(snapshot, report, match_index=args.match_index, counter_drift_s=drift)
    text = markdown(outcome, context)
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        document = {
            "mode": "live" if args.live else "files",
            "timestamps": timestamps,
            "context": context,
            "counter_drift_seconds": drift,
            "problems": outcome.problems,
            "gpus": [asdict(c) for c in outcome.comparisons],  # each with its rows
            "summary": {v: sum(c.count(v) for c in outcome.comparisons) for v in VERDICTS},
            "raw": {"nvidia_smi_q": smi_text, "snapshot": snapshot},
        }
        Path(args.json).write_text(json.dumps(document, indent=1, default=str) + "\n")
    if outcome.differs:
        print("smi_compare.py: differences found (listed above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
