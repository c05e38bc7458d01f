"""Probe results as they flow from the runner through the store to the exporter and the status page.

`ProbeBook` is the store's probe compartment (thread-safe, written by the runner); `ProbeView` is its immutable copy
in a StoreSnapshot; the exporter's `export_probe` turns a view into `gpuwatch_probe_*` samples for one GPU. State
layer: the probe (above) writes it, the store holds it, exposition reads it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

# compute_error: the probe ran and its result was wrong (its column checksums disagree beyond rounding): never "ok",
# never slow, never part of a baseline.
ProbeResult = Literal["ok", "skipped_busy", "skipped_unsupported", "failed", "timeout", "compute_error"]
RESULTS: tuple[ProbeResult, ...] = get_args(ProbeResult)

# The highest probe throughput believed, in FLOP/s. The fastest GPUs peak at about 2.5e15 dense in bf16 (the probe's
# default dtype; B200/B300) and at 1.5e16 at their lowest precision (B300, FP4 dense); 1e18 is over 60 times that,
# so a value above it is a corrupt number, never a fast GPU. There is no lower bound but zero: the probe's size is
# configurable, and a small matmul on a slow device measures little.
MAX_PLAUSIBLE_FLOPS = 1e18


def plausible_flops(value: object) -> bool:
    """Whether `value` can be a measured throughput: a finite number in (0, MAX_PLAUSIBLE_FLOPS]. NaN, infinities,
    zero, negatives and 1e308 are not (each made a wrong verdict: a negative baseline a "-68 %" slow probe, an
    infinite one a GpuUnderperforming that never healed, NaN no check at all)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= MAX_PLAUSIBLE_FLOPS
    )


@dataclass(frozen=True, slots=True)
class ComputeCheck:
    """The worker's check of its last matmul (gpuwatch/probe/checksum.py): `ran` false where it could not check
    (the simulated node without torch says so rather than pretend)."""

    ran: bool
    columns: int = 0
    bad_columns: int = 0
    worst_excess: float | None = None  # the largest |difference| / tolerance; None: not finite (NaN, inf)
    tolerance: float | None = None
    corrupted_elements: int = 0  # the test hook's, so a planted error is never mistaken for the hardware's
    why: str = ""  # why it did not run
    engine: str = ""  # what computed the checked matmul when not the probe's own engine (the simulated node's)

    @property
    def wrong(self) -> bool:
        return self.ran and self.bad_columns > 0

    @staticmethod
    def from_json(data: object) -> ComputeCheck:
        """Parse a worker's compute_check; TypeError/ValueError when it is malformed."""
        if not isinstance(data, dict):
            raise TypeError(f"compute_check must be an object, got {data!r}")
        ran = data.get("ran")
        if not isinstance(ran, bool):
            raise TypeError(f"compute_check.ran must be a boolean, got {ran!r}")
        if not ran:
            return ComputeCheck(False, why=str(data.get("why", "")), engine=str(data.get("engine", "")))
        columns, bad = data.get("columns"), data.get("bad_columns")
        if not (isinstance(columns, int) and isinstance(bad, int) and 0 <= bad <= columns):
            raise ValueError(f"compute_check needs 0 <= bad_columns <= columns, got {bad!r} of {columns!r}")
        excess, tolerance = data.get("worst_excess"), data.get("tolerance")
        corrupted = data.get("corrupted_elements", 0)
        return ComputeCheck(
            True,
            columns,
            bad,
            None if excess is None else float(excess),
            None if tolerance is None else float(tolerance),
            int(corrupted),
            engine=str(data.get("engine", "")),
        )

    def describe(self) -> str:
        """One line for a reason, a log line and the ledger's evidence."""
        if not self.ran:
            return f"result not checked: {self.why or 'no reason given'}"
        worst = "not finite" if self.worst_excess is None else f"{self.worst_excess:.3g}x its tolerance"
        planted = (
            f" ({self.corrupted_elements} corrupted on purpose by the test hook)" if self.corrupted_elements else ""
        )
        return f"wrong result: {self.bad_columns} of {self.columns} column checksums disagree (worst {worst}){planted}"


@dataclass(frozen=True, slots=True)
class WorkerResult:
    """What one worker child measured (its JSON, typed)."""

    engine: str
    engine_version: str
    blas_version: str
    dtype: str
    shape: str
    flops_median: float
    flops_p10: float
    flops_p90: float
    spread_ratio: float
    iterations: int
    gpu_time_seconds: float
    power_capped: bool | None
    h2d_bytes_per_second: float | None
    d2h_bytes_per_second: float | None
    copy_kind: str
    device: str
    compute_check: ComputeCheck | None = None  # None: the worker did not check (one from before the check existed)

    @staticmethod
    def from_json(data: dict[str, Any]) -> WorkerResult:
        """Parse a worker's success document; KeyError/TypeError/ValueError when it is malformed."""

        def opt(key: str) -> float | None:
            value = data.get(key)
            return None if value is None else float(value)

        capped = data.get("power_capped")
        if capped is not None and not isinstance(capped, bool):
            raise TypeError(f"power_capped must be a boolean or null, got {capped!r}")
        result = WorkerResult(
            engine=str(data["engine"]),
            engine_version=str(data["engine_version"]),
            blas_version=str(data["blas_version"]),
            dtype=str(data["dtype"]),
            shape=str(data["shape"]),
            flops_median=float(data["flops_median"]),
            flops_p10=float(data["flops_p10"]),
            flops_p90=float(data["flops_p90"]),
            spread_ratio=float(data["spread_ratio"]),
            iterations=int(data["iterations"]),
            gpu_time_seconds=float(data["gpu_time_seconds"]),
            power_capped=capped,
            h2d_bytes_per_second=opt("h2d_bytes_per_second"),
            d2h_bytes_per_second=opt("d2h_bytes_per_second"),
            copy_kind=str(data.get("copy_kind", "")),
            device=str(data.get("device", "")),
            compute_check=None if data.get("compute_check") is None else ComputeCheck.from_json(data["compute_check"]),
        )
        if not plausible_flops(result.flops_median):
            raise ValueError(
                f"flops_median must be in (0, {MAX_PLAUSIBLE_FLOPS:g}] FLOP/s, got {result.flops_median!r}"
            )
        return result


