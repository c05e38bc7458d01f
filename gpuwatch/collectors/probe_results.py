"""The `probe_results` collector: takes the probe results that a probe outside the agent handed over in the state
dir (`gpuwatch slurm epilog`, gpuwatch/probe/handoff.py) and records them as the agent records its own probes', so
its metrics, verdicts and baselines include them. Every poll interval, on its own job (a slow disk never delays the
poll); it reads a directory listing and nothing more when there is nothing to take."""

from __future__ import annotations

import logging

from gpuwatch.collectors.base import CheckLine, CollectorContext, Every
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.probe.handoff import pending, take_over

log = logging.getLogger(__name__)


class ProbeResultsCollector:
    name = "probe_results"
    schedule = Every("probe-results", lambda config: config.agent.poll_interval_seconds)

    def __init__(self, context: CollectorContext) -> None:
        self._context = context

    def update(self) -> bool:
        take_over(self._context.config().state_dir, self._context.store)
        return True


def collectors(context: CollectorContext, name: str) -> list[ProbeResultsCollector]:
    return [ProbeResultsCollector(context)]


def check(config: Config, sources: NodeSources, name: str) -> list[CheckLine]:
    """`gpuwatch check`: result files waiting mean the agent is not taking them (stopped, or this one disabled)."""
    waiting = pending(config.state_dir)
    if not waiting:
        return [CheckLine("ok", "probe results", f"none waiting in {config.state_dir}")]
    return [
        CheckLine(
            "warn",
            "probe results",
            f"{len(waiting)} handed-over probe result file(s) waiting in {config.state_dir} (oldest {waiting[0].name})",
            "start the agent (it takes them within a poll interval) or delete them if they are stale",
        )
    ]
