"""The files gpuwatch ships beside its code (alert rules, Alertmanager routing, runbooks, units), found where this
install keeps them: inside the package when installed from a wheel or a .deb (setup.py copies them into
gpuwatch/_shipped/), in the checkout for an editable install. Paths are named as in the repository, so one name
works in both."""

from __future__ import annotations

from pathlib import Path

import gpuwatch

_PACKAGE = Path(gpuwatch.__file__).resolve().parent  # the package, whichever module of it this is
_INSTALLED = _PACKAGE / "_shipped"
_CHECKOUT = _PACKAGE.parent


class ShippedFileMissing(FileNotFoundError):
    """A file this install should carry is not there: a broken or partial install, never bad input."""


def shipped_file(relative: str) -> Path:
    """The path of a shipped file named as in the repository (``deploy/prometheus/gpuwatch-alerts.yml``)."""
    for base in (_INSTALLED, _CHECKOUT):
        candidate = base / relative
        if candidate.is_file():
            return candidate
    raise ShippedFileMissing(
        f"{relative} is missing from this install of gpuwatch (looked in {_INSTALLED} and {_CHECKOUT}): "
        "reinstall the gpuwatch-agent package, or run from a whole checkout"
    )
