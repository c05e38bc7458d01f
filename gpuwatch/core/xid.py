"""The ``xid`` label: NVIDIA's XID codes as they are, anything outside their plausible range folded to ``other``.

NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors) runs from 1 to about 160 today and grows by a handful of
codes a year. Codes 1..999 keep their own series, which leaves years of room for new codes while bounding the label
at 1,000 values per GPU; a code outside it (a garbled record, a driver bug, a 5,000-digit number) is counted under
``xid="other"`` rather than dropped or allowed to grow the exposition without bound.
"""

from __future__ import annotations

XID_MIN = 1
XID_MAX = 999
OTHER_XID = -1  # the store's key for every code outside XID_MIN..XID_MAX; exported as xid="other"
_MAX_DIGITS = len(str(XID_MAX))


def fold_xid(code: int) -> int:
    """The code itself when it is in the catalogue's range, else OTHER_XID."""
    return code if XID_MIN <= code <= XID_MAX else OTHER_XID


def xid_from_digits(digits: str) -> int:
    """An XID from a string of ASCII digits of any length (never int()'s ValueError past 4,300 digits)."""
    stripped = digits.lstrip("0") or "0"
    return fold_xid(int(stripped)) if len(stripped) <= _MAX_DIGITS else OTHER_XID


def xid_label(code: int) -> str:
    """The ``xid`` label value of a store key."""
    return "other" if code == OTHER_XID else str(code)
