"""What our OVSDB transactions do, as ovsdbapp commands: ovsdbapp runs each in its connection's greenthread, and
again on fresh rows when python-ovs answers TRY_AGAIN (a verified column changed, or the connection moved), so
each reads what it decides from inside run_idl. And the errors they raise."""
from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

from ovsdbapp.backend.ovs_idl import command, idlutils

from controller.adapters import private
from controller.core.queues import QosSpec
from controller.core.role import not_older

OWNER_KEY = "ovs-qos-controller"


class OvsdbError(RuntimeError):
    """OVSDB refused a change, or holds something we must not overwrite."""


class Fenced(OvsdbError):
    """Another member of the cluster owns the switch under a newer epoch."""


def int_key(column: dict[str, str], key: str) -> int:
    try:
        return int(column.get(key, 0))
    except ValueError:
        return -1   # not a number: never equal to what we want, so it gets rewritten


class ReplacePortQos(command.BaseCommand):
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


class NextGeneration(command.BaseCommand):
    """Above the owner's last id, `above`, and every epoch of the owner's on a bridge: a standby pair's
    generation id is also its epoch (tc's fence), and a bridge may hold a higher one from an earlier run."""

    def __init__(self, api: Any, key: str, epoch_key: str, above: int) -> None:
        super().__init__(api)
        self.key, self.epoch_key, self.above = key, epoch_key, above

    def run_idl(self, txn: Any) -> None:
        row = next(iter(self.api.tables["Open_vSwitch"].rows.values()))
        row.verify("external_ids")
        epochs = [int_key(bridge.external_ids, self.epoch_key) for bridge in self.api.tables["Bridge"].rows.values()]
        # 64 bits wrap, and 0 is no id at all to the core: past 2^64 - 1 comes 1, newer to a switch as OpenFlow
        # compares ids (the signed distance).
        self.result = (max(int_key(row.external_ids, self.key), self.above, 0, *epochs) + 1) % 2**64 or 1
        row.setkey("external_ids", self.key, str(self.result))


class SetKey(command.BaseCommand):
    def __init__(self, api: Any, key: str, value: str) -> None:
        super().__init__(api)
        self.key, self.value = key, value

    def run_idl(self, txn: Any) -> None:
        next(iter(self.api.tables["Open_vSwitch"].rows.values())).setkey("external_ids", self.key, self.value)


class Fence(command.BaseCommand):
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
            current = int_key(row.external_ids, self.key)
            if current and not not_older(epoch, current):     # compared as OpenFlow compares generation ids
                refused[dp_id] = (f"another controller of this owner holds it now (epoch {current} in OVSDB, ours "
                                  f"{epoch}); this one writes nothing to it")
            else:
                row.setkey("external_ids", self.key, str(epoch))
        if refused and self.strict:
            raise Fenced("; ".join(f"switch {dp:016x}: {why}" for dp, why in refused.items()))
        self.result = refused


class Steal:
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


class Beat(command.BaseCommand):
    def __init__(self, api: Any, key: str) -> None:
        super().__init__(api)
        self.key = key

    def run_idl(self, txn: Any) -> None:
        row = next(iter(self.api.tables["Open_vSwitch"].rows.values()))
        row.setkey("external_ids", self.key, str((int_key(row.external_ids, self.key) + 1) % 2**31))


class ReadKey(Beat):
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


class RemoveOrphans(command.BaseCommand):
    """Our QoS rows no port names and our Queue rows no QoS of ours names, deleted; their count is the result.
    Given `dropped` (the rows the IDL saw a port or a QoS stop naming), it reads every row only if one of those
    is still there and ours."""

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
