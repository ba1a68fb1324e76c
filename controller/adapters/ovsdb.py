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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ovs.db.idl import ROW_CREATE, ROW_DELETE, ROW_UPDATE
from ovs.stream import Stream
from ovsdbapp import exceptions
from ovsdbapp.backend.ovs_idl import command, connection, idlutils, transaction
from ovsdbapp.schema.open_vswitch import impl_idl

from controller.adapters import private
from controller.core.bridges import CAPACITY_KEY, DELAY_KEY, BridgeInfo
from controller.core.plan import ABSENT, FOREIGN
from controller.core.policy import LOCAL_OVSDB, PolicyError, delay_us, parse_rate
from controller.core.queues import OvsdbQos, QosSpec, QueueSpec
from controller.core.role import not_older

LOG = logging.getLogger(__name__)
# Its one error, "Post-commit checks failed" (ovs-vswitchd slower than the timeout), logs every command of
# the transaction, megabytes for a policy on thousands of ports; we say what failed ourselves, in a line.
logging.getLogger("ovsdbapp.schema.open_vswitch.impl_idl").setLevel(logging.CRITICAL)
DEFAULT_DB = LOCAL_OVSDB
OWNER_KEY = "ovs-qos-controller"
EPOCH_KEY = "ovs-qos-epoch"
# Only the columns we read: vswitchd rewrites every Interface's statistics every few seconds, and any
# replicated change bumps the IDL's change number, which is what our read cache is keyed by.
COLUMNS = {"Open_vSwitch": ["bridges", "next_cfg", "cur_cfg",       # next/cur_cfg: waiting for vswitchd
                            "external_ids"],                          # the owner's OpenFlow generation id
           "Bridge": ["name", "datapath_id", "datapath_type", "ports",
                      "external_ids"],                               # a cluster's epochs (fencing)
           "Port": ["name", "interfaces", "qos"],
           "Interface": ["name", "ofport", "external_ids"],   # external_ids: a declared capacity and delay
           "QoS": None, "Queue": None}


# Columns whose changes are no change to what we plan from: the generation id and the heartbeat, the
# epochs, and next_cfg and cur_cfg, which every transaction of anyone's moves.
QUIET = {"Open_vSwitch": {"external_ids", "next_cfg", "cur_cfg"}, "Bridge": {"external_ids"}}
# The column by which a row names the rows that become unused when it stops naming them (when it changes or goes).
DROPPED = {"Port": "qos", "QoS": "queues"}
# What a bridge's reading (Ovsdb.bridge) is made of: a change to another column (a port's QoS, statistics) keeps it.
TOPOLOGY = {"Bridge": {"name", "datapath_id", "datapath_type", "ports"}, "Port": {"name", "interfaces"},
            "Interface": {"name", "ofport", "external_ids"}}


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


class OvsdbError(RuntimeError):
    """OVSDB refused a change, or holds something we must not overwrite."""


class LockHeld(OvsdbError):
    """Another controller of the same owner holds the OVSDB lock."""


LATE_SECONDS = 60.0   # a transaction past its timeout is waited for this much longer before it counts as lost
# Ports a transaction: ovsdbapp builds and sends a transaction on os-ken's event loop (its connection thread
# is green there), and 4000 ports held the loop for 3.3 s at once, longer at 10,000 than a switch waits for
# an echo reply (5 s) or a cluster member's lease lasts.
TRANSACTION_PORTS = 1000


class Unconfirmed(OvsdbError):
    """A transaction not answered in time: it may commit yet, or not; only a later read tells."""


