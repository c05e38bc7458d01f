"""The repository's own files that tests read: its root, and the names first agreed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SPEC_NAMES = REPO / "tests" / "fixtures" / "spec-names.json"


def spec_names() -> dict[str, Any]:
    """The names first agreed (metrics, collectors, alerts, commands, scenarios), kept in the repository: the list only
    grows, and no name on it is ever renamed or removed."""
    names: dict[str, Any] = json.loads(SPEC_NAMES.read_text())
    return names
