"""OVSDB adapter: bridges, ports and this controller's QoS/Queue rows, via ovsdbapp.

Every change of many ports' queues is one transaction with check_error=True: a port is never left
half-configured, and 1000 ports cost one transaction, not 1000. Rows are found through OVSDB's
name index, inside the transaction, so a change costs the same however many rows the database
holds. Rows this controller creates carry external_ids[OWNER_KEY] = owner, so it changes and removes
exactly its own and never another tool's QoS. ovsdbapp's Open_vSwitch transactions bump next_cfg
and wait for ovs-vswitchd to have applied them (cur_cfg), but only within what is left of the
transaction's own timeout, and then return as if it had (logging the timeout); apply() waits on
until cur_cfg has caught up, so the HTB classes exist when a change returns.

One controller per owner: the connection asks OVSDB for a lock named after the owner (as ovn-northd
does for its active/standby pairs); while another holds it, every transaction of ours is refused
by the server itself (python-ovs asserts the lock in each one).

Liveness: ovsdb-server probes no client of a unix socket, so a controller that hangs (SIGSTOP, a
deadlock) would keep the lock as long as its socket stays open. The active controller of a standby
pair therefore beats a heartbeat (a counter in Open_vSwitch external_ids, written without asking
vswitchd to reconfigure), and a standby that sees it stand still steals the lock (controller/adapters/
remotes.py), whereupon the hung one, should it resume, finds its transactions refused.

A cluster's members share the owner and take no lock: etcd decides who owns a switch, and the revision of
the ownership key is an epoch that only grows. Each transaction of a member for a switch's ports carries
that epoch as a condition on the bridge's external_ids[EPOCH_KEY-owner]: raised to it when lower, refused
when higher (another member owns the switch now), verified so that a raise by another member between
our read and our commit makes OVSDB refuse the commit. A deposed member's write fails even before it
learns from etcd that it is deposed.
"""
from __future__ import annotations

import logging
import queue
import time
from pathlib import Path
from typing import Any

from ovs.stream import Stream
from ovsdbapp import exceptions
from ovsdbapp.backend.ovs_idl import connection, idlutils, transaction
from ovsdbapp.schema.open_vswitch import impl_idl

from controller.adapters import private
from controller.adapters.ovsdb_commands import (
    OWNER_KEY,
    Beat,
    Fence,
    Fenced,
    NextGeneration,
    OvsdbError,
    ReadKey,
    RemoveOrphans,
    ReplacePortQos,
    SetKey,
    Steal,
    int_key,
)
from controller.adapters.ovsdb_replica import COLUMNS, BridgeCache, Replica
from controller.core.bridges import CAPACITY_KEY, DELAY_KEY, BridgeInfo
from controller.core.plan import ABSENT, FOREIGN
from controller.core.policy import LOCAL_OVSDB, PolicyError, delay_us, parse_rate
from controller.core.queues import OvsdbQos, QosSpec, QueueSpec

__all__ = ["DEFAULT_DB", "Fenced", "LockHeld", "Ovsdb", "OvsdbError", "Unconfirmed"]   # what the others use
LOG = logging.getLogger(__name__)
# Its one error, "Post-commit checks failed" (ovs-vswitchd slower than the timeout), logs every command of
# the transaction, megabytes for a policy on thousands of ports; we say what failed ourselves, in a line.
logging.getLogger("ovsdbapp.schema.open_vswitch.impl_idl").setLevel(logging.CRITICAL)
DEFAULT_DB = LOCAL_OVSDB
EPOCH_KEY = "ovs-qos-epoch"


def declared_capacity(value: str | None) -> int | None:
    """An interface's declared capacity (CAPACITY_KEY) in bit/s; None when absent or not a rate."""
    if value is None:
        return None
    try:
        return parse_rate(value, CAPACITY_KEY)
    except PolicyError:
        return None


