"""Wiring: vendor backends, the poll schedule, the event threads, the store and the HTTP server.

The poll job runs on an APScheduler BackgroundScheduler (one instance at a time, missed runs coalesced), so a slow or
hung vendor call delays only the next poll — never a scrape, which reads the store.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry, make_wsgi_app

from gpuwatch.backends.base import Backend, BackendUnavailable
from gpuwatch.config import Config, ConfigError, load_config, parse_listen
from gpuwatch.exporter import GpuwatchCollector
from gpuwatch.exposition_cache import CachedExposition, cached_metrics_app
from gpuwatch.host.collectors import HostCollectors
from gpuwatch.kmsg import KernelLogXidReader, KernelXid, normalize_pci_bus_id
from gpuwatch.model import GpuEvent
from gpuwatch.probe.runner import agent_probe_runner
from gpuwatch.sdnotify import ServiceNotifier
from gpuwatch.sources import BackendSlot, NodeSources
from gpuwatch.statedir import AgentLock, StateDirBusy, StateDirUnsafe, clean_stale_temp_files, require_safe_state_dir
from gpuwatch.statefile import KnownGpus, StateDirError, check_state_dir
from gpuwatch.status_page import render_status_page
from gpuwatch.store import STALE_AFTER_POLLS, SampleStore
from gpuwatch.web import HttpServer, make_app
from gpuwatch.webconfig import apply_web_config

if TYPE_CHECKING:
    from gpuwatch.simulation import SimulatedNode

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 60.0
EVENT_WAIT_SECONDS = 1.0
STOP_GRACE_SECONDS = 1.5
MAX_UNMATCHED_XIDS = 1024  # kernel-log XIDs kept while no GPU with their PCI address is known


class StartupError(Exception):
    """A resource the agent cannot work without is unavailable (exit 69)."""


class Agent:
    def __init__(
        self,
        config: Config,
        sources: NodeSources,
        *,
        reload_config: Callable[[], Config] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        notifier: ServiceNotifier | None = None,
    ) -> None:
        self.config = config
        self._notifier = notifier or ServiceNotifier.from_environment()  # systemd: READY, WATCHDOG from poll_once
        self._sources = sources
        self._reload_config = reload_config
        self._clock = clock
        self._monotonic = monotonic
        self.store = SampleStore(poll_interval_seconds=config.agent.poll_interval_seconds, clock=clock)
        self.store.configured_power_limit_watts = config.gpus.power_limit_watts
        self._known = KnownGpus(config.state_dir)
        self._state_lock = AgentLock(config.state_dir)  # one agent per state dir (gpuwatch.statedir)
        self._stop = threading.Event()
        self._reload_requested = threading.Event()
        self._scheduler: BackgroundScheduler | None = None
        self._http: HttpServer | None = None
        self._threads: list[threading.Thread] = []
        self._unmatched_xids: list[KernelXid] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(GpuwatchCollector(self.store))
        self.host = HostCollectors(sources.host, self.store, monotonic=monotonic, clock=clock)
        self.probe = agent_probe_runner(config, self.store, sources.probe_slowdown, clock)  # None when off
        self._update_expected()

    # --- life cycle ----------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._http is not None
        return self._http.port

    def start(self) -> None:
        """Claim what the agent cannot run without (state dir, port), then start polling and serving."""
        problem = self._watchdog_problem(self.config)
        if problem is not None:  # exit 78 before anything starts, not a watchdog restart loop with no hint
            raise ConfigError(str(self.config.source), "agent.poll_interval_seconds", problem)
        self._check_state_dir()
        self.store.add_known(self._known.load().values())
        host, port = parse_listen(self.config.agent.listen)
        metrics = cached_metrics_app(CachedExposition(self.store), make_wsgi_app(self.registry))  # bursts share renders
        app = make_app(self.registry, self.health, lambda: render_status_page(self.store.snapshot()), metrics)
        app, wrap_socket = apply_web_config(self.config.agent.web_config, app)  # TLS, basic auth: ConfigError = 78
        self._http = HttpServer(host, port, app, wrap_socket)
        for slot in self._active_slots():
            self.store.register_collector(slot.name, self.config.agent.poll_interval_seconds)
        self.host.register()
        if self.probe is not None:
            self.store.register_collector("probe", self.config.probe.interval_seconds)
            self.probe.load_baselines()  # gpuwatch_probe_baseline_flops survives a restart from the first scrape
        self._start_scheduler()
        self._start_event_threads()
        self._http.start()
        self._notifier.serving()
        log.info("serving on %s (state dir %s)", self.config.agent.listen, self.config.state_dir)

    def _watchdog_problem(self, config: Config) -> str | None:
        """Why systemd's watchdog would kill this agent between polls, or None (pings follow each poll only)."""
        watchdog = self._notifier.watchdog_seconds
        poll = config.agent.poll_interval_seconds
        if watchdog is None or poll <= watchdog / 2:
            return None
        return (
            f"{poll:g} s exceeds half the systemd watchdog period "
            f"(WatchdogSec={watchdog:g}s, from $WATCHDOG_USEC): the agent pings the watchdog after each poll, so "
            f"systemd would kill and restart it between polls; set agent.poll_interval_seconds to at most "
            f"{watchdog / 2:g} or raise WatchdogSec= above {2 * poll:g}s in a drop-in (systemctl edit gpuwatch)"
        )

    def _check_state_dir(self) -> None:
        """Only ours (exit 78), writable and not another agent's (exit 69); then clear a killed agent's temp files."""
        try:
            require_safe_state_dir(self.config.state_dir)
        except StateDirUnsafe as exc:
            raise ConfigError(str(self.config.source), "agent.state_dir", str(exc)) from None
        try:
            check_state_dir(self.config.state_dir)
            self._state_lock.acquire()
        except StateDirBusy as exc:
            raise StartupError(str(exc)) from None
        except (StateDirError, OSError) as exc:
            raise StartupError(
                f"state dir {self.config.state_dir} is not writable ({exc}); create it for the agent's user "
                "or pass --state-dir"
            ) from None
        clean_stale_temp_files(self.config.state_dir)

    def _start_scheduler(self) -> None:
        scheduler = BackgroundScheduler(job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None})
        scheduler.add_job(
            self.poll_once,
            "interval",
            seconds=self.config.agent.poll_interval_seconds,
            id="poll",
            next_run_time=None,
        )
        self.host.add_jobs(scheduler)  # hwmon and ipmi: their own jobs and intervals, never on the scrape path
        if self.probe is not None:  # first run one interval after start; never two at once
            interval = self.config.probe.interval_seconds
            scheduler.add_job(self.probe.run_scheduled, "interval", seconds=interval, id="probe")
        scheduler.start()
        # The first poll runs at once so the first scrape is complete.
        job = scheduler.get_job("poll")
        if job is not None:
            job.modify(next_run_time=_now_local())
        self._scheduler = scheduler

    def _start_event_threads(self) -> None:
        if "xid_events" in self.config.agent.disable_collectors:
            return
        self.store.register_collector("xid_events", EVENT_WAIT_SECONDS)
        for slot in self._active_slots():
            thread = threading.Thread(target=self._event_loop, args=(slot,), name=f"events-{slot.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def run_until_signalled(self) -> None:
        """Block until SIGTERM/SIGINT; SIGHUP re-reads the configuration."""
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_reload_signal)
        while not self._stop.wait(0.2):
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self._notifier.reloading()
                self.reload()
                self._notifier.reloaded(f"configuration from {self.config.source}")

    def _on_stop_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        self._stop.set()

    def _on_reload_signal(self, _signum: int, _frame: FrameType | None) -> None:
        self._reload_requested.set()

    def stop(self) -> None:
        """Stop within ~2 s even if a vendor call hangs: nothing waits on the poll thread."""
        self._notifier.stopping()
        self._stop.set()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        if self.probe is not None:
            self.probe.stop()  # SIGKILL any probe child still running
        if self._http is not None:
            self._http.stop()
            self._http = None
        closer = threading.Thread(target=self._close_backends, name="close", daemon=True)
        closer.start()
        closer.join(STOP_GRACE_SECONDS)
        if closer.is_alive():
            log.warning("a vendor library did not close within %.1f s; exiting anyway", STOP_GRACE_SECONDS)
        self._state_lock.release()

    def _close_backends(self) -> None:
        for slot in self._sources.slots:
            with slot.lock:
                if slot.backend is not None:
                    slot.backend.close()
                    slot.backend = None

    # --- polling -------------------------------------------------------------------------------------------

    @property
    def slots(self) -> list[BackendSlot]:
        return list(self._sources.slots)

    def _active_slots(self) -> list[BackendSlot]:
        disabled = self.config.agent.disable_collectors
        return [slot for slot in self._sources.slots if slot.name not in disabled]

    def poll_once(self) -> None:
        """One poll of every backend; each is timed and isolated, so one failing never stops the others."""
        for slot in self._active_slots():
            started = self._monotonic()
            try:
                ok = self._poll_slot(slot)
            except Exception:
                log.exception("%s poll failed unexpectedly", slot.name)
                ok = False
            self.store.record_collector_run(slot.name, success=ok, duration_seconds=self._monotonic() - started)
        self._known.remember(self.store.identities().values())
        self._notifier.poll_finished(f"polled {len(self.store.identities())} GPUs; health: {self.health()[1]}")

    def _poll_slot(self, slot: BackendSlot) -> bool:
        now = self._monotonic()
        backend = slot.backend
        if backend is None:
            if now < slot.next_attempt:
                return False
            backend = self._open(slot, now)
            if backend is None:
                return False
        slow = now - slot.last_slow_poll >= self.config.agent.slow_poll_interval_seconds
        try:
            readings = backend.poll(slow=slow)
        except Exception as exc:  # BackendUnavailable, or a bug: reopen with backoff rather than fail every poll
            if not isinstance(exc, BackendUnavailable):
                log.exception("%s poll failed unexpectedly; reopening the library", slot.name)
            self._backend_failed(slot, now, str(exc))
            with slot.lock:
                backend.close()
                slot.backend = None
            return False
        if slow:
            slot.last_slow_poll = now
        self.store.record_poll(readings)
        self.store.set_unusable(slot.name, backend.unusable())
        for uuid in backend.reset_uuids():  # AMD: reset counters exist from start-up at 0
            self.store.ensure_resets_counter(uuid)
        return True

    def _open(self, slot: BackendSlot, now: float) -> Backend | None:
        try:
            backend = slot.factory()
            backend.open()
        except Exception as exc:  # a bug in a backend is a library that cannot be used: backoff, never a loop
            if not isinstance(exc, BackendUnavailable) and not slot.down_reported:
                log.exception("%s failed to open unexpectedly", slot.name)
            self._backend_failed(slot, now, str(exc) if isinstance(exc, BackendUnavailable) else repr(exc))
            return None
        with slot.lock:
            slot.backend = backend
        slot.backoff = 1.0
        slot.last_slow_poll = -math.inf
        self.store.set_backend(slot.name, True)
        if slot.down_reported:
            log.info("%s is available again", slot.name)
        slot.down_reported = False
        return backend

    def _backend_failed(self, slot: BackendSlot, now: float, message: str) -> None:
        """Say it once, then retry with exponential backoff: drivers load late, and a restart loop helps no one."""
        self.store.set_backend(slot.name, False, message)
        self.store.set_unusable(slot.name, ())
        if not slot.down_reported and not self._stop.is_set():  # closing the library under a hung call is ours
            log.error(
                "%s unavailable: %s (retrying with backoff up to %.0f s)", slot.name, message, MAX_BACKOFF_SECONDS
            )
            slot.down_reported = True
        slot.next_attempt = now + slot.backoff
        slot.backoff = min(slot.backoff * 2, MAX_BACKOFF_SECONDS)

    def _update_expected(self) -> None:
        counts = self._sources.pci_gpu_counts()
        needed = {slot.vendor for slot in self._sources.slots}
        for vendor in sorted(needed | {v for v, n in counts.items() if n}):
            configured = self.config.expected_gpus(vendor)
            self.store.set_expected(vendor, configured if configured is not None else counts.get(vendor, 0))

    # --- events --------------------------------------------------------------------------------------------

    def _event_loop(self, slot: BackendSlot) -> None:
        while not self._stop.is_set():
            started = self._monotonic()
            ok = True
            try:
                self.read_events_once(slot, EVENT_WAIT_SECONDS)
            except Exception:
                log.exception("event reader for %s failed", slot.name)
                ok = False
                self._stop.wait(EVENT_WAIT_SECONDS)
            self.store.record_collector_run("xid_events", success=ok, duration_seconds=self._monotonic() - started)

    def read_events_once(self, slot: BackendSlot, timeout_s: float) -> None:
        """Wait up to timeout_s for the backend's events, then read the kernel log (NVIDIA XIDs)."""
        backend = slot.backend
        if backend is None:
            self._stop.wait(timeout_s)
            events: list[GpuEvent] = []
        else:
            events = backend.wait_events(timeout_s)
        reader = self._sources.kernel_log if slot.vendor == "nvidia" else None
        if reader is not None:
            events.extend(self._kernel_xids(reader))
        self.store.add_events(events)

    def _kernel_xids(self, reader: KernelLogXidReader) -> list[GpuEvent]:
        """Kernel-log XIDs mapped to GPUs; those of a GPU not known yet (NVML still opening, or down) wait for it."""
        events = []
        waiting: list[KernelXid] = []
        for xid in [*self._unmatched_xids, *reader.read_new(now=self._clock())]:
            identity = self.store.identity_by_pci(normalize_pci_bus_id(xid.pci_bus_id), normalize_pci_bus_id)
            if identity is None:
                waiting.append(xid)
            else:
                events.append(GpuEvent(identity.uuid, "xid", xid.timestamp, code=xid.xid, source="kmsg"))
        self._unmatched_xids = waiting[-MAX_UNMATCHED_XIDS:]
        self.store.add_sxids(reader.drain_sxids())
        return events

    # --- health and reload ---------------------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        """Healthy while every poll collector finished a run recently and no GPU's readings went stale."""
        snap = self.store.snapshot()
        limit = STALE_AFTER_POLLS * snap.poll_interval_seconds
        for slot in self._active_slots():
            status = snap.collectors.get(slot.name)
            last = status.last_run_timestamp if status else None
            if last is None:
                return False, f"starting: the first {slot.name} poll has not finished"
            if snap.now - last > limit:
                return False, f"{slot.name} poll has not finished for {snap.now - last:.1f} s (a hung vendor call?)"
        for uuid, sample in snap.samples.items():
            if uuid not in snap.gpu_errors and snap.now - sample.timestamp > limit:
                return False, f"GPU {uuid} readings are {snap.now - sample.timestamp:.1f} s old"
        return True, "ok"

    def reload(self) -> None:
        """Apply a re-read configuration where it can change live; say which settings need a restart."""
        if self._reload_config is None:
            return
        try:
            new = self._reload_config()
        except ConfigError as exc:
            log.error("configuration not reloaded, keeping the running one: %s", exc)
            return
        problem = self._watchdog_problem(new)
        if problem is not None:
            log.error("configuration not reloaded, keeping the running one: agent.poll_interval_seconds: %s", problem)
            return
        old = self.config
        restart_only = ("listen", "web_config", "backend", "state_dir", "disable_collectors")
        for key in restart_only:
            if getattr(old.agent, key) != getattr(new.agent, key):
                log.warning("agent.%s changed: takes effect after a restart", key)
        if old.xid != new.xid:
            log.warning("[xid] changed: takes effect after a restart")
        # Keep what the running sockets, backends and threads were built from, so the agent stays consistent.
        new = dataclasses.replace(
            new,
            agent=dataclasses.replace(new.agent, **{key: getattr(old.agent, key) for key in restart_only}),
            xid=old.xid,
        )
        if old.simulated != new.simulated:
            log.warning("[simulated] changed: takes effect after a restart")
        if old.probe != new.probe:
            log.warning("[probe] changed: takes effect after a restart")
        if old.host != new.host:
            log.warning("[host] changed: takes effect after a restart")
        logging.getLogger().setLevel(new.agent.log_level.upper())
        self.config = new
        self.store.poll_interval_seconds = new.agent.poll_interval_seconds
        self.store.configured_power_limit_watts = new.gpus.power_limit_watts
        self._update_expected()
        for slot in self._active_slots():
            self.store.register_collector(slot.name, new.agent.poll_interval_seconds)
        if self._scheduler is not None and old.agent.poll_interval_seconds != new.agent.poll_interval_seconds:
            self._scheduler.reschedule_job("poll", trigger="interval", seconds=new.agent.poll_interval_seconds)
        log.info("configuration reloaded from %s", new.source)


def _now_local() -> Any:
    from datetime import datetime

    return datetime.now().astimezone()


def build_sources(
    config: Config, *, sysfs_root: Path = Path("/sys"), simulated_node: SimulatedNode | None = None
) -> NodeSources:
    """This node's sources (gpuwatch.simulation.build_sources; the simulator is imported only when asked for)."""
    from gpuwatch.simulation import build_sources as build

    return build(config, sysfs_root=sysfs_root, simulated_node=simulated_node)


def load_for_reload(path: Path | None, overrides: dict[str, dict[str, Any]]) -> Callable[[], Config]:
    return lambda: load_config(path, overrides)
