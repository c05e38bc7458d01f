"""The agent's own status page at `/`: what someone standing at one node wants to see, without Grafana.

Plain HTML, no JavaScript. The node's own problems first (a poll hung in a vendor call, a vendor library down, GPUs
missing against the expected count, power cables, host rails and supplies), then one row per GPU with its readings
against its own limits and a finding per condition an alert rule pages on — with the same thresholds
(gpuwatch.core.thresholds, gpuwatch.judge.verdict), a "what to do" line and a link to the alert's runbook — then the
host's rails and supplies against their limits, and the probe's state. It refreshes itself every 10 s. Columns are a
table of (header, cell) pairs, so adding one is one entry in ``COLUMNS``. This module draws; what is wrong (the
findings, shared with /health/gpus) is decided in gpuwatch/judge/findings.py.
"""

from __future__ import annotations

import html
import socket
import time
from collections.abc import Callable

from gpuwatch import __version__
from gpuwatch.core.thresholds import threshold
from gpuwatch.judge.findings import (
    FLEET_PROBE_RATIO,
    HOT_MARGIN_CELSIUS,
    POWER_CAPPED_RATIO,
    PROBE_FRESH_INTERVALS,
    SLOW_PROBE_RATIO,
    GpuView,
    frozen_by,
    health_flags,
    node_findings,
    probe_ratio,
    views,
)
from gpuwatch.judge.gpu_verdict import view_verdict
from gpuwatch.judge.verdict import BENIGN_REASONS, Finding, ago, judge_rail, rail_limit, reference_limit
from gpuwatch.probe.baseline import PROBES_TO_ESTABLISH
from gpuwatch.state.store import StoreSnapshot

