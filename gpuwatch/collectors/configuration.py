"""The agent's whole configuration: the config layer's sections and each registered collector's own, the section
its module declares as SETTINGS (gpuwatch/registry.py names the modules). Every command and the service load through
here, so a collector's section is read, validated and reported with the rest, and a new one edits no shared file."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from gpuwatch.config.settings import CollectorSection, Config, load_settings
from gpuwatch.registry import REGISTRY


def collector_sections() -> list[type[CollectorSection]]:
    """The sections the registered collectors declare, in registry order (each once: siblings may share one)."""
    found: list[type[CollectorSection]] = []
    for registration in REGISTRY:
        section = getattr(importlib.import_module(registration.module), "SETTINGS", None)
        if section is not None and section not in found:
            found.append(section)
    return found


def load_config(path: Path | None, overrides: dict[str, dict[str, Any]] | None = None) -> Config:
    """Read the TOML file (None: defaults only), apply flag overrides, validate every section: ConfigError names
    each problem with its file or flag and key."""
    return load_settings(path, overrides, collector_sections())
