"""Super-I/O sensor maps: the TOML file an operator writes (lm-sensors' sensors.conf in TOML), validated with an
error that names the file, the key and the problem, and the compute expressions applied to raw pin readings."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.host.sensormap import SensorMapError, load_sensor_maps

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
