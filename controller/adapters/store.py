"""Where the policy in force is kept, one store for each way the controller runs (controller/adapters/ha.py
chooses it once at start); each fenced by what decides who writes.

- Alone: the state file (statefile.py), locked by this process for its life.
- An active/standby pair: the first OVSDB remote, in Open_vSwitch external_ids, written by a transaction
  that asserts the pair's lock, so that OVSDB itself refuses a deposed holder's save however late it
  comes (a paused process, a slow disk) and the pair needs no shared disk. A pair that kept its policy in
  a shared state file before reads it from there until its first change.
- A cluster: etcd (coordination.py), by revision.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

from controller.adapters.coordination import Coordination, CoordinationError
from controller.adapters.ovsdb import OvsdbError, Unconfirmed
from controller.adapters.remotes import Remotes
from controller.adapters.rest import Unavailable
from controller.adapters.statefile import StateFile, decode, encode, load, save
from controller.core import events as ev
from controller.core.errors import PolicyError
from controller.core.keeper import SAVED_ABSENT

LOG = logging.getLogger(__name__)
Load = Callable[[], ev.PolicyLoaded]
Keep = Callable[[Any, int, "int | None"], ev.PolicySaved]    # document, revision, expect: actions.SavePolicy
Read = Callable[[], dict[str, Any]]                            # {"policy": document, "revision": N}


class Store(NamedTuple):
    load: Load
    keep: Keep
    read: Read | None     # where other controllers change the policy too: GET reads it there, not our copy


class PairStore:
    """A standby pair's policy, in the first OVSDB remote under the pair's lock."""

    def __init__(self, remotes: Remotes, legacy: StateFile) -> None:
        self._remotes, self._legacy = remotes, legacy
        self._unknown = 0     # the last revision a save of unknown outcome may have stored

    def load(self) -> ev.PolicyLoaded:
        where = f"OVSDB {self._remotes.names[0]}"
        try:
            text = self._remotes.saved_policy()
        except (OvsdbError, RuntimeError) as err:
            return ev.PolicyLoaded(SAVED_ABSENT, error=f"{where}: cannot read the pair's policy ({err})")
        if text is None:
            legacy = load(self._legacy)
            if legacy.saved != SAVED_ABSENT:
                LOG.info("the pair's policy comes from %s this once; it is kept in %s from its next change",
                         self._legacy.path, where)
            return legacy
        try:
            saved, document, revision = decode(text.encode(), where, "put the policy again")
        except PolicyError as err:
            return ev.PolicyLoaded(SAVED_ABSENT, error=str(err))
        return ev.PolicyLoaded(saved, document, revision=revision)

    def save(self, document: Any, revision: int, expect: int | None = None) -> ev.PolicySaved:
        """`expect`: a cluster's; the pair's If-Match was answered by its active controller's copy. A save OVSDB
        did not answer is indeterminate (it commits if OVSDB answers later), and its revision is never given
        to another: the answer to it names it, and the core asks for it again, having put nothing in force."""
        revision = max(revision, self._unknown + 1)
        try:
            self._remotes.save_policy(encode(document, revision))
        except Unconfirmed as err:
            self._unknown = revision
            return ev.PolicySaved(f"OVSDB {self._remotes.names[0]}: {err}", indeterminate=True)
        except (OvsdbError, RuntimeError) as err:
            return ev.PolicySaved(f"OVSDB {self._remotes.names[0]} refused it ({err}); this controller may no "
                                  "longer hold the pair's lock")
        return ev.PolicySaved(None, revision)


def alone_store(state_file: Any) -> Store:
    """A lone controller's policy, in its state file."""
    alone = StateFile(state_file)
    return Store(partial(load, alone), lambda document, revision, expect: save(alone, document, revision), None)


def pair_store(remotes: Remotes, state_file: Any) -> Store:
    """A standby pair's, in the first OVSDB remote (the shared state file read once, if it is there before)."""
    pair = PairStore(remotes, StateFile(state_file, shared=True))
    return Store(pair.load, pair.save, None)


def cluster_store(coordination: Coordination) -> Store:
    """A cluster's, in etcd: read there for GET too, since any member changes it."""
    return Store(coordination.policy_loaded, coordination.policy_saved, partial(_current, coordination))


def _current(coordination: Coordination) -> dict[str, Any]:
    try:
        document, revision = coordination.current_policy()
    except CoordinationError as err:
        raise Unavailable(f"etcd: {err}; the cluster's policy cannot be read now, try again") from None
    return {"policy": document, "revision": revision}
