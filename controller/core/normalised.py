"""A Policy written back out as a policy document: every default, filled-in prerequisite and
expanded match spelled out, with no base. It parses back to the same Policy, so it is both what the
offline checker shows (controller/check.py) and a body the REST API takes.

Pure.
"""
from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

from controller.core.policy import (
    SPECIAL_OUTPUTS,
    FlowRule,
    NetworkPolicy,
    Policy,
    PortPolicy,
    SwitchPolicy,
    TrafficClass,
    parse_share,
)


class HexNumber(int):
    """A number OpenFlow people read in hex (dp_id, eth_type); to JSON it is a plain int."""

    digits: int

    def __new__(cls, value: int, digits: int = 1) -> HexNumber:
        number = super().__new__(cls, value)
        number.digits = digits
        return number

    def hex(self) -> str:
        return f"0x{int(self):0{self.digits}x}"


def normalised_document(policy: Policy) -> dict[str, Any]:
    return {"name": policy.name, "description": policy.description,
            "classes": {c.name: _class(c) for c in policy.classes},
            "congestion": {"poll_interval": policy.poll_interval, "fast_poll_interval": policy.fast_poll_interval,
                           **_congestion(policy)},
            **({"switches": {s.name: _switch(s) for s in policy.switches}} if policy.switches else {}),
            **({"network": _network(policy.network)} if policy.network else {})}


def _network(network: NetworkPolicy) -> dict[str, Any]:
    doc: dict[str, Any] = {"forwarding": "learn", "paths": network.paths,
                           "classify": [{"priority": r.priority, "match": {k: _match_value(k, v) for k, v in r.match},
                                         "class": r.traffic_class} for r in network.classify]}
    rule = network.ports
    if rule is not None:
        doc["ports"] = {"queues": rule.queues, "queue_packets": rule.queue_packets, "discipline": rule.discipline,
                        "qos_type": rule.qos_type, **({"capacity": rule.capacity_bps} if rule.capacity_bps else {})}
    return doc


def percent(share: float) -> str | float:
    """0.8 → '80%'; the bare fraction when no short percentage parses back to exactly the same share."""
    text = f"{share * 100:.9g}%"
    return text if parse_share(text, "") == share else share


def _class(c: TrafficClass) -> dict[str, Any]:
    spec: dict[str, Any] = {"queue": c.queue, "min": percent(c.min_share), "max": percent(c.max_share), "dscp": c.dscp,
            "priority": c.priority}
    if c.police:
        spec["police"] = {"rate": f"{c.police.rate_kbps}kbit", "burst": f"{c.police.burst_kbits}kbit"}
    return spec


def _congestion(policy: Policy) -> dict[str, Any]:
    values = dataclasses.asdict(policy.congestion)
    return {k: v if k in ("samples", "hold_seconds") else percent(v) for k, v in values.items()}


def _switch(switch: SwitchPolicy) -> dict[str, Any]:
    doc = {"dp_id": HexNumber(switch.dp_id), "flows": [_flow(f) for f in switch.flows],
           "ports": {p.port_no: _port(p) for p in switch.ports}}
    return {**doc, "ovsdb": switch.ovsdb} if switch.ovsdb else doc


def _flow(rule: FlowRule) -> dict[str, Any]:
    names = {number: name for name, number in SPECIAL_OUTPUTS.items()}
    flow = {"priority": rule.priority, "match": {k: _match_value(k, v) for k, v in rule.match},
            "actions": [{"output": names.get(port, port)} for port in rule.outputs]}
    return {**flow, "class": rule.traffic_class} if rule.traffic_class else flow


def _match_value(key: str, value: Any) -> Any:
    if key == "eth_type":
        return HexNumber(value, 4)
    if isinstance(value, tuple):   # (address, netmask): the prefix it stands for
        address, netmask = value
        return f"{address}/{bin(int(ipaddress.ip_address(netmask))).count('1')}"
    return value


def _port(port: PortPolicy) -> dict[str, Any]:
    return {"capacity": port.capacity_bps, "queues": port.queues, "queue_packets": port.queue_packets,
            "discipline": port.discipline, "qos_type": port.qos_type}
