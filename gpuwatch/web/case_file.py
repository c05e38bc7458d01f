"""A GPU's case file as one self-contained HTML page, rendered from its JSON twin (`gpuwatch report`).

What a vendor's RMA desk asks for, in the order it asks: who the card is, what went wrong and when, what the driver
said, the memory's health, how it computes against itself and its peers, what it did around each fault, and the
last diagnostics. Inline CSS and SVG only: it opens from a ticket's attachment, offline, with script disabled, and
prints. Every value comes from the document and is escaped here; a value the library could not give is said.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuwatch.web.svg_plot import Series, line_chart

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;color:#1f2328;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;
padding-bottom:4px}h3{font-size:15px;margin:16px 0 6px}
table{border-collapse:collapse;margin:6px 0;width:100%}th,td{border:1px solid #d0d7de;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f6f8fa;font-weight:600}
td.k{width:230px;background:#f6f8fa;font-family:ui-monospace,monospace;font-size:13px}
.meta{color:#57606a}.none{color:#57606a;font-style:italic}.open{color:#cf222e;font-weight:600}
.closed{color:#1a7f37}.healthy{color:#1a7f37}.degraded{color:#9a6700}.unhealthy{color:#cf222e}
figure.plot{margin:8px 0 16px}figcaption{font-weight:600;margin-bottom:2px}.legend{font-size:12px}
.legend span{margin-right:14px}code{font-family:ui-monospace,monospace;font-size:13px}
@media print{body{margin:0;max-width:none}h2{break-after:avoid}table,figure{break-inside:avoid}}
"""
NOT_AVAILABLE = '<span class="none">not available</span>'


def _e(value: object) -> str:
    return html.escape(str(value))


def _when(t: object) -> str:
    if not isinstance(t, int | float) or t <= 0:
        return NOT_AVAILABLE
    return _e(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)))