@dataclass(frozen=True, slots=True)
class Telemetry:
    """What the vendor library showed while the probe ran (from the store's fresh samples); None = no sample."""

    sm_clock_hertz: float | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None  # peak core temperature
    samples: int = 0


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    """One GPU's probe run: its result class, why, and what it measured when it ran."""

    uuid: str
    index: int
    result: ProbeResult
    reason: str = ""
    timestamp: float = 0.0  # unix time the run ended
    measured: WorkerResult | None = None
    telemetry: Telemetry = field(default_factory=Telemetry)
    wall_seconds: float | None = None  # child start to result, including the engine's import
    baseline_flops: float | None = None  # the GPU's baseline after this run (None: not established)
    baseline_note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.measured is None or not self.baseline_flops:
            return None
        return self.measured.flops_median / self.baseline_flops


@dataclass(frozen=True, slots=True)
class ProbeView:
    """An immutable copy of the probe state for one scrape."""

    enabled: bool = False
    interval_seconds: float = 0.0
    runs: dict[str, dict[str, int]] = field(default_factory=dict)
    last_ok: dict[str, ProbeOutcome] = field(default_factory=dict)
    last_any: dict[str, ProbeOutcome] = field(default_factory=dict)
    last_compute_error: dict[str, ProbeOutcome] = field(default_factory=dict)  # uuid -> its last wrong result
    baselines: dict[str, tuple[str, float]] = field(default_factory=dict)  # uuid -> (dtype, FLOP/s)
    previous_baselines: dict[str, tuple[str, float]] = field(default_factory=dict)  # before the current key
    # uuid -> (start, end; None while it runs) of the GPU's last probe: a sample taken within shows the probe's own load
    windows: dict[str, tuple[float, float | None]] = field(default_factory=dict)

    def under_probe(self, uuid: str, timestamp: float) -> bool:
        """Whether a sample of this GPU taken at `timestamp` shows the probe's own load (its worker ran)."""
        window = self.windows.get(uuid)
        return window is not None and window[0] <= timestamp and (window[1] is None or timestamp <= window[1])


class ProbeBook:
    """The store's probe compartment: counters from start-up at 0, the last results, the baselines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._view = ProbeView()

    def configure(self, *, enabled: bool, interval_seconds: float) -> None:
        with self._lock:
            self._view = replace(self._view, enabled=enabled, interval_seconds=interval_seconds)

    def record(self, outcome: ProbeOutcome) -> None:
        with self._lock:
            v = self._view
            runs = {uuid: dict(counts) for uuid, counts in v.runs.items()}
            counts = runs.setdefault(outcome.uuid, dict.fromkeys(RESULTS, 0))
            counts[outcome.result] = counts.get(outcome.result, 0) + 1
            last_ok = dict(v.last_ok)
            if outcome.result == "ok":
                last_ok[outcome.uuid] = outcome
            errors = v.last_compute_error
            if outcome.result == "compute_error":
                errors = {**errors, outcome.uuid: outcome}
            self._view = replace(
                v,
                runs=runs,
                last_ok=last_ok,
                last_any={**v.last_any, outcome.uuid: outcome},
                last_compute_error=errors,
            )

    def set_baseline(
        self, uuid: str, dtype: str, flops: float | None, previous: tuple[str, float] | None = None
    ) -> None:
        """The GPU's baseline (None: not established) and the one it had under its previous key."""
        with self._lock:
            baselines, previous_baselines = dict(self._view.baselines), dict(self._view.previous_baselines)
            for book, value in ((baselines, None if flops is None else (dtype, flops)), (previous_baselines, previous)):
                if value is None:
                    book.pop(uuid, None)
                else:
                    book[uuid] = value
            self._view = replace(self._view, baselines=baselines, previous_baselines=previous_baselines)

    def probing(self, uuids: Iterable[str], since: float) -> None:
        """A probe round starts its workers on these GPUs now."""
        with self._lock:
            self._view = replace(self._view, windows={**self._view.windows, **dict.fromkeys(uuids, (since, None))})

    def probed(self, uuids: Iterable[str], until: float) -> None:
        """The probe round on these GPUs has ended: none of its workers runs any more."""
        with self._lock:
            windows = dict(self._view.windows)
            for uuid in uuids:
                if uuid in windows:
                    windows[uuid] = (windows[uuid][0], until)
            self._view = replace(self._view, windows=windows)

    def view(self) -> ProbeView:
        with self._lock:
            return self._view  # every update replaces the view, so handing it out is safe
