"""What a metric family is (name, type, labels, help) and where a collector writes its samples: the words the
catalogue (gpuwatch/exposition/catalogue.py) and a collector module declaring its own FAMILIES share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

MetricType = Literal["gauge", "counter"]

GPU = ("gpu", "uuid")  # the labels of every per-GPU family, first


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    type: MetricType
    labels: tuple[str, ...]
    help: str


class SampleSink(Protocol):
    """Where an export writes: one sample of the catalogue's family `name` (a None value is no sample)."""

    def add(self, name: str, labels: tuple[str, ...], value: float | int | bool | None) -> None: ...


@dataclass(frozen=True, slots=True)
class ExportDetail:
    """What the exposition serves beyond its default, from the configuration (docs/cost-and-sizing.md, "The series
    budget"): the default keeps a healthy 8-GPU HGX node within 700 series."""

    nvlink_per_link: frozenset[str] = frozenset()  # vendors whose every link is served per link ([nvml], [amdsmi])
    per_pipe: bool = False  # every SM pipe's activity (NVIDIA GPM), [nvml] gpm_per_pipe
    video_clock: bool = False  # the video engines' clock (NVIDIA), [nvml] video_clock
    # [compat] dcgm: what its mapping (gpuwatch/exposition/dcgm_fields.py) reads is served whole, as before the
    # budget, so dcgm-exporter's names answer what they answered (a field absent where its source was cut would not).
    dcgm: bool = False
