"""What netem takes (pure): a delay with its unit, as the controller reads it (controller/core/policy.py)."""
from __future__ import annotations

from controller.core.policy import DELAY as DELAY  # re-exported: the launcher's checks use the same grammar
from controller.core.policy import delay_us


def delay_seconds(delay: str | None) -> float:
    """'150ms' → 0.15 (None: no added delay)."""
    return 0.0 if delay is None else delay_us(delay, "delay") / 1e6
