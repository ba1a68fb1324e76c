"""Fakes that let unit tests drive the real core (controller/core/controller.py) through the real
OpenFlow adapter (controller/adapters/openflow.py) and the real OVSDB/tc worker, without a switch,
OVSDB or netlink, after Faucet's clib/fakeoftable.py.

- FakeSwitch is an OpenFlow 1.3 switch as OVS behaves: a flow table and a meter table that apply
  the real os-ken FlowMods and MeterMods, a generation id per bridge and a role per connection
  (a new connection is an equal; a master demotes the others; a slave's writes are refused), and
  real os-ken replies (barriers, errors, role, echo, flow/meter/queue/port statistics) queued until
  the test lets them through. FakeConnection is one controller's connection to it.
- FakeOvsdb holds each port's QoS as OvsdbQos and the owner's lock and generation counter; FakeTc
  holds each device's classes (from that QoS, rebuilt when it changes, as OVS does), leaves and filters.
- Harness is one controller process: the core, a worker run in turn, the clock and the timers the core
  set. Its loop hands every action out (OpenFlow messages to the switches, jobs to the worker, answers
  to the test) and every reply back in, through the adapter's own translation, until nothing moves.
- study_net() is the study topology's s1 and s2 under it; up(), flood() and mode() are what the
  app's tests do to it and read from it (tests/unit/conftest.py makes it the `net` fixture).
"""
from __future__ import annotations

import collections
import heapq
import itertools
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser
from os_ken.ofproto.ofproto_common import ONF_EXPERIMENTER_ID

from controller.adapters import openflow
from controller.adapters.ovsdb import OvsdbError, Unconfirmed
from controller.adapters.remotes import Remotes
from controller.adapters.statefile import StateFile
from controller.adapters.store import PairStore
from controller.adapters.tc import ClassCounters, Leaf
from controller.adapters.worker import SWEEP, Worker
from controller.core import actions as act
from controller.core import events as ev
from controller.core.authority import Alone, Pair
from controller.core.bridges import BridgeInfo
from controller.core.controller import Controller
from controller.core.flows import CLASSIFIED, COOKIE
from controller.core.plan import ABSENT, FILTER_FAMILIES, FOREIGN, htb_classid
from controller.core.policy import Policy, load_document, parse_policy
from controller.core.queues import FIFO_KINDS, OvsdbQos

REPORT = "the app's report of the remotes"   # a timer of the Harness's own
ROLE = {ofp.OFPCR_ROLE_MASTER: "master", ofp.OFPCR_ROLE_SLAVE: "slave", ofp.OFPCR_ROLE_EQUAL: "equal"}
WRITES = ("OFPFlowMod", "OFPMeterMod")
SETTLE_STEPS = 20_000     # events, job batches and replies one settle() may take: far beyond any test's


@dataclass
class Entry:
    cookie: int
    instructions: list
    packets: float = 0
    bytes: float = 0
    flags: int = 0


@dataclass
class PortTraffic:
    tx_bytes: float = 0
    tx_packets: float = 0
    tx_dropped: float = 0
    rx_packets: float = 0


