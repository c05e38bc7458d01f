"""`gpuwatch health`: asks the local agent for its GPUs' verdicts (/health/gpus as JSON) and answers with its exit
status, so a script, NHC or Slurm's HealthCheckProgram needs nothing but the status: 0 healthy, 1 a GPU (or the node)
needs action, 2 bad usage, 69 when it cannot tell (the agent unreachable, asking for credentials, or a bad answer).

It reads the agent over HTTP(S) only, never the GPUs, so it answers in well under a second and never hangs in a driver.
An https URL is verified against the system's CAs; basic auth credentials are not sent (a 401 says so).

`--npd` answers node-problem-detector instead (docs/kubernetes.md): its custom plugin contract's statuses (0 OK,
1 NonOK, 2 Unknown) and one line on stdout short enough for NPD's default max_output_length, which becomes the node
condition's message, so it names the GPU, its action and its first evidence. The full reason of an Unknown goes to
stderr (NPD's log); nothing it prints is ever a traceback.
"""

from __future__ import annotations

import json
import logging
import ssl
import sys
import threading
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from gpuwatch.config.settings import Config, parse_listen
from gpuwatch.core.exitcodes import (
    EXIT_NOT_OK,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    NPD_MAX_OUTPUT_LENGTH,
    NPD_NON_OK,
    NPD_OK,
    NPD_UNKNOWN,
)
from gpuwatch.judge.gpu_verdict import ACTIONS, STATES

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 10.0
PATH = "/health/gpus"


class CannotTell(Exception):
    """The agent gave no verdict: unreachable, refused us, or answered something that is not the document. `short`
    says the same in a few words, for a node condition's message."""

    def __init__(self, message: str, short: str | None = None) -> None:
        super().__init__(message)
        self.short = short or message


def default_url(config: Config) -> str:
    """The configured listen address as a loopback base URL: an agent listening on every address (':9845',
    '0.0.0.0', '::') is asked on this machine's loopback."""
    host, port = parse_listen(config.agent.listen)
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def health_url(base: str) -> str:
    """BASE (http://HOST:PORT, optionally with a path prefix) + /health/gpus; ValueError names what is wrong."""
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--url {base!r} is not an http:// or https:// base URL (e.g. http://127.0.0.1:9845)")
    return base.rstrip("/") + PATH


def fetch(url: str, timeout_seconds: float = TIMEOUT_SECONDS) -> dict[str, Any]:
    """The agent's document; CannotTell with the reason when there is none to read. `timeout_seconds` bounds each
    socket operation (connect, each read), not the whole exchange: `gpuwatch slurm` holds a deadline over it."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise CannotTell(
                f"{url}: the agent asks for credentials (401, basic auth in its web config); gpuwatch health sends "
                "none: ask it on an address without auth",
                "the agent asks for credentials (401); ask it on an address without auth",
            ) from None
        status, body = exc.code, exc.read()
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLError):  # the certificate is the agent's problem, not the network's
            raise CannotTell(
                f"{url}: TLS failed ({exc.reason}); is the agent's certificate (or its CA) trusted on this machine?",
                f"TLS to the agent failed ({exc.reason})",
            ) from None
        raise CannotTell(
            f"cannot reach the agent at {url}: {exc.reason}; is gpuwatch running there?",
            f"agent unreachable at {urlsplit(url).netloc}: {exc.reason}",
        ) from None
    except ssl.SSLError as exc:  # raised after the handshake (a reset mid-read)
        raise CannotTell(f"{url}: TLS failed ({exc})", f"TLS to the agent failed ({exc})") from None
    except (OSError, ValueError) as exc:
        raise CannotTell(
            f"cannot reach the agent at {url}: {exc}", f"agent unreachable at {urlsplit(url).netloc}: {exc}"
        ) from None
    return _document(url, status, body)


def _document(url: str, status: int, body: bytes) -> dict[str, Any]:
    if status not in (200, 503):
        raise CannotTell(
            f"{url} answered {status}: {body[:200].decode(errors='replace').strip()}",
            f"the agent answered {status} at {urlsplit(url).path}",
        )
    try:
        document = json.loads(body)
    except ValueError:
        raise CannotTell(
            f"{url} answered {status} but not JSON (an agent older than gpuwatch health?)",
            "the agent answered no JSON (older than gpuwatch health?)",
        ) from None
    if (
        not isinstance(document, dict)
        or not isinstance(document.get("healthy"), bool)
        or not isinstance(document.get("gpus"), list)
    ):
        raise CannotTell(
            f"{url} answered JSON without the verdicts ('healthy' and 'gpus')", "the agent's JSON has no verdicts"
        )
    if document["healthy"] != (status == 200):
        raise CannotTell(
            f"{url} answered {status} with healthy={document['healthy']}: they disagree",
            f"the agent's status {status} and its JSON disagree",
        )
    return document


def render(document: dict[str, Any]) -> str:
    """A line per GPU (state and action, then its evidence indented) and the node's own problems."""
    lines = [f"{document.get('node', '?')}: {'healthy' if document['healthy'] else 'needs action'}"]
    for gpu in document["gpus"]:
        uuid = gpu.get("uuid") or "no UUID"
        lines.append(f"GPU {gpu.get('index')} ({uuid}): {gpu.get('state')}, {gpu.get('action')}")
        lines += [f"  {line}" for line in gpu.get("evidence", [])]
    lines += [f"node: {line}" for line in document.get("node_findings", [])]
    return "\n".join(lines)


