"""The BMC reader on recorded ipmitool output of several vendors' BMCs, and through a real child process."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hostfixtures import exported
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.core.model import HostPsu, HostSample
from gpuwatch.readers.ipmi import (
    PSU_COMMAND,
    SENSOR_COMMAND,
    THRESHOLDS,
    IpmiError,
    IpmiReader,
    IpmiSensor,
    LocalBmc,
    PsuState,
    parse_psu_states,
    parse_sensor_list,
    psu_power_from_sensors,
    readings_from_sensors,
    redundancy_lost,
)

FIXTURES = Path(__file__).parent / "fixtures" / "ipmi"


def recorded(vendor: str) -> dict[str, str]:
    return {name: (FIXTURES / vendor / f"{name}.txt").read_text() for name in ("sensor", "psu")}


class RecordedBmc:
    """A BMC that answers with what a real one printed (tests/fixtures/ipmi/<vendor>/)."""

    def __init__(self, outputs: dict[str, str]) -> None:
        self.outputs = outputs

    def usable(self) -> tuple[bool, str]:
        return True, "recorded"

    def run(self, command: Sequence[str], _timeout_s: float) -> str:
        assert tuple(command) in (SENSOR_COMMAND, PSU_COMMAND), command
        return self.outputs["psu"] if tuple(command) == PSU_COMMAND else self.outputs["sensor"]


def reader_for(outputs: dict[str, str], state: Path | None = None) -> IpmiReader:
    return IpmiReader(RecordedBmc(outputs), state_path=state)


def rails(reader: IpmiReader) -> dict[str, tuple[float, float | None, float | None]]:
    return {v.sensor: (v.volts, v.nominal_volts, v.min_volts) for v in reader.read().voltages}


def test_supermicro_rails_with_the_bmc_lower_non_critical_and_nominal_from_the_name() -> None:
    """IPMI threshold sensors carry non-critical, critical and non-recoverable thresholds (IPMI v2.0, Get Sensor
    Thresholds; ipmitool's lnc/lcr/lnr columns), and tools read non-critical as the warning level (FreeIPMI's
    ipmi-sensors reports it as Warning). The lower non-critical threshold is therefore the rail's min, like a PMBus
    chip's warning limit (inX_min); it used to be the lower critical one."""
    reader = reader_for(recorded("supermicro_x12"))
    assert rails(reader) == {
        "12V": (11.968, 12.0, 10.8),
        "5VCC": (5.026, 5.0, 4.5),
        "3.3VCC": (3.367, 3.3, 2.97),
        "5VSB": (5.052, 5.0, 4.5),
        "3.3VSB": (3.384, 3.3, 2.97),
        "1.8V PCH": (1.818, 1.8, 1.62),
        "1.05V PCH": (1.066, 1.05, 0.927),
    }  # Vcpu1/2, VDimm*, VBAT (discrete on this BMC), PVNN (the PCH's VNN rail) are not supply rails


def test_supermicro_temperatures_and_fans_skip_unreadable_sensors() -> None:
    sample = reader_for(recorded("supermicro_x12")).read()
    temps = {t.sensor: t.value for t in sample.temperatures}
    assert temps["CPU1 Temp"] == 45.0 and temps["System Temp"] == 30.0
    assert "P1-DIMMB1 Temp" not in temps  # na
    assert {f.sensor: f.value for f in sample.fans} == {"FAN1": 3360.0, "FAN2": 3500.0, "FANA": 2940.0}
    assert {t.chip for t in sample.temperatures} == {"ipmi"}


def test_supermicro_supply_with_ac_lost_is_down() -> None:
    psus = {p.psu: p.up for p in reader_for(recorded("supermicro_x12")).read().psus}
    assert psus == {"PS1 Status": True, "PS2 Status": False}


