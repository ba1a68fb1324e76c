"""The switches a member owns, in etcd: switch/<datapath id> holds its owner's name, on the owner's lease (so it
goes when the owner does). A member owns a switch only once an etcd transaction that creates the key (or, to
renew, puts it again while it is ours) succeeded; the write's revision, which only grows, is the OpenFlow
generation id it claims master with (controller/core/cluster.py decides what to claim and release).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from controller.adapters.etcd import CoordinationError, Gateway, absent, b64
from controller.compat import hub
from controller.core import actions as act
from controller.core import events as ev

LOG = logging.getLogger(__name__)
CLAIM_BATCH = 64           # claims in one etcd transaction (etcd refuses more than 128 operations in one)
RETRY_SECONDS = 1.0        # a release etcd did not answer is tried again this often


class Claims:
    """`lease()`: the lease our keys go on; `base()`: what lifts etcd's revisions to the cluster's (recovery.py);
    `expired()`: whether our lease is gone (our keys with it)."""

    def __init__(self, gateway: Gateway, prefix: str, member: str, lease: Callable[[], int],
                 base: Callable[[], int], expired: Callable[[], bool]) -> None:
        self._gateway, self._prefix, self._member = gateway, f"{prefix}switch/", member
        self._lease, self._base, self._expired = lease, base, expired
        self._pending: list[act.ClaimSwitch] = []     # the core's, sent together by _flush

    def key(self, dp_id: int) -> str:
        return b64(f"{self._prefix}{dp_id:016x}")

    def claim(self, dp_id: int, renew: bool) -> int | None:
        """Make the switch's key ours, on our lease: only if it has none (or, to renew, only if it is ours). The
        revision of the write, which is the key's; None when the condition failed."""
        found, failed = self.claims([(dp_id, renew)])
        if failed is not None:
            raise failed
        return found[0]

    def claims(self, wanted: list[tuple[int, bool]]) -> tuple[list[int | None], CoordinationError | None]:
        """`claim` of each (dp_id, renew), CLAIM_BATCH of them in one transaction of etcd's, each claim a
        transaction of its own inside it (it succeeds or fails alone): a take-over of a hundred switches is two
        round trips, not a hundred. The claims of one transaction share its revision. A transaction that fails
        ends them: the outcomes of those before it, and its error (its claims and those after have none)."""
        found: list[int | None] = []
        for at in range(0, len(wanted), CLAIM_BATCH):
            ops = []
            for dp_id, renew in wanted[at:at + CLAIM_BATCH]:
                key = self.key(dp_id)
                compare = {"key": key, "result": "EQUAL", "target": "VALUE", "value": b64(self._member)} \
                    if renew else absent(key)
                ops.append({"request_txn": {"compare": [compare], "success": [
                    {"request_put": {"key": key, "value": b64(self._member), "lease": self._lease()}}]}})
            try:
                answer = self._gateway.post("/kv/txn", {"success": ops})
            except CoordinationError as err:
                return found, err
            revision = self._base() + int(answer["header"]["revision"])
            found += [revision if r["response_txn"].get("succeeded") else None for r in answer["responses"]]
        return found, None

    def ask(self, claim: act.ClaimSwitch, post: Callable[[ev.Event], None]) -> None:
        """One of the core's claims: the claims of one event are sent together once it is handled, on a greenthread
        of their own, each one's outcome posted as events.SwitchClaimed."""
        if not self._pending:
            hub.spawn(self._flush, post)
        self._pending.append(claim)

    def _flush(self, post: Callable[[ev.Event], None]) -> None:
        """None for each claim etcd did not answer: the next read finds which of ours it holds."""
        pending, self._pending = self._pending, []
        revisions, failed = self.claims([(claim.dp_id, claim.renew) for claim in pending])
        if failed is not None:
            LOG.warning("etcd: cannot claim switches %s: %s", ", ".join(
                f"{c.dp_id:016x}" for c in pending[len(revisions):]), failed)
        revisions += [None] * (len(pending) - len(revisions))
        for claim, revision in zip(pending, revisions):
            post(ev.SwitchClaimed(claim.dp_id, revision))

    def release(self, dp_id: int, revision: int) -> None:
        """Delete the switch's key if it is still ours as claimed at `revision`, never a claim of ours made since (a
        release etcd carries out late would delete it); tried again each second until etcd confirms it, or until
        our lease ran out (the key went with it): the member the ring names cannot claim the switch while our key
        holds it."""
        key = self.key(dp_id)
        said = False
        while not self._expired():
            ours = [{"key": key, "result": "EQUAL", "target": "VALUE", "value": b64(self._member)},
                    {"key": key, "result": "EQUAL", "target": "MOD", "mod_revision": revision - self._base()}]
            try:
                self._gateway.post("/kv/txn", {"compare": ours, "success": [{"request_delete_range": {"key": key}}]})
                return
            except CoordinationError as err:
                if not said:
                    LOG.warning("etcd: switch %016x not released yet (%s); tried again every second", dp_id, err)
                said = True
            hub.sleep(RETRY_SECONDS)
