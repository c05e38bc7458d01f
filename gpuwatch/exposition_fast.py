"""The text and OpenMetrics encodings of gpuwatch's own families, byte for byte what prometheus_client writes.

prometheus_client's encoders validate and escape every metric and label name of every sample (they must accept any
collector); ours come from the catalogue and are valid by construction, so most of that work is wasted: about 2 ms of
a 1-GPU scrape and most of an 8-GPU one on a small host. This encoder does only what can vary (label values, help
text, the number) and hands anything it was not written for back to the library (`None`). Tests hold its output to
the library's for every scenario and both formats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from prometheus_client import exposition
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _untyped_go_float

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
    write (another type, a unit, a timestamp, an exemplar): the caller then uses the library."""
    text = fmt == "text"
    out: list[str] = []
    for family in families:
        kind = family.type
        if kind not in ("gauge", "counter", "unknown") or family.unit:  # unknown: gpuwatch.dcgm_compat's counters
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