class FakeSwitch:
    ofproto = ofp
    ofproto_parser = parser

    def __init__(self, dp_id: int, ports: dict[int, str], userspace: bool = True):
        self.id = dp_id
        self.bridge = BridgeInfo(f"br{dp_id}", "netdev" if userspace else "system", dict(ports))
        self.ports = frozenset(ports)
        self.tables: dict[int, dict[tuple, Entry]] = {0: {}}   # table id → (priority, match items) → entry
        self.table = self.tables[0]                  # table 0, where a policy's flows are
        self.net: Any = None                         # the FakeNet its ports are cabled into (tests/unit/fakenet.py)
        self.traffic: dict[int, PortTraffic] = {p: PortTraffic() for p in ports}
        self.queues: dict[tuple[int, int], tuple[int, int, int]] = {}   # (port, queue) → bytes, packets, drops
        self.replies: collections.deque = collections.deque()         # (connection, reply), not yet delivered
        self.sent: list = []                         # every message any controller sent it
        self.meters: dict[int, Any] = {}            # meter id → the OFPMeterMod that made it
        self.meter_traffic: dict[int, tuple[float, float, float]] = {}   # meter id → packets, bytes, dropped
        self.load: dict[int, float] = {}              # port → bit/s it sends while time passes (run)
        self.class_load: dict[int, float] = {}        # cookie → bit/s its flow carries (and its meter counts)
        self.drop_load: dict[tuple[int, int], float] = {}   # (port, queue) → packets/s its class drops
        self.max_meter = 1000                       # meter features: 0 is a switch without meters
        self.refuse_cookies: set[int] = set()       # flow mods with these cookies get an error back
        self.stalled = False                        # vswitchd busy: replies wait until it is False again
        self.generation: int | None = None          # the bridge's master election id, as OVS keeps it
        self.role = None                            # the role the last role request set
        self.generation_id = None                   # ... and its generation id
        self.connections: list[FakeConnection] = []
        self.packet_outs: list[tuple[list[int], bytes]] = []   # every packet a controller sent out of it
        self.mute = False                            # it answers nothing, its connection still open (a cut cable)
        self.monitors = True                         # it has a flow monitor (OVS's for OpenFlow 1.3)
        self.monitoring: list[FakeConnection] = []   # the connections whose monitor is in force
        self.late = False                            # its replies wait for release() (a busy switch)
        self.held: list = []
        self.older: list = []

    def run(self, seconds: float) -> None:
        """Time passes: the loads the test set move the counters. What is sent or matched came in on a port:
        the lowest numbered's rx counters take it all."""
        arrived = 0.0
        for port, bps in self.load.items():
            traffic = self.traffic[port]
            traffic.tx_bytes += bps * seconds / 8
            traffic.tx_packets += bps * seconds / 8 / 1500
            arrived += bps * seconds / 8 / 1500
        for (port, queue), pps in self.drop_load.items():
            b, n, d = self.queues.get((port, queue), (0, 0, 0))
            self.queues[(port, queue)] = (b, n, d + pps * seconds)
        for entry in self.entries() if self.class_load else ():
            if entry.cookie not in self.class_load:
                continue
            nbytes = self.class_load[entry.cookie] * seconds / 8
            entry.bytes += nbytes
            entry.packets += nbytes / 1500
            arrived += nbytes / 1500
            for meter in self.meters_of(entry):
                n, b, d = self.meter_traffic.get(meter, (0, 0, 0))
                self.meter_traffic[meter] = (n + nbytes / 1500, b + nbytes, d)
        if self.traffic:
            self.traffic[min(self.traffic)].rx_packets += arrived

    def send_msg(self, msg) -> None:
        """A change by hand (ovs-ofctl): a connection of its own, whose replies nobody reads."""
        self.process(None, msg)

    def process(self, conn: FakeConnection | None, msg) -> None:
        self.sent.append(msg)
        kind = type(msg).__name__
        if kind in WRITES and conn is not None and conn.role == "slave":
            self.error(conn, msg.xid, ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_IS_SLAVE)
        elif kind == "OFPFlowMod":
            self._flow_mod(conn, msg)
        elif kind == "OFPMeterMod":
            self._meter_mod(conn, msg)
        elif kind == "OFPRoleRequest":
            self._role(conn, msg)
        elif kind == "OFPBarrierRequest":
            self.reply(conn, parser.OFPBarrierReply(conn), msg.xid)
        elif kind == "OFPSetAsync":
            conn.slave_packet_ins = msg.packet_in_mask[1]
        elif kind == "OFPEchoRequest":
            if conn.answers_echo:
                self.reply(conn, parser.OFPEchoReply(conn), msg.xid)
        elif kind == "ONFFlowMonitorStatsRequest":
            if not self.monitors:
                self.error(conn, msg.xid, ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_EXPERIMENTER)
                return
            self.monitoring.append(conn)
            self.reply(conn, self._updates([]), msg.xid)
        elif kind == "OFPPacketOut":
            ports = [a.port for a in msg.actions if type(a).__name__ == "OFPActionOutput"]
            self.packet_outs.append((ports, msg.data))
            if self.net is not None:
                for port in ports:
                    self.net.leave(self, port, bytes(msg.data), read_fields(bytes(msg.data)), 0)
        else:
            self.reply(conn, self._stats(conn, msg), msg.xid)

    def reply(self, conn: FakeConnection | None, msg, xid: int) -> None:
        msg.xid = xid
        if conn is not None and not self.mute:
            (self.held if self.late else self.replies).append((conn, msg))

    def release(self) -> None:
        """The replies it held back before the last release, sent now: each a release late."""
        self.replies.extend(self.older)
        self.older, self.held = self.held, []

    def error(self, conn: FakeConnection, xid: int, err_type: int, code: int) -> None:
        self.reply(conn, parser.OFPErrorMsg(conn, type_=err_type, code=code, data=b""), xid)

    def _role(self, conn: FakeConnection, msg) -> None:
        if msg.role != ofp.OFPCR_ROLE_NOCHANGE:
            if msg.role != ofp.OFPCR_ROLE_EQUAL:
                if self.generation is not None and (msg.generation_id - self.generation) % 2**64 >= 2**63:
                    self.error(conn, msg.xid, ofp.OFPET_ROLE_REQUEST_FAILED, ofp.OFPRRFC_STALE)
                    return
                self.generation = msg.generation_id
            conn.role = ROLE[msg.role]
            if conn.role == "master":
                for other in self.connections:
                    if other is not conn and other.role == "master":
                        other.role = "slave"
            self.role, self.generation_id = msg.role, msg.generation_id
        role = {v: k for k, v in ROLE.items()}[conn.role]
        generation = openflow.NO_GENERATION if self.generation is None else self.generation
        self.reply(conn, parser.OFPRoleReply(conn, role, generation), msg.xid)

    def _stats(self, conn: FakeConnection, msg):
        kind = type(msg).__name__
        if kind == "OFPFlowStatsRequest":
            return parser.OFPFlowStatsReply(conn, body=[
                parser.OFPFlowStats(table_id, 0, 0, prio, 0, 0, 0, e.cookie, int(e.packets), int(e.bytes),
                                    parser.OFPMatch(**dict(match)), e.instructions)
                for table_id, table in sorted(self.tables.items()) for (prio, match), e in table.items()
                if e.cookie & msg.cookie_mask == msg.cookie
                and (msg.out_port == ofp.OFPP_ANY or msg.out_port in outputs(e))], flags=0)
        if kind == "OFPMeterFeaturesStatsRequest":
            features = parser.OFPMeterFeaturesStats(self.max_meter, 1 << ofp.OFPMBT_DROP if self.max_meter else 0,
                                                    ofp.OFPMF_KBPS | ofp.OFPMF_BURST | ofp.OFPMF_STATS, 8, 0)
            return parser.OFPMeterFeaturesStatsReply(conn, body=[features], flags=0)
        if kind == "OFPMeterConfigStatsRequest":
            return parser.OFPMeterConfigStatsReply(conn, body=[
                parser.OFPMeterConfigStats(m.flags, meter, m.bands) for meter, m in sorted(self.meters.items())],
                flags=0)
        if kind == "OFPMeterStatsRequest":
            return parser.OFPMeterStatsReply(conn, body=[
                parser.OFPMeterStats(meter, 0, int(n), int(b), 0, 0, [parser.OFPMeterBandStats(int(d), 0)])
                for meter, (n, b, d) in ((m, self.meter_traffic.get(m, (0, 0, 0))) for m in sorted(self.meters))],
                flags=0)
        if kind == "OFPQueueStatsRequest":
            return parser.OFPQueueStatsReply(conn, body=[
                parser.OFPQueueStats(p, q, int(b), int(n), int(d), 0, 0) for (p, q), (b, n, d) in self.queues.items()
                if msg.port_no in (ofp.OFPP_ANY, p)], flags=0)
        if kind == "OFPPortStatsRequest":
            return parser.OFPPortStatsReply(conn, body=[
                parser.OFPPortStats(p, int(t.rx_packets), int(t.tx_packets), 0, int(t.tx_bytes), 0, int(t.tx_dropped),
                                    0, 0, 0, 0, 0, 0, 0, 0)
                for p, t in self.traffic.items() if msg.port_no in (ofp.OFPP_ANY, p)], flags=0)
        raise AssertionError(f"the fake switch does not know {kind}")

    def _meter_mod(self, conn: FakeConnection, msg) -> None:
        exists = msg.meter_id in self.meters
        if msg.command == ofp.OFPMC_ADD and exists or msg.command == ofp.OFPMC_MODIFY and not exists:
            code = ofp.OFPMMFC_METER_EXISTS if exists else ofp.OFPMMFC_UNKNOWN_METER
            self.error(conn, msg.xid, ofp.OFPET_METER_MOD_FAILED, code)
        elif msg.command == ofp.OFPMC_DELETE:
            self.meters.pop(msg.meter_id, None)
            for table in self.tables.values():
                for key in [k for k, e in table.items() if msg.meter_id in self.meters_of(e)]:
                    # As OpenFlow says: a meter's flows go with it, unsaid but to a monitor
                    self._monitored(conn, ofp.ONFFME_DELETED, table.pop(key))
        else:
            self.meters[msg.meter_id] = msg

    @staticmethod
    def meters_of(entry: Entry) -> set[int]:
        return {i.meter_id for i in entry.instructions if type(i).__name__ == "OFPInstructionMeter"}

    def _flow_mod(self, conn: FakeConnection, msg) -> None:
        if msg.cookie in self.refuse_cookies:
            self.error(conn, msg.xid, ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT)
            return
        if msg.command != ofp.OFPFC_DELETE and not self.meters_of(Entry(0, msg.instructions)) <= self.meters.keys():
            self.error(conn, msg.xid, ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_INVALID_METER)
            return
        key = (msg.priority, tuple(sorted(msg.match.items())))
        table = self.tables.setdefault(msg.table_id, {}) if msg.table_id != ofp.OFPTT_ALL else {}
        if msg.command == ofp.OFPFC_ADD:
            table[key] = Entry(msg.cookie, msg.instructions, flags=msg.flags)
            self._monitored(conn, ofp.ONFFME_ADDED, table[key])
        elif msg.command == ofp.OFPFC_MODIFY_STRICT and key in table:
            table[key].instructions = msg.instructions
            self._monitored(conn, ofp.ONFFME_MODIFIED, table[key])
        elif msg.command == ofp.OFPFC_DELETE:
            for table_id, table in self.tables.items():
                for k in [k for k, e in table.items() if e.cookie & msg.cookie_mask == msg.cookie & msg.cookie_mask]:
                    self._removed(table_id, k, table.pop(k), conn)

    def delete_by_hand(self, *keys: tuple) -> None:
        """`ovs-ofctl del-flows`: these entries of table 0 (every entry of every table if none named)."""
        for table_id, table in self.tables.items():
            for k in [k for k in table if not keys or table_id == 0 and k in keys]:
                self._removed(table_id, k, table.pop(k), None)

    def _removed(self, table_id: int, key: tuple, entry: Entry, by: FakeConnection | None) -> None:
        """As OVS does: a deleted flow that asked for it is said to every connection but a slave's (and to every
        monitor but the deleter's)."""
        self._monitored(by, ofp.ONFFME_DELETED, entry)
        if entry.flags & ofp.OFPFF_SEND_FLOW_REM:
            removed = parser.OFPFlowRemoved(None, entry.cookie, key[0], ofp.OFPRR_DELETE, table_id, 0, 0, 0, 0,
                                            int(entry.packets), int(entry.bytes), parser.OFPMatch(**dict(key[1])))
            for conn in self.connections:
                if conn.role != "slave":
                    self.reply(conn, removed, 0)

    def _monitored(self, by: FakeConnection | None, event: int, entry: Entry) -> None:
        """A flow monitor's update to every monitoring connection but the one that made the change, unasked."""
        for conn in self.monitoring:
            if conn is not by and conn in self.connections:
                self.reply(conn, self._updates([(event, entry.cookie)]), 0)

    @staticmethod
    def _updates(updates: list[tuple[int, int]]):
        """As OVS encodes them: each a full update (24 bytes, no match, no actions: not asked for)."""
        data = b"".join(struct.pack("!HHHHHHHBxQ", 24, event, 0, 0, 0, 0, 0, 0, cookie) for event, cookie in updates)
        body = parser.OFPExperimenterMultipart(ONF_EXPERIMENTER_ID, ofp.ONFMP_FLOW_MONITOR, data)
        return parser.OFPExperimenterStatsReply(None, body=body, flags=0)

    def entries(self) -> list[Entry]:
        return [e for table in self.tables.values() for e in table.values()]

    def steering(self) -> set[int]:
        """Cookies of the flows that set a queue."""
        return {e.cookie for e in self.entries()
                for i in e.instructions for a in getattr(i, "actions", ()) if type(a).__name__ == "OFPActionSetQueue"}

    # --- the pipeline: a packet through the tables, as OpenFlow 1.3 runs it --------------------------------
    def receive(self, in_port: int, data: bytes, fields: dict, hops: int) -> None:
        """A packet arrives on `in_port`: the tables decide where it goes (out of ports into the FakeNet, or to
        the controllers as a packet-in)."""
        fields = {**fields, "in_port": in_port, "metadata": 0}
        table_id: int | None = 0
        while table_id is not None:
            entry = self._lookup(table_id, fields)
            if entry is None:
                return                                   # a table miss: dropped (OpenFlow 1.3)
            entry.packets += 1
            entry.bytes += len(data)
            table_id, now = None, table_id
            for instruction in entry.instructions:
                name = type(instruction).__name__
                if name == "OFPInstructionActions":
                    for action in instruction.actions:
                        self._apply(action, in_port, data, fields, now, hops)
                elif name == "OFPInstructionWriteMetadata":
                    mask = instruction.metadata_mask
                    fields["metadata"] = fields["metadata"] & ~mask | instruction.metadata & mask
                elif name == "OFPInstructionGotoTable":
                    table_id = instruction.table_id

    def _lookup(self, table_id: int, fields: dict) -> Entry | None:
        best = None
        for (prio, match), entry in self.tables.get(table_id, {}).items():
            if (best is None or prio > best[0]) and all(_matches(fields.get(k), v) for k, v in match):
                best = (prio, entry)
        return best[1] if best else None

    def _apply(self, action, in_port: int, data: bytes, fields: dict, table_id: int, hops: int) -> None:
        name = type(action).__name__
        if name == "OFPActionSetField":
            fields[action.key] = action.value
        elif name == "OFPActionOutput" and action.port == ofp.OFPP_CONTROLLER:
            for conn in self.connections:   # our table-miss entries output to the controller: reason ACTION
                if conn.role != "slave" or conn.slave_packet_ins & 1 << ofp.OFPR_ACTION:
                    self.reply(conn, parser.OFPPacketIn(conn, ofp.OFP_NO_BUFFER, len(data), ofp.OFPR_ACTION,
                                                        table_id, 0, parser.OFPMatch(in_port=in_port), data), 0)
        elif name == "OFPActionOutput" and self.net is not None and action.port != in_port:
            self.net.leave(self, action.port, data, {k: v for k, v in fields.items()
                                                     if k not in ("in_port", "metadata")}, hops)

    def flow_mods(self) -> list:
        return [m for m in self.sent if type(m).__name__ == "OFPFlowMod"]

    def meter_mods(self) -> list:
        return [m for m in self.sent if type(m).__name__ == "OFPMeterMod"]


