#!/usr/bin/env python3
"""RSS per import: what each step of the agent's imports adds to a fresh interpreter's resident memory.

Run by hand. Imports the given modules in order in this process and prints the RSS (VmRSS) each one adds, with the
number of modules it brought; the default list is what `gpuwatch run` loads, in its order, largest groups named. A
module already loaded by an earlier one adds nothing: the order decides who is charged for shared dependencies (ssl
comes with prometheus_client's http.client and urllib.request either way). `python -X importtime -m gpuwatch run ...`
gives the time per module.

    python benchmarks/import_rss.py
    python benchmarks/import_rss.py ssl asyncio apscheduler.schedulers.background   # any modules
    python benchmarks/import_rss.py --last apscheduler.schedulers.background        # what the agent would save

`--last MOD ...`: the marginal cost of MODs in the agent. Every module a running agent has loaded (simulated, one
GPU, after 8 s) but MODs load themselves, and every module gpuwatch's modules import by name, is imported first in
this interpreter (not MODs' packages nor gpuwatch's); then MODs. So a dependency MODs share with the rest (email, ssl,
urllib between APScheduler and prometheus_client) is charged to the rest: what the agent would save without MODs.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile

DEFAULT = [
    "gpuwatch.config.settings",
    "gpuwatch.cli.main",
    "gpuwatch.simulated.node",
    "gpuwatch.simulated.bindings",
    "ssl",
    "http.server",
    "prometheus_client",
    "statistics",
    "gpuwatch.probe.runner",
    "gpuwatch.web.server",
    "gpuwatch.service.agent",
]


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def loaded_by(modules: list[str]) -> set[str]:
    """The modules a fresh interpreter has after importing `modules` (and not before)."""
    code = (
        "import importlib, json, sys\nbefore = set(sys.modules)\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    return set(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout))


def running_agent_modules(seconds: float = 8.0) -> set[str]:
    """The modules of a running `gpuwatch run` (simulated, one GPU) after `seconds`, lazy imports included."""
    with tempfile.TemporaryDirectory(prefix="gpuwatch-rss-") as state:
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        argv = ["gpuwatch", "run", "--backend", "simulated", "--gpus", "1", "--poll-interval", "1"]
        argv += ["--listen", f"127.0.0.1:{port}", "--state-dir", state]
        read, write = os.pipe()
        code = (
            "import json, os, runpy, sys, threading, time\n"
            "def dump():\n"
            f"    time.sleep({seconds})\n"
            f"    os.write({write}, json.dumps(sorted(sys.modules)).encode())\n"
            "    os._exit(0)\n"
            "threading.Thread(target=dump, daemon=True).start()\n"
            f"sys.argv = {argv!r}\n"
            "runpy.run_module('gpuwatch', run_name='__main__')\n"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=(write,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
        child.wait()
    return set(json.loads(data))


def imported_by_gpuwatch(running: set[str]) -> set[str]:
    """What the running agent's own modules import by name: a module they share with MODs stays charged to them."""
    names: set[str] = set()
    for module in sorted(name for name in running if name.split(".")[0] == "gpuwatch"):
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        with open(spec.origin, encoding="utf-8") as source:
            tree = ast.parse(source.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
    return {name for name in names if name.split(".")[0] != "gpuwatch"}


def marginal(last: list[str]) -> None:
    running = running_agent_modules()
    packages = {name.split(".")[0] for name in last} | {"gpuwatch", "__main__"}  # their submodules load them too
    rest = {name for name in running - loaded_by(last) if name.split(".")[0] not in packages}
    rest |= {name for name in imported_by_gpuwatch(running) if name.split(".")[0] not in packages}
    for name in sorted(rest):
        with contextlib.suppress(ImportError):  # none expected; a module only the agent's interpreter has
            importlib.import_module(name)
    before, count = rss_mib(), len(sys.modules)
    print(f"{'the rest of the running agent':40s} {before:6.1f} MiB  ({count} modules)")
    for name in last:
        importlib.import_module(name)
    print(f"{' + '.join(last):40s} +{rss_mib() - before:5.1f} MiB  ({len(sys.modules) - count} modules)")


def main() -> None:
    if sys.argv[1:2] == ["--last"]:
        marginal(sys.argv[2:])
        return
    modules = sys.argv[1:] or DEFAULT
    print(f"{'python':40s} {rss_mib():6.1f} MiB")
    for name in modules:
        before, count = rss_mib(), len(sys.modules)
        importlib.import_module(name)
        print(f"{name:40s} +{rss_mib() - before:5.1f} MiB  ({len(sys.modules) - count} modules)")
    print(f"{'total':40s} {rss_mib():6.1f} MiB")


if __name__ == "__main__":
    main()
