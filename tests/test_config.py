"""Configuration: TOML + flags, and every bad input named precisely (exit 78 from the CLI)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Literal, get_args, get_origin, get_type_hints

import pytest

from gpuwatch.collectors.configuration import load_config
from gpuwatch.config.settings import _SECTIONS, ConfigError, _coerce, parse_listen


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults_without_a_file() -> None:
    config = load_config(None)
    assert config.agent.listen == ":9845"
    assert config.agent.poll_interval_seconds == 1.0
    assert config.agent.backend == "auto"
    assert config.source == "defaults"


def test_file_values_and_flag_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[agent]\nlisten = "127.0.0.1:9000"\npoll_interval_seconds = 2\n'
        "[gpus]\nexpected_nvidia = 8\npower_limit_watts = 650\n",
    )
    config = load_config(path, {"agent": {"poll_interval_seconds": 0.5}})
    assert config.agent.listen == "127.0.0.1:9000"
    assert config.agent.poll_interval_seconds == 0.5  # the flag wins
    assert config.gpus.expected_nvidia == 8
    assert config.gpus.power_limit_watts == 650.0
    assert config.expected_gpus("nvidia") == 8
    assert config.expected_gpus("amd") is None


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("[agnet]\n", "[agnet]", "did you mean 'agent'"),
        ('[agent]\nlisten_adress = ":1"\n', "agent.listen_adress", "did you mean 'listen'"),
        ('[agent]\npoll_interval_seconds = "fast"\n', "agent.poll_interval_seconds", "must be a number"),
        ("[agent]\npoll_interval_seconds = 0\n", "agent.poll_interval_seconds", "between 0.05 and 3600"),
        ('[agent]\nbackend = "cuda"\n', "agent.backend", "must be one of auto, nvml, amdsmi, simulated, got 'cuda'"),
        ('[host]\nipmi = "yes"\n', "host.ipmi", "must be one of auto, on, off, got 'yes'"),
        ("[host]\nipmi = true\n", "host.ipmi", "must be one of auto, on, off, got True"),
        ('[probe]\ndtype = "FP16"\n', "probe.dtype", "must be one of bf16, fp16, fp32, got 'FP16'"),
        ("[simulated]\nvendor = 1\n", "simulated.vendor", "must be one of nvidia, amd, got 1"),
        ('[agent]\nlisten = "9845"\n', "agent.listen", "is not HOST:PORT"),
        ('[agent]\nlisten = ":99999"\n', "agent.listen", "from 0 to 65535"),
        ('[agent]\ndisable_collectors = ["gpu"]\n', "agent.disable_collectors", "no collector"),
        ("[gpus]\nexpected_nvidia = true\n", "gpus.expected_nvidia", "whole number"),
        ("[gpus]\nexpected_nvidia = -1\n", "gpus.expected_nvidia", "between 0 and 1024"),
        ("agent = 3\n", "agent", "must be a [agent] table"),
        ("[agent]\nslow_poll_interval_seconds = 0.1\n", "agent.slow_poll_interval_seconds", "at least the poll"),
    ],
)
def test_bad_values_name_the_file_key_and_problem(tmp_path: Path, text: str, key: str, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == key
    assert problem in info.value.problem
    assert str(path) in str(info.value)


def test_every_closed_choice_names_its_choices(tmp_path: Path) -> None:
    """Each Literal-typed key refuses a value outside its choices with the operator's error, naming every choice
    (a new closed choice gets this for free, and mypy checks the code that reads it)."""
    closed = [
        (section, f.name, get_args(hint))
        for section, cls in _SECTIONS.items()
        for f in fields(cls)
        if get_origin(hint := get_type_hints(cls)[f.name]) is Literal
    ]
    assert {f"{s}.{k}" for s, k, _ in closed} >= {"agent.backend", "agent.log_level", "host.ipmi", "probe.engine"}
    for section, key, choices in closed:
        with pytest.raises(ConfigError) as info:
            load_config(write(tmp_path, f'[{section}]\n{key} = "nonsense"\n'))
        assert (
            str(info.value)
            == f"{tmp_path / 'config.toml'}: {section}.{key}: must be one of " + ", ".join(choices) + ", got 'nonsense'"
        )
        for choice in choices:
            assert (
                getattr(getattr(load_config(write(tmp_path, f'[{section}]\n{key} = "{choice}"\n')), section), key)
                == choice
            )


def test_every_field_type_has_a_check() -> None:
    """_coerce knows every field type the sections use: each default goes through it unchanged."""
    for section, cls in _SECTIONS.items():
        for f in fields(cls):
            default = getattr(cls(), f.name)
            value = list(default) if isinstance(default, tuple) else default
            assert _coerce("t", f"{section}.{f.name}", get_type_hints(cls)[f.name], value) == default


def test_unparsable_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[agent\n"))
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.toml")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(binary)


def test_bad_flag_value_is_named_as_command_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {"agent": {"poll_interval_seconds": -1.0}})
    assert info.value.key == "agent.poll_interval_seconds"


@pytest.mark.parametrize(
    ("listen", "expected"),
    [(":9845", ("", 9845)), ("127.0.0.1:1", ("127.0.0.1", 1)), ("[::1]:9845", ("::1", 9845))],
)
def test_parse_listen(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


def test_state_dir_from_systemd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/gpuwatch-test")
    assert load_config(None).state_dir == Path("/var/lib/gpuwatch-test")
    assert load_config(None, {"agent": {"state_dir": "/tmp/x"}}).state_dir == Path("/tmp/x")


def test_example_config_is_valid_and_complete() -> None:
    """The shipped example names every key with its default, so the README and the file cannot drift."""
    example = Path(__file__).resolve().parent.parent / "deploy" / "config.example.toml"
    config = load_config(example)
    assert config.agent == load_config(None).agent
    text = example.read_text()
    for section in ("agent", "simulated", "gpus", "xid", "compat"):
        for f in fields(getattr(config, section)):
            assert f"{f.name} =" in text, f"{section}.{f.name} is not documented in {example.name}"


def test_unknown_scenario_is_a_config_error() -> None:
    """Found in review: an unknown simulated.scenario passed validation; now a ConfigError naming the key (exit 78)."""
    with pytest.raises(ConfigError) as info:
        load_config(None, {"simulated": {"scenario": "nosuch"}})
    assert info.value.key == "simulated.scenario"


def test_the_mig_scenario_on_an_amd_node_is_a_config_error_that_says_what_to_do() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {"simulated": {"scenario": "mig", "vendor": "amd"}})
    assert info.value.key == "simulated.scenario" and "vendor nvidia" in str(info.value)
