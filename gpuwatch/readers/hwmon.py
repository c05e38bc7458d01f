"""Linux hwmon: PMBus supplies, mapped Super-I/O rails, host temperatures and fans, from a sysfs root.

The root is a parameter (node_exporter's habit), so the same code reads /sys on a server and a fixture tree in the
tests and the simulated node. Every file is read on its own: an absent sensor (EIO/ENODATA), a root-only file
(EACCES) or a file that vanished skips that one reading and keeps the rest.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from gpuwatch.core.latch import Latch
from gpuwatch.core.model import HostPsuPower, HostReadingValue, HostSample, HostVoltage
from gpuwatch.files.sensormap import ChipMap, InputMap, find_input, has_mapping
from gpuwatch.readers.rails import (
    declared_undervoltage,
    is_supply_rail,
    lower_limit,
    nominal_from_name,
    nominal_from_reading,
)
from gpuwatch.readers.sysfs import read_attribute

log = logging.getLogger(__name__)

# Chips that report raw, unscaled, unlabelled pins: their voltages are exported only through a mapping.
SUPER_IO = re.compile(r"^(nct6\d{3}\w*|nct67\w*|it8\d{2,3}\w*|it87|w83\d+\w*|f71\d+\w*|f81\d+\w*|sch56\d+|dme1737)$")
# GPU drivers' own chips: the GPU backends report those temperatures and fans.
GPU_DRIVERS = frozenset({"amdgpu", "radeon", "nouveau", "i915", "xe", "nvidia"})
PCI_ADDRESS = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
I2C_CLIENT = re.compile(r"^(\d+)-([0-9a-f]{4})$")
PLATFORM_DEVICE = re.compile(r"^(.+)\.(\d+)$")
_INPUT = re.compile(r"^(in|temp|fan)(\d+)_input$")
_POWER = re.compile(r"^power(\d+)_input$")
# pmbus_core.c labels a chip's input power "pin" (READ_PIN) and its outputs' "pout1" … (READ_POUT, one per page).
_PMBUS_POWER = re.compile(r"^(pin|pout\d*)$")
AC_INPUT_MIN_VOLTS = 90.0  # the lowest AC mains a server supply takes (100 V less 10 %)


@dataclass(frozen=True, slots=True)
class Chip:
    """One hwmon device: its driver name and the node-unique label (libsensors' name-bus-address)."""

    path: Path
    name: str
    label: str
    super_io: bool


class HwmonReader:
    """Reads every hwmon chip under `<root>/class/hwmon` once per call to read()."""

    source = "hwmon"

    def __init__(
        self,
        root: Path = Path("/sys"),
        maps: Sequence[ChipMap] = (),
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self.maps = tuple(maps)
        self._clock = clock
        self._unmapped = Latch(log)  # by chip label: said once, a hint that holds until the maps change
        self._nominals: dict[tuple[str, str], float] = {}  # (chip label, input) -> nominal inferred from a reading
        # (hwmonN, where class/hwmon/hwmonN links to, driver name) -> (a GPU's chip, its label): where a device sits
        # and what it is do not change while its link does, and working them out was a quarter of each read.
        self._placed: dict[tuple[str, str, str], tuple[bool, str]] = {}

    @property
    def hwmon_dir(self) -> Path:
        return self.root / "class" / "hwmon"

    def chips(self) -> list[Chip]:
        """Every chip that is not a GPU's, sorted by label; empty when the machine has no hwmon (VMs)."""
        try:
            entries = sorted(self.hwmon_dir.iterdir(), key=lambda p: _natural(p.name))
        except OSError:
            return []
        chips: list[Chip] = []
        used: set[str] = set()
        placed: dict[tuple[str, str, str], tuple[bool, str]] = {}
        for entry in entries:
            name = read_attribute(entry / "name")
            if name is None:
                continue
            try:
                key: tuple[str, str, str] | None = (entry.name, os.readlink(entry), name)
            except OSError:  # not a link (a tree built by hand): worked out at every read
                key = None
            known = self._placed.get(key) if key is not None else None
            if known is None:
                # Directory names are bytes; Python hands undecodable ones over as surrogates, which no exposition
                # can encode: one odd byte in a device name made every /metrics a 500. Replaced here, like file text.
                known = (_is_gpu(entry, name), printable(chip_label(entry, name)))
            if key is not None:
                placed[key] = known
            gpu_chip, label = known
            if gpu_chip:
                continue
            if label in used:  # two chips at one address should not happen; keep both distinct if it does
                label = printable(f"{label}-{entry.name}")
            used.add(label)
            chips.append(Chip(entry, name, label, SUPER_IO.match(name) is not None))
        self._placed = placed  # only the chips there now
        return sorted(chips, key=lambda c: c.label)

    def board_name(self) -> str:
        return read_attribute(self.root / "class" / "dmi" / "id" / "board_name") or ""

    def read(self) -> HostSample:
        voltages: list[HostVoltage] = []
        temperatures: list[HostReadingValue] = []
        fans: list[HostReadingValue] = []
        power: list[HostPsuPower] = []
        board = self.board_name()
        for chip in self.chips():
            files = _listing(chip.path)
            supply = None if chip.super_io else _psu_power(chip, files)
            if supply is not None:
                power.append(supply)
            mapped = has_mapping(self.maps, chip.label, board)
            if chip.super_io and not mapped:
                self._unmapped.fail(
                    "%s is a Super-I/O chip: its voltages are exported only through a mapping in host.sensor_maps "
                    "(see deploy/sensor-maps/); temperatures and fans are read",
                    chip.label,
                    key=chip.label,
                    level=logging.INFO,
                )
            for kind, index in _inputs(files):
                key = f"{kind}{index}"
                mapping = find_input(self.maps, chip.label, board, key)
                if mapping is not None and mapping.ignore:
                    continue
                if kind == "in":
                    voltage = self._voltage(chip, files, key, mapping)
                    if voltage is not None:
                        voltages.append(voltage)
                    continue
                raw = _read_number(f"{chip.path}/{key}_input")
                if raw is None:
                    continue
                name = _sensor_name(chip.path, files, key, mapping)
                if kind == "temp":
                    value = raw / 1000.0
                    temperatures.append(HostReadingValue(chip.label, name, _scaled(value, mapping)))
                else:
                    fans.append(HostReadingValue(chip.label, name, _scaled(raw, mapping)))
        return HostSample(
            "hwmon",
            self._clock(),
            voltages=tuple(_unique(voltages)),
            temperatures=tuple(_unique(temperatures)),
            fans=tuple(_unique(fans)),
            psu_power=tuple(power),
        )

    def _inferred_nominal(self, chip: Chip, key: str, name: str, volts: float) -> float | None:
        """A PMBus output's nominal from its reading (rails.nominal_from_reading), inferred once per input and kept
        while the agent runs: a rail's nominal does not change, and inferring it again at every read would lose it
        exactly when the rail sags furthest."""
        known = self._nominals.get((chip.label, key))
        if known is None:
            known = nominal_from_reading(name, volts)
            if known is not None:
                self._nominals[(chip.label, key)] = known
        return known

    def _voltage(self, chip: Chip, files: frozenset[str], key: str, mapping: InputMap | None) -> HostVoltage | None:
        """A supply rail in volts, or None: unmapped Super-I/O pins, Vbat/Vcore/DIMM rails, unreadable inputs."""
        if chip.super_io and mapping is None:
            return None
        name = _sensor_name(chip.path, files, key, mapping)
        if not is_supply_rail(name):
            return None
        raw = _read_number(f"{chip.path}/{key}_input")
        if raw is None:
            return None
        volts = _scaled(raw / 1000.0, mapping)
        nominal = mapping.nominal if mapping is not None and mapping.nominal is not None else nominal_from_name(name)
        if nominal is None and not chip.super_io:
            nominal = self._inferred_nominal(chip, key, name, volts)
        declared = mapping.min if mapping is not None else None
        if declared is None and not chip.super_io:
            # The chip's low warning limit, else its lower critical one. On PMBus chips inX_min is VOUT_UV_WARN_LIMIT
            # and inX_lcrit VOUT_UV_FAULT_LIMIT (pmbus_core.c, vout_limit_attrs): at the fault limit the supply
            # shuts its output down or retries, so the warning is the one that leaves time to act. A negative rail
            # sags toward its max/crit instead (declared_undervoltage).
            lower = _limits(chip.path, files, key, mapping, "min", "lcrit")
            declared = declared_undervoltage(nominal, lower, _limits(chip.path, files, key, mapping, "max", "crit"))
        minimum = lower_limit(nominal, declared)
        alarms = () if chip.super_io else _alarms(chip.path, files, key)
        alarm = any(flag for _, flag in alarms) if alarms else None
        return HostVoltage(chip.label, name, volts, nominal, minimum, alarm, alarms)


def _psu_power(chip: Chip, files: frozenset[str]) -> HostPsuPower | None:
    """A PMBus power supply's power, from powerX_input (microwatts, Documentation/hwmon/sysfs-interface.rst) of the
    input labelled "pin", else of its first output ("pout1" …), or None.

    PMBus core gives CPU and GPU voltage regulators the same pin/pout (mp2975, xdpe12284, the 54→12 V converters of
    GPU baseboards); those are no supply and are left out. A supply is a PMBus chip with its own fan or an AC input
    ("vin" at 90 V or more): regulators and bus converters have neither."""
    found: dict[str, float] = {}
    for index in sorted(int(m.group(1)) for m in map(_POWER.match, files) if m):
        label = read_attribute(f"{chip.path}/power{index}_label") if f"power{index}_label" in files else None
        if label is None or not _PMBUS_POWER.match(label):
            continue
        microwatts = _read_number(f"{chip.path}/power{index}_input")
        if microwatts is not None and microwatts >= 0:
            found.setdefault(label, microwatts / 1e6)
    if not found or not _is_supply(chip.path, files):
        return None
    label = "pin" if "pin" in found else next(iter(found))
    return HostPsuPower(chip.label, round(found[label], 6), label)


def _is_supply(chip: Path, files: frozenset[str]) -> bool:
    if any(re.match(r"^fan\d+_input$", n) for n in files):
        return True
    for entry in files:
        match = _INPUT.match(entry)
        label = f"in{match.group(2)}_label" if match and match.group(1) == "in" else ""
        if label in files and read_attribute(f"{chip}/{label}") == "vin":
            millivolts = _read_number(f"{chip}/{entry}")
            if millivolts is not None and millivolts / 1000.0 >= AC_INPUT_MIN_VOLTS:
                return True
    return False


def _limits(chip: Path, files: frozenset[str], key: str, mapping: InputMap | None, *suffixes: str) -> list[float]:
    """The input's limits that can be read (inX_min, inX_lcrit …), in volts, in the order asked."""
    values = (_read_number(f"{chip}/{name}") for suffix in suffixes if (name := f"{key}_{suffix}") in files)
    return [_scaled(v / 1000.0, mapping) for v in values if v is not None]


# The alarm attributes of a voltage input (Documentation/hwmon/sysfs-interface.rst), by the limit they are raised at:
# inX_min_alarm, inX_lcrit_alarm, inX_max_alarm, inX_crit_alarm; "any" is a chip's single inX_alarm that does not say
# which limit was crossed.
ALARM_LIMITS = ("min", "lcrit", "max", "crit")


def _alarms(chip: Path, files: frozenset[str], key: str) -> tuple[tuple[str, bool], ...]:
    """The input's alarm flags the chip has, as (limit, raised); a flag that cannot be read, or reads neither 0 nor
    1, is left out. Super-I/O chips' flags are never read: they compare against limits the BIOS left, not ones the
    operator's mapping states."""
    found: list[tuple[str, bool]] = []
    for limit, attribute in (*((lim, f"{key}_{lim}_alarm") for lim in ALARM_LIMITS), ("any", f"{key}_alarm")):
        if attribute not in files:
            continue
        flag = _read_number(f"{chip}/{attribute}")
        if flag in (0.0, 1.0):
            found.append((limit, flag == 1.0))
    return tuple(found)


def chip_label(hwmon: Path, name: str) -> str:
    """libsensors' chip name: `name-bus-address` from where the device sits (i2c, isa/platform, pci), so two
    PSUs of one model are told apart and the label survives reboots (hwmonN numbers do not)."""
    try:
        device = (hwmon / "device").resolve(strict=True)
    except (OSError, RuntimeError):
        return f"{name}-virtual-0"
    base = device.name
    i2c = I2C_CLIENT.match(base)
    if i2c:
        return f"{name}-i2c-{int(i2c.group(1))}-{int(i2c.group(2), 16):02x}"
    for part in (device, *device.parents):
        pci = PCI_ADDRESS.match(part.name)
        if pci:
            _domain, bus, slot, func = (int(g, 16) for g in pci.groups())
            return f"{name}-pci-{(bus << 8) + (slot << 3) + func:04x}"
    platform = PLATFORM_DEVICE.match(base)
    if platform and "platform" in device.parts:
        return f"{name}-isa-{int(platform.group(2)):04x}"
    if "acpi" in base.lower() or base.startswith(("LNX", "PNP")):
        return f"{name}-acpi-0"
    return f"{name}-virtual-0"


def _is_gpu(hwmon: Path, name: str) -> bool:
    """A GPU driver's chip, or any hwmon whose device is a display controller (PCI class 0x03)."""
    if name in GPU_DRIVERS:
        return True
    device_class = read_attribute(hwmon / "device" / "class")
    return device_class is not None and device_class.lower().startswith("0x03")


def _listing(chip: Path) -> frozenset[str]:
    """The chip's attribute files: a reading is attempted only for a file that is there (a missing one was an
    exception per absent alarm, label and limit, most of the files a read tried)."""
    try:
        return frozenset(os.listdir(chip))
    except OSError:
        return frozenset()


def _inputs(files: frozenset[str]) -> list[tuple[str, int]]:
    found = []
    for entry in files:
        match = _INPUT.match(entry)
        if match:
            found.append((match.group(1), int(match.group(2))))
    order = {"in": 0, "temp": 1, "fan": 2}
    return sorted(found, key=lambda item: (order[item[0]], item[1]))


def _sensor_name(chip: Path, files: frozenset[str], key: str, mapping: InputMap | None) -> str:
    if mapping is not None and mapping.label:
        return mapping.label
    label = f"{key}_label"
    return (read_attribute(f"{chip}/{label}") if label in files else None) or key


def _scaled(value: float, mapping: InputMap | None) -> float:
    return value if mapping is None else round(mapping.scale(value), 6)


def printable(text: str) -> str:
    """``text`` with undecodable bytes (surrogate escapes from a file name) as U+FFFD, like errors="replace"."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _read_number(path: Path | str) -> float | None:
    text = read_attribute(path)
    if not text:
        return None
    try:
        value = float(text)  # exact for every integer a float holds; int() first overflowed past 1e308
    except ValueError:
        return None
    return value if math.isfinite(value) else None  # "nan", "inf", 400 digits: no reading


def _natural(name: str) -> tuple[str, int]:
    digits = re.search(r"\d+$", name)
    return (name[: digits.start()] if digits else name, int(digits.group()) if digits else -1)


T = TypeVar("T", HostVoltage, HostReadingValue)


def _unique(items: list[T]) -> list[T]:
    """Two inputs of one chip with the same label (two "Core 0" on a chip, a mapping typo) get distinct names."""
    seen: dict[tuple[str, str], int] = {}
    out: list[T] = []
    for item in items:
        key = (item.chip, item.sensor)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            item = _renamed(item, f"{item.sensor} #{seen[key]}")
        out.append(item)
    return out


def _renamed(item: T, sensor: str) -> T:
    return replace(item, sensor=sensor)
