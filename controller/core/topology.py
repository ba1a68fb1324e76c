"""The switches' ports and the links between them, as the controller finds them (pure: events and `now`
in, what changed out).

A port is one of:
- NEW: up, but not yet known to face a host or a switch. Nothing is forwarded in or out of it, so that a
  link not yet discovered can carry no loop; it is probed at every round.
- LINK: a discovery frame of ours crossed it (either way), and none sent LINK_TIMEOUT after the last that did
  has come back by another link while none came back by it. Silence is judged by when the frames were sent,
  not when they came in: a controller (or an OVS) that hears every frame late loses no link, and a link is
  lost only once frames sent after its own last one have made it elsewhere (or, with nothing else heard,
  after LINK_LOST).
- EDGE: probed for EDGE_SETTLE (from its first probe: a port nobody probed yet is new however long it has been
  up) with no such frame: it faces hosts. A switch another controller probes (a standby's, another member's)
  counts as probed once a probe from it is heard. It is not probed any more: a host there
  could capture a probe and send it again elsewhere. A switch cabled to it later probes it itself (its
  own port is new), or the port goes down and up as the cable moves.
- QUIET: a link on it went silent while the port stayed up (a far switch that lost its controller, or a
  link that drops frames): no longer a path, and never taken for an edge port, which would flood into it.
  A frame heard again makes it a link again; the port going down and up makes it new.
- DOWN: the switch says the link is down (or the port is gone): its link is removed at once.

Discovery frames are accepted only when genuine (controller/core/frames.py), sent within PROBE_MAX_AGE,
with a nonce not seen before, from a port of a connected switch that is up, onto another such port.
"""
from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from controller.core.frames import Probe

LOG = logging.getLogger("qos")

PROBE_SECONDS = 0.25          # a link port's probes: a silent link is lost within LINK_TIMEOUT + this
LINK_TIMEOUT = 0.75           # ... three rounds of probes heard elsewhere, and not on it
LINK_LOST = 3.0               # ... or, when none is heard anywhere, this long after its own last one was sent
EDGE_SETTLE = 1.0             # a port probed this long with no frame back faces hosts
PROBE_MAX_AGE_MS = 2000       # a frame sent longer ago is refused (a replay), as is one from the future
_NONCES_KEPT = 100_000        # nonces remembered (more than PROBE_MAX_AGE of frames at any size we run)

End = tuple[int, int]         # (datapath id, OpenFlow port)


class Role(enum.StrEnum):
    NEW = "new"
    EDGE = "edge"
    LINK = "link"
    QUIET = "quiet"
    DOWN = "down"


@dataclass
class PortState:
    up: bool
    since: float                   # when it came up, or its switch connected
    first_probed: float | None = None   # when a probe first left it (since it came up)
    quiet: bool = False
    probed: float = float("-inf")  # when a probe last left it


