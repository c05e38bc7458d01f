"""A collector is one module plus one registration line (docs/development.md, "Adding a collector"): the module in
tests/fixtures/collector_module declares its section, families, stored part, export, schedule and check lines, and a
child process adds it to gpuwatch/registry.py's table — the one shared thing it changes — before anything else of
gpuwatch is imported, as an edited registry would be. The agent then loads, validates, schedules, stores, exports
and checks it with no other change."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "collector_module"

_CHILD = r"""
import json, sys
from pathlib import Path
from wsgiref.util import setup_testing_defaults

sys.path.insert(0, sys.argv[1])
import gpuwatch.registry as registry  # the one line of the registry, added as an edit would add it
registry.REGISTRY = (*registry.REGISTRY, registry.Registration("loadavg_demo", "loadavg_demo"))
registry.COLLECTORS = tuple(r.name for r in registry.REGISTRY)

from gpuwatch.collectors.base import check_lines
from gpuwatch.collectors.configuration import load_config
from gpuwatch.config.settings import ConfigError
from gpuwatch.service.agent import Agent
from gpuwatch.service.nodes import build_sources

good, bad = Path(sys.argv[2]), Path(sys.argv[3])
config = load_config(good)
agent = Agent(config, build_sources(config))
agent.collectors.register(threads=False)
agent.poll_once()
ran = agent.collectors.run_job("loadavg-demo")
environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": ""}
setup_testing_defaults(environ)
body = b"".join(agent.app(environ, lambda status, headers, exc_info=None: None)).decode()
checks = {name: [line.level, line.detail] for name, line in check_lines(config, build_sources(config))}
jobs = {job: every.interval(config) for job, every in agent.collectors.jobs().items()}
try:
    load_config(bad)
    problem = ""
except ConfigError as exc:
    problem = str(exc)
disabled = load_config(good, {"agent": {"disable_collectors": ("loadavg_demo",)}})
off = Agent(disabled, build_sources(disabled))
print(json.dumps({"ran": ran, "body": body, "checks": checks, "jobs": jobs, "problem": problem,
                  "off": [c.name for c in off.collectors], "on": [c.name for c in agent.collectors]}))
"""


def test_a_collector_in_one_module_and_one_registry_line_is_loaded_run_exported_and_checked(tmp_path: Path) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.50 1.25 2.00 1/234 5678\n")
    state = tmp_path / "state"
    common = f'[agent]\nbackend = "simulated"\nstate_dir = "{state}"\n[probe]\ninterval_seconds = 0\n'
    good = tmp_path / "good.toml"
    good.write_text(common + f'[loadavg_demo]\npath = "{loadavg}"\ninterval_seconds = 5\n')
    bad = tmp_path / "bad.toml"
    bad.write_text(common + "[loadavg_demo]\ninterval_seconds = 0\ncolour = 1\n")
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(FIXTURE), str(good), str(bad)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert seen["ran"] is True and "loadavg_demo" in seen["on"] and "loadavg_demo" not in seen["off"]
    body = seen["body"]
    # its families, from its declaration, through the served /metrics
    assert "# HELP gpuwatch_demo_load The host's load average over `minutes`.\n" in body, body
    for minutes, value in (("1", "0.5"), ("5", "1.25"), ("15", "2.0")):
        assert f'gpuwatch_demo_load{{minutes="{minutes}"}} {value}\n' in body, body
    # its schedule, from its declaration and its section: the job, and the interval the meta-metrics export
    assert seen["jobs"]["loadavg-demo"] == 5.0 and seen["jobs"]["poll"] == 1.0, seen["jobs"]
    assert 'gpuwatch_collector_interval_seconds{collector="loadavg_demo"} 5.0\n' in body, body
    assert 'gpuwatch_collector_success{collector="loadavg_demo"} 1.0\n' in body, body
    # its check line, and its section's problems with the file's, named by key
    assert seen["checks"]["loadavg_demo"] == ["ok", f"{loadavg} readable"], seen["checks"]
    problem = seen["problem"]
    assert f"{bad}: loadavg_demo.colour: unknown key" in problem, problem
    assert f"{bad}: loadavg_demo.interval_seconds: must be between 1 and 3600 seconds, got 0" in problem, problem
