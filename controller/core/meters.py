"""Policy → the OpenFlow meters a switch should hold, and desired against actual → the meter changes.

Pure. A traffic class with `police` gets one meter on each switch whose flows steer that class; the
flows carry it with a meter instruction (controller/core/flows.py). Meters have no cookie, so ours
are told apart by their number, as our flows are by their cookie: METER_BASE in the high 16 bits,
the class's queue id below. Meters with other numbers are never touched.

Order, in one batch ended by a barrier: new and changed meters before the flows that use them (a
flow naming a meter the switch lacks is refused), and deletions after the flows that used them
(deleting a meter deletes every flow that still names it).
"""
from __future__ import annotations

from dataclasses import dataclass

from controller.core.policy import Police, Policy, SwitchPolicy

METER_BASE = 0x5153_0000
METER_MASK = 0xFFFF_0000


def meter_id(queue: int) -> int:
    """Our meter for the class with this queue id."""
    return METER_BASE | queue


def is_ours(meter: int) -> bool:
    return meter & METER_MASK == METER_BASE


def desired_meters(policy: Policy, switch: SwitchPolicy) -> dict[int, Police]:
    """meter id → its band, for each policed class some flow of `switch` steers."""
    used = {rule.traffic_class for rule in switch.flows}
    return {meter_id(c.queue): c.police for c in policy.classes if c.police and c.name in used}


@dataclass(frozen=True)
class MeterChanges:
    add: tuple[tuple[int, Police], ...] = ()
    modify: tuple[tuple[int, Police], ...] = ()
    delete: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.add or self.modify or self.delete)

    def applied_to(self, meters: dict[int, Police | None]) -> dict[int, Police | None]:
        """What the switch holds once these changes are confirmed."""
        after = {m: band for m, band in meters.items() if m not in self.delete}
        after.update(self.add + self.modify)
        return after


def meter_changes(desired: dict[int, Police], actual: dict[int, Police | None]) -> MeterChanges:
    """`actual`: our meters on the switch, None for one whose band is not one we write."""
    return MeterChanges(add=tuple(sorted((m, b) for m, b in desired.items() if m not in actual)),
                        modify=tuple(sorted((m, b) for m, b in desired.items() if m in actual and actual[m] != b)),
                        delete=tuple(sorted(m for m in actual if m not in desired)))
