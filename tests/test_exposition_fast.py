"""The fast encoders against their oracle: prometheus_client's own encoders, byte for byte, for every scenario of both
vendors and every format a scraper can ask for, and for any label values and numbers (hypothesis); and the hand-back
to the library for what they do not write."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from simnode import IN_THREAD_SCENARIOS, SimAgent

from gpuwatch.exposition import fast as exposition_fast
from gpuwatch.exposition.catalogue import CATALOGUE
from gpuwatch.exposition.exporter import SnapshotExporter, export
from gpuwatch.exposition.fast import Row, SeriesLines, fast_format, render

ACCEPTS = {
    "classic text (curl, Prometheus < 2.5)": "",
    "text 0.0.4": "text/plain;version=0.0.4",
    "OpenMetrics (Prometheus 2.x)": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    "OpenMetrics without a version": "application/openmetrics-text",
    "OpenMetrics, UTF-8 names (Prometheus 3)": "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
    "text 1.0.0, UTF-8 names": "text/plain;version=1.0.0;escaping=allow-utf-8",
}


def library_and_fast(collector: Collector, accept: str) -> tuple[bytes, bytes | None]:
    encoder, _ = choose_encoder(accept)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    fmt = fast_format(encoder)
    assert fmt is not None, f"{accept!r} should take the fast path"
    return encoder(registry), render(collector.collect(), fmt)


@pytest.mark.parametrize(
    "scenario, vendor",
    # `mig` splits an NVIDIA GPU with MIG: an AMD node refuses it (test_mig.py holds that).
    [(s, v) for s in IN_THREAD_SCENARIOS for v in ("nvidia", "amd") if (s, v) != ("mig", "amd")],
)
def test_every_scenario_renders_exactly_as_the_library_does(tmp_path: Path, scenario: str, vendor: str) -> None:
    sim = SimAgent(tmp_path, scenario=scenario, gpus=3, vendor=vendor, probe={"interval_seconds": 60.0})
    try:
        sim.run(6.0)
        collector = SnapshotExporter(sim.agent.store)
        lines = SeriesLines()
        export(sim.agent.store.snapshot(), lines)
        for what, accept in ACCEPTS.items():
            library, fast = library_and_fast(collector, accept)
            assert fast == library, f"{scenario}/{vendor}, {what}"
            assert lines.body(fast_format(choose_encoder(accept)[0]) or "") == library, f"{scenario}/{vendor}, {what}"
    finally:
        sim.close()


class _Odd(Collector):
    """Values and help texts the catalogue never produces, but a label value from a driver could."""

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily("x_odd", 'help with \\ backslash, "quotes"\nand a newline', labels=["model", "b"])
        gauge.add_metric(['H100 "SXM" \\ 80GB\nrev', "ünïcode ✓"], 1.5)
        gauge.add_metric(["inf", "x"], math.inf)
        gauge.add_metric(["-inf", "x"], -math.inf)
        gauge.add_metric(["nan", "x"], math.nan)
        gauge.add_metric(["big", "x"], 123456789012.0)
        gauge.add_metric(["tiny", "x"], 1e-12)
        yield gauge
        counter = CounterMetricFamily("x_events_total", "events", labels=["z", "a"])  # sorted by label name
        counter.add_metric(["1", "2"], 3)
        yield counter
        plain = GaugeMetricFamily("x_plain", "no labels")
        plain.add_metric([], 0)
        yield plain


@pytest.mark.parametrize("accept", list(ACCEPTS.values()), ids=list(ACCEPTS))
def test_escapes_and_numbers_match_the_library(accept: str) -> None:
    library, fast = library_and_fast(_Odd(), accept)
    assert fast == library


def test_what_it_does_not_write_goes_back_to_the_library() -> None:
    unit = GaugeMetricFamily("x_seconds", "with a unit", unit="seconds")
    unit.add_metric([], 1)
    stamped = GaugeMetricFamily("x_stamped", "with a timestamp", labels=["a"])
    stamped.add_metric(["1"], 1, timestamp=5)
    info = Metric("x_build", "an info family", "info")
    # A reserved label name (`__` first: prometheus_client's validation.py, RESERVED_METRIC_LABEL_NAME_RE) is quoted
    # by the library under UTF-8 escaping (openmetrics/exposition.py, escape_label_name) and never in a catalogue.
    reserved = GaugeMetricFamily("x_reserved", "a reserved label name", labels=["__"])
    reserved.add_metric([""], 0)
    for family in (unit, stamped, info, reserved):
        assert render([family], "text") is None and render([family], "openmetrics") is None
    # Escapings that rewrite names (dots, values) are the library's.
    for accept in (
        "application/openmetrics-text;version=1.0.0;escaping=dots",
        "text/plain;version=1.0.0;escaping=values",
    ):
        assert fast_format(choose_encoder(accept)[0]) is None


# --- properties: the library is the oracle for any label value, help text and number ------------------------------

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a shared CI host
# Names as the catalogue makes them (gpuwatch/exposition/catalogue.py: letters, digits, underscores; no colons, which
# are for recording rules), valid by construction: the encoder writes names as they are and escapes only what varies. A
# reserved label name (`__` first) goes back to the library (test_what_it_does_not_write_goes_back_to_the_library).
LEGACY_METRIC = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,15}", fullmatch=True)
LEGACY_LABEL = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True).filter(lambda name: name[:2] != "__")
# Any text but lone surrogates (no UTF-8 encoding exists for them, the library's or ours): backslash, quote, newline,
# control characters and astral-plane characters included, and the escapes' own spellings.
TEXT = st.one_of(
    st.text(max_size=20),
    st.lists(st.sampled_from(["\\", '"', "\n", "\\n", '\\"', "\r", "\t", "ü", "✓", "\U0001f600", "x"]), max_size=8).map(
        "".join
    ),
)
VALUE = st.floats(allow_nan=True, allow_infinity=True)


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def family(kind: str, name: str, help_text: str, names: list[str], rows: list[tuple[list[str], float]]) -> Metric:
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    built = cls(name, help_text, labels=names)
    for values, value in rows:
        built.add_metric(values[: len(names)], abs(value) if kind == "counter" else value)
    return built


def families_with(label_name: st.SearchStrategy[str]) -> st.SearchStrategy[list[Metric]]:
    one = st.tuples(
        st.sampled_from(["gauge", "counter"]),
        LEGACY_METRIC,
        TEXT,
        st.lists(label_name, max_size=3, unique=True),
    ).flatmap(
        lambda head: st.lists(st.tuples(st.lists(TEXT, min_size=3, max_size=3), VALUE), max_size=3).map(
            lambda rows: family(*head, rows)
        )
    )
    return st.lists(one, min_size=1, max_size=3, unique_by=lambda f: f.name)


@PROPERTY
@given(families_with(LEGACY_LABEL))
def test_property_any_label_value_help_and_number_render_as_the_library_does(families: list[Metric]) -> None:
    for accept in ACCEPTS.values():
        library, fast = library_and_fast(_Families(families), accept)
        assert fast == library, accept


_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**63), max_value=2**64),
    st.booleans(),
    st.sampled_from([0.0, -0.0, 1e6, 9999999.0, 12345678.9, 123456.789, 1e16, 85899345920, 5e-324, -1234567.5]),
    st.sampled_from([1023, 1024, True, False]),
)
_SAMPLES = st.lists(
    st.tuples(
        st.sampled_from(sorted(CATALOGUE)),
        st.lists(st.text(max_size=8) | st.sampled_from(["0", 'a"b', "a\\b", "a\nb", "ü✓"]), min_size=8, max_size=8),
        _NUMBERS,
        st.sampled_from(["add", "each", "row"]),
    ),
    max_size=40,
)
_ROWS = {name: Row(name) for name in CATALOGUE}  # kept across examples, as the exporter's are


class _Library(Collector):
    """The same samples as prometheus_client objects, made the way gpuwatch.exposition.exporter makes them."""

    def __init__(self, samples: list[tuple[str, tuple[str, ...], float]]) -> None:
        self.samples = samples

    def collect(self) -> Iterator[Metric]:
        made: dict[str, Metric] = {}
        for name, labels, value in self.samples:
            spec = CATALOGUE[name]
            if name not in made:
                cls = CounterMetricFamily if spec.type == "counter" else GaugeMetricFamily
                made[name] = cls(name, spec.help, labels=list(spec.labels))
            made[name].add_metric(list(labels), float(value))  # type: ignore[attr-defined]
        return iter(made.values())


@settings(max_examples=300, deadline=None)
@given(samples=_SAMPLES)
def test_any_labels_and_numbers_render_as_the_library_does(samples: list[tuple[str, list[str], float, str]]) -> None:
    """Label values with quotes, backslashes, newlines and non-ASCII; every float (inf, nan, -0.0, Go's exponents),
    ints and bools; samples added one by one, as a dict (`add_each`) or a row (`add_row`), prefixes and numbers
    remembered across examples."""
    lines = SeriesLines()
    added: list[tuple[str, tuple[str, ...], float]] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for name, values, number, way in samples:
        labels = tuple(values[: len(CATALOGUE[name].labels)])
        if (name, labels) in seen:
            continue  # one sample per series, as the exporter writes
        seen.add((name, labels))
        if way == "each" and labels:
            lines.add_each(name, labels[:-1], {labels[-1]: number})
        elif way == "row":
            lines.add_row(_ROWS[name], labels, (number,))
        else:
            lines.add(name, labels, number)
        added.append((name, labels, number))
    for accept in ACCEPTS.values():
        encoder, _ = choose_encoder(accept)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Library(added))
        assert lines.body(fast_format(encoder) or "") == encoder(registry), accept


@pytest.mark.parametrize("accept", ACCEPTS.values())
def test_numbers_that_are_equal_keep_their_own_text(accept: str) -> None:
    """Numbers are remembered by value, and equal values can be written differently: prometheus_client writes -0.0 as
    "-0.0" and 0.0 as "0.0" (utils.floatToGoString: repr of the float), an int as the float it equals (2 -> "2.0") and
    an int no float equals as the float nearest it. Each written after its equal twin, through every way in."""
    twins = [0, False, 0.0, -0.0, 0.0, 2, 2.0, True, 1.0, 2**53 + 1, float(2**53 + 1), 10**7, 1e7, -(10**7)]
    lines = SeriesLines()
    added: list[tuple[str, tuple[str, ...], float]] = []
    for i, value in enumerate(twins):
        for way, name in enumerate(("gpuwatch_gpu_power_watts", "gpuwatch_gpu_clock_hertz", "gpuwatch_gpu_processes")):
            labels = (str(i), "GPU-twin")
            if way == 0:
                lines.add(name, labels, value)
            elif way == 1:
                lines.add_each(name, labels, {"sm": value})
                labels = (*labels, "sm")
            else:
                lines.add_row(_ROWS[name], labels, (value,))
            added.append((name, labels, value))
    encoder, _ = choose_encoder(accept)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Library(added))
    body = lines.body(fast_format(encoder) or "")
    assert body == encoder(registry)
    assert b'gpuwatch_gpu_power_watts{gpu="3",uuid="GPU-twin"} -0.0\n' in body


def test_remembered_numbers_stay_bounded_and_keep_what_repeats() -> None:
    """Readings that change every poll (energy, power) must not grow the remembered numbers for ever: two generations
    of at most `_TEXT_LIMIT`; a number that comes back every poll stays remembered however many new ones pass, and
    what is written after the generations turned over is still the library's text."""
    polls, new_per_poll = 40, exposition_fast._TEXT_LIMIT // 3
    for poll in range(polls):
        lines = SeriesLines()
        added: list[tuple[str, tuple[str, ...], float]] = [
            ("gpuwatch_gpu_temperature_celsius", ("0", "GPU-bound", "core"), 85.0)  # the same every poll
        ]
        added += [
            ("gpuwatch_gpu_energy_joules_total", (str(i), "GPU-bound"), 1e6 + poll * new_per_poll + i + 0.5)
            for i in range(new_per_poll)
        ]
        for name, labels, value in added:
            lines.add(name, labels, value)
        remembered = len(exposition_fast._TEXTS) + len(exposition_fast._OLD_TEXTS)
        assert remembered <= 2 * exposition_fast._TEXT_LIMIT
        assert 85.0 in exposition_fast._TEXTS or 85.0 in exposition_fast._OLD_TEXTS
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Library(added))
    assert lines.body("text") == choose_encoder("")[0](registry)
