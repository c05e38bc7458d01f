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
    counters), 1,008 on 8 GPUs × 18 links; by default a link is served on its own only once it misbehaved. The SM
    pipes' activity is opt-in detail ([compat] dcgm serves it too: DCGM's DCGM_FI_PROF_PIPE_* fields read it)."""

    SECTION: ClassVar[str] = "nvml"

    nvlink_per_link: bool = False  # serve every NVLink's own series (gpuwatch_gpu_nvlink_*{link}), not only bad ones
    # Serve each SM pipe's activity (gpuwatch_gpu_pipe_active_ratio{pipe}, and gpuwatch_gpu_active_cycles_total for
    # the pipes beyond sm and tensor): 8 to 16 series a GPU with GPM. sm and tensor activity are served either way.
    gpm_per_pipe: bool = False
    # Serve the video engines' clock (gpuwatch_gpu_clock_hertz{clock="video"}, NVDEC/NVENC's): 1 series a GPU that
    # no rule, board or page reads; a transcoding node may want it.
    video_clock: bool = False

    def problems(self) -> Iterator[tuple[str, str]]:
        return iter(())


SETTINGS = NvmlSection
