"""The policy in force, and each change to it on its way (part of controller/core/controller.py): checked
against the switches, saved (the app's I/O: actions.SavePolicy, answered by events.PolicySaved), then in
force, and answered once every switch the old or the new policy names holds it, or after
CONFIRM_SECONDS, saying which do not and why (a switch that is not connected is changed when it
connects). In a cluster the answer waits, too, for the members that own the other switches to say (in
etcd: events.MemberSync) that they hold the change, and names each switch's owner. A change that cannot
be checked or saved changes nothing.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from controller.core import actions as act
from controller.core import events as ev
from controller.core.errors import PolicyError, StorageError
from controller.core.policy import Policy, parse_policy
from controller.core.view import Mode

LOG = logging.getLogger("qos")
CONFIRM_SECONDS = 20.0      # a change is answered once every switch is in sync, or after this saying what is not
NOT_CONNECTED = "not connected to this controller; it is changed when it connects"
NO_OWNER = "no member owns it yet; its owner changes it once it has claimed it"
# Saved states (controller/adapters/statefile.py reads them into one of these).
SAVED_ABSENT, SAVED_CLEARED, SAVED_POLICY = "absent", "cleared", "policy"


class Settling(Protocol):
    """What a change's answer reads of a switch."""
    in_sync: bool
    settled: bool

    @property
    def dp_id(self) -> int: ...

    def errors(self) -> dict[str, str]: ...


@dataclass
class Waiting:
    """A change answered once every switch has settled, or at its deadline."""
    token: Any
    result: dict[str, Any]
    deadline: float
    named: frozenset[int]     # the switches the old or the new policy names
    revision: int             # in a cluster: the policy's revision in etcd, which its owners must say they hold
    everywhere: bool = False  # the old or the new policy has a network: section: every switch is concerned


