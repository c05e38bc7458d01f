"""The wheel carries the files the agent serves or starts from beside its code: the alert rules and recording rules,
the Alertmanager routing, the runbooks (served at /runbooks), the example config and the systemd units. Their one
source stays where operators and docs find them (deploy/, docs/, systemd/); the build copies them into
gpuwatch/_shipped/ under the same relative paths, where gpuwatch.files.shipped finds them. An editable install reads them
from the checkout instead. Everything else is in pyproject.toml."""

from __future__ import annotations

import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = (
    "deploy/prometheus/gpuwatch-alerts.yml",
    "deploy/prometheus/gpuwatch-rules.yml",
    "deploy/prometheus/optional/*.yml",
    "deploy/alertmanager/alertmanager.yml",
    "deploy/config.example.toml",
    "docs/runbooks.md",
    "systemd/*.service",
    "systemd/README.md",  # deploy/install.sh: the units' Documentation= (/opt/gpuwatch/share/doc/gpuwatch/)
    "README.md",
    "systemd/drop-ins/*.conf",
)


class BuildWithShippedFiles(build_py):
    """build_py, then the SHIPPED files into the built package (not in editable mode: gpuwatch.files.shipped reads the
    checkout there)."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        here = os.path.dirname(os.path.abspath(__file__))
        for pattern in SHIPPED:
            found = sorted(glob.glob(os.path.join(here, pattern)))
            if not found:
                raise SystemExit(f"setup.py: nothing matches the shipped file {pattern!r}; is this a whole checkout?")
            for source in found:
                relative = os.path.relpath(source, here)
                target = os.path.join(self.build_lib, "gpuwatch", "_shipped", relative)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(source, target)


setup(cmdclass={"build_py": BuildWithShippedFiles})
