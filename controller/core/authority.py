"""A controller alone, or one of an active/standby pair (two of the ways controller/core/ha.py names): which
of the controllers of one owner may change the switches, and the proof they carry.

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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from controller.core import actions as act
from controller.core import events as ev
from controller.core.ha import Handover
from controller.core.peers import Peers, Sole
from controller.core.view import Role

if TYPE_CHECKING:
    from controller.core.switch import Switch

LOG = logging.getLogger("qos")
TAKEOVER_SECONDS = 8.0    # a standby steals the lock from an active one whose heartbeat stood still this long
REPORT_GAP_SECONDS = 3.0  # the remotes are reported every second: a longer gap is time the standby did not run
LEASE_SECONDS = 3.0       # the holder writes only this long after its last heartbeat OVSDB confirmed
PATH_SILENT_SECONDS = 2.5 # OVSDB silent this long to a standby that probes it every second: its path is stalled


class Alone:
    """The only controller of its owner: active while it holds the lock (from the start: it has no standby to wait
    for), the generation id it claims under it its proof; it shares nothing and fences no one."""
    shares = False

    def __init__(self, active: bool = True):
        self.role = Role.ACTIVE if active else Role.STANDBY
        self.generation = 0                       # ours as master; 0 until claimed
        self.claiming = False                     # a claim in flight
        self.above = -1                           # what the next claim must be newer than (-1: none wanted)

    @property
    def active(self) -> bool:
        return self.role is Role.ACTIVE

    def confirmed(self, now: float) -> bool:
        """Alone, it may write whenever it is active."""
        return self.active

    def owns(self, dp_id: int) -> bool:
        return self.active

    def generation_of(self, dp_id: int) -> int:
        return self.generation

    def epoch_of(self, dp_id: int) -> int:
        """Alone, there is no one to fence: no condition."""
        return 0

    def label(self, now: float) -> str:
        """Only a confirmed fact is `active`."""
        return str(self.role) if self.confirmed(now) or not self.active else "unconfirmed"

    def refusal(self, now: float, owner: str) -> str | None:
        if not self.active:
            return f"this controller is the standby of owner {owner}: send changes to the active one"
        if not self.confirmed(now):
            return (f"this controller of owner {owner} has not confirmed within {LEASE_SECONDS:g} s that it still "
                    "holds its owner's OVSDB lock; try again, or send the change to the other one")
        return None

    def beaten(self, beat: ev.Beaten) -> None:
        """Alone, it beats no heartbeat."""

    def need(self, dp_id: int, above: int) -> list[act.Action]:
        """A switch has seen `above`: claim a newer id, once no claim is in flight."""
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
        """Alone, no heartbeat to write or watch."""
        return []

    def take_over(self) -> None:
        self.role = Role.ACTIVE
        self.generation = 0           # claimed anew, above every switch's
        self.above = -1

    def stand_down(self) -> None:
        self.role = Role.STANDBY
        self.above = -1

    def coordinate(self, event: ev.ClusterChanged | ev.SwitchClaimed, now: float, switches: Mapping[int, Switch],
                   connected: Mapping[str, bool]) -> Handover:
        raise AssertionError("a coordination event without a cluster")

    def publish(self, held: dict[int, dict[str, Any]], revision: int) -> list[act.Action]:
        return []

    def peers(self) -> Peers:
        return Sole()

    def status(self) -> dict[str, Any]:
        return {}

    def about(self, dp_id: int) -> dict[str, Any]:
        return {}


class Pair(Alone):
    """One of an active/standby pair: the holder writes within a lease of its last confirmed heartbeat, and the
    standby steals the lock of one whose heartbeat stood still."""

    def __init__(self, active: bool):
        super().__init__(active)
        self._beat: tuple[int, float] | None = None   # the holder's heartbeat last seen, and since when
        self._watched_at = float("-inf")              # the standby's last report of it
        self.confirmed_at: float | None = None        # when the last heartbeat OVSDB confirmed was sent

    def confirmed(self, now: float) -> bool:
        """Whether this controller may write and speak as the active one now."""
        return self.active and self.confirmed_at is not None and now - self.confirmed_at < LEASE_SECONDS

    def epoch_of(self, dp_id: int) -> int:
        """The pair's generation id (claimed under the pair's lock, above every epoch on a bridge), so that tc,
        which no lock guards, is fenced as a cluster's is."""
        return self.generation

    def beaten(self, beat: ev.Beaten) -> None:
        if beat.ok and self.active:
            self.confirmed_at = max(self.confirmed_at or beat.at, beat.at)

    def watch(self, change: ev.RemotesChanged, now: float) -> list[act.Action]:
        """Each report of the remotes: the holder's heartbeat, or the standby's watch over it."""
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
        super().take_over()
        self.confirmed_at = None

    def stand_down(self) -> None:
        super().stand_down()
        self.confirmed_at = None
