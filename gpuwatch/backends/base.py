"""The narrow interface every vendor backend offers to the agent."""

from __future__ import annotations

from typing import Protocol

from gpuwatch.core.model import GpuEvent, GpuIdentity, GpuReading, UnusableGpu, Vendor


class BackendUnavailable(Exception):
    """The vendor library cannot be used now (missing, driver not loaded, version mismatch).

    Never fatal: the agent reports ``gpuwatch_backend_up 0`` and retries with backoff.
    """


class Backend(Protocol):
    """One vendor library. Only the backend modules speak to vendor libraries; everything else speaks to this."""

    name: str  # the collector name: nvml, amdsmi
    vendor: Vendor

    def open(self) -> None:
        """Initialise the library and enumerate GPUs; raise BackendUnavailable with a message for operators."""

    def close(self) -> None:
        """Release the library; safe to call when not open."""

    def poll(self, *, slow: bool) -> list[GpuReading]:
        """Read every GPU: the fast tier always, the slow tier when asked; raises BackendUnavailable if the
        library itself stopped working (so the agent reopens it)."""
        ...

    def wait_events(self, timeout_s: float) -> list[GpuEvent]:
        """Block up to timeout_s for events (XID, reset); return [] on timeout."""
        ...

    def versions(self) -> dict[str, str]:
        """Library and driver versions, for ``gpuwatch version`` and ``check``."""
        ...

    def gpus(self) -> list[GpuIdentity]:
        """The GPUs found at open, in index order."""
        ...

    def unusable(self) -> list[UnusableGpu]:
        """GPUs the library counts but could not open at open (NVML: power cables not attached)."""
        ...

    def case_identity(self, uuid: str) -> dict[str, str | None]:
        """Read now, for `gpuwatch report`: board part number and firmware versions, named as the vendor names them
        (None: not available); {} for a GPU the backend does not know."""
        ...

    def reset_uuids(self) -> list[str]:
        """GPUs whose reset counters exist from start-up at 0 (AMD reports resets; NVML has none)."""
        ...

    def activity_support(self) -> tuple[int, list[tuple[int, str]]]:
        """Real utilization (SM/tensor/DRAM activity): how many GPUs have it, and (gpu, why not) for each GPU
        without it, for ``check`` (its series are absent there, never 0)."""
        ...

    def version_problem(self) -> str | None:
        """A library/host version mismatch worth a FAIL line in ``check`` (AMD: package vs ROCm), else None."""
        ...