class Fenced(OvsdbError):
    """Another member of the cluster owns the switch under a newer epoch."""


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
        self._idl = _Idl(remote, helper)
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
        session: int = private.session(self._idl).get_seqno()   # a reconnection reloads rows without telling us each
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
        session: int = private.session(self._idl).get_seqno()   # a reconnection reloads rows without telling us each
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
        queues = tuple(QueueSpec(queue_id, _int(q.other_config, "min-rate"), _int(q.other_config, "max-rate"),
                                 q.external_ids.get("class", ""), _int(q.other_config, "priority"))
                       for queue_id, q in rows)
        return (OvsdbQos(qos.external_ids.get("mode", ""), _int(qos.other_config, "max-rate"), queues, qos.type),
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
                    txn.add(_Fence(self._api, self._epoch_key, epochs, strict=True))
                for iface, spec in changes.items():
                    ids = {OWNER_KEY: self.owner, "iface": iface, **(tags or {}), **(port_tags or {}).get(iface, {})}
                    txn.add(_ReplacePortQos(self._api, iface, spec, ids))
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
            found = txn.add(_Fence(self._api, self._epoch_key, epochs, strict=False))
        refused: dict[int, str] = found.result
        return refused

    @property
    def _epoch_key(self) -> str:
        return f"{EPOCH_KEY}-{self.owner}"

    def generation_id(self) -> int:
        """The OpenFlow generation id the owner's active controller last claimed (0: none yet)."""
        row = next(iter(self._api.tables["Open_vSwitch"].rows.values()), None)
        return _int(row.external_ids, self._generation_key) if row else 0

    def next_generation_id(self, above: int | None = None) -> int:
        """One more than the last this owner claimed, and than `above` (a switch's, which another owner may
        have set), kept in OVSDB: a controller that becomes active claims mastership with a newer id than
        any before it, whatever the hosts' clocks. The transaction carries our lock, so only the lock's
        holder can make it (OvsdbError otherwise)."""
        with self._api.transaction(check_error=True, log_errors=False) as txn:
            found = txn.add(_NextGeneration(self._api, self._generation_key, self._epoch_key, above or 0))
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
            found = txn.add(_ReadKey(self._api, self._heartbeat_key, self._policy_key))
        text: str | None = found.result
        return text

    def save_policy(self, text: str) -> None:
        """Save a standby pair's policy (JSON text) in Open_vSwitch external_ids: the transaction asserts our
        lock, so OVSDB itself refuses the write of a holder deposed since (OvsdbError), however late it
        comes; the file a pair once shared had no such guard. Unconfirmed where OVSDB did not answer in
        time: the transaction stays queued, and commits if OVSDB answers later."""
        try:
            with self._quiet_transaction() as txn:
                txn.add(_SetKey(self._api, self._policy_key, text))
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
        return _int(row.external_ids, self._heartbeat_key) if row else 0

    def beat(self) -> None:
        """One heartbeat. Unlike our other transactions it does not ask vswitchd to reconfigure (no next_cfg),
        so it costs vswitchd nothing; like them, it carries our lock."""
        with self._quiet_transaction() as txn:
            txn.add(_Beat(self._api, self._heartbeat_key))

    def silent_for(self) -> float:
        """Seconds since ovsdb-server last said anything on this session (0 over a unix socket, which cannot
        stall on the way: this host's kernel carries it)."""
        return 0.0 if self._remote.startswith("unix:") else private.silent_for(self._idl)

    def steal_lock(self) -> None:
        """Take the owner's lock from the session holding it (RFC 7047 "steal"), which is told it was
        stolen. Sent from ovsdbapp's connection thread, which alone may touch the session (and flushes
        what is sent): queued there as a transaction would be."""
        self._api.ovsdb_connection.queue_txn(_Steal(self._idl))

    @property
    def _heartbeat_key(self) -> str:
        return f"{OWNER_KEY}-alive-{self.owner}"

    def remove_orphans(self, everywhere: bool = True) -> int:
        """Remove our QoS rows no port uses and our Queue rows no QoS uses; returns how many. Not `everywhere`:
        only if a port or QoS stopped naming a row of ours that is still there (a QoS cleared by hand, a bridge
        removed) since the last time; our own changes remove what they replace, and reading every Port, QoS and
        Queue row after each of them cost a join 0.8 s of CPU beside 5000 ports (docs/benchmarks.md)."""
        # The first sweep over a connection reads every row: what went while we were away, no update told us of.
        session: int = private.session(self._idl).get_seqno()
        everywhere = everywhere or session != self._swept_session
        try:
            with self._api.transaction(check_error=True, log_errors=False) as txn:
                found = txn.add(_RemoveOrphans(self._api, self._owned, None if everywhere else self._idl.dropped))
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


class BridgeCache:
    """Each datapath's bridge as last read, kept until a row it was read from changes (forget). Pure: the rows
    are their uuids, and the reading is the caller's."""

    def __init__(self) -> None:
        self.readings: dict[int, BridgeInfo | None] = {}
        self.reads: dict[int, int] = {}               # datapath id → readings made (what a cache miss costs)
        self._rows: dict[int, tuple[Any, ...]] = {}   # datapath id → the rows its reading was made from
        self._readers: dict[Any, set[int]] = {}       # row → the datapath ids read from it

    def get(self, dp_id: int, read: Callable[[int], tuple[BridgeInfo | None, list[Any]]]) -> BridgeInfo | None:
        if dp_id not in self.readings:
            self.readings[dp_id], rows = read(dp_id)
            self.reads[dp_id] = self.reads.get(dp_id, 0) + 1
            self._rows[dp_id] = tuple(rows)
            for row in rows:
                self._readers.setdefault(row, set()).add(dp_id)
        return self.readings[dp_id]

    def forget(self, rows: set[Any], renumbered: bool) -> None:
        """What was read from these rows; with `renumbered` (a bridge made, removed or given another datapath id)
        also every datapath found to have no bridge."""
        gone = {dp_id for row in rows for dp_id in self._readers.get(row, ())}
        if renumbered:
            gone |= {dp_id for dp_id, reading in self.readings.items() if reading is None}
        for dp_id in gone:
            self._drop(dp_id)

    def clear(self) -> None:
        self.readings, self._rows, self._readers = {}, {}, {}

    def _drop(self, dp_id: int) -> None:
        del self.readings[dp_id]
        for row in self._rows.pop(dp_id, ()):
            readers = self._readers.get(row)
            if readers is not None:
                readers.discard(dp_id)
                if not readers:
                    del self._readers[row]


class _Idl(connection.OvsdbIdl):
    """ovsdbapp's IDL, noting which rows changed (python-ovs calls notify() for each, in the connection's
    greenthread), for the read cache, and counting the changes we plan from."""

    def __init__(self, remote: str, helper: Any) -> None:
        super().__init__(remote, helper)
        self.touched: set[Any] = set()      # rows changed since the cache last looked
        self.made: set[str] = set()         # ports made since, by name (a port read as absent may be one)
        self.changes = 0                    # changes we plan from
        self.reshaped: set[Any] = set()     # rows whose columns a bridge's reading is made of (TOPOLOGY) changed since
        self.renumbered = False             # a bridge made, removed or its datapath id changed since
        self.dropped: set[Any] = set()      # QoS and Queue rows a port or a QoS stopped naming since the last sweep
        self._indexes: dict[str, dict[str, Any]] = {}   # table → the indexes ovsdbapp made at start, by name

    def run(self) -> Any:
        """python-ovs makes every table's rows anew when a reconnection dumps the database again, without the
        indexes ovsdbapp made at start: every lookup by name (a port's, in each read and transaction) then reads
        the whole table, a million row reads for a member of 1000 ports in an OVSDB of 3000, 15-20 s of the event
        loop. They are made again, over the rows just read, before anything looks."""
        changed = super().run()
        for table in self.tables.values():
            if table.name not in self._indexes:          # first seen: what ovsdbapp made at start
                self._indexes[table.name] = dict(table.rows.indexes)
            for name, made in self._indexes[table.name].items():
                if name not in table.rows.indexes:
                    index = table.rows.index_create(name)
                    index.columns = list(made.columns)
                    for row in table.rows.values():
                        index.add(row)
        return changed

    def notify(self, event: str, row: Any, updates: Any = None) -> None:
        self.touched.add(row.uuid)
        table = private.table_name(row)
        if table == "Port" and event == ROW_CREATE:
            self.made.add(row.name)
        # python-ovs counts every change (change_seqno); `updates` holds the old values of the changed columns.
        changed = private.changed_columns(updates) if event == ROW_UPDATE and updates is not None else None
        if changed is None or changed - QUIET.get(table, set()):
            self.changes += 1
        holder = DROPPED.get(table)
        if holder and (event == ROW_DELETE or (changed is not None and holder in changed)):
            self.dropped |= private.referenced(row if event == ROW_DELETE else updates, holder)
        if table in TOPOLOGY and (changed is None or changed & TOPOLOGY[table]):
            self.reshaped.add(row.uuid)
            if table == "Bridge" and (changed is None or "datapath_id" in changed):
                self.renumbered = True


def lock_name(owner: str) -> str:
    """OVSDB lock names are ids (RFC 7047: letters, digits, '_'); the owner's bytes in hex keep them apart."""
    return f"ovs_qos_controller_{owner.encode().hex()}"


def _int(column: dict[str, str], key: str) -> int:
    try:
        return int(column.get(key, 0))
    except ValueError:
        return -1   # not a number: never equal to what we want, so it gets rewritten


class _ReplacePortQos(command.BaseCommand):
    """Put `spec`'s rows on a port (None: take ours off), over our own QoS or none only.

    Everything is read in run_idl, which ovsdbapp runs again on fresh data when the commit fails a
    verify(): the port's QoS is verified, so another tool's QoS set a moment ago is never overwritten.
    """

    def __init__(self, api: Any, iface: str, spec: QosSpec | None, ids: dict[str, str]) -> None:
        super().__init__(api)
        self.iface, self.spec, self.ids = iface, spec, ids

    def run_idl(self, txn: Any) -> None:
        port = idlutils.row_by_value(self.api.idl, "Port", "name", self.iface, None)
        if port is None:
            if self.spec is None:
                return
            raise OvsdbError(f"port {self.iface!r} is not in OVSDB")
        port.verify("qos")
        current = port.qos[0] if port.qos else None
        if current is not None and current.external_ids.get(OWNER_KEY) != self.ids[OWNER_KEY]:
            if self.spec is None:
                return
            raise OvsdbError(f"port {self.iface!r} has a QoS this controller did not create; remove it "
                             f"(ovs-vsctl clear port {self.iface} qos) or leave the port out of the policy")
        if current is not None:
            for queue in current.queues.values():
                if queue.external_ids.get(OWNER_KEY) == self.ids[OWNER_KEY]:
                    queue.delete()
            current.delete()
        if self.spec is None:
            port.qos = []
            return
        queues = {}
        for q in self.spec.queues:
            row = txn.insert(self.api.tables["Queue"])
            row.other_config = {"min-rate": str(q.min_bps), "max-rate": str(q.max_bps), "priority": str(q.priority)}
            row.external_ids = {**self.ids, "class": q.traffic_class}
            queues[q.queue_id] = row
        qos = txn.insert(self.api.tables["QoS"])
        qos.type = self.spec.qos_type
        qos.other_config = {"max-rate": str(self.spec.max_bps)}
        qos.queues = queues
        qos.external_ids = {**self.ids, "mode": self.spec.mode}
        port.qos = [qos]


class _NextGeneration(command.BaseCommand):
    """Above the owner's last id, `above`, and every epoch of the owner's on a bridge: a standby pair's
    generation id is also its epoch (tc's fence), and a bridge may hold a higher one from an earlier run."""

    def __init__(self, api: Any, key: str, epoch_key: str, above: int) -> None:
        super().__init__(api)
        self.key, self.epoch_key, self.above = key, epoch_key, above

    def run_idl(self, txn: Any) -> None:
        row = next(iter(self.api.tables["Open_vSwitch"].rows.values()))
        row.verify("external_ids")
        epochs = [_int(bridge.external_ids, self.epoch_key) for bridge in self.api.tables["Bridge"].rows.values()]
        # 64 bits wrap, and 0 is no id at all to the core: past 2^64 - 1 comes 1, newer to a switch as OpenFlow
        # compares ids (the signed distance).
        self.result = (max(_int(row.external_ids, self.key), self.above, 0, *epochs) + 1) % 2**64 or 1
        row.setkey("external_ids", self.key, str(self.result))


class _SetKey(command.BaseCommand):
    def __init__(self, api: Any, key: str, value: str) -> None:
        super().__init__(api)
        self.key, self.value = key, value

    def run_idl(self, txn: Any) -> None:
        next(iter(self.api.tables["Open_vSwitch"].rows.values())).setkey("external_ids", self.key, self.value)


class _Fence(command.BaseCommand):
    """Each switch's epoch raised to ours, or the switch refused: `strict` fails the transaction (the
    writes beside it must not land), else the refused are the result. The bridge's external_ids are
    verified: if another member changed them since our replica read them, OVSDB refuses the commit and
    ovsdbapp runs this again on the fresh rows.

    The epoch is written even where our replica shows it ours already, a write the server finds changes
    nothing: python-ovs sends no transaction that writes nothing, and leaves out the verify of a row the
    transaction does not write, so our epoch would be judged by our replica alone, however far behind the
    server it is (a paused process's). Judged by the server, that is enough for tc: a member writes a
    switch's tc only after this transaction, under the switch's host lock, and a new owner raises the epoch
    under the same lock; so a newer epoch was committed before we took the lock, and the server refuses
    us, or it waits for our lock and comes after all our writes."""

    def __init__(self, api: Any, key: str, epochs: dict[int, int], strict: bool) -> None:
        super().__init__(api)
        self.key, self.epochs, self.strict = key, epochs, strict

    def run_idl(self, txn: Any) -> None:
        bridges = {row.datapath_id[0]: row for row in self.api.tables["Bridge"].rows.values() if row.datapath_id}
        refused: dict[int, str] = {}
        for dp_id, epoch in self.epochs.items():
            row = bridges.get(f"{dp_id:016x}")
            if row is None:
                refused[dp_id] = "its bridge is not in OVSDB"
                continue
            row.verify("external_ids")
            current = _int(row.external_ids, self.key)
            if current and not not_older(epoch, current):     # compared as OpenFlow compares generation ids
                refused[dp_id] = (f"another controller of this owner holds it now (epoch {current} in OVSDB, ours "
                                  f"{epoch}); this one writes nothing to it")
            else:
                row.setkey("external_ids", self.key, str(epoch))
        if refused and self.strict:
            raise Fenced("; ".join(f"switch {dp:016x}: {why}" for dp, why in refused.items()))
        self.result = refused


class _Steal:
    """A "steal" request, in ovsdbapp's transaction queue. A session may not ask for a lock it already
    waits for (ovsdb-server answers with an error), so the wait is withdrawn ("unlock") first. python-ovs
    asks only "lock"; its own request path, given the other methods, does the rest (the steal's reply
    sets has_lock as a lock reply would)."""

    results: queue.Queue[Any]
    commands: list[Any]

    def __init__(self, idl: Any) -> None:
        self.idl, self.results, self.commands = idl, queue.Queue(1), []

    def do_commit(self) -> None:
        private.steal_lock(self.idl)


class _Beat(command.BaseCommand):
    def __init__(self, api: Any, key: str) -> None:
        super().__init__(api)
        self.key = key

    def run_idl(self, txn: Any) -> None:
        row = next(iter(self.api.tables["Open_vSwitch"].rows.values()))
        row.setkey("external_ids", self.key, str((_int(row.external_ids, self.key) + 1) % 2**31))


class _ReadKey(_Beat):
    """A key of Open_vSwitch external_ids as the server holds it: the column verified, and a heartbeat beside
    it so that the transaction is sent at all (one that only verifies commits without asking)."""

    def __init__(self, api: Any, beat: str, key: str) -> None:
        super().__init__(api, beat)
        self.read = key

    def run_idl(self, txn: Any) -> None:
        row = next(iter(self.api.tables["Open_vSwitch"].rows.values()))
        row.verify("external_ids")
        super().run_idl(txn)
        self.result = row.external_ids.get(self.read)


class _RemoveOrphans(command.BaseCommand):
    def __init__(self, api: Any, owned: Callable[[Any], bool], dropped: set[Any] | None) -> None:
        super().__init__(api)
        self.owned, self.dropped = owned, dropped
        self.candidates: set[Any] | None = None

    def run_idl(self, txn: Any) -> None:
        if self.dropped is not None:   # run in the connection's greenthread, as the IDL's notify() that fills it
            if self.candidates is None:   # taken once: a rerun after TRY_AGAIN looks at the same rows
                self.candidates = set(self.dropped)
                self.dropped.clear()
            tables = (self.api.tables["QoS"].rows, self.api.tables["Queue"].rows)
            left = [row for uuid in self.candidates for rows in tables if (row := rows.get(uuid)) is not None]
            if not any(self.owned(row) for row in left):
                self.result = 0
                return
        used_qos = {p.qos[0].uuid for p in self.api.tables["Port"].rows.values() if p.qos}
        removed = 0
        for qos in list(self.api.tables["QoS"].rows.values()):
            if self.owned(qos) and qos.uuid not in used_qos:
                qos.delete()
                removed += 1
        used_queues = {q.uuid for qos in self.api.tables["QoS"].rows.values()
                       if self.owned(qos) and qos.uuid in used_qos for q in qos.queues.values()}
        for row in list(self.api.tables["Queue"].rows.values()):
            if self.owned(row) and row.uuid not in used_queues:
                row.delete()
                removed += 1
        self.result = removed
