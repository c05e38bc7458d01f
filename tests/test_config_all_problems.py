"""A configuration with several problems reports them all at once, each naming where it comes from: the file and the
key, or the flag that set it (never `defaults: simulated.scenario` for a bad --scenario)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch.config.settings import ConfigError, load_config


def test_every_problem_at_once(tmp_path: Path) -> None:
    path = tmp_path / "gpuwatch.toml"
    path.write_text('[agent]\npoll_interval_seconds = -1\nlisten = "x"\nbogus = 1\n[probe]\nengine = "numpy"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, {"simulated": {"scenario": "nope"}})
    keys = [(p.source, p.flag or p.key) for p in info.value.problems]
    # What a value is (unknown key, wrong type, not one of the choices) is checked as it is read; ranges after.
    assert keys == [
        (str(path), "agent.bogus"),
        (str(path), "probe.engine"),
        (str(path), "agent.poll_interval_seconds"),
        (str(path), "agent.listen"),
        ("command line", "--scenario"),
    ]
    text = str(info.value)
    assert text.startswith(f"{path}: agent.bogus: unknown key") and text.count("\n  ") == 4, text
    assert info.value.key == "agent.bogus"  # the first problem's, for callers that read one


def test_a_bad_scenario_flag_is_blamed_on_the_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "run", "--backend", "simulated", "--scenario", "nope"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 78
    assert "command line: --scenario: must be one of healthy, mixed" in result.stderr, result.stderr
    assert "defaults" not in result.stderr


def test_an_override_no_flag_names_is_named_by_its_key() -> None:
    with pytest.raises(ConfigError, match=r"^command line: host\.ipmi_interval_seconds: must be between"):
        load_config(None, {"host": {"ipmi_interval_seconds": 1.0}})
