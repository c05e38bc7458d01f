"""Generate gpuwatch's reference documents from what they describe.

    python docs/generate.py          # rewrite docs/metrics.md and docs/alerts.md
    python docs/generate.py --check  # exit 1 if a committed file differs from what this file generates

docs/metrics.md is the metric catalogue (gpuwatch/exposition/catalogue.py); docs/alerts.md the alert rules
(deploy/prometheus/gpuwatch-alerts.yml), their thresholds (the `gpuwatch:threshold:*` recording rules of
deploy/prometheus/gpuwatch-rules.yml) and the inhibitions of deploy/alertmanager/alertmanager.yml. The Markdown is
committed so it reads on GitHub; tests/test_docs.py regenerates it and fails on a difference. The agent never imports
this file.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuwatch.core.model import THROTTLE_REASONS
from gpuwatch.exposition.catalogue import CATALOGUE, COLLECTORS, MetricSpec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ALERT_RULES = ROOT / "deploy" / "prometheus" / "gpuwatch-alerts.yml"
RECORDING_RULES = ROOT / "deploy" / "prometheus" / "gpuwatch-rules.yml"
ALERTMANAGER = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
ANNOTATION_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "gpuwatch-annotations-test.yml"
COMMAND = "python docs/generate.py"


def _banner(source: str) -> str:
    return f"<!-- Generated from {source} by docs/generate.py: do not edit; run `{COMMAND}` to update. -->\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=120, break_long_words=False, break_on_hyphens=False)


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """A Markdown table and the blank line after it."""
    body = ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *body, ""]


# --- docs/metrics.md -------------------------------------------------------------------------------------------------

# Each section of the reference starts at this metric of the catalogue, whose order it follows.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("Identity and self-health", "gpuwatch_build_info"),
    ("Thermal", "gpuwatch_gpu_temperature_celsius"),
    ("Clocks", "gpuwatch_gpu_clock_hertz"),
    ("Power", "gpuwatch_gpu_power_watts"),
    ("Throttling", "gpuwatch_gpu_throttle_active"),
    ("Utilization, memory, modes", "gpuwatch_gpu_utilization_ratio"),
    ("Errors and memory health", "gpuwatch_gpu_ecc_errors_total"),
    ("PCIe and interconnect", "gpuwatch_gpu_pcie_link_generation"),
    ("Matmul probe", "gpuwatch_probe_info"),
    ("Host power delivery and sensors", "gpuwatch_host_voltage_volts"),
)

# The unit is the name's suffix (Prometheus naming practice); the first suffix that matches wins.
UNITS: tuple[tuple[str, str], ...] = (
    ("_timestamp_seconds", "seconds (Unix time)"),
    ("_seconds_total", "seconds"),
    ("_seconds", "seconds"),
    ("_joules_total", "joules"),
    ("_celsius", "°C"),
    ("_hertz", "hertz"),
    ("_watts", "watts"),
    ("_volts", "volts"),
    ("_bytes_per_second", "bytes/s"),
    ("_bytes", "bytes"),
    ("_flops", "FLOP/s"),
    ("_ratio", "ratio 0-1"),
    ("_rpm", "RPM"),
    ("_info", "always 1"),
    ("_total", "count"),
)

METRICS_INTRO = """\
# gpuwatch metrics

Every metric gpuwatch exports, with its type, labels, unit and meaning, generated from the catalogue
`gpuwatch/exposition/catalogue.py`. One schema for every vendor: an alert or a dashboard panel written once works on
NVIDIA and AMD alike. Metrics may be added; none is renamed or re-labelled (`tests/fixtures/spec-names.json` keeps the
names first agreed, and a test holds the catalogue to it).

## Conventions

- Base units, named by the suffix: seconds, celsius, watts, joules, bytes, hertz, volts, ratio 0-1, FLOP/s as
  `flops`, bytes/s as `bytes_per_second`; counters end in `_total`. No hostname label (Prometheus adds `instance`);
  identity strings only on `*_info` metrics.
- Per-GPU series carry exactly `gpu` and `uuid`, plus the labels listed. `uuid` is the identity: rules, inhibitions
  and dashboards join on it. `gpu` is unique on the node: NVML's index for NVIDIA GPUs, AMD SMI's index on an
  AMD-only node; on a node with both vendors, AMD GPUs are numbered after the NVIDIA ones.
- A reading the device cannot give is left out for that device, never exported as 0 or NaN.
- Counters whose label values are known in advance (every probe `result`, every throttle `reason` the device supports)
  exist from start-up at 0, so the first event is an increase. Counters whose labels appear only with the event
  (`xid`) come with a `*_last_timestamp_seconds` gauge that rules can use instead.
- A GPU seen once stays known (its UUID is kept in the state dir): after it is lost, even across a restart of the
  agent, it is exported as `gpuwatch_gpu_up 0` with its info metric, while its readings disappear. A GPU whose
  readings are older than 3 poll intervals is exported the same way: stale values that look healthy are never served.
