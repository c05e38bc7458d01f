"""`gpuwatch demo` says in its log what the status page shows: a line when a GPU's or the node's finding appears
(GPU 2 overheating, GPU 5 power-capped) and one when it clears, so a person watching the terminal sees the scenario's
faults, not only the probe's rounds. The demo's alone: a real agent leaves this to the alerts and the status page."""

from __future__ import annotations

import threading
from collections.abc import Callable

from gpuwatch.judge.findings import health_flags, node_findings, views
from gpuwatch.state.store import SampleStore

INTERVAL_SECONDS = 5.0


def findings_now(store: SampleStore) -> dict[tuple[str, str], str]:
    """(where, alert) -> text for every finding that needs attention now (info findings are left out)."""
    snap = store.snapshot()
    found: dict[tuple[str, str], str] = {}
    for view in views(snap):
        where = f"GPU {view.identity.index}"
        for f in health_flags(view):
            if f.attention:
                found.setdefault((where, f.alert), f"{where}: {f.text} ({f.alert})")
    for f in node_findings(snap):
        if f.attention:
            found.setdefault(("node", f.alert), f"node: {f.text} ({f.alert})")
    return found


def announce_findings(
    store: SampleStore, say: Callable[[str], None], stop: threading.Event, interval: float = INTERVAL_SECONDS
) -> threading.Thread:
    """A daemon thread that says each new finding once and each cleared one once, every `interval` seconds."""

    def watch() -> None:
        shown: dict[tuple[str, str], str] = {}
        while not stop.wait(interval):
            now = findings_now(store)
            for key, text in now.items():
                if key not in shown:
                    say(f"gpuwatch demo: {text}")
            for key in shown.keys() - now.keys():
                say(f"gpuwatch demo: {key[0]}: {key[1]} cleared")
            shown = now

    thread = threading.Thread(target=watch, daemon=True, name="demo-findings")
    thread.start()
    return thread
