"""Who among the controllers of one owner may change the switches, and the proof they carry.

The active controller holds its owner's lock in the first OVSDB remote (or has no standby); it claims
OpenFlow mastership with a generation id newer than every one a switch has seen, claimed in OVSDB under
that lock (actions.ClaimGeneration), so a switch refuses the requests of any controller deposed before
it. The holder writes a heartbeat every second (actions.Beat); a standby that sees it stand still for
TAKEOVER_SECONDS (a holder hung, or stopped, with its OVSDB session still open) steals the lock
(actions.StealLock). Pure: the I/O is the app's, its outcome an event.

Holding the lock is a belief until OVSDB confirms it: a heartbeat is a transaction that asserts the lock,
so one that commits proves the lock was ours when it was sent. The holder of a pair writes (flows, jobs,
the saved policy) and answers as the active one only within LEASE_SECONDS of the last heartbeat OVSDB
confirmed, measured from when it was sent. A holder cut off from OVSDB, or paused and resumed, stops by
its own clock LEASE_SECONDS after its last confirmed beat, before a standby can have stolen the lock
(TAKEOVER_SECONDS of a still heartbeat) or been given it (OVSDB drops a silent session only after its
inactivity probe, longer than the lease).
"""
from __future__ import annotations

import logging

from controller.core import actions as act
from controller.core import events as ev
from controller.core.cluster import Cluster
from controller.core.view import Role

LOG = logging.getLogger("qos")
TAKEOVER_SECONDS = 8.0    # a standby steals the lock from an active one whose heartbeat stood still this long
REPORT_GAP_SECONDS = 3.0  # the remotes are reported every second: a longer gap is time the standby did not run
LEASE_SECONDS = 3.0       # the holder writes only this long after its last heartbeat OVSDB confirmed
PATH_SILENT_SECONDS = 2.5 # OVSDB silent this long to a standby that probes it every second: its path is stalled


class Authority:
    def __init__(self, active: bool, standby: bool, cluster: Cluster | None = None):
        """`standby`: this controller is one of a pair, so only the lock's holder is active. `cluster`: it is
        a member of a cluster that shares the switches: each is this member's only while it owns it."""
        self.role = Role.ACTIVE if active else Role.STANDBY
        self.standby, self.cluster = standby, cluster
        self.generation = 0                       # ours as master; 0 until claimed
        self.claiming = False                     # a claim in flight
        self.above = -1                           # what the next claim must be newer than (-1: none wanted)
        self._beat: tuple[int, float] | None = None   # the holder's heartbeat last seen, and since when
        self._watched_at = float("-inf")              # the standby's last report of it
        self.confirmed_at: float | None = None        # when the last heartbeat OVSDB confirmed was sent

    @property
    def active(self) -> bool:
        return self.role is Role.ACTIVE

    def confirmed(self, now: float) -> bool:
        """Whether this controller may write and speak as the active one now (alone, it always may)."""
        if self.cluster is not None:
            return self.cluster.confirmed(now)
        return self.active and (not self.standby or self.confirmed_at is not None
                                and now - self.confirmed_at < LEASE_SECONDS)

    def owns(self, dp_id: int) -> bool:
        """Whether the switch is this controller's to poll and master."""
        return self.active and (self.cluster is None or self.cluster.owns(dp_id))

    def generation_of(self, dp_id: int) -> int:
        """The generation id to claim the switch's mastership with (0: none yet)."""
        if self.cluster is not None:
            return self.cluster.mine.get(dp_id, 0)
        return self.generation

    def epoch_of(self, dp_id: int) -> int:
        """What OVSDB must not hold a newer epoch than for our writes to the switch: a cluster member's claim, a
        standby pair's generation id (claimed under the pair's lock, above every epoch on a bridge), so that tc,
        which no lock guards, is fenced for both alike (0: no condition; alone, there is no one to fence)."""
        if self.cluster is not None:
            return self.cluster.mine.get(dp_id, 0)
        return self.generation if self.standby else 0

    def label(self, now: float) -> str:
        """What the status and the metrics say: only a confirmed fact is `active`."""
        if self.cluster is not None:
            return "member" if self.confirmed(now) else "coordination lost"
        return str(self.role) if self.confirmed(now) or not self.active else "unconfirmed"

    def beaten(self, beat: ev.Beaten) -> None:
        if beat.ok and self.active:
            self.confirmed_at = max(self.confirmed_at or beat.at, beat.at)

    def need(self, dp_id: int, above: int) -> list[act.Action]:
        """A switch has seen `above`: claim a newer id, once no claim is in flight."""
        if self.cluster is not None:
            return self.cluster.renew(dp_id, above)
        self.above = max(self.above, above)
        if self.claiming or not self.active:
            return []
        self.claiming = True
        above, self.above = max(self.above, self.generation), -1
        return [act.ClaimGeneration(above)]

    def claimed(self, generation: int | None) -> list[act.Action]:
        """A claim's outcome; another claim when a switch has seen a newer id meanwhile."""
        self.claiming = False
        if generation is None or not self.active:
            return []
        LOG.info("OpenFlow master with generation id %d", generation)
        self.generation = generation
        return self.need(0, self.above) if self.above > generation else []

    def watch(self, change: ev.RemotesChanged, now: float) -> list[act.Action]:
        """Each report of the remotes: the holder's heartbeat, or the standby's watch over it."""
        if not self.standby:
            return []
        if change.locked:
            self._beat = None
            return [act.Beat(now)]
        if not change.taken:
            self._beat = None
            return []
        # A gap between reports is time this standby did not run (stopped, starved): what it holds of the heartbeat
        # may be as old as the gap, so the stillness is watched afresh rather than taken from before it. So is
        # a silence of OVSDB's (probed every second): our path to it may be stalled, not the holder dead.
        stale = now - self._watched_at > REPORT_GAP_SECONDS or change.silent > PATH_SILENT_SECONDS
        self._watched_at = now
        if self._beat is None or self._beat[0] != change.heartbeat or stale:
            self._beat = (change.heartbeat, now)
        elif now - self._beat[1] >= TAKEOVER_SECONDS:
            LOG.warning("the active controller's heartbeat has stood still for %.0f s; taking its lock",
                        now - self._beat[1])
            self._beat = None
            return [act.StealLock()]
        return []

    def take_over(self) -> None:
        self.role = Role.ACTIVE
        self.generation = 0           # claimed anew, above every switch's
        self.above = -1
        self.confirmed_at = None

    def stand_down(self) -> None:
        self.role = Role.STANDBY
        self.above = -1
        self.confirmed_at = None