REFRESH_SECONDS = 10

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1em;color:#222;max-width:95em}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.15em;margin:1.2em 0 .2em}p{margin:.3em 0}
table{border-collapse:collapse;margin-top:.8em}td,th{padding:.3em .35em;border-bottom:1px solid #ddd;text-align:right;
vertical-align:top}th{background:#f4f4f4;font-weight:600}td.l,th.l{text-align:left}
td{white-space:nowrap}td.health{white-space:normal;min-width:14em;max-width:30em}td.wrap{white-space:normal;min-width:6em}
td.gpu{white-space:normal;min-width:10em;max-width:14em}
small{color:#666;font-weight:normal}tr.row-bad td{background:#fdecee}tr.row-warn td{background:#fff6e0}
.uuid{font-family:ui-monospace,monospace;font-size:.75em;color:#666;word-break:break-all}
@media print{body{margin:0;font-size:9pt;max-width:none}td.health{min-width:12em}a{color:inherit}
tr{break-inside:avoid}}@page{size:landscape;margin:1cm}
.flag{display:inline-block;margin:0 .3em .2em 0;padding:.05em .45em;border-radius:.3em}
.bad{background:#b00020;color:#fff}.warn{background:#e08600;color:#fff}.ok{background:#1b5e20;color:#fff}
.info{background:#ddd;color:#333}.todo{display:block;font-size:.85em;color:#444;margin:0 0 .4em .2em}
.muted{color:#888}.summary{font-size:1.1em;margin:.6em 0}ul.findings{margin:.3em 0;padding-left:1.2em}
ul.findings li{margin:.2em 0}.verdict{display:block;margin:0 0 .3em}
"""


# --- cells -------------------------------------------------------------------------------------------------------
def _gpu_cell(v: GpuView) -> str:
    i = v.identity
    pci = f"<br>PCI {html.escape(i.pci_bus_id)}" if i.pci_bus_id else ""
    return (
        f"<b>GPU {i.index}</b> <small>{html.escape(i.model or 'unknown model')}</small><br>"
        f'<span class="uuid">{html.escape(i.uuid)}{pci}</span>'
    )


def _finding_html(f: Finding) -> str:
    todo = ""
    if f.attention:
        todo = (
            f'<span class="todo">what to do: {html.escape(f.remedy)} · '
            f'<a href="{html.escape(_relative(f.runbook))}">runbook: {html.escape(f.alert)}</a></span>'
        )
    return f'<span class="flag {f.level}">{html.escape(f.text)}</span>{todo}'


def _relative(path: str) -> str:
    """The agent's own path relative to this page ("./runbooks#..."), so a link works behind any host, port, TLS or
    a reverse proxy's path prefix."""
    return "." + path


def _health_cell(v: GpuView) -> str:
    flags = health_flags(v)
    held = v.snap.ledger.open_faults(v.identity.uuid)
    ok = "" if held or any(f.attention for f in flags) else '<span class="flag ok">ok</span>'
    return _verdict_html(v) + ok + "".join(_finding_html(f) for f in flags) + _ledger_html(v)


def _ledger_html(v: GpuView) -> str:
    """The GPU's faults held until repaired, each with how to say it is mended, and its last closed fault."""
    record = v.snap.ledger.record(v.identity.uuid)
    if record is None:
        return ""
    out = []
    for fault in record.open_faults:
        escalated = f", came back {fault.returns}x: escalated from {fault.base_action}" if fault.returns else ""
        out.append(
            f'<span class="flag {"bad" if fault.state == "unhealthy" else "warn"}">held until repaired: '
            f"{html.escape(fault.key)} -> <b>{fault.action}</b> (since {ago(v.snap.now - fault.opened)} ago"
            f"{escalated})</span>"
            f'<span class="todo">{html.escape(fault.evidence)} · once mended: <code>gpuwatch repair --gpu '
            f"{v.identity.index} --note '…'</code></span>"
        )
    closed = [f for f in record.faults if f.closed is not None]
    if closed:
        last = closed[-1]
        assert last.closed is not None
        how = (
            f"repaired by {last.closed.by}" if last.closed.how == "repair" else "closed by a clean probe after a reboot"
        )
        out.append(
            f'<span class="todo">ledger: {len(closed)} closed fault{"s" if len(closed) != 1 else ""}; last '
            f"{html.escape(last.key)}, {html.escape(how)} {ago(v.snap.now - last.closed.time)} ago: "
            f"{html.escape(last.closed.note)}</span>"
        )
    return "".join(out)


def _verdict_html(v: GpuView) -> str:
    """The GPU's verdict above its findings (docs/verdicts.md); nothing for a healthy GPU with nothing to do."""
    verdict = view_verdict(v)
    if verdict.state == "healthy" and verdict.action == "none":
        return ""
    return f'<span class="verdict">verdict: <b>{verdict.state}</b>, action <b>{verdict.action}</b></span>'


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
    reference, which = reference_limit(s, v.configured_limit_watts)
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
    when = f"<small>{ago(v.snap.now - last.timestamp)} ago</small>"
    ratio = probe_ratio(v)
    if last.result != "ok":
        why = f": {html.escape(last.reason)}" if last.reason else ""
        return f"{html.escape(last.result.replace('_', ' '))}{why}<br>{when}"
    if last.measured is None:
        return f"ok<br>{when}"
    tflops = f"{last.measured.flops_median / 1e12:.0f} TFLOP/s {html.escape(last.measured.dtype)}"
    share = "" if ratio is None else f"<br><small>{ratio:.0%} of baseline</small>"
    return f"{tflops}{share}<br>{when}"


def _pcie_cell(v: GpuView) -> str:
    s = v.sample
    assert s is not None
    gen, width = s.pcie_link_generation, s.pcie_link_width
    if not gen and not width:
        return '<span class="muted">–</span>'
    now = f"gen {gen.get('current', '–')} x{width.get('current', '–')}"
    return f"{now}<br><small>max gen {gen.get('max', '–')} x{width.get('max', '–')}</small>"


Cell = Callable[[GpuView], str]
# (header, sub-header, cell, left-aligned); cells other than GPU and health only run for GPUs with a fresh sample.
COLUMNS: tuple[tuple[str, str, Cell, bool], ...] = (
    ("Core °C", "now / slowdown", _temp_cell, False),
    ("Memory °C", "now / max", _memory_temp_cell, False),
    ("Power W", "now / limit", _power_cell, False),
    ("SM clock MHz", "now / max", _clock_cell, False),
    ("Utilization", "memory used", _util_cell, False),
    ("PCIe link", "now / max", _pcie_cell, False),
    ("Throttle reasons", "grey = normal", _throttle_cell, True),
    ("Last probe", "throughput", _probe_cell, True),
)


def _node_section(findings: list[Finding]) -> str:
    if not findings:
        return ""
    items = "".join(f"<li>{_finding_html(f)}</li>" for f in findings)
    return f'<h2>Node</h2><ul class="findings" id="node">{items}</ul>'


def _host_section(snap: StoreSnapshot) -> str:
    """Rails against their limits (the HostPsuRailUndervoltage limit), supplies, redundancy."""
    rails = [v for s in snap.host for v in s.voltages]
    psus = [p for s in snap.host for p in s.psus]
    power = {w.psu: w.watts for s in snap.host for w in s.psu_power}
    if not (rails or psus):
        collectors = [n for n in ("hwmon", "ipmi") if n in snap.collectors]
        why = "no rails or supplies read yet" if collectors else "no host sensors (no hwmon rails, no BMC)"
        return f'<h2>Host power</h2><p class="muted" id="host">{why}</p>'
    rows = []
    for v in rails:
        bad = judge_rail(v)
        limit = rail_limit(v)
        state = '<span class="flag bad">below limit</span>' if bad else '<span class="flag ok">ok</span>'
        rows.append(
            f'<tr class="{"row-bad" if bad else ""}"><td class="l">{html.escape(v.sensor)} '
            f"<small>{html.escape(v.chip)}</small></td><td>{v.volts:.2f} V <small>/ ≥ {_volts(limit)}</small></td>"
            f'<td>{_volts(v.nominal_volts)}</td><td class="l">{state}</td></tr>'
        )
    for p in psus:
        watts = power.get(p.psu)
        load = "" if watts is None else f"{watts:.0f} W"
        state = '<span class="flag ok">up</span>' if p.up else '<span class="flag bad">failed</span>'
        rows.append(
            f'<tr class="{"" if p.up else "row-bad"}"><td class="l">power supply {html.escape(p.psu)} '
            f'<small>{html.escape(p.states)}</small></td><td>{load}</td><td></td><td class="l">{state}</td></tr>'
        )
    verdicts = [s.psu_redundancy_lost for s in snap.host if s.psu_redundancy_lost is not None]
    if verdicts:
        lost = any(verdicts)
        state = '<span class="flag warn">lost</span>' if lost else '<span class="flag ok">ok</span>'
        rows.append(f'<tr><td class="l">power-supply redundancy</td><td></td><td></td><td class="l">{state}</td></tr>')
    return (
        '<h2>Host power</h2><table id="host"><tr><th class="l">rail / supply</th><th>now / limit</th>'
        f'<th>nominal</th><th class="l">state</th></tr>{"".join(rows)}</table>'
    )


def _network_section(snap: StoreSnapshot) -> str:
    """The RDMA ports (collectors/network.py): state, rate against the expected, flaps and errors; nothing on a node
    without any."""
    ports = snap.parts.get("network") or ()
    if not ports:
        return ""
    rows = []
    for view in ports:
        port = view.reading
        if view.down:
            state, row = '<span class="flag bad">down</span>', "row-bad"
        elif not port.up:
            state, row = '<span class="flag">not up</span>', ""
        elif view.slow:
            state, row = '<span class="flag warn">below its rate</span>', "row-warn"
        elif view.flapping:
            state, row = f'<span class="flag warn">flapping: down {view.flaps}× in 15 min</span>', "row-warn"
        elif view.erring:
            state, row = '<span class="flag warn">errors growing</span>', "row-warn"
        else:
            state, row = '<span class="flag ok">up</span>', ""
        rate = "" if port.rate_bits_per_second is None or not port.up else f"{port.rate_bits_per_second / 1e9:g}"
        expected = view.expected_rate_bits_per_second
        rate += "" if expected is None else f" <small>/ {expected / 1e9:g} Gb/s</small>"
        errors = sum(port.errors.values())
        layer = port.link_layer + (f" {port.netdev}" if port.netdev else "")
        rows.append(
            f'<tr class="{row}"><td class="l">{html.escape(port.device)}/{html.escape(port.port)} '
            f"<small>{html.escape(layer)}</small></td><td>{html.escape(view.gpu) or '—'}</td><td>{rate}</td>"
            f'<td>{_num(port.link_downed)}</td><td>{errors}</td><td class="l">{state}</td></tr>'
        )
    return (
        '<h2>Network</h2><table id="network"><tr><th class="l">port</th><th>GPU</th><th>rate / expected</th>'
        f'<th>link downed</th><th>errors</th><th class="l">state</th></tr>{"".join(rows)}</table>'
    )


def _mig_section(snap: StoreSnapshot) -> str:
    """Each MIG-enabled GPU's MIG devices (docs/mig.md): instance IDs, profile, memory, its GPU instance's SM and
    tensor activity (GPM; "—" where unread) and the workloads in each; nothing on a node without MIG."""
    workloads = snap.parts.get("workloads") or {}
    rows = []
    for uuid, identity in sorted(snap.identities.items(), key=lambda item: item[1].index):
        sample = snap.fresh(uuid)
        for device in sample.mig_devices if sample is not None else ():
            held = [
                f"{w.kind} {w.id}" for w in workloads.get(uuid, ()) if w.gpu_instance_id == str(device.gpu_instance_id)
            ]
            used, total = device.memory_used_bytes, device.memory_total_bytes
            memory = "" if used is None or total is None else f"{used / 2**30:.1f} / {total / 2**30:.1f} GiB"
            sm, tensor = device.sm_active_ratio, device.tensor_active_ratio
            active = "—" if sm is None else f"{sm:.0%}" + ("" if tensor is None else f" / {tensor:.0%}")
            rows.append(
                f'<tr><td class="l">{identity.index}</td><td>{device.gpu_instance_id}</td>'
                f'<td>{device.compute_instance_id}</td><td class="l">{html.escape(device.profile)}</td>'
                f'<td>{memory}</td><td>{active}</td><td class="l">{html.escape(", ".join(held)) or "—"}</td>'
                f'<td class="l"><small>{html.escape(device.uuid)}</small></td></tr>'
            )
    if not rows:
        return ""
    return (
        '<h2>MIG instances</h2><table id="mig"><tr><th class="l">GPU</th><th>GPU instance</th>'
        '<th>compute instance</th><th class="l">profile</th><th>memory</th>'
        '<th title="the GPU instance\'s GPM over the last poll">SM / tensor active</th><th class="l">workloads</th>'
        f'<th class="l">MIG UUID</th></tr>{"".join(rows)}</table>'
    )


def _probe_line(snap: StoreSnapshot) -> str:
    probe = snap.probe
    if not probe.enabled:
        return "Probe: off (probe.interval_seconds = 0)."
    interval = probe.interval_seconds
    results = len(probe.last_any)
    baselines = len(probe.baselines)
    if results == 0:
        return (
            f"Probe: every {interval:g} s on idle GPUs; no result yet (the first round runs about one interval after "
            f"start). A GPU's baseline needs {PROBES_TO_ESTABLISH} steady probes, about "
            f"{ago(PROBES_TO_ESTABLISH * interval)}; the page compares with its peers before that."
        )
    return (
        f"Probe: every {interval:g} s on idle GPUs; {results} GPUs probed, {baselines} with a baseline "
        f"({PROBES_TO_ESTABLISH} steady probes each, about {ago(PROBES_TO_ESTABLISH * interval)})."
    )


def render_status_page(snap: StoreSnapshot) -> str:
    gpus = views(snap)
    node = node_findings(snap)
    rows = []
    attention = 0
    for v in gpus:
        flags = health_flags(v)
        level = (
            "row-bad"
            if any(f.level == "bad" for f in flags)
            else "row-warn"
            if any(f.level == "warn" for f in flags)
            else ""
        )
        attention += any(f.attention for f in flags)
        cells = [f'<td class="l gpu">{_gpu_cell(v)}</td>', f'<td class="l health">{_health_cell(v)}</td>']
        if v.sample is None:
            frozen = frozen_by(snap, v.identity.uuid) is not None
            why = "no fresh readings while a vendor call hangs" if frozen else "no readings"
            cells.append(f'<td class="l muted" colspan="{len(COLUMNS)}">{why}</td>')
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
    expected = sum(snap.gpus_expected.values())
    node_bad = [f for f in node if f.attention]
    parts = [
        f"<b>GPU readings frozen: the {html.escape(c.backend)} call {html.escape(c.call)}"
        f"{f' on GPU {html.escape(c.gpu)}' if c.gpu else ''} hangs</b>"
        for c in snap.stuck_calls
    ]  # the cause first: every GPU's stale readings below are its symptom
    if node_bad:
        parts.append(f"<b>{len(node_bad)} node problem{'s' if len(node_bad) > 1 else ''}</b> (below)")
    if not gpus:
        parts.append(f"<b>no GPU seen</b> of {expected} expected" if expected else "No GPUs found yet")
    elif attention:
        parts.append(f"<b>{attention} of {len(gpus)} GPUs need attention</b> (highlighted below)")
    elif not node_bad:
        parts.append(f"All {len(gpus)} GPUs healthy")
    else:
        parts.append(f"all {len(gpus)} GPUs seen are healthy")
    summary = "; ".join(parts) + "."
    host = html.escape(socket.gethostname())
    read_at = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(snap.now))
    table = ""
    if gpus:
        table = f'<table><tr><th class="l">GPU</th><th class="l">Health</th>{headers}</tr>{"".join(rows)}</table>'
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_SECONDS}"><title>gpuwatch · {host}</title>
<style>{_STYLE}</style></head><body>
<h1>gpuwatch on {host}</h1>
<p class="summary" id="summary">{summary}</p>
<p>Read {read_at}, refreshes every {REFRESH_SECONDS} s · backends: {backends or "none"} ·
<a href="/metrics">/metrics</a> (Prometheus) · <a href="/healthz">/healthz</a> · <a href="/health/gpus">/health/gpus</a>
· <a href="./runbooks">/runbooks</a> (what to do per alert) · gpuwatch {html.escape(__version__)}</p>
{_node_section(node)}
<h2>GPUs</h2>
{table}
{_host_section(snap)}
{_network_section(snap)}
{_mig_section(snap)}
<p id="probe">{html.escape(_probe_line(snap))}</p>
<p><small>Each finding is the condition of the alert it links, with the rules' thresholds: overheating at the GPU's own
slowdown threshold, runs hot within {HOT_MARGIN_CELSIUS:.0f} °C of it · power-capped: enforced limit below
{POWER_CAPPED_RATIO:.0%} of the configured (else default) limit · slow probe: below {SLOW_PROBE_RATIO:.0%} of the GPU's
own baseline or {FLEET_PROBE_RATIO:.0%} of the median of the node's GPUs of its model, judged only on a probe younger
than {PROBE_FRESH_INTERVALS:.0f} probe intervals · XIDs for {threshold("xid_window_seconds") / 60:.0f} min after they
happen (application XIDs grey: no alert) · PCIe downtraining judged while busier than
{threshold("pcie_busy_utilization_ratio"):.0%} · uncorrectable ECC errors: a lifetime count · an alert fires once its
condition has held for the rule's duration · normal throttle reasons (idle, power cap under load) are grey.</small></p>
</body></html>"""


def _mhz(hertz: float | None) -> float | None:
    return None if hertz is None else hertz / 1e6


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _volts(value: float | None) -> str:
    return "–" if value is None else f"{abs(value):.2f} V"