def _value(value: object) -> str:
    if value is None or value == "" or value == {}:
        return NOT_AVAILABLE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ", ".join(f"{_e(k)} {_e(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_e(v) for v in value) or NOT_AVAILABLE
    return _e(value)


def _table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Cells are HTML already (escaped by the caller)."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return "<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>" + body + "</table>"


def _pairs(items: Iterable[tuple[str, str]]) -> str:
    return "<table>" + "".join(f'<tr><td class="k">{_e(k)}</td><td>{v}</td></tr>' for k, v in items) + "</table>"


def _note(text: object) -> str:
    return f'<p class="none">{_e(text)}</p>' if text else ""


def _flops(value: object) -> str:
    return f"{value / 1e12:.1f} TFLOP/s" if isinstance(value, int | float) else NOT_AVAILABLE


# ----- the sections ------------------------------------------------------------------------------------------------


def _header(doc: Mapping[str, Any]) -> str:
    ident = doc["identity"]
    verdict = doc["verdict"]
    name = ident.get("name") or "GPU"
    scenario = f", scenario {doc['scenario']}" if doc.get("scenario") else ""
    evidence = "".join(f"<li>{_e(line)}</li>" for line in verdict.get("evidence", []))
    return (
        f"<h1>Case file: {_e(name)}, serial {_e(ident.get('serial') or 'unknown')}</h1>"
        f'<p class="meta">GPU {_e(ident["index"])} · {_e(ident["uuid"])} · node {_e(doc["node"])} · '
        f"generated {_e(doc['generated'])} by gpuwatch {_e(doc['gpuwatch_version'])} "
        f"(backend {_e(doc['backend'])}{_e(scenario)})</p>"
        f'<p>Verdict now: <b class="{_e(verdict["state"])}">{_e(verdict["state"])}</b>, action '
        f"<b>{_e(verdict['action'])}</b></p>" + (f"<ul>{evidence}</ul>" if evidence else "")
    )


IDENTITY_LABELS = (
    ("serial", "serial number"),
    ("uuid", "UUID"),
    ("name", "product name"),
    ("board_part_number", "board part number"),
    ("vbios_version", "VBIOS version"),
    ("vbios_part_number", "VBIOS part number"),
    ("inforom_image_version", "InfoROM image version"),
    ("inforom_oem_object_version", "InfoROM OEM object"),
    ("inforom_ecc_object_version", "InfoROM ECC object"),
    ("inforom_power_object_version", "InfoROM power management object"),
    ("driver_version", "driver version"),
    ("nvml_version", "NVML version"),
    ("cuda_driver_version", "CUDA driver version"),
    ("pci_bus_id", "PCI bus id"),
    ("index", "index"),
    ("vendor", "vendor"),
)


def _identity(doc: Mapping[str, Any]) -> str:
    ident = doc["identity"]
    rows = [(f"{label} ({key})", _value(ident.get(key))) for key, label in IDENTITY_LABELS if key in ident]
    return "<h2>Identity</h2>" + _pairs(rows) + _note(ident.get("unavailable"))


def _ledger(doc: Mapping[str, Any]) -> str:
    ledger = doc["ledger"]
    faults = list(reversed(ledger.get("faults", [])))
    out = "<h2>Fault ledger (across reboots)</h2>"
    if not faults:
        return out + _note(ledger.get("note") or "no fault recorded")
    rows = []
    for f in faults:
        closed = f.get("closed")
        status = (
            '<span class="open">open: held until repaired</span>'
            if f["open"]
            else f'<span class="closed">closed {_when(closed["time"])}</span> ({_e(closed["how"])} by '
            f"{_e(closed['by'])}: {_e(closed['note'])})"
        )
        rows.append(
            (
                f"<b>{_e(f['key'])}</b>",
                status,
                f"{_e(f['state'])}, {_e(f['action'])}"
                + (f" (from {_e(f['base_action'])})" if f["base_action"] != f["action"] else ""),
                _when(f["at"]),
                _when(f["opened"]),
                _e(f["returns"]),
                _value(f["boots"]),
                _value(f["driver_version"]),
                _e(f["evidence"]),
            )
        )
    head = ("fault", "status", "state, action", "seen", "opened", "returned", "boots", "driver", "evidence")
    return out + _table(head, rows)


def _xids(doc: Mapping[str, Any]) -> str:
    out = "<h2>XIDs</h2>"
    xids = doc["xids"]
    if not xids:
        return out + _note(
            "no XID recorded for this GPU (fault ledger" + (", Prometheus" if doc["prometheus"] else "") + ")"
        )
    rows = [
        (
            f"<b>XID {_e(x['xid'])}</b>",
            _value(x["mnemonic"]),
            _value(x["description"]),
            _value(x["catalogue_action"]),
            f"{_e(x['alert_class'])}, {_e(x['action'])}",
            _value(x["count"]),
            _when(x["last_timestamp"]),
            _value(x["sources"]),
        )
        for x in xids
    ]
    head = (
        "XID",
        "mnemonic",
        "description (NVIDIA's catalogue)",
        "immediate action",
        "class, action",
        "count",
        "last",
        "from",
    )
    catalogue = next((x["catalogue"] for x in xids if x.get("catalogue")), None)
    return out + _table(head, rows) + (f'<p class="meta">Catalogue: {_e(catalogue)}</p>' if catalogue else "")


MEMORY_LABELS = (
    ("ecc_enabled", "ECC enabled"),
    ("ecc_errors_total", "ECC errors (lifetime, aggregate)"),
    ("remapped_rows_total", "remapped rows"),
    ("row_remap_pending", "row remap pending (needs a reset)"),
    ("row_remap_failed", "row remap failed"),
    ("row_remap_banks", "memory banks by spare rows left"),
    ("retired_pages", "retired pages"),
    ("retired_pages_limit", "retired pages limit"),
    ("sram_ecc_threshold_exceeded", "SRAM ECC past the driver's threshold"),
    ("inforom_valid", "InfoROM checksums valid"),
)


def _memory(doc: Mapping[str, Any]) -> str:
    memory = doc["memory"]
    out = f"<h2>Row remaps and ECC</h2><p class='meta'>Read now ({_when(doc['reading'].get('timestamp'))}).</p>"
    if memory.get("note"):
        return out + _note(memory["note"])
    return out + _pairs((label, _value(memory.get(key))) for key, label in MEMORY_LABELS)


def _probe(doc: Mapping[str, Any]) -> str:
    own, fleet = doc["probe"]["own"], doc["probe"]["fleet"]
    out = "<h2>Probe: against its own baseline and its fleet peers</h2><h3>Its own baseline (state dir)</h3>"
    if own.get("baseline_flops") is None and not own.get("samples_flops"):
        out += _note(own.get("note"))
    else:
        key = own.get("key") or {}
        out += _pairs(
            [
                ("baseline", _flops(own.get("baseline_flops"))),
                ("established", _when(own.get("established_timestamp"))),
                ("measured with", _value(key)),
                ("previous baseline", _flops(own.get("previous_baseline_flops"))),
                (
                    "samples kept (share of baseline)",
                    _value([f"{s / 1e12:.1f} TFLOP/s" for s in own.get("samples_flops", [])])
                    + (
                        " — " + ", ".join(f"{r:.0%}" for r in own["samples_ratio_to_baseline"])
                        if own.get("samples_ratio_to_baseline")
                        else ""
                    ),
                ),
            ]
        ) + _note(own.get("note"))
    out += "<h3>Over time, beside its fleet peers of the same model (Prometheus)</h3>"
    series = fleet.get("series")
    if not series:
        return out + _note(fleet.get("note"))
    start, end, step = fleet["start"], fleet["end"], fleet["step_seconds"]
    marks = _fault_marks(doc)
    peers = fleet.get("fleet_gpus")
    counted = _e(peers if peers is not None else "no")
    out += f"<p class='meta'>Fleet: {_e(fleet['fleet_model'])}, {counted} GPUs freshly probed.</p>"
    out += line_chart(
        "probe throughput",
        "FLOP/s",
        [
            Series("this GPU", series["probe_flops"]),
            Series("its baseline", series["baseline_flops"]),
            Series("fleet median, same model", series["fleet_median_flops"]),
        ],
        start,
        end,
        step,
        marks,
    )
    out += line_chart(
        "throughput / fleet median",
        "ratio",
        [Series("this GPU", series["ratio_to_fleet_median"])],
        start,
        end,
        step,
        marks,
    )
    return out + _pairs((name, f"<code>{_e(q)}</code>") for name, q in fleet.get("queries", {}).items())


def _fault_marks(doc: Mapping[str, Any]) -> list[tuple[float, str]]:
    return [(f["at"], f["key"]) for f in doc["ledger"].get("faults", [])]


def _around(doc: Mapping[str, Any]) -> str:
    section = doc["around_faults"]
    out = "<h2>Temperature, power and clocks around each fault</h2>" + _note(section.get("note"))
    if section.get("note"):
        out += _current(doc)
    for plot in section.get("faults", []):
        s, mark = plot["series"], [(plot["at"], plot["fault"])]
        start, end, step = plot["start"], plot["end"], plot["step_seconds"]
        out += f"<h3>{_e(plot['fault'])} at {_when(plot['at'])}</h3>"
        out += line_chart(
            "temperature",
            "°C",
            [Series("core", s["temperature_core_celsius"]), Series("memory", s["temperature_memory_celsius"])],
            start,
            end,
            step,
            mark,
        )
        out += line_chart("power", "W", [Series("board power", s["power_watts"])], start, end, step, mark)
        mhz = {k: [[t, v / 1e6] for t, v in s[k]] for k in ("sm_clock_hertz", "memory_clock_hertz")}
        out += line_chart(
            "clocks",
            "MHz",
            [Series("SM", mhz["sm_clock_hertz"]), Series("memory", mhz["memory_clock_hertz"])],
            start,
            end,
            step,
            mark,
        )
    if not section.get("faults") and not section.get("note"):
        out += _note("no fault to plot")
    return out


def _current(doc: Mapping[str, Any]) -> str:
    r = doc["reading"]
    if r.get("timestamp") is None:
        return _note(r.get("error") or "no reading now")
    clocks = {k: f"{v / 1e6:.0f} MHz" for k, v in r.get("clock_hertz", {}).items()}
    rows = [
        ("read", _when(r["timestamp"])),
        ("temperature", _value({k: f"{v:.0f} °C" for k, v in r.get("temperature_celsius", {}).items()})),
        ("power", _value(None if r.get("power_watts") is None else f"{r['power_watts']:.0f} W")),
        ("power limits", _value({k: f"{v:.0f} W" for k, v in r.get("power_limit_watts", {}).items()})),
        ("clocks", _value(clocks)),
        ("clock limits", _value({k: f"{v / 1e6:.0f} MHz" for k, v in r.get("clock_max_hertz", {}).items()})),
        ("throttle reasons active", _value(r.get("throttle_active") or "none")),
        ("PCIe link", _value({"generation": r.get("pcie_link_generation"), "width": r.get("pcie_link_width")})),
    ]
    return "<h3>The current reading</h3>" + _pairs(rows)


def _diag(doc: Mapping[str, Any]) -> str:
    diag = doc["diag"]
    out = "<h2>Last diagnostics (gpuwatch diag)</h2>"
    if diag["status"] != "recorded":
        return out + _note(diag["note"])
    when = diag.get("time")
    run = _when(when) if isinstance(when, int | float) else _value(when)
    head = f"<p class='meta'>Run {run}, level {_value(diag.get('level'))}.</p>"
    rows = [(_e(t["name"]), f"<b>{_e(t['result'])}</b>", _e(t["detail"]), _value(t["seconds"])) for t in diag["tests"]]
    return out + head + _table(("test", "result", "detail", "seconds"), rows) + _note(diag.get("note"))


def render_case_file(doc: Mapping[str, Any]) -> str:
    """The whole page."""
    ident = doc["identity"]
    title = f"Case file {ident.get('serial') or ident['uuid']} ({ident.get('name') or 'GPU'})"
    body = "".join(
        (_header(doc), _identity(doc), _ledger(doc), _xids(doc), _memory(doc), _probe(doc), _around(doc), _diag(doc))
    )
    footer = f"<p class='meta'>Its JSON twin: {_e(ident['uuid'])}.json (the same facts, keyed as NVML names them).</p>"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>{body}{footer}</body></html>\n"
    )
