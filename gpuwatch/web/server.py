"""The agent's HTTP server: /metrics, /healthz, /health/gpus, a plain status page and the runbooks, one thread per
request.

/healthz is the agent's liveness (systemd watchdog, Kubernetes livenessProbe): 503 only when the agent itself is
stuck (its first poll not finished, a poll loop hung in a vendor call), never for the hardware's faults, which a
restart does not mend. /health/gpus is the node's GPU health for a load balancer or a scheduler's node check: 503
with one line per problem while a GPU is lost or missing, a vendor library is down, or any condition an alert rule
pages on shows (docs/configuration.md, "Health endpoints"); asked for JSON (Accept or ?format=json), the same status
with each GPU's verdict (docs/verdicts.md). /runbooks is docs/runbooks.md, rendered on the first
request (gpuwatch.web.runbooks_page), where every alert's runbook link points by default.

A scrape only renders what the store already holds, so a slow client or a hung GPU never blocks another scrape.
What a client can hold before it is answered — connections, threads, time, header bytes — is bounded by
gpuwatch.web.connections; plain HTTP sent to the TLS port gets a 400 saying so, as Go's net/http answers.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from gpuwatch.web.connections import (
    EMFILE_PAUSE_SECONDS,
    HEAD_DEADLINE_SECONDS,
    LISTEN_BACKLOG,
    Connection,
    ConnectionTable,
    HeadTooLarge,
    looks_like_plain_http,
    read_head,
    simple_response,
)
from gpuwatch.web.runbooks_page import CONTENT_SECURITY_POLICY, RunbooksPage, RunbooksUnavailable

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
Environ = dict[str, Any]
HealthCheck = Callable[[], tuple[bool, str]]
HealthDocument = Callable[[], tuple[bool, dict[str, Any]]]  # /health/gpus as JSON (gpuwatch.judge.gpu_verdict)
StatusPage = Callable[[], str]

MAX_REQUEST_LINE = 8192
CLIENT_TIMEOUT_SECONDS = 30.0  # per read; the total deadlines are gpuwatch.web.connections'
STOP_WAIT_SECONDS = 1.0  # for the accept and reaper threads, which wake at once when asked to stop
PLAIN_HTTP_ON_TLS = "Client sent an HTTP request to an HTTPS server.\n"  # Go's words, which operators search for


class ListenError(Exception):
    """The listen address cannot be bound (port in use, permission, bad host): exit 69."""


class _QuietHandler(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT_SECONDS

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def handle(self) -> None:
        """Read the request head within its limits first, then let wsgiref parse it from memory and run the app."""
        try:
            head = read_head(self.rfile)
        except HeadTooLarge as exc:
            self.wfile.write(simple_response(exc.status, "the request head is too large\n"))
            return
        if head is None:  # the client left, or was closed for its deadline
            return
        server = self.server
        if isinstance(server, _Server):
            server.head_done()
        self.rfile = io.BytesIO(head)  # a GET has no body; POST and others get 405 from the app
        super().handle()


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG
    wrap_socket: Callable[[socket.socket], socket.socket] | None = None  # TLS (gpuwatch.web.webconfig)
    table: ConnectionTable
    _local: threading.local
    _stopping = False
    _wake_fds: tuple[int, ...] = ()  # the stop pipe (read end, write end) while the server is open

    def serve_until_stopped(self) -> None:
        """Accept connections until `stop_serving`. socketserver's serve_forever wakes every poll_interval to look
        for a shutdown request; this waits in the selector without a timeout, woken by a byte on its own pipe, so
        an idle agent's HTTP side never wakes."""
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            if self._wake_fds:
                selector.register(self._wake_fds[0], selectors.EVENT_READ)
            while not self._stopping:
                for key, _ in selector.select():
                    if key.fileobj is self and not self._stopping:
                        self._accept_one()

    def _accept_one(self) -> None:
        """What socketserver does for a readable listening socket: accept, then hand over (process_request)."""
        try:
            request, client_address = self.get_request()
        except OSError:  # the client left before accept, or out of descriptors (get_request paused)
            return
        try:
            self.process_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
            self.shutdown_request(request)

    def stop_serving(self) -> None:
        self._stopping = True
        if self._wake_fds:
            os.write(self._wake_fds[1], b"x")

    def server_close(self) -> None:
        """Close the socket and the stop pipe, once: a descriptor number closed twice may be someone else's."""
        super().server_close()
        fds, self._wake_fds = self._wake_fds, ()
        for fd in fds:
            os.close(fd)

    def get_request(self) -> tuple[socket.socket, Any]:
        """accept(), but out of descriptors (EMFILE) frees one or pauses: never a 100 % CPU loop, never a traceback."""
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self.table.report(
                    "emfile",
                    f"out of file descriptors accepting a connection ({exc.strerror}); closing the oldest "
                    "unfinished request or pausing (LimitNOFILE= in the unit)",
                )
                evicted = self.table.evict_oldest_incomplete()
                time.sleep(0.01 if evicted else EMFILE_PAUSE_SECONDS)
            raise  # socketserver drops an OSError from accept quietly

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per admitted connection; refused (503) when every slot is answering or no thread starts."""
        conn = self.table.admit(request)
        if conn is None:
            self._refuse(request)
            return
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address, conn), daemon=True, name="http-conn"
        )
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread": TasksMax= or the memory for a stack is gone
            self.table.release(conn)
            self.table.report("threads", "cannot start a thread for a connection (TasksMax=?); answered 503")
            self._refuse(request)

    def _serve_connection(self, request: Any, client_address: Any, conn: Connection) -> None:
        self._local.conn = conn
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.table.release(conn)
            self.shutdown_request(request)

    def head_done(self) -> None:
        """The connection's request head is in: it is being answered and no longer evicted for a newcomer."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self.table.head_done(conn)

    def _refuse(self, request: socket.socket) -> None:
        if self.wrap_socket is None:  # a TLS client could not read a plain 503: it only sees the close
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(simple_response("503 Service Unavailable", "too many connections; retry shortly\n"))
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that stalls past the timeout or resets is routine: a debug line, not a traceback on stderr."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.debug("connection from %s ended: %s", client_address, exc)
        else:
            log.error("request from %s failed", client_address, exc_info=True)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Runs in the connection's own thread, so a slow or failing TLS handshake never blocks other scrapes."""
        if self.wrap_socket is None:
            super().finish_request(request, client_address)
            return
        if self._plain_http_answered(request):
            return
        try:
            tls = self.wrap_socket(request)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            log.debug("TLS handshake with %s failed: %s", client_address, exc)
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()

    def _plain_http_answered(self, request: socket.socket) -> bool:
        """A plain HTTP request on the TLS port gets a 400 naming the mistake instead of a reset."""
        try:
            request.settimeout(HEAD_DEADLINE_SECONDS)
            first = request.recv(5, socket.MSG_PEEK | socket.MSG_WAITALL)
        except OSError:
            return True  # silent or gone: nothing to answer
        if not looks_like_plain_http(first):
            return False
        with contextlib.suppress(OSError):
            request.sendall(simple_response("400 Bad Request", PLAIN_HTTP_ON_TLS))
        return True


