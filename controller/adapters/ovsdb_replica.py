"""Our replica of OVSDB: the columns we monitor, the IDL that notes what changed in them (for the read caches,
the sweep for unused rows, and the changes we plan from), and the cache of each datapath's bridge."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ovs.db.idl import ROW_CREATE, ROW_DELETE, ROW_UPDATE
from ovsdbapp.backend.ovs_idl import connection

from controller.adapters import private
from controller.core.bridges import BridgeInfo

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


class Replica(connection.OvsdbIdl):
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
