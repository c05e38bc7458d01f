"""The `probe` collector: the agent's scheduled probe round (gpuwatch/probe/runner.py), first run one interval after
start, never two at once."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpuwatch.collector import CollectorContext, Every
from gpuwatch.config import Config
from gpuwatch.probe.launch import WorkerLauncher
from gpuwatch.probe.runner import ProbeRunner
from gpuwatch.store import SampleStore

log = logging.getLogger("gpuwatch.probe.runner")  # the line operators know, under the runner's logger


class ProbeCollector:
    name = "probe"
    schedule = Every("probe", first_run_now=False)

    def __init__(self, runner: ProbeRunner) -> None:
        self.runner = runner

    @property
    def interval_seconds(self) -> float:
        return self.runner.settings.interval_seconds

    def update(self) -> bool:
        try:
            self.runner.run()
        except Exception:
            log.exception("probe round failed unexpectedly")
            return False
        return True


def collectors(context: CollectorContext, name: str) -> list[ProbeCollector]:
    """The agent's probe, or none when it is off (interval 0)."""
    runner = agent_probe_runner(context.config(), context.store, context.sources.probe_launcher, context.clock)
    return [] if runner is None else [ProbeCollector(runner)]


def agent_probe_runner(
    config: Config,
    store: SampleStore,
    launcher: WorkerLauncher | None,
    clock: Callable[[], float] = time.time,
) -> ProbeRunner | None:
    """The agent's runner, or None when the probe is off (interval 0 or --disable-collector probe)."""
    if config.probe.interval_seconds <= 0 or "probe" in config.agent.disable_collectors:
        return None
    return ProbeRunner(config.probe, store, config.state_dir, launcher=launcher, clock=clock)