def make_app(
    registry: CollectorRegistry,
    health: HealthCheck,
    status_page: StatusPage,
    metrics_app: Callable[..., Any] | None = None,  # the agent's: gpuwatch.exposition.cache
    gpu_health: HealthCheck | None = None,  # /health/gpus
    runbooks: RunbooksPage | None = None,  # /runbooks; the shipped docs/runbooks.md unless given
    gpu_health_json: HealthDocument | None = None,  # /health/gpus for `Accept: application/json` or ?format=json
) -> Callable[..., Any]:
    metrics_app = metrics_app or make_wsgi_app(registry)
    runbooks = runbooks or RunbooksPage()

    def app(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return _reply(start_response, "405 Method Not Allowed", b"use GET\n", extra=[("Allow", "GET, HEAD")])
        if path == "/metrics":
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        if path == "/healthz":
            ok, reason = health()
            return _reply(start_response, "200 OK" if ok else "503 Service Unavailable", f"{reason}\n".encode())
        if path == "/health/gpus" and gpu_health_json is not None and wants_json(environ):
            ok, document = gpu_health_json()
            body = (json.dumps(document, indent=2) + "\n").encode()
            status = "200 OK" if ok else "503 Service Unavailable"
            return _reply(start_response, status, body, content_type="application/json")
        if path == "/health/gpus" and gpu_health is not None:
            ok, reason = gpu_health()
            return _reply(start_response, "200 OK" if ok else "503 Service Unavailable", f"{reason}\n".encode())
        if path in ("/", "/index.html"):
            return _reply(start_response, "200 OK", status_page().encode(), content_type="text/html; charset=utf-8")
        if path == "/runbooks":
            try:
                page = runbooks.html()
            except RunbooksUnavailable as exc:  # a broken install: say so, and keep serving everything else
                return _reply(start_response, "500 Internal Server Error", f"{exc}\n".encode())
            return _reply(
                start_response,
                "200 OK",
                page,
                content_type="text/html; charset=utf-8",
                extra=[("Content-Security-Policy", CONTENT_SECURITY_POLICY)],
            )
        return _reply(
            start_response, "404 Not Found", b"not found; try /metrics, /healthz, /health/gpus, /runbooks or /\n"
        )

    return app


def wants_json(environ: Environ) -> bool:
    """A scheduler's check or a script asks for JSON by header or, where it cannot set one, by query."""
    if "json" in parse_qs(environ.get("QUERY_STRING", "")).get("format", []):
        return True
    accept = environ.get("HTTP_ACCEPT", "")
    return any(part.split(";")[0].strip().lower() == "application/json" for part in accept.split(","))


def head_as_get(app: Callable[..., Any]) -> Callable[..., Any]:
    """HEAD gets GET's status and headers and no body, from every layer (auth and TLS included): load balancers
    and uptime checkers ask this way."""

    def wrapped(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return app(environ, start_response)  # type: ignore[no-any-return]
        body = app({**environ, "REQUEST_METHOD": "GET"}, start_response)
        close = getattr(body, "close", None)
        if close is not None:
            close()
        return []

    return wrapped


def _reply(
    start_response: StartResponse,
    status: str,
    body: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    extra: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body))), *(extra or [])])
    return [body]