def test_dell_supplies_named_status_are_told_apart_by_entity_and_redundancy_is_not_a_supply() -> None:
    sample = reader_for(recorded("dell_idrac9")).read()
    assert {p.psu: p.up for p in sample.psus} == {"Status 10.1": True, "Status 10.2": False}
    # the PSU's AC input voltage is a rail without a name that says its nominal; "ns" sensors are skipped
    assert {v.sensor: (v.volts, v.nominal_volts, v.min_volts) for v in sample.voltages} == {
        "Voltage 1": (232.0, None, None)
    }
    # both CPUs' sensors are called "Temp": neither is lost
    temps = {t.sensor: t.value for t in sample.temperatures}
    assert temps["Temp"] == 42.0 and temps["Temp #2"] == 40.0 and temps["Inlet Temp"] == 22.0
    assert "Fan4" not in {f.sensor for f in sample.fans}


def test_hpe_predictive_failure_is_down_and_fans_in_percent_are_not_rpm() -> None:
    sample = reader_for(recorded("hpe_ilo5")).read()
    assert {p.psu: p.up for p in sample.psus} == {"Power Supply 1": True, "Power Supply 2": False}
    assert sample.fans == () and sample.voltages == ()
    assert {t.sensor for t in sample.temperatures} == {"01-Inlet Ambient", "02-CPU 1", "03-CPU 2", "12-HD Max"}


def test_lenovo_failure_detected_unpopulated_bays_and_vccin_excluded() -> None:
    sample = reader_for(recorded("lenovo_xcc")).read()
    # PSU3 (ns, No Reading) and PSU4 (no presence asserted) were never populated: not exported
    assert {p.psu: p.up for p in sample.psus} == {"PSU1": True, "PSU2": False}
    assert {v.sensor: (v.volts, v.nominal_volts, v.min_volts) for v in sample.voltages} == {
        "Planar 3.3V": (3.32, 3.3, 3.04),
        "Planar 5V": (5.07, 5.0, 4.5),
        "Planar 12V": (12.16, 12.0, 10.84),
    }


def power(sample: HostSample) -> dict[str, float]:
    return {p.psu: p.watts for p in sample.psu_power}


def test_supply_power_from_the_bmc_under_the_names_psu_up_has() -> None:
    """`ipmitool sensor` rows with unit Watts that name a supply become gpuwatch_host_psu_power_watts{psu}, under the
    label gpuwatch_host_psu_up has for the supply of that number (HPE's "Power Supply 1", Lenovo's "PSU1"), so the two
    join on psu. A supply without a reading (na) is left out; the node's own totals (Dell's "Pwr Consumption", HPE's
    "Power Meter") name no supply and are left out rather than counted as one."""
    assert power(reader_for(recorded("hpe_ilo5")).read()) == {"Power Supply 1": 180.0, "Power Supply 2": 0.0}
    assert power(reader_for(recorded("lenovo_xcc")).read()) == {"PSU1": 410.0}
    assert power(reader_for(recorded("dell_idrac9")).read()) == {}
    watts = "| Watts | ok | na | na | na | na | na | na\n"
    sensors = parse_sensor_list(
        f"PS1 Output Power | 561.000 {watts}"
        f"PS1 Input Power | 612.000 {watts}"
        f"PSU2 Power Out | 498.000 {watts}"
        f"PS3_Input_Power | 75.000 {watts}"
        f"PS4 Input Power | -3.000 {watts}"
        f"PS5 Input Power | nan {watts}"
        f"CPU1 Power | 280.000 {watts}"
        f"Pwr Consumption | 1183.000 {watts}"
    )
    found = psu_power_from_sensors(sensors, ["PS1 Status", "PS2 Status", "Status 10.3"])
    # input power over output power; the psu label of that number; unknown supplies as their name says them
    assert [(p.psu, p.watts, p.sensor) for p in found] == [
        ("PS1 Status", 612.0, "PS1 Input Power"),
        ("PS2 Status", 498.0, "PSU2 Power Out"),
        ("Status 10.3", 75.0, "PS3_Input_Power"),
    ]
    assert power_from(sensors, []) == {"PS1": 612.0, "PSU2": 498.0, "PS3": 75.0}


def power_from(sensors: list[IpmiSensor], labels: list[str]) -> dict[str, float]:
    return {p.psu: p.watts for p in psu_power_from_sensors(sensors, labels)}


