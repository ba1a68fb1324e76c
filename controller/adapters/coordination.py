"""This controller as a member of its owner's cluster in etcd, through tooz as OpenStack services use it
([coordination] backend_url = etcd3+http://HOST:2379): the group it joins, the ownership keys of the
switches it owns, and the cluster's policy (controller/core/cluster.py decides; this only reads and writes).

Keys, under /ovs-qos/<owner>/: switch/<datapath id> holds the member that owns the switch, on that
member's lease (so it goes when the member does); unreachable/<member> lists the switches whose OVSDB
that member cannot reach, on its lease too, and sync/<member> what its switches hold of the policy (the
policy's revision it has in force, and per switch whether it is in sync); policy holds the policy in
force for the whole cluster, as the state file holds it for one controller ({"policy": <document or
null>}); lease/<member> the ids of that member's two leases, which a peer revokes when it hears the member's
OVSDB session close (controller/adapters/peers.py). Every call is a short HTTP request to etcd (green under
os-ken's eventlet); a failure raises CoordinationError.

The two leases (tooz's for our membership, ours for our keys) are refreshed by an OS thread of their own
(Keepalive), not by a greenthread: eventlet runs one greenthread at a time, and a large member's event
loop can be busy for seconds without a yield (parsing a 1000-port OVSDB transaction takes 1-2 s, a PUT
of 10,000 ports is checked and planned in one handler), which let a 4 s lease run out in the middle of
an apply. The loop still reads the cluster every second and takes the thread's last confirmed refresh
as its own; the thread stops refreshing when the core has handled no event for WEDGED_SECONDS (the app says
so after each one: `turned`), so a member whose loop hangs, or whose core no longer runs, gives its
switches up. SIGSTOP stops the thread too: a paused member's lease runs out.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import time
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any, assert_never

from eventlet import patcher

from controller.adapters import private
from controller.adapters.peers import PeerWatch
from controller.compat import hub
from controller.core import actions as act
from controller.core import events as ev
from controller.core.cluster import within_safe_share
from controller.core.keeper import SAVED_ABSENT, SAVED_CLEARED, SAVED_POLICY

LOG = logging.getLogger(__name__)
REFRESH_SECONDS = 1.0      # how often a member refreshes its lease (and reads the cluster, if no watch woke it)
CONNECTIONS = 256          # kept open to etcd: a hand-over releases each switch at once, on a greenthread of its own
CLAIM_BATCH = 64           # claims in one etcd transaction (etcd refuses more than 128 operations in one)
COALESCE_SECONDS = 0.02    # after a watch wakes the loop: changes arriving this soon are read with it
LEASE_GONE = "Not Found"   # what etcd's gateway answers a write on a lease it no longer has (HTTP 404)
SAVE_ATTEMPTS = 8          # a PUT read-then-CAS again when another landed in between: a bound, not a wait
WEDGED_SECONDS = 10.0      # the keepalive thread lets the leases run out once the core has handled nothing this long
_threading = patcher.original("threading")   # an OS thread (os-ken's eventlet patches `threading` green)
_time = patcher.original("time")


class CoordinationError(RuntimeError):
    """etcd did not answer, or refused. `unknown`: the request may have reached etcd and been carried out (its
    answer was lost, or etcd said it timed out); False only when it cannot have left this host."""

    def __init__(self, message: str, unknown: bool = False):
        super().__init__(message)
        self.unknown = unknown


def _unsent(err: BaseException) -> bool:
    """Whether a request that failed with `err` never reached etcd: the connection was refused or not made in time."""
    import requests  # type: ignore[import-untyped]  # etcd3gw's HTTP client
    from urllib3.exceptions import MaxRetryError, NewConnectionError
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, requests.exceptions.ConnectTimeout) or \
                isinstance(seen, MaxRetryError) and isinstance(seen.reason, NewConnectionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _policy_value(document: Any) -> str:
    """The policy key's value, the same bytes for the same document: etcd compares them to say "unchanged"."""
    return _b64(json.dumps({"policy": document}, sort_keys=True, separators=(",", ":")))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _text(value: str) -> str:
    return base64.b64decode(value).decode()


def _as_read(key: str, kvs: list[dict[str, Any]]) -> dict[str, Any]:
    """A transaction's condition: `key` still as a range read found it (`kvs`), modified by nobody since, or
    still absent."""
    return {"key": key, "result": "EQUAL", "target": "MOD", "mod_revision": kvs[0]["mod_revision"]} if kvs \
        else _absent(key)


def _absent(key: str) -> dict[str, Any]:
    """An etcd transaction's condition: the key (base64) does not exist."""
    return {"key": key, "result": "EQUAL", "target": "CREATE", "create_revision": 0}