def _matches(have: Any, want: Any) -> bool:
    if have is None:
        return False
    if isinstance(want, tuple):                  # (value, mask): MAC addresses as text, numbers as numbers
        value, mask = (int(str(x).replace(":", ""), 16) if isinstance(x, str) else x for x in want)
        have = int(have.replace(":", ""), 16) if isinstance(have, str) else have
        return have & mask == value & mask
    return have == want


def read_fields(data: bytes) -> dict:
    """The fields a flow matches on, read from a frame (Ethernet, and IPv4's protocol and DSCP)."""
    fields = {"eth_dst": ":".join(f"{b:02x}" for b in data[0:6]), "eth_src": ":".join(f"{b:02x}" for b in data[6:12]),
              "eth_type": int.from_bytes(data[12:14], "big")}
    if fields["eth_type"] == 0x0800 and len(data) >= 34:
        fields |= {"ip_proto": data[23], "ip_dscp": data[15] >> 2}
    return fields


def outputs(entry: Entry) -> set[int]:
    return {a.port for i in entry.instructions for a in getattr(i, "actions", ())
            if type(a).__name__ == "OFPActionOutput"}


class FakeConnection:
    """One controller's OpenFlow connection to a FakeSwitch: what os-ken's Datapath is to the adapter."""
    ofproto = ofp
    ofproto_parser = parser

    def __init__(self, switch: FakeSwitch):
        self.switch, self.id = switch, switch.id
        self.role = "equal"              # OpenFlow: every new connection starts as an equal
        self.slave_packet_ins = 0        # the packet-in reasons it hears as a slave (OFPSetAsync)
        self.answers_echo = True
        switch.connections.append(self)

    def send_msg(self, msg) -> None:
        self.switch.process(self, msg)


