"""Which port each switch sends a host's traffic by: the shortest paths' next hops over the links found, one
chosen among equals as the policy's `network.paths` says, unless a move of adaptive paths chose another (this
is the Paths that controller/core/placement.py moves traffic along); and the spanning tree what is flooded
follows. Worked out again, lazily, whenever the links change. Pure.
"""
from __future__ import annotations

from collections.abc import Iterable

from controller.core.hosts import Hosts
from controller.core.paths import ADAPTIVE, ECMP, EXTRA_HOPS, Graph, hops_to, next_hops, pick, tree
from controller.core.placement import Placement
from controller.core.topology import End, Topology


class Routes:
    def __init__(self, topology: Topology, hosts: Hosts):
        self.topology, self.hosts = topology, hosts
        self.placement = Placement()
        self.mode = ECMP
        self.graph: Graph = {}
        self.tree: set[End] = set()
        self._hops: dict[int, dict[int, int]] = {}                   # switch → every switch's hops to it
        self._next: dict[tuple[int, int], list[int]] = {}           # (switch, toward) → its next hops
        self._version = -1

    def fresh(self) -> None:
        if self._version != self.topology.version:
            self._version = self.topology.version
            self.graph = self.topology.graph()
            self.tree = tree(self.graph)
            self._hops, self._next = {}, {}
            self.placement.validate(self)

    def version(self) -> tuple[int, int, int, str]:
        """Changes whenever what the fabric says of some switch may have (but for new ports turning edge as
        time passes: Topology.settle_by)."""
        return self.topology.version, self.hosts.version, self.placement.version, self.mode

    def set_mode(self, mode: str) -> None:
        if mode != ADAPTIVE:
            self.placement.overrides.clear()
        self.mode = mode

    def switches(self) -> Iterable[int]:
        return self.topology.ports

    def home(self, mac: str) -> int | None:
        end = self.hosts.at.get(mac)
        return None if end is None else end[0]

    def peer(self, end: End) -> End | None:
        return self.topology.peer.get(end)

    def default_hop(self, dp_id: int, mac: str) -> int | None:
        """The port `dp_id` sends `mac`'s traffic by, as `mode` chooses among the shortest paths' next hops."""
        home = self.home(mac)
        if home is None:
            return None
        if home == dp_id:
            return self.hosts.at[mac][1]
        self.fresh()
        ports = self._next.get((dp_id, home))
        if ports is None:
            ports = self._next[(dp_id, home)] = next_hops(self.graph, dp_id, self.hops_to(home))
        return pick(ports, self.mode, mac, dp_id) if ports else None

    def next_hop(self, dp_id: int, mac: str) -> int | None:
        """As `default_hop`, or the port a move chose (on a live link)."""
        port = self.placement.overrides.get((dp_id, mac))
        if port is not None and (dp_id, port) in self.topology.peer:
            return port
        return self.default_hop(dp_id, mac)

    def choices(self, dp_id: int, mac: str) -> list[int]:
        """The link ports `mac`'s traffic could leave `dp_id` by: the shortest paths' first, then those up to
        EXTRA_HOPS longer (whether one loops is for the caller to find out)."""
        home = self.home(mac)
        hops = self.hops_to(home) if home is not None else {}
        if dp_id not in hops:
            return []
        near = [(hops[other], port) for port, other, _ in self.graph.get(dp_id, ())
                if hops.get(other, EXTRA_HOPS + hops[dp_id]) < hops[dp_id] + EXTRA_HOPS]
        return [port for _, port in sorted(near)]

    def hops_to(self, dp_id: int) -> dict[int, int]:
        self.fresh()
        hops = self._hops.get(dp_id)
        if hops is None:
            hops = self._hops[dp_id] = hops_to(self.graph, dp_id)
        return hops

    def reaches(self, src: int, dst: int) -> bool:
        return src in self.hops_to(dst)

    def tree_ports(self, dp_id: int) -> frozenset[int]:
        self.fresh()
        return frozenset(p for dp, p in self.tree if dp == dp_id)