def health(config: Config, url: str | None, as_json: bool) -> int:
    try:
        target = health_url(url if url is not None else default_url(config))
    except ValueError as exc:
        print(f"gpuwatch health: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        document = _fetch_within(target, TIMEOUT_SECONDS)
    except CannotTell as exc:
        print(f"gpuwatch health: cannot tell: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(json.dumps(document, indent=2) if as_json else render(document))
    return EXIT_OK if document["healthy"] else EXIT_NOT_OK


def fit(text: str, limit: int = NPD_MAX_OUTPUT_LENGTH) -> str:
    """TEXT on one line in at most LIMIT bytes of UTF-8, cut at a character (NPD cuts bytes, and half a character
    would reach the node object as invalid UTF-8) and marked '...' where cut."""
    line = " ".join(text.split())
    if len(line.encode()) <= limit:
        return line
    return line.encode()[: limit - 3].decode(errors="ignore").rstrip() + "..."


def _severity(gpu: dict[str, Any]) -> tuple[int, int, int]:
    """Worst first: the heaviest action, then the worst state, then the lowest index. An action or state this
    version does not know (a newer agent) counts as the worst."""
    action, state = gpu.get("action"), gpu.get("state")
    index = gpu.get("index")
    return (
        -(ACTIONS.index(action) if action in ACTIONS else len(ACTIONS)),
        -(STATES.index(state) if state in STATES else len(STATES)),
        index if isinstance(index, int) else 1 << 30,
    )


def npd_message(document: dict[str, Any]) -> str:
    """The node condition's message: the GPU that needs the most, its action (its state when it has none) and its
    first evidence, with how many more GPUs need something; or the node's first problem; when healthy, /health/gpus's
    own plain answer (a GPU may still ask for restart_app then: that is the application's, not the node's)."""
    gpus = [g for g in document["gpus"] if isinstance(g, dict)]
    if document["healthy"]:
        return fit(f"ok: {len(gpus)} GPUs healthy")
    needing = sorted((g for g in gpus if g.get("action") != "none" or g.get("state") != "healthy"), key=_severity)
    if needing:
        worst = needing[0]
        action = worst.get("action")
        head = f"GPU {worst.get('index')} {action if action != 'none' else worst.get('state')}"
        if len(needing) > 1:
            head += f" (+{len(needing) - 1} more)"
        evidence = worst.get("evidence") or []
        return fit(f"{head}: {evidence[0]}" if evidence and isinstance(evidence[0], str) else head)
    findings = document.get("node_findings") or []
    if findings:
        return fit(f"node: {findings[0]}")
    return fit("the node needs action: `gpuwatch health` says why")


def _fetch_within(url: str, seconds: float) -> dict[str, Any]:
    """fetch() with a deadline for the whole answer: the socket timeout bounds each read, not an agent that drips its
    reply, and NPD kills a plugin past the rule's timeout with a message of its own."""
    outcome: dict[str, Any] = {}

    def ask() -> None:
        try:
            outcome["document"] = fetch(url)
        except CannotTell as exc:
            outcome["error"] = exc
        except Exception as exc:  # whatever it is, NPD gets Unknown and a line, never a traceback
            outcome["error"] = CannotTell(f"{url}: {type(exc).__name__}: {exc}", f"{type(exc).__name__}: {exc}")

    asker = threading.Thread(target=ask, name="gpuwatch-health", daemon=True)
    asker.start()
    asker.join(seconds)
    if asker.is_alive():
        raise CannotTell(f"{url}: no answer within {seconds:g} s", f"the agent gave no answer within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["document"]  # type: ignore[no-any-return]


def npd_unknown(short: str, detail: str | None = None) -> int:
    """Unknown for NPD: the reason in a few words on stdout (the condition's message), in full on stderr (its log)."""
    print(fit(f"cannot tell: {short}"))
    print(f"gpuwatch health --npd: cannot tell: {detail or short}", file=sys.stderr)
    return NPD_UNKNOWN


def npd_health(config: Config, url: str | None) -> int:
    """`gpuwatch health --npd`: NPD's OK when healthy, NonOK when a GPU (or the node) needs action, Unknown when it
    cannot tell or was used wrongly."""
    try:
        target = health_url(url if url is not None else default_url(config))
    except ValueError as exc:
        return npd_unknown(f"bad usage: {exc}")
    try:
        document = _fetch_within(target, TIMEOUT_SECONDS)
        message = npd_message(document)
    except CannotTell as exc:
        return npd_unknown(exc.short, str(exc))
    except Exception as exc:  # an agent's odd document must not end in a traceback in NPD's log
        return npd_unknown(f"unreadable verdicts ({type(exc).__name__}: {exc})")
    print(message)
    return NPD_OK if document["healthy"] else NPD_NON_OK