class FakeOvsdb:
    """One OVSDB: the QoS of each port, the owner's generation counter, and its lock, held by one session
    (one controller process's connection) at a time, as ovsdb-server keeps it."""

    def __init__(self, *switches: FakeSwitch):
        self.bridges = {sw.id: sw.bridge for sw in switches}
        self.qos: dict[str, Any] = {}                 # iface → OvsdbQos, or FOREIGN
        self.refuse: set[str] = set()
        self.orphans = 0                              # rows of ours no port uses (a bridge that went left them)
        self.writes_to: collections.Counter[str] = collections.Counter()   # iface → transactions that set its QoS
        self.sweeps = 0                               # remove_orphans calls that found some
        self.transactions = 0
        self.attempts = 0                             # apply calls, answered or not
        self.slow = False                             # transactions go unanswered (vswitchd busy)
        self.connected = True
        self.holder: FakeSession | None = None        # the session holding the owner's lock
        self.generation_ids = 0
        self.beats = 0                                # the lock holder's heartbeat
        self.epochs: dict[int, int] = {}              # switch → a cluster's epoch in its bridge's external_ids
        self.policy_text: str | None = None           # a standby pair's saved policy (controller/adapters/store.py)
        self.silent = 0.0                             # seconds it has said nothing to a session (a stalled path)

    def session(self) -> FakeSession:
        """A controller's connection; the first to come takes the lock, as ovsdb-server grants it."""
        session = FakeSession(self)
        if self.holder is None:
            self.holder = session
        return session

    def generation_id(self) -> int:
        return self.generation_ids


    @property
    def generation(self) -> int:
        """Changes when the contents do, the tests' own edits included."""
        return hash(frozenset(self.qos.items()))

    def bridge(self, dp_id: int) -> BridgeInfo | None:
        return self.bridges.get(dp_id)

    def port_qos(self, iface: str):
        if not any(iface in b.ports.values() for b in self.bridges.values()):
            return ABSENT
        return self.qos.get(iface)

    def fence(self, epochs: dict[int, int]) -> dict[int, str]:
        """As the adapter's: raised where lower, refused where newer or the bridge is gone."""
        refused = {dp: "its bridge is not in OVSDB" for dp in epochs if dp not in self.bridges}
        refused |= {dp: f"another controller of this owner holds it now (epoch {self.epochs[dp]}, ours {epoch})"
                    for dp, epoch in epochs.items() if self.epochs.get(dp, 0) > epoch}
        self.epochs |= {dp: epoch for dp, epoch in epochs.items() if dp not in refused}
        return refused

    def apply(self, changes: dict, tags: dict | None = None, port_tags: dict | None = None,
              epochs: dict[int, int] | None = None) -> None:
        self.attempts += 1
        if self.slow:
            raise Unconfirmed(f"OVSDB did not confirm the change of {len(changes)} ports")
        if any(self.epochs.get(dp, 0) > epoch for dp, epoch in (epochs or {}).items()):
            raise OvsdbError("a newer epoch")
        bad = self.refuse & changes.keys()
        if bad:
            raise OvsdbError(f"port {sorted(bad)[0]!r} refused")
        missing = sorted(i for i, spec in changes.items() if spec is not None and self.port_qos(i) == ABSENT)
        if missing:   # as the adapter's transaction does (controller/adapters/ovsdb.py): none of it happens
            raise OvsdbError(f"port {missing[0]!r} is not in OVSDB")
        self.transactions += 1
        for iface, spec in changes.items():
            self.writes_to[iface] += 1
            if spec is None:
                if self.qos.get(iface) != FOREIGN:   # as the adapter's: only our own QoS is taken off
                    self.qos.pop(iface, None)
            else:
                self.qos[iface] = spec.ovsdb

    def remove_orphans(self, everywhere: bool = True) -> int:
        if not everywhere:   # after our own changes: they leave no row unused (the adapter removes what it replaces)
            return 0
        removed, self.orphans = self.orphans, 0
        self.sweeps += bool(removed)
        return removed

    def close(self) -> None:
        pass


