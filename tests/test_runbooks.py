"""Runbooks that work inside a datacentre (issue 28): every alert's description ends with the first step of its
runbook, its runbook_url is built from the one base the operator sets (an external label) or else points at the
agent's own /runbooks, and the agent serves docs/runbooks.md there — rendered on the first request, an anchor per
alert, behind the same auth as every page, with no script let in. Real agents, a real Prometheus, real HTTP."""

from __future__ import annotations

import base64
import json
import logging
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import bcrypt
import pytest
import yaml
from ports import free_port, free_port_range
from prometheus_client import CollectorRegistry
from promrules import PROM_DIR, ROOT, every_alert_rule, first_step, runbook_sections
from test_alerts_e2e import _get, _poll, _stop, scale_durations

from gpuwatch.collectors.configuration import load_config
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.files.shipped import shipped_file
from gpuwatch.service.agent import Agent
from gpuwatch.simulated.node import simulated_slot
from gpuwatch.simulated.scenarios import SimulatedNode
from gpuwatch.web.runbooks_page import CONTENT_SECURITY_POLICY, RunbooksPage, render_markdown
from gpuwatch.web.server import HttpServer, make_app

# The two shapes of runbook_url (whitespace as the folded YAML leaves it): the operator's base, else the agent of the
# alert's instance; GpuwatchDown's agent is the one that is down and GpuProbeRegressionFleetwide has no instance, so
# those two name the first agent that answers (by instance), else the alert's own.
BASE = "{{ with $externalLabels.gpuwatch_runbook_base }}{{ . }}{{ else }}"
PER_INSTANCE = BASE + "http://{{ $labels.instance }}/runbooks{{ end }}#"
FLEET = (
    BASE + '{{ with query `up{job="gpuwatch"} == 1` | sortByLabel "instance" }}'
    'http://{{ . | first | label "instance" }}{{ else }}http://{{ $labels.instance }}{{ end }}/runbooks{{ end }}#'
)
FLEET_ALERTS = {"GpuwatchDown", "GpuProbeRegressionFleetwide"}
WIKI = "https://wiki.example/gpu-runbooks"
ORGANISATION = "github.com/" + "gpuwatch/gpuwatch"  # split, so this file does not hold it either
# The same organisation behind GitHub's other hosts (raw.githubusercontent.com/<org>/<repo>/...).
ORGANISATION_ANYWHERE = r"github(usercontent)?\.com/" + "gpuwatch/gpuwatch"


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- the rules and the runbooks, one source ----------------------------------------------------------------------


def test_every_alert_description_ends_with_the_first_step_of_its_runbook() -> None:
    """The on-call reads what to do in the alert itself: the first sentence of the "What to do." paragraph of the
    alert's section of docs/runbooks.md, word for word, so editing one without the other fails here."""
    sections = runbook_sections()
    rules = every_alert_rule()
    assert len(rules) >= 40
    for path, rule in rules:
        name = rule["alert"]
        assert name in sections, f"{path.name}: {name} has no `## {name}` section in docs/runbooks.md"
        step = first_step(sections[name])
        assert step, f"docs/runbooks.md: {name}'s section has no **What to do.** paragraph"
        description = _one_line(rule["annotations"]["description"])
        assert description.endswith(f" What to do: {step}"), (
            f"{path.name}: {name}'s description must end with 'What to do: {step}' (docs/runbooks.md), "
            f"not ...{description[-160:]!r}"
        )
    assert set(sections) == {rule["alert"] for _, rule in rules}, "a runbook section for an alert that does not exist"


def test_every_runbook_url_is_the_operators_base_or_the_agent_and_ends_at_its_section() -> None:
    for path, rule in every_alert_rule():
        name = rule["alert"]
        url = _one_line(rule["annotations"]["runbook_url"])
        assert url.endswith("#" + name.lower()), f"{path.name}: {name}'s runbook_url must end with #{name.lower()}"
        expected = (FLEET if name in FLEET_ALERTS else PER_INSTANCE) + name.lower()
        assert url == expected, f"{path.name}: {name}'s runbook_url\n  is {url}\n  not {expected}"


