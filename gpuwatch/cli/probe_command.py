"""`gpuwatch probe`: run the probe now, in this process's children, and print each result beside its baseline.

Reads the GPUs once through the same backends as the agent, keeps polling them while the probe runs (telemetry,
power cap, processes), waits for — never overlaps — a probe the agent is running (per-GPU locks), and changes
baselines only with --update-baseline / --reset-baseline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import threading
from collections.abc import Iterator
from typing import Any

from gpuwatch.backends.base import Backend, BackendUnavailable
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.core.exitcodes import EXIT_CONFIG, EXIT_NOT_OK, EXIT_OK, EXIT_UNAVAILABLE
from gpuwatch.files.statedir import STATE_DIR_MODE, StateDirUnsafe, require_safe_state_dir
from gpuwatch.probe.baseline import Mode
from gpuwatch.probe.locks import LockUnavailable
from gpuwatch.probe.runner import ProbeRunner
from gpuwatch.service.nodes import build_sources
from gpuwatch.state.probebook import ProbeOutcome
from gpuwatch.state.store import SampleStore

POLL_SECONDS = 0.25


def probe(config: Config, *, gpus: list[int], as_json: bool, update_baseline: bool, reset_baseline: bool) -> int:
    mode: Mode = "reset" if reset_baseline else "update" if update_baseline else "none"
    try:  # another user's state dir, or one others may write in: its links would steer this (root) process
        require_safe_state_dir(config.state_dir)
    except StateDirUnsafe as exc:
        print(f"gpuwatch probe: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    with contextlib.suppress(OSError):  # a missing state dir is made; one we may not write is reported at the lock
        config.state_dir.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
    try:
        with polled_node(config) as (store, sources):
            known = sorted(i.index for i in store.identities().values())
            unknown = [n for n in gpus if n not in known]
            if unknown:
                print(f"gpuwatch probe: no GPU {unknown} on this node (GPUs: {known})", file=sys.stderr)
                return EXIT_NOT_OK
            runner = ProbeRunner(
                dataclasses.replace(config.probe, require_idle_node=False),  # the CLI probes every idle GPU it is given
                store,
                config.state_dir,
                launcher=sources.probe_launcher,
                progress=lambda text: print(text, file=sys.stderr, flush=True),
            )
            outcomes = runner.run(
                gpus=set(gpus) if gpus else None,
                explicit=bool(gpus),
                baseline_mode=mode,
                wait_for_locks=True,
            )
    except (NodeUnavailable, LockUnavailable) as exc:
        print(f"gpuwatch probe: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if as_json:
        print(json.dumps({"results": [_outcome_json(o) for o in outcomes]}, indent=2))
    else:
        _print_table(outcomes)
    return EXIT_OK if outcomes and all(o.result == "ok" for o in outcomes) else EXIT_NOT_OK


class NodeUnavailable(Exception):
    """A GPU backend cannot be opened, or the node has no GPU to probe; the message says which."""


@contextlib.contextmanager
def polled_node(config: Config) -> Iterator[tuple[SampleStore, NodeSources]]:
    """The node's GPUs read once through the same backends as the agent, then polled while the block runs (telemetry,
    power cap, processes: what the probe runner reads), and closed after it. `gpuwatch probe` and `gpuwatch slurm
    epilog` probe in it."""
    sources = build_sources(config)
    store = SampleStore(poll_interval_seconds=POLL_SECONDS)
    backends: list[Backend] = []
    try:
        for slot in sources.slots:
            try:
                backend = slot.factory()
                backend.open()
            except BackendUnavailable as exc:
                raise NodeUnavailable(f"{slot.name} unavailable: {exc}") from None
            backends.append(backend)
            store.record_poll(backend.poll(slow=True))
        if not store.identities():  # nothing to probe is a resource this command cannot work without (README: exit 69)
            raise NodeUnavailable("no GPU on this node to probe (gpuwatch check says why)")
        poller = _Poller(store, backends)
        poller.start()
        try:
            yield store, sources
        finally:
            poller.stop()
    finally:
        for backend in backends:
            backend.close()


class _Poller:
    """Keeps the store fresh while the probe runs, as the agent's poll job would (telemetry, power cap)."""

    def __init__(self, store: SampleStore, backends: list[Backend]) -> None:
        self._store, self._backends = store, backends
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="probe-poll", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _loop(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            for backend in self._backends:
                try:
                    self._store.record_poll(backend.poll(slow=False))
                except BackendUnavailable:
                    continue


def _outcome_json(o: ProbeOutcome) -> dict[str, Any]:
    return {
        "gpu": o.index,
        "uuid": o.uuid,
        "result": o.result,
        "reason": o.reason,
        "measured": None if o.measured is None else dataclasses.asdict(o.measured),
        "telemetry": dataclasses.asdict(o.telemetry),
        "wall_seconds": o.wall_seconds,
        "baseline_flops": o.baseline_flops,
        "ratio_to_baseline": o.ratio,
    }


def _print_table(outcomes: list[ProbeOutcome]) -> None:
    print(f"{'GPU':>3}  {'result':<19} {'TFLOP/s':>8} {'baseline':>8} {'ratio':>6} {'spread':>6} "
          f"{'H2D GB/s':>8} {'D2H GB/s':>8} {'capped':>6} {'wall s':>6}  note")  # fmt: skip
    for o in outcomes:
        m = o.measured
        if m is None or o.result == "compute_error":  # a wrong result's speed means nothing: its reason says why
            print(f"{o.index:>3}  {o.result:<19} {'':>8} {_tf(o.baseline_flops):>8} {'':>6} {'':>6} {'':>8} {'':>8} "
                  f"{'':>6} {'':>6}  {o.reason}")  # fmt: skip
            continue
        ratio = "-" if o.ratio is None else f"{o.ratio:.3f}"
        capped = "-" if m.power_capped is None else ("yes" if m.power_capped else "no")
        print(f"{o.index:>3}  {o.result:<19} {_tf(m.flops_median):>8} {_tf(o.baseline_flops):>8} {ratio:>6} "
              f"{m.spread_ratio:>6.3f} {_gb(m.h2d_bytes_per_second):>8} {_gb(m.d2h_bytes_per_second):>8} "
              f"{capped:>6} {_num(o.wall_seconds):>6}  {m.engine} {m.engine_version}, {m.blas_version}, {m.dtype} "
              f"{m.shape}{'; ' + o.reason if o.reason else ''}")  # fmt: skip


def _tf(flops: float | None) -> str:
    return "-" if flops is None else f"{flops / 1e12:.1f}"


def _gb(rate: float | None) -> str:
    return "-" if rate is None else f"{rate / 1e9:.1f}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
