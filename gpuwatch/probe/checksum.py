"""Checked results (algorithm-based fault tolerance, Huang & Abraham 1984): whether a probe's C = A·B is right.

The column sums of C must equal (1ᵀA)·B. The reference is computed in float64 from the stored low-precision inputs
(exact in float64), in blocks of rows of CHUNK_BYTES (with their temporaries, a few times that in extra device
memory), in O(n²) work beside the matmul's n³. Any difference beyond rounding is a wrong result. The tolerance is
derived, never tuned (docs/probe.md, "Checked results"): per column j,

    tol_j = λ · (u_out·‖Ĉ[:,j]‖₂ + γ_acc·‖B[:,j]‖₂·‖A‖_F) + ε₆₄_j

- output rounding (round to nearest, mean-zero errors, one per element) and accumulation error (bounded per element
  by γ_acc = m·u_acc/(1 − m·u_acc) times Σ_k|a_ik·b_kj|, any summation order; u_acc doubled where the hardware
  truncates: GPU tensor cores align addends with truncation) are summed down a column as independent bounded
  mean-zero terms: Hoeffding's inequality gives λ = sqrt(2·ln(2/p)) for a false-alarm probability p per column, and
  Cauchy–Schwarz bounds Σ_i(Σ_k|a_ik·b_kj|)² by ‖B[:,j]‖₂²·‖A‖_F²;
- ε₆₄_j: the float64 reference's own rounding, bounded deterministically (negligible).

p is FALSE_ALARM_PROBABILITY shared by the n columns (a union bound): a healthy probe is called wrong at most that
often, whatever its size. A column that is not finite (NaN, ±inf) is always wrong.

Both engines (gpuwatch/probe/engines.py) call `check_columns` with their own arrays; the functions here use only
what torch tensors and CuPy arrays share (`@`, `.sum(0)`, slicing, comparisons), so the math is one piece of code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FALSE_ALARM_PROBABILITY = 1e-9  # per probe, over all its columns: once in a billion healthy probes at most
CHUNK_BYTES = 32 * 2**20  # float64 rows converted at a time (the check's extra device memory: a few times this)
U64 = 2.0**-53
# Unit roundoff of each output dtype (round to nearest): 8, 11 and 24 bits of significand.
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}
U_ACCUMULATE = 2.0**-24  # fp32 accumulation (TF32 is off)
# Round toward zero (truncation) has twice the unit roundoff of round to nearest.
TRUNCATION_FACTOR = 2.0
# Products of two bf16 (8+8 bits) or fp16 (11+11 bits) significands are exact in fp32 (24 bits); fp32 products round.
PRODUCTS_EXACT = {"bf16": True, "fp16": True, "fp32": False}


def confidence_factor(columns: int, probability: float = FALSE_ALARM_PROBABILITY) -> float:
    """λ such that one column of bounded mean-zero errors exceeds λ·(its bound's 2-norm) with probability at most
    probability/columns (Hoeffding: P(|Σ X_i| ≥ t) ≤ 2·exp(−t²/(2·Σ c_i²)) for |X_i| ≤ c_i)."""
    if not 0 < probability < 1 or columns < 1:
        raise ValueError(f"a false-alarm probability in (0, 1) and at least one column, got {probability}, {columns}")
    return math.sqrt(2.0 * math.log(2.0 * columns / probability))


def accumulation_gamma(n: int, dtype: str, truncating: bool) -> float:
    """γ_m = m·u/(1 − m·u): the relative bound of an n-term fp32 dot product in any order (Higham, "Accuracy and
    Stability of Numerical Algorithms", 2nd ed., §3.1), m = n additions and, for fp32 inputs, one more rounding of
    each product; u doubled where the hardware truncates."""
    u = U_ACCUMULATE * (TRUNCATION_FACTOR if truncating else 1.0)
    m = n if PRODUCTS_EXACT[dtype] else n + 1
    if m * u >= 1:
        raise ValueError(f"n = {n} is too large for a bound on fp32 accumulation")
    return m * u / (1.0 - m * u)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The outcome of one check: how many columns disagree beyond their tolerance, and the worst one."""

    columns: int
    bad_columns: int
    worst_column: int
    worst_difference: float  # |1ᵀĈ − (1ᵀA)·B| of the worst column (nan: not finite)
    worst_tolerance: float
    worst_excess: float  # the largest |difference| / tolerance (> 1: wrong; inf: not finite)
    false_alarm_probability: float
    corrupted: int = 0  # elements the test hook corrupted before the check (0 in production)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.bad_columns == 0

    def as_json(self) -> dict[str, Any]:
        return {
            "ran": True,
            "columns": self.columns,
            "bad_columns": self.bad_columns,
            "worst_column": self.worst_column,
            "worst_difference": _finite_or_none(self.worst_difference),
            "tolerance": self.worst_tolerance,
            "worst_excess": _finite_or_none(self.worst_excess),
            "false_alarm_probability": self.false_alarm_probability,
            "corrupted_elements": self.corrupted,
            "seconds": self.seconds,
        }


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN or infinity: null means not finite


def check_columns(
    a: Any,
    b: Any,
    c: Any,
    *,
    dtype: str,
    truncating: bool,
    to64: Callable[[Any], Any],
    probability: float = FALSE_ALARM_PROBABILITY,
) -> CheckResult:
    """Check C = A·B (n×n) column by column; `to64` converts a block of rows to float64 on the same device."""
    n = int(c.shape[0])
    rows = max(1, CHUNK_BYTES // (8 * n))
    ones_a: Any = None  # 1ᵀA
    norm_a2 = 0.0  # ‖A‖_F²
    for start in range(0, n, rows):
        block = to64(a[start : start + rows])
        part = block.sum(0)
        ones_a = part if ones_a is None else ones_a + part
        norm_a2 += float((block * block).sum())
    reference: Any = None  # (1ᵀA)·B, and ‖B[:,j]‖₂²
    norm_b2: Any = None
    for start in range(0, n, rows):
        block = to64(b[start : start + rows])
        part = ones_a[start : start + rows] @ block
        squares = (block * block).sum(0)
        reference = part if reference is None else reference + part
        norm_b2 = squares if norm_b2 is None else norm_b2 + squares
    got: Any = None  # 1ᵀĈ, and ‖Ĉ[:,j]‖₂²
    norm_c2: Any = None
    abs_c: Any = None  # Σ_i |Ĉ_ij|, for the float64 sum's own bound
    for start in range(0, n, rows):
        block = to64(c[start : start + rows])
        part, squares, absolute = block.sum(0), (block * block).sum(0), abs(block).sum(0)
        got = part if got is None else got + part
        norm_c2 = squares if norm_c2 is None else norm_c2 + squares
        abs_c = absolute if abs_c is None else abs_c + absolute
    lam = confidence_factor(n, probability)
    u_out = UNIT_ROUNDOFF[dtype]
    gamma = accumulation_gamma(n, dtype, truncating)
    norm_a = math.sqrt(norm_a2)
    # The float64 reference and sums, bounded deterministically: γ₆₄ of 2n terms (1ᵀA then ·B) of magnitude at most
    # sqrt(n)·‖A‖_F·‖B[:,j]‖₂ in all, and of n terms Σ|Ĉ_ij| for the column sum of Ĉ.
    g64 = 2 * n * U64 / (1 - 2 * n * U64)
    norm_b = norm_b2**0.5
    tolerance = lam * (u_out * norm_c2**0.5 + gamma * norm_b * norm_a) + g64 * (math.sqrt(n) * norm_a * norm_b + abs_c)
    difference = abs(got - reference)
    excess = difference / tolerance
    good = excess <= 1.0  # NaN compares false: a column that is not finite is bad
    bad_columns = n - int(good.sum())
    excess_or_inf = excess.clone() if hasattr(excess, "clone") else excess.copy()
    excess_or_inf[~(excess == excess)] = math.inf  # NaN -> inf, so the worst column is the non-finite one
    worst = int(excess_or_inf.argmax())
    return CheckResult(
        columns=n,
        bad_columns=bad_columns,
        worst_column=worst,
        worst_difference=float(difference[worst]),
        worst_tolerance=float(tolerance[worst]),
        worst_excess=float(excess_or_inf[worst]),
        false_alarm_probability=probability,
    )


# The test hook (the worker's --corrupt-elements): each corrupted element gets CORRUPT_SCALE·‖Ĉ[:,j]‖₂ added, in
# its own column, a size docs/probe.md shows the check sees (for the probe's random inputs ‖Ĉ[:,j]‖₂ ≈ n, and the
# tolerance is at most 0.73·‖Ĉ[:,j]‖₂ for every dtype up to the default n = 8192, ~2.0· at 16384).
CORRUPT_SCALE = 4.0


def corruption_targets(n: int, count: int) -> list[tuple[int, int]]:
    """(row, column) of the elements the hook corrupts: `count` distinct columns (at most n), spread over rows."""
    if count < 0:
        raise ValueError(f"cannot corrupt {count} elements: give 0 or more")
    return [((k * 7919 + n // 3) % n, (n // 2 + k) % n) for k in range(min(count, n))]
