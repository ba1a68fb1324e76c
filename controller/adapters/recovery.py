"""A cluster's revisions across etcd losing its data (restarted empty, or restored from an older snapshot).

etcd's revisions, as the core sees them, are etcd's plus a base: after a loss etcd's revisions start again
lower, so the base lifts them above every one seen before, and ownership epochs, generation ids and policy
revisions keep growing (the switches refuse older ones). The base key (/ovs-qos/<owner>/base, "BASE TOKEN")
is also the mark that etcd still holds the cluster's data: made with a new token by whoever finds it gone.

A member finds a loss at its next read: etcd's revision went back (etcd.Gateway), the base key is gone, or
another member made it anew. It lifts the base, puts back the policy it had in force (register.py), says so
(reseeded/<member>), and then, until every member of the group before the loss has put back its copy or a
lease has passed, tells its core nothing (as with etcd down): the first to notice would otherwise apply an
older copy and claim every switch alone.
"""
from __future__ import annotations

import logging
import time
import uuid

from controller.adapters.etcd import Gateway, as_read, b64, kvs, text, under
from controller.adapters.membership import Membership
from controller.adapters.register import Register

LOG = logging.getLogger(__name__)


class Recovery:
    def __init__(self, gateway: Gateway, prefix: str, register: Register, membership: Membership) -> None:
        self._gateway, self._register, self._membership = gateway, register, membership
        self.key, self._reseeded = b64(f"{prefix}base"), f"{prefix}reseeded/"
        self.base, self._token = 0, ''                  # as the base key last said ('': not seen yet)
        self._lost: str | None = None                   # a loss found at a read of the keys
        self.restored: str | None = None                # the last loss recovered from, and how: said with each read
        self._waiting: tuple[float, frozenset[str]] | None = None   # after a loss: until when, and whom, to wait for
        self.group: tuple[str, ...] = ()                # the members as last read: whose copies a recovery waits for

    @property
    def lost(self) -> str | None:
        """Why etcd lost the cluster's data, once found (None: it did not)."""
        if self._lost is None and self._gateway.went_back is not None:
            self._lost = "its revision went back from {} to {}".format(*self._gateway.went_back)
        return self._lost

    def unsettled(self, marker: list[str] | None) -> bool:
        """Whether the base must be settled (made, adopted, or raised after a loss) before keys read with the base
        key's words `marker` (None: no base key) can be used."""
        if self.lost is None and marker is None and self._token:
            self._lost = "the cluster's keys are gone"
        elif self.lost is None and marker is not None and self._token and marker[1] != self._token:
            self._lost = "another member found the cluster's keys gone"
        return self.lost is not None or marker is None or marker[1] != self._token or int(marker[0]) > self.base

    def settle(self) -> None:
        """The base key made (a new cluster), adopted (another member's), or, after etcd lost its data, raised above
        every revision we saw and the policy we had in force put back where there is none or an older one: never
        nothing, and never an older one, in its place. A recovery that fails half way is done again, whole, at the
        next read. Our keys, and the switches' claims, are made again by the passes that follow, as after our lease
        ran out."""
        reason = self.lost
        floor = self._gateway.went_back[0] if self._gateway.went_back else self._gateway.highest
        base, token = self._lift(self.base + floor if reason else 0, reason is not None)
        if reason is not None:
            me = self._membership.member
            self._register.reseed()
            self._gateway.post("/kv/put", {"key": b64(f"{self._reseeded}{me}"), "value": b64(token)})
            self._waiting = (time.monotonic() + self._membership.seconds, frozenset(self.group) - {me})
            self.restored = f"{reason}; revisions now count from {max(self.base, base)}" + \
                (", its copy of the policy put back unless a newer one was" if self._register.copy is not None else "")
            LOG.error("etcd lost its data (%s): recovered, %s", reason, self.restored.split("; ", 1)[1])
            self._membership.forget()
        self.base, self._token, self._lost, self._gateway.went_back = max(self.base, base), token, None, None

    def _lift(self, want: int, lost: bool) -> tuple[int, str]:
        """The base key (base, token) as it is, made, or raised to `want`. After a loss (`lost`) the first member to
        find it, the one that finds the base key as it was before (or none), also gives it a new token and marks the
        policy etcd holds, which a restored snapshot kept, as a seed of the revision the members knew it at (the
        base it was read with, plus its key's): the lifted revisions would otherwise make it the newest, and every
        member would go back to it. A member's newer copy then replaces it (register.reseed)."""
        policy, seeded = b64(self._register.key), b64(self._register.seeded)
        while True:
            answer = self._gateway.post("/kv/txn", {"success": [{"request_range": {"key": k}}
                                                                for k in (self.key, policy, seeded)]})
            found, stored = kvs(answer, 0), kvs(answer, 1)
            said = text(found[0]["value"]).split() if found else ["0", uuid.uuid4().hex]
            base, token = int(said[0]), said[1]
            first = lost and (not found or token == self._token)
            if found and base >= want and not first:
                return base, token
            token = uuid.uuid4().hex if first else token
            compare = [as_read(self.key, found)]
            put = [{"request_put": {"key": self.key, "value": b64(f"{want} {token}")}}]
            if first and stored:
                compare.append(as_read(policy, stored))
                put += [{"request_put": {"key": policy, "value": stored[0]["value"]}},
                        {"request_put": {"key": seeded, "value": b64(f"{base + int(stored[0]['mod_revision']):020d}")}}]
            if self._gateway.post("/kv/txn", {"compare": compare, "success": put}).get("succeeded"):
                return want, token

    def recovering(self) -> bool:
        """After a loss, until every member of the group before it has put back its copy of the policy (or a lease
        has passed): until then a member that held an older copy would apply it, and claim switches the others
        have not yet claimed again."""
        if self._waiting is None:
            return False
        deadline, waiting = self._waiting
        found = kvs(self._gateway.post("/kv/range", under(self._reseeded)))
        done = {text(kv["key"]).rsplit("/", 1)[1] for kv in found if text(kv["value"]) == self._token}
        if waiting <= done or time.monotonic() > deadline:
            self._waiting = None
        return self._waiting is not None
