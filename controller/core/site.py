"""A switch the policy does not list, under its `network:` section: its flow table, built from what the
fabric says of it (controller/core/fabric.py) and the policy's classes and ports. Four tables:

- 0, ports: discovery frames to the controller; a port that faces hosts marks the packet as from the edge
  and goes on to table 1, a link's goes on to table 2; any other port (new, quiet, down) forwards nothing.
- 1, from the edge: ARP to the controller (it answers or floods it to edge ports); flooded frames on to
  table 2; a known host's packets, by port and source address, on to table 2; the first packet of an
  unknown source to the controller (it learns it) and on to table 2 as well.
- 2, routing: flooded frames along the spanning tree and out of the edge ports (never back in, and
  dropped when they come in by a link off the tree); a known host's address writes the port toward it
  into the metadata and goes on to table 3; an unknown one to the controller.
- 3, the egress port's classes: per port that forwards (a link's, or one a host was heard on), the same shape
  as a hand-written table (the port's output, one rule per class rule, and the rules that keep a class's mark
  from an upstream switch), so that a class's traffic has an output port and steering, class rates and
  meters work per port as for listed switches. They are listed first, in port order, so their positions
  (and the counting meters numbered by them) move only as a port starts or stops forwarding.
A port no host was heard on (yet) has no rules of its own beyond table 0's: a host's first frame there goes
to the controller, which learns it (a broadcast is flooded by the controller meanwhile). So a switch of many
idle ports costs a few rules per port, and a poll reads no class rule of theirs.

Every rule is keyed by its table, priority and match (SwitchPolicy.keyed): a rule keeps its cookie, and its
counters, whatever rules come and go beside it. Pure.
"""
from __future__ import annotations

from controller.core.bridges import BridgeInfo
from controller.core.fabric import INGRESS_TABLE, ROUTING_TABLE, FabricRules
from controller.core.frames import ETH_ARP, ETH_LLDP
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

CONTROLLER = SPECIAL_OUTPUTS["controller"]
PORTS_TABLE, CLASSES_TABLE = 0, 3
FROM_EDGE = 1 << 32                            # metadata: came in by an edge port
PORT_BITS = 0xFFFF_FFFF                        # metadata: the port toward the destination (table 2 → 3)
GROUP = ("01:00:00:00:00:00", "01:00:00:00:00:00")   # any group address (broadcast included)
PROBE_PRIORITY, ARP_PRIORITY, FLOOD_PRIORITY = 65000, 3000, 2500


def site_switch(policy: Policy, dp_id: int, bridge: BridgeInfo, fabric: FabricRules) -> SwitchPolicy:
    """What a switch the policy does not list should hold, with what the fabric knows now."""
    network = policy.network
    assert network is not None, "a switch the policy does not list, and no network: section"
    bridge_ports = sorted(p for p in bridge.ports if p <= MAX_PORT)    # not the bridge's LOCAL port
    forwarding = {port for _, port in fabric.hosts} | fabric.links
    flows = [rule for port in sorted(forwarding) for rule in _classes(policy, port)]
    where = "network.forwarding"

    def rule(table: int, priority: int, match: dict[str, object], outputs: tuple[int, ...] = (),
             goto: int | None = None, metadata: tuple[int, int] | None = None, counted: bool = False) -> None:
        flows.append(FlowRule(priority, tuple(sorted(match.items())), outputs, None, where, table=table, goto=goto,
                              write_metadata=metadata, counted=counted))

    rule(PORTS_TABLE, PROBE_PRIORITY, {"eth_type": ETH_LLDP}, (CONTROLLER,))
    for port in sorted(fabric.edge):
        rule(PORTS_TABLE, LEARNED_PRIORITY, {"in_port": port}, goto=INGRESS_TABLE, metadata=(FROM_EDGE, FROM_EDGE))
    for port in sorted(fabric.links):
        rule(PORTS_TABLE, LEARNED_PRIORITY, {"in_port": port}, goto=ROUTING_TABLE)
    rule(INGRESS_TABLE, ARP_PRIORITY, {"eth_type": ETH_ARP}, (CONTROLLER,))
    rule(INGRESS_TABLE, FLOOD_PRIORITY, {"eth_dst": GROUP}, goto=ROUTING_TABLE)
    for mac, port in fabric.hosts:
        rule(INGRESS_TABLE, LEARNED_PRIORITY, {"in_port": port, "eth_src": mac}, goto=ROUTING_TABLE)
    rule(INGRESS_TABLE, 0, {}, (CONTROLLER,), goto=ROUTING_TABLE)
    flood = fabric.edge | fabric.tree
    for port in sorted(forwarding):
        outputs = tuple(sorted(flood - {port})) if port in flood else ()    # off the tree: dropped
        rule(ROUTING_TABLE, FLOOD_PRIORITY, {"in_port": port, "eth_dst": GROUP}, outputs)
    for mac, port in fabric.routes:
        rule(ROUTING_TABLE, LEARNED_PRIORITY, {"eth_dst": mac}, goto=CLASSES_TABLE, metadata=(port, PORT_BITS),
             counted=fabric.counted)
    rule(ROUTING_TABLE, 0, {}, (CONTROLLER,))
    return SwitchPolicy(name=bridge.name, dp_id=dp_id, flows=tuple(flows), ports=_ports(policy, bridge, bridge_ports),
                        keyed=True)


def _classes(policy: Policy, port: int) -> list[FlowRule]:
    """Table 3 for one egress port: its output, each class rule, and the rules that keep a class's mark."""
    network = policy.network
    assert network is not None
    out = ("metadata", (port, PORT_BITS))
    where = f"network (port {port})"
    rules = [FlowRule(LEARNED_PRIORITY, (out,), (port,), None, where, table=CLASSES_TABLE)]
    rules += [FlowRule(MARKED_PRIORITY, tuple(sorted((out, ("eth_type", ETH_TYPE_IPV4), ("ip_dscp", c.dscp)))),
                       (port,), c.name, where, table=CLASSES_TABLE) for c in policy.classes]
    rules += [FlowRule(r.priority, tuple(sorted((*r.match, out))), (port,), r.traffic_class, where,
                       table=CLASSES_TABLE) for r in network.classify]
    return rules


def _ports(policy: Policy, bridge: BridgeInfo, bridge_ports: list[int]) -> tuple[PortPolicy, ...]:
    """The queues of every port whose capacity the policy gives or the port declares."""
    rule = policy.network.ports if policy.network else None
    if rule is None:
        return ()
    ports = []
    for port_no in bridge_ports:
        capacity = rule.capacity_bps or bridge.declared.get(port_no)
        if capacity:
            ports.append(PortPolicy(port_no, capacity, rule.queues, rule.queue_packets, rule.discipline, rule.qos_type))
    return tuple(ports)