class FakeSession:
    """One controller's connection to the FakeOvsdb: what it reads, and the lock as it sees it."""

    def __init__(self, db: FakeOvsdb):
        self.db = db

    def __getattr__(self, name: str):
        return getattr(self.db, name)

    @property
    def has_lock(self) -> bool:
        return self.db.holder is self

    @property
    def lock_contended(self) -> bool:
        return self.db.holder not in (None, self)

    def beat(self) -> None:
        if self.has_lock:
            self.db.beats += 1

    def silent_for(self) -> float:
        return self.db.silent if self.db.connected else 0.0

    def heartbeat(self) -> int:
        return self.db.beats

    def steal_lock(self) -> None:
        self.db.holder = self

    def next_generation_id(self, above: int | None = None) -> int:
        if not self.has_lock:   # OVSDB refuses a transaction that asserts a lock the session does not hold
            raise OvsdbError("ovsdb error: not owner")
        self.db.generation_ids = max(self.db.generation_ids, above or 0, *self.db.epochs.values()) + 1
        return self.db.generation_ids

    def saved_policy(self, verified: bool) -> str | None:
        return self.db.policy_text

    def save_policy(self, text: str) -> None:
        if not self.has_lock:
            raise OvsdbError("ovsdb error: not owner")
        self.db.policy_text = text
        if self.db.slow:   # committed, its answer lost, as a transaction OVSDB answers after ours gave up
            raise Unconfirmed("OVSDB did not confirm the save within 30 s; it may commit yet")


