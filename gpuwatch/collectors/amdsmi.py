"""The `amdsmi` collector: every AMD GPU through AMD SMI (ROCm's amdsmi), read on the agent's poll job. Its
code is shared with its sibling in gpuwatch/collectors/vendors.py; its section says what it serves beyond the default
(docs/configuration.md, docs/cost-and-sizing.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from gpuwatch.collectors.vendors import check, collectors

__all__ = ["SETTINGS", "AmdsmiSection", "check", "collectors"]


@dataclass(frozen=True, slots=True)
class AmdsmiSection:
    """[amdsmi]: detail beyond the per-GPU default. XGMI links are served as NVLinks are (gpuwatch_gpu_nvlinks_* per
    GPU, a link on its own once it misbehaved)."""

    SECTION: ClassVar[str] = "amdsmi"

    xgmi_per_link: bool = False  # serve every XGMI link's own series (gpuwatch_gpu_nvlink_*{link}), not only bad ones

    def problems(self) -> Iterator[tuple[str, str]]:
        return iter(())


SETTINGS = AmdsmiSection
