"""The policy in force, and each change to it on its way (part of controller/core/controller.py): checked
against the switches, saved (the app's I/O: actions.SavePolicy, answered by events.PolicySaved), then in
force, and answered once every switch the old or the new policy names holds it, or after
CONFIRM_SECONDS, saying which do not and why. The other controllers, if any, are the authority's to
describe (controller/core/peers.py): whose copy answers If-Match, and which switches they own and say they
hold the change (the answer waits for them too). A change that cannot be checked or saved changes nothing.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from controller.core import actions as act
from controller.core import events as ev
from controller.core.errors import Conflict, Indeterminate, PolicyError, StorageError
from controller.core.policy import Policy, parse_policy
from controller.core.view import Mode

if TYPE_CHECKING:
    from controller.core.peers import Peers

LOG = logging.getLogger("qos")
CONFIRM_SECONDS = 20.0      # a change is answered once every switch is in sync, or after this saying what is not
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
    revision: int             # the policy's revision in the store, which the other switches' owners must say they hold
    everywhere: bool          # the old or the new policy has a network: section: every switch is concerned


class PolicyKeeper:
    def __init__(self, mode: Mode, document: Any, policy: Policy | None, revision: int = 0):
        """`revision`: the stored policy's (each save's is newer)."""
        self.mode, self.document, self.policy, self.revision = mode, document, policy, revision
        self.load_error = False                       # the last change was refused
        self.saving: list[tuple[ev.SetPolicy | ev.ClearPolicy, Policy | None]] = []   # saves in flight, in order
        self.waiting: list[Waiting] = []

    @property
    def name(self) -> str | None:
        return self.policy.name if self.policy else None

    def install(self, mode: Mode, document: Any, policy: Policy | None, revision: int) -> None:
        self.mode, self.document, self.policy, self.revision = mode, document, policy, revision

    def change(self, req: ev.SetPolicy | ev.ClearPolicy, check: Callable[[Policy], None], now: float,
               peers: Peers) -> list[act.Action]:
        """A PUT (checked against the switches by `check`) or a DELETE: saved first, in force once saved. If-Match
        and "unchanged" are answered by our copy or by the store (actions.SavePolicy's `expect`), as `peers` says."""
        policy = None
        if isinstance(req, ev.SetPolicy):
            try:
                policy = parse_policy(req.document)
                check(policy)
            except PolicyError as err:
                self.load_error = True
                return [act.Answer(req.token, error=err)]
            self.load_error = False
        if peers.answers(bool(self.saving)):
            if req.expect is not None and not self._holds(req.expect):
                return [act.Answer(req.token, error=Conflict(self.revision, req.expect))]
            if policy is not None and self.mode is Mode.IN_FORCE and policy == self.policy:
                return self._confirm(req.token, {"applied": policy.name, "changed": False}, policy, now)
        # Saves in flight (the store answers each in order) end at revisions this one follows.
        self.saving.append((req, policy))
        return [act.SavePolicy(req.document if isinstance(req, ev.SetPolicy) else None,
                               self.revision + len(self.saving), peers.condition(req.expect))]

    def _holds(self, expect: int) -> bool:
        """Whether the policy in force meets If-Match: at revision `expect`, or any policy for ANY_POLICY."""
        return self.policy is not None if expect == ev.ANY_POLICY else expect == self.revision

    def saved(self, saved: ev.PolicySaved, now: float) -> tuple[list[act.Action], bool]:
        """The oldest save's outcome; whether its change is now in force."""
        req, policy = self.saving.pop(0)
        if saved.indeterminate:
            return [act.Answer(req.token, error=Indeterminate(
                f"the policy store did not answer ({saved.error}): the change may be in force or not; GET "
                f"/qos/v1/policy: a revision above {self.revision} is it, or a later one"))], False
        if saved.conflict:
            assert req.expect is not None
            return [act.Answer(req.token, error=Conflict(saved.revision, req.expect))], False
        if saved.error is not None:
            return [act.Answer(req.token, error=StorageError(
                f"cannot save the policy in force: {saved.error}; nothing was changed"))], False
        previous = self.policy
        # In a cluster, a newer policy may have come from the store before this answer: it stays in force.
        superseded = saved.revision < self.revision
        if superseded:
            LOG.info("policy change stored (revision %d); a newer one (revision %d) is in force already",
                     saved.revision, self.revision)
        if isinstance(req, ev.SetPolicy):
            assert policy is not None
            if not superseded:
                if saved.changed:
                    LOG.info("policy %s in force (revision %d)", policy.name, saved.revision)
                self.install(Mode.IN_FORCE, req.document, policy, saved.revision)
            result: dict[str, Any] = {"applied": policy.name, "changed": saved.changed}
        else:
            if not superseded:
                LOG.info("policy %s cleared (revision %d)", previous.name if previous else None, saved.revision)
                self.install(Mode.CLEARED, None, None, saved.revision)
            result = {"cleared": previous.name if previous else None}
        return self._confirm(req.token, result, previous, now, saved.revision), saved.changed and not superseded

    def _confirm(self, token: Any, result: dict[str, Any], previous: Policy | None, now: float,
                 revision: int | None = None) -> list[act.Action]:
        """`revision`: the change's (the store's; by default the one now in force)."""
        revision = self.revision if revision is None else revision
        named = frozenset(s.dp_id for p in (previous, self.policy) if p for s in p.switches)
        everywhere = any(p is not None and p.network is not None for p in (previous, self.policy))
        result = {**result, "revision": revision}
        self.waiting.append(Waiting(token, result, now + CONFIRM_SECONDS, named, revision, everywhere))
        return [act.Later(CONFIRM_SECONDS, ev.ConfirmDue())]   # answered then even if nothing else happens

    def answer(self, switches: Sequence[Settling], now: float, peers: Peers) -> list[act.Action]:
        """Answer the changes waiting for every switch to settle (in sync, or failed and shown as such), or for
        their time to run out. `switches`: the ones this controller owns; `peers`: who owns the others."""
        settled = all(sw.settled for sw in switches)
        answers: list[act.Action] = []
        waiting = []
        for change in self.waiting:
            theirs = peers.said(change.named, change.everywhere, change.revision)
            done = settled and all(entry["settled"] for entry in theirs.values())
            if not (done or now >= change.deadline):
                waiting.append(change)
                continue
            not_in_sync: dict[str, Any] = {f"{sw.dp_id:016x}": sw.errors() or "in progress" for sw in switches
                                           if not sw.in_sync}
            not_in_sync |= {f"{dp_id:016x}": entry["errors"] or "in progress"
                            for dp_id, entry in sorted(theirs.items()) if not entry["in_sync"]}
            ours = [sw.dp_id for sw in switches]
            absent = sorted(change.named - set(ours) - theirs.keys())
            not_in_sync |= {f"{dp_id:016x}": peers.absent for dp_id in absent}
            answers.append(act.Answer(change.token, {
                **change.result, "in_sync": not not_in_sync, **({"not_in_sync": not_in_sync} if not_in_sync else {}),
                **peers.owners(ours, theirs, absent, not_in_sync)}))
        self.waiting = waiting
        return answers


def from_saved(saved: ev.PolicyLoaded) -> tuple[Mode, Any, Policy | None, int]:
    """The policy the store holds, and its revision; one that cannot be used leaves the switches as they are."""
    if saved.error is not None:
        LOG.error("cannot use the saved policy (%s); starting without one, switches left as they are", saved.error)
        return Mode.UNSET, None, None, saved.revision
    if saved.saved != SAVED_POLICY:
        return (Mode.CLEARED if saved.saved == SAVED_CLEARED else Mode.UNSET), None, None, saved.revision
    try:
        return Mode.IN_FORCE, saved.document, parse_policy(saved.document), saved.revision
    except PolicyError as err:
        LOG.error("the saved policy is no longer valid (%s); starting without one, switches left as they are", err)
        return Mode.UNSET, None, None, saved.revision
