"""Fault injection for tests: lost GPUs, failing or hanging library calls, a missing library, extra events.

Vendor-neutral: rules match the simulated library's function names (fnmatch patterns such as ``"nvmlDevice*"``)
and carry the vendor's own integer error code, which the simulated library turns into its exception. Everything
is driven from the test thread while the agent's threads call in, so every method is thread-safe.

    node.faults.fail("nvmlDeviceGetPowerUsage", NVML_ERROR_NOT_SUPPORTED)        # always NotSupported
    node.faults.fail("nvmlDevice*", NVML_ERROR_UNKNOWN, rate=0.1)                 # 10 % of calls, seeded
    node.faults.fail("nvmlDeviceGetFieldValues", NVML_ERROR_TIMEOUT, gpu=2, times=1)
    node.faults.hang("nvmlDeviceGetTemperature", gpu=2)   # blocks until node.faults.release()
    node.faults.hang("*", seconds=5.0)                     # every call takes 5 s (release() cuts it short)
    node.faults.hang("nvmlDeviceGetTemperature", gpu=2, after=5.0)  # from 5 s into the node's life
    node.faults.lose_gpu(3); node.faults.restore_gpu(3)  # falls off the bus; the driver reload brings it back
    node.faults.set_library_missing(True)                 # init fails as if the driver were not installed
    node.faults.emit_xid(2, 79)                           # an XID event now

NVIDIA-shaped answers beyond failing calls (the simulated libnvidia-ml consults them):

    node.faults.field(NVML_FI_DEV_MEMORY_TEMP, timestamp=0)               # "success" without data
    node.faults.field(NVML_FI_DEV_PERF_POLICY_THERMAL, code=NVML_ERROR_NOT_SUPPORTED)  # per-field nvmlReturn
    node.faults.field(269, value=2_000_000_000, value_type=NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, gpu=0)
    node.faults.set_nvlink_errors(0, 1, NVML_NVLINK_ERROR_DL_CRC_FLIT, 12)  # what a link's error counter reads
    node.faults.hold_clock_event_reasons(0, nvmlClocksThrottleReasonBoardLimit)  # a reason bit held active
"""

from __future__ import annotations

import fnmatch
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class FailRule:
    """Calls matching `function` (and `gpu`, when set) fail with `code`, at `rate`, at most `times` times."""

    function: str
    code: int
    gpu: int | None = None
    rate: float = 1.0
    times: int | None = None  # None = for ever; counts down and the rule disappears at 0


@dataclass(slots=True)
class FieldRule:
    """How nvmlDeviceGetFieldValues answers `field_id` (the driver's own numbering, as the caller asks for it), on
    `gpu` when set. `code` is a per-field nvmlReturn (the call itself succeeds); otherwise the field answers
    success, with `value` of `value_type` (the nvmlValueType_t), stamped `timestamp` (µs; 0 = not filled, the
    H100 quirk). Each part left None keeps the driver's own answer; a timestamp left None is the time of the read
    where a value is given."""

    field_id: int
    gpu: int | None = None
    code: int | None = None
    value: float | None = None
    value_type: int | None = None
    timestamp: int | None = None


@dataclass(slots=True)
class HangRule:
    """Calls matching block until released, or for `seconds` when set (then they go on normally)."""

    function: str
    gpu: int | None = None
    seconds: float | None = None
    after: float | None = None  # node seconds from which the rule holds (None: at once)
    released: threading.Event = field(default_factory=threading.Event)


