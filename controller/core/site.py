"""A switch the policy does not list, under its `network:` section: the controller's own forwarding.

The controller learns where each MAC address is from the packets a switch sends it (a table-miss
entry sends it every packet no entry matches), floods what it cannot place, and gives the switch, for
each MAC it learned, an entry to that MAC's port plus one per class rule: the same shape as a
hand-written table, so a class's traffic has an output port, and steering, class rates and meters
work per port as they do for listed switches. OVS's NORMAL action would forward as well, but it hides
the output port from the flow table, and with it which port a class's bytes load.

A class's mark (its DSCP, set where a port reserves) is kept by the next switches: entries above the
class rules match it, so voice marked at one bottleneck is voice at the next.

Pure: packets in, desired SwitchPolicy out.
"""
from __future__ import annotations

from controller.core.bridges import BridgeInfo
from controller.core.policy import (
    ETH_TYPE_IPV4,
    LEARNED_PRIORITY,
    MARKED_PRIORITY,
    MAX_PORT,
    SPECIAL_OUTPUTS,
    FlowRule,
    Policy,
    PortPolicy,
    SwitchPolicy,
)

CONTROLLER, FLOOD = SPECIAL_OUTPUTS["controller"], SPECIAL_OUTPUTS["flood"]
MAX_LEARNED = 65536       # MACs a switch keeps: a host that makes up source addresses cannot grow it for ever


class Learned:
    """Where each MAC address is on one switch, in the order learned: a MAC keeps its place (and its entries
    their cookies) when it moves."""

    def __init__(self) -> None:
        self.ports: dict[str, int] = {}

    def learn(self, mac: str, port_no: int) -> bool:
        """Whether that changed what the switch should hold."""
        if self.ports.get(mac) == port_no or mac not in self.ports and len(self.ports) >= MAX_LEARNED:
            return False
        self.ports[mac] = port_no
        return True

    def forget_ports(self, ports: set[int]) -> bool:
        """MACs learned on ports the switch no longer has; whether any was."""
        gone = [mac for mac, port in self.ports.items() if port not in ports]
        for mac in gone:
            del self.ports[mac]
        return bool(gone)


def addresses(data: bytes) -> tuple[str, str] | None:
    """(destination, source) MAC of an Ethernet frame; None for a runt."""
    if len(data) < 14:
        return None
    return _mac(data[0:6]), _mac(data[6:12])


def unicast(mac: str) -> bool:
    return not int(mac[:2], 16) & 1


def _mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def site_switch(policy: Policy, dp_id: int, bridge: BridgeInfo, learned: Learned) -> SwitchPolicy:
    """What a switch the policy does not list should hold, with the MACs learned so far."""
    network = policy.network
    assert network is not None, "a switch the policy does not list, and no network: section"
    flows = [FlowRule(0, (), (CONTROLLER,), None, "network.forwarding")]
    for mac, port in learned.ports.items():
        dst = ("eth_dst", mac)
        where = f"network (learned {mac})"
        flows.append(FlowRule(LEARNED_PRIORITY, (dst,), (port,), None, where))
        flows += [FlowRule(MARKED_PRIORITY, tuple(sorted((dst, ("eth_type", ETH_TYPE_IPV4), ("ip_dscp", c.dscp)))),
                           (port,), c.name, where) for c in policy.classes]
        flows += [FlowRule(rule.priority, tuple(sorted((*rule.match, dst))), (port,), rule.traffic_class, where)
                  for rule in network.classify]
    rule = network.ports
    ports = []
    for port_no in sorted(p for p in bridge.ports if p <= MAX_PORT) if rule else ():   # not the bridge's LOCAL port
        assert rule is not None
        capacity = rule.capacity_bps or bridge.declared.get(port_no)
        if capacity:
            ports.append(PortPolicy(port_no, capacity, rule.queues, rule.queue_packets, rule.discipline, rule.qos_type))
    return SwitchPolicy(name=bridge.name, dp_id=dp_id, flows=tuple(flows), ports=tuple(ports))