"""


def unit(name: str) -> str:
    return next((u for suffix, u in UNITS if name.endswith(suffix)), "—")


def _metric_row(spec: MetricSpec) -> tuple[str, ...]:
    labels = ", ".join(f"`{label}`" for label in spec.labels) or "—"
    return (f"`{spec.name}`", spec.type, labels, unit(spec.name), spec.help)


def render_metrics() -> str:
    starts = {first: title for title, first in SECTIONS}
    missing = sorted(set(starts) - set(CATALOGUE))
    if missing:
        raise SystemExit(f"docs/generate.py: SECTIONS start at metrics the catalogue lacks: {missing}")
    sections: list[tuple[str, list[MetricSpec]]] = []
    for spec in CATALOGUE.values():
        if spec.name in starts:
            sections.append((starts[spec.name], []))
        elif not sections:
            raise SystemExit(f"docs/generate.py: {spec.name} comes before the first section of SECTIONS")
        sections[-1][1].append(spec)
    out = [_banner("gpuwatch/exposition/catalogue.py"), METRICS_INTRO]
    for title, specs in sections:
        out += [f"## {title}", ""]
        out += _table(("metric", "type", "labels", "unit", "meaning"), [_metric_row(s) for s in specs])
        if title == "Identity and self-health":
            values = ", ".join(f"`{c}`" for c in COLLECTORS)
            out += [_wrap(f"`collector` values (the names `--disable-collector` takes): {values}."), ""]
        if title == "Throttling":
            values = ", ".join(f"`{r}`" for r in THROTTLE_REASONS)
            out += [_wrap(f"`reason` values, one vocabulary for NVIDIA and AMD: {values}."), ""]
    return "\n".join(out)


# --- docs/alerts.md --------------------------------------------------------------------------------------------------

ALERTS_INTRO = """\
# gpuwatch alerts

Every alert of `deploy/prometheus/gpuwatch-alerts.yml`, by rule group, generated from the rules. Load
`deploy/prometheus/gpuwatch-rules.yml` beside it: the alerts read their thresholds from its recording rules (below).
Every alert carries a `severity` label and `summary`, `description` and `runbook_url` annotations; per-GPU alerts keep
`instance`, `gpu` and `uuid`. `for` is how long the condition must hold before the alert fires (— : at the first
evaluation). Every summary names the node (`{node}`: the `node` label, else `instance`), the GPU by index and model,
and the value with its unit and its limit. In summaries, `{label}` stands for that label's value, `{value}` for the
alert's value, `{model}` for the GPU's model (looked up in `gpuwatch_gpu_info`), and `{expression}` for a value the
summary looks up with the `query` template function (the `gpuwatch_` prefix and the alert's own label matchers left
out); "Rendered" below shows real ones. Each description ends with the first step of the alert's runbook ("What to
do: ..."), and `runbook_url` links its section of the runbooks: the agent's own `/runbooks` unless you set a base of
your own (docs/alerting.md, "Runbook links"). Alerts may be added; none is renamed (`tests/fixtures/spec-names.json`
keeps the names first agreed).
"""


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


# A `query` look-up with no look-up inside it: {{ with printf `EXPR` ARGS | query }}RENDER{{ else }}OTHER{{ end }}.
_NO_BLOCK = r"(?:(?!\{\{ (?:with|if) ).)*?"
_LOOKUP = re.compile(
    r"\{\{ with (?:printf `(?P<expr>[^`]*)`[^}]*?\| query|query `(?P<plain>[^`]*)`) \}\}"
    rf"(?P<render>{_NO_BLOCK})(?:\{{\{{ else \}}\}}(?P<other>{_NO_BLOCK}))?\{{\{{ end \}}\}}"
)


def _looked_up(expr: str) -> str:
    """What a look-up's value is, for a reader: the expression less its selectors, last_over_time() (a device's
    identity and limits are read as their last value in the hour) and the gpuwatch prefixes."""
    expr = re.sub(r"last_over_time\(([^{(\s]+)\{[^}]*\}\[\w+\]\)", r"\1", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"%(\[\d\])?s", "*", expr)
    return "{" + re.sub(r"\bgpuwatch[:_]", "", expr) + "}"


def _lookup(m: re.Match[str]) -> str:
    expr = m["expr"] or m["plain"]
    if expr.startswith("last_over_time(gpuwatch_gpu_info{"):
        return "{model}"
    render = re.sub(r'\{\{ \. \| first \| label "(\w+)" \}\}', r"{\1}", m["render"])
    return re.sub(r"\{\{ \. \| first \| value[^}]*\}\}", lambda _: _looked_up(expr), render)


def _summary(text: str) -> str:
    """A summary template as a reader can take it in: `{label}` for a label, `{value}` for the alert's value,
    `{model}` for the GPU's model, `{expression}` for a value looked up; what is left stays a template."""
    while (simpler := _LOOKUP.sub(_lookup, text)) != text:
        text = simpler
    text = text.replace("{{ or $labels.node $labels.instance }}", "{node}")
    text = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", r"{\1}", text)
    text = re.sub(r"\{\{ \$value[^}]*\}\}", "{value}", text)
    return re.sub(r"(\{\{.*?\}\})", r"`\1`", text).replace("|", "\\|")


