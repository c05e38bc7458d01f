"""A line chart as inline SVG: a few series over time, axes in their units, and marks (a fault's time).

Small on purpose: a case file must open anywhere, offline, without script, so its plots are markup. Each series
is a polyline in data order; gaps (a GPU that stopped answering) stay gaps, drawn as separate polylines.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH, HEIGHT = 760, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 12, 42
COLOURS = ("#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df")


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    points: Sequence[Sequence[float]]  # [[unix time, value], …]


def _fmt(value: float, span: float) -> str:
    """A tick label with the digits that tell ticks `span / 4` apart (1.002 and 1.004, not 1 and 1)."""
    magnitude = abs(value)
    factor, suffix = next(
        ((f, s) for f, s in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")) if magnitude >= f), (1, "")
    )
    tick = span / 4 / factor
    decimals = max(0, min(6, -math.floor(math.log10(tick)) + 1)) if tick > 0 else 0
    return f"{value / factor:.{decimals}f}{suffix}"


def _clock(t: float, span: float) -> str:
    return time.strftime("%H:%M:%S" if span < 86400 else "%m-%d %H:%M", time.gmtime(t))


def _segments(points: Sequence[Sequence[float]], step: float) -> list[list[tuple[float, float]]]:
    """The points split where the gap between two is over three steps (no data there)."""
    runs: list[list[tuple[float, float]]] = []
    last = None
    for t, v in points:
        if last is None or t - last > 3 * step:
            runs.append([])
        runs[-1].append((t, v))
        last = t
    return runs


def line_chart(
    title: str,
    unit: str,
    series: Sequence[Series],
    start: float,
    end: float,
    step: float = 1.0,
    marks: Sequence[tuple[float, str]] = (),
) -> str:
    """The chart's <figure>; a sentence instead when no series has a point."""
    values = [v for s in series for _, v in s.points]
    caption = f"<figcaption>{html.escape(title)} ({html.escape(unit)})</figcaption>"
    if not values or end <= start:
        return f'<figure class="plot">{caption}<p class="none">no data in this window</p></figure>'
    low, high = min(values), max(values)
    if high == low:
        low, high = low - (abs(low) * 0.05 or 1.0), high + (abs(high) * 0.05 or 1.0)
    pad = (high - low) * 0.08
    low, high = low - pad, high + pad
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - start) / (end - start) * plot_w

    def y(v: float) -> float:
        return TOP + (high - v) / (high - low) * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{html.escape(title)}">',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#bbb"/>',
    ]
    for i in range(5):  # horizontal grid and value labels
        v = low + (high - low) * i / 4
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>')
        label = _fmt(v, high - low)
        parts.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end" font-size="11">{label}</text>')
    for i, anchor in enumerate(("start", "middle", "middle", "middle", "end")):  # time labels, inside the width
        t = start + (end - start) * i / 4
        parts.append(
            f'<text x="{x(t):.1f}" y="{TOP + plot_h + 16}" text-anchor="{anchor}" font-size="11">'
            f"{_clock(t, end - start)}</text>"
        )
    parts.append(
        f'<text x="{LEFT + plot_w}" y="{HEIGHT - 6}" text-anchor="end" font-size="11" fill="#555">time (UTC)</text>'
    )
    for t, label in marks:
        if start <= t <= end:
            parts.append(
                f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#cf222e" '
                'stroke-dasharray="4 3"/>'
            )
            right = x(t) > LEFT + plot_w * 0.7  # near the right edge: the label goes to the line's left
            parts.append(
                f'<text x="{x(t) + (-4 if right else 4):.1f}" y="{TOP + 12}" font-size="11" fill="#cf222e" '
                f'text-anchor="{"end" if right else "start"}">{html.escape(label)}</text>'
            )
    legend = []
    for i, s in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        for run in _segments(s.points, step):
            coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in run)
            if len(run) == 1:
                t, v = run[0]
                parts.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2.5" fill="{colour}"/>')
            else:
                parts.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1.6"/>')
        legend.append(f'<span style="color:{colour}">━ {html.escape(s.label)}</span>')
    parts.append("</svg>")
    return f'<figure class="plot">{caption}{"".join(parts)}<div class="legend">{" ".join(legend)}</div></figure>'