def _range_end(prefix: str) -> str:
    """The key after every key that starts with `prefix` (etcd's prefix range)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class Keepalive:
    """Refreshes the leases `leases()` names (their ids, read anew each time) every REFRESH_SECONDS from an OS
    thread, while the core last handled an event (`turned`, set by the loop) within WEDGED_SECONDS. `confirmed`:
    when the last refresh that etcd answered for every lease was sent (monotonic), and the last lease's id (the
    one our keys are on); `gone`: the ids of leases etcd said are gone (the loop makes new ones). Plain
    attributes, each replaced whole: safe across the threads.
    `expired` asks about the leases held now: a round that read the ids just before the loop replaced them
    hears that the old ones are gone, which says nothing of the new ones (as a bare flag, that word would
    outlive them: a release would then be skipped as "the key went with the lease" while the key sat on a
    live one)."""

    def __init__(self, post: Callable[[str, dict[str, Any]], dict[str, Any]], leases: Callable[[], list[int]]):
        self._post, self._leases = post, leases
        self.turned: float = _time.monotonic()
        self.confirmed: tuple[float, int] = (self.turned, leases()[-1])   # a lease was just granted
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
        """etcd said a lease we hold now is gone."""
        return not self.gone.isdisjoint(self._leases())

    def lost(self) -> None:
        """The loop heard our leases are gone."""
        self.gone = frozenset(self._leases())

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = _time.monotonic()
            if sent - self.turned < WEDGED_SECONDS:
                self.round(self._leases(), sent)
            self._stop.wait(max(0.0, REFRESH_SECONDS - (_time.monotonic() - sent)))

    def round(self, leases: list[int], sent: float) -> None:
        """Refresh `leases`, read by the round sent at `sent`."""
        try:
            ttls = [int(self._post("/lease/keepalive", {"ID": lease}).get("result", {}).get("TTL", -1))
                    for lease in leases]
        except CoordinationError as err:    # the loop's own requests fail too, and say so
            LOG.debug("etcd: keepalive failed: %s", err)
            return
        gone = frozenset(lease for lease, ttl in zip(leases, ttls) if ttl <= 0)
        if gone:
            self.gone = self.gone | gone
        else:
            self.confirmed = (sent, leases[-1])


class Coordination:
    def __init__(self, url: str, owner: str, member: str, lease: int, ovsdb: str | None = None):
        """`lease`: seconds a member's keys outlive its last refresh (tooz's membership_timeout); `ovsdb`: the
        remote on which the members watch each other's sessions (controller/adapters/peers.py)."""
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
        self.url = url if "membership_timeout" in query else \
            f"{url}{'&' if '?' in url else '?'}membership_timeout={lease}&timeout={max(1, lease // 3)}"
        self.owner, self.member, self.lease_seconds = owner, member, lease
        self.group = f"ovs-qos-{owner}".encode()
        self.prefix = f"/ovs-qos/{owner}/"
        self._coord: Any = None
        self._lease: Any = None          # the lease our ownership keys are on
        self._keepalive: Keepalive | None = None
        self._reported_lease: int | None = None    # the lease of the last confirmed refresh the core was told of
        self._unreachable: frozenset[int] = frozenset()      # what we must tell the others ...
        self._told: frozenset[int] | None = frozenset()      # ... and what etcd holds of it (None: unknown)
        self._read_at = -REFRESH_SECONDS                       # when the cluster was last read on the second
        self._sync: ev.MemberSync | None = None                # what our switches hold ...
        self._sync_told: ev.MemberSync | None = None           # ... and what etcd holds of it
        self._wake = hub.Event()                               # the loop reads (and tells) at once
        self._policy: tuple[int, Any] | None = None            # the policy as last fetched: (revision, document)
        self._ovsdb = ovsdb
        self._peers: PeerWatch | None = None
        self._leases_told: list[int] | None = None             # our leases' ids as etcd holds them, for the peers
        self._outside = False                                  # out of the group until the first OVSDB hears us
        # etcd's revisions, as the core sees them, are etcd's plus `_base`: after etcd lost its data (its
        # revisions start again from 1) the base lifts them above every one seen before, so that ownership
        # epochs, generation ids and policy revisions keep growing (the switches refuse older ones). The base
        # key ("BASE TOKEN") is also the mark that etcd still holds the cluster's data: made with a new token
        # by whoever finds it gone.
        self._base, self._token = 0, ''                       # as the base key last said ('': not seen yet)
        self._seen = 0                                         # the highest revision (base included) seen
        self._highest = 0                                      # etcd's own highest revision seen
        self._lost: str | None = None                          # etcd's revision went back: a loss, or a restore
        self._restored: str | None = None                      # ... recovered: said with the next read
        self._members: tuple[str, ...] = ()                    # the group as last read
        self._pending_claims: list[act.ClaimSwitch] = []       # the core's, sent together by _claim_pending
        self._recovery: tuple[float, frozenset[str]] | None = None   # after a loss: until when, and whom, to wait

    def connect(self) -> None:
        """Join the owner's group (made if it is not there yet)."""
        import requests.adapters  # type: ignore[import-untyped]  # etcd3gw's HTTP client
        from tooz import coordination  # only a cluster's member needs it (and it is not in Ryu's venv)
        try:
            # Its etcd3gw driver, each call made by the caller: we wait for every one at once anyway, and tooz's
            # default pool thread polls its queue each second, which held a stopping member a second longer.
            coord: Any = coordination.get_coordinator(self.url, self.member.encode(), executor="synchronous")
            if "ca_cert" in self.url:
                # The URL's CA is the trust for etcd: requests would let REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE
                # in the environment override it (its session's verify loses to them), and refuse etcd.
                coord.client.session.trust_env = False
            # requests keeps 10 connections a host by default, and says so in a warning for each one more.
            for scheme in ("http://", "https://"):
                coord.client.session.mount(scheme, requests.adapters.HTTPAdapter(pool_maxsize=CONNECTIONS))
            coord.start(start_heart=False)
            self._create_group(coord)
            self._join(coord)
            self._lease = coord.client.lease(self.lease_seconds)
        except Exception as err:   # noqa: BLE001 - tooz and etcd3gw raise many kinds; all mean "not reached"
            raise CoordinationError(_why(err)) from None
        self._coord = coord
        self._keepalive = Keepalive(self._thread_post(coord),
                                    lambda: [private.membership_lease_id(coord), self._lease.id])
        self._keepalive.start()
        if self._ovsdb is not None and self._peers is None:
            self._peers = PeerWatch(self._ovsdb, self.owner, self.member, self._revoker(self._thread_post(coord)),
                                    probe=self.lease_seconds / 3)
            self._peers.start()

    def _revoker(self, post: Callable[[str, dict[str, Any]], dict[str, Any]]) -> Callable[[str], None]:
        """For the peer watch's thread: revoke the leases a member that is gone published, so that its keys go
        now (its switches are claimed by the ring's next owners at once) rather than when they run out."""
        def gone(peer: str) -> None:
            try:
                kvs = post("/kv/range", {"key": _b64(f"{self.prefix}lease/{peer}")}).get("kvs", [])
                leases = json.loads(_text(kvs[0]["value"])) if kvs else []
                for lease in leases:
                    with contextlib.suppress(CoordinationError):   # gone already: it left, or ran out
                        post("/kv/lease/revoke", {"ID": lease})
            except CoordinationError as err:
                LOG.warning("etcd: member %s's OVSDB session closed, but its leases were not revoked (%s); its "
                            "switches move when its lease runs out", peer, err)
                return
            if leases:
                LOG.warning("member %s's OVSDB session closed: its leases revoked, its switches move now", peer)
        return gone

    def _thread_post(self, coord: Any) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
        """A POST to etcd for the keepalive thread, on a session of its own (requests' are not thread-safe)."""
        import requests
        session = requests.Session()
        session.verify, session.cert, session.trust_env = (coord.client.session.verify, coord.client.session.cert,
                                                           coord.client.session.trust_env)
        timeout = max(1, self.lease_seconds // 3)

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            try:
                answer = session.post(coord.client.get_url(path), json=body, timeout=timeout)
                answer.raise_for_status()
                result: dict[str, Any] = answer.json()
            except Exception as err:   # noqa: BLE001
                raise CoordinationError(_why(err)) from None
            return result
        return post

    def _create_group(self, coord: Any) -> None:
        from tooz import coordination
        with contextlib.suppress(coordination.GroupAlreadyExist):
            coord.create_group(self.group).get()

    def _join(self, coord: Any) -> None:
        from tooz import coordination
        try:
            coord.join_group(self.group).get()
        except coordination.MemberAlreadyExist:   # our key from before a restart, on the old (dying) lease
            coord.leave_group(self.group).get()
            coord.join_group(self.group).get()

    @property
    def connected(self) -> bool:
        return self._coord is not None

    def refresh(self) -> float | None:
        """When the last refresh of our leases that etcd confirmed was sent (the keepalive thread's); None when
        a lease had run out (our keys are gone: new leases are taken, and the switches must be claimed anew)."""
        keepalive = self._keepalive
        assert keepalive is not None, "refresh before connect"
        if not keepalive.expired:
            at, self._reported_lease = keepalive.confirmed
            return at
        sent = _time.monotonic()
        try:
            self._coord.heartbeat()          # tooz's membership lease, made anew if it ran out
            if self._lease.refresh() == -1:
                self._lease = self._coord.client.lease(self.lease_seconds)
        except Exception as err:   # noqa: BLE001
            raise CoordinationError(_why(err)) from None
        # etcd granted (or refreshed) both leases for a whole term from no earlier than `sent`: that confirms
        # them as a refresh would, so the core may write as soon as it has heard of them, not a refresh later.
        keepalive.confirmed = (sent, self._lease.id)
        keepalive.gone = frozenset()
        return None

    def turned(self) -> None:
        """The core handled an event (the app says so after each): the keepalive may go on refreshing."""
        if self._keepalive is not None:
            self._keepalive.turned = time.monotonic()

    def confirmed(self, now: float) -> bool:
        """Whether this member may write now, as the core judges it (cluster.py, SAFE_SHARE of the lease) but from
        the keepalive's latest word: the core hears of a refresh only when the loop gets to the next report, which
        a busy loop holds back. Only a refresh of the lease the core was last told of counts: after our leases
        ran out, nothing is written until the core has heard of the new one (and claimed the switches anew)."""
        if self._keepalive is None or self._keepalive.expired:
            return False
        at, lease = self._keepalive.confirmed
        return lease == self._reported_lease and within_safe_share(at, self.lease_seconds, now)

    def mark(self, dp_ids: frozenset[int]) -> None:
        """The switches whose OVSDB we cannot reach: written to etcd with the next refresh."""
        self._unreachable = dp_ids

    def publish(self, sync: ev.MemberSync) -> None:
        """What our switches hold: written to etcd at once (the loop wakes for it)."""
        self._sync = sync
        self._wake.set()

    def _tell(self) -> None:
        leases = [private.membership_lease_id(self._coord), self._lease.id]
        # What a peer revokes when our OVSDB session closes: said only while we hold our lock (peers.py).
        if self._peers is not None and self._peers.own_held and self._leases_told != leases:
            self._post("/kv/put", {"key": _b64(f"{self.prefix}lease/{self.member}"), "value": _b64(json.dumps(leases)),
                                   "lease": self._lease.id})
            self._leases_told = leases
        if self._told != self._unreachable:
            key = _b64(f"{self.prefix}unreachable/{self.member}")
            if self._unreachable:
                self._post("/kv/put", {"key": key, "value": _b64(json.dumps(sorted(self._unreachable))),
                                       "lease": self._lease.id})
            else:
                self._post("/kv/deleterange", {"key": key})
            self._told = self._unreachable
        if self._sync is not None and self._sync_told != self._sync:
            sync = self._sync
            self._post("/kv/put", {"key": _b64(f"{self.prefix}sync/{self.member}"), "lease": self._lease.id,
                                   "value": _b64(json.dumps({"revision": sync.revision, "switches": {
                                       f"{dp:016x}": held for dp, held in sync.switches.items()}}))})
            self._sync_told = sync

    def read(self) -> ev.ClusterChanged:
        """The members, the switches' owners, etcd's revision at the read, the policy (revision, document), the
        switches each member cannot reach and what each says its switches hold (refreshed_at: unknown here).
        Every key is read in one transaction, the policy's without its value: it is fetched only when its
        revision moved (a policy of 10,000 ports is a megabyte, and this runs every second)."""
        members, answer = self._read_all()
        before = answer["responses"][0]["response_range"].get("kvs", [])
        marker = next((_text(kv["value"]).split() for kv in before if kv["key"] == self._base_key), None)
        if self._lost is None and marker is None and self._token:
            self._lost = "the cluster's keys are gone"
        elif self._lost is None and marker is not None and self._token and marker[1] != self._token:
            self._lost = "another member found the cluster's keys gone"
        if self._lost is not None or marker is None or marker[1] != self._token or int(marker[0]) > self._base:
            self._settle_base()        # made, raised above what we saw after a loss, or adopted
            members, answer = self._read_all()
        before, stored, after = (r["response_range"].get("kvs", []) for r in answer["responses"])
        policy = self._fetch_policy(self._base + int(stored[0]["mod_revision"])) if stored else None
        owners: dict[int, str] = {}
        unreachable: dict[str, frozenset[int]] = {}
        sync: dict[str, ev.MemberSync] = {}
        for kv in [*before, *after]:
            key, value = _text(kv["key"])[len(self.prefix):], _text(kv.get("value", ""))
            if key.startswith("switch/"):
                owners[int(key[len("switch/"):], 16)] = value
            elif key.startswith("unreachable/"):
                unreachable[key[len("unreachable/"):]] = frozenset(json.loads(value))
            elif key.startswith("sync/"):
                said = json.loads(value)
                sync[key[len("sync/"):]] = ev.MemberSync(said["revision"], {
                    int(dp, 16): held for dp, held in said["switches"].items()})
        self._members = members
        return ev.ClusterChanged(members, owners, self._base + int(answer["header"]["revision"]), policy, None,
                                 unreachable, sync)

    def _read_all(self) -> tuple[tuple[str, ...], dict[str, Any]]:
        """The group's members, and every key in one transaction (the policy's without its value)."""
        policy_key = self._policy_key
        from tooz import coordination
        try:
            try:
                members = tuple(sorted(m.decode() for m in self._coord.get_members(self.group).get()))
            except coordination.GroupNotCreated:    # etcd lost its data: the group is made again, and we join
                self._create_group(self._coord)
                self._join(self._coord)
                members = tuple(sorted(m.decode() for m in self._coord.get_members(self.group).get()))
            answer = self._post("/kv/txn", {"success": [
                {"request_range": {"key": _b64(self.prefix), "range_end": _b64(policy_key)}},
                {"request_range": {"key": _b64(policy_key), "keys_only": True}},
                {"request_range": {"key": _b64(policy_key + "\0"), "range_end": _b64(_range_end(self.prefix))}}]})
        except CoordinationError:
            raise
        except Exception as err:   # noqa: BLE001
            raise CoordinationError(_why(err)) from None
        return members, answer

    @property
    def _policy_key(self) -> str:
        return f"{self.prefix}policy"

    @property
    def _base_key(self) -> str:
        return _b64(f"{self.prefix}base")

    def _settle_base(self) -> None:
        """The base key made (a new cluster), adopted (another member's), or, after etcd lost its data (emptied, or
        restored from an older snapshot), raised above every revision we saw and the policy we had in force put
        back where there is none: never nothing in its place. The group, our membership and our leases are made
        again by the pass that follows, as after a lease ran out."""
        reason = self._lost
        want = self._seen if reason else 0
        while True:
            kvs = self._post("/kv/range", {"key": self._base_key}).get("kvs", [])
            said = _text(kvs[0]["value"]).split() if kvs else ["0", uuid.uuid4().hex]
            base, token = int(said[0]), said[1]
            if kvs and base >= want:
                break
            if self._post("/kv/txn", {"compare": [_as_read(self._base_key, kvs)], "success": [
                    {"request_put": {"key": self._base_key, "value": _b64(f"{want} {token}")}}]}).get("succeeded"):
                base = want
                break
        self._base, self._token, self._lost = max(self._base, base), token, None
        if reason is None:
            return
        self._reseed()
        self._post("/kv/put", {"key": _b64(f"{self.prefix}reseeded/{self.member}"), "value": _b64(token)})
        self._recovery = (time.monotonic() + self.lease_seconds, frozenset(self._members) - {self.member})
        self._restored = f"{reason}; revisions now count from {self._base}" + \
            (", its copy of the policy put back unless a newer one was" if self._policy is not None else "")
        LOG.error("etcd lost its data (%s): recovered, %s", reason, self._restored.split("; ", 1)[1])
        self._told = self._sync_told = self._leases_told = None

    def _reseed(self) -> None:
        """After a loss, the policy in force put back: the newest that any member had, never an older one over it.
        Each member that finds the loss puts its copy unless the one stored is newer: a seed (stored with its
        revision from before the loss, in the same transaction) from a newer copy, or a policy PUT since."""
        if self._policy is None:
            return
        revision, document = self._policy
        key, seeded = _b64(self._policy_key), _b64(f"{self.prefix}seeded")
        put = [{"request_put": {"key": key, "value": _policy_value(document)}},
               {"request_put": {"key": seeded, "value": _b64(f"{revision:020d}")}}]
        while True:
            answer = self._post("/kv/txn", {"success": [{"request_range": {"key": key}},
                                                        {"request_range": {"key": seeded}}]})
            stored, seed = (r["response_range"].get("kvs", []) for r in answer["responses"])
            if stored and not (seed and seed[0]["mod_revision"] == stored[0]["mod_revision"]
                               and int(_text(seed[0]["value"])) < revision):
                return
            compare = [_as_read(key, stored), _as_read(seeded, seed)]
            if self._post("/kv/txn", {"compare": compare, "success": put}).get("succeeded"):
                return

    def _recovering(self) -> bool:
        """After a loss, until every member of the group before it has put back its copy of the policy (or a lease
        has passed): until then a member that held an older copy would apply it, and claim switches the others
        have not yet claimed again."""
        if self._recovery is None:
            return False
        deadline, waiting = self._recovery
        kvs = self._post("/kv/range", {"key": _b64(f"{self.prefix}reseeded/"),
                                       "range_end": _b64(_range_end(f"{self.prefix}reseeded/"))}).get("kvs", [])
        done = {_text(kv["key"]).rsplit("/", 1)[1] for kv in kvs if _text(kv["value"]) == self._token}
        if waiting <= done or time.monotonic() > deadline:
            self._recovery = None
        return self._recovery is not None

    def _fetch_policy(self, revision: int) -> tuple[int, Any] | None:
        """The policy (revision, document) at `revision` or later: the one fetched last if it is that one."""
        if self._policy is None or self._policy[0] != revision:
            kvs = self._post("/kv/range", {"key": _b64(self._policy_key)}).get("kvs", [])
            self._policy = (self._base + int(kvs[0]["mod_revision"]),
                            json.loads(_text(kvs[0]["value"])).get("policy")) if kvs else None
        return self._policy

    def _lease_gone(self, err: CoordinationError) -> None:
        """Our leases went (revoked by a peer that took us for dead, or run out) before the keepalive said so:
        new ones at the next pass, as the keepalive would have it, and the keys and the group joined on them
        then; nothing is down. Any other error is raised."""
        if str(err) != LEASE_GONE:
            raise err
        LOG.info("etcd: our lease is gone; taking new ones")
        assert self._keepalive is not None
        self._keepalive.lost()

    def _rejoin(self) -> None:
        try:
            self._join(self._coord)
        except Exception as err:   # noqa: BLE001
            raise CoordinationError(_why(err)) from None

    def claim(self, dp_id: int, renew: bool) -> int | None:
        """Make the switch's key ours, on our lease: only if it has none (or, to renew, only if it is ours). The
        revision of the write, which is the key's; None when the condition failed."""
        return self.claims([(dp_id, renew)])[0]

    def claims(self, wanted: list[tuple[int, bool]]) -> list[int | None]:
        """`claim` of each (dp_id, renew), CLAIM_BATCH of them in one transaction of etcd's, each claim a
        transaction of its own inside it (it succeeds or fails alone): a take-over of a hundred switches is two
        round trips, not a hundred. The claims of one transaction share its revision."""
        found: list[int | None] = []
        for at in range(0, len(wanted), CLAIM_BATCH):
            batch = wanted[at:at + CLAIM_BATCH]
            ops = []
            for dp_id, renew in batch:
                key = _b64(f"{self.prefix}switch/{dp_id:016x}")
                compare = {"key": key, "result": "EQUAL", "target": "VALUE", "value": _b64(self.member)} \
                    if renew else _absent(key)
                ops.append({"request_txn": {"compare": [compare], "success": [
                    {"request_put": {"key": key, "value": _b64(self.member), "lease": self._lease.id}}]}})
            answer = self._post("/kv/txn", {"success": ops})
            revision = self._base + int(answer["header"]["revision"])
            found += [revision if r["response_txn"].get("succeeded") else None for r in answer["responses"]]
        return found

    def release(self, dp_id: int) -> None:
        """Delete the switch's key if it is ours; tried again each second until etcd confirms it, or until our lease
        ran out (the key went with it): the member the ring names cannot claim the switch while our key holds it."""
        key = _b64(f"{self.prefix}switch/{dp_id:016x}")
        said = False
        while self._keepalive is not None and not self._keepalive.expired:
            try:
                self._post("/kv/txn", {"compare": [{"key": key, "result": "EQUAL", "target": "VALUE",
                                                    "value": _b64(self.member)}],
                                       "success": [{"request_delete_range": {"key": key}}]})
                return
            except CoordinationError as err:
                if not said:
                    LOG.warning("etcd: switch %016x not released yet (%s); tried again every second", dp_id, err)
                said = True
            hub.sleep(REFRESH_SECONDS)

    def save_policy(self, document: Any, expect: int | None = None) -> ev.PolicySaved:
        """The cluster's policy (None: cleared), in one transaction that etcd decides: without `expect`, kept
        unless the key holds this very document (then unchanged, at its revision); with it, kept only if the
        key is still at that revision (0: absent; ANY_POLICY: holds a policy, not a cleared one), else refused
        with the revision it is at."""
        key, value = _b64(self._policy_key), _policy_value(document)
        read, put = {"request_range": {"key": key}}, {"request_put": {"key": key, "value": value}}
        if expect is None:
            # A put conditional on the revision just read, never a blind one: a transaction that a partition held
            # back and delivered after a newer policy was stored then changes nothing (its sender said 504).
            for _ in range(SAVE_ATTEMPTS):
                kvs = self._post("/kv/range", {"key": key}).get("kvs", [])
                if kvs and kvs[0]["value"] == value:
                    return ev.PolicySaved(None, self._base + int(kvs[0]["mod_revision"]), changed=False)
                answer = self._post("/kv/txn", {"compare": [_as_read(key, kvs)], "success": [put]})
                if answer.get("succeeded"):
                    return self._saved(document, answer)
            raise CoordinationError(f"the policy changed {SAVE_ATTEMPTS} times while this one was being stored; "
                                    "nothing of it was stored")
        condition: dict[str, Any]
        if expect == ev.ANY_POLICY:        # a policy stored, not a cleared one (etcd fails a value compare on no key)
            condition = {"key": key, "result": "NOT_EQUAL", "target": "VALUE", "value": _policy_value(None)}
        elif 0 < expect <= self._base:     # a revision from before etcd lost its data: none is at it now
            condition = {"key": key, "result": "LESS", "target": "MOD", "mod_revision": 0}   # never true
        else:
            condition = _absent(key) if expect == 0 else {"key": key, "result": "EQUAL", "target": "MOD",
                                                           "mod_revision": expect - self._base}
        answer = self._post("/kv/txn", {"compare": [condition], "success": [put], "failure": [read]})
        if answer.get("succeeded"):
            return self._saved(document, answer)
        kvs = answer["responses"][0]["response_range"].get("kvs", [])
        return ev.PolicySaved(None, self._base + int(kvs[0]["mod_revision"]) if kvs else 0, conflict=True)

    def _saved(self, document: Any, answer: dict[str, Any]) -> ev.PolicySaved:
        """A policy stored: also this member's copy, should etcd lose its data before the next read fetches it."""
        revision = self._base + int(answer["header"]["revision"])
        if self._policy is None or self._policy[0] < revision:
            self._policy = (revision, document)
        return ev.PolicySaved(None, revision)

    def current_policy(self) -> tuple[Any, int]:
        """The cluster's policy as etcd holds it now (a linearizable read, never this member's copy): the document
        (None: none or cleared) and its revision (0: none)."""
        if not self.connected:
            raise CoordinationError("not connected to etcd")
        kvs = self._post("/kv/range", {"key": _b64(self._policy_key)}).get("kvs", [])
        if not kvs:
            return None, 0
        return json.loads(_text(kvs[0]["value"])).get("policy"), self._base + int(kvs[0]["mod_revision"])

    # --- as the app uses it: outcomes as the core's events ---------------------------------------------------
    def run(self, post: Callable[[ev.Event], None]) -> None:
        """Our lease refreshed each second; the cluster read then and as soon as etcd's watch says a member or a
        key of ours changed (a member gone, its keys expired, a policy stored: acted on within milliseconds,
        not at the next second), and posted for the core, which decides what follows. etcd down (at start or
        later) is tried again every second, said once, and changes nothing on a switch."""
        watches: list[Any] = []
        failing: str | None = None
        try:
            while True:
                failing = self._turn(post, failing, watches)
                if self._wake.wait(timeout=max(0.0, REFRESH_SECONDS - (time.monotonic() - self._read_at))):
                    hub.sleep(COALESCE_SECONDS)          # a burst of changes (claims, expiries) is read once
                self._wake.clear()
        finally:
            for watch in watches:
                hub.kill(watch)

    def _turn(self, post: Callable[[ev.Event], None], failing: str | None, watches: list[Any]) -> str | None:
        """One pass: connect if need be, take the keepalive's word on our leases (new ones if they ran out), read
        the cluster and post it; what failed (None: nothing)."""
        sent = _time.monotonic()
        if sent - self._read_at >= REFRESH_SECONDS:
            self._read_at = sent                 # read again a second later, whatever follows
        try:
            if not self.connected:
                self.connect()
            if failing is not None or not watches:       # a watch may hang on a cut connection: made anew
                for watch in watches:
                    hub.kill(watch)
                watches[:] = [hub.spawn(self._watch, prefix)
                              for prefix in (self.prefix, private.group_prefix(self._coord, self.group))]
            refreshed = self.refresh()
            if refreshed is None:
                self._told = self._sync_told = self._leases_told = None      # our keys went with the lease
            try:
                self._tell()
            except CoordinationError as err:
                self._lease_gone(err)
            cluster = self.read()
            assert cluster.members is not None
            if self._peers is not None:
                self._peers.peers = frozenset(cluster.members)
            if self.member not in cluster.members and self._peers is not None and not self._peers.own_held:
                # The others take us for dead when our session with the first OVSDB closed (peers.py): we
                # join again once it is back, rather than claim switches only to give them up again.
                if not self._outside:
                    LOG.warning("etcd: member %s is out of the group and %s does not hear it; joining again once "
                                "it does", self.member, self._ovsdb)
                self._outside = True
            elif self.member not in cluster.members:
                # Our membership's lease ran out (a pause, a cut): tooz takes a new lease but joins no
                # group again, and the others' ring would pass over us for good.
                LOG.warning("etcd: member %s had left the group (its lease ran out); joining again", self.member)
                try:
                    self._rejoin()
                    self._outside = False
                except CoordinationError as err:   # on the membership lease a peer has just revoked
                    self._lease_gone(err)
            if self._recovering():
                post(ev.ClusterChanged(None, {}, 0, None, None))     # no switch changed meanwhile, as with etcd down
                return failing
            post(dataclasses.replace(cluster, refreshed_at=refreshed, restored=self._restored))
            if failing is not None:
                LOG.info("etcd answers again; member %s", self.member)
            return None
        except CoordinationError as err:
            if failing != str(err):
                LOG.error("etcd: %s; this member changes no switch until it answers (tried every second)", err)
            post(ev.ClusterChanged(None, {}, 0, None, None))
            return str(err)

    def _watch(self, prefix: str) -> None:
        """Wake the loop at each change etcd reports under `prefix` that calls for a read now (and once the watch is
        made, for what changed before it); a watch that fails is made again a second later."""
        body = {"create_request": {"key": _b64(prefix), "range_end": _b64(_range_end(prefix))}}
        while True:
            try:
                client = self._coord.client
                with client.session.post(client.get_url("/watch"), json=body, stream=True,
                                         timeout=(client.timeout, None)) as answer:
                    answer.raise_for_status()
                    for line in answer.iter_lines():
                        if line and wakes(line, f"{self.prefix}switch/"):
                            self._wake.set()     # "created" first, then each batch of events
            except Exception as err:   # noqa: BLE001 - the second's pass reads anyway; the watch only hastens it
                LOG.debug("etcd: watch on %s ended: %s", prefix, _why(err))
            hub.sleep(REFRESH_SECONDS)

    def execute(self, action: act.ClaimSwitch | act.ReleaseSwitch | act.Unreachable | act.PublishSync,
                post: Callable[[ev.Event], None]) -> None:
        """A cluster's action of the core's: etcd's round trips in greenthreads of their own (a claim's outcome
        posted as events.SwitchClaimed), what other members are told written with the next pass."""
        match action:
            case act.ClaimSwitch():
                if not self._pending_claims:      # the claims of this one event, sent together once it is handled
                    hub.spawn(self._claim_pending, post)
                self._pending_claims.append(action)
            case act.ReleaseSwitch():
                hub.spawn(self.release, action.dp_id)
            case act.Unreachable():
                LOG.warning("switches whose OVSDB this member cannot reach, left to members that can: %s",
                            ", ".join(f"{dp:016x}" for dp in sorted(action.dp_ids)) or "none now")
                self.mark(action.dp_ids)
            case act.PublishSync():
                self.publish(action.sync)
            case _:
                assert_never(action)

    def _claim_pending(self, post: Callable[[ev.Event], None]) -> None:
        """The claims the core asked for since this greenthread was spawned, in as few transactions as may be; each
        one's outcome posted as events.SwitchClaimed (None for all when etcd did not answer: the next read finds
        which of ours it holds)."""
        pending, self._pending_claims = self._pending_claims, []
        try:
            revisions = self.claims([(claim.dp_id, claim.renew) for claim in pending])
        except CoordinationError as err:
            LOG.warning("etcd: cannot claim switches %s: %s", ", ".join(f"{c.dp_id:016x}" for c in pending), err)
            revisions = [None] * len(pending)
        for claim, revision in zip(pending, revisions):
            post(ev.SwitchClaimed(claim.dp_id, revision))

    def policy_loaded(self) -> ev.PolicyLoaded:
        """The cluster's policy, if etcd answers now (else it comes with etcd's first answer)."""
        try:
            if not self.connected:
                self.connect()
            policy = self.read().policy
        except CoordinationError as err:
            return ev.PolicyLoaded(SAVED_ABSENT, error=f"etcd: {err}; the cluster's policy is put in force once "
                                                       "etcd answers")
        if policy is None:
            return ev.PolicyLoaded(SAVED_ABSENT)
        return ev.PolicyLoaded(SAVED_CLEARED if policy[1] is None else SAVED_POLICY, policy[1], revision=policy[0])

    def policy_saved(self, document: Any, revision: int = 0, expect: int | None = None) -> ev.PolicySaved:
        """`revision` is etcd's to give, not ours."""
        try:
            return self.save_policy(document, expect)
        except CoordinationError as err:
            return ev.PolicySaved(f"etcd: {err}", indeterminate=err.unknown)

    def leave(self) -> None:
        """A clean stop: both our leases revoked first, as a peer revokes a dead member's (peers.py): our
        membership and our switches' keys go together, and the others claim our switches at their next read."""
        if self._coord is None:
            return
        try:
            for lease in (private.membership_lease_id(self._coord), self._lease.id):
                self._post("/kv/lease/revoke", {"ID": lease})
            LOG.info("etcd: member %s left (its leases revoked): its switches are the others' to claim", self.member)
        except CoordinationError as err:
            LOG.warning("etcd: could not leave the group cleanly (%s); our keys expire with our lease", err)
        if self._keepalive is not None:
            self._keepalive.stop()
        if self._peers is not None:
            self._peers.stop()
        with contextlib.suppress(Exception):   # tooz's own leave finds our membership gone: nothing to do
            self._coord.stop()
        self._coord = None

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._coord is None:
            raise CoordinationError("not connected to etcd")
        client = self._coord.client
        floor = self._highest    # answered before this was sent: etcd serves this at that revision or later
        try:
            answer: dict[str, Any] = client.post(client.get_url(path), json=body)
        except Exception as err:   # noqa: BLE001
            raise CoordinationError(_why(err), unknown=not _unsent(err)) from None
        revision = int(answer.get("header", {}).get("revision", 0))
        if 0 < revision < floor and self._lost is None:   # etcd's revisions never go back but by a loss
            self._lost = f"its revision went back from {floor} to {revision}"
            self._highest = revision
        self._highest = max(self._highest, revision)
        self._seen = max(self._seen, self._base + revision)
        return answer


def wakes(line: bytes, claims: str) -> bool:
    """Whether a line of etcd's watch calls for a read at once: anything but switches claimed (keys under `claims`
    put), which only the ring's owner does, and the second's read sees soon enough. A take-over of a hundred
    switches would otherwise have each member read the cluster again while its own switches' role replies wait."""
    try:
        events = json.loads(line).get("result", {}).get("events", [])
    except ValueError:
        return True
    return not events or any(event.get("type") == "DELETE" or not _text(event["kv"]["key"]).startswith(claims)
                             for event in events)


def _why(err: BaseException) -> str:
    """One line: the error's text, or (etcd3gw raises some without any) its cause's."""
    text = " ".join(str(err).split())[:300]
    cause = err.__cause__ or err.__context__
    if not text and cause is not None:
        return f"{type(err).__name__}: {_why(cause)}"
    return text or type(err).__name__
