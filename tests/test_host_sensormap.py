"""Super-I/O sensor maps: the TOML file an operator writes (lm-sensors' sensors.conf in TOML), validated with an
error that names the file, the key and the problem, and the compute expressions applied to raw pin readings."""

from __future__ import annotations

import contextlib
import json
import math
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.files.sensormap import Compute, SensorMapError, find_input, load_sensor_maps

REPO = Path(__file__).resolve().parent.parent


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


@pytest.mark.parametrize("volts", ["nan", "inf", "-inf", "1" + "0" * 400, "0", "-12", "true", '"12"'])
def test_volts_that_are_no_positive_finite_number_are_refused(tmp_path: Path, volts: str) -> None:
    """Found by a property: TOML's nan and inf were accepted (a NaN limit no alert compares against), and an integer
    past a float's range raised OverflowError, a traceback instead of exit 78 naming the key."""
    path = tmp_path / "board.toml"
    for key in ("nominal", "min"):
        path.write_text(f'[[chip]]\nmatch = "nct*"\n[chip.in4]\n{key} = {volts}\n')
        with pytest.raises(SensorMapError, match=rf"chip\[0\]\.in4\.{key}: must be a positive, finite number of volts"):
            load_sensor_maps([str(path)])


@pytest.mark.parametrize("key", ["in4\\n", "in\\u0664", "temp2 "])
def test_an_input_the_reader_never_looks_up_is_refused(tmp_path: Path, key: str) -> None:
    """Found by a property: "in4" with a trailing newline (`$` matches before one) and "in" with an Arabic-Indic four
    (`\\d` is any Unicode digit) were accepted as inputs, then silently never applied: the reader looks up in4."""
    path = tmp_path / "board.toml"
    path.write_text(f'[[chip]]\nmatch = "nct*"\n[chip."{key}"]\nlabel = "+12V"\n')
    with pytest.raises(SensorMapError, match="unknown key; inputs are named like in4"):
        load_sensor_maps([str(path)])


PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a shared CI host

# --- properties ---------------------------------------------------------------------------------------------------


