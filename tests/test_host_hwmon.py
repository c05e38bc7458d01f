"""The hwmon reader over fixture sysfs trees shaped like real machines: values and units, chip labels, thresholds,
the rails that never count, Super-I/O mappings, GPU chips left out, and files that cannot be read."""

from __future__ import annotations

import errno
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hostfixtures import ASUS_BOARD, add_chip, exported, server_tree, set_board, workstation_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.core.model import HostSample
from gpuwatch.files.sensormap import load_sensor_maps
from gpuwatch.readers import sysfs as sysfs_module
from gpuwatch.readers.hwmon import HwmonReader

REPO = Path(__file__).resolve().parent.parent
ASUS_MAP = REPO / "deploy" / "sensor-maps" / "asus-pro-ws-nct6798.toml"


def volts(sample: HostSample) -> dict[tuple[str, str], tuple[float, float | None, float | None]]:
    return {(v.chip, v.sensor): (v.volts, v.nominal_volts, v.min_volts) for v in sample.voltages}


def temps(sample: HostSample) -> dict[tuple[str, str], float]:
    return {(t.chip, t.sensor): t.value for t in sample.temperatures}


def fans(sample: HostSample) -> dict[tuple[str, str], float]:
    return {(f.chip, f.sensor): f.value for f in sample.fans}


def test_server_pmbus_supplies_in_volts_with_their_own_limits(tmp_path: Path) -> None:
    sample = HwmonReader(server_tree(tmp_path), clock=lambda: 100.0).read()
    assert sample.source == "hwmon" and sample.timestamp == 100.0
    rails = volts(sample)
    # millivolts -> volts; the limit is in*_min (PMBus VOUT_UV_WARN_LIMIT), with or without an in*_lcrit beside it;
    # the nominal of a PMBus "vout1" is the standard rail its reading is near
    assert rails[("pmbus-i2c-7-58", "vout1")] == (12.112, 12.0, 11.6)
    assert rails[("pmbus-i2c-7-59", "vout1")] == (11.2, 12.0, 11.6)
    assert rails[("pmbus-i2c-7-58", "vin")] == (229.5, None, 190.0)  # VIN_UV_WARN_LIMIT, not VIN_UV_FAULT_LIMIT
    alarms = {(v.chip, v.sensor): (v.alarm, v.alarms) for v in sample.voltages}
    assert alarms[("pmbus-i2c-7-58", "vout1")] == (False, (("min", False), ("lcrit", False)))
    assert alarms[("pmbus-i2c-7-59", "vout1")] == (True, (("min", True),))
    assert alarms[("pmbus-i2c-7-58", "vin")] == (None, ())
    assert set(rails) == {(f"pmbus-i2c-7-{a}", s) for a in ("58", "59") for s in ("vin", "vout1")}


def test_pmbus_warning_limit_is_alerted_on_not_the_fault_limit(tmp_path: Path) -> None:
    """drivers/hwmon/pmbus/pmbus_core.c (vout_limit_attrs) maps VOUT_UV_WARN_LIMIT to inX_min and VOUT_UV_FAULT_LIMIT
    to inX_lcrit; Documentation/hwmon/pmbus.rst says the same ("inX_min: Minimum Voltage. From VIN_UV_WARN_LIMIT or
    VOUT_UV_WARN_LIMIT register", "inX_lcrit: Critical minimum Voltage. From VIN_UV_FAULT_LIMIT or
    VOUT_UV_FAULT_LIMIT register"), and Documentation/ABI/testing/sysfs-class-hwmon (the sysfs-interface) says of
    inY_lcrit: "If voltage drops to or below this limit, the system may take drastic action such as power down or
    reset". At the fault limit the supply acts on its own (VOUT_UV_FAULT_RESPONSE: shut down or retry); the warning
    limit is the one that leaves time to act, so it is the one exported as the rail's min. The reader used to prefer
    lcrit and reported 11.4 V for a rail that was already under its 11.6 V warning limit."""
    files = {"in1_label": "vout1", "in1_input": 11500, "in1_min": 11600, "in1_lcrit": 11000}
    add_chip(tmp_path, 0, "devices/pci0000:00/0000:00:1f.4/i2c-7/7-0058", "pmbus", files)
    [rail] = HwmonReader(tmp_path).read().voltages
    assert rail.min_volts == 11.6
    # no warning limit (the chip lacks VOUT_UV_WARN_LIMIT, or it reads 0 = unset): the fault limit stands in
    (tmp_path / "class/hwmon/hwmon0/in1_min").write_text("0\n")
    assert HwmonReader(tmp_path).read().voltages[0].min_volts == 11.0
    (tmp_path / "class/hwmon/hwmon0/in1_min").unlink()
    assert HwmonReader(tmp_path).read().voltages[0].min_volts == 11.0


