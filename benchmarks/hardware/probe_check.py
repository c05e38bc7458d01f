#!/usr/bin/env python3
"""Issue #33's hardware Show: the probe's checked result on a real GPU (docs/probe.md, "Checked results").

Run by hand on a GPU node (read-only there: it changes no GPU setting). For each probe engine installed (CuPy, PyTorch):

1. N probes of the production worker (`python -m gpuwatch.probe.worker --json`, bf16 8192³ as the agent runs it): its
   `compute_check` each time -> "compute errors over N probes: K". Issue #36 asks for at least 50: the engine the
   agent's `auto` picks (CuPy where installed) runs --probes (default 50), any other --other-probes (default 5);
2. one probe with one element of the result corrupted on the device before the check (the worker's hidden
   `--corrupt-elements 1`) -> "corrupted result caught: yes|no";
3. the false-alarm study (benchmarks/probe_check_false_alarms.py) on the GPU: many healthy checks per dtype at
   8192, each on fresh inputs, the margin of the worst column, and corrupted results caught.

Writes one JSON (--out) and a Markdown summary (--markdown, also printed). `--dry-run` runs the same flow on the CPU
with torch at a small size, so a slip in this script costs no device time. Exit status: 0 when no healthy probe was
called wrong and every corrupted one was caught, 1 otherwise (or when nothing could run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuwatch.probe.engines import available_engines

REPO = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probes", type=int, default=50, help="healthy probes of the engine auto picks (default 50)")
    p.add_argument("--other-probes", type=int, default=5, help="healthy probes of each other engine (default 5)")
    p.add_argument("--seeds", type=int, default=100, help="healthy checks per engine and dtype in the study")
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--out", type=Path, default=Path("probe_check.json"))
    p.add_argument("--markdown", type=Path, help="also write the summary here")
    p.add_argument("--dry-run", action="store_true", help="the CPU, torch, a small size: no GPU needed")
    args = p.parse_args(argv)
    if args.probes < 1 or args.other_probes < 1 or args.seeds < 1 or args.size < 2:
        p.error("--probes, --other-probes and --seeds must be at least 1, --size at least 2")
    return args


def worker(args: argparse.Namespace, engine: str, *extra: str) -> dict[str, Any]:
    """One production worker child; its JSON (or the error, with its stderr's tail)."""
    device = ["--device", "cpu"] if args.dry_run else []
    argv = [sys.executable, "-m", "gpuwatch.probe.worker", "--json", "--engine", engine, "--size", str(args.size)]
    argv += [*device, "--copy-mib", "16", *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    try:
        doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "error": f"exit {proc.returncode}, no JSON: {proc.stderr[-400:]}"}
    return doc


def engine_part(args: argparse.Namespace, engine: str, count: int) -> dict[str, Any]:
    probes = [worker(args, engine) for _ in range(count)]
    checks = [p.get("compute_check") or {} for p in probes if p.get("ok")]
    errors = sum(1 for c in checks if c.get("bad_columns"))
    corrupted = worker(args, engine, "--corrupt-elements", "1")
    check = corrupted.get("compute_check") or {}
    return {
        "engine": engine,
        "probes": probes,
        "probes_ok": len(checks),
        "compute_errors": errors,
        "worst_excess_healthy": max((c.get("worst_excess") or 0.0 for c in checks), default=None),
        "check_seconds": [c.get("seconds") for c in checks],
        "corrupted": corrupted,
        "corrupted_caught": bool(check.get("bad_columns")) if corrupted.get("ok") else None,
    }


def study(args: argparse.Namespace, engines: list[str]) -> dict[str, Any]:
    script = REPO / "benchmarks" / "probe_check_false_alarms.py"
    device = "cpu" if args.dry_run else "gpu"
    argv = [sys.executable, str(script), "--json", "--device", device, "--engines", *engines]
    argv += ["--sizes", str(args.size), "--seeds", str(args.seeds), "--corrupted", str(min(10, args.seeds))]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=540)
    try:
        doc: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        return {"error": f"exit {proc.returncode}: {proc.stderr[-400:]}"}
    return doc


def summary(doc: dict[str, Any]) -> list[str]:
    lines = [f"# The probe's checked result ({doc['started']}{', DRY RUN on the CPU' if doc['dry_run'] else ''})", ""]
    for part in doc["engines"]:
        caught = part["corrupted_caught"]
        lines.append(
            f"- {part['engine']}: compute errors over {part['probes_ok']} probes: {part['compute_errors']} "
            f"(worst healthy column at {part['worst_excess_healthy'] or 0:.3f} of its tolerance); corrupted result "
            f"caught: {'yes' if caught else 'no' if caught is False else 'not run: ' + str(part['corrupted'])[:200]}"
        )
    if not doc["engines"]:
        lines.append("- no probe engine installed: nothing ran")
    rows = (doc.get("study") or {}).get("rows") or []
    if rows:
        lines += [
            "",
            "| engine | dtype | n | checks | false alarms | worst excess (max / p99) | tol / ‖C_j‖ | corrupted caught "
            "| check (ms) |",
            "|---|---|---:|---:|---:|---|---:|---|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['engine']} {r['engine_version']} ({r['blas_version']}) | {r['dtype']} | {r['n']} "
                f"| {r['checks']} "
                f"| {r['false_alarms']} | {r['worst_excess_max']:.3f} / {r['worst_excess_p99']:.3f} "
                f"| {r['tolerance_over_column_norm']:.3g} | {r['corrupted_caught']} of {r['corrupted_checks']} "
                f"| {r['check_seconds_median'] * 1000:.1f} |"
            )
    elif doc.get("study"):
        lines.append(f"- false-alarm study: {doc['study']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run and args.size == 8192:
        args.size = 256
    engines = [e for e in available_engines() if not (args.dry_run and e == "cupy")]
    doc: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dry_run": args.dry_run,
        "size": args.size,
        "engines": [],
    }
    for position, engine in enumerate(engines):  # the first is auto's choice (gpuwatch/probe/engines.py)
        doc["engines"].append(engine_part(args, engine, args.probes if position == 0 else args.other_probes))
        args.out.write_text(json.dumps(doc, indent=2))
    doc["study"] = study(args, engines) if engines else None
    args.out.write_text(json.dumps(doc, indent=2))
    text = "\n".join(summary(doc)) + "\n"
    if args.markdown:
        args.markdown.write_text(text)
    print(text)
    good = bool(engines) and all(p["compute_errors"] == 0 and p["corrupted_caught"] for p in doc["engines"])
    rows = (doc.get("study") or {}).get("rows") or []
    good = (
        good
        and bool(rows)
        and all(r["false_alarms"] == 0 and r["corrupted_caught"] == r["corrupted_checks"] for r in rows)
    )
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
