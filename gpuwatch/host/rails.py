"""What a voltage sensor's name says: whether it is a supply rail at all, and its nominal voltage.

Shared by the hwmon and IPMI readers so a rail is judged the same way whichever source reports it.
"""

from __future__ import annotations

import re

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
    # -12V, N12V, 12V_NEG: a negative rail keeps its sign (the BMC reads it as -12.05, not 12.05).
    negative = name[: match.start()].endswith("-") or _NEGATIVE.search(name) is not None
    return -volts if negative else volts