def test_every_alarm_flag_of_a_rail_is_exported_by_its_limit(tmp_path: Path) -> None:
    """Documentation/hwmon/sysfs-interface.rst names a voltage's alarm flags by limit: in[0-*]_min_alarm,
    in[0-*]_max_alarm, in[0-*]_lcrit_alarm, in[0-*]_crit_alarm ("0: no alarm, 1: alarm"), or one in[0-*]_alarm on
    chips that do not tell which limit was crossed; pmbus_core.c raises min_alarm on VOLTAGE_UV_WARNING, lcrit_alarm
    on VOLTAGE_UV_FAULT, max_alarm on VOLTAGE_OV_WARNING and crit_alarm on VOLTAGE_OV_FAULT. The reader used to fold
    them into one flag that nothing exported. Each flag the chip has is now gpuwatch_host_voltage_alarm{limit}, 1 or
    0; a flag that cannot be read or reads neither 0 nor 1 is left out, never the scrape."""
    files: dict[str, object] = {
        "in1_label": "vout1",
        "in1_input": 11500,
        "in1_min": 11600,
        "in1_min_alarm": 1,
        "in1_lcrit_alarm": 0,
        "in1_max_alarm": 0,
        "in1_crit_alarm": "garbage",
        "in2_label": "P12V",
        "in2_input": 12000,
        "in2_alarm": 0,
        "in3_label": "P5V",
        "in3_input": 5000,
        "in3_min_alarm": 7,
    }
    add_chip(tmp_path, 0, "devices/pci0000:00/0000:00:1f.4/i2c-7/7-0058", "pmbus", files)
    sample = HwmonReader(tmp_path).read()
    chip = "pmbus-i2c-7-58"
    alarms = {k: v for k, v in exported([sample]).items() if k[0] == "gpuwatch_host_voltage_alarm"}
    assert alarms == {
        ("gpuwatch_host_voltage_alarm", chip, "vout1", "min"): 1.0,
        ("gpuwatch_host_voltage_alarm", chip, "vout1", "lcrit"): 0.0,
        ("gpuwatch_host_voltage_alarm", chip, "vout1", "max"): 0.0,
        ("gpuwatch_host_voltage_alarm", chip, "P12V", "any"): 0.0,
    }
    assert {v.sensor: v.alarm for v in sample.voltages} == {"vout1": True, "P12V": False, "P5V": None}


def test_super_io_alarm_flags_are_not_read(tmp_path: Path) -> None:
    """A Super-I/O chip compares its pins against limits the BIOS left (nct6775: often 0), not the ones a mapping
    states, so its alarm flags say nothing about the rail: they are not exported, like its limits."""
    root = workstation_tree(tmp_path)
    (root / "class/hwmon/hwmon0/in4_alarm").write_text("1\n")
    sample = HwmonReader(root, load_sensor_maps([str(ASUS_MAP)])).read()
    assert {v.sensor: (v.alarm, v.alarms) for v in sample.voltages}["+12V"] == (None, ())
    assert not any(k[0] == "gpuwatch_host_voltage_alarm" for k in exported([sample]))


