"""OVSDB adapter: bridges, ports and this controller's QoS/Queue rows, via ovsdbapp.

Every change to a port's queues (old rows out, Queues + QoS in, Port.qos set) is
one transaction with check_error=True, so a port is never left half-configured.
Rows this controller creates carry external_ids[OWNER_KEY] so it removes exactly
its own and never another tool's QoS.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ovsdbapp.backend.ovs_idl import command, connection, idlutils
from ovsdbapp.schema.open_vswitch import impl_idl

from controller.queues import QosSpec

LOG = logging.getLogger(__name__)
DEFAULT_DB = "unix:/var/run/openvswitch/db.sock"
OWNER_KEY = "ovs-qos-controller"
USERSPACE_DATAPATH = "netdev"


class OvsdbError(RuntimeError):
    """OVSDB refused a change or holds something we must not overwrite."""


@dataclass(frozen=True)
class BridgeInfo:
    name: str
    datapath_type: str          # "netdev" (userspace) or "system"/"" (kernel)
    ports: dict[int, str]       # OpenFlow port number → interface name

    @property
    def userspace(self) -> bool:
        return self.datapath_type == USERSPACE_DATAPATH


class Ovsdb:
    def __init__(self, remote: str = DEFAULT_DB, timeout: float = 10.0, owner: str = "default"):
        helper = idlutils.get_schema_helper(remote, "Open_vSwitch")
        for table in ("Open_vSwitch", "Bridge", "Port", "Interface", "QoS", "Queue"):
            helper.register_table(table)
        self._api = impl_idl.OvsdbIdl(connection.Connection(
            idl=connection.OvsdbIdl(remote, helper), timeout=timeout))
        # The owner tag separates controller instances (tests run their own).
        self.owner = owner

    def bridge(self, dp_id: int) -> BridgeInfo | None:
        dpid = f"{dp_id:016x}"
        for br in self._api.tables["Bridge"].rows.values():
            if br.datapath_id and br.datapath_id[0] == dpid:
                ports = {iface.ofport[0]: iface.name
                         for port in br.ports for iface in port.interfaces
                         if iface.ofport and iface.ofport[0] > 0}
                return BridgeInfo(br.name, br.datapath_type, ports)
        return None

    def apply_qos(self, iface: str, spec: QosSpec, tags: dict[str, str]) -> None:
        """Replace `iface`'s QoS with `spec` in one transaction."""
        ids = {OWNER_KEY: self.owner, "iface": iface, **tags}
        with self._api.transaction(check_error=True) as txn:
            queues = {}
            for q in spec.queues:
                queues[q.queue_id] = txn.add(self._api.db_create(
                    "Queue", other_config={"min-rate": str(q.min_bps), "max-rate": str(q.max_bps),
                                           "priority": str(q.priority)},
                    external_ids={**ids, "class": q.traffic_class}))
            qos = txn.add(self._api.db_create(
                "QoS", type="linux-htb", other_config={"max-rate": str(spec.max_bps)},
                queues=queues, external_ids={**ids, "mode": spec.mode}))
            txn.add(_SetPortQos(self._api, iface, self._owned, qos))
            self._destroy_owned(txn, iface)

    def remove_qos(self, iface: str) -> None:
        """Take this controller's QoS off `iface`; leave anyone else's alone."""
        with self._api.transaction(check_error=True) as txn:
            txn.add(_SetPortQos(self._api, iface, self._owned, None))
            self._destroy_owned(txn, iface)

    def remove_all(self) -> int:
        """Remove every QoS and Queue row of this owner, wherever it hangs; returns rows removed."""
        qos_rows = [r for r in self._api.tables["QoS"].rows.values() if self._owned(r)]
        queue_rows = [r for r in self._api.tables["Queue"].rows.values() if self._owned(r)]
        if not qos_rows and not queue_rows:
            return 0
        with self._api.transaction(check_error=True) as txn:
            for port in self._api.tables["Port"].rows.values():
                if port.qos and self._owned(port.qos[0]):
                    txn.add(self._api.db_clear("Port", port.name, "qos"))
            for row in qos_rows + queue_rows:
                txn.add(self._api.db_destroy(row._table.name, row.uuid))
        return len(qos_rows) + len(queue_rows)

    def owned_qos(self) -> dict[str, str]:
        """iface → mode of this owner's QoS rows attached to ports."""
        return {port.name: port.qos[0].external_ids.get("mode", "")
                for port in self._api.tables["Port"].rows.values()
                if port.qos and self._owned(port.qos[0])}

    def close(self) -> None:
        self._api.ovsdb_connection.stop()

    def _destroy_owned(self, txn, iface: str) -> None:
        """Add to `txn` the destruction of this owner's rows for `iface` (those in force now)."""
        for table in ("QoS", "Queue"):
            for row in list(self._api.tables[table].rows.values()):
                if self._owned(row) and row.external_ids.get("iface") == iface:
                    txn.add(self._api.db_destroy(table, row.uuid))

    def _owned(self, row) -> bool:
        return row.external_ids.get(OWNER_KEY) == self.owner


class _SetPortQos(command.BaseCommand):
    """Set (qos: a db_create command) or clear (None) a port's QoS, over our own QoS or none only.

    Checked when the transaction commits, not before: verify() makes OVSDB refuse the commit if
    the port's QoS changed since the IDL last saw it, and ovsdbapp then re-runs the transaction
    on fresh data, so another tool's QoS set a moment ago is never overwritten.
    """

    def __init__(self, api, iface: str, owned, qos):
        super().__init__(api)
        self.iface, self.owned, self.qos = iface, owned, qos

    def run_idl(self, txn):
        port = next((p for p in self.api.tables["Port"].rows.values() if p.name == self.iface), None)
        if port is None:
            if self.qos is None:
                return
            raise OvsdbError(f"port {self.iface!r} is not in OVSDB")
        port.verify("qos")
        if port.qos and not self.owned(port.qos[0]):
            if self.qos is None:
                return
            raise OvsdbError(f"port {self.iface!r} has a QoS this controller did not create; remove it "
                             f"(ovs-vsctl clear port {self.iface} qos) or leave the port out of the policy")
        port.qos = [self.qos.result] if self.qos is not None else []
