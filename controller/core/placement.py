"""Adaptive paths (`network.paths: adaptive`): traffic moved off a full link onto a path with room, and back
once its own path has room again (pure: rates and `now` in, the moves out).

Routing is by destination: each switch sends a host's traffic out of one port, chosen among the equal next
hops (controller/core/fabric.py). A move overrides that choice for one (switch, destination): every packet
to that host through that switch takes another port, and the switches after it route on as they do. The
rates come from the switches themselves: a link end's from its port counters (fast polled while it is busy),
a (switch, destination)'s from its routing entry's counters.

A link is relieved when, for `samples` polls in a row, it sends at `utilisation` of its capacity or more with
two elephants or more on it (a destination taking ACTIVE_SHARE of it or more): elephants colliding while a
path beside them may be idle, whatever their classes (Hedera's case). The congestion detector of a port that
queues (controller/core/switch_state.py) also asks for relief before it reserves. The elephants go first,
each to the first path with room for it (Hedera's global first fit: the shortest paths first, then up to
EXTRA_HOPS longer ones; a cluster's member: the shortest only), moved at the switch the link leaves or,
when that switch has no other way, at a switch before it; a path never loops (every move is checked by
following it to its host). A link that no move can relieve keeps what it has: the queues are the answer there.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from controller.core.congestion import CongestionConfig
from controller.core.topology import End

ACTIVE_SHARE = 0.05         # a destination taking less of a link is a mouse: never moved for it
MARGIN = 0.05               # a relieved link is brought this far under the utilisation that made it hot
IDLE_BPS = 1000             # a moved destination sending less than this is idle
SETTLE_SECONDS = 1.0        # a link traffic was moved off is judged again after this (a slow poll)


@dataclass(frozen=True)
class Move:
    """Traffic to `mac` through `dp_id` sent out of `after` instead of `before` (None: the default's again)."""
    dp_id: int
    mac: str
    before: int | None
    after: int | None
    bps: float
    why: str


class Paths(Protocol):
    """What the fabric knows of paths (controller/core/fabric.py)."""

    def next_hop(self, dp_id: int, mac: str) -> int | None: ...

    def default_hop(self, dp_id: int, mac: str) -> int | None: ...

    def choices(self, dp_id: int, mac: str) -> list[int]: ...

    def peer(self, end: End) -> End | None: ...

    def home(self, mac: str) -> int | None: ...

    def switches(self) -> Iterable[int]: ...


@dataclass
class Placement:
    overrides: dict[tuple[int, str], int] = field(default_factory=dict)    # (switch, host) → the port it takes
    load: dict[End, float] = field(default_factory=dict)                   # link end → bit/s sent, latest
    capacity: dict[End, int] = field(default_factory=dict)                 # link end → its capacity, declared
    rate: dict[tuple[int, str], float] = field(default_factory=dict)       # (switch, host) → bit/s, latest
    hot: dict[End, int] = field(default_factory=dict)                      # link end → hot samples in a row
    relieved: dict[End, float] = field(default_factory=dict)               # link end → when it last was
    room_since: dict[tuple[int, str], float] = field(default_factory=dict) # a move whose own path has room
    moved_at: dict[tuple[int, str], float] = field(default_factory=dict)   # (switch, host) → when it last moved
    moves: int = 0                                                          # in all, for the metrics
    version: int = 0                                                        # bumped by every change of overrides
    # A cluster's member moves traffic onto shortest paths only: it cannot know the other members' moves, and
    # moves that each take a hop nearer the host never loop, whoever makes them.
    shortest_only: bool = False

    def observe(self, dp_id: int, ports: dict[int, float], routes: dict[str, float], capacity: dict[int, int],
                config: CongestionConfig, paths: Paths, now: float) -> list[Move]:
        """One poll of a switch: its ports' rates (bit/s), its routes' and its ports' capacities. The moves it
        made (the switches' tables must change)."""
        self.load.update({(dp_id, port): bps for port, bps in ports.items()})
        self.rate.update({(dp_id, mac): bps for mac, bps in routes.items()})
        self.capacity.update({(dp_id, port): bps for port, bps in capacity.items()})
        moves = []
        for port in ports:
            end = (dp_id, port)
            if paths.peer(end) is None or end not in self.capacity:
                continue
            settling = now - self.relieved.get(end, -SETTLE_SECONDS) < SETTLE_SECONDS
            self.hot[end] = self.hot.get(end, 0) + 1 if not settling and self._colliding(end, config, paths) else 0
            if self.hot[end] >= config.samples:
                moves += self.relieve(end, config, paths, now, "elephants collide")
        return moves + self._settle(config, paths, now)

    def _colliding(self, end: End, config: CongestionConfig, paths: Paths) -> bool:
        capacity = self.capacity[end]
        if self.load.get(end, 0.0) < config.utilisation * capacity:
            return False
        return len(self._elephants(end, paths)) >= 2

    def _elephants(self, end: End, paths: Paths) -> list[tuple[float, str]]:
        """The destinations the link's switch sends out of it, biggest first, mice left out."""
        dp_id, port = end
        floor = ACTIVE_SHARE * self.capacity.get(end, 0)
        found = [(bps, mac) for (dp, mac), bps in self.rate.items()
                 if dp == dp_id and bps >= floor and bps > IDLE_BPS and paths.next_hop(dp, mac) == port]
        return sorted(found, reverse=True)

    def recently_relieved(self, end: End, config: CongestionConfig, now: float) -> bool:
        at = self.relieved.get(end)
        return at is not None and now - at <= config.hold_seconds

    def relieve(self, end: End, config: CongestionConfig, paths: Paths, now: float, why: str) -> list[Move]:
        """Elephants moved off the link, first fit, until it is under its utilisation: each at the switch nearest
        its sources that can move it, onto a shortest path if one has room, else onto a longer one."""
        capacity = self.capacity.get(end)
        if capacity is None or paths.peer(end) is None:
            return []
        load = self.load.get(end, 0.0)
        excess = load - (config.utilisation - MARGIN) * capacity
        moves = []
        for _, mac in self._elephants(end, paths):
            if excess <= 0:
                break
            movers = self._movers(end, mac, paths, now, config.hold_seconds)
            # A longer path only once every switch that sends to the host across the link has said how much:
            # the traffic may be its own to move, on a path as short as it has now.
            longest = (False, True) if not self.shortest_only and self._informed(end, mac, paths) else (False,)
            fit = next(((dp_id, rate, port) for longer in longest for dp_id, rate in movers
                        if (port := self._first_fit(dp_id, mac, rate, end, config.utilisation, longer, paths))
                        is not None), None)
            if fit is not None:
                dp_id, rate, port = fit
                moves.append(self._move(dp_id, mac, port, rate, paths, now,
                                        f"link {end[0]:x}:{end[1]} at {load / capacity:.0%}: {why}"))
                excess -= rate
        self.hot[end] = 0
        return moves

    def _movers(self, end: End, mac: str, paths: Paths, now: float, hold: float) -> list[tuple[int, float]]:
        """The switches whose traffic to `mac` crosses the link, with its rate there: the farthest from the
        link first (nearest its sources: the move takes that traffic only), the link's own switch last. One
        that moved it within the hold time keeps it where it is: rates read before a move took effect would
        otherwise send it back and forth between links that are both full."""
        floor = ACTIVE_SHARE * self.capacity.get(end, 0)
        upstream = []
        for (dp_id, host), bps in self.rate.items():
            if host == mac and dp_id != end[0] and bps >= floor:
                chain = self.chain(dp_id, mac, None, paths)
                if end in chain:
                    upstream.append((chain.index(end), dp_id, bps))
        movers = [(dp_id, bps) for _, dp_id, bps in sorted(upstream, reverse=True)] + \
            [(end[0], self.rate.get((end[0], mac), 0.0))]
        return [(dp_id, bps) for dp_id, bps in movers if now - self.moved_at.get((dp_id, mac), -hold) >= hold]

    def _informed(self, end: End, mac: str, paths: Paths) -> bool:
        return all((dp_id, mac) in self.rate for dp_id in paths.switches()
                   if end in self.chain(dp_id, mac, None, paths))

    def chain(self, dp_id: int, mac: str, first: int | None, paths: Paths) -> list[End]:
        """The link ends traffic to `mac` leaves by from `dp_id` on (out of `first` there, if given); empty if it
        does not reach the host (a loop, or a dead end)."""
        home, seen, here = paths.home(mac), {dp_id}, dp_id
        ends: list[End] = []
        port = first if first is not None else paths.next_hop(dp_id, mac)
        while here != home:
            if port is None:
                return []
            peer = paths.peer((here, port))
            if peer is None or peer[0] in seen:
                return []
            ends.append((here, port))
            here = peer[0]
            seen.add(here)
            port = paths.next_hop(here, mac)
        return ends

    def _first_fit(self, dp_id: int, mac: str, rate: float, avoid: End, share: float, longer: bool,
                   paths: Paths) -> int | None:
        """The first port of `dp_id` whose path to `mac` avoids the link and has room for `rate`: a path as
        short as the one taken now, or (`longer`) a longer one."""
        now_port = paths.next_hop(dp_id, mac)
        hops = len(self.chain(dp_id, mac, None, paths))
        for port in paths.choices(dp_id, mac):
            chain = self.chain(dp_id, mac, port, paths) if port != now_port else []
            if chain and (len(chain) > hops) == longer and avoid not in chain and self._room(chain, rate, share):
                return port
        return None

    def _room(self, chain: Iterable[End], rate: float, share: float) -> bool:
        return all(self.load.get(end, 0.0) + rate <= share * self.capacity[end]
                   for end in chain if end in self.capacity)

    def _move(self, dp_id: int, mac: str, port: int | None, rate: float, paths: Paths, now: float,
              why: str) -> Move:
        """The override in force, and the loads as they will be once it is (until the next polls say). The
        links it leaves wait SETTLE_SECONDS before they are judged again: their next readings may still be
        of the traffic as it was."""
        before = paths.next_hop(dp_id, mac)
        for end in self.chain(dp_id, mac, None, paths):
            self.load[end] = max(0.0, self.load.get(end, 0.0) - rate)
            self.relieved[end] = now
        self._set(dp_id, mac, port, paths)
        for end in self.chain(dp_id, mac, None, paths):
            self.load[end] = self.load.get(end, 0.0) + rate
        self.room_since.pop((dp_id, mac), None)
        self.moved_at[(dp_id, mac)] = now
        self.moves += 1
        return Move(dp_id, mac, before, paths.next_hop(dp_id, mac), rate, why)

    def _set(self, dp_id: int, mac: str, port: int | None, paths: Paths) -> None:
        self.version += 1
        if port is None or port == paths.default_hop(dp_id, mac):
            self.overrides.pop((dp_id, mac), None)
        else:
            self.overrides[(dp_id, mac)] = port

    def validate(self, paths: Paths) -> None:
        """After the links changed: a move whose path no longer reaches its host (a link gone, or a loop the
        new shortest paths would close) is undone."""
        for (dp_id, mac) in list(self.overrides):
            if not self.chain(dp_id, mac, None, paths):
                del self.overrides[(dp_id, mac)]
                self.version += 1

    def _settle(self, config: CongestionConfig, paths: Paths, now: float) -> list[Move]:
        """Moves no longer needed are undone: a destination gone quiet, or whose own path has had room for it,
        with a margin, for the hold time."""
        moves = []
        for key in list(self.overrides):
            dp_id, mac = key
            rate = self.rate.get(key, 0.0)
            default = paths.default_hop(dp_id, mac)
            home = self.chain(dp_id, mac, default, paths) if default is not None else []
            if not home or rate > IDLE_BPS and not self._room(home, rate, config.clear_utilisation):
                self.room_since.pop(key, None)
                continue
            since = self.room_since.setdefault(key, now)
            if now - since >= config.hold_seconds:
                moves.append(self._move(dp_id, mac, default, rate, paths, now, f"its own path has had room for "
                                        f"{now - since:g} s" if rate > IDLE_BPS else "quiet"))
        return moves
