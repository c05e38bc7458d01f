"""The simulated node's host: a sysfs hwmon tree and a BMC's ipmitool output that the REAL readers read.

Nothing here produces HostSample values directly: the tree is rendered to a temporary directory before each read
(a PMBus PSU pair, coretemp, an NVMe drive) and the BMC answers `ipmitool sensor` / `sdr type "Power Supply"` in a
Supermicro BMC's format, so `--backend simulated` runs gpuwatch/readers/hwmon.py and ipmi.py as a server would.

Healthy: both supplies' 12 V outputs near 12.1 V over their 11.6 V warning limits, each supply's input power on the
BMC, and the BMC's redundancy sensor reading Fully Redundant. `psu_undervoltage`: from the GPUs' fault onset (1 s)
PSU1's 12 V output sags to 11.2 V, under its limit, with its alarms raised, and the BMC's 12 V sensor reads the sag
too — the GPUs power-brake at the same time (physics.py); the node draws more than one supply can carry, so the BMC
reports Redundancy Lost with both supplies still up, PSU2 carrying more than the sagging PSU1.
"""

from __future__ import annotations

import os
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatch.collectors.sources import HostSource
from gpuwatch.core.model import HostSample
from gpuwatch.readers.hwmon import HwmonReader
from gpuwatch.readers.ipmi import IpmiReader

if TYPE_CHECKING:
    from gpuwatch.config.settings import Config
    from gpuwatch.simulated.scenarios import SimulatedNode

SAG_VOLTS = 11.2
LCRIT_VOLTS = 11.4
TWELVE_THRESHOLDS = ("10.173", "10.515", "10.800", "13.200", "13.485", "13.827")
ONSET_S = 1.0  # the GPUs' fault onset (physics.GpuPlan.onset_s)
# Input power of PS1 and PS2 (W): idle, under load, and sagging (PSU1 delivers less, PSU2 takes over the rest).
PSU_WATTS = {"idle": (612.0, 598.0), "busy": (2840.0, 2810.0), "sagging": (2380.0, 3290.0)}

_I2C = "devices/pci0000:00/0000:00:1f.4/i2c-7"
_CHIPS = {
    # hwmon index: (device directory under the root, driver name)
    0: ("devices/platform/coretemp.0", "coretemp"),
    1: ("devices/platform/coretemp.1", "coretemp"),
    2: (f"{_I2C}/7-0058", "pmbus"),
    3: (f"{_I2C}/7-0059", "pmbus"),
    4: ("devices/pci0000:00/0000:00:01.1/0000:01:00.0/nvme/nvme0", "nvme"),
}


