"""The simulated libamd_smi.so agrees with what AMD's amdsmi package (7.0.2 and 6.4.3) expects of the real one:
C prototypes as the wrapper declares them, amdsmi.h status codes and enum values, symbol table, handle and status
semantics, and the import that fails without the library. Line numbers are amdsmi 7.0.2's unless said otherwise.
"""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from amd_releases import over_releases

from gpuwatch.backends.amdsmi import AmdSmiBackend, load_amdsmi
from gpuwatch.backends.base import BackendUnavailable
from gpuwatch.simulated import amdsmi_readings
from gpuwatch.simulated.amdsmi_binding import binding_package, bound_symbols, installed_package, package_version
from gpuwatch.simulated.amdsmi_clib import PROTOTYPES, Status
from gpuwatch.simulated.amdsmi_sim import BINDINGS, INSTALLED, library_of, simulated_amdsmi
from gpuwatch.simulated.scenarios import SimulatedNode

# Functions the backend asks for that older amdsmi releases lack: the first release with each. The backend reads
# them through its choke point, where a missing function is a value not available (never an error).
NEWER_FUNCTIONS = {"amdsmi_get_gpu_bad_page_threshold": "7.0"}


def _amdsmi(release: str, gpus: int = 1, scenario: str = "healthy") -> ModuleType:
    return simulated_amdsmi(SimulatedNode(scenario, gpus=gpus, vendor="amd"), binding=release)


def _kind(ctype: Any) -> tuple[str, int]:
    """What a C argument is at the ABI: a pointer, or a signed/unsigned integer or float of a width."""
    if ctype is None:
        return ("void", 0)
    code = getattr(ctype, "_type_", None)
    if issubclass(ctype, ctypes._Pointer | ctypes.Array) or code in ("P", "z", "Z"):
        return ("pointer", ctypes.sizeof(ctypes.c_void_p))
    assert isinstance(code, str), ctype
    kind = "float" if code in "fdg" else "signed" if code.islower() else "unsigned"
    return (kind, ctypes.sizeof(ctype))


def test_the_installed_package_is_the_release_the_tests_name() -> None:
    assert package_version(installed_package()) == INSTALLED, "the dev extra pins amdsmi==7.0.2"


@over_releases
def test_prototypes_match_the_argtypes_the_wrapper_assigns(release: str) -> None:
    """The wrapper sets .restype/.argtypes on every function it binds (e.g. amdsmi_wrapper.py:2916-2918); ctypes
    converts by those and our callback reads by its prototype, so each argument must agree in kind and width."""
    wrapper = _amdsmi(release).amdsmi_wrapper
    symbols = bound_symbols(binding_package(release))
    checked = 0
    for name, argtypes in PROTOTYPES.items():
        if name not in symbols:
            continue
        function = getattr(wrapper, name)
        assert _kind(function.restype) == _kind(ctypes.c_uint32), name  # amdsmi_status_t
        assert [_kind(a) for a in function.argtypes] == [_kind(a) for a in argtypes], name
        checked += 1
    assert checked >= len(PROTOTYPES) - 1  # 7.0 dropped amdsmi_get_power_info_v2


def test_every_prototype_is_bound_by_some_release() -> None:
    """No dead prototypes: each simulated function is one a supported release's wrapper binds."""
    symbols: set[str] = set()
    for release in BINDINGS:
        try:
            symbols |= bound_symbols(binding_package(release))
        except FileNotFoundError as exc:
            pytest.skip(str(exc))
    assert set(PROTOTYPES) <= symbols


@over_releases
def test_status_codes_and_enum_values_are_amdsmi_h(release: str) -> None:
    """The library's own statuses and the enum values it reads or writes, against amdsmi_wrapper.py:337-382 and
    the enum blocks (e.g. AMDSMI_TEMPERATURE_TYPE_HOTSPOT at :548)."""
    wrapper = _amdsmi(release).amdsmi_wrapper
    for status in Status:
        assert getattr(wrapper, f"AMDSMI_STATUS_{status.name}") == status.value, status.name
    for name, value in amdsmi_readings.C.items():
        assert getattr(wrapper, name) == value, name


@over_releases
def test_the_backend_reaches_only_simulated_functions(release: str) -> None:
    """Every function the backend names exists in the release, and what they call in the library is simulated:
    a NOT_SUPPORTED stub there would hide a reading the real library gives."""
    source = (Path(__file__).parents[1] / "gpuwatch" / "backends" / "amdsmi.py").read_text()
    called = set(re.findall(r'"(amdsmi_[a-z0-9_]+)"', source))
    amdsmi = _amdsmi(release, gpus=2, scenario="busy")
    assert len(called) > 15
    for name in called:
        first = NEWER_FUNCTIONS.get(name)
        if first is not None and tuple(map(int, release.split(".")[:2])) < tuple(map(int, first.split("."))):
            assert getattr(amdsmi, name, None) is None, f"{name} is in amdsmi {release}: drop it from NEWER_FUNCTIONS"
            continue
        assert callable(getattr(amdsmi, name, None)), f"the backend calls {name}, which amdsmi {release} lacks"
    backend = AmdSmiBackend(amdsmi)
    backend.open()
    try:
        backend.poll(slow=True)
        backend.poll(slow=False)
        backend.wait_events(0.0)
        backend.versions()
        backend._read_violation_status(backend._gpus[0], 0.0)  # the slow-tier fallback where gpu_metrics lacks it
    finally:
        backend.close()
    assert library_of(amdsmi).unsupported_calls == {}


