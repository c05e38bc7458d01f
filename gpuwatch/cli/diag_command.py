"""`gpuwatch diag`: deep tests on idle GPUs (docs/diag.md), each GPU's in a child process pinned to it, under
deadlines; the results printed (a table, or --json), written to the state dir for the agent (`diag_results.json`:
metrics, findings, the fault ledger) and summed up in the exit status."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatch.cli.probe_command import NodeUnavailable, polled_node
from gpuwatch.collectors.workloads import WorkloadsSection
from gpuwatch.config.settings import Config
from gpuwatch.core.exitcodes import EXIT_CONFIG, EXIT_NOT_OK, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from gpuwatch.files.statedir import STATE_DIR_MODE, StateDirUnsafe, require_safe_state_dir
from gpuwatch.files.statefile import StateDirError
from gpuwatch.probe.diag import DiagRefused, DiagRunner, GpuDiag, NoSuchGpu
from gpuwatch.probe.diag_node import node_tests
from gpuwatch.probe.diag_results import record_results
from gpuwatch.probe.locks import LockUnavailable
from gpuwatch.readers.procfs import Procfs


def diag(config: Config, *, level: int, gpus: list[int], as_json: bool, force: bool) -> int:
    """Run the level's tests; exit 0 when none failed, 1 when one did, 69 when it cannot run."""
    code, diags = run_diag(config, level=level, gpus=gpus, force=force)
    if diags is None:
        return code
    if as_json:
        print(json.dumps(document(diags, level), indent=2))
    else:
        print_table(diags)
    return code


def run_diag(
    config: Config,
    *,
    level: int,
    gpus: list[int],
    force: bool,
    progress: Callable[[str], None] | None = None,
    with_dcgm: bool = True,
    command: str = "diag",
) -> tuple[int, list[GpuDiag] | None]:
    """Run the diag and write its results for the agent: the exit status, and the results (None when it could not
    run, said on stderr)."""
    say = progress or (lambda text: print(text, file=sys.stderr, flush=True))
    try:
        require_safe_state_dir(config.state_dir)
    except StateDirUnsafe as exc:
        print(f"gpuwatch {command}: {exc}", file=sys.stderr)
        return EXIT_CONFIG, None
    with contextlib.suppress(OSError):
        config.state_dir.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
    which = shutil.which if with_dcgm else (lambda _name: None)
    try:
        with polled_node(config) as (store, sources):
            runner = DiagRunner(
                store,
                config.state_dir,
                sources.diag_launcher,
                level=level,
                idle_utilization_ratio=config.probe.idle_utilization_ratio,
                progress=say,
                node_tests=functools.partial(node_tests, which=which),
                describe=_describer(sources.procfs or Procfs(Path(config.section(WorkloadsSection).procfs_root))),
            )
            diags = runner.run(runner.choose(set(gpus), force=force))
    except NoSuchGpu as exc:
        print(f"gpuwatch {command}: {exc}", file=sys.stderr)
        return EXIT_USAGE, None
    except (NodeUnavailable, LockUnavailable, DiagRefused) as exc:
        print(f"gpuwatch {command}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE, None
    try:
        path = record_results(config.state_dir, [d.record(level, time.time()) for d in diags])
        say(f"results written to {path} (the agent exports them within a poll interval)")
    except StateDirError as exc:
        print(f"gpuwatch {command}: the results could not be written for the agent: {exc}", file=sys.stderr)
    if any(t.result == "fail" for d in diags for t in d.tests):
        return EXIT_NOT_OK, diags
    if all(t.result == "skip" for d in diags for t in d.tests):
        print(f"gpuwatch {command}: no test could run (each skip says why)", file=sys.stderr)
        return EXIT_UNAVAILABLE, diags
    return EXIT_OK, diags


def _describer(procfs: Procfs) -> Callable[[int], str]:
    """A GPU process as the workloads collector names it: `PID 4711 (slurm_job 1234, user alice)`."""

    def describe(pid: int) -> str:
        owner = procfs.owner(pid)
        if isinstance(owner, str):
            return f"PID {pid} ({owner})"
        return f"PID {pid} ({owner.workload.kind} {owner.workload.id}, user {owner.user})"

    return describe


def failures(diags: list[GpuDiag]) -> list[str]:
    """Each failed test as `GPU i test: detail`."""
    return [f"GPU {d.identity.index} {t.name}: {t.detail}" for d in diags for t in d.tests if t.result == "fail"]


def document(diags: list[GpuDiag], level: int) -> dict[str, Any]:
    return {"level": level, "gpus": [d.as_json() for d in diags]}


def print_table(diags: list[GpuDiag]) -> None:
    print(f"{'GPU':>3}  {'test':<10} {'result':<6} {'s':>6}  detail")
    for d in diags:
        for t in d.tests:
            print(f"{d.identity.index:>3}  {t.name:<10} {t.result:<6} {t.seconds:>6.1f}  {t.detail}")
