"""Which voltage sensors are PSU rails, on the names OpenBMC and Supermicro X13 BMCs and hwmon chips use."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.cli.host_report import print_host_table
from gpuwatch.core.model import HostSample, HostVoltage
from gpuwatch.readers.ipmi import parse_sensor_list, readings_from_sensors
from gpuwatch.readers.rails import (
    INFER_WINDOW,
    STANDARD_RAILS,
    declared_undervoltage,
    is_supply_rail,
    lower_limit,
    nominal_from_name,
    nominal_from_reading,
    tolerance_for,
)

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


# ATX12V Power Supply Design Guide 2.x, §3.2.1 "DC Voltage Regulation", Table 2: +12V1/+12V2, +5V, +3.3V and +5VSB
# ±5 % (+11.40, +4.75, +3.14, +4.75 V at the least), −12 V ±10 % (−10.80 V); earlier revisions' −5 V ±10 % too.
ATX = [(12.0, 0.05, 11.4), (5.0, 0.05, 4.75), (3.3, 0.05, 3.135), (-12.0, 0.10, -10.8), (-5.0, 0.10, -4.5)]


@pytest.mark.parametrize(("nominal", "tolerance", "limit"), ATX)
def test_each_rail_gets_its_atx_tolerance(nominal: float, tolerance: float, limit: float) -> None:
    """ATX12V Power Supply Design Guide (2.x, §3.2.1, Table 2 "DC Output Voltage Regulation") allows ±5 % on +12 V,
    +5 V, +3.3 V and +5VSB but ±10 % on −12 V; one 95 % for every rail paged critical on a −12 V rail reading
    −11.3 V, well inside its regulation range. Without a declared limit a rail's min is its nominal less its own
    tolerance, with the rail's sign."""
    assert tolerance_for(nominal) == tolerance
    assert lower_limit(nominal, None) == limit
    assert lower_limit(nominal, 1.0) == 1.0  # a declared limit wins
    assert lower_limit(None, None) is None


def _under_min(name: str, volts: float, thresholds: str = "na | na | na | na | na | na") -> bool:
    """The condition HostPsuRailUndervoltage is to evaluate on what the agent exports: |volts| < |min_volts|."""
    [rail] = readings_from_sensors(parse_sensor_list(f"{name} | {volts} | Volts | ok | {thresholds}\n"))[0]
    assert rail.min_volts is not None
    return abs(rail.volts) < abs(rail.min_volts)


def test_negative_rails_are_judged_within_their_ten_percent_and_positive_ones_within_five() -> None:
    """The four cases of the alert, on the agent's min_volts (ATX12V design guide, Table 2): −11.3 V on −12 V is
    inside −12 V's ±10 % (silent), −10.7 V is outside (fires); 11.2 V on +12 V is outside its ±5 % (fires), 11.5 V
    is inside (silent)."""
    assert not _under_min("-12V", -11.3)
    assert _under_min("-12V", -10.7)
    assert _under_min("12V", 11.2)
    assert not _under_min("12V", 11.5)


def test_a_negative_rail_takes_the_bmc_threshold_on_its_undervoltage_side() -> None:
    """A −12 V rail sags toward 0 V, through the thresholds above it: a BMC that declares −12 V's lower critical as
    −13.2 V (the signed minimum, i.e. too much magnitude) and its upper critical as −10.8 V gets −10.8 V as min,
    never −13.2 V, against which −12.05 V would read as under its limit by magnitude. A BMC that writes the
    undervoltage limit into lcr (−10.8 V) gets the same; one that declares only −13.2 V gets ATX's −10.8 V."""
    rails = readings_from_sensors(
        parse_sensor_list(
            "-12V | -12.050 | Volts | ok | na | -13.200 | na | na | -10.800 | na\n"
            "N12V | -12.050 | Volts | ok | na | -10.800 | na | na | na | na\n"
            "12V NEG | -12.050 | Volts | ok | -13.800 | -13.200 | na | na | na | na\n"
            "-5V | -5.020 | Volts | ok | na | -5.500 | na | -4.750 | -4.500 | na\n"
        )
    )[0]
    assert {v.sensor: v.min_volts for v in rails} == {"-12V": -10.8, "N12V": -10.8, "12V NEG": -10.8, "-5V": -4.75}
    assert not any(abs(v.volts) < abs(v.min_volts or 0) for v in rails)