def toml_value(value: object) -> str:
    """A TOML literal: strings as basic strings (JSON's escapes are TOML's), floats as Python spells them (TOML
    takes nan, inf, -inf and exponents), booleans in lower case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def render(chips: list[dict[str, object]]) -> str:
    lines = []
    for chip in chips:
        lines.append("[[chip]]")
        lines += [f"{key} = {toml_value(v)}" for key, v in chip.items() if not isinstance(v, dict)]
        for key, table in chip.items():
            if isinstance(table, dict):
                lines.append(f"[chip.{json.dumps(key)}]")
                lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def load(text: str | bytes) -> tuple[object, ...]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "board.toml"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
        return load_sensor_maps([str(path)])


TOML_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x7f"), max_size=20)
ANY_VALUE = st.one_of(st.booleans(), st.integers(-(10**20), 10**20), st.floats(), TOML_TEXT)


def mostly(good: st.SearchStrategy[object], other: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """Four times in five `good`: a file is only accepted when every entry of it is valid."""
    return st.integers(0, 4).flatmap(lambda n: other if n == 0 else good)


INPUT_KEY = mostly(
    st.sampled_from(["in0", "in4", "temp2", "fan1", "in12"]),
    st.sampled_from(["volt1", "in", "in4\n", "in\u0664", " in4", "IN4", "in-1"]),
)
VOLTS = mostly(st.floats(0.1, 60), st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -12.0, True]))
INPUT_TABLE = st.fixed_dictionaries(
    {},
    optional={
        "label": mostly(TOML_TEXT.filter(bool), ANY_VALUE),
        "compute": mostly(st.sampled_from(["@*12", "@*(1+120/56)", "@/2, @*2"]), TOML_TEXT),
        "nominal": VOLTS,
        "min": VOLTS,
        "ignore": mostly(st.booleans(), ANY_VALUE),
    },
)
CHIP = st.fixed_dictionaries(
    {"match": mostly(st.just("nct6798-isa-*"), ANY_VALUE)},
    optional={"board": mostly(st.just("Pro WS *"), ANY_VALUE)},
).flatmap(lambda head: st.dictionaries(INPUT_KEY, INPUT_TABLE, max_size=3).map(lambda inputs: {**head, **inputs}))


@PROPERTY
@given(st.binary(max_size=300))
def test_property_any_file_content_loads_or_is_a_sensor_map_error(content: bytes) -> None:
    with contextlib.suppress(SensorMapError):
        load(content)


@PROPERTY
@given(st.lists(CHIP, min_size=1, max_size=2))
def test_property_any_mapping_document_loads_or_is_a_sensor_map_error(chips: list[dict[str, object]]) -> None:
    with contextlib.suppress(SensorMapError):
        load(render(chips))


@PROPERTY
@given(st.one_of(INPUT_KEY, TOML_TEXT))
def test_property_an_accepted_input_is_one_the_reader_looks_up(key: str) -> None:
    """The hwmon reader looks inputs up by their sysfs names, in4, temp2, fan1
    (Documentation/hwmon/sysfs-interface.rst); a key it would never look up is refused, not accepted and unused."""
    try:
        maps = load(render([{"match": "nct6798-isa-*", key: {"label": "+12V"}}]))
    except SensorMapError:
        return
    (chip_map,) = maps
    assert all(re.fullmatch("(in|temp|fan)[0-9]+", k) for k in chip_map.inputs), key  # type: ignore[attr-defined]


@PROPERTY
@given(
    st.one_of(st.floats(), st.integers(-(10**400), 10**400), st.booleans()),
    st.one_of(st.floats(), st.integers(-(10**400), 10**400), st.booleans()),
)
def test_property_accepted_volts_are_positive_and_finite(nominal: float, minimum: float) -> None:
    """TOML has nan, inf and integers of any size; a mapping's volts are a positive finite number or a SensorMapError
    naming the key, never a NaN limit no alert can compare against, nor an OverflowError traceback."""
    try:
        maps = load(render([{"match": "nct6798-isa-*", "in4": {"nominal": nominal, "min": minimum}}]))
    except SensorMapError as exc:
        assert "chip[0].in4." in str(exc)
        return
    mapping = maps[0].inputs["in4"]  # type: ignore[attr-defined]
    for volts in (mapping.nominal, mapping.min):
        assert math.isfinite(volts) and volts > 0


DIVIDER = st.integers(1, 200)
COMPUTES = st.one_of(
    DIVIDER.map(lambda n: (f"@*{n}", lambda x, n=n: x * n)),
    DIVIDER.map(lambda n: (f"@/{n}, @*{n}", lambda x, n=n: x / n)),
    st.tuples(DIVIDER, DIVIDER).map(lambda ab: (f"@*(1+{ab[0]}/{ab[1]})", lambda x, a=ab[0], b=ab[1]: x * (1 + a / b))),
    st.tuples(DIVIDER, DIVIDER).map(lambda ab: (f"(@ - {ab[0]}) * {ab[1]}", lambda x, a=ab[0], b=ab[1]: (x - a) * b)),
    st.just(("-@", lambda x: -x)),
)


@PROPERTY
@given(
    st.integers(0, 99),
    TOML_TEXT.filter(bool),
    COMPUTES,
    st.floats(0.5, 60),
    st.floats(0.1, 60),
    st.floats(-1e4, 1e4, allow_nan=False),
)
def test_property_a_valid_mapping_loads_back_and_computes_as_written(
    pin: int, label: str, compute: tuple[str, object], nominal: float, minimum: float, raw: float
) -> None:
    text, expected = compute
    doc = [{"match": "nct6798-isa-*", "board": "Pro WS *", f"in{pin}": {"label": label, "compute": text}}]
    doc[0][f"in{pin}"].update(nominal=nominal, min=minimum)  # type: ignore[union-attr]
    maps = load(render(doc))
    mapping = find_input(maps, "nct6798-isa-0290", "Pro WS WRX80E-SAGE SE WIFI", f"in{pin}")  # type: ignore[arg-type]
    assert mapping is not None and (mapping.label, mapping.nominal, mapping.min) == (label, nominal, minimum)
    assert mapping.scale(raw) == pytest.approx(expected(raw))  # type: ignore[operator]
    assert find_input(maps, "nct6798-isa-0290", "PRIME X670E", f"in{pin}") is None  # type: ignore[arg-type]
    assert find_input(maps, "it8686-isa-0a40", "Pro WS WRX80E-SAGE SE WIFI", f"in{pin}") is None  # type: ignore[arg-type]


@PROPERTY
@given(st.one_of(st.text(max_size=250), st.text("@0123456789.+-*/() ,", max_size=250)))
def test_property_a_compute_expression_parses_or_is_a_value_error(text: str) -> None:
    try:
        compute = Compute.parse(text)
    except ValueError:
        return
    assert isinstance(compute.apply(1.5), float)
