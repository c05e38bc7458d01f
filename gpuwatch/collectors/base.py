"""What every collector keeps: the Collector protocol, its schedule (`Every` job or its own `Threads`), what it is
built from (`CollectorContext`) and its `gpuwatch check` lines. The service builds, schedules and times them
(gpuwatch/service/scheduling.py).

A collector's `update` is one run: True when it succeeded. It handles (and logs, in its own words) what it expects to
fail; the scheduler catches the rest, so one collector failing never stops another.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from gpuwatch.registry import REGISTRY

if TYPE_CHECKING:
    from gpuwatch.collectors.sources import BackendSlot, NodeSources
    from gpuwatch.config.settings import Config
    from gpuwatch.state.store import SampleStore


def collector_logger(name: str) -> logging.Logger:
    """The logger of the collector registered as `name`: each collector's lines carry its own name, whichever module
    holds the code it shares with another (nvml and amdsmi, hwmon and ipmi)."""
    return logging.getLogger(f"gpuwatch.collectors.{name}")


@dataclass(frozen=True, slots=True)
class Every:
    """A scheduler job (one instance at a time, missed runs coalesced) every `interval_seconds` of its collector.
    Collectors that name the same job run one after another in it (the vendors share the agent's `poll`)."""

    job: str
    first_run_now: bool = True


@dataclass(frozen=True, slots=True)
class Threads:
    """The collector's own threads: each (thread name -> one run) runs back to back until the agent stops."""

    runs: Mapping[str, Callable[[], bool]]


class Collector(Protocol):
    @property
    def name(self) -> str: ...  # its registration's name: the `collector` label

    @property
    def interval_seconds(self) -> float: ...  # gpuwatch_collector_interval_seconds; an Every job's interval

    @property
    def schedule(self) -> Every | Threads: ...

    def update(self) -> bool: ...  # one run (an Every job's)


@dataclass(frozen=True, slots=True)
class CheckLine:
    """One line of `gpuwatch check`: FAIL is what stops the agent, warn what it runs without; both say what to do."""

    level: Literal["ok", "warn", "FAIL"]
    what: str
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.level != "ok" and not self.fix:
            raise ValueError(f"check line {self.what!r} is {self.level} without a remedy")


def check_lines(config: Config, sources: NodeSources) -> list[tuple[str, CheckLine]]:
    """(collector, line) for `gpuwatch check`, in registry order: each registered collector's module says its own
    lines with ``check(config, sources, name) -> list[CheckLine]``, so a new collector brings its own."""
    lines: list[tuple[str, CheckLine]] = []
    for registration in REGISTRY:
        name = registration.name
        if name in config.agent.disable_collectors:
            lines.append((name, CheckLine("ok", f"collector {name}", "disabled (agent.disable_collectors)")))
            continue
        module = importlib.import_module(registration.module)
        lines.extend((name, line) for line in module.check(config, sources, name))
    return lines


@dataclass(slots=True)
class CollectorContext:
    """What a collector is built from."""

    config: Callable[[], Config]  # asked at each use: a reload changes it
    sources: NodeSources
    store: SampleStore
    slots: list[BackendSlot]  # the vendor backends not disabled
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    stopping: threading.Event