class FakeTc:
    """Each device's HTB classes follow its QoS in the fake OVSDB; a QoS change rebuilds them (and drops
    leaves and filters), as OVS does."""

    def __init__(self, ovsdb: FakeOvsdb):
        self.ovsdb = ovsdb
        self.leaves_: dict[str, dict[str, Leaf]] = {}
        self.filters_: dict[str, set] = {}
        self.writes = 0
        self.fail: dict[str, str] = {}      # operation (replace_leaf, replace_filters, classes) → netlink's error
        self.gone: set[str] = set()         # devices whose root qdisc was deleted by hand
        self._built: dict[str, Any] = {}

    def _may(self, operation: str) -> None:
        """Netlink refuses the operation while the test says so, as Rtnl raises it (an OSError)."""
        if operation in self.fail:
            raise OSError(1, self.fail[operation])

    def _sync(self, iface: str) -> None:
        """OVS builds the device's qdisc anew for each QoS it is given (taken off and put back: anew too)."""
        built = (self.ovsdb.qos.get(iface), self.ovsdb.writes_to[iface])
        if self._built.get(iface) != built:
            self._built[iface] = built
            self.leaves_[iface] = {}
            self.filters_[iface] = set()
            self.gone.discard(iface)

    def delete_root(self, iface: str) -> None:
        """`tc qdisc del dev IFACE root` by hand: the HTB classes are gone until OVS builds them again."""
        self._sync(iface)
        self.gone.add(iface)

    def classes(self, iface: str) -> dict[str, ClassCounters]:
        self._may("classes")
        self._sync(iface)
        qos = self.ovsdb.qos.get(iface)
        if not isinstance(qos, OvsdbQos) or iface in self.gone:
            return {}
        return {htb_classid(q.queue_id): ClassCounters(0, 0, 0) for q in qos.queues}

    def leaves(self, iface: str, classes=None) -> dict[str, Leaf]:
        self._sync(iface)
        return {c: self.leaves_[iface].get(c, Leaf("pfifo", 1000)) for c in self.classes(iface)
                if classes is None or c in classes}

    def filters(self, iface: str) -> set:
        self._sync(iface)
        return set(self.filters_[iface])

    def replace_leaf(self, iface: str, cls: str, chain: tuple[tuple[str, ...], ...]) -> None:
        """Read back as Tc.leaves reads it: the bottom qdisc's kind and limit, and netem's delay above it."""
        self._may("replace_leaf")
        self._sync(iface)
        self.writes += 1
        bottom, delay = chain[-1], 0
        if chain[0][0] == "netem":
            delay = int(chain[0][chain[0].index("delay") + 1].removesuffix("us"))
        limit = int(bottom[bottom.index("limit") + 1]) if bottom[0] in (*FIFO_KINDS, "netem") else None
        self.leaves_[iface][cls] = Leaf(bottom[0], limit, delay_us=delay)

    def replace_filters(self, iface: str, marks, clear: bool = True) -> None:
        self._may("replace_filters")
        self._sync(iface)
        self.writes += 1
        kept = self.filters_[iface] if not clear else set()   # u32 adds beside what is there
        self.filters_[iface] = kept | {(family, dscp, htb_classid(q)) for family in FILTER_FAMILIES
                                       for dscp, q in marks}

    def ifindex(self, iface: str) -> int:
        return 1000 + sum(map(ord, iface))


