"""Which voltage sensors are PSU rails, on the names OpenBMC and Supermicro X13 BMCs and hwmon chips use."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.host.ipmi import parse_sensor_list, readings_from_sensors
from gpuwatch.host.rails import is_supply_rail

FIXTURES = Path(__file__).parent / "fixtures" / "ipmi"

NOT_RAILS = (
    # memory rails spelled with "_" around MEM/DDR (\b treated "_" as a word character and let these through)
    "P1V2_MEM_ABC",
    "P1V2_MEM_DEF",
    "VDD_1V2_DDR",
    "MEM_VDD",
    "DDR_VPP",
    "P1V1_DDR5_CPU1",
    # CPU package rails (set by the CPU, not the PSU)
    "PVCCFA_EHV_CPU0",
    "PVCCIN_CPU0",
    "PVCCIO_CPU1",
    "PVNN_MAIN_CPU0",
    "PVNN PCH",
    "VSA",
    "PVSA_CPU1",
    "PVCCANA_CPU0",
    # the RTC battery
    "P3V_BAT",
    "VBAT",
    "BAT_3V",
    "Vcpu1",
    "VDimmP1ABC",
)
RAILS = ("P12V", "12V", "P5V_STBY", "P3V3", "3.3VCC", "5VSB", "P12V_AUX", "PSU0 VIN", "1.8V PCH")


@pytest.mark.parametrize("name", NOT_RAILS)
def test_cpu_memory_and_battery_rails_are_not_supply_rails(name: str) -> None:
    assert not is_supply_rail(name)


@pytest.mark.parametrize("name", RAILS)
def test_supply_rails_stay_supply_rails(name: str) -> None:
    assert is_supply_rail(name)


def test_openbmc_style_sensor_list_keeps_only_psu_rails() -> None:
    text = (FIXTURES / "openbmc_x13" / "sensor.txt").read_text()
    voltages, _, _ = readings_from_sensors(parse_sensor_list(text))
    assert {v.sensor: v.nominal_volts for v in voltages} == {
        "P12V": 12.0,
        "P5V": 5.0,
        "P3V3": 3.3,
        "P5V_STBY": 5.0,
        "P3V3_STBY": 3.3,
        "P1V8_PCH_STBY": 1.8,
    }
