"""An in-process agent over the simulated node with a clock the test drives: deterministic and fast."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.collectors.configuration import load_config
from gpuwatch.core.scenario_catalogue import SCENARIOS
from gpuwatch.readers.kmsg import KernelLogXidReader
from gpuwatch.service.agent import Agent
from gpuwatch.simulated.node import simulated_sources
from gpuwatch.simulated.scenarios import SimulatedNode

START_WALL = 1_800_000_000.0


def get(
    app: Callable[..., Iterable[bytes]], path: str, headers: dict[str, str] | None = None
) -> tuple[str, dict[str, str], bytes]:
    """(status, headers, body) of a GET of `path` from a WSGI app, as the agent's HTTP server calls it."""
    environ: dict[str, Any] = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": ""}
    setup_testing_defaults(environ)
    for name, value in (headers or {}).items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    started: list[Any] = []

    def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        started.extend((status, response_headers))

    body = b"".join(app(environ, start_response))
    return started[0], dict(started[1]), body


# Every scenario a poll in the test's own thread can run: nvml_hang's temperature call never returns after 5 s, which
# would hang that thread for good (tests/test_nvml_hang.py runs it in an agent process instead).
IN_THREAD_SCENARIOS = tuple(sorted(set(SCENARIOS) - {"nvml_hang"}))


class FakeClock:
    def __init__(self) -> None:
        self.elapsed = 0.0

    def mono(self) -> float:
        return self.elapsed

    def wall(self) -> float:
        return START_WALL + self.elapsed


class SimAgent:
    """The real Agent, backend and simulated library; the test advances time one poll at a time."""

    def __init__(
        self,
        state_dir: Path,
        scenario: str = "healthy",
        gpus: int = 8,
        kernel_log: KernelLogXidReader | None = None,
        probe: dict[str, object] | None = None,
        vendor: str = "nvidia",
        boot: int = 0,
        nvlink: bool = False,
        sections: dict[str, dict[str, object]] | None = None,
        **config: object,
    ) -> None:
        self.clock = FakeClock()
        self.node = SimulatedNode(
            scenario=scenario,
            gpus=gpus,
            vendor=vendor,
            clock=self.clock.mono,
            wall_clock=self.clock.wall,
            nvlink=nvlink,  # an HGX node: 18 NVLinks per GPU, NVSwitches, a NIC per GPU
        )
        overrides: dict[str, dict[str, object]] = {
            **(sections or {}),  # other sections of the configuration, e.g. {"nvml": {"nvlink_per_link": True}}
            "agent": {"backend": "simulated", "state_dir": str(state_dir), **config},
        }
        if probe is not None:
            overrides["probe"] = probe
        if boot:
            overrides["simulated"] = {"boot": boot}  # the node's boot id (a reboot, as the fault ledger sees one)
        loaded = load_config(None, overrides)
        # The one simulated-node factory (gpuwatch.simulated.node): its vendor backend (the real AMD SMI backend over
        # the simulated amdsmi module, whose import may fail), hwmon + BMC through the real readers, its probe worker.
        self.sources = simulated_sources(loaded, self.node, kernel_log=kernel_log, clock=self.clock.wall)
        sources = self.sources
        self.slot = sources.slots[0]
        self.agent = Agent(loaded, sources, clock=self.clock.wall, monotonic=self.clock.mono)
        self.agent.collectors.register(threads=False)  # xid_events: run() reads the events, no thread does
        self._last_run: dict[str, float] = {}  # scheduler job -> when it last ran (simulated seconds)
        self._scraped: dict[tuple[str, frozenset[tuple[str, str]]], float] | None = None

    def run(self, seconds: float, step: float = 1.0) -> None:
        """Poll and read events every `step` simulated seconds."""
        end = self.clock.elapsed + seconds
        while self.clock.elapsed < end:
            self.agent.poll_once()
            self._run_due_host_jobs()
            self.agent.read_events_once(self.slot, 0.0)
            self.clock.elapsed += step
        self.clock.elapsed -= step  # scrape right after the last poll
        self._scraped = None

    def _run_due_host_jobs(self) -> None:
        """The scheduler's part for hwmon and ipmi: every host job whose interval has passed on the test's clock."""
        for job, every in self.agent.collectors.jobs().items():
            interval = every.interval(self.agent.config)
            if job.startswith("host-") and self.clock.elapsed - self._last_run.get(job, -math.inf) >= interval:
                self._last_run[job] = self.clock.elapsed
                self.agent.collectors.run_job(job)

    def probe_round(self, poll_every: float = 0.05) -> None:
        """One scheduled probe round now, with real worker children. Meanwhile the test's clock follows the real one
        and the agent polls every `poll_every` seconds, as its poll job would: the probe's telemetry and its power-cap
        signal come from those polls, which show the probe's load on the simulated GPUs."""
        assert self.agent.probe is not None, "the probe is off in this SimAgent"
        done = threading.Event()

        def poll() -> None:
            last = time.monotonic()
            while not done.wait(poll_every):
                now = time.monotonic()
                self.clock.elapsed += now - last
                last = now
                self.agent.poll_once()

        self.clock.elapsed += poll_every  # the round starts after the last poll, as on a real clock
        poller = threading.Thread(target=poll, name="simnode-probe-poll")
        poller.start()
        try:
            self.agent.collectors.run_job("probe")
        finally:
            done.set()
            poller.join()
        self._scraped = None

    def text(self) -> str:
        """/metrics as a GET takes it: through the agent's own WSGI app (render cache, fast encoder, compat)."""
        return get(self.agent.app, "/metrics")[2].decode()

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """One scrape per simulated moment: parsed once, then reused until time moves."""
        if self._scraped is None:
            self._scraped = {}
            for family in text_string_to_metric_families(self.text()):
                for s in family.samples:
                    self._scraped[(s.name, frozenset(s.labels.items()))] = s.value
        return self._scraped

    def gpu(self, index: int) -> dict[str, str]:
        """The gpu/uuid labels of GPU `index`."""
        for name, labels in self.samples():
            if name == "gpuwatch_gpu_up" and dict(labels)["gpu"] == str(index):
                return dict(labels)
        raise KeyError(index)

    def value(self, name: str, gpu: int | None = None, **labels: str) -> float | None:
        full = {**(self.gpu(gpu) if gpu is not None else {}), **labels}
        return self.samples().get((name, frozenset(full.items())))

    def close(self) -> None:
        self.agent.stop()