def test_a_declared_limit_that_is_no_limit_is_ignored() -> None:
    """0 (unset) and limits above the nominal (a BMC default, a chip's register garbage) are no undervoltage limit:
    the rail falls back to its nominal's tolerance instead of alerting forever or never."""
    assert declared_undervoltage(12.0, [0.0, 65.535]) is None
    assert declared_undervoltage(12.0, [11.6, 11.4]) == 11.6  # nearest the nominal: the warning limit
    assert declared_undervoltage(None, [0.0, 190.0]) == 190.0  # no nominal (an AC input): the first positive
    assert declared_undervoltage(-12.0, [-13.2], [-11.4, -10.8]) == -11.4


@pytest.mark.parametrize(
    ("name", "volts", "nominal"),
    [
        ("vout1", 12.1, 12.0),
        ("vout1", 11.2, 12.0),
        ("vout1", 10.0, 12.0),  # -17 %: still 12 V
        ("vout2", 54.3, 54.0),
        ("vout1", 51.6, 54.0),
        ("vout1", 48.4, 48.0),
        ("vout3", 5.02, 5.0),
        ("vout1", 3.31, 3.3),
        ("vout1", 1.8, None),  # a VRM's output: no standard rail near it
        ("vout1", 2.5, None),
        ("vout1", 9.5, None),  # 12 V less 21 %: neither 12 nor 5
        ("vout1", 24.0, None),
        ("vout1", 0.0, None),
        ("vin", 12.0, None),  # an input is never judged by its reading
        ("vin", 230.0, None),
        ("P12V_AUX", 12.0, None),  # other names state their nominal or have none
    ],
)
def test_a_pmbus_output_gets_the_nominal_of_the_nearest_standard_rail(
    name: str, volts: float, nominal: float | None
) -> None:
    """PMBus chips label their outputs vout1 … voutN (drivers/hwmon/pmbus/pmbus_core.c), which names no voltage, so
    the 95 % check never applied to them. The nominal is the standard rail (12, 54, 48, 5, 3.3 V) nearest the
    reading, within ±20 %: the rails lie at least 20 % apart (48/54 V excepted), twice ATX's widest tolerance."""
    assert nominal_from_reading(name, volts) == nominal


def test_the_snapshot_table_judges_rails_like_the_alert(capsys: pytest.CaptureFixture[str]) -> None:
    """`gpuwatch snapshot` marks a rail BELOW MIN by magnitude (a -12 V rail at -10.7 V, not at -11.3 V) and names
    the alarm flags a chip raised."""
    sample = HostSample(
        "hwmon",
        0.0,
        voltages=(
            HostVoltage("ipmi", "-12V", -11.3, -12.0, -10.8),
            HostVoltage("ipmi", "-12V B", -10.7, -12.0, -10.8),
            HostVoltage("pmbus-i2c-7-58", "vout1", 11.7, 12.0, 11.6, True, (("min", True), ("lcrit", False))),
        ),
    )
    print_host_table([sample], {})
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row[:40].strip() for row in rows] == ["ipmi -12V", "ipmi -12V B", "pmbus-i2c-7-58 vout1"]
    assert [row[69:].strip() for row in rows] == ["ok", "BELOW MIN", "ALARM (min)"]


@pytest.mark.parametrize("name", ["0V", "GPU0VDD", "PSU0VIN", "-0V", "P0V0"])
def test_a_zero_in_a_name_states_no_nominal(name: str) -> None:
    """Found by a property: "GPU0VDD" read as a 0 V rail, exported as gpuwatch_host_voltage_nominal_volts 0 (a
    dashboard's 95 %-of-nominal line at 0 V). A stated 0 V is a unit's number, never a rail."""
    assert nominal_from_name(name) is None


