"""/metrics rendered once per store state: concurrent scrapes of an unchanged store share one render.

Rendering ~700 series is pure Python (about 0.35 ms with gpuwatch.exposition.fast, holding the GIL), so 200
scrapers at once would still queue behind 200 renders. Each request still takes its own store snapshot; the body is
reused only when that snapshot equals the one the body was rendered from (every field but the clock) and the same
GPUs are fresh. So a response is always exactly what its own snapshot would render: nothing the store no longer
holds, no GPU served after it went stale. Renders run one at a time under a lock, so a burst renders once and the
others wait for that body instead of rendering it again.

After each scheduler job (a poll), `prerender` renders the new store state's bodies in the job's thread — only
those that were served since the store last changed, so only for scrapers at least as frequent as the store's
changes: a scrape then finds its body ready (a cache miss took 2.2 ms at 8 GPUs and one scrape a second, a hit
0.5-1 ms). A scraper slower than the poll costs at most one render that nobody reads after each of its scrapes.

The format comes from the Accept header through `negotiate`, which hands prometheus_client's `choose_encoder` only
offers of a version Prometheus defines (text 0.0.4 and 1.0.0, OpenMetrics 0.0.1 and 1.0.0) and skips the others, as
Prometheus's own negotiation does (prometheus/common expfmt `Negotiate`: an offer of an unknown version is passed
over, and with none left the answer is text 0.0.4). The library raised on a version that is not dotted numbers
(`version=x`: a 500 and a traceback per request) and echoed any other into the Content-Type and the cache key
(`version=1.0.7`, `version=9.9`: a new body to render per spelling, and the poll thread re-rendering every one). So
the cache holds at most the 10 content types that known versions and escapings make, each plain or gzip.
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.openmetrics.exposition import ALLOWUTF8, DOTS, UNDERSCORES, VALUES
from prometheus_client.registry import Collector

from gpuwatch.core.latch import Latch
from gpuwatch.exposition.catalogue import CATALOGUE
from gpuwatch.exposition.exporter import Extension, export, families
from gpuwatch.exposition.fast import Encoder, SeriesLines, fast_format
from gpuwatch.exposition.fast import render as render_objects
from gpuwatch.state.store import SampleStore, StoreSnapshot

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

# The versions Prometheus defines for each format it scrapes (prometheus/common expfmt); "" is an offer without one.
KNOWN_VERSIONS = {
    "text/plain": ("", "0.0.4", "1.0.0"),
    "application/openmetrics-text": ("", "0.0.1", "1.0.0"),
}
_ESCAPINGS = (UNDERSCORES, DOTS, VALUES, ALLOWUTF8)
_unknown_offer = Latch(log)  # a warn-once notice: a client sending nonsense must not flood the journal


def canonical_accept(accept: str | None) -> tuple[str, str | None]:
    """The Accept header's offers of a format gpuwatch serves, in their order, each rewritten from known parts only
    (a known version, a known escaping; q-values and other parameters dropped, as `choose_encoder` ignores them);
    and the first offer skipped for an unknown version, or None."""
    offers: list[str] = []
    skipped: str | None = None
    for offer in (accept or "").split(","):
        media, *parameters = offer.split(";")
        media = media.strip().lower()
        known = KNOWN_VERSIONS.get(media)
        if known is None:
            continue  # */*, protobuf, text/html: choose_encoder passes over them too
        params: dict[str, str] = {}
        for parameter in parameters:
            name, equals, text = parameter.partition("=")
            if equals:
                params.setdefault(name.strip().lower(), text.strip().strip('"'))
        version, escaping = params.get("version", ""), params.get("escaping", "")
        if version not in known:
            skipped = skipped if skipped is not None else offer.strip()
            continue
        parts = [
            media,
            *([f"version={version}"] if version else []),
            *([f"escaping={escaping}"] if escaping in _ESCAPINGS else []),
        ]
        offers.append("; ".join(parts))
    return ",".join(offers), skipped


def negotiate(accept: str | None) -> tuple[Encoder, str]:
    """(encoder, content type) for a scrape's Accept header: prometheus_client's choice among the offers of known
    versions, text 0.0.4 when none is left. An offer of an unknown version is said once per process, not per request."""
    canonical, skipped = canonical_accept(accept)
    if skipped is not None:
        _unknown_offer.fail(
            "a scrape's Accept header offers %s, a version Prometheus does not define; such offers are skipped (text "
            "0.0.4 when nothing else is offered, as Prometheus's own negotiation does). Said once; later ones are not "
            "logged",
            ascii(skipped[:120]),
        )
    return choose_encoder(canonical)


class _Rendered(Collector):
    """The families of the one snapshot the cache key was taken from, for the library's encoders."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


def _key(snap: StoreSnapshot) -> tuple[StoreSnapshot, frozenset[str]]:
    """What the rendered body depends on: the snapshot without its clock, and which GPUs are fresh at that clock."""
    fresh = frozenset(uuid for uuid in snap.identities if snap.fresh(uuid) is not None)
    return dataclasses.replace(snap, now=0.0), fresh


