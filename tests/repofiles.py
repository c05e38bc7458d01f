"""The repository's own files that tests read: its root, and the names first agreed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SPEC_NAMES = REPO / "tests" / "fixtures" / "spec-names.json"


def spec_names() -> dict[str, Any]:
    """The names first agreed (metrics, collectors, alerts, commands, scenarios), kept in the repository: the list only
    grows, and no name on it is ever renamed or removed."""
    names: dict[str, Any] = json.loads(SPEC_NAMES.read_text())
    return names


def load_script(path: Path, name: str) -> ModuleType:
    """A script of the repository (a benchmark, a generator) imported as module `name`, registered in sys.modules so
    its dataclasses can look their module up by name."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
