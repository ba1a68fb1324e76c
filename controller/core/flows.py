"""Policy → the OpenFlow 1.3 flow entries a switch should hold.

Pure: the adapter turns each FlowEntry into an OFPFlowMod. Steering a traffic
class into its queue takes `set_queue` on the kernel datapath; the userspace
datapath ignores it (all packets leave through one AF_PACKET socket), so there
the flow also marks the packet's DSCP and a tc filter on the port maps the mark
to the HTB class (see controller/adapters/tc.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.core.meters import counting_meter_id, meter_id
from controller.core.policy import Policy, SwitchPolicy

# The high bits mark this controller's flows so it replaces exactly its own; the low bits
# number the policy's rule, so flow statistics map back to a rule (and its class) directly.
# CLASSIFIED marks the rules of a traffic class: their statistics (the class rates) are asked
# for on every poll, without the rest of the table.
COOKIE = 0x5153_0000_0000_0000
COOKIE_MASK = 0xFFFF_0000_0000_0000
CLASSIFIED = 0x0000_0001_0000_0000
RULE_MASK = 0x0000_0000_FFFF_FFFF


def rule_cookie(index: int, classified: bool = False) -> int:
    return COOKIE | (CLASSIFIED if classified else 0) | (index + 1)


def rule_index(cookie: int) -> int | None:
    """The policy rule behind one of our cookies (None for another's)."""
    return (cookie & RULE_MASK) - 1 if cookie & COOKIE_MASK == COOKIE else None


@dataclass(frozen=True)
class FlowEntry:
    priority: int
    match: tuple[tuple[str, Any], ...]
    # ("meter", id) | ("set_field", name, value) | ("set_queue", id) | ("output", port); a meter comes first,
    # as the switch reports its instruction
    actions: tuple[tuple[Any, ...], ...]
    cookie: int


def desired_flows(policy: Policy, switch: SwitchPolicy, reserving: frozenset[int], mark_dscp: bool,
                  counted: frozenset[int] = frozenset()) -> tuple[FlowEntry, ...]:
    """Flows for `switch` while the ports in `reserving` have their class queues in force. A policed
    class's flows pass its meter whatever the port's queues; the rules in `counted` their counting meter."""
    entries = []
    for index, rule in enumerate(switch.flows):
        steer: tuple[tuple[Any, ...], ...] = ()
        if rule.traffic_class is not None:
            cls = policy.traffic_class(rule.traffic_class)
            if cls.police:
                steer = (("meter", meter_id(cls.queue)),)
            elif index in counted:
                steer = (("meter", counting_meter_id(index)),)
            if rule.outputs[0] in reserving:
                steer += ((("set_field", "ip_dscp", cls.dscp),) if mark_dscp else ()) + (("set_queue", cls.queue),)
        entries.append(FlowEntry(rule.priority, rule.match,
                                 steer + tuple(("output", port) for port in rule.outputs),
                                 rule_cookie(index, rule.traffic_class is not None)))
    return tuple(entries)
