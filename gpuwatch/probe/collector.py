"""The `probe` collector: the agent's scheduled probe round (gpuwatch/probe/runner.py), first run one interval after
start, never two at once."""

from __future__ import annotations

import logging

from gpuwatch.collector import CollectorContext, Every
from gpuwatch.probe.runner import ProbeRunner, agent_probe_runner

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
    runner = agent_probe_runner(context.config(), context.store, context.sources.probe_slowdown, context.clock)
    return [] if runner is None else [ProbeCollector(runner)]