@over_releases
def test_symbols_not_simulated_answer_not_supported_and_unknown_ones_are_undefined(release: str) -> None:
    """The wrapper binds every symbol at import (amdsmi_wrapper.py:211 and on), so each must exist; a feature the
    simulation lacks is AMDSMI_STATUS_NOT_SUPPORTED (2), raised as AmdSmiLibraryException (amdsmi_interface.py:698).
    A symbol the release does not bind is undefined, as ctypes.CDLL raises AttributeError for it."""
    amdsmi = _amdsmi(release)
    amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
    handle = amdsmi.amdsmi_get_processor_handles()[0]
    with pytest.raises(amdsmi.AmdSmiLibraryException) as raised:
        amdsmi.amdsmi_get_gpu_fan_rpms(handle, 0)
    assert raised.value.get_error_code() == Status.NOT_SUPPORTED
    with pytest.raises(AttributeError, match="undefined symbol"):
        library_of(amdsmi).amdsmi_no_such_function  # noqa: B018 - the lookup is the test
    amdsmi.amdsmi_shut_down()


@over_releases
def test_handles_and_library_state(release: str) -> None:
    """amdsmi.h: calls before amdsmi_init are NOT_INIT (32); a handle the library never gave is INVAL (1); handles
    are opaque pointers the package wraps in c_void_p (amdsmi_interface.py:969), distinct per processor."""
    amdsmi = _amdsmi(release, gpus=2)
    with pytest.raises(amdsmi.AmdSmiLibraryException) as raised:
        amdsmi.amdsmi_get_processor_handles()
    assert raised.value.get_error_code() == Status.NOT_INIT
    amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
    handles = amdsmi.amdsmi_get_processor_handles()
    assert all(isinstance(h, ctypes.c_void_p) and h.value for h in handles) and len({h.value for h in handles}) == 2
    with pytest.raises(amdsmi.AmdSmiLibraryException) as raised:
        amdsmi.amdsmi_get_gpu_device_uuid(ctypes.c_void_p(12345))
    assert raised.value.get_error_code() == Status.INVAL
    with pytest.raises(amdsmi.AmdSmiParameterException):  # the package's own type check, before any C call
        amdsmi.amdsmi_get_gpu_device_uuid(handles[0].value)
    amdsmi.amdsmi_shut_down()


@over_releases
def test_a_python_error_inside_the_library_is_a_status_never_success(
    release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ctypes callback that raises returns 0 (AMDSMI_STATUS_SUCCESS) with the struct unfilled; the library
    answers AMDSMI_STATUS_INTERNAL_EXCEPTION (16, amdsmi_wrapper.py:353) instead."""

    def broken(struct: Any, state: Any) -> None:
        raise ZeroDivisionError("simulated bug")

    monkeypatch.setattr(amdsmi_readings, "engine_usage", broken)
    amdsmi = _amdsmi(release)
    amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
    with pytest.raises(amdsmi.AmdSmiLibraryException) as raised:
        amdsmi.amdsmi_get_gpu_activity(amdsmi.amdsmi_get_processor_handles()[0])
    assert raised.value.get_error_code() == Status.INTERNAL_EXCEPTION
    amdsmi.amdsmi_shut_down()


def test_copies_of_both_releases_coexist_and_leave_ctypes_as_it_was() -> None:
    """Each simulated node has its own package copy and library; ctypes.CDLL is patched only during the import."""
    cdll = ctypes.CDLL
    first, second = _amdsmi("7.0.2", gpus=1), _amdsmi("7.0.2", gpus=3)
    assert ctypes.CDLL is cdll
    assert first.AmdSmiLibraryException is not second.AmdSmiLibraryException
    assert library_of(first) is not library_of(second)
    assert not [name for name in sys.modules if name.startswith("_gpuwatch_amdsmi_")]
    for amdsmi, count in ((first, 1), (second, 3)):
        amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
        assert len(amdsmi.amdsmi_get_processor_handles()) == count
        amdsmi.amdsmi_shut_down()


def test_the_real_import_fails_with_key_error_and_the_backend_says_library_not_found() -> None:
    """The installed package without ROCm: its import raises KeyError (amdsmi_wrapper.py:203-211), which never
    escapes load_amdsmi."""
    installed_package()
    with pytest.raises(BackendUnavailable, match="AMD SMI library not found"):
        load_amdsmi()


@over_releases
def test_the_simulated_import_fails_the_same_way(release: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Without the library the vendor's wrapper prints and then fails binding its first symbol with
    KeyError('libamd_smi.so') (amdsmi_wrapper.py:203-211)."""
    node = SimulatedNode("backend_down", gpus=2, vendor="amd")
    with pytest.raises(KeyError, match=r"libamd_smi\.so"):
        simulated_amdsmi(node, binding=release)
    assert "Unable to find libamd_smi.so" in capsys.readouterr().out
    with pytest.raises(BackendUnavailable, match="AMD SMI library not found"):
        load_amdsmi(lambda: simulated_amdsmi(node, binding=release))
