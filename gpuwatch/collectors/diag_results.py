"""The `diag_results` collector: the last run of each `gpuwatch diag` test on each GPU (the state dir's
`diag_results.json`, gpuwatch/probe/diag_results.py), read again when the file changes and exported per GPU; the
judge (gpuwatch/judge/findings.py) turns a failed test into a finding, so the verdict and the fault ledger hold it.
Every poll interval on its own job; a stat() and nothing more while the file is unchanged."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from gpuwatch.collectors.base import CheckLine, CollectorContext, Every
from gpuwatch.collectors.sources import NodeSources
from gpuwatch.config.settings import Config
from gpuwatch.core.metric_spec import GPU, MetricSpec, SampleSink
from gpuwatch.probe.diag_results import RESULTS, GpuRecord, read_results, results_path

log = logging.getLogger(__name__)

FAMILIES = (
    MetricSpec(
        "gpuwatch_diag_result",
        "gauge",
        (*GPU, "test", "result"),
        "The last `gpuwatch diag` run of `test` on the GPU: 1 for its result (pass, fail, skip), 0 for the others.",
    ),
    MetricSpec(
        "gpuwatch_diag_last_run_timestamp_seconds",
        "gauge",
        (*GPU, "test"),
        "When the last `gpuwatch diag` run of `test` on the GPU ended (unix time).",
    ),
    MetricSpec(
        "gpuwatch_diag_duration_seconds",
        "gauge",
        (*GPU, "test"),
        "How long the last `gpuwatch diag` run of `test` on the GPU took.",
    ),
)

DiagResults = Mapping[str, GpuRecord]  # what a run stores: GPU uuid -> its last diag results


def export_gpu(part: DiagResults | None, gpu: tuple[str, str], out: SampleSink) -> None:
    record = (part or {}).get(gpu[1])
    if record is None:
        return
    for test in record.tests.values():
        for result in RESULTS:
            out.add("gpuwatch_diag_result", (*gpu, test.name, result), int(test.result == result))
        out.add("gpuwatch_diag_last_run_timestamp_seconds", (*gpu, test.name), test.at)
        out.add("gpuwatch_diag_duration_seconds", (*gpu, test.name), test.seconds)


class DiagResultsCollector:
    name = "diag_results"
    schedule = Every("diag-results", lambda config: config.agent.poll_interval_seconds)

    def __init__(self, context: CollectorContext) -> None:
        self._context = context
        self._stamp: tuple[int, int, int] | None = None

    def update(self) -> bool:
        path = results_path(self._context.config().state_dir)
        try:
            st = os.stat(path)
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp or stamp is None:
            self._stamp = stamp
            self._context.store.set_part(self.name, read_results(path.parent) if stamp is not None else {})
        return True


def collectors(context: CollectorContext, name: str) -> list[DiagResultsCollector]:
    return [DiagResultsCollector(context)]


def check(config: Config, sources: NodeSources, name: str) -> list[CheckLine]:
    results = read_results(config.state_dir, move_aside=False)
    if not results:
        return [CheckLine("ok", "diag results", f"none in {config.state_dir} (run `gpuwatch diag`)")]
    failed = sorted(f"GPU {g.index} {t.name}" for g in results.values() for t in g.tests.values() if t.result == "fail")
    if failed:
        return [
            CheckLine(
                "warn",
                "diag results",
                "failed: " + ", ".join(failed),
                "see `gpuwatch health` and docs/diag.md; run `gpuwatch diag` again once the GPU is repaired",
            )
        ]
    return [CheckLine("ok", "diag results", f"{len(results)} GPU(s), no failed test")]
