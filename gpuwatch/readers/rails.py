"""What a voltage sensor's name says: whether it is a supply rail at all, and its nominal voltage.

Shared by the hwmon and IPMI readers so a rail is judged the same way whichever source reports it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# Never supply rails: the RTC battery, CPU core and package rails (set by the CPU's VID, not the PSU), and memory
# rails. Their readings move with load and power states; alerting on them as "PSU undervoltage" would be noise.
# Word edges are spelled (?<![a-z0-9]) / (?![a-z0-9]), not \b: "_" is a word character for \b, so \bmem\b would miss
# the MEM of P1V2_MEM_ABC and \bddr the DDR of VDD_1V2_DDR (OpenBMC / Supermicro sensor names).
_EXCLUDED = re.compile(
    r"vbat|battery|(?<![a-z0-9])bat(?![a-z0-9])|cmos"
    r"|v_?core|cpu\s*core|vcpu|cpu\d*\s*v|vccin|vcc_?in(?![a-z0-9])|vccsa|vccio|vddcr|vcc_?gt"
    r"|vcc_?soc|vdd_?soc|vid(?![a-z0-9])|vccfa|vnn|vsa(?![a-z])|vccana"
    r"|dimm|vddq|vdd_?mem|vpp|(?<![a-z0-9])mem(?![a-z0-9])|memory|(?<![a-z0-9])ddr|vtt",
    re.IGNORECASE,
)
# Names that mean 3.3 V on boards and BMCs (nct6775 AVCC/3VCC/3VSB, Supermicro 3.3VCC).
_THREE_THREE = re.compile(r"(?<![\d.])(?:avcc|3vcc|3vsb|vcc3|vsb3|vcc)(?![a-z])", re.IGNORECASE)
# 12V, +12V, P12V_AUX, 5VSB, 3.3V, 3V3, 1V8 (not the 1 of "PS1 Voltage").
_VOLTS = re.compile(r"(?<![\d.])(\d{1,2})(?:v(\d{1,2})(?!\d)|(\.\d{1,2})?v(?![0-9]|olt))", re.IGNORECASE)

# Negative rails spelled out rather than with a minus sign: N12V, NEG12V, 12V_NEG, -12V MINUS, "12V Neg".
_NEGATIVE = re.compile(r"(?<![a-z])(?:neg(?:ative)?|minus|n(?=\d{1,2}v))(?![a-z])", re.IGNORECASE)


def is_supply_rail(name: str) -> bool:
    """False for Vbat, Vcore/CPU and DIMM/VDDQ rails, which never count as PSU rails."""
    return _EXCLUDED.search(name) is None


def nominal_from_name(name: str) -> float | None:
    """The nominal voltage the name states (12V, 5VSB, 3V3, 3.3VCC, AVCC …), else None."""
    if _THREE_THREE.search(name):
        return 3.3
    match = _VOLTS.search(name)
    if match is None:
        return None
    whole, fraction_v, fraction_dot = match.groups()
    volts = float(f"{whole}.{fraction_v}") if fraction_v else float(whole + (fraction_dot or ""))
    if volts == 0:  # the "0V" of GPU0VDD or PSU0VIN is a unit's number, never a rail's nominal
        return None
    # -12V, N12V, 12V_NEG: a negative rail keeps its sign (the BMC reads it as -12.05, not 12.05).
    negative = name[: match.start()].endswith("-") or _NEGATIVE.search(name) is not None
    return -volts if negative else volts


# The rails a PMBus supply's output can be, for a "vout1" that names none: ATX's 12, 5 and 3.3 V, and the 48/54 V of
# rack and GPU-baseboard distribution (OCP Open Rack, HGX baseboards).
STANDARD_RAILS = (12.0, 54.0, 48.0, 5.0, 3.3)
# How far a reading may sit from a standard rail and still be taken for it. The standard rails lie at least 20 % apart
# (3.3 × 1.2 = 3.96 < 5 × 0.8 = 4.0; 5 × 1.2 = 6 < 12 × 0.8 = 9.6; 12 × 1.2 = 14.4 < 48 × 0.8 = 38.4), so a reading
# falls in one window at most, except 48 and 54 V, which share theirs (nearest wins). 20 % is twice the widest ATX
# tolerance (10 %), so a rail sagging well past its limit still gets its nominal, while outputs that are no standard
# rail (1.8, 2.5, 7, 24 V) get none rather than a wrong one.
INFER_WINDOW = 0.20
# PMBus core labels a supply's output voltages vout1 … voutN (drivers/hwmon/pmbus/pmbus_core.c, one per page).
_PMBUS_VOUT = re.compile(r"^vout\d*$")


def nominal_from_reading(name: str, volts: float) -> float | None:
    """The nominal of a PMBus output (``vout1``) from its reading: the nearest standard rail within ±20 %, else None.

    Only PMBus output labels are judged this way; any other name that states no nominal keeps none (an AC input, a
    fan's supply, a Super-I/O pin without a mapping could sit near 12 V without being a 12 V rail)."""
    if not _PMBUS_VOUT.match(name) or not volts > 0:
        return None
    nearest = min(STANDARD_RAILS, key=lambda rail: abs(volts / rail - 1.0))
    return nearest if abs(volts / nearest - 1.0) < INFER_WINDOW else None


def tolerance_for(nominal: float) -> float:
    """How far below its nominal a rail may read and still be in regulation, as a ratio.

    ATX12V Power Supply Design Guide (2.x, §3.2.1 "DC Voltage Regulation", Table 2): ±5 % on +12 V, +5 V, +3.3 V and
    +5VSB, ±10 % on −12 V (and on the −5 V of older revisions): every negative rail gets 10 %, every positive one 5 %,
    which is also what BMC-less rails were held to before (95 % of nominal). 48 and 54 V are no ATX rails: a
    distribution bus whose supplies are set anywhere from 48 to 54 V and step down by design (an Open Rack V3 shelf
    drops its output 3 V on AC loss to hand over to its batteries); 10 % is a judgment that keeps those steps from
    paging, not a number from a standard."""
    if nominal < 0:
        return 0.10
    if nominal >= 40.0:
        return 0.10
    return 0.05


def lower_limit(nominal: float | None, declared: float | None) -> float | None:
    """The limit a rail is alerted on: what the chip, BMC or mapping declares, else nominal × (1 − tolerance), with
    the rail's sign (−12 V: −10.8); None when neither is known."""
    if declared is not None:
        return declared
    if nominal is None or nominal == 0:
        return None
    return round(nominal * (1.0 - tolerance_for(nominal)), 6)


def declared_undervoltage(nominal: float | None, lower: Sequence[float], upper: Sequence[float] = ()) -> float | None:
    """Of the thresholds a chip or BMC declares, the undervoltage one to alert on, or None.

    ``lower`` are its lower thresholds, warning first (hwmon min, lcrit; IPMI lnc, lcr, lnr), ``upper`` its upper
    ones. A positive rail sags toward 0, through its lower thresholds: the one nearest the nominal (the warning one)
    is taken, and only between 0 and the nominal (a limit of 0 or above the nominal is no limit: unset Super-I/O and
    BMC defaults). A negative rail sags toward 0 too, through the thresholds *above* it: a BMC's lower critical of
    −13.2 V on −12 V is the over-voltage side and is not taken; what lies between the nominal and 0 is, nearest the
    nominal first. With no nominal, a positive lower threshold is taken, warning first."""
    if nominal is not None and nominal < 0:
        below_zero = [t for t in (*lower, *upper) if nominal < t < 0]
        return min(below_zero) if below_zero else None
    if nominal is not None:
        under = [t for t in lower if 0 < t < nominal]
        return max(under) if under else None
    return next((t for t in lower if t > 0), None)
