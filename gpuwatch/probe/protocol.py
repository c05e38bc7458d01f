"""What the probe runner (in the agent) and its worker child (`python -m gpuwatch.probe.worker`) agree on, in a module
of its own: the agent imports these without loading the worker's code."""

from __future__ import annotations

EXIT_NO_ENGINE = 3  # the worker's exit status when no engine can run on this GPU
CAPPED_LINE = "capped"  # what the runner writes to stdin when the GPU reached its power limit
