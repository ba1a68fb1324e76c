"""This member in etcd: its lease, and the keys it keeps on that lease, which say to the others that it is a
member (member/<name>), which lease to revoke when it dies (lease/<name>, peers.py), the switches whose OVSDB it
cannot reach (unreachable/<name>) and what its switches hold of the policy (sync/<name>). Every key of the
member goes with its lease: when it dies, when a peer revokes the lease, when it is cut off from etcd for a
lease. Membership is one key on the member's own lease, as its switches' keys are (claims.py): no library's
group, and no second lease to keep alive.

The lease is refreshed by an OS thread of its own (Keepalive), not by a greenthread: eventlet runs one
greenthread at a time, and a large member's event loop can be busy for seconds without a yield (parsing a
1000-port OVSDB transaction takes 1-2 s, a PUT of 10,000 ports is checked and planned in one handler), which
let a 4 s lease run out in the middle of an apply. The loop still reads the cluster every second and takes the
thread's last confirmed refresh as its own; the thread stops refreshing when the core has handled no event for
WEDGED_SECONDS (the app says so after each one: `turned`), so a member whose loop hangs, or whose core no longer
runs, gives its switches up. SIGSTOP stops the thread too: a paused member's lease runs out.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from eventlet import patcher

from controller.adapters.etcd import LEASE_GONE, CoordinationError, Gateway, Post, b64
from controller.core.cluster import within_safe_share

LOG = logging.getLogger(__name__)
REFRESH_SECONDS = 1.0      # how often a member refreshes its lease (and reads the cluster, if no watch woke it)
WEDGED_SECONDS = 10.0      # the keepalive thread lets the lease run out once the core has handled nothing this long
_threading = patcher.original("threading")   # an OS thread (os-ken's eventlet patches `threading` green)
_time = patcher.original("time")


class Keepalive:
    """Refreshes the lease `lease()` names (read anew each time) every REFRESH_SECONDS from an OS thread, while the
    core last handled an event (`turned`, set by the loop) within WEDGED_SECONDS. `confirmed`: when the last
    refresh that etcd answered was sent (monotonic), and the lease's id; `gone`: the ids of leases etcd said are
    gone (the loop takes a new one). Plain attributes, each replaced whole: safe across the threads.
    `expired` asks about the lease held now: a round that read the id just before the loop replaced it hears
    that the old one is gone, which says nothing of the new one (as a bare flag, that word would outlive it: a
    release would then be skipped as "the key went with the lease" while the key sat on a live one)."""

    def __init__(self, post: Post, lease: Callable[[], int]):
        self._post, self._lease = post, lease
        self.turned: float = _time.monotonic()
        self.confirmed: tuple[float, int] = (self.turned, lease())   # a lease was just granted
        self.gone: frozenset[int] = frozenset()
        self._stop = _threading.Event()
        self._thread = _threading.Thread(target=self._run, name="etcd-keepalive", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * REFRESH_SECONDS)

    @property
    def expired(self) -> bool:
        """etcd said the lease we hold now is gone."""
        return self._lease() in self.gone

    def lost(self) -> None:
        """The loop heard our lease is gone."""
        self.gone = self.gone | {self._lease()}

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = _time.monotonic()
            if sent - self.turned < WEDGED_SECONDS:
                self.round(self._lease(), sent)
            self._stop.wait(max(0.0, REFRESH_SECONDS - (_time.monotonic() - sent)))

    def round(self, lease: int, sent: float) -> None:
        """Refresh `lease`, read by the round sent at `sent`."""
        try:
            ttl = int(self._post("/lease/keepalive", {"ID": lease}).get("result", {}).get("TTL", -1))
        except CoordinationError as err:    # the loop's own requests fail too, and say so
            LOG.debug("etcd: keepalive failed: %s", err)
            return
        if ttl <= 0:
            self.gone = self.gone | {lease}
        else:
            self.confirmed = (sent, lease)


class Membership:
    """Our lease, kept alive, and the keys we say on it (each written once, and again after a new lease)."""

    def __init__(self, gateway: Gateway, prefix: str, member: str, seconds: int) -> None:
        self._gateway, self._prefix, self.member, self.seconds = gateway, prefix, member, seconds
        self.lease = 0                                        # our lease's id (0: none yet)
        self._keepalive: Keepalive | None = None
        self._reported: int | None = None                    # the lease of the last refresh the core was told of
        self._said: dict[str, Any] = {"member": ""}          # key (its kind) → its value (None: no key)
        self._told: dict[str, Any] = {}                       # ... as etcd holds it (absent: unknown)

    def start(self) -> None:
        self.lease = self._grant()
        self._keepalive = Keepalive(self._gateway.poster(), lambda: self.lease)
        self._keepalive.start()

    def _grant(self) -> int:
        return int(self._gateway.post("/lease/grant", {"TTL": self.seconds})["ID"])

    @property
    def expired(self) -> bool:
        """etcd said our lease is gone (or we never had one): every key of ours went with it."""
        return self._keepalive is None or self._keepalive.expired

    def refresh(self) -> float | None:
        """When the last refresh of our lease that etcd confirmed was sent (the keepalive thread's); None when it had
        run out (our keys are gone: a new lease is taken, the keys said again, the switches must be claimed anew)."""
        keepalive = self._keepalive
        assert keepalive is not None, "refresh before start"
        if not keepalive.expired:
            at, self._reported = keepalive.confirmed
            return at
        sent = _time.monotonic()
        self.lease = self._grant()
        # etcd granted the lease for a whole term from no earlier than `sent`: that confirms it as a refresh would,
        # so the core may write as soon as it has heard of it, not a refresh later.
        keepalive.confirmed = (sent, self.lease)
        self.forget()
        return None

    def turned(self) -> None:
        """The core handled an event (the app says so after each): the keepalive may go on refreshing."""
        if self._keepalive is not None:
            self._keepalive.turned = _time.monotonic()

    def confirmed(self, now: float) -> bool:
        """Whether this member may write now, as the core judges it (cluster.py, SAFE_SHARE of the lease) but from
        the keepalive's latest word: the core hears of a refresh only when the loop gets to the next report, which
        a busy loop holds back. Only a refresh of the lease the core was last told of counts: after our lease ran
        out, nothing is written until the core has heard of the new one (and claimed the switches anew)."""
        if self._keepalive is None or self._keepalive.expired:
            return False
        at, lease = self._keepalive.confirmed
        return lease == self._reported and within_safe_share(at, self.seconds, now)

    def say(self, kind: str, value: Any) -> None:
        """Our key `kind`/<member> holds `value` (JSON; None: no key), in etcd from the next `tell`."""
        self._said[kind] = value

    def forget(self, kind: str | None = None) -> None:
        """What etcd holds of our key `kind` (None: of all of them) is unknown: said again at the next `tell`."""
        self._told = {} if kind is None else {k: v for k, v in self._told.items() if k != kind}

    def tell(self) -> None:
        """Our keys written where etcd holds something else. Our lease gone meanwhile (a peer revoked it, or it ran
        out) before the keepalive said so: a new one at the next pass, as the keepalive would have it; nothing is
        down. Any other error is raised."""
        try:
            for kind, value in list(self._said.items()):
                if kind in self._told and self._told[kind] == value:
                    continue
                key = b64(f"{self._prefix}{kind}/{self.member}")
                if value is None:
                    self._gateway.post("/kv/deleterange", {"key": key})
                else:
                    self._gateway.post("/kv/put", {"key": key, "value": b64(json.dumps(value)), "lease": self.lease})
                self._told[kind] = value
        except CoordinationError as err:
            if str(err) != LEASE_GONE:
                raise
            LOG.info("etcd: our lease is gone; taking a new one")
            assert self._keepalive is not None
            self._keepalive.lost()

    def leave(self) -> None:
        """Our lease revoked, so every key of ours goes now; the keepalive stopped."""
        try:
            if self.lease:
                self._gateway.post("/kv/lease/revoke", {"ID": self.lease})
        finally:
            if self._keepalive is not None:
                self._keepalive.stop()