def test_a_pmbus_output_without_limits_is_held_to_its_inferred_nominal_and_keeps_it(tmp_path: Path) -> None:
    """A PMBus supply that declares no VOUT_UV limit (pmbus_core.c creates inX_min/inX_lcrit only for the registers
    the chip has) had neither a nominal ("vout1" names none) nor a min, so nothing could alert on it. Its nominal is
    now the standard rail nearest its first reading, kept while the agent runs (a rail sagging past -20 % keeps its
    12 V), and its min that nominal less ATX's 5 % (ATX12V design guide, Table 2)."""
    hwmon = add_chip(
        tmp_path, 0, "devices/pci0000:00/0000:00:1f.4/i2c-7/7-0058", "pmbus", {"in1_label": "vout1", "in1_input": 12100}
    )
    reader = HwmonReader(tmp_path)
    assert volts(reader.read()) == {("pmbus-i2c-7-58", "vout1"): (12.1, 12.0, 11.4)}
    (hwmon / "in1_input").write_text("9000\n")
    assert volts(reader.read()) == {("pmbus-i2c-7-58", "vout1"): (9.0, 12.0, 11.4)}
    # an agent started while the rail already reads 9 V cannot tell what it should be
    assert volts(HwmonReader(tmp_path).read()) == {("pmbus-i2c-7-58", "vout1"): (9.0, None, None)}


def test_a_negative_rail_on_a_labelled_chip_takes_the_limit_toward_zero(tmp_path: Path) -> None:
    """hwmon limits are signed millivolts (Documentation/hwmon/sysfs-interface.rst): on a -12 V input inX_min is the
    most negative allowed reading (-13.2 V, too much magnitude) and inX_max the least (-10.8 V), which is where a
    sagging -12 V rail goes. That one is the rail's min; with neither, ATX's -10.8 V."""
    files: dict[str, object] = {
        "in0_label": "-12V",
        "in0_input": -11300,
        "in0_min": -13200,
        "in0_max": -10800,
        "in1_label": "-12V AUX",
        "in1_input": -11300,
        "in1_min": -13200,
    }
    add_chip(tmp_path, 0, "devices/platform/i2c_designware.1/i2c-3/3-0040", "ina3221", files)
    rails = volts(HwmonReader(tmp_path).read())
    assert rails == {
        ("ina3221-i2c-3-40", "-12V"): (-11.3, -12.0, -10.8),
        ("ina3221-i2c-3-40", "-12V AUX"): (-11.3, -12.0, -10.8),
    }


def test_pmbus_supplies_report_their_input_power_and_regulators_are_no_supplies(tmp_path: Path) -> None:
    """Documentation/hwmon/pmbus.rst: "powerX_input: Measured power. From READ_PIN or READ_POUT register",
    "powerX_label: "pin" or "poutY""; Documentation/hwmon/sysfs-interface.rst: power in microwatts. A supply's input
    power (pin) is exported as gpuwatch_host_psu_power_watts{psu=<chip label>}, its output (pout1) where it reports
    nothing else. PMBus CPU/GPU regulators carry pin/pout too: a chip counts as a supply only with its own fan or an
    AC input (vin at 90 V or more), which regulators and 54->12 V bus converters lack."""
    root = server_tree(tmp_path)
    i2c = "devices/pci0000:00/0000:00:1f.4/i2c-8"
    regulator = {"in1_label": "vin", "in1_input": 12000, "in2_label": "vout1", "in2_input": 1800}
    regulator |= {"power1_label": "pin", "power1_input": 310000000, "power2_label": "pout1", "power2_input": 290000000}
    add_chip(root, 6, f"{i2c}/8-0060", "xdpe12284", regulator)
    converter = {"in1_label": "vin", "in1_input": 54100, "power1_label": "pin", "power1_input": 980000000}
    add_chip(root, 7, f"{i2c}/8-0061", "q54sj108a2", converter)
    output_only = {"in1_label": "vin", "in1_input": 230000, "power1_label": "pout1", "power1_input": 1200000000}
    add_chip(root, 8, f"{i2c}/8-0058", "pmbus", output_only)
    broken = {"fan1_input": 5000, "power1_label": "pin", "power1_input": "garbage", "power2_label": "pout1"}
    add_chip(root, 9, f"{i2c}/8-0059", "pmbus", broken | {"power2_input": -5})
    sample = HwmonReader(root).read()
    assert [(p.psu, p.watts, p.sensor) for p in sample.psu_power] == [
        ("pmbus-i2c-7-58", 412.5, "pin"),
        ("pmbus-i2c-7-59", 412.5, "pin"),
        ("pmbus-i2c-8-58", 1200.0, "pout1"),
    ]
    power = {k[1]: v for k, v in exported([sample]).items() if k[0] == "gpuwatch_host_psu_power_watts"}
    assert power == {"pmbus-i2c-7-58": 412.5, "pmbus-i2c-7-59": 412.5, "pmbus-i2c-8-58": 1200.0}
    assert HwmonReader(workstation_tree(tmp_path / "ws")).read().psu_power == ()


