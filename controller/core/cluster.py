"""Several active controllers of one owner sharing the switches, through a coordination service (etcd,
reached by controller/adapters/coordination.py): who should own each switch, who does, and whether this
member may write to the switches it owns.

The members are a group in etcd, each on a lease it refreshes. The ring (Ring) is the intent: rendezvous
hashing over the members names each switch's owner, and when a member joins or leaves only the switches
it gains or had move, about 1/N of them. A member enters the ring only once it has been seen for
HOLD_DOWN_SECONDS, so one that flaps moves nothing. The ring is not authority: a member owns a switch
only once it has won an etcd transaction that creates the switch's ownership key on its own lease
(actions.ClaimSwitch); the key's revision, which only grows, is the OpenFlow generation id it claims
master with, so a switch refuses a member deposed before it. A member hands a switch the ring gives
another back by deleting its key. Each member tells the others what its switches hold of the cluster's
policy (actions.PublishSync), so that any member can answer a change for all of them.

A member that cannot reach a switch's OVSDB for a lease time says so in etcd (actions.Unreachable); the ring
passes over a member for the switches it cannot reach, so the next member that can takes them.

A member writes only while its lease is confirmed: within SAFE_SHARE of the lease time of the last
refresh etcd answered, measured from when it was sent. Its keys live until a lease time after etcd last
saw a refresh, so a member cut off from etcd, or paused, stops writing before another can claim its
switches. Pure: the I/O is the app's, each outcome an event.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from controller.core import actions as act
from controller.core import events as ev
from controller.core.peers import Shared

HOLD_DOWN_SECONDS = 3.0     # a new member enters the ring after this long: a flapping one moves nothing
SAFE_SHARE = 0.5            # a member writes within this share of its lease after its last confirmed refresh


def within_safe_share(confirmed_at: float | None, lease: float, now: float) -> bool:
    """Whether a lease last confirmed at `confirmed_at` still lets its holder write at `now`."""
    return confirmed_at is not None and now - confirmed_at < SAFE_SHARE * lease


class Ring:
    """Rendezvous (highest random weight) hashing: a switch belongs to the member whose hash with it is the
    highest. Each switch's share is an independent draw, so the members' shares are as even as hashing
    allows (a ring of points adds the unevenness of its arcs: 64 md5 points a member gave one of three 38 %
    of 1000 switches), and a member that joins takes only the switches it now wins, one that leaves gives
    up only its own: about 1/N of them either way."""

    def __init__(self, members: Sequence[str]):
        self._members = sorted(set(members))

    @property
    def members(self) -> list[str]:
        return list(self._members)

    def owner(self, dp_id: int, skip: frozenset[str] = frozenset()) -> str | None:
        """The member the switch belongs to, passing over `skip` (unless that is everyone)."""
        candidates = [m for m in self._members if m not in skip] or self._members
        return max(candidates, key=lambda member: _hash(f"{dp_id:016x}/{member}"), default=None)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.md5(text.encode(), usedforsecurity=False).digest()[:8], "big")


class Cluster:
    def __init__(self, me: str, lease: float):
        self.me, self.lease = me, lease
        self.seen: dict[str, float] = {}              # member → since when it is in the group
        self.ring = Ring([me])
        self.owners: dict[int, str] = {}              # switch → its owner, as etcd said at the last report
        self.mine: dict[int, int] = {}                # switches this member owns → its key's revision
        self.claiming: set[int] = set()               # claims in flight
        self.confirmed_at: float | None = None        # when the last refresh etcd answered was sent
        self.unreachable: dict[str, frozenset[int]] = {}   # member → switches it cannot reach, as etcd said
        # Since when we cannot reach a switch: ("ovsdb", dp) its OVSDB, ("openflow", dp) one we own over OpenFlow.
        self.since: dict[tuple[str, int], float] = {}
        self.cut: frozenset[int] = frozenset()        # those we told the others of
        self.sync: dict[str, ev.MemberSync] = {}      # member → what it says it holds, as etcd said
        self.published: ev.MemberSync | None = None   # what we last told the others we hold
        self.restored: str | None = None              # the last time etcd lost its data, as this member recovered

    def confirmed(self, now: float) -> bool:
        return within_safe_share(self.confirmed_at, self.lease, now)

    def owns(self, dp_id: int) -> bool:
        return dp_id in self.mine

    def report(self, report: ev.ClusterChanged, now: float, switches: Iterable[int]) -> tuple[list[act.Action],
                                                                                              set[int]]:
        """The coordination service's state: the claims and hand-offs it calls for among `switches` (the
        connected ones), and the switches this member no longer owns."""
        if report.refreshed_at is not None:
            self.confirmed_at = max(self.confirmed_at or report.refreshed_at, report.refreshed_at)
        if report.members is None:     # etcd did not answer: nothing is known anew
            return [], set()
        self.restored = report.restored or self.restored
        # Members there at our first look are established; only those that join later are held down.
        first = not self.seen
        self.seen = {m: self.seen.get(m, now - HOLD_DOWN_SECONDS if first else now) for m in report.members}
        self.ring = Ring(sorted({m for m, since in self.seen.items() if now - since >= HOLD_DOWN_SECONDS} | {self.me}))
        self.owners = dict(report.owners)
        self.unreachable = dict(report.unreachable)
        self.sync = dict(report.sync)
        # A key of ours that etcd no longer holds (our lease ran out) is not ours, unless claimed since the read.
        lost = {dp for dp, revision in self.mine.items()
                if self.owners.get(dp) != self.me and revision <= report.revision}
        for dp in lost:
            del self.mine[dp]
        actions: list[act.Action] = []
        switches = set(switches)
        # A switch we own but have not reached over OpenFlow for a lease: given up, so that a member that
        # reaches it can take it (our key would otherwise keep it ours for as long as we live).
        self._since("openflow", (dp for dp in self.mine if dp not in switches), now)
        given_up = self._given_up("openflow", now)
        for dp in given_up:
            actions.append(self._release(dp, report))
            del self.since[("openflow", dp)]
        lost |= given_up
        for dp in (switches | {dp for dp, owner in self.owners.items() if owner == self.me}) - given_up:
            intended = self.intended(dp)
            if dp in self.mine:
                if dp in switches and intended != self.me:
                    actions.append(self._release(dp, report))      # handed to the member the ring names
                    lost.add(dp)
            elif dp in self.claiming:
                continue
            elif dp in switches and intended == self.me and self.owners.get(dp) in (None, self.me):
                # A key of ours we do not know of is a claim whose answer was lost: put it again, for its revision.
                self.claiming.add(dp)
                actions.append(act.ClaimSwitch(dp, renew=dp in self.owners))
            elif self.owners.get(dp) == self.me:
                # The same, for a switch the ring now gives another member (or not connected to us): neither we
                # nor that member would master it while our key holds it.
                actions.append(self._release(dp, report))
        return actions, lost

    def _release(self, dp_id: int, report: ev.ClusterChanged) -> act.ReleaseSwitch:
        """Our key given up: at our claim's revision, or, for a key of ours we did not know of, at the one etcd
        showed (a renewal of ours whose answer was lost leaves an older one here: released at the next report)."""
        return act.ReleaseSwitch(dp_id, self.mine.pop(dp_id, 0) or report.revisions.get(dp_id, 0))

    def intended(self, dp_id: int) -> str | None:
        return self.ring.owner(dp_id, frozenset(m for m, cut in self.unreachable.items() if dp_id in cut))

    def reach(self, cut: Iterable[int], now: float) -> list[act.Action]:
        """`cut`: the switches whose OVSDB this member cannot reach now. Those cut for a lease time are told to
        the others (a moment's reconnection moves nothing); one reached again, at once."""
        self._since("ovsdb", cut, now)
        given_up = self._given_up("ovsdb", now)
        if given_up == self.cut:
            return []
        self.cut = given_up
        return [act.Unreachable(given_up)]

    def _since(self, what: str, switches: Iterable[int], now: float) -> None:
        self.since = {key: t for key, t in self.since.items() if key[0] != what} | \
            {(what, dp): self.since.get((what, dp), now) for dp in switches}

    def _given_up(self, what: str, now: float) -> frozenset[int]:
        """Those unreached for a lease time: a moment's reconnection moves nothing."""
        return frozenset(dp for (kind, dp), t in self.since.items() if kind == what and now - t >= self.lease)

    def claimed(self, claim: ev.SwitchClaimed) -> bool:
        """A claim's outcome; whether this member owns the switch now."""
        self.claiming.discard(claim.dp_id)
        if claim.revision is None:
            return False
        self.mine[claim.dp_id] = claim.revision
        self.owners[claim.dp_id] = self.me
        return True

    def renew(self, dp_id: int, above: int) -> list[act.Action]:
        """The switch has seen a generation id not older than our key's: put the key again, for a newer one."""
        if dp_id not in self.mine or self.mine[dp_id] > above or dp_id in self.claiming:
            return []
        self.claiming.add(dp_id)
        return [act.ClaimSwitch(dp_id, renew=True)]

    def shared(self) -> Shared:
        """The cluster as a change's answer sees it."""
        return Shared(self.me, {dp: owner for dp, owner in self.owners.items() if owner != self.me}, self.sync)

    def publish(self, held: dict[int, dict[str, Any]], revision: int) -> list[act.Action]:
        """`held`: what the switches we own hold of the policy in force, at `revision`; told to the others when it
        changed."""
        sync = ev.MemberSync(revision, held)
        if sync == self.published:
            return []
        self.published = sync
        return [act.PublishSync(sync)]

    def status(self) -> dict[str, object]:
        return {"member": self.me, "members": sorted(self.seen), "ring": self.ring.members,
                **({"etcd_restored": self.restored} if self.restored else {})}
