"""What netem takes (pure): a delay with its unit."""
from __future__ import annotations

import re

DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")     # e.g. 5ms, 500us, 0.1s
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def delay_seconds(delay: str | None) -> float:
    """'150ms' → 0.15 (None: no added delay)."""
    if delay is None:
        return 0.0
    found = DELAY.match(delay)
    if not found:
        raise ValueError(f"{delay!r} is not a delay such as 150ms")
    number, unit = found.groups()
    return float(number) * _UNIT[unit]
