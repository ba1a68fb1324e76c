"""How this controller shares its owner's switches, chosen once at start: the one seam the controller
(controller/core/controller.py) asks through, never which of the three it has.

- Alone (controller/core/authority.py): the only controller of its owner, the OVSDB lock's holder.
- Pair (controller/core/authority.py): one of an active/standby pair; the lock's holder writes within a
  lease of its last confirmed heartbeat, the standby watches that heartbeat and steals a still one's lock.
- Member (controller/core/member.py): one of a cluster's active members; each switch is the member's
  whose claim in etcd holds it, and the member writes while its etcd lease is confirmed.

Each says which switches are this controller's to write now, with which generation id and epoch, why a
change is refused, what the status adds, and how a change is answered (controller/core/peers.py: a cluster's
store and switches are the others' too).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from controller.core import actions as act
from controller.core import events as ev

if TYPE_CHECKING:
    from controller.core.peers import Peers
    from controller.core.switch import Switch


@dataclass
class Handover:
    """What a coordination event changes for the controller: what to ask, the connected switches now ours
    (taken over) and those now another's (stood down), the cluster's discovery key, a policy put elsewhere."""
    actions: list[act.Action] = field(default_factory=list)
    ours: frozenset[int] = frozenset()
    theirs: frozenset[int] = frozenset()
    probe_key: bytes | None = None
    policy: ev.PolicyLoaded | None = None


class Authority(Protocol):
    """This controller's authority over the switches, and the proof its writes carry."""

    shares: bool   # other controllers write the same switches and the same store at once (a cluster's members)

    @property
    def active(self) -> bool:
        """Whether it acts for its owner at all (a pair's standby does not)."""

    def owns(self, dp_id: int) -> bool:
        """Whether the switch is this controller's to poll and master."""

    def confirmed(self, now: float) -> bool:
        """Whether this controller may write now: its lock or lease is proved recent enough."""

    def generation_of(self, dp_id: int) -> int:
        """The generation id to claim the switch's mastership with (0: none yet)."""

    def epoch_of(self, dp_id: int) -> int:
        """What OVSDB must not hold a newer epoch than for our writes to the switch (0: no condition)."""

    def label(self, now: float) -> str:
        """What the status and the metrics say of it."""

    def refusal(self, now: float, owner: str) -> str | None:
        """Why a change of the policy is refused now, if it is."""

    def need(self, dp_id: int, above: int) -> list[act.Action]:
        """A switch has seen generation id `above`: what claims a newer one."""

    def claimed(self, generation: int | None) -> list[act.Action]:
        """A generation id claim's outcome (actions.ClaimGeneration)."""

    def beaten(self, beat: ev.Beaten) -> None:
        """A heartbeat's outcome."""

    def watch(self, change: ev.RemotesChanged, now: float) -> list[act.Action]:
        """Each report of the remotes: what it asks of OVSDB's lock."""

    def take_over(self) -> None:
        """The owner's lock is ours now."""

    def stand_down(self) -> None:
        """The owner's lock is another's now."""

    def coordinate(self, event: ev.ClusterChanged | ev.SwitchClaimed, now: float, switches: Mapping[int, Switch],
                   connected: Mapping[str, bool]) -> Handover:
        """The coordination service's news, for the connected `switches` (`connected`: the remotes reached)."""

    def publish(self, held: dict[int, dict[str, Any]], revision: int) -> list[act.Action]:
        """What our switches hold of the policy at `revision`, for the answers other controllers give."""

    def peers(self) -> Peers:
        """The other controllers as a change and its answer see them."""

    def status(self) -> dict[str, Any]:
        """What the status says besides the role."""

    def about(self, dp_id: int) -> dict[str, Any]:
        """What the status says of one switch besides its own state."""
