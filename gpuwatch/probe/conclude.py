"""What a finished probe worker's output means: one ProbeOutcome, and the baseline bookkeeping it brings (the
baselines file, the exported baseline, a slow GPU's warning, an engine fallback said once).

gpuwatch/probe/supervisor.py ran the child; gpuwatch/probe/runner.py decided it should run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuwatch.config.settings import ProbeSection
from gpuwatch.core.exitcodes import WORKER_NO_ENGINE
from gpuwatch.core.latch import Latch
from gpuwatch.core.model import GpuIdentity, GpuSample
from gpuwatch.core.thresholds import runbook_reference
from gpuwatch.probe.baseline import BaselineKey, Baselines, Mode
from gpuwatch.probe.children import _Child, _failure, _last_json
from gpuwatch.probe.readings import SpeedLog, _previous, _telemetry
from gpuwatch.state.probebook import ProbeBook, ProbeOutcome, ProbeResult, WorkerResult

log = logging.getLogger(__name__)

READER_JOIN_SECONDS = 2.0  # a child's output readers end with its pipes; a grandchild holding them open is cut off


def outcome(
    identity: GpuIdentity, result: ProbeResult, reason: str, clock: Callable[[], float], **kw: Any
) -> ProbeOutcome:
    """A probe result of one GPU, stamped now; anything but ok is logged at debug level with its reason."""
    if result != "ok":
        log.debug("probe on GPU %d: %s (%s)", identity.index, result, reason)
    return ProbeOutcome(identity.uuid, identity.index, result, reason, timestamp=clock(), **kw)


class Conclusions:
    """Turns each ended child into its outcome; owns the baselines file and what is said about results."""

    def __init__(
        self,
        baselines: Baselines,
        book: ProbeBook,
        *,
        clock: Callable[[], float],
        stopping: threading.Event,
        memory_limit_bytes: int,
    ) -> None:
        self.baselines = baselines
        self._book = book
        self._clock = clock
        self._stopping = stopping
        self._memory_limit_bytes = memory_limit_bytes
        self._fallbacks = Latch(log)  # by fallback: an engine fallback is logged once, then only noted per result
        self._speed = SpeedLog()  # a slow GPU warned once, until it recovers

    def conclude(self, settings: ProbeSection, child: _Child, sample: GpuSample, mode: Mode) -> ProbeOutcome:
        """The outcome of one ended child; `sample` is its GPU's sample from before the round."""
        with contextlib.suppress(OSError):
            if child.proc.stdin is not None:
                child.proc.stdin.close()
        identity = child.identity
        if child.memory_exceeded:
            used, limit = child.memory_exceeded / 2**20, self._memory_limit_bytes / 2**20
            why = f"used {used:.0f} MiB of host memory, over the {limit:.0f} MiB limit; killed"
            log.warning("probe on GPU %d failed: %s", identity.index, why)
            return self._outcome(identity, "failed", why)
        if child.timed_out:
            killed = "could not be killed (stuck in the driver?)" if child.unkillable else "killed"
            return self._outcome(identity, "timeout", f"no result within {settings.timeout_seconds:g} s; {killed}")
        for reader in child.readers:
            reader.join(timeout=READER_JOIN_SECONDS)
        wall = (child.ended or time.monotonic()) - (child.deadline - settings.timeout_seconds)
        stderr = b"".join(child.stderr).decode(errors="replace").strip()
        if self._stopping.is_set():
            return self._outcome(identity, "failed", "the agent stopped while the probe ran")
        doc = _last_json(b"".join(child.stdout))
        code = child.proc.returncode
        if code == WORKER_NO_ENGINE and doc is not None and doc.get("error") == "no_engine":  # the worker's own answer
            return self._outcome(identity, "skipped_unsupported", str((doc or {}).get("message", "no probe engine")))
        if code != 0 or doc is None or not doc.get("ok"):
            why = _failure(code, doc, stderr)
            log.warning("probe on GPU %d failed: %s", identity.index, why)
            return self._outcome(identity, "failed", why)
        try:
            measured = WorkerResult.from_json(doc)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("probe on GPU %d returned a malformed result: %s", identity.index, exc)
            return self._outcome(identity, "failed", f"malformed worker result: {exc}")
        check = measured.compute_check
        if check is not None and check.wrong:  # wrong whoever else ran meanwhile: a compute error, never "slow"
            why = check.describe()
            log.error(
                "probe on GPU %d (%s) computed a %s: drain the GPU and reset it (%s)",
                identity.index,
                identity.uuid,
                why,
                runbook_reference("GpuComputeErrors"),
            )
            return self._outcome(identity, "compute_error", why, measured=measured, wall_seconds=wall)
        if child.foreign_pids:
            pids = ", ".join(str(p) for p in sorted(child.foreign_pids))
            return self._outcome(identity, "skipped_busy", f"result discarded: process {pids} appeared meanwhile")
        return self._measured(child, sample, mode, measured, doc, wall)

    def _measured(
        self,
        child: _Child,
        sample: GpuSample,
        mode: Mode,
        measured: WorkerResult,
        doc: dict[str, object],
        wall: float,
    ) -> ProbeOutcome:
        """An ok result: let it count toward the baseline as `mode` says, and compare it with the baseline."""
        identity = child.identity
        key = BaselineKey(
            dtype=measured.dtype,
            shape=measured.shape,
            engine=measured.engine,
            engine_version=measured.engine_version,
            blas_version=measured.blas_version,
            driver_version=identity.driver_version,
            power_limit_watts=sample.power_limit_watts.get("enforced"),
        )
        steady = measured.power_capped is not False and not child.explicit_busy
        uncapped = measured.power_capped is False and not child.explicit_busy  # never reached the power limit
        baseline, note = self.baselines.observe(
            identity.uuid,
            key,
            measured.flops_median,
            steady=steady,
            mode=mode,
            timestamp=self._clock(),
            uncapped=uncapped,
        )
        same = baseline is not None and baseline.key in (key, dataclasses.replace(key, uncapped=True))
        flops = baseline.flops if baseline is not None and same else None
        self._book.set_baseline(identity.uuid, key.dtype, flops, _previous(baseline) if same else None)
        if note:
            log.info("probe on GPU %d: %s", identity.index, note)
        if flops and not child.explicit_busy:
            self._speed.judge(identity.index, identity.uuid, measured.flops_median / flops)
        passed_over = doc.get("engines_passed_over")
        fallback = "; ".join(str(p) for p in passed_over) if isinstance(passed_over, list) else ""
        if fallback:
            note = f"ran on {measured.engine}, passed over {fallback}" + (f"; {note}" if note else "")
            self._fallbacks.fail(
                "probe on GPU %d ran on %s, passed over %s", identity.index, measured.engine, fallback, key=fallback
            )
        if child.explicit_busy:
            note = "the GPU was busy: not comparable with its baseline" + (f"; {note}" if note else "")
        return self._outcome(
            identity,
            "ok",
            note,
            measured=measured,
            telemetry=_telemetry(list(child.seen.values())),
            wall_seconds=wall,
            baseline_flops=flops,
            baseline_note=note,
        )

    def _outcome(self, identity: GpuIdentity, result: ProbeResult, reason: str = "", **kw: Any) -> ProbeOutcome:
        return outcome(identity, result, reason, self._clock, **kw)
