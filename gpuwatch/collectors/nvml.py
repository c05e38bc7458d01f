"""The `nvml` collector: every NVIDIA GPU through NVML (NVIDIA's nvidia-ml-py), read on the agent's poll job. Its
code is shared with its sibling in gpuwatch/collectors/vendors.py; its section says what it serves beyond the default
(docs/configuration.md, docs/cost-and-sizing.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from gpuwatch.collectors.vendors import check, collectors

__all__ = ["SETTINGS", "NvmlSection", "check", "collectors"]


@dataclass(frozen=True, slots=True)
class NvmlSection:
    """[nvml]: detail beyond the per-GPU default. Each link of an HGX H100 is 7 series (state, 4 error counters, 2 byte
    counters), 1,008 on 8 GPUs × 18 links; by default a link is served on its own only once it misbehaved."""

    SECTION: ClassVar[str] = "nvml"

    nvlink_per_link: bool = False  # serve every NVLink's own series (gpuwatch_gpu_nvlink_*{link}), not only bad ones

    def problems(self) -> Iterator[tuple[str, str]]:
        return iter(())


SETTINGS = NvmlSection
