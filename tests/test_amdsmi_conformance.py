"""The simulated ``amdsmi`` module agrees with the real package's interface: functions and their parameters, enums
and their values, the event reader, exception classes and status codes.

The real package cannot be imported without ROCm (its import raises KeyError('libamd_smi.so')), so its source is
read with ast: 7.0.2 from the package the dev extra installs, 6.4.3 from a snapshot taken from its wheel
(tests/data/amdsmi-6.4.3-interface.json, provenance inside).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest
from amdsmi_source import read_interface

from gpuwatch.backends.amdsmi import load_amdsmi
from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.simulated import amdsmi_types
from gpuwatch.simulated.amdsmi_lib import PUBLIC_FUNCTIONS, SimulatedAmdSmi, import_simulated_amdsmi
from gpuwatch.simulated.scenarios import SimulatedNode

DATA = Path(__file__).parent / "data"


def _installed_package() -> Path:
    spec = importlib.util.find_spec("amdsmi")  # finds the package without executing it
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the amdsmi package is not installed: bash scripts/test.sh installs the dev extra (amdsmi==7.0.2)")
    return Path(next(iter(spec.submodule_search_locations)))


def _real(version: str) -> dict[str, Any]:
    if version == "7.0":
        package = _installed_package()
        assert (package / "_version.py").read_text().count("7.0.2") == 1, "the dev extra pins amdsmi==7.0.2"
        return read_interface(package)
    return json.loads((DATA / "amdsmi-6.4.3-interface.json").read_text())


def _sim(shape: str) -> SimulatedAmdSmi:
    return import_simulated_amdsmi(SimulatedNode("healthy", gpus=1, vendor="amd"), shape=shape)  # type: ignore[arg-type]


def _params(function: Any) -> list[list[Any]]:
    return [
        [p.name, p.default is not inspect.Parameter.empty]
        for p in inspect.signature(function).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


VERSIONS = pytest.mark.parametrize("version", ["7.0", "6.4"])


@VERSIONS
def test_every_simulated_function_exists_with_the_real_parameters(version: str) -> None:
    real, sim = _real(version), _sim(version)
    assert PUBLIC_FUNCTIONS, "the simulated module has functions"
    for name in PUBLIC_FUNCTIONS:
        assert name in real["functions"], f"{name} is not a function of amdsmi {version}"
        assert _params(getattr(sim, name)) == real["functions"][name], name


@VERSIONS
def test_every_function_the_backend_calls_is_real_and_simulated(version: str) -> None:
    source = (Path(__file__).parents[1] / "gpuwatch" / "backends" / "amdsmi.py").read_text()
    called = set(re.findall(r'"(amdsmi_[a-z0-9_]+)"', source))
    assert len(called) > 15
    real = _real(version)
    for name in called:
        assert name in real["functions"], f"the backend calls {name}, which amdsmi {version} lacks"
        assert hasattr(_sim(version), name), f"the simulated module lacks {name}"


@VERSIONS
def test_enums_have_the_real_members_and_values(version: str) -> None:
    real = _real(version)["enums"]
    for enum in amdsmi_types.ENUMS:
        assert enum.__name__ in real, enum.__name__
        for member, value in enum.__members__.items():
            assert real[enum.__name__].get(member) == int(value), f"{enum.__name__}.{member} in amdsmi {version}"


@VERSIONS
def test_event_reader_and_exceptions_match(version: str) -> None:
    real = _real(version)
    reader = _sim(version).AmdSmiEventReader  # type: ignore[attr-defined]
    for method in ("__init__", "read", "stop"):
        assert _params(getattr(reader, method))[1:] == real["classes"]["AmdSmiEventReader"][method], method
    for cls in amdsmi_types.EXCEPTIONS:
        facts = real["exceptions"][cls.__name__]
        assert [b.__name__ for b in cls.__bases__] == facts["bases"], cls.__name__
        init = cls.__dict__.get("__init__")
        assert (_params(init)[1:] if init is not None else None) == facts["init"], cls.__name__
        assert set(facts["methods"]) <= set(cls.__dict__), cls.__name__


@VERSIONS
def test_status_codes_match(version: str) -> None:
    real = _real(version)["status"]
    for name, value in amdsmi_types.STATUS.items():
        assert real[name] == value, name


def test_the_real_import_fails_with_key_error_and_the_backend_says_library_not_found() -> None:
    """The installed package without ROCm: its import raises KeyError, which never escapes load_amdsmi."""
    _installed_package()
    with pytest.raises(BackendUnavailable, match="AMD SMI library not found"):
        load_amdsmi()


def test_the_simulated_import_fails_the_same_way() -> None:
    node = SimulatedNode("backend_down", gpus=2, vendor="amd")
    with pytest.raises(KeyError, match=r"libamd_smi\.so"):
        import_simulated_amdsmi(node)
    with pytest.raises(BackendUnavailable, match="AMD SMI library not found"):
        load_amdsmi(lambda: import_simulated_amdsmi(node))