class PolicyKeeper:
    def __init__(self, mode: Mode, document: Any, policy: Policy | None):
        self.mode, self.document, self.policy = mode, document, policy
        self.load_error = False                       # the last change was refused
        self.saving: list[tuple[ev.SetPolicy | ev.ClearPolicy, Policy | None]] = []   # saves in flight, in order
        self.waiting: list[Waiting] = []

    @property
    def name(self) -> str | None:
        return self.policy.name if self.policy else None

    def install(self, mode: Mode, document: Any, policy: Policy | None) -> None:
        self.mode, self.document, self.policy = mode, document, policy

    def change(self, req: ev.SetPolicy | ev.ClearPolicy, check: Callable[[Policy], None],
               now: float, revision: int = 0) -> list[act.Action]:
        """A PUT (checked against the switches by `check`) or a DELETE: saved first, in force once saved.
        `revision`: in a cluster, the revision of the policy in force."""
        policy = None
        if isinstance(req, ev.SetPolicy):
            try:
                policy = parse_policy(req.document)
                check(policy)
            except PolicyError as err:
                self.load_error = True
                return [act.Answer(req.token, error=err)]
            self.load_error = False
            if self.mode is Mode.IN_FORCE and policy == self.policy and not self.saving:
                return self._confirm(req.token, {"applied": policy.name, "changed": False}, policy, now, revision)
        self.saving.append((req, policy))
        return [act.SavePolicy(req.document if isinstance(req, ev.SetPolicy) else None)]

    def saved(self, saved: ev.PolicySaved, now: float) -> tuple[list[act.Action], bool]:
        """The oldest save's outcome; whether its change is now in force."""
        req, policy = self.saving.pop(0)
        if saved.error is not None:
            return [act.Answer(req.token, error=StorageError(
                f"cannot save the policy in force: {saved.error}; nothing was changed"))], False
        previous = self.policy
        if isinstance(req, ev.SetPolicy):
            assert policy is not None
            LOG.info("policy %s in force", policy.name)
            self.install(Mode.IN_FORCE, req.document, policy)
            result: dict[str, Any] = {"applied": policy.name, "changed": True}
        else:
            LOG.info("policy %s cleared", previous.name if previous else None)
            self.install(Mode.CLEARED, None, None)
            result = {"cleared": previous.name if previous else None}
        return self._confirm(req.token, result, previous, now, saved.revision), True

    def _confirm(self, token: Any, result: dict[str, Any], previous: Policy | None, now: float,
                 revision: int) -> list[act.Action]:
        named = frozenset(s.dp_id for p in (previous, self.policy) if p for s in p.switches)
        everywhere = any(p is not None and p.network is not None for p in (previous, self.policy))
        self.waiting.append(Waiting(token, result, now + CONFIRM_SECONDS, named, revision, everywhere))
        return [act.Later(CONFIRM_SECONDS, ev.ConfirmDue())]   # answered then even if nothing else happens

    def answer(self, switches: Sequence[Settling], now: float, cluster: Shared | None = None) -> list[act.Action]:
        """Answer the changes waiting for every switch to settle (in sync, or failed and shown as such), or for
        their time to run out. `switches`: the ones this controller owns; `cluster`: what the other members
        of a cluster own and say."""
        settled = all(sw.settled for sw in switches)
        others = cluster.others if cluster else {}
        answers: list[act.Action] = []
        waiting = []
        for change in self.waiting:
            concerned = others.keys() if change.everywhere else change.named & others.keys()
            theirs = {dp: cluster.held(dp, change.revision) for dp in concerned} if cluster else {}
            done = settled and all(entry is not None and entry["settled"] for entry in theirs.values())
            if not (done or now > change.deadline):
                waiting.append(change)
                continue
            not_in_sync: dict[str, Any] = {f"{sw.dp_id:016x}": sw.errors() or "in progress" for sw in switches
                                           if not sw.in_sync}
            for dp_id, entry in sorted(theirs.items()):
                if entry is None:
                    not_in_sync[f"{dp_id:016x}"] = f"its owner, member {others[dp_id]}, has not said it holds " \
                                                   "this change yet"
                elif not entry["in_sync"]:
                    not_in_sync[f"{dp_id:016x}"] = entry["errors"] or "in progress"
            absent = change.named - {sw.dp_id for sw in switches} - theirs.keys()
            not_in_sync |= {f"{dp_id:016x}": NO_OWNER if cluster else NOT_CONNECTED for dp_id in sorted(absent)}
            owners = {**{f"{dp:016x}": None for dp in absent}, **{f"{dp:016x}": others[dp] for dp in theirs},
                      **{f"{sw.dp_id:016x}": cluster.me for sw in switches}} if cluster else {}
            answers.append(act.Answer(change.token, {
                **change.result, "in_sync": not not_in_sync, **({"not_in_sync": not_in_sync} if not_in_sync else {}),
                **({"switches": {dp: {"owner": owner, "in_sync": dp not in not_in_sync}
                                 for dp, owner in sorted(owners.items())}} if cluster else {})}))
        self.waiting = waiting
        return answers


@dataclass(frozen=True)
class Shared:
    """A cluster as a change's answer sees it: this member, the switches the others own, what they say."""
    me: str
    others: dict[int, str]                  # switch → the other member that owns it
    sync: dict[str, ev.MemberSync]          # member → what it says it holds

    def held(self, dp_id: int, revision: int) -> dict[str, Any] | None:
        """What the switch's owner says of it, once it says it has the policy of `revision` (or newer) in force."""
        said = self.sync.get(self.others[dp_id])
        return said.switches.get(dp_id) if said is not None and said.revision >= revision else None


def from_saved(saved: ev.PolicyLoaded) -> tuple[Mode, Any, Policy | None]:
    """The policy the store holds; one that cannot be used leaves the switches as they are."""
    if saved.error is not None:
        LOG.error("cannot use the saved policy (%s); starting without one, switches left as they are", saved.error)
        return Mode.UNSET, None, None
    if saved.saved != SAVED_POLICY:
        return (Mode.CLEARED if saved.saved == SAVED_CLEARED else Mode.UNSET), None, None
    try:
        return Mode.IN_FORCE, saved.document, parse_policy(saved.document)
    except PolicyError as err:
        LOG.error("the saved policy is no longer valid (%s); starting without one, switches left as they are", err)
        return Mode.UNSET, None, None
