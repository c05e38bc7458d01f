"""The agent's own status page at `/`: what someone standing at one node wants to see, without Grafana."""

from __future__ import annotations

import html
import time

from gpuwatch import __version__
from gpuwatch.model import GpuSample
from gpuwatch.store import StoreSnapshot

# Reasons that are normal and say nothing about health (an idle GPU, a GPU at its power cap under load).
BENIGN_REASONS = frozenset({"gpu_idle", "sw_power_cap", "applications_clocks", "display_clock", "sync_boost"})

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse}td,th{padding:.3em .7em;border-bottom:1px solid #ddd;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}.bad{color:#b00020;font-weight:600}.warn{color:#a15c00}
.ok{color:#1b5e20}small{color:#666}
"""


def render_status_page(snap: StoreSnapshot) -> str:
    rows = []
    for identity in sorted(snap.identities.values(), key=lambda i: (i.index, i.uuid)):
        sample = snap.fresh(identity.uuid)
        name = f"{identity.index}<br><small>{html.escape(identity.model)}<br>{html.escape(identity.uuid)}</small>"
        if sample is None:
            why = snap.gpu_errors.get(identity.uuid, "no fresh readings")
            rows.append(
                f'<tr><td class="l">{name}</td><td class="l bad" colspan="6">LOST: {html.escape(why)}</td></tr>'
            )
            continue
        rows.append(_gpu_row(name, sample, snap.configured_power_limit_watts))
    backends = ", ".join(
        f'{html.escape(b)}: <span class="{"ok" if up else "bad"}">{"up" if up else "DOWN " + html.escape(msg)}</span>'
        for b, (up, msg) in sorted(snap.backends.items())
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>gpuwatch</title>
<style>{_STYLE}</style></head><body>
<h1>gpuwatch {html.escape(__version__)}</h1>
<p>Backends: {backends or "none"} · <a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> ·
read {time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.now))}</p>
<table><tr><th class="l">GPU</th><th>Core °C<br><small>slowdown</small></th><th>Memory °C</th>
<th>Power W<br><small>enforced / default</small></th><th>SM clock MHz</th><th>Util</th>
<th class="l">Health</th></tr>
{"".join(rows)}
</table></body></html>"""


def _gpu_row(name: str, s: GpuSample, configured_limit: float | None) -> str:
    core = s.temperature_celsius.get("core")
    slowdown = s.temperature_threshold_celsius.get(("core", "slowdown"))
    memory = s.temperature_celsius.get("memory")
    enforced = s.power_limit_watts.get("enforced")
    default = configured_limit or s.power_limit_watts.get("default")
    flags = []
    if core is not None and slowdown is not None and core >= slowdown - 5:
        flags.append(("bad" if core >= slowdown else "warn", f"hot ({core:.0f} of {slowdown:.0f} °C)"))
    throttling = sorted(r for r, active in s.throttle_active.items() if active and r not in BENIGN_REASONS)
    if throttling:
        flags.append(("bad", "throttling: " + ", ".join(throttling)))
    if enforced is not None and default is not None and enforced < 0.95 * default:
        flags.append(("warn", f"power-capped at {enforced:.0f} of {default:.0f} W"))
    if s.row_remap_failed or s.ecc_errors_total.get("uncorrected"):
        flags.append(("bad", "memory errors"))
    health = "; ".join(f'<span class="{cls}">{html.escape(text)}</span>' for cls, text in flags)
    sm = s.clock_hertz.get("sm")
    return (
        f'<tr><td class="l">{name}</td><td>{_num(core)}<br><small>{_num(slowdown)}</small></td><td>{_num(memory)}</td>'
        f"<td>{_num(s.power_watts)}<br><small>{_num(enforced)} / {_num(default)}</small></td>"
        f"<td>{_num(None if sm is None else sm / 1e6)}</td>"
        f"<td>{_num(None if s.utilization_ratio is None else s.utilization_ratio * 100)}%</td>"
        f'<td class="l">{health or "<span class=ok>ok</span>"}</td></tr>'
    )


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"
