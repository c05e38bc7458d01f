"""The BMC through `ipmitool`: voltage rails with the BMC's own thresholds, power supplies from their event states.

Two commands, chosen for what each one says best:

* `ipmitool sensor` — one pipe-separated line per threshold sensor: reading, unit, status and the six thresholds
  the BMC enforces *now* (read with Get Sensor Thresholds, so an operator's change is seen, unlike the SDR's initial
  values in `sdr -v`). The unit column ("Volts", "degrees C", "RPM") identifies rails, temperatures and fans the same
  way on every vendor's BMC, whatever the sensor is called. Discrete sensors show as "discrete" and are skipped.
* `ipmitool sdr type "Power Supply"` — the supplies' event states already decoded ("Presence detected, Failure
  detected", "Power Supply AC lost" …). `sensor` shows them only as a raw state mask (0x0100), whose bits a parser
  would have to decode itself.

`sdr elist` gives readings without thresholds, so it cannot tell a rail's lower-critical limit. Both commands read
the local BMC through /dev/ipmi0 (`-I open`); each runs with a timeout and is killed when it passes it, because a
busy BMC can take tens of seconds and an agent must never wait on it without bound.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuwatch.core.model import HostPsu, HostPsuPower, HostReadingValue, HostSample, HostVoltage
from gpuwatch.files.statefile import STATE_VERSION, StateDirError, atomic_write_json, read_json
from gpuwatch.readers.rails import declared_undervoltage, is_supply_rail, lower_limit, nominal_from_name

log = logging.getLogger(__name__)

CHIP = "ipmi"
SENSOR_COMMAND = ("sensor",)
PSU_COMMAND = ("sdr", "type", "Power Supply")
PSU_STATE_KIND = "gpuwatch-host-psus"
THRESHOLDS = ("lnr", "lcr", "lnc", "unc", "ucr", "unr")
# Event states of sensor type 0x08 (IPMI 2.0 table 42-3) that mean the supply does not deliver, or will not.
_FAILED = re.compile(r"failure detected|predictive failure|ac lost|out-of-range|config(uration)? error", re.I)
_PRESENT = re.compile(r"presence detected", re.I)
_REDUNDANCY = re.compile(r"redundan", re.I)
# The redundancy states (IPMI generic event/reading type 0Bh, as ipmitool and FreeIPMI print them): Fully Redundant,
# Redundancy Lost, Redundancy Degraded, Non-redundant:Sufficient Resources from Redundant / from Insufficient
# Resources, Non-redundant:Insufficient Resources, Redundancy Degraded from Fully Redundant / from Non-redundant.
# "Degraded" still has redundancy (a unit lost some, not all); "from Non-redundant" is not a non-redundant state.
_REDUNDANCY_KEPT = re.compile(r"fully redundant|redundancy regained|redundancy degraded", re.I)
_REDUNDANCY_LOST = re.compile(r"redundancy lost|(?<!from )non-?\s?redundant", re.I)
# A supply's number in a sensor name: PS1 Status, PSU2 Power Out, Power Supply 1, PSU0_STATUS, PWS 2.
_PSU_NUMBER = re.compile(r"(?<![a-z0-9])(?:psu|ps|pws|power\s*supply)\s*[_-]?\s*(\d+)(?![0-9])", re.I)
_ENTITY_PSU = re.compile(r"(?:^|\s)10\.(\d+)$")  # entity ID 10 (0Ah) is "power supply": 10.2 = the second
_POWER_IN = re.compile(r"(?<![a-z])(?:in|input|pin|ac)(?![a-z])", re.I)
_POWER_OUT = re.compile(r"(?<![a-z])(?:out|output|pout|dc)(?![a-z])", re.I)

Runner = Callable[[Sequence[str], float], str]


# usable()'s detail for a BMC device that exists but this process cannot open: a deployment problem, not "no BMC".
INACCESSIBLE = "BMC present but not accessible"
INACCESSIBLE_HINT = "see the ipmi.conf drop-in / udev rule in systemd/README.md"


class IpmiError(Exception):
    """ipmitool could not be run, failed, or passed its timeout; the message says which."""


@dataclass(frozen=True, slots=True)
class IpmiSensor:
    """A line of `ipmitool sensor`: the reading (None when "na") and the thresholds the BMC declares."""

    name: str
    value: float | None
    unit: str
    status: str
    thresholds: dict[str, float]


@dataclass(frozen=True, slots=True)
class PsuState:
    """A line of `ipmitool sdr type "Power Supply"`."""

    name: str
    entity: str
    status: str
    states: str

    @property
    def label(self) -> str:
        """The `psu` label: the sensor's name, with the entity instance when the name alone says no bay (Dell's
        supplies are all called "Status", told apart by entity 10.1, 10.2)."""
        return self.name if any(ch.isdigit() for ch in self.name) else f"{self.name} {self.entity}"

    @property
    def redundancy(self) -> bool:
        return bool(_REDUNDANCY.search(self.name) or _REDUNDANCY.search(self.states))

    @property
    def failed(self) -> bool:
        return bool(_FAILED.search(self.states))

    @property
    def present(self) -> bool:
        """Present: presence asserted, or a failure reported (some BMCs drop the presence bit of a failed supply)."""
        if self.status == "ns":
            return False
        return bool(_PRESENT.search(self.states)) or self.failed


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None  # na, ns, "Not Readable", "disabled", hex states of discrete sensors
    return value if math.isfinite(value) else None  # "nan", "inf" are no reading either


def redundancy_lost(states: Sequence[PsuState], psus: Sequence[HostPsu]) -> bool | None:
    """Whether the node has lost power-supply redundancy, or None where nothing tells.

    The BMC's redundancy sensor says it where it has one and reads it: Redundancy Lost or a Non-redundant state is
    lost; Fully Redundant or Redundancy Degraded (some redundancy left) is not. Without one (or with one that is
    "Not Readable"), two or more supplies known of which one is not up is lost, all up is not; a single supply has
    no redundancy to lose and says nothing."""
    verdicts = []
    for state in states:
        if not state.redundancy or state.status == "ns":
            continue
        if _REDUNDANCY_LOST.search(state.states) and not _REDUNDANCY_KEPT.search(state.states):
            verdicts.append(True)
        elif _REDUNDANCY_KEPT.search(state.states):
            verdicts.append(False)
    if verdicts:
        return any(verdicts)
    if len(psus) >= 2:
        return not all(p.up for p in psus)
    return None


def psu_number(label: str) -> int | None:
    """The supply's number a name or `psu` label carries (PS1 Status, Power Supply 2, PSU0, Dell's Status 10.2)."""
    match = _PSU_NUMBER.search(label) or _ENTITY_PSU.search(label)
    return int(match.group(1)) if match else None


def psu_power_from_sensors(sensors: Sequence[IpmiSensor], labels: Sequence[str]) -> list[HostPsuPower]:
    """Each supply's power from the BMC's Watts sensors that name a supply (PS1 Input Power, PSU2 Power Out, Power
    Supply 1), under the `psu` label gpuwatch_host_psu_up has for that supply's number, else as the name says it
    (PS1). Input power is taken over power of no stated direction, and that over output power. Sensors of the whole
    node (Dell's Pwr Consumption, HPE's Power Meter) name no supply and are left out; so are readings below 0."""
    by_number: dict[int, str] = {}
    for label in labels:
        number = psu_number(label)
        if number is not None:
            by_number.setdefault(number, label)
    best: dict[str, tuple[int, HostPsuPower]] = {}
    for sensor in sensors:
        if sensor.unit.lower() != "watts" or sensor.value is None or sensor.value < 0 or sensor.status in ("na", "ns"):
            continue
        match = _PSU_NUMBER.search(sensor.name)
        if match is None:
            continue
        psu = by_number.get(int(match.group(1)), match.group(0).strip())
        rank = 0 if _POWER_IN.search(sensor.name) else 2 if _POWER_OUT.search(sensor.name) else 1
        if psu not in best or rank < best[psu][0]:
            best[psu] = (rank, HostPsuPower(psu, sensor.value, sensor.name))
    return [best[psu][1] for psu in sorted(best)]


def parse_sensor_list(text: str) -> list[IpmiSensor]:
    """Parse `ipmitool sensor`; lines that are not ten pipe-separated fields (warnings, blanks) are skipped."""
    sensors = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 10 or not fields[0]:
            continue
        name, reading, unit, status = fields[:4]
        if unit.lower() == "discrete":
            continue
        thresholds = {
            key: v for key, raw in zip(THRESHOLDS, fields[4:10], strict=True) if (v := _number(raw)) is not None
        }
        sensors.append(IpmiSensor(name, _number(reading), unit, status.lower(), thresholds))
    return sensors


def parse_psu_states(text: str) -> list[PsuState]:
    """Parse `ipmitool sdr type "Power Supply"`: name | id | status | entity | event states."""
    psus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 5 or not fields[0]:
            continue
        psus.append(PsuState(fields[0], fields[3], fields[2].lower(), " | ".join(fields[4:])))
    return psus


def readings_from_sensors(
    sensors: Sequence[IpmiSensor],
) -> tuple[list[HostVoltage], list[HostReadingValue], list[HostReadingValue]]:
    """Voltage rails (Vbat, Vcore, DIMM excluded), temperatures and fans; sensors without a reading are left out."""
    voltages, temperatures, fans = [], [], []
    seen: dict[tuple[str, str], int] = {}
    for sensor in sensors:
        unit = sensor.unit.lower()
        kind = "volts" if unit == "volts" else "temp" if unit == "degrees c" else "fan" if unit == "rpm" else None
        if kind is None:
            continue
        # Dell names both CPUs' sensors "Temp": the second of a name becomes "Temp #2", in the BMC's order.
        count = seen[(kind, sensor.name)] = seen.get((kind, sensor.name), 0) + 1
        name = sensor.name if count == 1 else f"{sensor.name} #{count}"
        if sensor.value is None or sensor.status in ("na", "ns"):
            continue
        if kind == "volts":
            if is_supply_rail(name):
                nominal = nominal_from_name(name)
                voltages.append(HostVoltage(CHIP, name, sensor.value, nominal, _lower_limit(sensor, nominal)))
        elif kind == "temp":
            temperatures.append(HostReadingValue(CHIP, name, sensor.value))
        else:
            fans.append(HostReadingValue(CHIP, name, sensor.value))
    return voltages, temperatures, fans


def _lower_limit(sensor: IpmiSensor, nominal: float | None) -> float | None:
    """The rail's limit to alert on: the BMC's lower non-critical threshold (IPMI's warning level), else its lower
    critical, else non-recoverable one; on a negative rail the upper ones, which lie toward 0 (rails.py); else the
    nominal less its ATX tolerance."""
    t = sensor.thresholds
    lower = [t[k] for k in ("lnc", "lcr", "lnr") if k in t]
    upper = [t[k] for k in ("unc", "ucr", "unr") if k in t]
    return lower_limit(nominal, declared_undervoltage(nominal, lower, upper))


def run_command(argv: Sequence[str], timeout_s: float) -> str:
    """Run ipmitool in its own process group; on timeout kill the group and do not wait for it long."""
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",  # one non-UTF-8 byte in a BMC sensor name disabled IPMI for good (UnicodeDecodeError)
            start_new_session=True,
        )
    except OSError as exc:
        raise IpmiError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=2.0)
        except subprocess.TimeoutExpired:  # stuck in the kernel (D state): leave it, never hang the agent
            log.warning("%s did not exit after SIGKILL", argv[0])
        raise IpmiError(f"{' '.join(argv)} took longer than {timeout_s:g} s and was killed") from None
    if proc.returncode != 0:
        message = (err or out).strip().splitlines()
        raise IpmiError(f"{' '.join(argv)} exited {proc.returncode}: {message[-1] if message else 'no output'}")
    return out


class BmcAccess(Protocol):
    """How the reader reaches a BMC: whether it can now (and if not, why), and one ipmitool command's output."""

    def usable(self) -> tuple[bool, str]: ...

    def run(self, command: Sequence[str], timeout_s: float) -> str: ...  # IpmiError when it fails or times out


@dataclass(frozen=True, slots=True)
class LocalBmc:
    """The local BMC: `ipmitool -I open` on /dev/ipmiN, each command in a process of its own (`runner`)."""

    ipmitool: str = "ipmitool"
    device: Path = Path("/dev/ipmi0")
    runner: Runner = run_command

    def usable(self) -> tuple[bool, str]:
        """Whether ipmitool and the BMC device are there and usable by this user, and if not, why."""
        tool = shutil.which(self.ipmitool)
        if tool is None:
            return False, f"{self.ipmitool} not found (apt-get install ipmitool)"
        if not self.device.exists():
            return False, f"no {self.device} (no BMC, or the ipmi_si/ipmi_devintf modules are not loaded)"
        if not os.access(self.device, os.R_OK | os.W_OK):
            return False, f"{INACCESSIBLE} (permission on {self.device}; {INACCESSIBLE_HINT})"
        try:  # the device cgroup (DevicePolicy=closed without the ipmi.conf drop-in) refuses open(), not access()
            os.close(os.open(self.device, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))
        except PermissionError as exc:
            return False, f"{INACCESSIBLE} (permission on {self.device}: {exc.strerror}; {INACCESSIBLE_HINT})"
        except OSError as exc:
            return False, f"{INACCESSIBLE} ({self.device}: {exc.strerror or exc})"
        return True, f"{tool} via {self.device}"

    def argv(self, *command: str) -> list[str]:
        """ipmitool's command line for `command` on this device (`-d N` for /dev/ipmiN other than 0)."""
        argv = [self.ipmitool, "-I", "open"]
        number = re.search(r"(\d+)$", self.device.name)
        if number and number.group(1) != "0":
            argv += ["-d", number.group(1)]
        return argv + list(command)

    def run(self, command: Sequence[str], timeout_s: float) -> str:
        return self.runner(self.argv(*command), timeout_s)


class IpmiReader:
    """Reads a BMC (the local one unless another `bmc` is given); remembers every supply it has seen, so one that
    disappears is exported as down."""

    source = "ipmi"

    def __init__(
        self,
        bmc: BmcAccess | None = None,
        *,
        timeout_s: float = 20.0,
        state_path: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bmc: BmcAccess = bmc if bmc is not None else LocalBmc()
        self.timeout_s = timeout_s
        self._state_path = state_path
        self._clock = clock
        self._seen: set[str] | None = None

    def usable(self) -> tuple[bool, str]:
        """Whether the BMC can be read now, and if not, why."""
        return self.bmc.usable()

    def read(self) -> HostSample:
        sensors = parse_sensor_list(self.bmc.run(SENSOR_COMMAND, self.timeout_s))
        psus = parse_psu_states(self.bmc.run(PSU_COMMAND, self.timeout_s))
        voltages, temperatures, fans = readings_from_sensors(sensors)
        supplies = self._psus(psus)
        return HostSample(
            "ipmi",
            self._clock(),
            voltages=tuple(voltages),
            psus=tuple(supplies),
            temperatures=tuple(temperatures),
            fans=tuple(fans),
            psu_power=tuple(
                psu_power_from_sensors(sensors, [p.psu for p in supplies] + [s.label for s in psus if not s.redundancy])
            ),
            psu_redundancy_lost=redundancy_lost(psus, supplies),
        )

    def _psus(self, states: Sequence[PsuState]) -> list[HostPsu]:
        seen = self._load_seen()
        out: dict[str, HostPsu] = {}
        for state in states:
            if state.redundancy or state.label in out:
                continue
            if state.present:
                out[state.label] = HostPsu(state.label, not state.failed, state.states)
        newly = set(out) - seen
        for label in sorted(seen - set(out)):
            out[label] = HostPsu(label, False, "absent (was present before)")
        if newly:
            seen |= newly
            self._save_seen(seen)
        return [out[label] for label in sorted(out)]

    def _load_seen(self) -> set[str]:
        if self._seen is None:
            self._seen = set()
            if self._state_path is not None:
                data = read_json(self._state_path, expect_kind=PSU_STATE_KIND)
                psus = data.get("psus") if data else None
                if isinstance(psus, list):
                    self._seen = {p for p in psus if isinstance(p, str)}
        return self._seen

    def _save_seen(self, seen: set[str]) -> None:
        if self._state_path is None:
            return
        try:
            atomic_write_json(
                self._state_path, {"kind": PSU_STATE_KIND, "version": STATE_VERSION, "psus": sorted(seen)}
            )
        except StateDirError as exc:
            log.warning("%s; the supplies seen are remembered only until the agent restarts", exc)
