"""`gpuwatch demo --alerting`: from install to a firing alert in one command.

The demo's simulated node, the real Prometheus (the shipped recording and alert rules) and the real Alertmanager
(the shipped routing, as it is) found on PATH, all on loopback, with their configuration, data and logs in one
private temp dir that goes away at exit. Prometheus scrapes and evaluates every few seconds, so an alert fires as
soon as its shipped `for:` has passed (GpuOverheating, 1 minute, is the mixed scenario's first); the command prints
each alert when Alertmanager first holds it. No shipped file is edited or copied.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatch.cli.promstack import (
    HOST,
    Interrupted,
    LocalServer,
    ServerStartError,
    StopFlag,
    start_server,
    which_first,
)
from gpuwatch.config.settings import Config, load_config, parse_listen
from gpuwatch.core.exitcodes import EXIT_OK, EXIT_UNAVAILABLE
from gpuwatch.files.shipped import ShippedFileMissing, shipped_file

PROMETHEUS = ("prometheus",)
ALERTMANAGER = ("prometheus-alertmanager", "alertmanager")  # Debian's name, then upstream's
INSTALL_HINT = "sudo apt-get install prometheus prometheus-alertmanager"
RULE_FILES = ("deploy/prometheus/gpuwatch-rules.yml", "deploy/prometheus/gpuwatch-alerts.yml")
ROUTING = "deploy/alertmanager/alertmanager.yml"
INTERVAL = "2s"  # scrape and evaluation: an alert fires within seconds of its `for:` (production: 15s)
NODE = "demo-node"  # the `node` label the alerts' summaries name
ALERT_POLL_SECONDS = 1.0


def missing_servers() -> str | None:
    """What is missing from PATH, as a message that says how to install it; None when both servers are there."""
    missing = [" or ".join(names) for names in (PROMETHEUS, ALERTMANAGER) if which_first(names) is None]
    if not missing:
        return None
    return (
        f"gpuwatch demo --alerting runs the real Prometheus and Alertmanager, and {' and '.join(missing)} "
        f"{'is' if len(missing) == 1 else 'are'} not on PATH; install them (Debian, Ubuntu): {INSTALL_HINT}"
    )


def prometheus_config(agent_target: str, alertmanager_port: int, rule_files: list[Path]) -> dict[str, Any]:
    """The shipped job (`gpuwatch`: GpuwatchDown selects it) scraping the demo node, the shipped rules, and the
    Alertmanager; only the intervals are shorter than production's."""
    return {
        "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [str(path) for path in rule_files],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"{HOST}:{alertmanager_port}"]}]}]},
        "scrape_configs": [
            {
                "job_name": "gpuwatch",
                "scrape_interval": INTERVAL,
                "scrape_timeout": INTERVAL,
                "static_configs": [{"targets": [agent_target], "labels": {"node": NODE}}],
            }
        ],
    }


