"""The hwmon reader over fixture sysfs trees shaped like real machines: values and units, chip labels, thresholds,
the rails that never count, Super-I/O mappings, GPU chips left out, and files that cannot be read."""

from __future__ import annotations

import builtins
import errno
from pathlib import Path
from typing import Any

import pytest
from hostfixtures import ASUS_BOARD, add_chip, server_tree, set_board, workstation_tree

from gpuwatch.host import hwmon as hwmon_module
from gpuwatch.host.hwmon import HwmonReader
from gpuwatch.host.sensormap import SensorMapError, load_sensor_maps
from gpuwatch.model import HostSample

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
    # millivolts -> volts; lower critical from in*_lcrit (PMBus VOUT_UV_FAULT_LIMIT)
    assert rails[("pmbus-i2c-7-58", "vout1")] == (12.112, None, 11.4)
    # no in2_lcrit on the second supply: its low warning limit (in2_min) stands in
    assert rails[("pmbus-i2c-7-59", "vout1")] == (11.2, None, 11.6)
    assert rails[("pmbus-i2c-7-58", "vin")] == (229.5, None, 180.0)
    alarms = {(v.chip, v.sensor): v.alarm for v in sample.voltages}
    assert alarms[("pmbus-i2c-7-58", "vout1")] is False
    assert alarms[("pmbus-i2c-7-59", "vout1")] is True
    assert set(rails) == {(f"pmbus-i2c-7-{a}", s) for a in ("58", "59") for s in ("vin", "vout1")}


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
    assert rails[(chip, "+12V")] == (12.096, 12.0, 11.4)
    assert rails[(chip, "+5V")] == (5.08, 5.0, None)
    assert rails[(chip, "AVCC")] == (3.344, 3.3, None)
    assert rails[(chip, "+3.3V")] == (3.328, 3.3, None)
    assert rails[(chip, "3VSB")] == (3.392, 3.3, None)
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
    assert rails == {("ina3221-i2c-3-40", "P12V"): (12.05, 12.0, 10.8), ("ina3221-i2c-3-40", "P3V3"): (3.31, 3.3, None)}


@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO, errno.ENODATA], ids=["permission-denied", "eio", "enodata"])
def test_an_unreadable_file_skips_that_sensor_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    root = server_tree(tmp_path)
    baseline = HwmonReader(root).read()
    broken = {"hwmon3/in2_input", "hwmon1/temp2_input", "hwmon4/fan1_input", "hwmon4/in2_min"}
    real_open = builtins.open

    def failing_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if any(str(path).endswith(b) for b in broken):
            raise (PermissionError if code == errno.EACCES else OSError)(code, "injected", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(hwmon_module, "open", failing_open, raising=False)
    sample = HwmonReader(root).read()
    assert set(volts(baseline)) - set(volts(sample)) == {("pmbus-i2c-7-58", "vout1")}
    assert set(temps(baseline)) - set(temps(sample)) == {("coretemp-isa-0000", "Core 0")}
    assert set(fans(baseline)) - set(fans(sample)) == {("pmbus-i2c-7-59", "fan1")}
    # a threshold that cannot be read leaves the reading without a limit, not without a reading
    assert volts(sample)[("pmbus-i2c-7-59", "vout1")] == (11.2, None, None)


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


def test_a_machine_without_hwmon_reads_empty(tmp_path: Path) -> None:
    reader = HwmonReader(tmp_path)
    assert reader.chips() == []
    sample = reader.read()
    assert (sample.voltages, sample.temperatures, sample.fans) == ((), (), ())


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[[chip]]\n[chip.in1]\nlabel = "x"\n', "chip[0].match: required"),
        ('[[chip]]\nmatch = "nct*"\n[chip.in1]\ncompute = "__import__(1)"\n', "chip[0].in1.compute"),
        ('[[chip]]\nmatch = "nct*"\n[chip.in1]\nscale = 2\n', "chip[0].in1.scale: unknown key"),
        ('[[chip]]\nmatch = "nct*"\n[chip.volt1]\nlabel = "x"\n', "chip[0].volt1: unknown key"),
        ('[[chip]]\nmatch = "nct*"\n[chip.in1]\nnominal = -12\n', "chip[0].in1.nominal: must be a positive"),
        ("[[chip]\n", "not valid TOML"),
    ],
)
def test_a_bad_mapping_file_names_the_key_and_the_problem(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "board.toml"
    path.write_text(text)
    with pytest.raises(SensorMapError, match=problem.replace("[", r"\[").replace("]", r"\]")) as info:
        load_sensor_maps([str(path)])
    assert str(path) in str(info.value)


def test_every_shipped_mapping_loads() -> None:
    maps = load_sensor_maps(sorted(str(p) for p in (REPO / "deploy" / "sensor-maps").glob("*.toml")))
    assert len(maps) >= 2
