"""The fabric (controller/core/fabric.py) among the controller's switches: which switches it covers (those a
policy's `network:` section covers), its rounds of discovery, the packets the switches send it, and what it
says of each switch, kept so that a switch's view carries it and a switch is told when it changes.

A part of controller/core/controller.py: events and `now` in, actions out, and the switches whose tables must
be built anew; it holds no pointer to the controller.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from controller.core import actions as act
from controller.core import events as ev
from controller.core.fabric import Fabric, FabricRules, Out
from controller.core.placement import Move
from controller.core.policy import Policy
from controller.core.switch import Switch
from controller.core.topology import PROBE_SECONDS


class Forwarding:
    def __init__(self, key: bytes, rng: random.Random, wall: Callable[[], float], shared: bool = False):
        """`key`: what the discovery frames are signed with (a cluster's members share it); `shared`: the switches
        are shared with a cluster's other members."""
        self.fabric = Fabric(key, rng)
        self.fabric.routes.placement.shortest_only = shared
        self.wall = wall
        self.rules: dict[int, FabricRules] = {}    # what the fabric last said of each switch it covers
        self.due: float | None = None              # the next round, while one is set
        self._said: tuple[object, ...] = ()       # the fabric's version when every switch's rules were last said
        self._said_at: dict[int, float] = {}       # switch → when its rules were last said

    @staticmethod
    def covered(policy: Policy | None, switches: dict[int, Switch]) -> dict[int, Switch]:
        """The switches the fabric forwards for: those the policy's network: section covers."""
        if policy is None or policy.network is None:
            return {}
        return {dp: sw for dp, sw in switches.items() if policy.switch(dp) is None}

    def refresh(self, policy: Policy | None, switches: dict[int, Switch], now: float) -> tuple[list[act.Action],
                                                                                              list[Switch]]:
        """What the fabric says of each switch it covers, anew: a round set if none is, and the switches whose
        rules changed."""
        covered = self.covered(policy, switches)
        if policy is not None and policy.network is not None:
            self.fabric.routes.set_mode(policy.network.paths)
        # Every switch's rules when the paths may have changed (links, hosts, moves); else only those of the
        # switches new to it, whose ports changed, or whose new ports have turned edge since their rules were
        # said: a switch joining a site of N costs what it costs alone.
        version = self.fabric.routes.version()
        topology = self.fabric.topology
        if version != self._said:
            self._said, redo = version, set(covered)
        else:
            redo = {dp for dp in covered.keys() - self.rules.keys() | topology.touched | set(topology.settle_by)
                    if dp in covered and (dp not in self.rules or dp in topology.touched
                                          or self._said_at.get(dp, now) < topology.settle_by[dp] <= now)}
        topology.touched.clear()
        for dp in set(self.rules) - set(covered):
            del self.rules[dp], self._said_at[dp]
        changed = []
        for dp in sorted(redo):
            rules, self._said_at[dp] = self.fabric.rules(dp, now), now
            if self.rules.get(dp) != rules:
                self.rules[dp] = rules
                changed.append(covered[dp])
        for dp in [dp for dp, by in topology.settle_by.items() if self._said_at.get(dp, by - 1) >= by]:
            del topology.settle_by[dp]           # settled, and said since
        if not covered or self.due is not None:
            return [], changed
        self.due = now
        return [act.Later(0.0, ev.DiscoveryDue(now))], changed

    def round(self, due: ev.DiscoveryDue, covered: dict[int, Switch], writable: Callable[[int], bool],
              now: float) -> list[act.Action]:
        """Links not heard lately lost, probes out of the writable switches' ports, the next round set. Whether a
        switch is writable is asked only of those with ports to probe."""
        if due.due != self.due:
            return []
        self.due = None
        if not covered:
            return []       # rounds start again with the next switch covered
        wall_ms = int(self.wall() * 1000)
        self.fabric.expire(wall_ms)
        unprobed = self.fabric.topology.unprobed
        out = [send for dp in sorted(covered) if dp not in unprobed and writable(dp)
               for send in self._send(covered[dp], self.fabric.probes(dp, now, wall_ms))]
        self.due = max(due.due + PROBE_SECONDS, now)
        return [*out, act.Later(self.due - now, ev.DiscoveryDue(self.due))]

    def packet_in(self, sw: Switch, packet: ev.PacketIn, covered: dict[int, Switch], writable: Callable[[int], bool],
                  now: float) -> list[act.Action]:
        """From any switch the fabric covers, ours to write or not (a standby's, another member's: it is heard
        as its owner hears it); what it asks to send goes out of ours only."""
        if sw.dp_id not in covered:
            return []
        outs = self.fabric.packet_in(sw.dp_id, packet.in_port, packet.table, packet.data, now,
                                     int(self.wall() * 1000), {dp for dp in covered if writable(dp)})
        return [send for out in outs for send in self._send(covered[out.dp_id], [out])]

    def loads(self, loads: act.Loads, policy: Policy | None, now: float) -> list[Move]:
        """A poll's figures, for adaptive paths: the moves they made."""
        if policy is None or policy.network is None:
            return []
        routes = self.fabric.routes
        return routes.placement.observe(loads.dp_id, loads.ports, loads.routes, loads.capacity, policy.congestion,
                                        routes, now)

    def relieve(self, dp_id: int, port_no: int, policy: Policy | None, now: float) -> list[Move] | None:
        """A link port's detector would reserve: the moves that relieve it, [] if it was relieved lately (give
        them time), or None if nothing can be moved (it reserves)."""
        if policy is None:
            return None
        routes = self.fabric.routes
        if routes.placement.recently_relieved((dp_id, port_no), policy.congestion, now):
            return []
        return routes.placement.relieve((dp_id, port_no), policy.congestion, routes, now, "its queue drops or its "
                                 "classes contend") or None

    @staticmethod
    def _send(sw: Switch, outs: Iterable[Out]) -> list[act.Action]:
        messages = tuple(act.PacketOut(sw.link.xid(), out.outputs, out.data) for out in outs)
        return [act.Send(sw.conn, messages)] if messages else []