# --- properties: what a rail's name states, and the limits derived from it ---------------------------------------

PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a shared CI host
WHOLE = st.integers(1, 54)
FRACTION = st.integers(1, 99).map(str)  # "3V3", "1V05", "3.3V", "1.05V"
PREFIX = st.sampled_from(["", "P", "+", "PSU1 ", "Planar "])
SUFFIX = st.sampled_from(["", "_AUX", " Rail", "_STBY", " Input"])


@PROPERTY
@given(PREFIX, WHOLE, st.one_of(st.none(), FRACTION), st.booleans(), SUFFIX)
def test_property_a_stated_nominal_is_read_from_the_name(
    prefix: str, whole: int, fraction: str | None, dotted: bool, suffix: str
) -> None:
    """12V, P12V_AUX, 3V3, 1.05V …: the voltage the name states, whatever surrounds it."""
    if fraction is None:
        stated, volts = f"{whole}V", float(whole)
    else:
        stated, volts = (f"{whole}.{fraction}V" if dotted else f"{whole}V{fraction}"), float(f"{whole}.{fraction}")
    assert nominal_from_name(f"{prefix}{stated}{suffix}") == volts


@PROPERTY
@given(WHOLE, st.sampled_from(["-{}V", "N{}V", "NEG{}V", "{}V_NEG", "{}V Neg", "-{}V MINUS", "P{}V_NEGATIVE"]))
def test_property_a_negative_rail_keeps_its_sign(whole: int, form: str) -> None:
    assert nominal_from_name(form.format(whole)) == -float(whole)


@PROPERTY
@given(st.text(max_size=40))
def test_property_names_never_raise(name: str) -> None:
    nominal = nominal_from_name(name)
    assert nominal is None or 0 < abs(nominal) < 100
    assert isinstance(is_supply_rail(name), bool)


# Nominals a name or a mapping states: a rail of 0.1 V or less is none (limits are rounded to the microvolt).
NOMINAL = st.one_of(
    st.sampled_from([12.0, 5.0, 3.3, -12.0, -5.0, 48.0, 54.0, 1.8]), st.floats(0.1, 60), st.floats(-60, -0.1)
)
THRESHOLD = st.floats(-100, 100, allow_nan=False)


@PROPERTY
@given(NOMINAL)
def test_property_the_tolerance_limit_lies_between_the_nominal_and_zero(nominal: float) -> None:
    """ATX12V Design Guide 2.x §3.2.1, Table 2: a rail sags toward 0, so its limit lies between 0 and its nominal."""
    limit = lower_limit(nominal, None)
    assert limit is not None and (0 < limit < nominal or nominal < limit < 0)
    assert limit == pytest.approx(nominal * (1 - tolerance_for(nominal)), abs=1e-6)


@PROPERTY
@given(st.one_of(st.none(), NOMINAL), st.lists(THRESHOLD, max_size=3), st.lists(THRESHOLD, max_size=3))
def test_property_a_declared_limit_is_one_of_the_thresholds_on_the_undervoltage_side(
    nominal: float | None, lower: list[float], upper: list[float]
) -> None:
    declared = declared_undervoltage(nominal, lower, upper)
    if declared is None:
        return
    if nominal is None:
        assert declared in lower and declared > 0
    elif nominal < 0:
        assert declared in lower + upper and nominal < declared < 0
    else:
        assert declared in lower and 0 < declared < nominal
    assert lower_limit(nominal, declared) == declared


@PROPERTY
@given(st.sampled_from(["vout", "vout1", "vout12", "vin", "12V", "in3"]), st.floats(-100, 100, allow_nan=False))
def test_property_an_inferred_nominal_is_a_standard_rail_near_the_reading(name: str, volts: float) -> None:
    nominal = nominal_from_reading(name, volts)
    if nominal is not None:
        assert name.startswith("vout") and nominal in STANDARD_RAILS
        assert abs(volts / nominal - 1) < INFER_WINDOW
