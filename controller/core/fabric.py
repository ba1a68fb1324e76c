"""The controller's own forwarding over any graph of switches, loops included (the switches a policy's
`network:` section covers): links found by probes, hosts learned on edge ports, ARP answered, unicast
routed along paths installed at every switch on the way, and what is flooded sent along a spanning tree.

Nothing is flooded around a loop: the switches flood (multicast, broadcast other than ARP) only along the
tree and out of edge ports, and what the controller floods itself (ARP it cannot answer, unicast to an
address it has not learned) it sends out of edge ports only, never onto a link. A port is not forwarded
through until it is known to face a host or a switch (controller/core/topology.py).

Pure: events and `now` in; the packets to send (Out) and each switch's FabricRules out, which
controller/core/site.py turns into its flow table. Which of the equal next hops a switch takes toward a
host is chosen by the policy's `network.paths` (controller/core/paths.py).
"""
from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from controller.core import frames
from controller.core.hosts import Hosts
from controller.core.paths import ADAPTIVE
from controller.core.routes import Routes
from controller.core.telemetry import FabricFigures
from controller.core.topology import Role, Topology

CONTROLLER_PORT = 0xFFFFFFFD    # OFPP_CONTROLLER: a packet-out's in_port, so that it may leave by any port
INGRESS_TABLE, ROUTING_TABLE = 1, 2   # the tables whose misses reach us (controller/core/site.py)


@dataclass(frozen=True)
class Out:
    """A packet to send out of `outputs` of switch `dp_id`."""
    dp_id: int
    outputs: tuple[int, ...]
    data: bytes


@dataclass(frozen=True)
class FabricRules:
    """What one switch needs of the fabric for its flow table."""
    edge: frozenset[int]                      # ports that face hosts
    links: frozenset[int]                     # ports of live links
    tree: frozenset[int]                      # the links of the spanning tree among them
    hosts: tuple[tuple[str, int], ...]        # the hosts on this switch: (MAC, port)
    routes: tuple[tuple[str, int], ...]       # every host it can reach: (MAC, the port toward it)
    counted: bool = False                     # its routes' rates are read at every poll (adaptive paths)


NO_FABRIC = FabricRules(frozenset(), frozenset(), frozenset(), (), ())   # a switch nothing is known of yet


