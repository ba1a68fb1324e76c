"""Policy → the OpenFlow 1.3 flow entries a switch should hold.

Pure: the adapter turns each FlowEntry into an OFPFlowMod. Steering a traffic
class into its queue takes `set_queue` on the kernel datapath; the userspace
datapath ignores it (all packets leave through one AF_PACKET socket), so there
the flow also marks the packet's DSCP and a tc filter on the port maps the mark
to the HTB class (see controller/adapters/tc.py).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from controller.core.meters import counting_meter_id, meter_id
from controller.core.policy import Policy, SwitchPolicy

# The high bits mark this controller's flows so it replaces exactly its own; the low bits
# number the policy's rule, so flow statistics map back to a rule (and its class) directly.
# CLASSIFIED marks the rules of a traffic class (and routes whose rates adaptive paths need): their
# statistics (the class rates) are asked for on every poll, without the rest of the table.
COOKIE = 0x5153_0000_0000_0000
COOKIE_MASK = 0xFFFF_0000_0000_0000
CLASSIFIED = 0x0000_0001_0000_0000
RULE_MASK = 0x0000_0000_FFFF_FFFF
KEYED = 0x8000_0000        # the low bits are a hash of the rule's table, priority and match, not its position


def rule_cookies(switch: SwitchPolicy) -> tuple[int, ...]:
    """Each rule's cookie: its position in the switch's list, or, for a switch the controller builds itself
    (keyed), a hash of its table, priority and match, so that a rule keeps its cookie (and the switch its
    counters) whatever rules come and go beside it. Two keys of one hash take the next free value."""
    cookies, taken = [], set()
    for index, rule in enumerate(switch.flows):
        if switch.keyed:
            low = zlib.crc32(repr((rule.table, rule.priority, rule.match)).encode()) & ~KEYED & RULE_MASK
            while low in taken:
                low = (low + 1) & ~KEYED & RULE_MASK
            taken.add(low)
            low |= KEYED
        else:
            low = index + 1
        cookies.append(COOKIE | (CLASSIFIED if rule.traffic_class is not None or rule.counted else 0) | low)
    return tuple(cookies)


def is_ours(cookie: int) -> bool:
    return cookie & COOKIE_MASK == COOKIE


@dataclass(frozen=True)
class FlowEntry:
    priority: int
    match: tuple[tuple[str, Any], ...]
    # ("meter", id) | ("set_field", name, value) | ("set_queue", id) | ("output", port) |
    # ("write_metadata", value, mask) | ("goto", table), in the order the switch reports its instructions
    actions: tuple[tuple[Any, ...], ...]
    cookie: int
    table: int = 0


def desired_flows(policy: Policy, switch: SwitchPolicy, reserving: frozenset[int], mark_dscp: bool,
                  counted: frozenset[int] = frozenset(), cookies: tuple[int, ...] | None = None
                  ) -> tuple[FlowEntry, ...]:
    """Flows for `switch` while the ports in `reserving` have their class queues in force. A policed
    class's flows pass its meter whatever the port's queues; the rules in `counted` their counting meter.
    `cookies`: rule_cookies(switch), when the caller has them already."""
    cookies = cookies or rule_cookies(switch)
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
        then = ((("write_metadata", *rule.write_metadata),) if rule.write_metadata else ()) + \
            ((("goto", rule.goto),) if rule.goto is not None else ())
        entries.append(FlowEntry(rule.priority, rule.match, steer + tuple(("output", port) for port in rule.outputs)
                                 + then, cookies[index], rule.table))
    return tuple(entries)