class FaultInjector:
    """The test's handle on what goes wrong; the simulated libraries consult it on every call."""

    def __init__(
        self,
        seed: int,
        gpu_count: int,
        on_change: Callable[[], None],
        emit: Callable[[int, str, int | None], None],
        elapsed: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._lock = threading.Lock()
        self._elapsed = elapsed  # the node's seconds since start: when timed hang rules begin
        self._rng = random.Random(seed ^ 0x5EED_FA17)
        self._gpu_count = gpu_count
        self._on_change = on_change
        self._emit = emit
        self._fail_rules: list[FailRule] = []
        self._hang_rules: list[HangRule] = []
        self._blocked = 0
        self._blocked_changed = threading.Condition(self._lock)
        self._lost: dict[int, bool] = {}
        self._library_missing: bool | None = None  # None: as the scenario says
        self._nvlink_down: set[tuple[int, int]] = set()
        self._fabric_degraded: dict[int, bool] = {}  # gpu -> its fabric's bandwidth degraded (None: the scenario's)
        self.fabric_manager_running = True  # nv-fabricmanager, on a node with NVSwitches
        self.storage_carrier_losses = 0  # times the RoCE storage NIC's interface lost its carrier (and got it back)
        self._nvlink_errors: dict[tuple[int, int, int], int | None] = {}  # (gpu, link, counter) -> count
        self._sram_threshold_exceeded: set[int] = set()  # GPUs whose SRAM ECC errors passed the driver's threshold
        self._field_rules: list[FieldRule] = []
        self._held_reasons: dict[int, int] = {}  # gpu -> clock event reason bits held active

    # --- GPUs falling off the bus -------------------------------------------------------------------------
    def lose_gpu(self, index: int) -> None:
        """The GPU stops answering (every call on it raises the vendor's "GPU is lost"); it stays on the bus."""
        self._check_gpu(index)
        with self._lock:
            self._lost[index] = True
        self._on_change()

    def restore_gpu(self, index: int) -> None:
        """A driver reload: the GPU answers again, overriding the scenario's own loss too."""
        self._check_gpu(index)
        with self._lock:
            self._lost[index] = False
        self._on_change()

    def lost_override(self, index: int) -> bool | None:
        """True/False when a test decided, None to let the scenario decide."""
        with self._lock:
            return self._lost.get(index)

    # --- the library itself -----------------------------------------------------------------------------------
    @property
    def library_missing(self) -> bool | None:
        """True/False when a test decided, None to let the scenario decide (backend_down: missing)."""
        with self._lock:
            return self._library_missing

    def set_library_missing(self, missing: bool = True) -> None:
        """Init fails as if the shared library were not installed (NVML: LibraryNotFound); False installs it,
        in backend_down too (a driver installed while the agent runs)."""
        with self._lock:
            self._library_missing = missing
        self._on_change()

    # --- failing calls ----------------------------------------------------------------------------------------
    def fail(
        self,
        function: str = "*",
        code: int = 999,
        *,
        gpu: int | None = None,
        rate: float = 1.0,
        times: int | None = None,
    ) -> FailRule:
        """Make matching calls raise the library's error for `code`; returns the rule (for remove())."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be within 0..1, not {rate}")
        if gpu is not None:
            self._check_gpu(gpu)
        rule = FailRule(function=function, code=code, gpu=gpu, rate=rate, times=times)
        with self._lock:
            self._fail_rules.append(rule)
        return rule

    def remove(self, rule: FailRule | HangRule | FieldRule) -> None:
        """Withdraw one rule (a hang rule also releases the calls it holds)."""
        with self._lock:
            if isinstance(rule, FailRule):
                self._fail_rules = [r for r in self._fail_rules if r is not rule]
            elif isinstance(rule, FieldRule):
                self._field_rules = [r for r in self._field_rules if r is not rule]
            else:
                self._hang_rules = [r for r in self._hang_rules if r is not rule]
        if isinstance(rule, HangRule):
            rule.released.set()

    def clear_failures(self) -> None:
        with self._lock:
            self._fail_rules.clear()

    # --- hanging calls ----------------------------------------------------------------------------------------
    def hang(
        self, function: str = "*", *, gpu: int | None = None, seconds: float | None = None, after: float | None = None
    ) -> HangRule:
        """Make matching calls block (as a GPU falling off the bus can hang the driver) until release(); from
        `after` node seconds on, when given (a scenario's hang that starts once the agent is up)."""
        if gpu is not None:
            self._check_gpu(gpu)
        rule = HangRule(function=function, gpu=gpu, seconds=seconds, after=after)
        with self._lock:
            self._hang_rules.append(rule)
        return rule

    def release(self) -> None:
        """Let every hung call go on, and hang no more calls."""
        with self._lock:
            rules, self._hang_rules = self._hang_rules, []
        for rule in rules:
            rule.released.set()

    def blocked_calls(self) -> int:
        """How many calls are blocked in a hang right now."""
        with self._lock:
            return self._blocked

    def wait_until_blocked(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Wait (real time) until at least `count` calls are blocked; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._blocked_changed:
            while self._blocked < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._blocked_changed.wait(left)
            return True

    # --- links and events ----------------------------------------------------------------------------------
    def set_nvlink_up(self, index: int, link: int, up: bool) -> None:
        """Take one NVLink of a GPU down (or back up); only meaningful on a node built with nvlink=True."""
        self._check_gpu(index)
        with self._lock:
            if up:
                self._nvlink_down.discard((index, link))
            else:
                self._nvlink_down.add((index, link))
        self._on_change()

    def nvlink_down(self, index: int, link: int) -> bool:
        with self._lock:
            return (index, link) in self._nvlink_down

    def set_fabric_degraded(self, index: int, degraded: bool) -> None:
        """The GPU's NVLink fabric reports degraded bandwidth (health mask) and limited capacity (summary), or
        stops doing so; only meaningful on a node with an NVSwitch fabric (nvlink=True)."""
        self._check_gpu(index)
        with self._lock:
            self._fabric_degraded[index] = degraded
        self._on_change()

    def stop_fabric_manager(self, stopped: bool = True) -> None:
        """nv-fabricmanager exits (or starts again): the GPUs stay readable, CUDA on them fails."""
        with self._lock:
            self.fabric_manager_running = not stopped
        self._on_change()

    def lose_storage_carrier(self, times: int = 1) -> None:
        """The RoCE storage NIC's interface loses its carrier and gets it back, `times` times (a flapping cable)."""
        with self._lock:
            self.storage_carrier_losses += times
        self._on_change()

    def fabric_degraded_override(self, index: int) -> bool | None:
        """True/False when a test decided, None to let the scenario decide."""
        with self._lock:
            return self._fabric_degraded.get(index)

    def set_nvlink_errors(self, index: int, link: int, counter: int, count: int | None) -> None:
        """What one error counter of one NVLink reads (`counter`: an nvmlNvLinkErrorCounter_t such as
        NVML_NVLINK_ERROR_DL_CRC_FLIT); None makes that counter answer NotSupported, as a counter the link does
        not keep does. Only meaningful on a node built with nvlink=True (other links' counters read 0)."""
        self._check_gpu(index)
        with self._lock:
            self._nvlink_errors[(index, link, counter)] = count
        self._on_change()

    def exceed_sram_ecc_threshold(self, index: int, exceeded: bool = True) -> None:
        """The GPU's SRAM ECC errors passed the driver's threshold (nvmlEccSramErrorStatus_v1_t.bThresholdExceeded),
        as nvidia-smi -q's "SRAM Threshold Exceeded: Yes"."""
        self._check_gpu(index)
        with self._lock:
            (self._sram_threshold_exceeded.add if exceeded else self._sram_threshold_exceeded.discard)(index)
        self._on_change()

    def sram_ecc_threshold_exceeded(self, index: int) -> bool:
        with self._lock:
            return index in self._sram_threshold_exceeded

    def nvlink_errors(self, index: int, link: int, counter: int) -> int | None:
        """The counter's value (0 unless set), None for NotSupported."""
        with self._lock:
            return self._nvlink_errors.get((index, link, counter), 0)

    def hold_clock_event_reasons(self, index: int, mask: int) -> None:
        """Hold these clock event reason bits active on a GPU on top of what the scenario causes (0 lets go), e.g.
        nvmlClocksThrottleReasonBoardLimit on a board whose driver reports the newer bits."""
        self._check_gpu(index)
        with self._lock:
            self._held_reasons[index] = mask
        self._on_change()

    def held_clock_event_reasons(self, index: int) -> int:
        with self._lock:
            return self._held_reasons.get(index, 0)

    # --- field values -------------------------------------------------------------------------------------------
    def field(
        self,
        field_id: int,
        *,
        code: int | None = None,
        value: float | None = None,
        value_type: int | None = None,
        timestamp: int | None = None,
        gpu: int | None = None,
    ) -> FieldRule:
        """Make nvmlDeviceGetFieldValues answer `field_id` so (see FieldRule); the newest rule for a field wins.
        Returns the rule (for remove())."""
        if gpu is not None:
            self._check_gpu(gpu)
        rule = FieldRule(field_id, gpu, code, value, value_type, timestamp)
        with self._lock:
            self._field_rules.append(rule)
        return rule

    def field_rule(self, field_id: int, gpu: int) -> FieldRule | None:
        """The rule for this field of this GPU, None to answer as the driver would."""
        with self._lock:
            return next(
                (r for r in reversed(self._field_rules) if r.field_id == field_id and r.gpu in (None, gpu)), None
            )

    def emit_xid(self, index: int, xid: int) -> None:
        """An XID error on that GPU now (delivered to event sets registered for XID events)."""
        self._check_gpu(index)
        self._emit(index, "xid", xid)

    def emit_reset(self, index: int) -> None:
        """An AMD-style GPU reset event on that GPU now."""
        self._check_gpu(index)
        self._emit(index, "reset", None)

    def clear(self) -> None:
        """Back to the scenario's own behaviour: no rules, hung calls released, library and GPUs as planned."""
        with self._lock:
            self._fail_rules.clear()
            self._lost.clear()
            self._library_missing = None
            self._nvlink_down.clear()
            self._fabric_degraded.clear()
            self.fabric_manager_running = True
            self.storage_carrier_losses = 0
            self._nvlink_errors.clear()
            self._field_rules.clear()
            self._held_reasons.clear()
        self.release()
        self._on_change()

    # --- what the simulated libraries call ---------------------------------------------------------------
    def before_call(self, names: Sequence[str], gpu: int | None) -> int | None:
        """Apply hang rules (blocking, outside every lock), then return an error code to fail with, or None.

        `names` are the names this call answers to (the public function and the symbol it uses), `gpu` the
        index of the GPU it is about, or None for library-wide calls.
        """
        while True:
            with self._lock:
                hang = next(
                    (
                        r
                        for r in self._hang_rules
                        if _matches(r.function, r.gpu, names, gpu) and (r.after is None or self._elapsed() >= r.after)
                    ),
                    None,
                )
                if hang is None:
                    break
                self._blocked += 1
                self._blocked_changed.notify_all()
            try:
                hang.released.wait(hang.seconds)
            finally:
                with self._lock:
                    self._blocked -= 1
                    self._blocked_changed.notify_all()
            if hang.seconds is not None:
                break
        with self._lock:
            for rule in self._fail_rules:
                if not _matches(rule.function, rule.gpu, names, gpu):
                    continue
                if rule.rate < 1.0 and self._rng.random() >= rule.rate:
                    continue
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times <= 0:
                        self._fail_rules = [r for r in self._fail_rules if r is not rule]
                return rule.code
        return None

    def _check_gpu(self, index: int) -> None:
        if not 0 <= index < self._gpu_count:
            raise IndexError(f"no GPU {index} on this node ({self._gpu_count} GPUs)")


def _matches(pattern: str, rule_gpu: int | None, names: Sequence[str], gpu: int | None) -> bool:
    if rule_gpu is not None and rule_gpu != gpu:
        return False
    return any(fnmatch.fnmatchcase(name, pattern) for name in names)
