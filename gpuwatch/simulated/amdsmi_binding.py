"""Import a fresh copy of AMD's own ``amdsmi`` Python package over a library object of our choosing.

The package's ``amdsmi_wrapper.py`` finds libamd_smi.so at import (``find_smi_library()`` ->
``ctypes.CDLL(location)``, amdsmi 7.0.2 amdsmi_wrapper.py:179-204) and binds every C function it wraps right then
(``amdsmi_x = _libraries['libamd_smi.so'].amdsmi_x`` plus ``.restype``/``.argtypes``). So the vendor's Python runs
unmodified over a simulated C library when ``ctypes.CDLL`` answers that library for libamd_smi.so during the
import, and only then. Each copy lives under its own module name, so several simulated nodes and several amdsmi
releases coexist in one process; the copies are not left in ``sys.modules`` (the caller holds the package).
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

# Extracted wheels of further amdsmi releases: <venv>/bindings/amdsmi-<version>/amdsmi/ (scripts/test.sh makes them).
BINDINGS_ROOT = Path(sys.prefix) / "bindings"
LIBRARY_NAME = "libamd_smi.so"

_patch_lock = threading.Lock()  # ctypes.CDLL is process-wide: one patched import at a time
_copies = itertools.count()
_BOUND = re.compile(r"^(amdsmi_\w+) = _libraries\['libamd_smi\.so'\]\.(\w+)$", re.MULTILINE)


def installed_package() -> Path:
    """The directory of the amdsmi package installed in this environment, found without executing it."""
    spec = importlib.util.find_spec("amdsmi")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the amdsmi Python package is not installed", name="amdsmi")
    return Path(next(iter(spec.submodule_search_locations)))


def binding_package(version: str | None = None) -> Path:
    """The package directory of amdsmi ``version``: the installed one when it is that version (or None),
    else the extracted wheel under BINDINGS_ROOT. FileNotFoundError names the directory when it is missing."""
    installed = installed_package()
    if version is None or package_version(installed) == version:
        return installed
    package = BINDINGS_ROOT / f"amdsmi-{version}" / "amdsmi"
    if not (package / "__init__.py").is_file():
        raise FileNotFoundError(f"amdsmi {version} is not extracted at {package} (scripts/test.sh puts it there)")
    return package


def package_version(package: Path) -> str:
    """``__version__`` of the package at ``package``, read from its _version.py without importing it."""
    found = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", (package / "_version.py").read_text())
    return found.group(1) if found else ""


def bound_symbols(package: Path) -> frozenset[str]:
    """Every libamd_smi.so symbol the package's wrapper binds at import: the library must export all of them."""
    return frozenset(symbol for _, symbol in _BOUND.findall((package / "amdsmi_wrapper.py").read_text()))


def import_amdsmi(package: Path, library: Callable[[], Any]) -> ModuleType:
    """A fresh copy of the amdsmi package at ``package`` whose ``ctypes.CDLL('…/libamd_smi.so')`` got
    ``library()``; an OSError from ``library()`` is what the package meets on a host without ROCm (it prints and
    raises KeyError('libamd_smi.so'), amdsmi_wrapper.py:203-211). Other CDLL calls go to the real ctypes.CDLL."""
    name = f"_gpuwatch_amdsmi_{next(_copies)}"
    spec = importlib.util.spec_from_file_location(
        name, package / "__init__.py", submodule_search_locations=[str(package)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    real_cdll = ctypes.CDLL

    def cdll(location: Any, *args: Any, **kwargs: Any) -> Any:
        if os.path.basename(os.fspath(location)) == LIBRARY_NAME:
            return library()
        return real_cdll(location, *args, **kwargs)

    with _patch_lock:
        ctypes.CDLL = cdll  # type: ignore[misc,assignment]
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            ctypes.CDLL = real_cdll  # type: ignore[misc]
            for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                del sys.modules[key]
    return module