class SimulatedHost:
    """Renders the node's sensors at the node's current time."""

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self._dir = tempfile.TemporaryDirectory(prefix="gpuwatch-simhost-")
        weakref.finalize(self, self._dir.cleanup)
        self.root = Path(self._dir.name)
        self._written: dict[Path, str] = {}  # what each file holds: a render rewrites only what changed
        self._build()

    @property
    def sagging(self) -> bool:
        return self.node.scenario == "psu_undervoltage" and self.node.elapsed() >= ONSET_S

    @property
    def busy(self) -> bool:
        return self.node.scenario in ("busy", "psu_undervoltage", "mixed")

    def psu_watts(self) -> tuple[float, float]:
        return PSU_WATTS["sagging" if self.sagging else "busy" if self.busy else "idle"]

    def _build(self) -> None:
        for index, (device, name) in _CHIPS.items():
            hwmon = self.root / device / "hwmon" / f"hwmon{index}"
            hwmon.mkdir(parents=True)
            (hwmon / "device").symlink_to(os.path.relpath(self.root / device, hwmon))
            (hwmon / "name").write_text(name + "\n")
            link = self.root / "class" / "hwmon" / f"hwmon{index}"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(hwmon, link.parent))
        dmi = self.root / "class" / "dmi" / "id"
        dmi.mkdir(parents=True)
        (dmi / "board_name").write_text("X13DEG-OAD\n")

    def _write(self, directory: Path, files: Mapping[str, object]) -> None:
        """Each file whose text changed (opening and writing ~40 files every read was most of a simulated node's
        host-sensor CPU, which a real node does not spend)."""
        for name, value in files.items():
            path, text = directory / name, f"{value}\n"
            if self._written.get(path) != text:
                path.write_text(text)
                self._written[path] = text

    def _hwmon(self, index: int) -> Path:
        return self.root / _CHIPS[index][0] / "hwmon" / f"hwmon{index}"

    def render(self) -> None:
        """Write every reading as the kernel drivers would (millivolts, millidegrees, RPM)."""
        busy = self.busy
        for socket, index in ((0, 0), (1, 1)):
            package = 58 if busy else 41 + socket
            files = {"temp1_label": "Package id 0" if socket == 0 else "Package id 1", "temp1_input": package * 1000}
            for core in range(2):
                files[f"temp{core + 2}_label"] = f"Core {core}"
                files[f"temp{core + 2}_input"] = (package - 2 + core) * 1000
            files["temp1_crit"] = 100000
            self._write(self._hwmon(index), files)
        for psu, index in ((1, 2), (2, 3)):
            sag = psu == 1 and self.sagging
            vout = SAG_VOLTS if sag else 12.10 - 0.02 * (psu - 1)
            files = {
                "in1_label": "vin",
                "in1_input": 230000 + 1000 * psu,
                "in1_lcrit": 180000,
                "in1_min": 190000,
                "in2_label": "vout1",
                "in2_input": round(vout * 1000),
                "in2_lcrit": round(LCRIT_VOLTS * 1000),
                "in2_min": 11600,
                "in2_lcrit_alarm": int(sag),
                "in2_min_alarm": int(sag),
                "temp1_input": (45 if busy else 31) * 1000 + psu * 500,
                "temp2_input": (52 if busy else 36) * 1000 + psu * 500,
                "fan1_input": 11800 if busy else 6400,
            }
            self._write(self._hwmon(index), files)
        self._write(self._hwmon(4), {"temp1_label": "Composite", "temp1_input": 38850, "temp1_crit": 84850})

    def sensor_output(self) -> str:
        """`ipmitool sensor` of a Supermicro BMC: name | reading | unit | status | lnr | lcr | lnc | unc | ucr | unr."""
        twelve = SAG_VOLTS if self.sagging else 12.096
        fan = 11200 if self.node.scenario in ("busy", "psu_undervoltage") else 5600
        rows = [
            ("CPU1 Temp", "52.000", "degrees C", "ok", "0.000", "0.000", "0.000", "90.000", "100.000", "100.000"),
            ("System Temp", "29.000", "degrees C", "ok", "-9.000", "-7.000", "-5.000", "80.000", "85.000", "90.000"),
            ("Inlet Temp", "24.000", "degrees C", "ok", "-9.000", "-7.000", "-5.000", "40.000", "45.000", "50.000"),
            ("FAN1", f"{fan:.3f}", "RPM", "ok", "420.000", "560.000", "700.000", "25480.000", "25620.000", "25760.000"),
            ("FAN2", "na", "RPM", "na", "na", "na", "na", "na", "na", "na"),
            ("12V", f"{twelve:.3f}", "Volts", "cr" if self.sagging else "ok", *TWELVE_THRESHOLDS),
            ("5VCC", "5.026", "Volts", "ok", "4.246", "4.390", "4.500", "5.500", "5.610", "5.754"),
            ("3.3VCC", "3.333", "Volts", "ok", "2.789", "2.882", "2.970", "3.630", "3.718", "3.811"),
            ("VBAT", "3.094", "Volts", "ok", "2.422", "2.500", "2.578", "na", "na", "na"),
            ("Vcpu1", "1.791", "Volts", "ok", "1.242", "1.260", "1.404", "2.106", "2.160", "2.178"),
            ("P1_VDDQ_ABCD", "1.125", "Volts", "ok", "0.959", "0.977", "1.013", "1.409", "1.445", "1.463"),
            ("PS1 Status", "0x1", "discrete", "0x0100", "na", "na", "na", "na", "na", "na"),
            *(
                (f"PS{n} Input Power", f"{watts:.3f}", "Watts", "ok", "na", "na", "na", "na", "na", "na")
                for n, watts in enumerate(self.psu_watts(), start=1)
            ),
        ]
        return "".join(
            " | ".join(f"{cell:<16}" if n == 0 else f"{cell:<10}" for n, cell in enumerate(r)) + "\n" for r in rows
        )

    def psu_output(self) -> str:
        """`ipmitool sdr type "Power Supply"` of the same BMC; both supplies present and OK, and the redundancy
        sensor: Redundancy Lost while PSU1 sags under the load, else Fully Redundant."""
        redundancy = "Redundancy Lost" if self.sagging else "Fully Redundant"
        return (
            "PS1 Status       | C8h | ok  | 10.1 | Presence detected\n"
            "PS2 Status       | C9h | ok  | 10.2 | Presence detected\n"
            f"PS Redundancy    | CAh | ok  | 19.1 | {redundancy}\n"
        )


class SimulatedHwmonReader(HwmonReader):
    """The real hwmon reader over the simulated node's tree, rendered at each read."""

    def __init__(self, host: SimulatedHost, *, clock: Callable[[], float]) -> None:
        super().__init__(host.root, clock=clock)
        self._host = host

    def read(self) -> HostSample:
        self._host.render()
        return super().read()


class SimulatedBmc:
    """The node's BMC, as the IPMI reader reaches it: always there, answering the two commands the reader sends
    with what ipmitool would print for this node now."""

    def __init__(self, host: SimulatedHost) -> None:
        self._host = host

    def usable(self) -> tuple[bool, str]:
        return True, "simulated BMC"

    def run(self, command: Sequence[str], _timeout_s: float) -> str:
        if list(command) == ["sensor"]:
            return self._host.sensor_output()
        if list(command) == ["sdr", "type", "Power Supply"]:
            return self._host.psu_output()
        raise AssertionError(f"the simulated BMC does not answer ipmitool {' '.join(command)}")


def simulated_host_sources(
    node: SimulatedNode, config: Config, *, clock: Callable[[], float] = time.time
) -> list[HostSource]:
    """The hwmon and ipmi collectors of the simulated node, on the intervals of the [host] section."""
    host = SimulatedHost(node)
    disabled = config.agent.disable_collectors
    sources: list[HostSource] = []
    if "hwmon" not in disabled:
        reader = SimulatedHwmonReader(host, clock=clock)
        found = (True, "simulated: pmbus-i2c-7-58, pmbus-i2c-7-59, coretemp, nvme")
        sources.append(HostSource("hwmon", reader, config.host.hwmon_interval_seconds, lambda: found))
    if "ipmi" not in disabled and config.host.ipmi != "off":
        ipmi = IpmiReader(SimulatedBmc(host), clock=clock)
        sources.append(HostSource("ipmi", ipmi, config.host.ipmi_interval_seconds, ipmi.usable))
    return sources
