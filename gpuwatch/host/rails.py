"""What a voltage sensor's name says: whether it is a supply rail at all, and its nominal voltage.

Shared by the hwmon and IPMI readers so a rail is judged the same way whichever source reports it.
"""

from __future__ import annotations

import re

# Never supply rails: the RTC battery, CPU core and package rails (set by the CPU's VID, not the PSU), and memory
# rails. Their readings move with load and power states; alerting on them as "PSU undervoltage" would be noise.
_EXCLUDED = re.compile(
    r"vbat|battery|\bbat\b|cmos"
    r"|v_?core|cpu\s*core|vcpu|cpu\d*\s*v|vccin|vcc_?in\b|vccsa|vccio|vddcr|vcc_?gt|vcc_?soc|vdd_?soc|vid\b"
    r"|dimm|vddq|vdd_?mem|vpp|\bmem\b|memory|\bddr|vtt",
    re.IGNORECASE,
)
# Names that mean 3.3 V on boards and BMCs (nct6775 AVCC/3VCC/3VSB, Supermicro 3.3VCC).
_THREE_THREE = re.compile(r"(?<![\d.])(?:avcc|3vcc|3vsb|vcc3|vsb3|vcc)(?![a-z])", re.IGNORECASE)
# 12V, +12V, P12V_AUX, 5VSB, 3.3V, 3V3, 1V8 (not the 1 of "PS1 Voltage").
_VOLTS = re.compile(r"(?<![\d.])(\d{1,2})(?:v(\d{1,2})(?!\d)|(\.\d{1,2})?v(?![0-9]|olt))", re.IGNORECASE)


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
    if fraction_v:
        return float(f"{whole}.{fraction_v}")
    return float(whole + (fraction_dot or ""))
