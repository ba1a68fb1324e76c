"""The other controllers of this policy, as a change and its answer see them (controller/core/keeper.py),
given by the authority (controller/core/ha.py): whose copy answers If-Match, who holds the switches this
controller does not, and what the answer says of them.

- Sole (alone, or one of a pair): this controller is the store's only writer (the pair's lock fences the
  other), and a switch it is not connected to is changed when it connects.
- Shared (a cluster's member): etcd is every member's store, so it alone answers If-Match; each switch is
  its owner's, which says in etcd what it holds (events.MemberSync), and the answer names the owners.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from controller.core import events as ev

NOT_CONNECTED = "not connected to this controller; it is changed when it connects"
NO_OWNER = "no member owns it yet; its owner changes it once it has claimed it"
Said = dict[int, dict[str, Any]]   # switch → what its owner says of it: in_sync, settled, errors


class Peers(Protocol):
    absent: ClassVar[str]   # what the answer says of a switch the change names that no controller holds

    def answers(self, saving: bool) -> bool:
        """Whether our own copy answers If-Match and "unchanged" now (`saving`: a save of ours is in flight)."""

    def condition(self, expect: int | None) -> int | None:
        """The If-Match a save asks the store to check (None: none)."""

    def said(self, named: frozenset[int], everywhere: bool, revision: int) -> Said:
        """The switches others own that a change concerns (`named`, or all for `everywhere`), and what each
        owner says of them at `revision`."""

    def owners(self, ours: Iterable[int], theirs: Iterable[int], absent: Iterable[int],
               not_in_sync: Mapping[str, Any]) -> dict[str, Any]:
        """What the answer adds of each switch it names."""


@dataclass(frozen=True)
class Sole:
    """No other controller writes the store or these switches."""
    absent: ClassVar[str] = NOT_CONNECTED

    def answers(self, saving: bool) -> bool:
        """Our copy is the store's but while a save is in flight, whose outcome it does not know yet."""
        return not saving

    def condition(self, expect: int | None) -> int | None:
        """Our copy answered If-Match; a lone or a pair's store checks nothing."""
        return None

    def said(self, named: frozenset[int], everywhere: bool, revision: int) -> Said:
        return {}

    def owners(self, ours: Iterable[int], theirs: Iterable[int], absent: Iterable[int],
               not_in_sync: Mapping[str, Any]) -> dict[str, Any]:
        """Every switch is ours: the answer names no owner."""
        return {}


@dataclass(frozen=True)
class Shared:
    """A cluster: this member, the switches the others own, what they say."""
    me: str
    others: dict[int, str]                  # switch → the other member that owns it
    sync: dict[str, ev.MemberSync]          # member → what it says it holds
    absent: ClassVar[str] = NO_OWNER

    def answers(self, saving: bool) -> bool:
        """Other members change the store too: only it knows whether a change holds If-Match or changes anything."""
        return False

    def condition(self, expect: int | None) -> int | None:
        return expect

    def said(self, named: frozenset[int], everywhere: bool, revision: int) -> Said:
        """What each owner says, once it says it has the policy of `revision` (or newer) in force."""
        concerned = self.others.keys() if everywhere else named & self.others.keys()
        return {dp: self._held(dp, revision) for dp in concerned}

    def _held(self, dp_id: int, revision: int) -> dict[str, Any]:
        said = self.sync.get(self.others[dp_id])
        entry = said.switches.get(dp_id) if said is not None and said.revision >= revision else None
        return entry if entry is not None else {
            "in_sync": False, "settled": False,
            "errors": f"its owner, member {self.others[dp_id]}, has not said it holds this change yet"}

    def owners(self, ours: Iterable[int], theirs: Iterable[int], absent: Iterable[int],
               not_in_sync: Mapping[str, Any]) -> dict[str, Any]:
        """Each switch's owner (None: no member's yet)."""
        owners = {**dict.fromkeys(absent), **{dp: self.others[dp] for dp in theirs}, **dict.fromkeys(ours, self.me)}
        return {"switches": {f"{dp:016x}": {"owner": owner, "in_sync": f"{dp:016x}" not in not_in_sync}
                             for dp, owner in sorted(owners.items())}}
