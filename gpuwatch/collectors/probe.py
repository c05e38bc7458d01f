"""The `probe` collector: the agent's scheduled probe round (gpuwatch/probe/runner.py), first run one interval after
start, never two at once."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpuwatch.collectors.base import CheckLine, CollectorContext, Every
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.probe.baseline import Baselines
from gpuwatch.probe.engines import engine_versions
from gpuwatch.probe.launch import WorkerLauncher
from gpuwatch.probe.runner import ProbeRunner
from gpuwatch.state.store import SampleStore

log = logging.getLogger(__name__)


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


def check(config: Config, sources: NodeSources, name: str) -> list[CheckLine]:
    """`gpuwatch check`: whether the probe can run here (an engine), and baselines it should not trust."""
    if config.probe.interval_seconds <= 0:
        return [CheckLine("ok", "probe", "off (probe.interval_seconds = 0)")]
    return [_check_engine(config, sources.probe_launcher.engines()), *uncapped_baselines(config)]


def _check_engine(config: Config, engines: list[str]) -> CheckLine:
    """`engines`: what the node's probe launcher finds (the production one: available_engines(), none imported)."""
    found = engine_versions(engines)
    if not found:
        return CheckLine(
            "warn",
            "probe engine",
            "none installed; every probe is skipped_unsupported",
            "pip install 'gpuwatch-agent[probe]' for CuPy, or install PyTorch (docs/probe.md)",
        )
    if not any(found.values()):  # another launcher's worker (the simulated node's): nothing to look up
        return CheckLine("ok", "probe engine", ", ".join(found))
    chosen = config.probe.engine if config.probe.engine != "auto" else next(iter(found))
    versions = ", ".join(f"{engine} {version}" for engine, version in found.items())
    return CheckLine("ok", "probe engine", f"{versions} (uses {chosen})")


def uncapped_baselines(config: Config) -> list[CheckLine]:
    """A warn line per GPU whose probe baseline comes from probes that never reached the power limit."""
    try:
        baselines = Baselines(config.state_dir).peek()  # no lock file made, nothing moved: check writes nothing
    except Exception:  # a state dir this user cannot read: the state dir line already says so
        return []
    return [
        CheckLine(
            "warn",
            f"probe baseline of GPU {uuid}",
            "taken from probes that never reached the power limit within probe.warmup_max_seconds = "
            f"{config.probe.warmup_max_seconds:g} (uncapped; slow-GPU detection compares uncapped probes only)",
            "let the GPU reach its power limit in the warm-up (a longer probe.warmup_max_seconds), then start the "
            "baseline again on an idle GPU: gpuwatch probe --gpu N --reset-baseline (docs/probe.md)",
        )
        for uuid, baseline in sorted(baselines.items())
        if baseline.key.uncapped and baseline.flops is not None
    ]