def test_server_temperatures_and_fans_with_node_unique_chip_labels(tmp_path: Path) -> None:
    sample = HwmonReader(server_tree(tmp_path)).read()
    t = temps(sample)
    assert t[("coretemp-isa-0000", "Package id 0")] == 44.0
    assert t[("coretemp-isa-0001", "Package id 1")] == 46.0
    # the two sockets' "Core 0" stay apart through their chip label
    assert t[("coretemp-isa-0000", "Core 0")] == 41.0 and t[("coretemp-isa-0001", "Core 0")] == 43.0
    assert t[("nvme-pci-0100", "Composite")] == 38.85
    assert t[("pmbus-i2c-7-58", "temp1")] == 31.5
    assert t[("acpitz-virtual-0", "temp1")] == 27.8
    assert fans(sample) == {("pmbus-i2c-7-58", "fan1"): 6336.0, ("pmbus-i2c-7-59", "fan1"): 6336.0}


def test_unmapped_super_io_exports_no_voltage_but_its_temperatures_and_fans(tmp_path: Path) -> None:
    sample = HwmonReader(workstation_tree(tmp_path)).read()
    assert sample.voltages == ()
    t = temps(sample)
    assert t[("nct6798-isa-0290", "SYSTIN")] == 33.0
    assert t[("k10temp-pci-00c3", "Tctl")] == 52.875
    assert t[("nvme-pci-0200", "Composite")] == 35.85
    assert fans(sample)[("nct6798-isa-0290", "fan1")] == 1205.0


def test_gpu_chips_are_left_out_by_driver_name_and_by_pci_display_class(tmp_path: Path) -> None:
    sample = HwmonReader(workstation_tree(tmp_path)).read()
    chips = {t.chip for t in sample.temperatures} | {f.chip for f in sample.fans} | {v.chip for v in sample.voltages}
    assert chips == {"nct6798-isa-0290", "k10temp-pci-00c3", "nvme-pci-0200"}


def test_mapped_super_io_rails_are_scaled_labelled_and_excluded_as_the_mapping_and_rules_say(tmp_path: Path) -> None:
    reader = HwmonReader(workstation_tree(tmp_path), load_sensor_maps([str(ASUS_MAP)]))
    sample = reader.read()
    rails = volts(sample)
    chip = "nct6798-isa-0290"
    assert rails[(chip, "+12V")] == (12.096, 12.0, 11.4)  # the mapping's min
    # no min in the mapping (and none read from a Super-I/O chip): the nominal less ATX's 5 %
    assert rails[(chip, "+5V")] == (5.08, 5.0, 4.75)
    assert rails[(chip, "AVCC")] == (3.344, 3.3, 3.135)
    assert rails[(chip, "+3.3V")] == (3.328, 3.3, 3.135)
    assert rails[(chip, "3VSB")] == (3.392, 3.3, 3.135)
    # Vcore and Vbat are mapped (labelled) but never PSU rails; in5/in6 are not mapped at all
    assert set(rails) == {(chip, s) for s in ("+12V", "+5V", "AVCC", "+3.3V", "3VSB")}
    # the mapping's `ignore` drops the unconnected AUXTIN3 (-62 °C)
    assert (chip, "AUXTIN3") not in temps(sample) and (chip, "CPUTIN") in temps(sample)


def test_a_mapping_for_another_board_does_not_apply(tmp_path: Path) -> None:
    root = workstation_tree(tmp_path)
    set_board(root, "ROG STRIX X670E-E GAMING WIFI")
    assert HwmonReader(root, load_sensor_maps([str(ASUS_MAP)])).read().voltages == ()
    set_board(root, ASUS_BOARD)
    assert HwmonReader(root, load_sensor_maps([str(ASUS_MAP)])).read().voltages != ()


