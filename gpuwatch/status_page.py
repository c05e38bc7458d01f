"""The agent's own status page at `/`: what someone standing at one node wants to see, without Grafana.

Plain HTML, no JavaScript: one row per GPU with its readings against its own limits, and health flags that say what
is wrong and why (hot, throttling, power-capped, slow probe, memory errors, lost). It refreshes itself every 10 s.
Columns are a table of (header, cell) pairs, so adding one (e.g. the last probe) is one entry in ``COLUMNS``.
"""

from __future__ import annotations

import html
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuwatch import __version__
from gpuwatch.model import GpuIdentity, GpuSample
from gpuwatch.store import StoreSnapshot

# Reasons that are normal and say nothing about health (an idle GPU, a GPU at its power cap under load).
BENIGN_REASONS = frozenset({"gpu_idle", "sw_power_cap", "applications_clocks", "display_clock", "sync_boost"})
HOT_MARGIN_CELSIUS = 5.0  # "hot" this close to the slowdown threshold (the GpuTemperatureHigh rule's margin)
POWER_CAPPED_RATIO = 0.95  # the GpuPowerLimitBelowDefault rule's threshold
SLOW_PROBE_RATIO = 0.90  # the GpuUnderperforming rule's threshold
PROBE_FRESH_INTERVALS = 2  # a probe result older than this many probe intervals judges nothing (the rules' freshness)
REFRESH_SECONDS = 10

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:90em}
h1{font-size:1.4em;margin:0 0 .2em}p{margin:.3em 0}
table{border-collapse:collapse;margin-top:.8em}td,th{padding:.3em .5em;border-bottom:1px solid #ddd;text-align:right;
vertical-align:top}th{background:#f4f4f4;font-weight:600}td.l,th.l{text-align:left}
th,td{white-space:nowrap}td.health{white-space:normal;min-width:13em}td.wrap{white-space:normal;min-width:8em}
small{color:#666;font-weight:normal}tr.row-bad td{background:#fdecee}tr.row-warn td{background:#fff6e0}
.uuid{font-family:ui-monospace,monospace;font-size:.75em;color:#666}
.flag{display:inline-block;margin:0 .3em .2em 0;padding:.05em .45em;border-radius:.3em}
.bad{background:#b00020;color:#fff}.warn{background:#e08600;color:#fff}.ok{background:#1b5e20;color:#fff}
.muted{color:#888}.summary{font-size:1.1em;margin:.6em 0}
"""


@dataclass(frozen=True, slots=True)
class Flag:
    """One health finding: its severity (bad, warn) and the words a person reads."""

    level: str
    text: str


@dataclass(frozen=True, slots=True)
class GpuView:
    """Everything a row needs: the GPU, its fresh sample (None when lost) and the node's configured power limit."""

    identity: GpuIdentity
    sample: GpuSample | None
    error: str
    configured_limit_watts: float | None
    snap: StoreSnapshot


def health_flags(view: GpuView) -> list[Flag]:
    """What is wrong with this GPU, worst first; empty when healthy."""
    s = view.sample
    if s is None:
        return [Flag("bad", f"lost: {view.error}")]
    flags: list[Flag] = []
    core = s.temperature_celsius.get("core")
    slowdown = s.temperature_threshold_celsius.get(("core", "slowdown"))
    if core is not None and slowdown is not None and core >= slowdown - HOT_MARGIN_CELSIUS:
        level = "bad" if core >= slowdown else "warn"
        flags.append(Flag(level, f"hot: {core:.0f} °C, slowdown at {slowdown:.0f} °C"))
    memory = s.temperature_celsius.get("memory")
    memory_max = s.temperature_threshold_celsius.get(("memory", "max_operating"))
    if memory is not None and memory_max is not None and memory >= memory_max - HOT_MARGIN_CELSIUS:
        flags.append(
            Flag("bad" if memory >= memory_max else "warn", f"memory hot: {memory:.0f} °C, limit {memory_max:.0f} °C")
        )
    throttling = sorted(r for r, active in s.throttle_active.items() if active and r not in BENIGN_REASONS)
    if throttling:
        flags.append(Flag("bad", "throttling: " + ", ".join(r.replace("_", " ") for r in throttling)))
    enforced = s.power_limit_watts.get("enforced")
    reference, which = _reference_limit(s, view.configured_limit_watts)
    if enforced is not None and reference is not None and enforced < POWER_CAPPED_RATIO * reference:
        flags.append(Flag("warn", f"power-capped: limit {enforced:.0f} W, {which} {reference:.0f} W"))
    if s.power_supply_undersized:
        flags.append(Flag("bad", "power supply undersized"))
    fresh = _probe_fresh(view, view.identity.uuid)
    ratio = _probe_ratio(view) if fresh else None
    peers = _peer_ratio(view) if fresh else None
    if ratio is not None and ratio < SLOW_PROBE_RATIO:
        flags.append(Flag("warn", f"slow probe: {ratio:.0%} of its baseline"))
    elif peers is not None and peers < SLOW_PROBE_RATIO:
        flags.append(Flag("warn", f"slow probe: {peers:.0%} of the median of this node's {view.identity.model}s"))
    # A lifetime count: it never goes down, so it is a warning to look at, not a red flag forever (the
    # GpuEccUncorrectable alert judges its growth).
    uncorrectable = (s.ecc_errors_total.get("uncorrected") or 0) + (s.ecc_errors_total.get("deferred") or 0)
    if uncorrectable:
        flags.append(Flag("warn", f"{uncorrectable:.0f} uncorrectable ECC errors (lifetime count)"))
    if s.row_remap_failed:
        flags.append(Flag("bad", "row remap failed"))
    elif s.row_remap_pending:
        flags.append(Flag("warn", "row remap pending: reset the GPU"))
    if s.recovery_action:
        flags.append(Flag("bad", f"driver asks for recovery action {s.recovery_action}"))
    return flags


def _reference_limit(s: GpuSample, configured: float | None) -> tuple[float | None, str]:
    if configured is not None:
        return configured, "configured"
    return s.power_limit_watts.get("default"), "default"


def _probe_fresh(view: GpuView, uuid: str) -> bool:
    """Whether the GPU's last successful probe is younger than PROBE_FRESH_INTERVALS probe intervals."""
    probe = view.snap.probe
    outcome = probe.last_ok.get(uuid)
    if outcome is None:
        return False
    return view.snap.now - outcome.timestamp <= PROBE_FRESH_INTERVALS * probe.interval_seconds


def _peer_ratio(view: GpuView) -> float | None:
    """The last successful probe over the median of the node's GPUs of the same model and dtype (at least 3): a GPU
    can be slow from its first probe on, and then its own baseline is slow too."""
    probe = view.snap.probe
    mine = probe.last_ok.get(view.identity.uuid)
    if mine is None or mine.measured is None:
        return None
    peers = [
        o.measured.flops_median
        for uuid, o in probe.last_ok.items()
        if o.measured is not None
        and o.measured.dtype == mine.measured.dtype
        and (ident := view.snap.identities.get(uuid)) is not None
        and ident.model == view.identity.model
        and _probe_fresh(view, uuid)
    ]
    if len(peers) < 3:
        return None
    return mine.measured.flops_median / statistics.median(peers)


def _probe_ratio(view: GpuView) -> float | None:
    """The last successful probe over this GPU's baseline; None without a probe result or baseline."""
    outcome = view.snap.probe.last_ok.get(view.identity.uuid)
    return outcome.ratio if outcome is not None else None


# --- cells -------------------------------------------------------------------------------------------------------
def _gpu_cell(v: GpuView) -> str:
    i = v.identity
    pci = f"<br>PCI {html.escape(i.pci_bus_id)}" if i.pci_bus_id else ""
    return (
        f"<b>GPU {i.index}</b> <small>{html.escape(i.model or 'unknown model')}</small><br>"
        f'<span class="uuid">{html.escape(i.uuid)}{pci}</span>'
    )


def _health_cell(v: GpuView) -> str:
    flags = health_flags(v)
    if not flags:
        return '<span class="flag ok">ok</span>'
    return "".join(f'<span class="flag {f.level}">{html.escape(f.text)}</span>' for f in flags)


def _temperature_against(v: GpuView, sensor: str, threshold: str) -> str:
    s = v.sample
    assert s is not None
    now = s.temperature_celsius.get(sensor)
    limit = s.temperature_threshold_celsius.get((sensor, threshold))
    return f"{_num(now)} <small>/ {_num(limit)}</small>"


def _temp_cell(v: GpuView) -> str:
    return _temperature_against(v, "core", "slowdown")


def _memory_temp_cell(v: GpuView) -> str:
    return _temperature_against(v, "memory", "max_operating")


def _power_cell(v: GpuView) -> str:
    s = v.sample
    assert s is not None
    reference, which = _reference_limit(s, v.configured_limit_watts)
    return (
        f"{_num(s.power_watts)} <small>/ {_num(s.power_limit_watts.get('enforced'))}</small><br>"
        f"<small>{which} {_num(reference)}</small>"
    )


def _clock_cell(v: GpuView) -> str:
    s = v.sample
    assert s is not None
    sm, sm_max = s.clock_hertz.get("sm"), s.clock_max_hertz.get("sm")
    return f"{_num(_mhz(sm))} <small>/ {_num(_mhz(sm_max))}</small>"


def _util_cell(v: GpuView) -> str:
    s = v.sample
    assert s is not None
    util = None if s.utilization_ratio is None else s.utilization_ratio * 100
    used, total = s.memory_used_bytes, s.memory_total_bytes
    mem = "" if used is None or total is None else f"<br><small>{used / 2**30:.0f} / {total / 2**30:.0f} GiB</small>"
    return f"{_num(util)} %{mem}"


def _throttle_cell(v: GpuView) -> str:
    s = v.sample
    assert s is not None
    active = sorted(r for r, on in s.throttle_active.items() if on)
    if not active:
        return '<span class="muted">none</span>'
    return " ".join(
        f'<span class="muted">{html.escape(r)}</span>' if r in BENIGN_REASONS else f"<b>{html.escape(r)}</b>"
        for r in active
    )


def _probe_cell(v: GpuView) -> str:
    probe = v.snap.probe
    if not probe.enabled:
        return '<span class="muted">off</span>'
    last = probe.last_any.get(v.identity.uuid)
    if last is None:
        return '<span class="muted">not yet</span>'
    ago = f"<small>{_ago(v.snap.now - last.timestamp)} ago</small>"
    ratio = _probe_ratio(v)
    if last.result != "ok":
        why = f": {html.escape(last.reason)}" if last.reason else ""
        return f"{html.escape(last.result.replace('_', ' '))}{why}<br>{ago}"
    if last.measured is None:
        return f"ok<br>{ago}"
    tflops = f"{last.measured.flops_median / 1e12:.0f} TFLOP/s {html.escape(last.measured.dtype)}"
    share = "" if ratio is None else f"<br><small>{ratio:.0%} of baseline</small>"
    return f"{tflops}{share}<br>{ago}"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


Cell = Callable[[GpuView], str]
# (header, sub-header, cell, left-aligned); cells other than GPU and health only run for GPUs with a fresh sample.
COLUMNS: tuple[tuple[str, str, Cell, bool], ...] = (
    ("Core °C", "now / slowdown", _temp_cell, False),
    ("Memory °C", "now / max", _memory_temp_cell, False),
    ("Power W", "now / limit", _power_cell, False),
    ("SM clock MHz", "now / max", _clock_cell, False),
    ("Utilization", "memory used", _util_cell, False),
    ("Throttle reasons", "grey = normal", _throttle_cell, True),
    ("Last probe", "throughput", _probe_cell, True),
)


def render_status_page(snap: StoreSnapshot) -> str:
    views = [
        GpuView(
            i,
            snap.fresh(i.uuid),
            snap.gpu_errors.get(i.uuid, "no fresh readings"),
            snap.configured_power_limit_watts,
            snap,
        )
        for i in sorted(snap.identities.values(), key=lambda i: (i.index, i.uuid))
    ]
    rows = []
    attention = 0
    for v in views:
        flags = health_flags(v)
        level = "row-bad" if any(f.level == "bad" for f in flags) else "row-warn" if flags else ""
        attention += bool(flags)
        cells = [f'<td class="l">{_gpu_cell(v)}</td>', f'<td class="l health">{_health_cell(v)}</td>']
        if v.sample is None:
            cells.append(f'<td class="l muted" colspan="{len(COLUMNS)}">no readings</td>')
        else:
            cells += [f'<td class="{"l wrap" if left else ""}">{cell(v)}</td>' for _, _, cell, left in COLUMNS]
        rows.append(f'<tr class="{level}" id="gpu-{v.identity.index}">{"".join(cells)}</tr>')
    headers = "".join(
        f'<th class="{"l" if left else ""}">{html.escape(h)}<br><small>{html.escape(sub)}</small></th>'
        for h, sub, _, left in COLUMNS
    )
    backends = ", ".join(
        f'{html.escape(b)} <span class="flag {"ok" if up else "bad"}">'
        f"{'up' if up else 'down: ' + html.escape(msg)}</span>"
        for b, (up, msg) in sorted(snap.backends.items())
    )
    if not views:
        summary = "No GPUs found yet."
    elif attention:
        summary = f"<b>{attention} of {len(views)} GPUs need attention</b> (highlighted below)."
    else:
        summary = f"All {len(views)} GPUs healthy."
    host = html.escape(socket.gethostname())
    read_at = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(snap.now))
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_SECONDS}"><title>gpuwatch · {host}</title>
<style>{_STYLE}</style></head><body>
<h1>gpuwatch on {host}</h1>
<p class="summary">{summary}</p>
<p>Read {read_at}, refreshes every {REFRESH_SECONDS} s · backends: {backends or "none"} ·
<a href="/metrics">/metrics</a> (Prometheus) · <a href="/healthz">/healthz</a> · gpuwatch {html.escape(__version__)}</p>
<table><tr><th class="l">GPU</th><th class="l">Health</th>{headers}</tr>
{"".join(rows)}
</table>
<p><small>hot: within {HOT_MARGIN_CELSIUS:.0f} °C of the GPU's own slowdown threshold · power-capped: enforced limit
below {POWER_CAPPED_RATIO:.0%} of the configured (else default) limit · slow probe: below {SLOW_PROBE_RATIO:.0%} of the
GPU's own baseline or of the median of the node's GPUs of its model, judged only on a probe younger than
{PROBE_FRESH_INTERVALS} probe intervals · uncorrectable ECC errors: a lifetime count · normal throttle reasons
(idle, power cap under load) are grey.</small></p>
</body></html>"""


def _mhz(hertz: float | None) -> float | None:
    return None if hertz is None else hertz / 1e6


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"