class Fabric:
    def __init__(self, key: bytes, rng: random.Random):
        """`key`: what the controller's discovery frames are signed with."""
        self.key, self.rng = key, rng
        self.topology = Topology()
        self.hosts = Hosts()
        self.routes = Routes(self.topology, self.hosts)
        # By kind: probe, arp, a new source, an unknown destination; each counted from 0, as a counter should be.
        self.packet_ins: dict[str, int] = dict.fromkeys(("probe", "arp", "source", "destination"), 0)

    # --- switches, as they connect and say what their ports are ---------------------------------------------
    def connect(self, dp_id: int, ports: Iterable[int], down: Iterable[int], now: float) -> None:
        self.topology.switch_up(dp_id, ports, down, now)

    def disconnect(self, dp_id: int) -> None:
        self.topology.switch_down(dp_id)
        self.hosts.forget({end for end in self.hosts.at.values() if end[0] == dp_id})

    def set_ports(self, dp_id: int, ports: frozenset[int], down: frozenset[int], now: float) -> None:
        """A port gone or down forgets its hosts: it may face anything when it is back."""
        self.topology.set_ports(dp_id, ports, down, now)
        self.hosts.forget({(dp_id, p) for p in {p for dp, p in self.hosts.at.values() if dp == dp_id} - (ports - down)})

    # --- discovery -----------------------------------------------------------------------------------------
    def probes(self, dp_id: int, now: float, wall_ms: int) -> list[Out]:
        """The discovery frames due out of the switch's ports now."""
        return [Out(dp_id, (port,), frames.probe_frame(self.key, dp_id, port, wall_ms, self.rng.randbytes(8)))
                for port in self.topology.to_probe(dp_id, now)]

    def expire(self, wall_ms: int) -> None:
        self.topology.expire(wall_ms)

    # --- what the switches send us -------------------------------------------------------------------------
    def packet_in(self, dp_id: int, port: int, table: int, data: bytes, now: float, wall_ms: int,
                  ours: set[int]) -> list[Out]:
        """A packet a switch sent us; `ours`: the switches this controller may send packets out of."""
        probe = frames.read_probe(data)
        kind = "probe" if probe is not None else "source" if table != ROUTING_TABLE else "destination"
        self.packet_ins[kind] = self.packet_ins.get(kind, 0) + 1
        if probe is not None:
            # A probe from or onto a port a host was heard on: one a host captured and sent again elsewhere
            # (only a port going down makes such a port new again).
            if not frames.genuine(self.key, probe):
                self.topology.refused["forged"] = self.topology.refused.get("forged", 0) + 1
            elif self.hosts.on_port((dp_id, port)) or self.hosts.on_port((probe.dp_id, probe.port_no)):
                self.topology.refused["a host's port"] = self.topology.refused.get("a host's port", 0) + 1
            else:
                self.topology.heard(probe, (dp_id, port), now, wall_ms)
            return []
        found = frames.addresses(data)
        role = self.topology.role((dp_id, port), now)
        if found is None or role not in (Role.EDGE, Role.LINK):
            return []
        dst, src, eth_type = found
        if role is Role.EDGE and not frames.multicast(src):
            self.hosts.learn(src, (dp_id, port))
        if role is Role.EDGE and eth_type == frames.ETH_ARP:
            self.packet_ins["arp"] = self.packet_ins.get("arp", 0) + 1
            self.packet_ins[kind] -= 1
            return self._arp(dp_id, port, data, now, ours)
        if table != ROUTING_TABLE:
            return []     # a new source, learned: the switch forwards the packet itself
        if frames.multicast(dst) or dst not in self.hosts.at:
            return self._flood(dp_id, port, data, now, ours) if role is Role.EDGE else []
        return self._deliver(dp_id, dst, data, ours)

    def _arp(self, dp_id: int, port: int, data: bytes, now: float, ours: set[int]) -> list[Out]:
        arp = frames.read_arp(data)
        if arp is None:
            return []
        self.hosts.learn_ip(arp.sender_ip, arp.sender_mac)
        if arp.op == frames.ARP_REPLY:
            return self._deliver(dp_id, arp.target_mac, data, ours)
        if arp.sender_ip == arp.target_ip:
            return []     # gratuitous: an announcement, learned
        mac = self.hosts.macs.get(arp.target_ip)
        if mac in self.hosts.at and self.routes.reaches(dp_id, self.hosts.at[mac][0]):
            return [Out(dp_id, (port,), frames.arp_reply(arp, mac))] if dp_id in ours else []
        return self._flood(dp_id, port, data, now, ours)

    def _deliver(self, dp_id: int, mac: str, data: bytes, ours: set[int]) -> list[Out]:
        """Straight to a known host's port, while its switches' paths are being installed."""
        end = self.hosts.at.get(mac)
        if end is None or end[0] not in ours or not self.routes.reaches(dp_id, end[0]):
            return []
        return [Out(end[0], (end[1],), data)]

    def _flood(self, dp_id: int, port: int, data: bytes, now: float, ours: set[int]) -> list[Out]:
        """Out of every edge port of every switch it can reach, but the one it came in by: never onto a link."""
        outs = []
        for dp in sorted(ours):
            if self.routes.reaches(dp_id, dp):
                edge = tuple(sorted(p for p, role in self.topology.roles(dp, now).items()
                                    if role is Role.EDGE and (dp, p) != (dp_id, port)))
                if edge:
                    outs.append(Out(dp, edge, data))
        return outs

    def status(self) -> dict[str, Any]:
        """Its links (each once, as two ends) and hosts, as the status shows them."""
        def at(end: tuple[int, int]) -> str:
            return f"{end[0]:016x}:{end[1]}"
        return {"links": sorted([at(a), at(b)] for a, b in self.topology.peer.items() if a < b),
                "hosts": {mac: at(end) for mac, end in sorted(self.hosts.at.items())}}

    def figures(self) -> FabricFigures:
        return FabricFigures(len(self.topology.peer) // 2, len(self.hosts.at), self.routes.placement.moves,
                             dict(self.packet_ins), dict(self.topology.refused))

    def rules(self, dp_id: int, now: float) -> FabricRules:
        roles = self.topology.roles(dp_id, now)
        hosts = self.hosts.on(dp_id)
        routes = dict(hosts)
        for mac in self.hosts.at:
            port = self.routes.next_hop(dp_id, mac)
            if port is not None:
                routes[mac] = port
        return FabricRules(edge=frozenset(p for p, r in roles.items() if r is Role.EDGE),
                           links=frozenset(p for p, r in roles.items() if r is Role.LINK),
                           tree=self.routes.tree_ports(dp_id),
                           hosts=tuple(sorted((m, p) for m, p in hosts.items() if roles.get(p) is Role.EDGE)),
                           routes=tuple(sorted(routes.items())), counted=self.routes.mode == ADAPTIVE)
