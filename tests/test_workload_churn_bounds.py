"""What workload churn could grow, and its bound (issue 31, item 7: RSS rose from 38 to 60 MiB over 10 minutes under
churn before it levelled off). Structural bounds only: how many entries each cache holds after many distinct
workloads, never an RSS figure or a time (benchmarks/workload_churn.py measures those).

- the fast renderer's series prefixes: at most twice a family's series now plus _PREFIX_SLACK after each render;
- the user names: at most 4,096 uids;
- what the workloads collector stores: replaced each poll, at most max_per_gpu + 1 workloads per GPU."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from gpuwatch.collectors.workloads import GpuWorkload, attribute, export_gpu
from gpuwatch.core.model import GpuSample
from gpuwatch.exposition import fast
from gpuwatch.exposition.catalogue import CATALOGUE
from gpuwatch.exposition.fast import SeriesLines
from gpuwatch.readers.cgroup import Workload
from gpuwatch.readers.procfs import ProcessOwner, UserNames

GPUS = [(str(i), f"GPU-churn-{i}") for i in range(8)]
INFO = "gpuwatch_gpu_workload_info"
MEMORY = "gpuwatch_gpu_workload_memory_bytes"


def render_poll(poll: int, per_gpu: int) -> SeriesLines:
    """One render, as the render cache makes it: every GPU up, and `per_gpu` workloads on each that no poll had."""
    lines = SeriesLines()
    for gpu in GPUS:
        lines.add("gpuwatch_gpu_up", gpu, 1)
        workloads = tuple(
            GpuWorkload("slurm_job", str(100_000 + (poll * len(GPUS) + int(gpu[0])) * per_gpu + n), "alice", 2**30, 1)
            for n in range(per_gpu)
        )
        export_gpu({gpu[1]: workloads}, gpu, lines)
    lines.bound_prefixes()
    return lines


class _Families:
    """The same samples as prometheus_client families, for its encoder: the oracle of the bytes."""

    def __init__(self, poll: int, per_gpu: int) -> None:
        self.poll, self.per_gpu = poll, per_gpu

    def collect(self) -> list[Metric]:
        up = GaugeMetricFamily("gpuwatch_gpu_up", CATALOGUE["gpuwatch_gpu_up"].help, labels=["gpu", "uuid"])
        info = GaugeMetricFamily(INFO, CATALOGUE[INFO].help, labels=list(CATALOGUE[INFO].labels))
        memory = GaugeMetricFamily(MEMORY, CATALOGUE[MEMORY].help, labels=list(CATALOGUE[MEMORY].labels))
        for gpu in GPUS:
            up.add_metric(list(gpu), 1)
            for n in range(self.per_gpu):
                job = str(100_000 + (self.poll * len(GPUS) + int(gpu[0])) * self.per_gpu + n)
                info.add_metric([*gpu, "slurm_job", job, "alice", ""], 1)  # no MIG: no GPU instance
                memory.add_metric([*gpu, "slurm_job", job, ""], 2**30)
        return [up, info, memory]


def test_the_prefixes_of_churning_workloads_stay_near_the_series_shown() -> None:
    """5,000 polls of 24 new workloads each (120,000 distinct, 12 times _PREFIX_LIMIT per family): a workload family
    never keeps more than twice its series plus _PREFIX_SLACK, and a steady family keeps its prefixes (none made
    anew)."""
    per_gpu, shown = 3, 3 * len(GPUS)
    render_poll(0, per_gpu)
    steady = dict(fast._PREFIXES["gpuwatch_gpu_up"])
    peak = 0
    for poll in range(1, 5_000):
        render_poll(poll, per_gpu)
        for name in (INFO, MEMORY):
            held = len(fast._PREFIXES.get(name, {}))
            assert held <= 2 * shown + fast._PREFIX_SLACK, (poll, name, held)
            peak = max(peak, held)
    assert peak > shown  # it did keep prefixes between renders: the bound, not a cache that never holds any
    now = fast._PREFIXES["gpuwatch_gpu_up"]
    assert all(now[labels] is prefix for labels, prefix in steady.items())


@pytest.mark.parametrize("fmt, accept", [("text", ""), ("openmetrics", "application/openmetrics-text")])
def test_a_render_after_its_prefixes_were_let_go_is_still_the_library_s_bytes(fmt: str, accept: str) -> None:
    per_gpu = 4
    for poll in range(400):  # past several clearings
        lines = render_poll(poll, per_gpu)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(399, per_gpu))
    assert lines.body(fmt) == choose_encoder(accept)[0](registry)


def test_user_names_hold_at_most_4096_uids_after_20000() -> None:
    names = UserNames(clock=lambda: 0.0)
    for uid in range(200_000, 220_000):
        assert names(uid) == str(uid)  # no such user here: the number, as exported
        assert len(names._names) <= 4096
    assert names(0) == "root"


def test_a_gpu_exports_at_most_max_per_gpu_workloads_plus_other_however_many_it_runs() -> None:
    pids = tuple(range(1_000, 1_500))
    sample = GpuSample("GPU-busy", 0.0, process_pids=pids, process_memory_bytes={pid: pid for pid in pids})

    def owner(pid: int) -> ProcessOwner:
        return ProcessOwner(Workload("slurm_job", str(pid)), f"user{pid}", 1)

    workloads = attribute(sample, owner, max_per_gpu=8)
    assert len(workloads) == 9 and workloads[-1].kind == "other" and workloads[-1].processes == 492