@pytest.mark.parametrize(
    ("vendor", "lost"),
    [
        ("dell_idrac9", True),  # PS Redundancy: Redundancy Lost
        ("hpe_ilo5", False),  # Power Supplies: Fully Redundant (PSU2's predictive failure still delivers)
        ("lenovo_xcc", True),  # PSU Redundancy: Not Readable -> derived: PSU2 failed
        ("supermicro_x12", True),  # no redundancy sensor -> derived: PS2 AC lost
        ("openbmc_x13", None),  # one supply: no redundancy to lose
    ],
)
def test_redundancy_from_the_bmc_sensor_else_from_the_supplies(vendor: str, lost: bool | None) -> None:
    """The BMC's power-supply redundancy sensor (IPMI generic event/reading type 0Bh, "Redundancy": Fully
    Redundant, Redundancy Lost, Redundancy Degraded, Non-redundant:…) says it where it reads; else two or more
    supplies known with one not up is redundancy lost. gpuwatch_host_psu_redundancy_lost is 1/0, absent on a single
    supply."""
    sample = reader_for(recorded(vendor)).read()
    assert sample.psu_redundancy_lost is lost
    series = exported([sample]).get(("gpuwatch_host_psu_redundancy_lost",))
    assert series == (None if lost is None else float(lost))


@pytest.mark.parametrize(
    ("state", "lost"),
    [
        ("Fully Redundant", False),
        ("Redundancy Lost", True),
        ("Redundancy Degraded", False),  # lost some redundancy, still redundant
        ("Non-redundant:Sufficient Resources from Redundant", True),
        ("Non-Redundant: Sufficient Resources from Insufficient Resources", True),
        ("Non-redundant:Insufficient Resources", True),
        ("Redundancy Degraded from Fully Redundant", False),
        ("Redundancy Degraded from Non-redundant", False),  # regained some: redundant again
        ("Not Readable", None),
        ("", None),
    ],
)
def test_every_redundancy_state_ipmi_defines(state: str, lost: bool | None) -> None:
    """The eight states of IPMI's Redundancy event/reading type (0Bh) as ipmitool and FreeIPMI print them; DMTF's
    Redfish message registry words them: "Redundancy Degraded from Fully Redundant: Unit has lost some redundant
    resource(s) but is still in a redundant state", "Non-redundant:Insufficient Resources: Unit is non-redundant and
    has insufficient resource to maintain normal operation". A state that says nothing leaves the verdict to the
    supplies (here one up supply: no verdict)."""
    states = parse_psu_states(
        f"PS1 Status | C8h | ok | 10.1 | Presence detected\nPS Redundancy | CAh | ok | 19.1 | {state}\n"
    )
    assert redundancy_lost(states, [HostPsu("PS1 Status", True)]) is lost
    # a redundancy sensor the BMC cannot read (ns) says nothing either: two supplies, one down, is lost
    states = parse_psu_states("PS Redundancy | CAh | ns | 19.1 | Fully Redundant\n")
    assert redundancy_lost(states, [HostPsu("PS1", True), HostPsu("PS2", False)]) is True
    assert redundancy_lost(states, [HostPsu("PS1", True), HostPsu("PS2", True)]) is False


def test_a_supply_seen_once_that_disappears_is_down_and_remembered_across_restarts(tmp_path: Path) -> None:
    state = tmp_path / "host_psus.json"
    outputs = recorded("lenovo_xcc")
    assert {p.psu for p in reader_for(outputs, state).read().psus} == {"PSU1", "PSU2"}
    outputs["psu"] = "PSU1             | E0h | ok  | 10.1 | Presence detected\n"
    after_restart = reader_for(outputs, state)  # a new reader: what it knows comes from the state file
    psus = {p.psu: (p.up, p.states) for p in after_restart.read().psus}
    assert psus == {"PSU1": (True, "Presence detected"), "PSU2": (False, "absent (was present before)")}
    # and without a state file, it is remembered in memory
    memory = reader_for(recorded("lenovo_xcc"))
    memory.read()
    outputs_gone = {**recorded("lenovo_xcc"), "psu": ""}
    memory.bmc = RecordedBmc(outputs_gone)
    assert {p.psu: p.up for p in memory.read().psus} == {"PSU1": False, "PSU2": False}