def test_no_tracked_file_links_the_organisation_that_does_not_exist() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    found = subprocess.run(
        ["git", "grep", "-l", "-E", ORGANISATION_ANYWHERE, "--", ".", ":!benchmarks/hardware/results"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 1 and not found.stdout, f"{ORGANISATION} still in: {found.stdout}{found.stderr}"


# --- /runbooks on a real agent -----------------------------------------------------------------------------------


class Ids(HTMLParser):
    """Every element id of a page, the <h2> ones apart, and the links."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.h2: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"] or "")
            if tag == "h2":
                self.h2.add(a["id"] or "")
        if tag == "a":
            self.links.append(a.get("href") or "")


def _agent(tmp_path: Path, **agent: object) -> tuple[Agent, int]:
    node = SimulatedNode(scenario="healthy", gpus=1)
    port = free_port()
    overrides = {
        "agent": {
            "backend": "simulated",
            "state_dir": str(tmp_path / "state"),
            "poll_interval_seconds": 0.2,
            "listen": f"127.0.0.1:{port}",
            **agent,
        }
    }
    started = Agent(load_config(None, overrides), NodeSources([simulated_slot(node)], node.pci_gpu_counts, None))
    started.start()
    return started, port


def _request(
    port: int, path: str, method: str = "GET", auth: tuple[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[int]:
    running, port = _agent(tmp_path)
    yield port
    running.stop()


def test_the_agent_serves_the_runbooks_with_an_anchor_per_alert(agent: int) -> None:
    """Every alert of the default and the opt-in rules has its anchor, as the links name it; the page says where
    it comes from and links back to the status page."""
    status, headers, body = _request(agent, "/runbooks")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8", (status, headers)
    assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY and "script-src" not in CONTENT_SECURITY_POLICY
    assert int(headers["Content-Length"]) == len(body)
    page = Ids()
    page.feed(body.decode())
    alerts = {rule["alert"].lower() for _, rule in every_alert_rule()}
    assert alerts <= page.h2, sorted(alerts - page.h2)
    assert "./" in page.links  # back to the status page, relative like the status page's links here
    text = body.decode()
    overheating = text[text.index('<h2 id="gpuoverheating">') :]
    assert "<strong>What to do.</strong> Check cooling first" in overheating.split("<h2", 2)[1]
    # a link to another document of docs/ (not served here) is its text and its path, not a 404
    assert "(docs/alerting.md#opt-in-alerts)" in text and 'href="alerting.md' not in text
    assert '<a href="https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html">' in text


def test_head_answers_as_get_without_a_body(agent: int) -> None:
    get_status, get_headers, body = _request(agent, "/runbooks")
    assert get_status == 200
    status, headers, head_body = _request(agent, "/runbooks", method="HEAD")
    assert (status, head_body) == (200, b"")
    assert headers["Content-Length"] == get_headers["Content-Length"] == str(len(body))
    assert headers["Content-Type"] == get_headers["Content-Type"]


def test_the_status_page_links_the_runbooks_relative_to_itself(agent: int) -> None:
    _, _, body = _request(agent, "/")
    page = Ids()
    page.feed(body.decode())
    assert "./runbooks" in page.links


def test_basic_auth_guards_the_runbooks_like_every_page(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  oncall: '{hashed}'\n")
    running, port = _agent(tmp_path, web_config=str(web))
    try:
        status, headers, _ = _request(port, "/runbooks")
        assert status == 401 and headers["WWW-Authenticate"] == 'Basic realm="gpuwatch"'
        assert _request(port, "/runbooks", auth=("oncall", "wrong"))[0] == 401
        assert _request(port, "/runbooks", method="HEAD")[0] == 401
        status, _, body = _request(port, "/runbooks", auth=("oncall", "s3cret"))
        assert status == 200 and b'<h2 id="gpuoverheating">' in body
    finally:
        running.stop()


_LAZY = """
import json, sys, urllib.request
from gpuwatch.service.agent import Agent
from gpuwatch.collectors.configuration import load_config
from gpuwatch.simulated.scenarios import SimulatedNode
from gpuwatch.simulated.node import simulated_slot
from gpuwatch.collectors.sources import NodeSources

state, port = sys.argv[1], sys.argv[2]
node = SimulatedNode(scenario="healthy", gpus=1)
config = load_config(None, {"agent": {"backend": "simulated", "state_dir": state, "poll_interval_seconds": 0.2,
                                      "listen": "127.0.0.1:" + port}})
agent = Agent(config, NodeSources([simulated_slot(node)], node.pci_gpu_counts, None))
agent.start()

def get(path):
    with urllib.request.urlopen("http://127.0.0.1:" + port + path, timeout=10) as reply:
        return reply.read()

def loaded():
    return sorted(m for m in sys.modules if m.split(".")[0] in ("markdown_it", "mdurl"))

get("/"), get("/metrics"), get("/healthz")
before = loaded()
first = get("/runbooks")
after = loaded()
again = get("/runbooks")
agent.stop()
print(json.dumps({"before": before, "after": after, "same": first == again}))
"""


def test_the_markdown_library_is_imported_only_when_someone_reads_the_runbooks(tmp_path: Path) -> None:
    """The agent's memory at start is tuned (benchmarks/README.md): a fresh agent serving its status page, metrics
    and health has not imported markdown-it; the first /runbooks does, and the page is the same on the next."""
    done = subprocess.run(
        [sys.executable, "-c", _LAZY, str(tmp_path / "state"), str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == [] and "markdown_it" in seen["after"] and seen["same"], seen


def test_a_missing_runbooks_file_is_a_500_naming_it_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """A broken install (the file not shipped): a clear 500 and an error logged once, never a crash; the other
    pages go on."""
    page = RunbooksPage(lambda: shipped_file("docs/no-such-runbooks.md"))
    app = make_app(CollectorRegistry(), lambda: (True, "ok"), lambda: "<html></html>", runbooks=page)
    server = HttpServer("127.0.0.1", 0, app)
    server.start()
    try:
        with caplog.at_level(logging.ERROR, logger="gpuwatch.web.runbooks_page"):
            first = _request(server.port, "/runbooks")
            second = _request(server.port, "/runbooks")
        for status, headers, body in (first, second):
            assert status == 500 and headers["Content-Type"] == "text/plain; charset=utf-8", (status, headers)
            assert b"cannot read the runbooks: docs/no-such-runbooks.md is missing" in body, body
            assert b"reinstall the gpuwatch-agent package" in body, body
        errors = [r for r in caplog.records if r.name == "gpuwatch.web.runbooks_page"]
        assert len(errors) == 1 and "docs/no-such-runbooks.md is missing" in errors[0].getMessage(), errors
        assert _request(server.port, "/healthz")[0] == 200
    finally:
        server.stop()


def test_the_document_cannot_put_a_script_on_the_page() -> None:
    """Raw HTML is escaped, script: links are refused, and headings keep GitHub's anchors."""
    html = render_markdown(
        "## GpuEvil <script>alert(1)</script>\n\n"
        "<script>alert(2)</script>\n\n"
        'Text <img src=x onerror="alert(3)"> and [a link](javascript:alert(4)) and [ok](https://example.com/).\n'
    )
    assert "<script" not in html and "<img" not in html and 'href="javascript:' not in html, html
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html
    assert '<a href="https://example.com/">ok</a>' in html
    assert '<h2 id="gpuevil-scriptalert1script">' in html, html


# --- runbook_url on a real Prometheus: the operator's base, else an agent that answers -----------------------------


def _prometheus(
    tmp: Path, name: str, external_labels: dict[str, str], port: int, dead: int
) -> tuple[subprocess.Popen[bytes], str]:
    """A Prometheus on `port` evaluating the shipped alerts (durations shortened), whose gpuwatch job scrapes `dead`,
    a port nobody listens on (GpuwatchDown), and Prometheus itself (an agent that answers, as far as `up` tells)."""
    rules = tmp / f"{name}-alerts.yml"
    rules.write_text(scale_durations((PROM_DIR / "gpuwatch-alerts.yml").read_text(), 0.01))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "external_labels": external_labels},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "gpuwatch",
                "scrape_timeout": "1s",
                "static_configs": [{"targets": [f"127.0.0.1:{dead}", f"127.0.0.1:{port}"]}],
            }
        ],
    }
    (tmp / f"{name}.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp / f'{name}.yml'}",
            f"--storage.tsdb.path={tmp / f'{name}-tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    return proc, f"127.0.0.1:{port}"


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus missing (apt-get install prometheus)")
def test_prometheus_builds_runbook_url_from_the_external_label_else_an_agent_that_answers(tmp_path: Path) -> None:
    # Four distinct ports below the ephemeral range, taken at once: a port one Prometheus is yet to bind must never
    # be the other's "dead" target, nor a port a scrape's own client socket takes meanwhile.
    first = free_port_range(4)
    with_base, base_address = _prometheus(tmp_path, "with-base", {"gpuwatch_runbook_base": WIKI}, first, first + 1)
    default, default_address = _prometheus(tmp_path, "default", {}, first + 2, first + 3)
    try:

        def runbook_urls(address: str) -> set[str]:
            alerts = _get(f"http://{address}/api/v1/alerts")["data"]["alerts"]
            return {a["annotations"]["runbook_url"] for a in alerts if a["labels"]["alertname"] == "GpuwatchDown"}

        deadline = time.monotonic() + 60
        _poll("GpuwatchDown with a base", lambda: bool(runbook_urls(base_address)), deadline)
        _poll("GpuwatchDown without one", lambda: bool(runbook_urls(default_address)), deadline)
        assert runbook_urls(base_address) == {f"{WIKI}#gpuwatchdown"}
        # The agent that is down cannot serve it: the one that answers does (here Prometheus stands in for it). With
        # the durations scaled to 1 %, the alert can fire before Prometheus has scraped the one that answers; until
        # then the link is the down agent's own, and the next evaluation (1 s) gives the answering one's.
        answering = {f"http://{default_address}/runbooks#gpuwatchdown"}
        _poll("the link to the agent that answers", lambda: runbook_urls(default_address) == answering, deadline)
    finally:
        _stop(with_base)
        _stop(default)


def test_the_shipped_configs_name_the_external_label_the_rules_read() -> None:
    """prometheus.yml and vmalert.env show the one setting (commented: the default is the agent's /runbooks)."""
    label = "gpuwatch_runbook_base"
    assert re.search(rf"^\s*#\s*{label}: https://", (PROM_DIR / "prometheus.yml").read_text(), re.M)
    vmalert = (ROOT / "deploy" / "victoriametrics" / "vmalert.env").read_text()
    assert re.search(rf"^#.*-external\.label={label}=https://", vmalert, re.M), vmalert