def demo_alerting(
    config_path: Path | None, overrides: dict[str, dict[str, Any]], setup_logging: Callable[[str], None]
) -> int:
    """Run it all until SIGTERM/SIGINT/SIGHUP (exit 0); 69 when a server is missing, cannot start or dies."""
    problem = missing_servers()
    if problem is not None:  # before anything starts
        print(f"gpuwatch: {problem}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        rule_files = [shipped_file(name) for name in RULE_FILES]
        routing = shipped_file(ROUTING)
    except ShippedFileMissing as exc:
        print(f"gpuwatch: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    stop = StopFlag()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # a closed terminal stops the servers too
        signal.signal(signum, stop.set)  # sets a flag, nothing else
    workdir = Path(tempfile.mkdtemp(prefix="gpuwatch-demo-"))  # 0700, removed at exit
    keep = False
    try:
        overrides.setdefault("agent", {}).setdefault("state_dir", str(workdir / "state"))
        config = load_config(config_path, overrides)
        setup_logging(config.agent.log_level)
        code = _run(config, rule_files, routing, workdir, stop)
        keep = code != EXIT_OK and any(workdir.glob("*.log"))  # a server failed: its whole log stays readable
        return code
    finally:
        if keep:
            print(f"gpuwatch demo: the logs and data are kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(config: Config, rule_files: list[Path], routing: Path, workdir: Path, stop: StopFlag) -> int:
    from gpuwatch.service.agent import Agent
    from gpuwatch.service.nodes import build_sources
    from gpuwatch.service.startup import StartupError
    from gpuwatch.web.server import ListenError

    started = time.monotonic()
    agent = Agent(config, build_sources(config))
    servers: list[LocalServer] = []
    try:
        try:
            agent.start()
        except (StartupError, ListenError) as exc:
            print(f"gpuwatch: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        host = parse_listen(config.agent.listen)[0]
        shown = HOST if host in ("", "0.0.0.0", "::") else (f"[{host}]" if ":" in host else host)
        target = f"{shown}:{agent.port}"
        alertmanager_binary = which_first(ALERTMANAGER) or ALERTMANAGER[0]
        prometheus_binary = which_first(PROMETHEUS) or PROMETHEUS[0]
        prometheus_yml = workdir / "prometheus.yml"
        try:
            servers.append(
                start_server(
                    "Alertmanager",
                    lambda port: [
                        alertmanager_binary,
                        f"--config.file={routing}",
                        f"--storage.path={workdir / 'alertmanager'}",
                        f"--web.listen-address={HOST}:{port}",
                        "--cluster.listen-address=",  # one instance: no gossip port
                    ],
                    workdir / "alertmanager.log",
                    stop,
                )
            )
            prometheus_yml.write_text(json.dumps(prometheus_config(target, servers[0].port, rule_files), indent=1))
            servers.append(
                start_server(
                    "Prometheus",
                    lambda port: [
                        prometheus_binary,
                        f"--config.file={prometheus_yml}",
                        f"--storage.tsdb.path={workdir / 'prometheus'}",
                        f"--web.listen-address={HOST}:{port}",
                    ],
                    workdir / "prometheus.log",
                    stop,
                )
            )
        except Interrupted:
            return EXIT_OK
        except ServerStartError as exc:
            print(f"gpuwatch demo: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        alertmanager, prometheus = servers
        print(f"gpuwatch demo: simulated {config.simulated.gpus}-GPU node, scenario {config.simulated.scenario!r}")
        print(f"  metrics:     http://{target}/metrics")
        print(f"  status page: http://{target}/")
        print(f"Prometheus: {prometheus.url}")
        print(f"Alertmanager: {alertmanager.url}")
        print(f"  the shipped rules ({', '.join(p.name for p in rule_files)}) and routing ({routing})")
        print(f"  logs: {workdir / 'prometheus.log'}, {workdir / 'alertmanager.log'} (removed at exit)")
        print("  alerts show here as they fire, each after its rule's `for:` (1 minute or more); stop with Ctrl-C")
        sys.stdout.flush()
        return _watch(servers, alertmanager, started, stop)
    finally:
        for server in reversed(servers):
            server.stop()
        agent.stop()


def _watch(servers: list[LocalServer], alertmanager: LocalServer, started: float, stop: StopFlag) -> int:
    """Print every alert the first time Alertmanager holds it active, until stopped or a server dies."""
    seen: set[str] = set()
    while not stop.wait(ALERT_POLL_SECONDS):
        dead = next((s for s in servers if s.exited() is not None), None)
        if dead is not None:
            if stop.is_set():  # it went with the signal that stops us
                break
            print(f"gpuwatch demo: {dead.death_notice()}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        try:
            alerts = fetch_active_alerts(alertmanager.url)
        except (OSError, ValueError):
            continue  # a slow answer now; a dead server shows above next time
        for alert in sorted(alerts, key=lambda a: str(a.get("startsAt", ""))):
            if alert["fingerprint"] not in seen:
                seen.add(alert["fingerprint"])
                print(f"firing after {time.monotonic() - started:.0f} s: {describe(alert)}", flush=True)
    return EXIT_OK


def fetch_active_alerts(alertmanager_url: str) -> list[dict[str, Any]]:
    """Alertmanager's active alerts, neither silenced nor inhibited (what it would notify about)."""
    url = f"{alertmanager_url}api/v2/alerts?active=true&silenced=false&inhibited=false&unprocessed=false"
    with urllib.request.urlopen(url, timeout=5) as answer:
        alerts = json.loads(answer.read())
    return [a for a in alerts if a.get("status", {}).get("state") == "active"]


def describe(alert: dict[str, Any]) -> str:
    """One line: the alert's name, severity and summary."""
    labels, annotations = alert.get("labels", {}), alert.get("annotations", {})
    name, severity = labels.get("alertname", "?"), labels.get("severity", "none")
    summary = " ".join(str(annotations.get("summary", "(no summary)")).split())
    return f"{name} ({severity}): {summary}"