def test_parsers_skip_warnings_and_blank_lines() -> None:
    text = "Unable to read sensor 0x42: Timeout\n\n" + recorded("supermicro_x12")["sensor"]
    assert len(parse_sensor_list(text)) == len(parse_sensor_list(recorded("supermicro_x12")["sensor"]))
    assert parse_psu_states("Get SDR 0042 command failed\n") == []
    voltages, _, _ = readings_from_sensors(parse_sensor_list("12V | na | Volts | na | na | na | na | na | na | na\n"))
    assert voltages == []


def fake_ipmitool(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "ipmitool"
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_through_a_real_child_process(tmp_path: Path) -> None:
    """The argv the reader sends and the output a real process prints, end to end."""
    fixtures = FIXTURES / "supermicro_x12"
    tool = fake_ipmitool(
        tmp_path,
        "import sys\n"
        f"assert sys.argv[1:3] == ['-I', 'open'], sys.argv\n"
        f"name = 'psu' if sys.argv[3:] == ['sdr', 'type', 'Power Supply'] else 'sensor'\n"
        f"assert name == 'psu' or sys.argv[3:] == ['sensor'], sys.argv\n"
        f"print(open({str(fixtures)!r} + '/' + name + '.txt').read(), end='')\n",
    )
    device = tmp_path / "ipmi0"
    device.write_text("")
    reader = IpmiReader(LocalBmc(str(tool), device), timeout_s=30)
    assert reader.usable()[0]
    sample = reader.read()
    assert {v.sensor for v in sample.voltages} >= {"12V", "5VCC"}
    assert {p.psu: p.up for p in sample.psus} == {"PS1 Status": True, "PS2 Status": False}


def test_a_hung_ipmitool_is_killed_at_its_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    tool = fake_ipmitool(
        tmp_path, f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    )
    device = tmp_path / "ipmi0"
    device.write_text("")
    reader = IpmiReader(LocalBmc(str(tool), device), timeout_s=1.0)
    with pytest.raises(IpmiError, match="longer than 1 s and was killed"):
        reader.read()
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, and reaped


def test_a_failing_ipmitool_says_why(tmp_path: Path) -> None:
    tool = fake_ipmitool(
        tmp_path, "import sys\nprint('Could not open device at /dev/ipmi0', file=sys.stderr)\nsys.exit(1)\n"
    )
    device = tmp_path / "ipmi0"
    device.write_text("")
    with pytest.raises(IpmiError, match="exited 1: Could not open device"):
        IpmiReader(LocalBmc(str(tool), device)).read()


def test_usable_says_what_is_missing(tmp_path: Path) -> None:
    assert IpmiReader(LocalBmc(str(tmp_path / "nope"))).usable() == (
        False,
        f"{tmp_path / 'nope'} not found (apt-get install ipmitool)",
    )
    tool = fake_ipmitool(tmp_path, "")
    ok, why = IpmiReader(LocalBmc(str(tool), tmp_path / "ipmi0")).usable()
    assert not ok and "no " + str(tmp_path / "ipmi0") in why


def test_a_negative_rail_keeps_its_sign() -> None:
    """A healthy -12 V rail reads -12.05: its nominal is -12, never 12 (which made HostPsuRailUndervoltage fire)."""
    from gpuwatch.readers.rails import nominal_from_name

    assert [nominal_from_name(n) for n in ("-12V", "N12V", "12V NEG", "-5V", "+12V", "P12V", "12V")] == [
        -12.0,
        -12.0,
        -12.0,
        -5.0,
        12.0,
        12.0,
        12.0,
    ]
    text = "-12V | -12.050 | Volts | ok | na | -13.200 | na | na | -10.800 | na\n"
    voltages, _, _ = readings_from_sensors(parse_sensor_list(text))
    assert [(v.sensor, v.volts, v.nominal_volts) for v in voltages] == [("-12V", -12.05, -12.0)]


def test_a_bmc_this_user_cannot_open_is_not_reported_as_no_bmc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tests run as root, so the permission problem is simulated for the fixture device only: first the file mode
    (os.access), then the device cgroup of a unit without the ipmi.conf drop-in (open() refused, access() fine)."""
    from gpuwatch.cli.host_report import print_host_table, read_host
    from gpuwatch.collectors.host import check_source
    from gpuwatch.collectors.sources import HostSource

    tool = fake_ipmitool(tmp_path, "")
    device = tmp_path / "ipmi0"
    device.write_text("")
    reader = IpmiReader(LocalBmc(str(tool), device))
    assert reader.usable()[0]  # present and openable: usable

    real_access, real_open = os.access, os.open
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == device else real_access(p, mode, **kw))
    ok, why = reader.usable()
    assert not ok
    assert why.startswith(f"BMC present but not accessible (permission on {device}; see the ipmi.conf drop-in")

    monkeypatch.setattr(os, "access", real_access)

    def refuse(path: object, flags: int, *args: object, **kw: object) -> int:
        if Path(str(path)) == device:
            raise PermissionError(1, "Operation not permitted", str(path))
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refuse)
    ok, why = reader.usable()
    assert not ok and why.startswith(f"BMC present but not accessible (permission on {device}: Operation not permitted")

    # `gpuwatch check` warns (FAIL when host.ipmi = "on"); `gpuwatch snapshot` names the problem, never "no BMC".
    auto = HostSource("ipmi", reader, 60.0, reader.usable)
    line = check_source(auto)
    assert (line.level, line.what) == ("warn", "host ipmi") and line.detail == why and "ipmi.conf" in line.fix
    required = HostSource("ipmi", reader, 60.0, reader.usable, required=True)
    assert check_source(required).level == "FAIL"
    samples, problems = read_host([auto])
    assert samples == [] and problems == {"ipmi": why}
    print_host_table(samples, problems)
    out = capsys.readouterr().out
    assert "ipmi: unavailable: BMC present but not accessible" in out and "no BMC" not in out

    absent = IpmiReader(LocalBmc(str(tool), tmp_path / "no-ipmi0"))  # no device at all: still just info
    assert check_source(HostSource("ipmi", absent, 60.0, absent.usable)).level == "ok"


# --- properties: `ipmitool sensor` and `sdr type "Power Supply"` as ipmitool prints them -----------------------
# ipmitool's lib/ipmi_sensor.c prints a threshold sensor as "%-16s | %-10.3f | %-10s | %-6s" and the six thresholds
# "| %-10.3f" each, "na" where there is none; lib/ipmi_sdr.c prints a supply as "name | id | status | entity | states".

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a shared CI host
# A BMC's name or state text: anything printable but the column separator (a line break would end the line).
FIELD = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="|"), max_size=24)
NAME = FIELD.filter(lambda name: name.strip() != "")
READING = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False))
UNIT = st.sampled_from(["Volts", "degrees C", "RPM", "Watts", "Amps", "percent", "CFM"])
STATUS = st.sampled_from(["ok", "nc", "cr", "nr", "na", "ns", "OK", "Not Readable"])


def sensor_line(name: str, value: float | None, unit: str, status: str, thresholds: list[float | None]) -> str:
    def column(number: float | None) -> str:
        return "na" if number is None else repr(number)

    return " | ".join([f"{name:<16}", f"{column(value):<10}", f"{unit:<10}", f"{status:<6}", *map(column, thresholds)])


SENSOR = st.tuples(NAME, READING, UNIT, STATUS, st.lists(READING, min_size=6, max_size=6))
Sensor = tuple[str, float | None, str, str, list[float | None]]
# What ipmitool prints besides sensors: warnings, blank lines, a header; never ten columns.
NOT_A_SENSOR = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=60).filter(
    lambda line: line.count("|") < 9
)


@PROPERTY
@given(st.text(max_size=400))
def test_property_sensor_and_psu_parsers_never_raise(text: str) -> None:
    for sensor in parse_sensor_list(text):
        assert sensor.value is None or abs(sensor.value) < float("inf")
        assert all(abs(v) < float("inf") for v in sensor.thresholds.values())
    voltages, temperatures, fans = readings_from_sensors(parse_sensor_list(text))
    assert all(abs(r) < float("inf") for r in [v.volts for v in voltages] + [t.value for t in temperatures + fans])
    for psu in parse_psu_states(text):
        assert isinstance(psu.failed, bool) and isinstance(psu.present, bool)


@PROPERTY
@given(st.lists(st.tuples(SENSOR, st.lists(NOT_A_SENSOR, max_size=2)), max_size=8))
def test_property_sensor_lines_parse_back_and_other_lines_are_skipped(lines: list[tuple[Sensor, list[str]]]) -> None:
    text, expected = [], []
    for (name, value, unit, status, thresholds), junk in lines:
        text.append(sensor_line(name, value, unit, status, thresholds))
        text.extend(junk)
        limits = {key: v for key, v in zip(THRESHOLDS, thresholds, strict=True) if v is not None}
        expected.append(IpmiSensor(name.strip(), value, unit, status.lower(), limits))
    assert parse_sensor_list("\n".join(text)) == expected


@PROPERTY
@given(NAME, st.sampled_from(["na", "nan", "NaN", "inf", "-inf", "Infinity", "0x04", "Not Readable", "disabled", ""]))
def test_property_a_reading_that_is_no_number_is_none_never_nan_or_inf(name: str, reading: str) -> None:
    """No reading is ever exported as NaN, ±Inf or 0: "na", a discrete state or a non-finite number is None."""
    (sensor,) = parse_sensor_list(f"{name} | {reading} | Volts | ok | {reading} | na | na | na | na | {reading}")
    assert sensor.value is None and sensor.thresholds == {}


@PROPERTY
@given(st.lists(SENSOR, max_size=10))
def test_property_readings_keep_the_bmc_unit_and_value_and_unique_names(sensors: list[Sensor]) -> None:
    """IPMI readings come in the unit the BMC states (IPMI 2.0 §43.17 sensor units): degrees C and RPM are exported
    as read, no scaling; each reading of a kind keeps its own sensor name (Dell's two "Temp" become "Temp #2")."""
    parsed = parse_sensor_list("\n".join(sensor_line(*sensor) for sensor in sensors))
    voltages, temperatures, fans = readings_from_sensors(parsed)
    readable = [s for s in parsed if s.value is not None and s.status not in ("na", "ns")]
    assert [t.value for t in temperatures] == [s.value for s in readable if s.unit == "degrees C"]
    assert [f.value for f in fans] == [s.value for s in readable if s.unit == "RPM"]
    assert {v.volts for v in voltages} <= {s.value for s in readable if s.unit == "Volts"}
    for readings in ([v.sensor for v in voltages], [t.sensor for t in temperatures], [f.sensor for f in fans]):
        assert len(set(readings)) == len(readings)


PSU_STATES = st.lists(
    st.sampled_from(["Presence detected", "Failure detected", "Power Supply AC lost", "Predictive failure", "x"]),
    max_size=3,
).map(", ".join)


@PROPERTY
@given(st.lists(st.tuples(NAME, st.sampled_from(["ok", "ns", "OK", "nr"]), st.integers(1, 8), PSU_STATES), max_size=6))
def test_property_psu_lines_parse_back(supplies: list[tuple[str, str, int, str]]) -> None:
    text = "\n".join(
        f"{name:<16} | {0x60 + n:02x}h | {status:<3} | 10.{entity} | {states}"
        for n, (name, status, entity, states) in enumerate(supplies)
    )
    expected = [
        PsuState(name.strip(), f"10.{entity}", status.lower(), states) for name, status, entity, states in supplies
    ]
    assert parse_psu_states(text) == expected
    for state in parse_psu_states(text):
        assert state.failed == any(s in state.states for s in ("Failure", "AC lost", "Predictive"))
        assert state.present == (state.status != "ns" and (state.failed or "Presence detected" in state.states))
