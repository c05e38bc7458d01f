"""What the runner starts as a GPU's probe worker, and whether this node can run one: the runner's one seam.

The production launcher starts gpuwatch/probe/worker.py in isolated mode and asks this interpreter for an engine and
the kernel for the PID namespace. The composition layer (gpuwatch/simulated/node.py) gives the simulated node's launcher
instead, which starts gpuwatch/simulated/probe_worker.py as a real child the same way; the runner never knows which.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.core.model import GpuIdentity
from gpuwatch.probe.children import PID_NAMESPACE_PATH, pid_namespace_inode
from gpuwatch.probe.engines import available_engines

WORKER_MODULE = "gpuwatch.probe.worker"
# The worker runs as root: `-I` (isolated mode) keeps the working directory, PYTHONPATH and the user site out of its
# sys.path, so a file planted beside where `gpuwatch probe` was started (an argparse.py in /tmp) is never imported.
# gpuwatch's own root is appended after the installed packages, which still covers a source checkout on PYTHONPATH.
_BOOTSTRAP = "import sys; sys.path.append({root!r}); from {module} import main; sys.exit(main())"
WORKER_CWD = "/"  # a fixed, root-owned working directory: nothing the child opens by a relative name is planted


def worker_argv(module: str = WORKER_MODULE) -> list[str]:
    """A worker's command line: isolated mode, gpuwatch imported from where this process imported it, `module`'s
    main() run (the production worker unless the composition layer names another)."""
    import gpuwatch

    root = str(Path(gpuwatch.__file__).resolve().parent.parent)
    return [sys.executable, "-I", "-c", _BOOTSTRAP.format(root=root, module=module), "--json"]


def _production_command(_identity: GpuIdentity) -> list[str]:
    return worker_argv()


def _this_pid_namespace() -> int | None:
    return pid_namespace_inode(PID_NAMESPACE_PATH)


@dataclass(frozen=True, slots=True)
class WorkerLauncher:
    """How a probe worker starts on this node: the command for a GPU (the runner appends the probe's settings, the
    worker contract of gpuwatch/probe/worker.py), the engines it can run on (none: every probe is
    skipped_unsupported), and the PID namespace that NVML's process PIDs must be read in."""

    command: Callable[[GpuIdentity], Sequence[str]] = _production_command
    engines: Callable[[], list[str]] = available_engines
    pid_namespace_inode: Callable[[], int | None] = _this_pid_namespace