def test_vbat_vcore_and_dimm_rails_never_count_even_on_labelled_chips(tmp_path: Path) -> None:
    files = {
        "in0_label": "VBAT",
        "in0_input": 3050,
        "in1_label": "CPU VCORE",
        "in1_input": 1100,
        "in2_label": "VDDQ_ABCD",
        "in2_input": 1200,
        "in3_label": "DIMM VPP",
        "in3_input": 2500,
        "in4_label": "P12V",
        "in4_input": 12050,
        "in4_lcrit": 10800,
        "in5_label": "P3V3",
        "in5_input": 3310,
    }
    add_chip(tmp_path, 0, "devices/platform/i2c_designware.1/i2c-3/3-0040", "ina3221", files)
    rails = volts(HwmonReader(tmp_path).read())
    assert rails == {
        ("ina3221-i2c-3-40", "P12V"): (12.05, 12.0, 10.8),
        ("ina3221-i2c-3-40", "P3V3"): (3.31, 3.3, 3.135),
    }


class _FailingOs:
    """`os` as the sysfs reader (gpuwatch/readers/sysfs.py) sees it, the kernel failing the `broken` files as sysfs
    does: a root-only file at open (EACCES), a driver whose show() fails at read (EIO, ENODATA:
    Documentation/filesystems/sysfs.rst)."""

    def __init__(self, broken: set[str], code: int) -> None:
        self.broken, self.code, self.failing = broken, code, set[int]()

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: Any, flags: int, *args: Any) -> int:
        hit = any(str(path).endswith(b) for b in self.broken)
        if hit and self.code == errno.EACCES:
            raise PermissionError(self.code, "injected", str(path))
        fd = os.open(path, flags, *args)
        if hit:
            self.failing.add(fd)
        return fd

    def read(self, fd: int, size: int) -> bytes:
        if fd in self.failing:
            raise OSError(self.code, "injected")
        return os.read(fd, size)

    def close(self, fd: int) -> None:
        self.failing.discard(fd)
        os.close(fd)


@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO, errno.ENODATA], ids=["permission-denied", "eio", "enodata"])
def test_an_unreadable_file_skips_that_sensor_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    root = server_tree(tmp_path)
    baseline = HwmonReader(root).read()
    broken = {"hwmon3/in2_input", "hwmon1/temp2_input", "hwmon4/fan1_input", "hwmon4/in2_min"}
    monkeypatch.setattr(sysfs_module, "os", _FailingOs(broken, code))  # where hwmon's attribute reads happen
    sample = HwmonReader(root).read()
    assert set(volts(baseline)) - set(volts(sample)) == {("pmbus-i2c-7-58", "vout1")}
    assert set(temps(baseline)) - set(temps(sample)) == {("coretemp-isa-0000", "Core 0")}
    assert set(fans(baseline)) - set(fans(sample)) == {("pmbus-i2c-7-59", "fan1")}
    # a threshold that cannot be read leaves the reading with the nominal's tolerance as its limit, not without one
    assert volts(sample)[("pmbus-i2c-7-59", "vout1")] == (11.2, 12.0, 11.4)


def test_real_filesystem_oddities_skip_only_what_they_hit(tmp_path: Path) -> None:
    root = server_tree(tmp_path)
    chip = root / "devices/pci0000:00/0000:00:1f.4/i2c-7/7-0058/hwmon/hwmon3"
    (chip / "temp1_input").unlink()
    (chip / "temp1_input").mkdir()  # EISDIR
    (chip / "temp2_input").write_text("garbage\n")
    nvme = root / "devices/pci0000:00/0000:00:01.1/0000:01:00.0/nvme/nvme0/hwmon/hwmon5"
    (nvme / "name").unlink()  # a chip without a name is skipped as a whole
    (root / "class/hwmon/hwmon9").symlink_to("../../devices/gone/hwmon9")  # dangling link
    t = temps(HwmonReader(root).read())
    assert ("pmbus-i2c-7-58", "temp1") not in t and ("pmbus-i2c-7-58", "temp2") not in t
    assert not any(chip.startswith("nvme") for chip, _ in t)
    assert t[("pmbus-i2c-7-59", "temp1")] == 31.5


