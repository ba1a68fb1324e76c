"""A member of a cluster (one of the ways controller/core/ha.py names): a switch is this member's while its
claim in etcd holds it (controller/core/cluster.py), the claim's revision its generation id and its epoch,
and it writes only while its lease is confirmed. It takes no OVSDB lock, so it is never a standby: it
gains and loses its switches one by one, as the coordination service's news says.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from controller.core import actions as act
from controller.core import events as ev
from controller.core.cluster import Cluster
from controller.core.ha import Handover
from controller.core.keeper import SAVED_CLEARED, SAVED_POLICY
from controller.core.peers import Peers

if TYPE_CHECKING:
    from controller.core.switch import Switch

LOG = logging.getLogger("qos")


class Member:
    shares = True

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    @property
    def active(self) -> bool:
        """Every member is active, for the switches it owns."""
        return True

    def owns(self, dp_id: int) -> bool:
        return self.cluster.owns(dp_id)

    def confirmed(self, now: float) -> bool:
        return self.cluster.confirmed(now)

    def generation_of(self, dp_id: int) -> int:
        """Our claim's revision, which only grows: a switch refuses a member deposed before us."""
        return self.cluster.mine.get(dp_id, 0)

    def epoch_of(self, dp_id: int) -> int:
        """Our claim's revision too, so that a deposed member's OVSDB and tc writes are fenced."""
        return self.cluster.mine.get(dp_id, 0)

    def label(self, now: float) -> str:
        return "member" if self.confirmed(now) else "coordination lost"

    def refusal(self, now: float, owner: str) -> str | None:
        if not self.confirmed(now):
            return ("coordination lost: this member has not reached etcd within its lease; try again, or send the "
                    "change to another member")
        return None

    def need(self, dp_id: int, above: int) -> list[act.Action]:
        return self.cluster.renew(dp_id, above)

    def claimed(self, generation: int | None) -> list[act.Action]:
        """A member claims switches (need: actions.ClaimSwitch), never a generation id of OVSDB's."""
        return []

    def beaten(self, beat: ev.Beaten) -> None:
        """A member beats no heartbeat: its lease is etcd's."""

    def watch(self, change: ev.RemotesChanged, now: float) -> list[act.Action]:
        return []

    def take_over(self) -> None:
        """No lock is ever ours (a member asks for none): its switches come by coordinate()."""

    def stand_down(self) -> None:
        """No lock is ever another's: its switches go by coordinate()."""

    def coordinate(self, event: ev.ClusterChanged | ev.SwitchClaimed, now: float, switches: Mapping[int, Switch],
                   connected: Mapping[str, bool]) -> Handover:
        cluster = self.cluster
        if isinstance(event, ev.SwitchClaimed):
            if cluster.claimed(event) and event.dp_id in switches:
                LOG.info("switch %016x is ours (ownership revision %d)", event.dp_id, event.revision)
                return Handover(ours=frozenset({event.dp_id}))
            return Handover()
        # Switches whose OVSDB we cannot reach: given up, so that a member that can reach it takes it.
        actions = cluster.reach((dp for dp, sw in switches.items() if sw.bridge is not None
                                 and not connected.get(sw.bridge.remote, False)), now)
        more, lost = cluster.report(event, now, switches)
        theirs = frozenset(lost & switches.keys())
        for dp_id in theirs:
            LOG.info("switch %016x is another member's now", dp_id)
        policy = None if event.policy is None else \
            ev.PolicyLoaded(SAVED_POLICY if event.policy[1] is not None else SAVED_CLEARED, event.policy[1],
                            revision=event.policy[0])
        return Handover(actions + more, theirs=theirs, probe_key=event.probe_key, policy=policy)

    def publish(self, held: dict[int, dict[str, Any]], revision: int) -> list[act.Action]:
        return self.cluster.publish(held, revision)

    def peers(self) -> Peers:
        return self.cluster.shared()

    def status(self) -> dict[str, Any]:
        return {"cluster": self.cluster.status()}

    def about(self, dp_id: int) -> dict[str, Any]:
        """Which member owns the switch, as etcd said."""
        return {"owner": self.cluster.owners.get(dp_id)}