class Harness:
    """One controller process on fake switches: the real core, the real worker, a clock and timers."""
    _conns = itertools.count(1)     # connection numbers, unique across every harness of a test

    def __init__(self, ovsdb: FakeOvsdb, state_file: Path, policy: Path | None = None, tc: FakeTc | None = None,
                 clock: float = 1000.0, alone: bool = False):
        """`alone`: a lone controller (no standby, so no lease and no epoch on its jobs), not one of a pair."""
        self.fake_ovsdb, self.state_file, self.policy_file = ovsdb, state_file, policy
        self.clock, self.alone = clock, alone
        self.session = ovsdb.session()
        self.remotes = Remotes(("fake",), lambda name: self.session, standby=not alone)
        self.remotes.connect("fake")
        self.store = PairStore(self.remotes, StateFile(state_file, shared=True))   # a standby pair's (standby=True)
        self.core = Controller(self.remotes, owner="test", saved=self.store.load(),
                               pinned=_checked(load_document(str(policy))) if policy else None,
                               authority=Alone() if alone else Pair(self.remotes.locked), wall=lambda: self.clock,
                               rng=random.Random(7))
        self.tc = tc or FakeTc(ovsdb)
        self.worker = Worker(self.remotes.view("fake"), self.tc, lambda results: None,
                             lambda: self.core.authority.confirmed(self.clock))
        self.pending_jobs: list = []
        self.pending_events: list = []
        # The order the world answers in: by default a message the core sends reaches its switch at once,
        # before any job it asked for with it runs (flows land before OVSDB changes). jobs_first holds the
        # messages until the jobs asked with them have run (OVSDB and tc faster than the switch).
        self.jobs_first = False
        self.pending_sends: list[tuple[int, tuple]] = []
        self.exited: act.Exit | None = None
        self.timers: list = [(self.clock + 1.0, -1, REPORT)]
        self._seq = itertools.count()
        self.answers: list[act.Answer] = []
        self.conns: dict[int, FakeConnection] = {}        # connection number → connection
        self.closed: list[int] = []
        self.handle(ev.RemotesChanged(self.remotes.connected(), ("fake",), self.remotes.locked,
                                      self.remotes.lock_taken, self.remotes.heartbeat()))   # as the app, once connected
        self.settle()

    # What tests read of the controller.
    def __getattr__(self, name: str):
        return getattr(self.core, name)

    @property
    def snapshot(self):
        return self.core.snapshot(self.clock)

    def another(self) -> Harness:
        """A second controller process on the same OVSDB, state file and devices: a restart (once this one
        has gone, `exit()`), or a standby (while this one holds the lock)."""
        return Harness(self.fake_ovsdb, self.state_file, self.policy_file, self.tc, self.clock, self.alone)

    def exit(self) -> None:
        """The process ends: its OVSDB session, and with it the lock, goes."""
        if self.fake_ovsdb.holder is self.session:
            self.fake_ovsdb.holder = None

    def remotes_changed(self) -> None:
        """The report of the OVSDB remotes and the lock at once, as the app sends it every second."""
        self.handle(self._report())
        self.settle()

    def _report(self) -> ev.RemotesChanged:
        return ev.RemotesChanged(self.remotes.connected(), (), self.remotes.locked, self.remotes.lock_taken,
                                 self.remotes.heartbeat(), self.remotes.silent_for())

    # --- the loop -------------------------------------------------------------------------------------
    def handle(self, event: Any) -> None:
        for action in self.core.handle(event, self.clock):
            if isinstance(action, act.Send):
                if self.jobs_first:
                    self.pending_sends.append((action.conn, action.messages))
                else:
                    self._send(action.conn, action.messages)
            elif isinstance(action, act.Submit):
                self.pending_jobs += [*action.jobs, *([SWEEP] if action.sweep else [])]
            elif isinstance(action, act.Answer):
                self.answers.append(action)
            elif isinstance(action, act.Later):
                heapq.heappush(self.timers, (self.clock + action.seconds + action.slack, next(self._seq), action.event))
            elif isinstance(action, act.Close):
                self.closed.append(action.conn)
                self.conns.pop(action.conn, None)
            elif isinstance(action, act.ClaimGeneration):   # the app does it in a greenthread: after this event
                self.pending_events.append(ev.GenerationClaimed(self.remotes.claim_generation(action.above)))
            elif isinstance(action, act.SavePolicy):
                self.handle(self.store.save(action.document, action.revision, action.expect))
            elif isinstance(action, act.LoadPolicy):
                self.handle(self.store.load())
            elif isinstance(action, act.Beat):
                self.pending_events.append(ev.Beaten(action.at, self.remotes.beat()))
            elif isinstance(action, act.StealLock):
                self.remotes.steal_lock()
            elif isinstance(action, act.Exit):
                self.exited = action

    def _send(self, number: int, messages: tuple) -> None:
        conn = self.conns.get(number)
        for message in messages if conn else ():
            conn.send_msg(openflow.message(conn, message))

    def settle(self) -> None:
        """Deliver replies and run the worker until nothing moves (a core that keeps asking fails the test, rather
        than hanging it)."""
        for _ in range(SETTLE_STEPS):
            if self.pending_events:
                self.handle(self.pending_events.pop(0))
                continue
            if self.pending_jobs:
                batch, self.pending_jobs = self.pending_jobs, []
                self.handle(ev.JobsDone(tuple(self.worker.execute(batch))))
                continue
            if self.pending_sends:      # jobs_first: what was sent with the jobs reaches the switches now
                number, messages = self.pending_sends.pop(0)
                self._send(number, messages)
                continue
            delivered = False
            for switch in {c.switch for c in self.conns.values() if not c.switch.stalled}:
                for i, (conn, msg) in enumerate(switch.replies):
                    number = next((n for n, c in self.conns.items() if c is conn), None)
                    if number is None:
                        continue        # for another controller's connection
                    del switch.replies[i]
                    event = openflow.reply(number, msg)
                    if event is not None:     # as the app: what is not ours is no event
                        self.handle(event)
                    delivered = True
                    break
            if not delivered:
                return
        raise AssertionError(f"the core did not settle in {SETTLE_STEPS} steps: it keeps asking")

    def advance(self, seconds: float) -> None:
        """Time passes (and traffic with it, on the switches this controller is connected to): every timer
        due by then fires at its time."""
        until = self.clock + seconds
        self.settle()
        while self.timers and self.timers[0][0] <= until:
            due, _, event = heapq.heappop(self.timers)
            self._run(max(self.clock, due) - self.clock)
            if event is REPORT:   # the app's report of the remotes, every second
                heapq.heappush(self.timers, (due + 1.0, next(self._seq), REPORT))
                event = self._report()
            self.handle(event)
            self.settle()
        self._run(until - self.clock)
        self.settle()

    def _run(self, seconds: float) -> None:
        for switch in {c.switch for c in self.conns.values()}:
            switch.run(seconds)
        self.clock += seconds

    def poll(self, seconds: float = 1.0) -> None:
        """A poll interval passes (every switch is polled once, its ports near capacity fast polled); then
        the loads a test set for it (flood) stop."""
        self.advance(seconds)
        for switch in {c.switch for c in self.conns.values()}:
            switch.load, switch.class_load, switch.drop_load = {}, {}, {}

    # --- what the test does -------------------------------------------------------------------------
    def connect(self, switch: FakeSwitch, claims: int | None = None) -> int:
        """A new connection to `switch` (claiming its datapath id, or `claims`); its number."""
        number = next(self._conns)
        self.conns[number] = FakeConnection(switch)
        self.handle(ev.SwitchUp(number, switch.id if claims is None else claims, switch.ports,
                                frozenset(getattr(switch, "down", ()))))
        self.settle()
        return number

    def conn_of(self, switch: FakeSwitch) -> int:
        return next(n for n, c in self.conns.items() if c.switch is switch)

    def disconnect(self, switch: FakeSwitch, number: int | None = None) -> None:
        number = self.conn_of(switch) if number is None else number
        self.conns.pop(number, None)
        self.handle(ev.SwitchDown(number))
        self.settle()

    def request(self, kind: Callable[..., ev.Request], *args: Any):
        """A REST request as the core answers it: (result, error)."""
        self.begin(kind, *args)
        self.settle()
        (answer,) = self.answers
        return answer.result, answer.error

    def begin(self, kind: Callable[..., ev.Request], *args: Any) -> None:
        """A REST request (its token "rest") handled, nothing else yet: what it sent is still unanswered."""
        self.answers.clear()
        self.handle(kind("rest", *args))


