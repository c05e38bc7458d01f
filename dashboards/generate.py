"""Generate gpuwatch's Grafana dashboards from code (grafana-foundation-sdk, Grafana 10.1 schema).

    python dashboards/generate.py          # rewrite dashboards/*.json
    python dashboards/generate.py --check  # exit 1 if the committed JSON differs from what the code generates

The JSON is committed so operators import it without Python; a test regenerates it and diffs. This file is the entry
point only; the dashboards are built in dashboards/gen/ (`board` and `promql` the shared building blocks, one module
per dashboard), which Python finds beside this script. The agent never imports any of it. Every query selects a
datasource variable, joins on `uuid`, and uses only the metrics of docs/metrics.md and the recording
rules of deploy/prometheus/gpuwatch-rules.yml.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from gen.fleet import fleet_overview
from gen.node import node_detail
from gen.workloads import workloads

HERE = Path(__file__).resolve().parent
GRAFANA_TARGET = "10.1"  # the schema grafana-foundation-sdk==1769699998!10.1.0 generates (schemaVersion 36)

DASHBOARDS = {
    "gpuwatch-fleet.json": fleet_overview,
    "gpuwatch-node.json": node_detail,
    "gpuwatch-workloads.json": workloads,
}


def render() -> dict[str, str]:
    """File name -> JSON text, stable (sorted keys, trailing newline) so the diff test is meaningful."""
    return {
        name: json.dumps(make(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        for name, make in DASHBOARDS.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed JSON instead of writing")
    parser.add_argument("--out", type=Path, default=HERE, help="directory for the JSON files (default: dashboards/)")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; run: python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