def _runbook(url: str) -> str:
    """The runbook_url template ends in its section's anchor (the base is the operator's, or the agent's /runbooks)."""
    return f"[runbook](runbooks.md#{url.rpartition('#')[2]})"


def _comments_above(path: Path, marker: str) -> list[str]:
    """For each line matching `marker`, the comment lines right above it (the previous one's where it has none)."""
    found: list[str] = []
    block: list[str] = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        if re.match(marker, stripped):
            found.append(" ".join(block) if block else (found[-1] if found else ""))
        block = []
    return found


def _thresholds() -> list[tuple[str, ...]]:
    rules = [
        r
        for g in _load(RECORDING_RULES)["groups"]
        for r in g["rules"]
        if str(r.get("record", "")).startswith("gpuwatch:threshold:")
    ]
    comments = _comments_above(RECORDING_RULES, r"- record: gpuwatch:threshold:")
    rows: list[tuple[str, ...]] = []
    for rule, comment in zip(rules, comments, strict=True):
        m = re.fullmatch(r"vector\((.+)\)", str(rule["expr"]).strip())
        rows.append((f"`{rule['record']}`", m[1] if m else f"`{rule['expr']}`", comment))
    return rows


def _rendered() -> list[tuple[str, ...]]:
    tests = _load(ANNOTATION_TESTS)["tests"]
    return [
        (f"`{case['alertname']}`", alert["exp_annotations"]["summary"])
        for test in tests
        for case in test["alert_rule_test"]
        for alert in case["exp_alerts"]
    ]


def _inhibitions() -> list[tuple[str, ...]]:
    rules = _load(ALERTMANAGER)["inhibit_rules"]
    comments = _comments_above(ALERTMANAGER, r"- source_matchers:")

    def matchers(ms: list[str]) -> str:
        return ", ".join(f"`{m}`" for m in ms)

    return [
        (matchers(r["source_matchers"]), matchers(r["target_matchers"]), matchers(r["equal"]), comment)
        for r, comment in zip(rules, comments, strict=True)
    ]


def render_alerts() -> str:
    out = [_banner("deploy/prometheus/gpuwatch-{alerts,rules}.yml and deploy/alertmanager/alertmanager.yml")]
    out.append(ALERTS_INTRO)
    for group in _load(ALERT_RULES)["groups"]:
        rows = [
            (
                f"`{r['alert']}`",
                r["labels"]["severity"],
                r.get("for", "—"),
                _summary(r["annotations"]["summary"]),
                _runbook(r["annotations"]["runbook_url"]),
            )
            for r in group["rules"]
            if "alert" in r
        ]
        out += [f"## {group['name']}", ""]
        out += _table(("alert", "severity", "for", "summary", "runbook"), rows)
    out += [
        "## Rendered",
        "",
        "Summaries as Prometheus renders them, from `deploy/prometheus/tests/gpuwatch-annotations-test.yml` (promtool",
        "holds each word; vmalert renders the same templates). node-07 has a `node` label, n8:9845 has none.",
        "",
    ]
    out += _table(("alert", "summary"), _rendered())
    out += [
        "## Thresholds",
        "",
        "The defaults every alert compares against: constant recording rules in the `gpuwatch-thresholds` group of",
        "`deploy/prometheus/gpuwatch-rules.yml`. To change one, edit its `expr` there and reload Prometheus; no alert",
        "expression needs editing.",
        "",
    ]
    out += _table(("threshold", "default", "what it sets"), _thresholds())
    out += [
        "## Inhibitions",
        "",
        "From `deploy/alertmanager/alertmanager.yml`: while a source alert fires, a target alert with the same values",
        "of the `equal` labels is not sent.",
        "",
    ]
    out += _table(("source", "target", "equal", "why"), _inhibitions())
    return "\n".join(out)


DOCUMENTS = {"metrics.md": render_metrics, "alerts.md": render_alerts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed document is out of date")
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write to (default docs/)")
    args = parser.parse_args(argv)
    stale = 0
    for name, render in DOCUMENTS.items():
        text, path = render(), args.out / name
        if not args.check:
            path.write_text(text)
            continue
        old = path.read_text() if path.exists() else ""
        if old != text:
            stale += 1
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True), str(path), name))
            print(f"docs/{name} is out of date: run `{COMMAND}` to update it", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