@dataclass
class Topology:
    ports: dict[int, dict[int, PortState]] = field(default_factory=dict)   # switch → port → state
    peer: dict[End, End] = field(default_factory=dict)                     # a live link's end → the other
    seen: dict[End, int] = field(default_factory=dict)                     # a link's lower end → when the newest
    #                                                                        frame heard across it was sent (ms)
    newest: int = 0                                                         # ... and the newest heard at all
    version: int = 0                                                       # bumped by every change of links
    settle_by: dict[int, float] = field(default_factory=dict)              # until then a new port may turn edge
    touched: set[int] = field(default_factory=set)                         # switches whose ports changed
    unprobed: set[int] = field(default_factory=set)                        # switches of edge and down ports only,
    #                                                                        as at their last round, and unchanged
    refused: dict[str, int] = field(default_factory=dict)                  # frames refused, by reason
    _nonces: dict[bytes, int] = field(default_factory=dict)

    # --- switches and their ports, as they say ---------------------------------------------------------
    def switch_up(self, dp_id: int, ports: Iterable[int], down: Iterable[int], now: float) -> None:
        self.ports[dp_id] = {}
        self.set_ports(dp_id, ports, down, now)

    def switch_down(self, dp_id: int) -> bool:
        """Its links go; the far ends stay up, so they turn quiet. Whether a link went."""
        gone = [end for end in self.peer if end[0] == dp_id]
        self.ports.pop(dp_id, None)
        self.settle_by.pop(dp_id, None)
        self.touched.discard(dp_id)
        self.unprobed.discard(dp_id)
        return self._cut(gone)

    def set_ports(self, dp_id: int, ports: Iterable[int], down: Iterable[int], now: float) -> bool:
        """The switch's ports now, and which of them are down. Whether a link went."""
        states = self.ports.get(dp_id)
        if states is None:
            return False
        up = set(ports) - set(down)
        gone = [(dp_id, p) for p, state in states.items() if state.up and p not in up]
        for port_no in set(states) - set(ports):
            del states[port_no]
        for port_no in ports:
            state = states.get(port_no)
            if state is None or state.up != (port_no in up):
                states[port_no] = PortState(port_no in up, now)
                self._touch(dp_id)
        return self._cut([end for end in gone if end in self.peer])

    def role(self, end: End, now: float) -> Role:
        state = self.ports.get(end[0], {}).get(end[1])
        if state is None or not state.up:
            return Role.DOWN
        if end in self.peer:
            return Role.LINK
        if state.quiet:
            return Role.QUIET
        settled = state.first_probed is not None and now - state.first_probed >= EDGE_SETTLE
        return Role.EDGE if settled else Role.NEW

    def roles(self, dp_id: int, now: float) -> dict[int, Role]:
        return {p: self.role((dp_id, p), now) for p in self.ports.get(dp_id, {})}

    # --- probes ------------------------------------------------------------------------------------------
    def to_probe(self, dp_id: int, now: float) -> list[int]:
        """The ports of `dp_id` due a probe now; each is marked as probed. A switch whose ports are all edge or
        down is passed over (`unprobed`) until one of them changes: an edge port turns into nothing else by time
        alone, and looking at 10,000 such ports four times a second was a tenth of the controller's work."""
        due, probing = [], False
        for port_no, state in self.ports.get(dp_id, {}).items():
            if self.role((dp_id, port_no), now) in (Role.DOWN, Role.EDGE):
                continue
            probing = True
            if now - state.probed >= PROBE_SECONDS / 2:
                state.probed = now
                self._probed(dp_id, state, now)
                due.append(port_no)
        if not probing and dp_id in self.ports:
            self.unprobed.add(dp_id)
        return due

    def _touch(self, dp_id: int) -> None:
        """One of the switch's ports changed (up, down, a link found or lost on it)."""
        self.touched.add(dp_id)
        self.unprobed.discard(dp_id)

    def _probed(self, dp_id: int, state: PortState, now: float) -> None:
        if state.first_probed is None and state.up:
            state.first_probed = now
            self.settle_by[dp_id] = now + EDGE_SETTLE

    def heard(self, probe: Probe, at: End, now: float, wall_ms: int) -> bool:
        """A genuine frame of ours, received on `at`; whether it made or moved a link."""
        since = wall_ms - probe.sent_ms
        if not 0 <= since + 100 <= PROBE_MAX_AGE_MS:    # 0.1 s of slack for clocks read at other moments
            return self._refuse("stale")
        if probe.nonce in self._nonces:
            return self._refuse("replayed")
        self._nonces[probe.nonce] = probe.sent_ms
        if len(self._nonces) > _NONCES_KEPT:
            del self._nonces[next(iter(self._nonces))]
        src = (probe.dp_id, probe.port_no)
        if src == at or Role.DOWN in (self.role(src, now), self.role(at, now)):
            return self._refuse("not between two live ports")
        for state in self.ports[probe.dp_id].values():     # its switch is probed, by us or its owner
            self._probed(probe.dp_id, state, now)
        key = min(src, at)
        self.newest = max(self.newest, probe.sent_ms)
        if self.peer.get(at) == src:
            self.seen[key] = max(self.seen[key], probe.sent_ms)
            return False
        self._cut([end for end in (src, at) if end in self.peer])    # re-cabled: the old links go
        self.peer[src], self.peer[at] = at, src
        self.seen[key] = probe.sent_ms
        LOG.info("link %016x:%d - %016x:%d found", *src, *at)
        for dp, port in (src, at):
            self.ports[dp][port].quiet = False
            self._touch(dp)
        self.version += 1
        return True

    def expire(self, wall_ms: int) -> bool:
        """Links gone silent go (their ports turn quiet); whether one did."""
        silent = [end for end, sent in self.seen.items()
                  if self.newest - sent >= LINK_TIMEOUT * 1000 or wall_ms - sent > LINK_LOST * 1000]
        for end in silent:
            LOG.info("link %016x:%d - %016x:%d silent: lost", *end, *self.peer[end])
        return self._cut(silent)

    def _refuse(self, why: str) -> bool:
        self.refused[why] = self.refused.get(why, 0) + 1
        return False

    def _cut(self, ends: list[End]) -> bool:
        for end in ends:
            other = self.peer.pop(end, None)
            if other is None:
                continue
            del self.peer[other]
            self.seen.pop(min(end, other), None)
            for dp, port in (end, other):
                state = self.ports.get(dp, {}).get(port)
                if state is not None and state.up:
                    state.quiet = True
                    self._touch(dp)
        if ends:
            self.version += 1
        return bool(ends)

    # --- the graph -----------------------------------------------------------------------------------------
    def graph(self) -> dict[int, list[tuple[int, int, int]]]:
        """Switch → its live links as (port, the switch at the other end, its port), in port order."""
        near: dict[int, list[tuple[int, int, int]]] = {dp: [] for dp in self.ports}
        for (dp, port), (other, their_port) in sorted(self.peer.items()):
            near[dp].append((port, other, their_port))
        return near
