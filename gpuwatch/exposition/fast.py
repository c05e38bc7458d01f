"""The text and OpenMetrics encodings of gpuwatch's own families, byte for byte what prometheus_client writes.

prometheus_client's encoders validate and escape every metric and label name of every sample (they must accept any
collector); ours come from the catalogue and are valid by construction, so most of that work is wasted. `SeriesLines`
goes further: it is what gpuwatch.exposition.exporter writes its samples into, and it keeps each series' name-and-labels
prefix (escaped, sorted, once per series for the life of the process) and formats only the value, so a scrape never
builds prometheus_client objects at all (about a fifth of the cost: benchmarks/render.py). `render` does the
same for families a caller built (the uncached `name[]` filter) and hands anything it was not written for back to the
library (`None`). Tests hold both to the library's output for every scenario and both formats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, TypeVar

from prometheus_client import exposition
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _untyped_go_float

from gpuwatch.exposition.catalogue import CATALOGUE

Encoder = Callable[[Collector], bytes]
_go_float: Callable[[float], str] = _untyped_go_float  # the library's number format (+Inf, NaN, Go's exponents)

# Escapings that leave a valid legacy name unchanged; others (dots, values) rewrite names, so the library does those.
_PLAIN_ESCAPINGS = (openmetrics.UNDERSCORES, openmetrics.ALLOWUTF8)


def fast_format(encoder: Encoder) -> str | None:
    """'text' or 'openmetrics' when `encoder` (from prometheus_client's choose_encoder) writes what this module
    writes for our families; None for anything else."""
    func, escaping = encoder, openmetrics.UNDERSCORES
    if isinstance(encoder, partial):
        func, escaping = encoder.func, encoder.keywords.get("escaping", openmetrics.UNDERSCORES)
    if escaping not in _PLAIN_ESCAPINGS:
        return None
    if func is exposition.generate_latest:
        return "text"
    if func is openmetrics.generate_latest:
        return "openmetrics"
    return None


def render(families: Iterable[Any], fmt: str) -> bytes | None:
    """The body for `fmt` ('text' or 'openmetrics'), or None when a family holds something this encoder does not
    write (another type, a unit, a timestamp, an exemplar, a reserved `__` label name, which UTF-8 escaping quotes):
    the caller then uses the library."""
    text = fmt == "text"
    out: list[str] = []
    for family in families:
        kind = family.type
        if (
            kind not in ("gauge", "counter", "unknown") or family.unit
        ):  # unknown: gpuwatch.exposition.dcgm_compat's counters
            return None
        name = family.name
        if text:
            shown = name + "_total" if kind == "counter" else name
            help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
            kind = "untyped" if kind == "unknown" else kind
        else:
            shown = name
            help_text = _escape(family.documentation)
        out.append(f"# HELP {shown} {help_text}\n# TYPE {shown} {kind}\n")
        for sample in family.samples:
            if sample.timestamp is not None or sample.exemplar is not None or getattr(sample, "native_histogram", None):
                return None
            labels = sample.labels
            if any(name.startswith("__") for name in labels):
                return None
            if labels:
                pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
                out.append(f"{sample.name}{{{pairs}}} {_go_float(sample.value)}\n")
            else:
                out.append(f"{sample.name} {_go_float(sample.value)}\n")
    if not text:
        out.append("# EOF\n")
    return "".join(out).encode("utf-8")


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


# Series prefixes ('name{a="x",b="y"} '), kept for the life of the process: metric -> label values -> prefix, and for
# dict-shaped readings metric -> leading label values (the GPU) -> last label value(s) -> prefix, so a sample costs
# dict lookups and no tuple. Bounded: label values a node never repeats (XID codes, probe shapes, and above all the
# workloads of a busy node: every Slurm job and pod is a new id) must not grow them for ever; clearing one only costs
# the next render its prefixes. Two bounds: no metric's table past _PREFIX_LIMIT, and after each render
# (SeriesLines.bound_prefixes) none past twice the series it has now plus _PREFIX_SLACK, so a family whose series
# churn keeps about as many prefixes as it shows. Before that second bound, 20 new workloads a second filled the two
# workload families' tables to 10,000 each over 8 minutes, 12 MiB of RSS (benchmarks/workload_churn.py).
_PREFIXES: dict[str, dict[tuple[str, ...], str]] = {}
_EACH_PREFIXES: dict[str, dict[tuple[str, ...], dict[Any, str]]] = {}
_PREFIX_LIMIT = 10_000  # per metric
_PREFIX_SLACK = 1_000  # prefixes a metric may keep beyond twice its series in the last render
_HEADERS: dict[tuple[str, bool], str] = {}


class SeriesLines:
    """The samples of one snapshot as exposition lines, family by family in the order they first got a sample (the
    order prometheus_client writes `gpuwatch.exposition.exporter.families` in); `body(fmt)` joins them."""

    __slots__ = ("_lines",)

    def __init__(self) -> None:
        self._lines: dict[str, list[str]] = {}

    def add(self, name: str, labels: tuple[str, ...], value: float | int | bool | None) -> None:
        """One sample of catalogue metric `name` (None: the device cannot give it, so no series)."""
        if value is None:
            return
        known = _PREFIXES.get(name)
        prefix = known.get(labels) if known is not None else None
        if prefix is None:
            prefix = _prefix(name, labels)
            _remember(_PREFIXES, name, labels, prefix)
        number = _TEXTS.get(value) or _text(value) if value or value.__class__ is not float else repr(value)
        lines = self._lines.get(name)
        if lines is None:
            self._lines[name] = [prefix + number]
        else:
            lines.append(prefix + number)

    def add_row(self, row: Row, labels: tuple[str, ...], values: tuple[float | int | bool | None, ...]) -> None:
        """A sample of each of `row`'s metrics, all with `labels` (None values have no series): what `add` does for
        each, with the prefixes looked up once for the row."""
        prefixes = row.prefixes.get(labels)
        if prefixes is None:
            if len(row.prefixes) >= _PREFIX_LIMIT:
                row.prefixes.clear()
            prefixes = row.prefixes[labels] = tuple(_prefix(name, labels) for name in row.names)
        lines = self._lines
        texts = _TEXTS
        for name, prefix, value in zip(row.names, prefixes, values, strict=True):
            if value is None:
                continue
            number = texts.get(value) or _text(value) if value or value.__class__ is not float else repr(value)
            found = lines.get(name)
            if found is None:
                lines[name] = [prefix + number]
            else:
                found.append(prefix + number)

    def add_each(self, name: str, head: tuple[str, ...], values: dict[Any, Any]) -> None:
        """A sample per item of `values`, in key order: labels `head` + the key (a label value, or a tuple of them);
        None values have no series. What `add` does for each item, without a call or a tuple per sample."""
        if not values:
            return
        by_head = _EACH_PREFIXES.get(name)
        known = by_head.get(head) if by_head is not None else None
        if known is None:
            known = _remember(_EACH_PREFIXES, name, head, {})
        lines = self._lines.get(name)
        if lines is None:
            lines = self._lines[name] = []
        append = lines.append
        texts = _TEXTS
        for key, value in sorted(values.items()):
            if value is None:
                continue
            prefix = known.get(key)
            if prefix is None:
                prefix = known[key] = _prefix(name, head + (key if key.__class__ is tuple else (key,)))
            append(
                prefix + (texts.get(value) or _text(value) if value or value.__class__ is not float else repr(value))
            )
        if not lines:
            del self._lines[name]

    def bound_prefixes(self) -> None:
        """After a render: forget the prefixes of a metric that keeps more than twice its series now plus
        _PREFIX_SLACK, label values that came and went (workloads); its next render makes the live ones again."""
        for name, known in _PREFIXES.items():
            if len(known) > _PREFIX_SLACK:
                lines = self._lines.get(name)
                if len(known) > 2 * (len(lines) if lines is not None else 0) + _PREFIX_SLACK:
                    known.clear()

    def body(self, fmt: str) -> bytes:
        """The exposition in `fmt` ('text' or 'openmetrics'), exactly the bytes prometheus_client writes."""
        text = fmt == "text"
        out: list[str] = []
        for name, lines in self._lines.items():
            header = _HEADERS.get((name, text))
            if header is None:
                header = _HEADERS[(name, text)] = _header(name, text)
            out.append(header)
            out.append("\n".join(lines))
            out.append("\n")
        if not text:
            out.append("# EOF\n")
        return "".join(out).encode("utf-8")


_T = TypeVar("_T")


class Row:
    """Catalogue metrics with the same labels that are written together (one GPU's scalar readings), for
    `SeriesLines.add_row`: each label set's prefixes are kept on the row."""

    __slots__ = ("names", "prefixes")

    def __init__(self, *names: str) -> None:
        self.names = names
        self.prefixes: dict[tuple[str, ...], tuple[str, ...]] = {}  # labels -> a prefix per name


# Numbers as the library writes them, by value: a reading that did not change since the last poll (most of them) costs
# a dict lookup instead of a repr and Go's exponent rules. Equal keys share their text: an int or bool is written as
# the float it equals (float(2) -> "2.0", False -> "0.0"), an int no float equals is a key of its own. The exception is
# a float zero: 0.0 and -0.0 are equal keys with different text, so the writers take its repr, which is the library's.
# Two generations bound the memory (readings that change every poll, energy and power, would fill one dict for ever):
# when the young one is full it becomes the old one, and a number found only in the old one moves back to the young,
# so what repeats poll after poll stays. The writers (`add`, `add_row`, `add_each`) each inline the lookup
# `texts.get(value) or _text(value) if value or value.__class__ is not float else repr(value)`: a call per sample
# would cost about what the lookup saves.
_TEXT_LIMIT = 2048  # numbers per generation: at most ~0.5 MiB for both
_TEXTS: dict[float | int | bool, str] = {i: repr(float(i)) for i in range(1024)}
_OLD_TEXTS: dict[float | int | bool, str] = {}


def _text(value: float | int | bool) -> str:
    """The text of `value` after a miss in `_TEXTS` (never a float zero): from the old generation, or made; kept in
    the young one."""
    global _TEXTS, _OLD_TEXTS
    number = _OLD_TEXTS.get(value) or _number(value)
    if len(_TEXTS) >= _TEXT_LIMIT:
        _OLD_TEXTS, _TEXTS = _TEXTS, {}
    _TEXTS[value] = number
    return number


def _number(value: float | int | bool) -> str:
    """prometheus_client's floatToGoString(value), without its work for the common case."""
    number = repr(float(value))
    if len(number) > 8 or number[-1] in "fn":
        return _go_number(number, float(value))
    return number


def _go_number(number: str, value: float) -> str:
    """floatToGoString for a repr that may need it (inf, nan, or a positive number with 7+ digits before the point,
    which Go writes with an exponent), from the repr already made."""
    if number[-1] in "fn":
        return _go_float(value)
    dot = number.find(".")
    if dot > 6 and value > 0:
        mantissa = f"{number[0]}.{number[1:dot]}{number[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return number


def _remember(table: dict[str, dict[tuple[str, ...], _T]], name: str, key: tuple[str, ...], value: _T) -> _T:
    known = table.setdefault(name, {})
    if len(known) >= _PREFIX_LIMIT:
        known.clear()
    known[key] = value
    return value


def _family_name(name: str) -> str:
    """The family name prometheus_client gives a catalogue metric: a counter's without its _total suffix."""
    return name.removesuffix("_total") if CATALOGUE[name].type == "counter" else name


def _header(name: str, text: bool) -> str:
    spec = CATALOGUE[name]
    family = _family_name(name)
    if text:
        shown = family + "_total" if spec.type == "counter" else family
        help_text = spec.help.replace("\\", r"\\").replace("\n", r"\n")
    else:
        shown, help_text = family, _escape(spec.help)
    return f"# HELP {shown} {help_text}\n# TYPE {shown} {spec.type}\n"


def _prefix(name: str, labels: tuple[str, ...]) -> str:
    """'name{label="value",...} ' for one series: labels sorted by name and escaped as the library does."""
    spec = CATALOGUE[name]
    sample = _family_name(name) + ("_total" if spec.type == "counter" else "")
    if len(labels) != len(spec.labels):
        raise ValueError(f"{name}: {len(labels)} label values for labels {spec.labels}")
    if not labels:
        return sample + " "
    pairs = ",".join(f'{k}="{_escape(_encodable(v))}"' for k, v in sorted(zip(spec.labels, labels, strict=True)))
    return f"{sample}{{{pairs}}} "


def _encodable(value: str) -> str:
    """A label value UTF-8 can encode: undecodable bytes kept as surrogate escapes (a hwmon or IPMI name) become
    U+FFFD, so one bad label never breaks the scrape."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return value
