"""Each GPU's NVLink (AMD: XGMI) links summed per GPU, and the links that misbehaved since the agent started.

An HGX H100 node has 8 × 18 links; their per-link series (state, four error counters, two byte counters) were 1,008
of a healthy node's series, almost all constant (issue #34). So the exposition serves, per GPU: the links up, the
links it has, errors by type and bytes by direction summed over its links; and a link's own series only for a link
that misbehaved — down while the GPU expects it up, or an error counter grown since the agent started — from that
poll until the agent restarts (or for every link when `[nvml] nvlink_per_link` / `[amdsmi] xgmi_per_link` asks).

The links a GPU has: nvml.h's nvmlDeviceGetNvLinkState answers for a link that exists (NVML_ERROR_INVALID_ARGUMENT
for a link index the device does not have, NVML_ERROR_NOT_SUPPORTED on a GPU without NVLink): the NVML backend asks
each of NVML_NVLINK_MAX_LINKS once at open and keeps those that answered (`GpuSample.nvlink_expected`). Where the
backend does not say (AMD), the links that ever answered since the agent started.

A sum is of each link's last reading: a link whose counters one poll could not read keeps its last value in the sum.
A sum that fell for a failed read would be a counter reset to rate() and increase(), which would count the whole
sum again as new errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwatch.core.model import GpuSample

# The error types whose growth makes a link misbehave: those GpuNvlinkErrors reads. Blackwell's `symbol` (before FEC)
# and `effective` (after FEC) counts grow on healthy links too, a little, which FEC is there to absorb.
FLAGGING_TYPES = frozenset({"replay", "recovery", "recovery_failed", "crc"})


@dataclass(frozen=True, slots=True)
class NvlinkTotals:
    """What one GPU's links add up to after a poll; never changed after (store snapshots share it)."""

    up: int  # links up now
    expected: int  # links the GPU has
    errors_total: dict[str, int] = field(default_factory=dict)  # type -> summed over the links
    bytes_total: dict[str, float] = field(default_factory=dict)  # rx | tx -> summed over the links
    misbehaved: frozenset[str] = frozenset()  # links that misbehaved since the agent started


class LinkWatch:
    """One GPU's links across polls: their last readings, their first error counts, which misbehaved."""

    def __init__(self) -> None:
        self._errors: dict[tuple[str, str], int] = {}  # (link, type) -> last count read
        self._first_errors: dict[tuple[str, str], int] = {}  # (link, type) -> the lowest count read: growth is above
        self._bytes: dict[tuple[str, str], float] = {}  # (link, direction) -> last total read
        self._answered: set[str] = set()  # links whose state was ever read
        self._seen_up: set[str] = set()
        self._misbehaved: set[str] = set()

    def update(self, sample: GpuSample) -> NvlinkTotals | None:
        """The GPU's totals after this poll; None for a GPU without links."""
        self._answered.update(sample.nvlink_up)
        self._seen_up.update(link for link, up in sample.nvlink_up.items() if up)
        self._errors.update(sample.nvlink_errors_total)
        self._bytes.update(sample.nvlink_bytes_total)
        expected = sample.nvlink_expected if sample.nvlink_expected is not None else len(self._answered)
        if not expected and not self._errors and not self._bytes:
            return None
        any_up = any(sample.nvlink_up.values())
        for link, up in sample.nvlink_up.items():
            # Down where it was up, or where its siblings are up: a link that exists and dropped. A GPU none of whose
            # links ever came up (a PCIe card without its bridge) has nothing misbehaving, only nothing wired.
            if not up and (link in self._seen_up or any_up):
                self._misbehaved.add(link)
        for key, count in sample.nvlink_errors_total.items():
            first = self._first_errors.setdefault(key, count)
            if count < first:  # the counters were reset (a driver reload, nvidia-smi nvlink -e): growth from here
                self._first_errors[key] = count
            elif count > first and key[1] in FLAGGING_TYPES:
                self._misbehaved.add(key[0])
        errors: dict[str, int] = {}
        for (_link, kind), count in self._errors.items():
            errors[kind] = errors.get(kind, 0) + count
        sent: dict[str, float] = {}
        for (_link, direction), total in self._bytes.items():
            sent[direction] = sent.get(direction, 0.0) + total
        return NvlinkTotals(
            up=sum(1 for up in sample.nvlink_up.values() if up),
            expected=expected,
            errors_total=errors,
            bytes_total=sent,
            misbehaved=frozenset(self._misbehaved),
        )
