"""The shared /metrics render: reused only while the store is unchanged and the same GPUs are fresh, so a cached body
is always what a fresh render of the request's own moment gives."""

from __future__ import annotations

import gzip
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from simnode import SimAgent

from gpuwatch.exposition.cache import CachedExposition
from gpuwatch.state.store import STALE_AFTER_POLLS

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def up(body: bytes) -> set[float]:
    return {
        s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == "gpuwatch_gpu_up"
    }


def test_the_cached_body_always_equals_a_fresh_render(tmp_path: Path) -> None:
    sim = SimAgent(tmp_path, scenario="mixed", gpus=4)
    try:
        cache = CachedExposition(sim.agent.store)
        sim.run(3.0)
        _, first = cache.render(None, False)
        assert first == generate_latest(sim.agent.registry)
        assert cache.render(None, False)[1] is first  # unchanged store: the one render is shared, not rebuilt
        _, zipped = cache.render(None, True)
        assert gzip.decompress(zipped) == first
        content_type, om = cache.render(OPENMETRICS, False)
        assert content_type.startswith("application/openmetrics-text") and om.endswith(b"# EOF\n")
        sim.run(2.0)  # polls changed the store: a new render, equal to the registry's own
        _, second = cache.render(None, False)
        assert second != first and second == generate_latest(sim.agent.registry)
        assert up(second) == {1.0}
        # No poll, only time passing: once the readings go stale the cached body must not be served.
        sim.clock.elapsed += STALE_AFTER_POLLS * sim.agent.config.agent.poll_interval_seconds + 0.5
        _, stale = cache.render(None, False)
        assert up(stale) == {0.0} and stale == generate_latest(sim.agent.registry)
    finally:
        sim.close()


def test_prerender_makes_ready_only_the_bodies_scrapers_took(tmp_path: Path) -> None:
    """After a poll the agent renders, off the scrape path, exactly the bodies served since the store last changed:
    a scraper at least as frequent as the poll finds its body ready, and nobody pays for formats nobody asked for."""
    sim = SimAgent(tmp_path, scenario="mixed", gpus=4)
    try:
        cache = CachedExposition(sim.agent.store)
        sim.run(2.0)
        cache.prerender()  # nothing served yet: nothing rendered
        assert not cache.ready(None, False) and not cache.ready(OPENMETRICS, True)
        cache.render(None, False)
        cache.render(OPENMETRICS, True)
        sim.run(2.0)  # a poll changed the store
        assert not cache.ready(None, False) and not cache.ready(OPENMETRICS, True)
        cache.prerender()
        assert cache.ready(None, False) and cache.ready(OPENMETRICS, True)
        assert not cache.ready(None, True) and not cache.ready(OPENMETRICS, False)
        _, text = cache.render(None, False)
        assert text == generate_latest(sim.agent.registry)  # what was prerendered is the store's current state
        _, om = cache.render(OPENMETRICS, True)
        assert gzip.decompress(om) == CachedExposition(sim.agent.store).render(OPENMETRICS, False)[1]
        # A scraper that stopped: after the next change only what was taken since is rendered (text), then nothing.
        sim.run(2.0)
        cache.render(None, False)
        sim.run(2.0)
        cache.prerender()
        assert cache.ready(None, False) and not cache.ready(OPENMETRICS, True)
        sim.run(2.0)
        cache.prerender()
        assert not cache.ready(None, False)
    finally:
        sim.close()
