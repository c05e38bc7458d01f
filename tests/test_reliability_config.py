"""Bad configuration input, fuzzed: every document ends in a valid Config or a ConfigError that names the problem,
never another exception; through the real CLI it is exit 0, 69 or 78 with a message, never a traceback."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.config.settings import _SECTIONS, Config, ConfigError, load_config

KNOWN_KEYS = {name: [f.name for f in dataclasses.fields(cls)] for name, cls in _SECTIONS.items()}
NAMES = sorted({*KNOWN_KEYS, *(k for keys in KNOWN_KEYS.values() for k in keys)})

# TOML scalars including the awkward ones: huge integers, NaN/inf, empty and non-ASCII strings, near-valid values.
SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, -1, 2**63 - 1, 64, 65, 1024, 3600, 86400, 10**400, -(10**400)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", "auto", "nvml", "simulated", "mixed", ":0", "127.0.0.1:0", "[::1]:0", "on", "bf16", "/"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
KEYS = st.one_of(st.sampled_from(NAMES), st.text(min_size=1, max_size=12))
SECTION = st.dictionaries(KEYS, VALUES, max_size=6)
DOCUMENT = st.dictionaries(st.one_of(st.sampled_from(sorted(KNOWN_KEYS)), KEYS), SECTION | VALUES, max_size=4)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string; a lone surrogate makes the document invalid, also worth a try
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(doc: dict[str, Any]) -> str:
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for name, table in doc.items():
        if isinstance(table, dict):
            lines.append(f"[{json.dumps(name)}]")
            lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def outcome(path: Path) -> Config | ConfigError:
    """load_config's answer; any exception other than ConfigError fails the test with its traceback."""
    try:
        return load_config(path)
    except ConfigError as exc:
        return exc


def assert_names_the_problem(path: Path, result: Config | ConfigError) -> None:
    if isinstance(result, ConfigError):
        text = str(result)
        assert text.startswith(str(path)), text
        assert result.problem.strip(), text
        assert "Traceback" not in text


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(DOCUMENT)
def test_fuzzed_toml_documents_are_valid_or_a_named_config_error(doc: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpuwatch.toml"
        path.write_text(toml_document(doc), encoding="utf-8", errors="surrogatepass")
        assert_names_the_problem(path, outcome(path))


@FUZZ
@given(st.sampled_from(sorted(KNOWN_KEYS)), st.data())
def test_every_known_key_with_a_random_value(section: str, data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(KNOWN_KEYS[section]))
    value = data.draw(VALUES)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpuwatch.toml"
        path.write_text(f"[{section}]\n{key} = {toml_value(value)}\n", encoding="utf-8", errors="surrogatepass")
        result = outcome(path)
        assert_names_the_problem(path, result)
        if isinstance(result, ConfigError):
            assert result.key == "" or result.key.startswith(f"{section}.") or result.key.startswith("["), result


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_are_a_named_config_error_or_valid(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpuwatch.toml"
        path.write_bytes(raw)
        assert_names_the_problem(path, outcome(path))


CLI_CASES = {
    "valid": ('[agent]\nbackend = "simulated"\nlisten = "127.0.0.1:0"\n', 0, ""),
    "not toml": ("[agent\nlisten = \n", 78, "not valid TOML"),
    "binary": ("\x00\xff\xfe garbage", 78, "invalid configuration"),
    "unknown section": ("[agnet]\n", 78, "did you mean 'agent'"),
    "wrong type": ('[agent]\npoll_interval_seconds = "fast"\n', 78, "agent.poll_interval_seconds"),
    "huge int": ("[simulated]\ngpus = 9223372036854775807\n", 78, "simulated.gpus"),
    "nan": ("[agent]\npoll_interval_seconds = nan\n", 78, "agent.poll_interval_seconds"),
    "table for a value": ("[probe]\nengine = {a = 1}\n", 78, "probe.engine"),
    "float overflow": ("[agent]\npoll_interval_seconds = 1" + "0" * 400 + "\n", 78, "agent.poll_interval_seconds"),
    "5000 digits": ("[simulated]\ngpus = 1" + "0" * 5000 + "\n", 78, "not a usable TOML document"),
    "nested deep": ("a = " + "[" * 5000 + "\n", 78, "not a usable TOML document"),
    "non-ASCII port": ('[agent]\nlisten = ":\u0663"\n', 78, "agent.listen"),
    "state dir unavailable": (
        '[agent]\nbackend = "simulated"\nlisten = "127.0.0.1:0"\nstate_dir = "/proc/1"\n',
        69,
        "FAIL",
    ),
}


def test_bad_configs_through_the_real_cli(tmp_path: Path) -> None:
    for name, (text, code, needle) in CLI_CASES.items():
        path = tmp_path / f"{name.replace(' ', '_')}.toml"
        path.write_bytes(text.encode("utf-8", errors="surrogateescape"))
        state = [] if "state_dir" in text else ["--state-dir", str(tmp_path / "state")]
        run = subprocess.run(
            [sys.executable, "-m", "gpuwatch", "check", "--config", str(path), *state],
            capture_output=True,
            text=True,
            timeout=60,
        )
        out = run.stdout + run.stderr
        assert run.returncode == code, (name, out)
        assert "Traceback" not in out, (name, out)
        assert needle in out, (name, out)
