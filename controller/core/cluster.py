"""Several active controllers of one owner sharing the switches, through a coordination service (etcd,
reached by controller/adapters/coordination.py): who should own each switch, who does, and whether this
member may write to the switches it owns.

The members are a group in etcd, each on a lease it refreshes. A consistent hash ring over the members
(Ring) is the intent: it names each switch's owner, and when a member joins or leaves only about 1/N of
the switches move. A member enters the ring only once it has been seen for HOLD_DOWN_SECONDS, so one that
flaps moves nothing. The ring is not authority: a member owns a switch only once it has won an etcd
transaction that creates the switch's ownership key on its own lease (actions.ClaimSwitch); the key's
revision, which only grows, is the OpenFlow generation id it claims master with, so a switch refuses a
member deposed before it. A member hands a switch the ring gives another back by deleting its key.

A member that cannot reach a switch's OVSDB for a lease time says so in etcd (actions.Unreachable); the ring
passes over a member for the switches it cannot reach, so the next member that can takes them.

A member writes only while its lease is confirmed: within SAFE_SHARE of the lease time of the last
refresh etcd answered, measured from when it was sent. Its keys live until a lease time after etcd last
saw a refresh, so a member cut off from etcd, or paused, stops writing before another can claim its
switches. Pure: the I/O is the app's, each outcome an event.
"""
from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence

from controller.core import actions as act
from controller.core import events as ev

HOLD_DOWN_SECONDS = 3.0     # a new member enters the ring after this long: a flapping one moves nothing
SAFE_SHARE = 0.5            # a member writes within this share of its lease after its last confirmed refresh
POINTS = 64                 # points per member on the ring: the busiest of 10 holds about 1.2x the mean


class Ring:
    """A consistent hash ring (md5 points, as tooz's); a datapath id belongs to the next point."""

    def __init__(self, members: Sequence[str]):
        points = sorted((_hash(f"{member}/{i}"), member) for member in members for i in range(POINTS))
        self._hashes = [h for h, _ in points]
        self._members = [m for _, m in points]

    @property
    def members(self) -> list[str]:
        return sorted(set(self._members))

    def owner(self, dp_id: int, skip: frozenset[str] = frozenset()) -> str | None:
        """The member the switch belongs to: the next point's, passing over `skip` (unless that is everyone)."""
        if not self._hashes:
            return None
        start = bisect.bisect(self._hashes, _hash(f"{dp_id:016x}"))
        for k in range(len(self._hashes)):
            member = self._members[(start + k) % len(self._hashes)]
            if member not in skip:
                return member
        return self._members[start % len(self._hashes)]


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
        self.policy_revision = 0                      # the cluster's policy this member has in force
        self.unreachable: dict[str, frozenset[int]] = {}   # member → switches it cannot reach, as etcd said
        self.cut_since: dict[int, float] = {}         # switches whose OVSDB we cannot reach → since when
        self.cut: frozenset[int] = frozenset()        # those we told the others of

    def confirmed(self, now: float) -> bool:
        return self.confirmed_at is not None and now - self.confirmed_at < SAFE_SHARE * self.lease

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
        # Members there at our first look are established; only those that join later are held down.
        first = not self.seen
        self.seen = {m: self.seen.get(m, now - HOLD_DOWN_SECONDS if first else now) for m in report.members}
        self.ring = Ring(sorted({m for m, since in self.seen.items() if now - since >= HOLD_DOWN_SECONDS} | {self.me}))
        self.owners = dict(report.owners)
        self.unreachable = dict(report.unreachable)
        # A key of ours that etcd no longer holds (our lease ran out) is not ours, unless claimed since the read.
        lost = {dp for dp, revision in self.mine.items()
                if self.owners.get(dp) != self.me and revision <= report.revision}
        for dp in lost:
            del self.mine[dp]
        actions: list[act.Action] = []
        for dp in switches:
            intended = self.intended(dp)
            if dp in self.mine and intended != self.me:
                actions.append(act.ReleaseSwitch(dp))       # handed to the member the ring names
                del self.mine[dp]
                lost.add(dp)
            elif intended == self.me and dp not in self.owners and dp not in self.claiming | self.mine.keys():
                self.claiming.add(dp)
                actions.append(act.ClaimSwitch(dp, renew=False))
        return actions, lost

    def intended(self, dp_id: int) -> str | None:
        return self.ring.owner(dp_id, frozenset(m for m, cut in self.unreachable.items() if dp_id in cut))

    def reach(self, cut: Iterable[int], now: float) -> list[act.Action]:
        """`cut`: the switches whose OVSDB this member cannot reach now. Those cut for a lease time are told to
        the others (a moment's reconnection moves nothing); one reached again, at once."""
        cut = set(cut)
        self.cut_since = {dp: self.cut_since.get(dp, now) for dp in cut}
        given_up = frozenset(dp for dp, since in self.cut_since.items() if now - since >= self.lease)
        if given_up == self.cut:
            return []
        self.cut = given_up
        return [act.Unreachable(given_up)]

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

    def status(self) -> dict[str, object]:
        return {"member": self.me, "members": sorted(self.seen), "ring": self.ring.members}