class HttpServer:
    """Binds at construction (so a taken port is an immediate, clear error) and serves in a daemon thread."""

    def __init__(
        self,
        host: str,
        port: int,
        app: Callable[..., Any],
        wrap_socket: Callable[[socket.socket], socket.socket] | None = None,
    ) -> None:
        server_class = _server_class_for(host, port)
        try:
            self._server = make_server(host or "", port, head_as_get(app), server_class, handler_class=_QuietHandler)
        except OSError as exc:
            hint = {
                errno.EADDRINUSE: "another process listens there; stop it or choose another --listen",
                errno.EACCES: "ports below 1024 need privileges; choose a port above 1024",
                errno.EADDRNOTAVAIL: "this host has no such address; use ':PORT' to listen on all",
            }.get(exc.errno or 0, "check --listen")
            raise ListenError(f"cannot listen on {host or '*'}:{port}: {exc.strerror} ({hint})") from None
        self._server.wrap_socket = wrap_socket
        self._server.table = ConnectionTable()
        self._server._local = threading.local()
        self._server._wake_fds = os.pipe()
        self._thread = threading.Thread(target=self._server.serve_until_stopped, name="http", daemon=True)
        self._reaper = threading.Thread(target=self._reap, name="http-deadlines", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        self._reaper.start()

    def stop(self) -> None:
        """Stop accepting and reaping; connections being answered finish in their own (daemon) threads."""
        self._server.stop_serving()
        self._server.table.stop_reaping()
        for thread in (self._thread, self._reaper):
            if thread.ident is not None:  # started
                thread.join(STOP_WAIT_SECONDS)
        self._server.server_close()

    def _reap(self) -> None:
        """Close connections past their deadlines (a total for the request head, not one per read)."""
        self._server.table.reap_until_stopped()


def _server_class_for(host: str, port: int) -> type[_Server]:
    """An IPv6 host needs an AF_INET6 socket; ':PORT' listens on IPv4 all-interfaces like node_exporter's default."""
    try:
        family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except socket.gaierror as exc:
        raise ListenError(f"cannot resolve listen host {host!r}: {exc}") from None

    class Server(_Server):
        address_family = family

    return Server