def test_a_number_past_a_floats_range_is_no_reading(tmp_path: Path) -> None:
    """Found by the property below: a 309-digit integer in a sysfs file raised OverflowError out of read()
    (float(int(text))), taking every hwmon reading of the node with it."""
    root = server_tree(tmp_path)
    chip = root / "devices/pci0000:00/0000:00:1f.4/i2c-7/7-0058/hwmon/hwmon3"
    (chip / "temp1_input").write_text("7" * 309 + "\n")
    t = temps(HwmonReader(root).read())
    assert ("pmbus-i2c-7-58", "temp1") not in t and t[("pmbus-i2c-7-58", "temp2")] == 36.25


def test_a_machine_without_hwmon_reads_empty(tmp_path: Path) -> None:
    reader = HwmonReader(tmp_path)
    assert reader.chips() == []
    sample = reader.read()
    assert (sample.voltages, sample.temperatures, sample.fans) == ((), (), ())


# --- properties: units and scaling, and files holding anything --------------------------------------------------
# Documentation/hwmon/sysfs-interface.rst: inX_input in millivolts, tempX_input in millidegrees Celsius, fanX_input in
# RPM, powerX_input in microwatts, each a decimal integer; gpuwatch exports volts, degrees, RPM and watts.

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a shared CI host
MILLI = st.integers(-(10**9), 10**9)


def read_chip(files: dict[str, object]) -> HostSample:
    """One PMBus supply (a labelled chip with its own fan) on i2c-7 at 0x58, read through a fresh sysfs tree."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        add_chip(root, 0, "devices/pci0000:00/0000:00:1f.4/i2c-7/7-0058", "pmbus", files)
        return HwmonReader(root).read()


@PROPERTY
@given(MILLI, MILLI, st.integers(0, 10**6), st.integers(0, 10**13))
def test_property_each_reading_is_scaled_to_its_si_unit(mv: int, mdeg: int, rpm: int, uw: int) -> None:
    sample = read_chip(
        {
            **{"in1_label": "12V", "in1_input": mv, "temp1_input": mdeg, "fan1_input": rpm},
            **{"power1_label": "pin", "power1_input": uw},
        }
    )
    assert [(v.sensor, v.volts) for v in sample.voltages] == [("12V", mv / 1000)]
    assert [(t.sensor, t.value) for t in sample.temperatures] == [("temp1", mdeg / 1000)]
    assert [(f.sensor, f.value) for f in sample.fans] == [("fan1", rpm)]
    assert [(p.psu, p.watts) for p in sample.psu_power] == [("pmbus-i2c-7-58", round(uw / 1e6, 6))]


# What a broken driver, a half-written file or a hostile bind mount could hold instead of a number.
ANY_CONTENT = st.one_of(
    st.text(max_size=40),
    st.text("0123456789", min_size=300, max_size=5000),  # past a float's range, past int()'s 4,300 digits
    st.sampled_from(["nan", "inf", "-inf", "1e999", "0x10", " 12 ", "12\n13", "", "-"]),
)


@PROPERTY
@given(ANY_CONTENT, ANY_CONTENT, ANY_CONTENT)
def test_property_a_file_holding_anything_skips_that_reading_only(
    volts_text: str, temp_text: str, min_text: str
) -> None:
    """No reading is ever NaN, ±Inf or a traceback: a file that is no finite number is no reading, and the chip's
    other readings stay."""
    sample = read_chip(
        {
            **{"in1_label": "12V", "in1_input": volts_text, "in1_min": min_text, "temp1_input": temp_text},
            **{"in2_label": "5V", "in2_input": 5012, "temp2_input": 40500, "fan1_input": 3000},
        }
    )
    for v in sample.voltages:
        assert math.isfinite(v.volts) and (v.min_volts is None or math.isfinite(v.min_volts))
    assert all(math.isfinite(t.value) for t in sample.temperatures)
    assert ("5V", 5.012) in [(v.sensor, v.volts) for v in sample.voltages]
    assert ("temp2", 40.5) in [(t.sensor, t.value) for t in sample.temperatures]
    assert [(f.sensor, f.value) for f in sample.fans] == [("fan1", 3000)]
