#!/usr/bin/env python3
"""RSS per import: what each step of the agent's imports adds to a fresh interpreter's resident memory.

Run by hand. Imports the given modules in order in this process and prints the RSS (VmRSS) each one adds, with the
number of modules it brought; the default list is what `gpuwatch run` loads, in its order, largest groups named. A
module already loaded by an earlier one adds nothing: the order decides who is charged for shared dependencies (ssl
comes with prometheus_client's http.client and urllib.request either way). `python -X importtime -m gpuwatch run ...`
gives the time per module.

    python benchmarks/import_rss.py
    python benchmarks/import_rss.py ssl asyncio apscheduler.schedulers.background   # any modules
"""

from __future__ import annotations

import importlib
import sys

DEFAULT = [
    "gpuwatch.config",
    "gpuwatch.cli",
    "gpuwatch.simulation",
    "gpuwatch.simulated.bindings",
    "ssl",
    "http.server",
    "prometheus_client",
    "statistics",
    "gpuwatch.probe.runner",
    "gpuwatch.web",
    "gpuwatch.agent",
]


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def main() -> None:
    modules = sys.argv[1:] or DEFAULT
    print(f"{'python':40s} {rss_mib():6.1f} MiB")
    for name in modules:
        before, count = rss_mib(), len(sys.modules)
        importlib.import_module(name)
        print(f"{name:40s} +{rss_mib() - before:5.1f} MiB  ({len(sys.modules) - count} modules)")
    print(f"{'total':40s} {rss_mib():6.1f} MiB")


if __name__ == "__main__":
    main()
