"""The vendors' own Python bindings over simulated C libraries.

``simulated_pynvml(node)`` is nvidia-ml-py's ``pynvml`` module, unmodified, loaded afresh with a simulated
``libnvidia-ml.so.1`` (``libnvml.py``) where it would have loaded the driver's. Each call gives a module of its own
(its own library handle, function cache and init count), so several simulated nodes live in one process, and
``binding`` chooses another nvidia-ml-py's pynvml.py (tests run the oldest the project allows beside the newest).
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from gpuwatch.simulated.libnvml import SimulatedLibNvml
from gpuwatch.simulated.scenarios import SimulatedNode

_copies = itertools.count()
_import_lock = threading.Lock()


def installed_pynvml_path() -> Path:
    """pynvml.py of the installed nvidia-ml-py."""
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("nvidia-ml-py is not installed: pip install 'gpuwatch-agent[nvidia]'")
    return Path(spec.origin)


def load_module_copy(path: Path, prefix: str) -> ModuleType:
    """Execute a module's source as a new module (not the one ``import`` shares), registered while it runs:
    pynvml builds its error classes from ``sys.modules[__name__]``."""
    name = f"_gpuwatch_{prefix}_{next(_copies)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    with _import_lock:
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            del sys.modules[name]
    return module


def simulated_pynvml(node: SimulatedNode, *, binding: Path | None = None, **library_options: Any) -> ModuleType:
    """The real pynvml over a simulated libnvidia-ml of ``node`` (options: see ``SimulatedLibNvml``)."""
    module = load_module_copy(binding or installed_pynvml_path(), "pynvml")
    # What _LoadNvmlLibrary's CDLL would have set; it then loads nothing.
    setattr(module, "nvmlLib", SimulatedLibNvml(node, **library_options))  # noqa: B010
    return module
