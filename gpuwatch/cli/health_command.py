"""`gpuwatch health`: asks the local agent for its GPUs' verdicts (/health/gpus as JSON) and answers with its exit
status, so a script, NHC or Slurm's HealthCheckProgram needs nothing but the status: 0 healthy, 1 a GPU (or the node)
needs action, 2 bad usage, 69 when it cannot tell (the agent unreachable, asking for credentials, or a bad answer).

It reads the agent over HTTP(S) only, never the GPUs, so it answers in well under a second and never hangs in a driver.
An https URL is verified against the system's CAs; basic auth credentials are not sent (a 401 says so).
"""

from __future__ import annotations

import json
import logging
import ssl
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from gpuwatch.config.settings import Config, parse_listen
from gpuwatch.core.exitcodes import EXIT_NOT_OK, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 10.0
PATH = "/health/gpus"


class CannotTell(Exception):
    """The agent gave no verdict: unreachable, refused us, or answered something that is not the document."""


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
                "none: ask it on an address without auth"
            ) from None
        status, body = exc.code, exc.read()
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLError):  # the certificate is the agent's problem, not the network's
            raise CannotTell(
                f"{url}: TLS failed ({exc.reason}); is the agent's certificate (or its CA) trusted on this machine?"
            ) from None
        raise CannotTell(f"cannot reach the agent at {url}: {exc.reason}; is gpuwatch running there?") from None
    except ssl.SSLError as exc:  # raised after the handshake (a reset mid-read)
        raise CannotTell(f"{url}: TLS failed ({exc})") from None
    except (OSError, ValueError) as exc:
        raise CannotTell(f"cannot reach the agent at {url}: {exc}") from None
    return _document(url, status, body)


def _document(url: str, status: int, body: bytes) -> dict[str, Any]:
    if status not in (200, 503):
        raise CannotTell(f"{url} answered {status}: {body[:200].decode(errors='replace').strip()}")
    try:
        document = json.loads(body)
    except ValueError:
        raise CannotTell(f"{url} answered {status} but not JSON (an agent older than gpuwatch health?)") from None
    if (
        not isinstance(document, dict)
        or not isinstance(document.get("healthy"), bool)
        or not isinstance(document.get("gpus"), list)
    ):
        raise CannotTell(f"{url} answered JSON without the verdicts ('healthy' and 'gpus')")
    if document["healthy"] != (status == 200):
        raise CannotTell(f"{url} answered {status} with healthy={document['healthy']}: they disagree")
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
        document = fetch(target)
    except CannotTell as exc:
        print(f"gpuwatch health: cannot tell: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(json.dumps(document, indent=2) if as_json else render(document))
    return EXIT_OK if document["healthy"] else EXIT_NOT_OK
