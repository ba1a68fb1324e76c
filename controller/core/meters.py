"""Policy → the OpenFlow meters a switch should hold, and desired against actual → the meter changes.

Pure. A traffic class with `police` gets one meter on each switch whose flows steer that class; the
flows carry it with a meter instruction (controller/core/flows.py). A classified flow to an `auto`
port whose class is not policed passes a counting meter of its own, whose band never drops
(COUNTING_BAND): OVS reads a meter's counters from the datapath when asked, where a flow's come from
its revalidators up to half a second late, so a flood's class shows in the next poll
(docs/datapath.md). Meters have no cookie, so ours are told apart by their number, as our flows are
by their cookie: METER_BASE in the high 16 bits, the class's queue id below for a policing meter,
COUNTING and the flow rule's number for a counting one. Meters with other numbers are never touched.

Order, in one batch ended by a barrier: new and changed meters before the flows that use them (a
flow naming a meter the switch lacks is refused), and deletions after the flows that used them
(deleting a meter deletes every flow that still names it).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller.core.policy import Police, Policy, SwitchPolicy

METER_BASE = 0x5153_0000
METER_MASK = 0xFFFF_0000
COUNTING = 0x8000                           # a counting meter's number: METER_BASE | COUNTING | rule + 1
COUNTING_BAND = Police(100_000_000, 100_000_000)   # 100 Gbit/s, a 1 s burst: never reached by our ports


def meter_id(queue: int) -> int:
    """Our policing meter for the class with this queue id."""
    return METER_BASE | queue


def counting_meter_id(rule: int) -> int:
    """Our counting meter for the switch's flow rule with this index."""
    return METER_BASE | COUNTING | (rule + 1)


def counted_rule(meter: int) -> int | None:
    """The flow rule a counting meter counts, or None for another meter."""
    return (meter & 0x7FFF) - 1 if is_ours(meter) and meter & COUNTING else None


def is_ours(meter: int) -> bool:
    return meter & METER_MASK == METER_BASE


def desired_meters(policy: Policy, switch: SwitchPolicy, counting: bool = False) -> dict[int, Police]:
    """meter id → its band: for each policed class some flow of `switch` steers, and, when `counting`,
    for each flow rule counted (counted_rules)."""
    used = {rule.traffic_class for rule in switch.flows}
    meters = {meter_id(c.queue): c.police for c in policy.classes if c.police and c.name in used}
    if counting:
        meters |= {counting_meter_id(index): COUNTING_BAND for index in counted_rules(policy, switch)}
    return meters


def counted_rules(policy: Policy, switch: SwitchPolicy) -> set[int]:
    """The flow rules that pass a counting meter: classified, to an `auto` port, of a class without police
    (a policed class's meter counts it already)."""
    auto = {p.port_no for p in switch.ports if p.queues == "auto"}
    policed = {c.name for c in policy.classes if c.police}
    return {index for index, rule in enumerate(switch.flows)
            if rule.traffic_class and rule.outputs[0] in auto and rule.traffic_class not in policed}


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


def meter_changes(desired: Mapping[int, Police], actual: dict[int, Police | None]) -> MeterChanges:
    """`actual`: our meters on the switch, None for one whose band is not one we write."""
    return MeterChanges(add=tuple(sorted((m, b) for m, b in desired.items() if m not in actual)),
                        modify=tuple(sorted((m, b) for m, b in desired.items() if m in actual and actual[m] != b)),
                        delete=tuple(sorted(m for m in actual if m not in desired)))