# --- the study topology under the app ---------------------------------------------------------------

S1 = {1: "s1-eth1", 2: "s1-eth2", 3: "s1-eth3"}
# The study policies' flows (policies/bases/study.yaml): how many on each switch, and s1's classified ones.
S1_FLOWS, S2_FLOWS = 7, 6
TCP, UDP, VOICE = COOKIE | CLASSIFIED | 4, COOKIE | CLASSIFIED | 3, COOKIE | CLASSIFIED | 7
S2 = {1: "s2-eth1", 3: "s2-eth3", 4: "s2-eth4"}
CAPACITY = 5_000_000


@dataclass
class Net:
    app: Harness
    ovsdb: FakeOvsdb
    s1: FakeSwitch
    s2: FakeSwitch
    tmp: Path


def study_net(tmp_path: Path, alone: bool = False) -> Net:
    s1, s2 = FakeSwitch(1, S1), FakeSwitch(2, S2)
    ovsdb = FakeOvsdb(s1, s2)
    return Net(Harness(ovsdb, tmp_path / "state.json", alone=alone), ovsdb, s1, s2, tmp_path)


def shipped(name: str) -> dict:
    return load_document(f"policies/{name}.yaml")


def up(net, policy="reserve"):
    net.app.connect(net.s1)
    net.app.connect(net.s2)
    result, error = net.app.request(ev.SetPolicy, shipped(policy))
    assert error is None
    return result


def mode(net, iface="s1-eth1"):
    qos = net.ovsdb.qos.get(iface)
    return getattr(qos, "mode", qos)


def flood(net, tcp_bps: float, udp_bps: float) -> None:
    """Until the next poll(): s1 port 1 sends at capacity, TCP's and UDP's class rules (and their counting
    meters) carrying these rates."""
    net.s1.load = {1: CAPACITY}
    net.s1.class_load = {COOKIE | CLASSIFIED | 3: udp_bps, COOKIE | CLASSIFIED | 4: tcp_bps}


def slow_polls(app: Harness, switch: FakeSwitch) -> list[float]:
    """The instants, on `app`'s clock, at which a controller asks `switch` for every port's counters from now on."""
    times: list[float] = []
    process = switch.process

    def watched(conn, msg):
        if type(msg).__name__ == "OFPPortStatsRequest" and msg.port_no == switch.ofproto.OFPP_ANY:
            times.append(app.clock)
        process(conn, msg)
    switch.process = watched
    return times


def _checked(document: Any) -> tuple[Any, Policy]:
    return document, parse_policy(document)