class CachedExposition:
    """The current body per (format, gzip), rebuilt when a request's snapshot differs from the cached one."""

    def __init__(
        self, store: SampleStore, extension: Extension | None = None, extra_names: frozenset[str] = frozenset()
    ) -> None:
        self._store = store
        self._extension, self.extra_names = extension, extra_names  # [compat] families and their names
        self._lock = threading.Lock()
        self._key: tuple[StoreSnapshot, frozenset[str]] | None = None
        self._lines: SeriesLines | None = None  # the key's samples as lines: text and OpenMetrics share them
        self._bodies: dict[tuple[str, bool], bytes] = {}
        self._served: dict[tuple[str, bool], Encoder] = {}  # bodies of this key that a scrape has taken

    def render(self, accept: str | None, compress: bool) -> tuple[str, bytes]:
        """(content type, body) for a scrape that accepts `accept` and, when `compress`, gzip."""
        encoder, content_type = negotiate(accept)
        snap = self._store.snapshot()
        key = _key(snap)
        with self._lock:
            self._switch_locked(key)
            self._served[(content_type, compress)] = encoder
            return content_type, self._body_locked(snap, encoder, content_type, compress)

    def prerender(self) -> None:
        """Render the store's new state now, off the scrape path: each body served since the store last changed."""
        snap = self._store.snapshot()
        key = _key(snap)
        with self._lock:
            wanted = self._served
            if key == self._key or not wanted:
                return
            self._switch_locked(key)
            for (content_type, compress), encoder in wanted.items():
                self._body_locked(snap, encoder, content_type, compress)

    def ready(self, accept: str | None, compress: bool) -> bool:
        """Whether a scrape now would be answered without rendering (the store unchanged since its body was made)."""
        _, content_type = negotiate(accept)
        key = _key(self._store.snapshot())
        with self._lock:
            return key == self._key and (content_type, compress) in self._bodies

    def _switch_locked(self, key: tuple[StoreSnapshot, frozenset[str]]) -> None:
        if key != self._key:  # NaN readings never compare equal: such a store is simply rendered every time
            self._key, self._lines, self._bodies, self._served = key, None, {}, {}

    def _body_locked(self, snap: StoreSnapshot, encoder: Encoder, content_type: str, compress: bool) -> bytes:
        body = self._bodies.get((content_type, compress))
        if body is None:
            fmt = fast_format(encoder)
            if fmt is None or self._extension is not None:  # a format the fast lines do not write, or [compat]
                # families made from gpuwatch's own objects: the library's objects, then the fast encoder
                body = _library(list(families(snap, self._extension)), encoder)
            else:
                if self._lines is None:
                    self._lines = SeriesLines()
                    export(snap, self._lines)
                    self._lines.bound_prefixes()  # label values that came and went (workloads) are let go
                body = self._lines.body(fmt)
            if compress:
                body = gzip.compress(body)
            self._bodies[(content_type, compress)] = body
        return body

    def render_filtered(self, accept: str | None, names: set[str]) -> tuple[str, bytes]:
        """(content type, body) with only the families that have a sample named in `names` (`name[]`), uncached.

        prometheus_client's own filter finds collectors by the names they describe, and this registry describes
        none (auto_describe off), so it would answer every filter with an empty body."""
        encoder, content_type = negotiate(accept)
        metrics = [
            m for m in families(self._store.snapshot(), self._extension) if m.name in names or _sample_names(m) & names
        ]
        return content_type, _library(metrics, encoder)


def _library(metrics: list[Metric], encoder: Callable[[Any], bytes], *, printable: bool = False) -> bytes:
    """The body of prometheus_client objects: the fast encoder where it writes the format, else the library's."""
    fmt = fast_format(encoder)
    try:
        body = render_objects(metrics, fmt) if fmt is not None else None
        return body if body is not None else encoder(_Rendered(metrics))
    except UnicodeEncodeError:  # a label with a surrogate escape (an undecodable name): never a 500
        if printable:
            raise
        return _library(_printable(metrics), encoder, printable=True)


def _printable(metrics: list[Metric]) -> list[Metric]:
    """The families with every label value made encodable (undecodable bytes as U+FFFD): one bad label must
    never break the scrape."""

    def clean(text: str) -> str:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")

    for metric in metrics:
        metric.samples = [s._replace(labels={k: clean(v) for k, v in s.labels.items()}) for s in metric.samples]
    return metrics


def _sample_names(metric: Metric) -> set[str]:
    return {sample.name for sample in metric.samples}


_SAMPLE_SUFFIXES = ("", "_total", "_created", "_bucket", "_sum", "_count", "_info")


def exported_name(name: str) -> bool:
    """Whether `name` is a metric (family or sample name) gpuwatch can export.

    prometheus_client filters `name[]` by sample name and answers an empty 200 for a name it does not have; a
    typo then looks like a node with nothing to report. A filter naming only metrics gpuwatch never exports is a
    400 saying so instead; names that exist but have no samples right now (a probe that is off) still get 200."""
    return any(name.removesuffix(suffix) in CATALOGUE for suffix in _SAMPLE_SUFFIXES if name.endswith(suffix)) or any(
        f"{name}{suffix}" in CATALOGUE for suffix in _SAMPLE_SUFFIXES
    )


def cached_metrics_app(cache: CachedExposition, fallback: WsgiApp) -> WsgiApp:
    """A /metrics WSGI app serving GET from the cache (`name[]`: filtered, uncached); other methods go to `fallback`."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        if names is not None and not any(exported_name(name) or name in cache.extra_names for name in names):
            body = (
                f"name[]: gpuwatch exports no metric named {', '.join(sorted(set(names)))[:500]}; GET /metrics "
                "without name[] lists every metric\n"
            ).encode()
            headers = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
            start_response("400 Bad Request", headers)
            return [body]
        if environ.get("REQUEST_METHOD") != "GET":
            return fallback(environ, start_response)
        if names is not None:
            content_type, body = cache.render_filtered(environ.get("HTTP_ACCEPT"), set(names))
            start_response("200 OK", [("Content-Type", content_type), ("Content-Length", str(len(body)))])
            return [body]
        compress = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING") or "")
        content_type, body = cache.render(environ.get("HTTP_ACCEPT"), compress)
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if compress:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    return app