def declared_delay(value: str | None) -> int | None:
    """An interface's declared one-way delay (DELAY_KEY) in µs; None when absent, zero or not a delay."""
    if value is None:
        return None
    try:
        return delay_us(value, DELAY_KEY) or None
    except PolicyError:
        return None


class LockHeld(OvsdbError):
    """Another controller of the same owner holds the OVSDB lock."""


LATE_SECONDS = 60.0   # a transaction past its timeout is waited for this much longer before it counts as lost
# Ports a transaction: ovsdbapp builds and sends a transaction on os-ken's event loop (its connection thread
# is green there), and 4000 ports held the loop for 3.3 s at once, longer at 10,000 than a switch waits for
# an echo reply (5 s) or a cluster member's lease lasts.
TRANSACTION_PORTS = 1000


class Unconfirmed(OvsdbError):
    """A transaction not answered in time: it may commit yet, or not; only a later read tells."""


class Ovsdb:
    def __init__(self, remote: str = DEFAULT_DB, owner: str = "default", timeout: float = 30.0,
                 lock_wait: float = 10.0, ssl: tuple[Path, Path, Path] | None = None, standby: bool = False,
                 lock: bool = True, late: float = LATE_SECONDS, probe: float | None = None):
        """`standby`: another controller of this owner holding the lock is waited for, not an error. `lock`
        False: the members of a cluster share the owner (etcd decides who writes what), so none locks. `late`:
        how long apply() waits, past `timeout`, for a transaction still queued to end. `probe`: seconds of silence
        after which a TCP or SSL session is probed, and as many again after which it is closed (python-ovs's
        default is 5): a path that drops everything is found as a close is."""
        self.owner, self.standby, self._late, self._remote = owner, standby, late, remote
        if ssl:   # python-ovs keeps one key, certificate and CA for all its SSL streams
            key, certificate, ca_cert = map(str, ssl)
            Stream.ssl_set_private_key_file(key)
            Stream.ssl_set_certificate_file(certificate)
            Stream.ssl_set_ca_cert_file(ca_cert)
        helper = idlutils.get_schema_helper(remote, "Open_vSwitch")
        for table, columns in COLUMNS.items():
            if columns is None:
                helper.register_table(table)
            else:
                helper.register_columns(table, columns)
        self._idl = Replica(remote, helper)
        if lock:
            self._idl.set_lock(lock_name(owner))    # before the connection starts (python-ovs asks that)
        # A server back is used within 2 s (python-ovs backs off to 8 s); its session is private, no other way.
        private.session(self._idl).reconnect.set_backoff(1000, 2000)
        if probe and not remote.startswith("unix:"):    # ovsdb-server is never probed over a unix socket
            private.session(self._idl).reconnect.set_probe_interval(int(probe * 1000))
        # ovsdbapp keeps one connection per API class: a class of our own per instance keeps them apart.
        api_class = type("QosOvsdbIdl", (impl_idl.OvsdbIdl,), {"_ovsdb_connection": None})
        self._api = api_class(connection.Connection(idl=self._idl, timeout=timeout))
        self._cache: dict[str, OvsdbQos | str | None] = {}
        self._depends: dict[Any, set[str]] = {}       # row uuid → the cached ports read from that row
        self._cache_session = -1                      # the connection the cache was read over
        self._bridges = BridgeCache()                 # datapath id → its bridge, kept until one of its rows changes
        self._bridges_session = -1                    # the connection they were read over
        self._swept_session = -1                      # the connection whose rows were all swept once
        self._by_datapath: dict[str, Any] | None = None   # datapath_id → its Bridge row, until bridges come or go
        if lock:
            self._wait_for_lock(lock_wait)

    @property
    def generation(self) -> int:
        """Changes whenever anything we plan from changes in OVSDB."""
        return self._idl.changes

    @property
    def _connection(self) -> int:
        """The session's connection number: a reconnection reloads every row without telling us of each."""
        seqno: int = private.session(self._idl).get_seqno()
        return seqno

    @property
    def connected(self) -> bool:
        """Connected and answering: the server has sent what we monitor since this connection was made. A TCP
        connect alone says nothing (a proxy, or a path that drops everything, accepts one and answers nothing)."""
        up: bool = private.session(self._idl).is_connected()
        return up and self._idl.state == self._idl.IDL_S_MONITORING

    @property
    def has_lock(self) -> bool:
        held: bool = self._idl.has_lock
        return held

    @property
    def lock_contended(self) -> bool:
        """Another session holds our owner's lock (not merely: we have not got it back yet)."""
        contended: bool = self._idl.is_lock_contended
        return contended

    def _wait_for_lock(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._idl.has_lock:
            if self._idl.is_lock_contended and self.standby:
                return
            if self._idl.is_lock_contended:
                self.close()
                raise LockHeld(f"another controller with owner {self.owner!r} is running on this OVSDB (it holds "
                               f"the lock {lock_name(self.owner)}); stop it, or give this one another owner")
            if time.monotonic() > deadline:
                self.close()
                raise OvsdbError(f"OVSDB did not answer the lock request within {seconds:g} s")
            time.sleep(0.05)

    @property
    def bridge_reads(self) -> dict[int, int]:
        """How many times each datapath's bridge was read from the replica (cache misses), by datapath id."""
        return self._bridges.reads

    def bridge(self, dp_id: int) -> BridgeInfo | None:
        """The bridge of that datapath id, read again only once one of the rows it was read from (its Bridge, Port
        and Interface rows) was made, removed or renumbered, or a bridge came, went or changed its datapath id
        (for an id no bridge had): python-ovs converts each column read, and a 100-port bridge was read twice per
        switch for each policy (checked, then planned), 2 s of a 10,000-port member's event loop. A change to one
        bridge reads that one again, not every switch's: emptied whole, the cache had a bridge joining a site of
        500 read all 500 again, each after a scan of the whole Bridge table, at every switch's next poll."""
        session = self._connection
        if session != self._bridges_session:
            self._bridges.clear()
            self._bridges_session, self._by_datapath = session, None
            self._idl.reshaped, self._idl.renumbered = set(), False
        elif self._idl.reshaped or self._idl.renumbered:
            reshaped, self._idl.reshaped = self._idl.reshaped, set()
            renumbered, self._idl.renumbered = self._idl.renumbered, False
            self._bridges.forget(reshaped, renumbered)
            if renumbered:
                self._by_datapath = None
        return self._bridges.get(dp_id, self._read_bridge)

    def _read_bridge(self, dp_id: int) -> tuple[BridgeInfo | None, list[Any]]:
        """The bridge and the uuids of the rows it was read from."""
        if self._by_datapath is None:    # one scan of the Bridge table per bridge made, removed or renumbered
            self._by_datapath = {}
            for row in self._api.tables["Bridge"].rows.values():
                if row.datapath_id:
                    self._by_datapath.setdefault(row.datapath_id[0], row)
        br = self._by_datapath.get(f"{dp_id:016x}")
        if br is None:
            return None, []
        ports = br.ports
        every = [iface for port in ports for iface in port.interfaces]
        ifaces = [iface for iface in every if iface.ofport and iface.ofport[0] > 0]
        declared = {iface.ofport[0]: bps for iface in ifaces
                    if (bps := declared_capacity(iface.external_ids.get(CAPACITY_KEY))) is not None}
        delays = {iface.ofport[0]: us for iface in ifaces
                  if (us := declared_delay(iface.external_ids.get(DELAY_KEY))) is not None}
        return (BridgeInfo(br.name, br.datapath_type, {iface.ofport[0]: iface.name for iface in ifaces},
                           declared=declared, delays=delays),
                [br.uuid, *(port.uuid for port in ports), *(iface.uuid for iface in every)])

    def port_qos(self, iface: str) -> OvsdbQos | str | None:
        """What OVSDB holds on the port: our queues read back, FOREIGN for another tool's, None for no QoS,
        ABSENT when OVSDB has no such port. Each port is read again only once a row it was read from (its
        Port, QoS or Queue rows) changed, or a port of its name was made: python-ovs converts every column
        it is asked for, which cost most of a cluster member's CPU while other members wrote their QoS."""
        session = self._connection
        if session != self._cache_session:
            self._cache, self._depends, self._cache_session = {}, {}, session
            self._idl.touched, self._idl.made = set(), set()
        if self._idl.touched or self._idl.made:
            touched, self._idl.touched = self._idl.touched, set()
            made, self._idl.made = self._idl.made, set()
            for name in made | {name for row in touched for name in self._depends.pop(row, ())}:
                self._cache.pop(name, None)
        if iface not in self._cache:
            self._cache[iface], rows = self._read_port_qos(iface)
            for row in rows:
                self._depends.setdefault(row, set()).add(iface)
        return self._cache[iface]

    def _read_port_qos(self, iface: str) -> tuple[OvsdbQos | str | None, list[Any]]:
        """The port's QoS and the uuids of the rows it was read from."""
        port = idlutils.row_by_value(self._api.idl, "Port", "name", iface, None)
        if port is None:
            return ABSENT, []
        if not port.qos:
            return None, [port.uuid]
        qos = port.qos[0]
        if not self._owned(qos):
            return FOREIGN, [port.uuid, qos.uuid]
        rows = sorted(qos.queues.items())
        queues = tuple(QueueSpec(queue_id, int_key(q.other_config, "min-rate"), int_key(q.other_config, "max-rate"),
                                 q.external_ids.get("class", ""), int_key(q.other_config, "priority"))
                       for queue_id, q in rows)
        return (OvsdbQos(qos.external_ids.get("mode", ""), int_key(qos.other_config, "max-rate"), queues, qos.type),
                [port.uuid, qos.uuid, *(q.uuid for _, q in rows)])

    def apply(self, changes: dict[str, QosSpec | None], tags: dict[str, str] | None = None,
              port_tags: dict[str, dict[str, str]] | None = None, epochs: dict[int, int] | None = None) -> None:
        """Every port's queues as given (None: ours off the port). The rows carry `tags` and the port's own
        `port_tags` in external_ids. Transactions of TRANSACTION_PORTS ports however many switches the ports
        are on, one after the other; only the last asks vswitchd to reconfigure (it reconfigures every port
        of the host for each request) and waits until it has: it then holds what the others wrote too.
        `epochs`: a cluster member's, by datapath id; each transaction fails with Fenced where a switch's
        epoch is newer."""
        items = list(changes.items())
        chunks = [dict(items[k:k + TRANSACTION_PORTS]) for k in range(0, len(items), TRANSACTION_PORTS)] or [{}]
        for k, chunk in enumerate(chunks):
            self._apply(chunk, tags, port_tags, epochs, reconfigure=k == len(chunks) - 1)
        # vswitchd builds ~100 ports' classes a second here when busy; one that is down is not waited for long.
        self._await_vswitchd(time.monotonic() + min(self._late, 5.0 + 0.01 * len(items)))

    def _apply(self, changes: dict[str, QosSpec | None], tags: dict[str, str] | None,
               port_tags: dict[str, dict[str, str]] | None, epochs: dict[int, int] | None, reconfigure: bool) -> None:
        # We log every refusal ourselves, in one line; ovsdbapp's own log would add a traceback to each.
        opened = self._api.transaction(check_error=True, log_errors=False) if reconfigure else \
            self._quiet_transaction()
        try:
            with opened as txn:
                if epochs:
                    txn.add(Fence(self._api, self._epoch_key, epochs, strict=True))
                for iface, spec in changes.items():
                    ids = {OWNER_KEY: self.owner, "iface": iface, **(tags or {}), **(port_tags or {}).get(iface, {})}
                    txn.add(ReplacePortQos(self._api, iface, spec, ids))
        except exceptions.TimeoutException:   # its text lists every command: thousands of lines for a policy
            # The transaction is still queued behind others (an ovs-vswitchd busy with thousands of ports): wait
            # for its end rather than send it again, or each retry would queue one more behind it.
            unconfirmed = Unconfirmed(f"OVSDB did not confirm the change of {len(changes)} ports within "
                                      f"{self._api.ovsdb_connection.timeout + self._late:g} s; what it holds is read "
                                      "again at the next poll")
            try:
                late = txn.results.get(timeout=self._late)
            except queue.Empty:
                raise unconfirmed from None
            if isinstance(late, idlutils.ExceptionResult):
                # Its own wait for the server ran out too (a silent partition): ovsdbapp's exception then has
                # no text at all (str() of it raises).
                raise unconfirmed if isinstance(late.ex, exceptions.TimeoutException) else late.ex from None

    def _await_vswitchd(self, deadline: float) -> None:
        """Until vswitchd has applied every change asked of it (cur_cfg reached next_cfg), or `deadline`. At
        10,000 ports the transactions took 44 s, ovsdbapp's wait for vswitchd ran out with them, and vswitchd
        built the ports' linux-htb classes for 80 s more, 1000 ports at a time (tc monitor)."""
        while True:
            row = next(iter(self._api.tables["Open_vSwitch"].rows.values()), None)
            if row is None or row.cur_cfg >= row.next_cfg or time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def _quiet_transaction(self) -> Any:
        """A transaction that asks nothing of vswitchd (no next_cfg to wait for), refusals raised, not logged."""
        connection = self._api.ovsdb_connection
        return transaction.Transaction(self._api, connection, connection.timeout, check_error=True, log_errors=False)

    def fence(self, epochs: dict[int, int]) -> dict[int, str]:
        """Raise each switch's epoch to ours where it is lower, in one transaction that asks nothing of
        vswitchd; the switches refused (a newer epoch, or no such bridge), each with why."""
        with self._quiet_transaction() as txn:
            found = txn.add(Fence(self._api, self._epoch_key, epochs, strict=False))
        refused: dict[int, str] = found.result
        return refused

    @property
    def _epoch_key(self) -> str:
        return f"{EPOCH_KEY}-{self.owner}"

    def generation_id(self) -> int:
        """The OpenFlow generation id the owner's active controller last claimed (0: none yet)."""
        row = next(iter(self._api.tables["Open_vSwitch"].rows.values()), None)
        return int_key(row.external_ids, self._generation_key) if row else 0

    def next_generation_id(self, above: int | None = None) -> int:
        """One more than the last this owner claimed, and than `above` (a switch's, which another owner may
        have set), kept in OVSDB: a controller that becomes active claims mastership with a newer id than
        any before it, whatever the hosts' clocks. The transaction carries our lock, so only the lock's
        holder can make it (OvsdbError otherwise)."""
        with self._api.transaction(check_error=True, log_errors=False) as txn:
            found = txn.add(NextGeneration(self._api, self._generation_key, self._epoch_key, above or 0))
        claimed: int = found.result
        return claimed

    def saved_policy(self, verified: bool) -> str | None:
        """A standby pair's policy as its holder last saved it (the JSON text; None: never saved). `verified`
        (the lock's holder only): read so that nothing saved before now is missed, by a transaction under
        our lock that verifies our replica's Open_vSwitch external_ids are the server's (or ovsdbapp runs
        it again once they are), so a write the last holder committed just before the lock came to us is in
        what we read; else as our replica holds it."""
        if not verified:
            row = next(iter(self._api.tables["Open_vSwitch"].rows.values()), None)
            return row.external_ids.get(self._policy_key) if row else None
        with self._quiet_transaction() as txn:
            found = txn.add(ReadKey(self._api, self._heartbeat_key, self._policy_key))
        text: str | None = found.result
        return text

    def save_policy(self, text: str) -> None:
        """Save a standby pair's policy (JSON text) in Open_vSwitch external_ids: the transaction asserts our
        lock, so OVSDB itself refuses the write of a holder deposed since (OvsdbError), however late it
        comes; the file a pair once shared had no such guard. Unconfirmed where OVSDB did not answer in
        time: the transaction stays queued, and commits if OVSDB answers later."""
        try:
            with self._quiet_transaction() as txn:
                txn.add(SetKey(self._api, self._policy_key, text))
        except exceptions.TimeoutException:   # its text lists the policy whole
            raise Unconfirmed(f"OVSDB did not confirm the save within {self._api.ovsdb_connection.timeout:g} s; "
                              "it may commit yet") from None

    @property
    def _policy_key(self) -> str:
        return f"{OWNER_KEY}-policy-{self.owner}"

    @property
    def _generation_key(self) -> str:
        return f"{OWNER_KEY}-generation-{self.owner}"

    def heartbeat(self) -> int:
        """The active controller's heartbeat as this replica holds it (0: none)."""
        row = next(iter(self._api.tables["Open_vSwitch"].rows.values()), None)
        return int_key(row.external_ids, self._heartbeat_key) if row else 0

    def beat(self) -> None:
        """One heartbeat. Unlike our other transactions it does not ask vswitchd to reconfigure (no next_cfg),
        so it costs vswitchd nothing; like them, it carries our lock."""
        with self._quiet_transaction() as txn:
            txn.add(Beat(self._api, self._heartbeat_key))

    def silent_for(self) -> float:
        """Seconds since ovsdb-server last said anything on this session (0 over a unix socket, which cannot
        stall on the way: this host's kernel carries it)."""
        return 0.0 if self._remote.startswith("unix:") else private.silent_for(self._idl)

    def steal_lock(self) -> None:
        """Take the owner's lock from the session holding it (RFC 7047 "steal"), which is told it was
        stolen. Sent from ovsdbapp's connection thread, which alone may touch the session (and flushes
        what is sent): queued there as a transaction would be."""
        self._api.ovsdb_connection.queue_txn(Steal(self._idl))

    @property
    def _heartbeat_key(self) -> str:
        return f"{OWNER_KEY}-alive-{self.owner}"

    def remove_orphans(self, everywhere: bool = True) -> int:
        """Remove our QoS rows no port uses and our Queue rows no QoS uses; returns how many. Not `everywhere`:
        only if a port or QoS stopped naming a row of ours that is still there (a QoS cleared by hand, a bridge
        removed) since the last time; our own changes remove what they replace, and reading every Port, QoS and
        Queue row after each of them cost a join 0.8 s of CPU beside 5000 ports (docs/benchmarks.md)."""
        # The first sweep over a connection reads every row: what went while we were away, no update told us of.
        session = self._connection
        everywhere = everywhere or session != self._swept_session
        try:
            with self._api.transaction(check_error=True, log_errors=False) as txn:
                found = txn.add(RemoveOrphans(self._api, self._owned, None if everywhere else self._idl.dropped))
        except Exception:
            self._swept_session = -1      # what it took from `dropped` is lost with it: the next sweep reads all
            raise
        if everywhere:
            self._swept_session = session
        return found.result or 0

    def close(self) -> None:
        self._api.ovsdb_connection.stop()

    def _owned(self, row: Any) -> bool:
        owner: str | None = row.external_ids.get(OWNER_KEY)
        return owner == self.owner


def lock_name(owner: str) -> str:
    """OVSDB lock names are ids (RFC 7047: letters, digits, '_'); the owner's bytes in hex keep them apart."""
    return f"ovs_qos_controller_{owner.encode().hex()}"


