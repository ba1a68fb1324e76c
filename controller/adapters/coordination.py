"""This controller as a member of its owner's cluster in etcd ([coordination] backend_url =
etcd3+http://HOST:2379): the loop that ties the parts together and hands their outcomes to the core as events
(controller/core/cluster.py decides; the parts only read and write).

Keys, under /ovs-qos/<owner>/: member/<member>, lease/<member>, unreachable/<member> and sync/<member>, each on
that member's lease (membership.py), and cut/<member> while its OVSDB session is down (liveness.py);
switch/<datapath id>, the member that owns the switch, on its lease too (claims.py); policy, the policy in force
for the whole cluster (register.py); base, seeded and reseeded/<member>, which carry the cluster's revisions
across etcd losing its data (recovery.py); probe-key, what the members sign their discovery frames with
(keys.py).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from typing import Any, assert_never

from controller.adapters import keys
from controller.adapters.claims import Claims
from controller.adapters.etcd import CoordinationError, Gateway, text, why
from controller.adapters.liveness import Liveness, directory
from controller.adapters.membership import REFRESH_SECONDS, Membership
from controller.adapters.peers import PeerWatch
from controller.adapters.recovery import Recovery
from controller.adapters.register import Register
from controller.compat import hub
from controller.core import actions as act
from controller.core import events as ev
from controller.core.keeper import SAVED_ABSENT, SAVED_CLEARED, SAVED_POLICY

LOG = logging.getLogger(__name__)
COALESCE_SECONDS = 0.02    # after a watch wakes the loop: changes arriving this soon are read with it

__all__ = ["Coordination", "CoordinationError"]


class Coordination:
    def __init__(self, url: str, owner: str, member: str, lease: int, ovsdb: str | None = None):
        """`lease`: seconds a member's keys outlive its last refresh ([coordination] membership_timeout); `ovsdb`:
        the remote on which the members watch each other's sessions (controller/adapters/peers.py)."""
        self.member, self.prefix = member, f"/ovs-qos/{owner}/"
        gateway = Gateway(url, max(1, lease // 3))
        self._gateway = gateway
        self.membership = Membership(gateway, self.prefix, member, lease)
        self.register = Register(gateway, self.prefix, lambda: self.recovery.base)
        self.recovery = Recovery(gateway, self.prefix, self.register, self.membership)
        self.claims = Claims(gateway, self.prefix, member, lambda: self.membership.lease, lambda: self.recovery.base,
                             lambda: self.membership.expired)
        self._liveness: Liveness | None = None
        self._peers: PeerWatch | None = None
        if ovsdb:
            self._liveness = Liveness(gateway.poster(), self.prefix, owner, member, lambda: self.membership.lease,
                                      directory(ovsdb))
            self._peers = PeerWatch(ovsdb, owner, member, self._liveness, probe=lease)
        self._wake = hub.Event()                               # the loop reads (and tells) at once
        self._read_at = -REFRESH_SECONDS                       # when the cluster was last read on the second
        self._outside = False                                  # out of the group until the first OVSDB hears us

    def connect(self) -> None:
        """Our lease taken and the group joined on it, and the watch over our peers started."""
        self.membership.start()
        self.membership.tell()
        if self._peers is not None:
            self._peers.start()

    @property
    def connected(self) -> bool:
        return bool(self.membership.lease)

    # --- the loop: outcomes as the core's events -----------------------------------------------------------
    def run(self, post: Callable[[ev.Event], None]) -> None:
        """Our lease refreshed each second; the cluster read then and as soon as etcd's watch says a member or a
        key of ours changed (a member gone, its keys expired, a policy stored: acted on within milliseconds,
        not at the next second), and posted for the core, which decides what follows. etcd down (at start or
        later) is tried again every second, said once, and changes nothing on a switch."""
        watches: list[Any] = []
        failing: str | None = None
        try:
            while True:
                failing = self._turn(post, failing, watches)
                if self._wake.wait(timeout=max(0.0, REFRESH_SECONDS - (time.monotonic() - self._read_at))):
                    hub.sleep(COALESCE_SECONDS)          # a burst of changes (claims, expiries) is read once
                self._wake.clear()
        finally:
            for watch in watches:
                hub.kill(watch)

    def _turn(self, post: Callable[[ev.Event], None], failing: str | None, watches: list[Any]) -> str | None:
        """One pass: connect if need be, take the keepalive's word on our lease (a new one if it ran out), say our
        keys, read the cluster and post it; what failed (None: nothing)."""
        sent = time.monotonic()
        if sent - self._read_at >= REFRESH_SECONDS:
            self._read_at = sent                 # read again a second later, whatever follows
        try:
            if not self.connected:
                self.connect()
            if failing is not None or not watches:       # a watch may hang on a cut connection: made anew
                for watch in watches:
                    hub.kill(watch)
                watches[:] = [hub.spawn(self._watch)]
            refreshed = self.membership.refresh()
            if refreshed is None:
                LOG.info("etcd: our lease was gone (it ran out, or a peer revoked it); a new one taken")
            if self._peers is not None and self._liveness is not None and self._peers.own_held:
                # What a peer revokes when we die: said only while we hold our lock (peers.py), after our file
                # beside the OVSDB socket names it (liveness.py).
                self._liveness.mark(self.membership.lease)
                self.membership.say("lease", self.membership.lease)
            self.membership.tell()
            cluster = self.read()
            assert cluster.members is not None
            self._join(cluster.members)
            if self.recovery.recovering():
                post(ev.ClusterChanged(None, {}, 0, None, None))     # no switch changed meanwhile, as with etcd down
                return failing
            post(dataclasses.replace(cluster, refreshed_at=refreshed, restored=self.recovery.restored,
                                     probe_key=cluster.probe_key or keys.probe_key(self._gateway, self.prefix)))
            if failing is not None:
                LOG.info("etcd answers again; member %s", self.member)
            return None
        except CoordinationError as err:
            if failing != str(err):
                LOG.error("etcd: %s; this member changes no switch until it answers (tried every second)", err)
            post(ev.ClusterChanged(None, {}, 0, None, None))
            return str(err)

    def _join(self, members: tuple[str, ...]) -> None:
        """Our membership key said again when it is gone, unless the others took us for dead because our session
        with the first OVSDB closed (peers.py): we join again once it is back, rather than claim switches only to
        give them up again."""
        if self._peers is not None:
            self._peers.peers = frozenset(members)
        if self.member in members:
            return
        if self._peers is not None and not self._peers.own_held:
            if not self._outside:
                LOG.warning("etcd: member %s is out of the group and its first OVSDB does not hear it; joining again "
                            "once it does", self.member)
            self._outside = True
            self.membership.say("member", None)
            return
        LOG.warning("etcd: member %s was out of the group; joining again", self.member)
        self._outside = False
        self.membership.say("member", "")
        self.membership.forget("member")
        self.membership.tell()

    def read(self) -> ev.ClusterChanged:
        """The cluster as etcd holds it now (keys.py), the base settled first if need be (recovery.py)."""
        return keys.read(self._gateway, self.prefix, self.register, self.recovery)

    def _watch(self) -> None:
        """Wake the loop at each change etcd reports under our prefix that calls for a read now (and once the watch
        is made, for what changed before it); a watch that fails is made again a second later."""
        while True:
            try:
                with self._gateway.watch(self.prefix) as lines:
                    for line in lines:
                        if line and wakes(line, f"{self.prefix}switch/"):
                            self._wake.set()     # "created" first, then each batch of events
            except Exception as err:   # noqa: BLE001 - the second's pass reads anyway; the watch only hastens it
                LOG.debug("etcd: watch on %s ended: %s", self.prefix, why(err))
            hub.sleep(REFRESH_SECONDS)

    # --- as the app uses it -----------------------------------------------------------------------------------
    def execute(self, action: act.ClaimSwitch | act.ReleaseSwitch | act.Unreachable | act.PublishSync,
                post: Callable[[ev.Event], None]) -> None:
        """A cluster's action of the core's: etcd's round trips in greenthreads of their own (a claim's outcome
        posted as events.SwitchClaimed), what other members are told written with the next pass."""
        match action:
            case act.ClaimSwitch():
                self.claims.ask(action, post)
            case act.ReleaseSwitch():
                hub.spawn(self.claims.release, action.dp_id, action.revision)
            case act.Unreachable():
                LOG.warning("switches whose OVSDB this member cannot reach, left to members that can: %s",
                            ", ".join(f"{dp:016x}" for dp in sorted(action.dp_ids)) or "none now")
                self.membership.say("unreachable", sorted(action.dp_ids) or None)
            case act.PublishSync():
                self.membership.say("sync", {"revision": action.sync.revision, "switches": {
                    f"{dp:016x}": held for dp, held in action.sync.switches.items()}})
                self._wake.set()                                   # written at once
            case _:
                assert_never(action)

    def turned(self) -> None:
        """The core handled an event (the app says so after each): the keepalive may go on refreshing."""
        self.membership.turned()

    def confirmed(self, now: float) -> bool:
        return self.membership.confirmed(now)

    def policy_loaded(self) -> ev.PolicyLoaded:
        """The cluster's policy, if etcd answers now (else it comes with etcd's first answer)."""
        try:
            if not self.connected:
                self.connect()
            policy = self.read().policy
        except CoordinationError as err:
            return ev.PolicyLoaded(SAVED_ABSENT, error=f"etcd: {err}; the cluster's policy is put in force once "
                                                       "etcd answers")
        if policy is None:
            return ev.PolicyLoaded(SAVED_ABSENT)
        return ev.PolicyLoaded(SAVED_CLEARED if policy[1] is None else SAVED_POLICY, policy[1], revision=policy[0])

    def policy_saved(self, document: Any, revision: int = 0, expect: int | None = None) -> ev.PolicySaved:
        """`revision` is etcd's to give, not ours."""
        try:
            return self.register.save(document, expect)
        except CoordinationError as err:
            return ev.PolicySaved(f"etcd: {err}", indeterminate=err.unknown)

    def current_policy(self) -> tuple[Any, int]:
        if not self.connected:
            raise CoordinationError("not connected to etcd")
        return self.register.current()

    def leave(self) -> None:
        """A clean stop: our lease revoked first, as a peer revokes a dead member's (peers.py): our membership and
        our switches' keys go together, and the others claim our switches at their next read."""
        if not self.connected:
            return
        try:
            self.membership.leave()
            LOG.info("etcd: member %s left (its lease revoked): its switches are the others' to claim", self.member)
        except CoordinationError as err:
            LOG.warning("etcd: could not leave the group cleanly (%s); our keys expire with our lease", err)
        if self._peers is not None:
            self._peers.stop()
        self.membership.lease = 0


def wakes(line: bytes, claims: str) -> bool:
    """Whether a line of etcd's watch calls for a read at once: anything but switches claimed (keys under `claims`
    put), which only the ring's owner does, and the second's read sees soon enough. A take-over of a hundred
    switches would otherwise have each member read the cluster again while its own switches' role replies wait."""
    try:
        events = json.loads(line).get("result", {}).get("events", [])
    except ValueError:
        return True
    return not events or any(event.get("type") == "DELETE" or not text(event["kv"]["key"]).startswith(claims)
                             for event in events)
