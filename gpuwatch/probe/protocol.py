"""What the probe runner (in the agent) and its worker child (`python -m gpuwatch.probe.worker`) agree on, in a module
of its own: the agent imports these without loading the worker's code (the exit statuses:
gpuwatch/core/exitcodes.py)."""

from __future__ import annotations

CAPPED_LINE = "capped"  # what the runner writes to stdin when the GPU reached its power limit
