"""The service: composes the registered collectors (service/scheduling.py), the store, the exposition and the HTTP
server, and runs start, stop, reload and health.

The poll job runs on an APScheduler BackgroundScheduler (one instance at a time, missed runs coalesced), so a slow or
hung vendor call delays only the next poll — never a scrape, which reads the store.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app

from gpuwatch.collectors.base import CollectorContext
from gpuwatch.collectors.probe import ProbeCollector
from gpuwatch.collectors.sources import BackendSlot, NodeSources
from gpuwatch.collectors.vendors import VendorCollectors
from gpuwatch.collectors.xid_events import EventCollector
from gpuwatch.config.settings import CompatSection, Config, ConfigError, parse_listen
from gpuwatch.exposition.cache import CachedExposition, cached_metrics_app
from gpuwatch.exposition.exporter import Extension, SnapshotExporter, export_detail
from gpuwatch.files.statedir import AgentLock
from gpuwatch.files.statefile import KnownGpus, StateDirError, check_state_dir, last_write_ok
from gpuwatch.judge.findings import gpu_health
from gpuwatch.judge.gpu_verdict import health_document
from gpuwatch.judge.held import remember
from gpuwatch.probe.runner import ProbeRunner
from gpuwatch.readers.procfs import Procfs
from gpuwatch.service.scheduling import Collectors
from gpuwatch.service.sdnotify import ServiceNotifier
from gpuwatch.service.signal_inbox import SignalInbox
from gpuwatch.service.startup import (
    STATE_DIR_RETRY_SECONDS,
    claim_state_dir,
    live_part,
    poll_health,
    watchdog_problem,
)
from gpuwatch.state.ledger import FaultLedger, Records
from gpuwatch.state.store import STALE_AFTER_POLLS, SampleStore, StoreSnapshot
from gpuwatch.web.server import HttpServer, make_app

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 1.5
# Serving waits this long at most for the first poll, so the first scrape is complete (not a node without GPUs);
# a vendor call that hangs at start-up delays serving only this much (/healthz then says the poll is stuck).
FIRST_POLL_WAIT_SECONDS = 2.0


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
        self._notifier = notifier or ServiceNotifier.from_environment()  # systemd: READY, WATCHDOG after each poll
        self._sources = sources
        self._reload_config = reload_config
        self._clock = clock
        self._monotonic = monotonic
        self.store = SampleStore(poll_interval_seconds=config.agent.poll_interval_seconds, clock=clock)
        self.store.configure(config.agent.poll_interval_seconds, config.gpus.power_limit_watts, export_detail(config))
        self._known = KnownGpus(config.state_dir)
        self._ledger = FaultLedger(config.state_dir)  # faults held until repaired (gpuwatch.judge.held)
        procfs = sources.procfs or Procfs(Path("/proc"))  # boot_id is the host's in any PID namespace
        boot_time = procfs.boot_time()
        self._boot = (procfs.boot_id() or f"btime-{boot_time or 0:.0f}", boot_time)
        self._state_lock = AgentLock(config.state_dir)  # one agent per state dir (gpuwatch.files.statedir)
        self._state_writable: bool | None = None  # None before start; False while state is kept in memory
        self._state_retry_at = float("-inf")  # monotonic: the next write test while the state dir takes no writes
        self._stop = threading.Event()
        self._first_poll = threading.Event()
        self._signals = SignalInbox()  # what SIGTERM, SIGINT and SIGHUP asked the main thread for
        self._scheduler: Any = None  # an APScheduler BackgroundScheduler while running
        self._http: HttpServer | None = None
        self.vendors = VendorCollectors(sources.slots, self.store, lambda: self.config, monotonic, self._stop)
        # prometheus_client's registry, holding the one exporter of store snapshots (the library's encoders use it)
        self.prometheus_registry = CollectorRegistry(auto_describe=False)
        self._extension, self._extension_names = compat_extension(config.compat)
        self.prometheus_registry.register(SnapshotExporter(self.store, self._extension))
        self._cache = CachedExposition(self.store, self._extension, self._extension_names)
        self.app = self._app()  # what the HTTP server serves (start wraps it in the web config's TLS and auth)
        # Every collector of gpuwatch/registry.py not disabled: its meta-metrics, schedule and runs (scheduling.py).
        context = CollectorContext(
            lambda: self.config, sources, self.store, self.vendors.active(), clock, monotonic, self._stop
        )
        self.collectors = Collectors.build(context)
        probe = self.collectors.of_type(ProbeCollector)
        self.probe: ProbeRunner | None = probe.runner if probe is not None else None  # None when off
        self.store.probe.configure(enabled=self.probe is not None, interval_seconds=config.probe.interval_seconds)
        self._update_expected()

    # --- life cycle ----------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._http is not None
        return self._http.port

    def start(self) -> None:
        """Claim what the agent cannot run without (state dir, port), then start polling and serving."""
        problem = watchdog_problem(self._notifier.watchdog_seconds, self.config)
        if problem is not None:  # exit 78 before anything starts, not a watchdog restart loop with no hint
            raise ConfigError(str(self.config.source), "agent.poll_interval_seconds", problem)
        writable = claim_state_dir(self.config, self._state_lock)  # False: full, state in memory (said there)
        self._state_writable = writable
        self.store.set_state_dir_writable(writable)
        self._state_retry_at = self._monotonic() + STATE_DIR_RETRY_SECONDS
        self.store.add_known(self._known.load().values())
        self.store.set_ledger(self._ledger.view())  # a fault held before the restart is in the first scrape
        host, port = parse_listen(self.config.agent.listen)
        app, wrap_socket = self.app, None
        if self.config.agent.web_config:  # only then bcrypt, YAML and the TLS reloader are loaded (RSS)
            from gpuwatch.web.webconfig import apply_web_config

            app, wrap_socket = apply_web_config(self.config.agent.web_config, app)  # TLS, basic auth: ConfigError 78
        self._http = HttpServer(host, port, app, wrap_socket)
        self.collectors.register()
        if self.probe is not None:
            self.probe.load_baselines()  # gpuwatch_probe_baseline_flops survives a restart from the first scrape
        self._scheduler = self.collectors.start_scheduler({"poll": self._after_poll}, self._cache.prerender)
        self.collectors.start_threads()  # xid_events: a thread per vendor backend
        self._first_poll.wait(FIRST_POLL_WAIT_SECONDS)
        self._http.start()
        self._notifier.serving()
        log.info("serving on %s (state dir %s)", self.config.agent.listen, self.config.state_dir)

    def handle_signals(self) -> None:
        """SIGTERM/SIGINT stop, SIGHUP reloads: installed before `start`, so a signal that comes as soon as the port
        answers (the first poll done) is a clean stop, never a KeyboardInterrupt inside start-up. The handlers only
        record the signal and wake the main thread (gpuwatch/service/signal_inbox.py): one that took a lock deadlocked
        under a burst of SIGHUPs."""
        self._signals.install(stop=(signal.SIGTERM, signal.SIGINT), reload=(signal.SIGHUP,))

    def run_until_signalled(self) -> None:
        """Block until SIGTERM/SIGINT (or `stop`); SIGHUP re-reads the configuration, once per burst."""
        self.handle_signals()
        while True:
            received = self._signals.receive()  # no timeout: an idle agent's main thread never wakes
            if received.stop is not None:
                log.info("received %s, stopping", signal.Signals(received.stop).name)
                self._stop.set()
            if self._stop.is_set():
                return
            if received.reload:
                self._notifier.reloading()
                self.reload()
                self._notifier.reloaded(f"configuration from {self.config.source}")

    def stop(self) -> None:
        """Stop within ~2 s even if a vendor call hangs: nothing waits on the poll thread."""
        self._notifier.stopping()
        self._stop.set()
        self._signals.wake()  # a run_until_signalled in the main thread returns
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        if self.probe is not None and not self.probe.stop(deadline - time.monotonic()):  # SIGKILL its children
            log.warning("the probe round did not end within %.1f s of its workers being killed", STOP_GRACE_SECONDS)
        if self._http is not None:
            self._http.stop()
            self._http = None
        closer = threading.Thread(target=self.vendors.close, name="close", daemon=True)
        closer.start()
        closer.join(max(0.0, deadline - time.monotonic()))
        if closer.is_alive():
            log.warning("a vendor library did not close within %.1f s; exiting anyway", STOP_GRACE_SECONDS)
        running = self.collectors.join_threads(max(0.0, deadline - time.monotonic()))  # xid_events: bounded
        if running:
            log.debug("collector threads still running at exit (daemons): %s", ", ".join(running))
        self._state_lock.release()

    # --- polling -------------------------------------------------------------------------------------------

    @property
    def slots(self) -> list[BackendSlot]:
        return list(self._sources.slots)

    def _active_slots(self) -> list[BackendSlot]:
        return self.vendors.active()

    def _app(self) -> Callable[..., Any]:
        """The agent's WSGI app: /metrics through the render cache, the status page, the health endpoints, each
        request seeing a hung poll (the golden /metrics test takes this path, as a GET does)."""
        metrics = cached_metrics_app(self._cache, make_wsgi_app(self.prometheus_registry))  # bursts share renders
        page = lambda: status_page(self.store.snapshot())  # noqa: E731
        app = make_app(
            self.prometheus_registry,
            self.health,
            page,
            metrics,
            gpu_health=lambda: gpu_health(self.store.snapshot()),
            gpu_health_json=lambda: health_document(self.store.snapshot(), socket.gethostname()),
        )
        return _noting_stuck_calls(app, self._note_stuck_calls)

    def poll_once(self) -> None:
        """One run of the poll job and what follows it, as the scheduler runs them (tests drive the agent so)."""
        try:
            self.collectors.run_job("poll")
        finally:
            self._after_poll()

    def _after_poll(self) -> None:
        """After each poll: the first one lets serving start; the GPUs seen are remembered; systemd's watchdog is
        fed with the health, so a poll that hangs is a watchdog restart."""
        self._first_poll.set()
        self._known.remember(self.store.identities().values())
        self._keep_ledger()
        self._watch_state_dir()
        memory = "; state dir takes no writes: state kept in memory only" if self._state_writable is False else ""
        self._notifier.poll_finished(f"polled {len(self.store.identities())} GPUs; health: {self.health()[1]}{memory}")

    def _keep_ledger(self) -> None:
        """The fault ledger brought up to date with this poll (a repair from the CLI read back by its file's change);
        a failed write keeps it in memory, said once by the ledger."""
        boot_id, boot_time = self._boot
        view = self._ledger.view()  # a repair from the CLI read back first: this poll is judged with it
        self.store.set_ledger(view)
        snap = self.store.snapshot()

        def keep(records: Records) -> None:
            remember(
                records, snap, boot_id=boot_id, boot_time=boot_time, escalate_after=self.config.ledger.escalate_after
            )

        trial = Records(dict(view.gpus))
        keep(trial)
        if trial.changed:  # the file's lock is taken only for a change, not once a second
            with contextlib.suppress(StateDirError), self._ledger.change() as records:
                keep(records)
            for note in records.notes:
                log.warning("fault ledger: %s", note)
            view = self._ledger.view()
        self.store.set_ledger(view)

    def _watch_state_dir(self) -> None:
        """gpuwatch_state_dir_writable from the last state write; while writes fail (a full filesystem or quota), a
        write test every STATE_DIR_RETRY_SECONDS; once a write works again (that test or any state file's), the
        state kept in memory is written at once."""
        state_dir = self.config.state_dir
        writable = last_write_ok(state_dir) is not False
        if not writable and self._monotonic() >= self._state_retry_at:
            self._state_retry_at = self._monotonic() + STATE_DIR_RETRY_SECONDS
            with contextlib.suppress(StateDirError):
                check_state_dir(state_dir)
                writable = True
        if writable and self._state_writable is False:
            log.warning("state dir %s takes writes again: state is written there from now on", state_dir)
            self._state_lock.renew()
            self._known.write_now()
        self._state_writable = writable
        self.store.set_state_dir_writable(writable)

    def _update_expected(self) -> None:
        counts = self._sources.pci_gpu_counts()
        needed = {slot.vendor for slot in self._sources.slots}
        for vendor in sorted(needed | {v for v, n in counts.items() if n}):
            configured = self.config.expected_gpus(vendor)
            self.store.set_expected(vendor, configured if configured is not None else counts.get(vendor, 0))

    # --- events --------------------------------------------------------------------------------------------

    def read_events_once(self, slot: BackendSlot, timeout_s: float) -> None:
        """Wait up to timeout_s for the backend's events, then read the kernel log (NVIDIA XIDs)."""
        events = self.collectors.of_type(EventCollector)
        if events is not None:
            events.read_once(slot, timeout_s)

    def _note_stuck_calls(self) -> None:
        """Whether a poll hangs in a vendor call, into the store before a request reads it: the poll thread cannot
        say so while it hangs, and asking from each request costs an idle agent no wake."""
        self.store.set_stuck_calls(self.vendors.stuck_calls(self._clock()))

    # --- health and reload ---------------------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        """Healthy while every poll collector finished a run recently and no GPU's readings went stale."""
        return poll_health(self.store.snapshot(), [slot.name for slot in self._active_slots()], STALE_AFTER_POLLS)

    def reload(self) -> None:
        """Apply a re-read configuration where it can change live; say which settings need a restart."""
        if self._reload_config is None:
            return
        try:
            new = self._reload_config()
        except ConfigError as exc:
            log.error("configuration not reloaded, keeping the running one: %s", exc)
            return
        problem = watchdog_problem(self._notifier.watchdog_seconds, new)
        if problem is not None:
            log.error("configuration not reloaded, keeping the running one: agent.poll_interval_seconds: %s", problem)
            return
        old = self.config
        new = live_part(old, new)  # what the running sockets, backends and threads were built from stays
        logging.getLogger().setLevel(new.agent.log_level.upper())
        self.config = new
        self.store.configure(new.agent.poll_interval_seconds, new.gpus.power_limit_watts, export_detail(new))
        self._update_expected()
        self.collectors.register()  # intervals declared from the configuration (the poll's) change with it
        if self._scheduler is not None:
            self.collectors.reschedule(self._scheduler, old)
        log.info("configuration reloaded from %s", new.source)


def compat_extension(compat: CompatSection) -> tuple[Extension | None, frozenset[str]]:
    """`[compat] dcgm`: dcgm-exporter's families and their names, or none. Its tables (1.4 MiB resident) are loaded
    only when it is on."""
    if not compat.dcgm:
        return None, frozenset()
    from gpuwatch.exposition.dcgm_compat import NAMES, dcgm_extension

    return dcgm_extension(compat), NAMES


def status_page(snapshot: StoreSnapshot) -> str:
    """The HTML status page, its module (0.3 MiB) loaded by the first reader rather than by every agent."""
    from gpuwatch.web.status_page import render_status_page

    return render_status_page(snapshot)


def _noting_stuck_calls(app: Callable[..., Any], note: Callable[[], None]) -> Callable[..., Any]:
    """The WSGI app, with `note` run before each request: every page (metrics, status, health) sees a hung poll."""

    def noting(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        note()
        return app(environ, start_response)

    return noting
