"""The cluster's policy in etcd: /ovs-qos/<owner>/policy holds the policy in force for every member, as the state
file holds it for one controller ({"policy": <document or null>}). A register that etcd alone decides, never a
member's copy: each save is one transaction, conditional on what was read just before or on If-Match's revision,
and each read of the current policy is a read of etcd. The member keeps a copy of the newest policy it fetched
or saved, which is what it puts back should etcd lose its data (recovery.py).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from controller.adapters.etcd import CoordinationError, Gateway, as_read, b64, kvs, text
from controller.core import events as ev

SAVE_ATTEMPTS = 8          # a PUT read-then-CAS again when another landed in between: a bound, not a wait


def _policy_value(document: Any) -> str:
    """The policy key's value, the same bytes for the same document: etcd compares them to say "unchanged"."""
    return b64(json.dumps({"policy": document}, sort_keys=True, separators=(",", ":")))


class Register:
    """`base()`: what lifts etcd's revisions to the cluster's (recovery.py)."""

    def __init__(self, gateway: Gateway, prefix: str, base: Callable[[], int]) -> None:
        self._gateway, self._base = gateway, base
        self.key, self.seeded = f"{prefix}policy", f"{prefix}seeded"
        self.copy: tuple[int, Any] | None = None       # the newest policy fetched or saved: (revision, document)

    def fetch(self, revision: int) -> tuple[int, Any] | None:
        """The policy (revision, document) at `revision` or later: the one fetched last if it is that one."""
        if self.copy is None or self.copy[0] != revision:
            found = kvs(self._gateway.post("/kv/range", {"key": b64(self.key)}))
            self.copy = (self._base() + int(found[0]["mod_revision"]),
                         json.loads(text(found[0]["value"])).get("policy")) if found else None
        return self.copy

    def current(self) -> tuple[Any, int]:
        """The cluster's policy as etcd holds it now (a linearizable read, never this member's copy): the document
        (None: none or cleared) and its revision (0: none)."""
        found = kvs(self._gateway.post("/kv/range", {"key": b64(self.key)}))
        if not found:
            return None, 0
        return json.loads(text(found[0]["value"])).get("policy"), self._base() + int(found[0]["mod_revision"])

    def save(self, document: Any, expect: int | None = None) -> ev.PolicySaved:
        """The cluster's policy (None: cleared), in one transaction that etcd decides: without `expect`, kept
        unless the key holds this very document (then unchanged, at its revision); with it, kept only if the
        key is still at that revision (0: absent; ANY_POLICY: holds a policy, not a cleared one), else refused
        with the revision it is at."""
        key, value = b64(self.key), _policy_value(document)
        read, put = {"request_range": {"key": key}}, {"request_put": {"key": key, "value": value}}
        if expect is None:
            # A put conditional on the revision just read, never a blind one: a transaction that a partition held
            # back and delivered after a newer policy was stored then changes nothing (its sender said 504).
            for _ in range(SAVE_ATTEMPTS):
                found = kvs(self._gateway.post("/kv/range", {"key": key}))
                if found and found[0]["value"] == value:
                    return ev.PolicySaved(None, self._base() + int(found[0]["mod_revision"]), changed=False)
                answer = self._gateway.post("/kv/txn", {"compare": [as_read(key, found)], "success": [put]})
                if answer.get("succeeded"):
                    return self._saved(document, answer)
            raise CoordinationError(f"the policy changed {SAVE_ATTEMPTS} times while this one was being stored; "
                                    "nothing of it was stored")
        condition: dict[str, Any]
        if expect == ev.ANY_POLICY:        # a policy stored, not a cleared one (etcd fails a value compare on no key)
            condition = {"key": key, "result": "NOT_EQUAL", "target": "VALUE", "value": _policy_value(None)}
        elif 0 < expect <= self._base():   # a revision from before etcd lost its data: none is at it now
            condition = {"key": key, "result": "LESS", "target": "MOD", "mod_revision": 0}   # never true
        else:
            condition = as_read(key, []) if expect == 0 else {"key": key, "result": "EQUAL", "target": "MOD",
                                                              "mod_revision": expect - self._base()}
        answer = self._gateway.post("/kv/txn", {"compare": [condition], "success": [put], "failure": [read]})
        if answer.get("succeeded"):
            return self._saved(document, answer)
        found = kvs(answer, 0)
        return ev.PolicySaved(None, self._base() + int(found[0]["mod_revision"]) if found else 0, conflict=True)

    def _saved(self, document: Any, answer: dict[str, Any]) -> ev.PolicySaved:
        """A policy stored: also this member's copy, should etcd lose its data before the next read fetches it."""
        revision = self._base() + int(answer["header"]["revision"])
        if self.copy is None or self.copy[0] < revision:
            self.copy = (revision, document)
        return ev.PolicySaved(None, revision)

    def reseed(self) -> None:
        """After a loss, the policy in force put back: the newest that any member had, never an older one over it.
        Each member that finds the loss puts its copy unless the one stored is newer: a seed (stored with its
        revision from before the loss, in the same transaction) from a newer copy, or a policy PUT since."""
        if self.copy is None:
            return
        revision, document = self.copy
        key, seeded = b64(self.key), b64(self.seeded)
        put = [{"request_put": {"key": key, "value": _policy_value(document)}},
               {"request_put": {"key": seeded, "value": b64(f"{revision:020d}")}}]
        while True:
            answer = self._gateway.post("/kv/txn", {"success": [{"request_range": {"key": key}},
                                                                {"request_range": {"key": seeded}}]})
            stored, seed = kvs(answer, 0), kvs(answer, 1)
            if stored and not (seed and seed[0]["mod_revision"] == stored[0]["mod_revision"]
                               and int(text(seed[0]["value"])) < revision):
                return
            if self._gateway.post("/kv/txn", {"compare": [as_read(key, stored), as_read(seeded, seed)],
                                              "success": put}).get("succeeded"):
                return
