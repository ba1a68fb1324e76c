"""Fakes that let unit tests drive the real controller app (controller/qos_app.py) without a switch,
OVSDB or netlink, after Faucet's clib/fakeoftable.py.

- FakeDatapath is an OpenFlow 1.3 switch: a flow table and a meter table that apply the app's real
  os-ken FlowMods and MeterMods, and replies (barriers, errors, flow/meter/queue/port statistics)
  queued until the test delivers them.
- FakeOvsdb holds each port's QoS as OvsdbQos; FakeTc holds each device's classes (from that QoS,
  rebuilt when it changes, as OVS does), leaves and filters.
- FakeController is the app with those collaborators, a fake clock, and an event loop the test
  turns with settle(): deliver replies, run the worker, dispatch events, until nothing moves.
- study_net() is the study topology's s1 and s2 under it; up(), flood() and mode() are what the
  app's tests do to it and read from it (tests/unit/conftest.py makes it the `net` fixture).
"""
from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from os_ken.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from controller import qos_app
from controller.adapters.config import Settings
from controller.adapters.ovsdb import BridgeInfo, OvsdbError
from controller.adapters.remotes import Remotes
from controller.adapters.tc import ClassCounters, Leaf
from controller.adapters.worker import SWEEP, Worker
from controller.core.flows import CLASSIFIED, COOKIE
from controller.core.plan import ABSENT, FILTER_FAMILIES, htb_classid
from controller.core.policy import load_document
from controller.core.queues import OvsdbQos


@dataclass
class Entry:
    cookie: int
    instructions: list
    packets: int = 0
    bytes: int = 0


@dataclass
class PortTraffic:
    tx_bytes: int = 0
    tx_packets: int = 0
    tx_dropped: int = 0


class FakeDatapath:
    ofproto = ofp
    ofproto_parser = parser

    def __init__(self, dp_id: int, ports: dict[int, str], userspace: bool = True):
        self.id = dp_id
        self.bridge = BridgeInfo(f"br{dp_id}", "netdev" if userspace else "system", dict(ports))
        self.ports = {p: SimpleNamespace(port_no=p) for p in ports} | {ofp.OFPP_LOCAL: SimpleNamespace()}
        self.table: dict[tuple, Entry] = {}          # (priority, match items) → entry
        self.traffic: dict[int, PortTraffic] = {p: PortTraffic() for p in ports}
        self.queues: dict[tuple[int, int], tuple[int, int, int]] = {}   # (port, queue) → bytes, packets, drops
        self.replies: collections.deque = collections.deque()
        self.sent: list = []
        self.meters: dict[int, Any] = {}            # meter id → the OFPMeterMod that made it
        self.meter_traffic: dict[int, tuple[int, int, int]] = {}   # meter id → packets, bytes, dropped
        self.max_meter = 1000                       # meter features: 0 is a switch without meters
        self.refuse_cookies: set[int] = set()       # flow mods with these cookies get an error back
        self.port_stats_parts = 1                   # split port statistics over this many replies
        self._xids = itertools.count(1)

    def set_xid(self, msg) -> int:
        msg.xid = next(self._xids)
        return msg.xid

    def send_msg(self, msg) -> bool:
        self.sent.append(msg)
        kind = type(msg).__name__
        if kind == "OFPFlowMod":
            self._flow_mod(msg)
        elif kind == "OFPBarrierRequest":
            self.replies.append(("barrier", msg.xid, None))
        elif kind == "OFPFlowStatsRequest":
            body = [SimpleNamespace(cookie=e.cookie, priority=prio, match=parser.OFPMatch(**dict(match)),
                                    instructions=e.instructions, byte_count=e.bytes, packet_count=e.packets)
                    for (prio, match), e in self.table.items() if e.cookie & msg.cookie_mask == msg.cookie]
            self.replies.append(("flow", msg.xid, body))
        elif kind == "OFPRoleRequest":
            self.role, self.generation_id = msg.role, msg.generation_id
        elif kind == "OFPMeterMod":
            self._meter_mod(msg)
        elif kind == "OFPMeterFeaturesStatsRequest":
            features = parser.OFPMeterFeaturesStats(self.max_meter, 1 << ofp.OFPMBT_DROP if self.max_meter else 0,
                                                    ofp.OFPMF_KBPS | ofp.OFPMF_BURST | ofp.OFPMF_STATS, 8, 0)
            self.replies.append(("meter_features", msg.xid, [features]))
        elif kind == "OFPMeterConfigStatsRequest":
            body = [parser.OFPMeterConfigStats(m.flags, meter, m.bands) for meter, m in sorted(self.meters.items())]
            self.replies.append(("meter_config", msg.xid, body))
        elif kind == "OFPMeterStatsRequest":
            body = [SimpleNamespace(meter_id=meter, packet_in_count=n, byte_in_count=b,
                                    band_stats=[SimpleNamespace(packet_band_count=d)])
                    for meter, (n, b, d) in ((m, self.meter_traffic.get(m, (0, 0, 0))) for m in sorted(self.meters))]
            self.replies.append(("meter", msg.xid, body))
        elif kind == "OFPAggregateStatsRequest":
            count = sum(e.cookie & msg.cookie_mask == msg.cookie for e in self.table.values())
            self.replies.append(("count", msg.xid, SimpleNamespace(flow_count=count)))
        elif kind == "OFPQueueStatsRequest":
            body = [SimpleNamespace(port_no=p, queue_id=q, tx_bytes=b, tx_packets=n, tx_errors=d)
                    for (p, q), (b, n, d) in self.queues.items()]
            self.replies.append(("queue", msg.xid, body))
        elif kind == "OFPPortStatsRequest":
            body = [SimpleNamespace(port_no=p, rx_bytes=0, tx_bytes=t.tx_bytes, rx_packets=0, tx_packets=t.tx_packets,
                                    rx_dropped=0, tx_dropped=t.tx_dropped, rx_errors=0, tx_errors=0)
                    for p, t in self.traffic.items()]
            size = -(-len(body) // self.port_stats_parts)
            for k in range(0, len(body), size):
                self.replies.append(("port", msg.xid, body[k:k + size]))
        return True

    def _meter_mod(self, msg) -> None:
        exists = msg.meter_id in self.meters
        if msg.command == ofp.OFPMC_ADD and exists or msg.command == ofp.OFPMC_MODIFY and not exists:
            code = ofp.OFPMMFC_METER_EXISTS if exists else ofp.OFPMMFC_UNKNOWN_METER
            self.replies.append(("error", msg.xid, (ofp.OFPET_METER_MOD_FAILED, code)))
        elif msg.command == ofp.OFPMC_DELETE:
            self.meters.pop(msg.meter_id, None)
            for key in [k for k, e in self.table.items() if msg.meter_id in self.meters_of(e)]:
                del self.table[key]   # as OpenFlow says: a meter's flows go with it
        else:
            self.meters[msg.meter_id] = msg

    @staticmethod
    def meters_of(entry: Entry) -> set[int]:
        return {i.meter_id for i in entry.instructions if type(i).__name__ == "OFPInstructionMeter"}

    def _flow_mod(self, msg) -> None:
        if msg.cookie in self.refuse_cookies:
            self.replies.append(("error", msg.xid, (ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT)))
            return
        if msg.command != ofp.OFPFC_DELETE and not self.meters_of(Entry(0, msg.instructions)) <= self.meters.keys():
            self.replies.append(("error", msg.xid, (ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_INVALID_METER)))
            return
        key = (msg.priority, tuple(sorted(msg.match.items())))
        if msg.command == ofp.OFPFC_ADD:
            self.table[key] = Entry(msg.cookie, msg.instructions)
        elif msg.command == ofp.OFPFC_MODIFY_STRICT and key in self.table:
            self.table[key].instructions = msg.instructions
        elif msg.command == ofp.OFPFC_DELETE:
            for k in [k for k, e in self.table.items() if e.cookie & msg.cookie_mask == msg.cookie & msg.cookie_mask]:
                del self.table[k]

    def steering(self) -> set[int]:
        """Cookies of the flows that set a queue."""
        return {e.cookie for e in self.table.values()
                for i in e.instructions for a in i.actions if type(a).__name__ == "OFPActionSetQueue"}

    def flow_mods(self) -> list:
        return [m for m in self.sent if type(m).__name__ == "OFPFlowMod"]

    def meter_mods(self) -> list:
        return [m for m in self.sent if type(m).__name__ == "OFPMeterMod"]


class FakeOvsdb:
    def __init__(self, *datapaths: FakeDatapath):
        self.bridges = {dp.id: dp.bridge for dp in datapaths}
        self.qos: dict[str, Any] = {}                 # iface → OvsdbQos, or FOREIGN
        self.refuse: set[str] = set()
        self.transactions = 0
        self.connected = True
        self.has_lock = True
        self.generation_ids = 0

    def generation_id(self) -> int:
        return self.generation_ids

    def next_generation_id(self) -> int:
        self.generation_ids += 1
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

    def apply(self, changes: dict, tags: dict | None = None, port_tags: dict | None = None) -> None:
        bad = self.refuse & changes.keys()
        if bad:
            raise OvsdbError(f"port {sorted(bad)[0]!r} refused")
        self.transactions += 1
        for iface, spec in changes.items():
            if spec is None:
                self.qos.pop(iface, None)
            else:
                self.qos[iface] = spec.ovsdb

    def remove_orphans(self) -> int:
        return 0

    def close(self) -> None:
        pass


class FakeTc:
    """Each device's HTB classes follow its QoS in the fake OVSDB; a QoS change rebuilds them (and drops
    leaves and filters), as OVS does."""

    def __init__(self, ovsdb: FakeOvsdb):
        self.ovsdb = ovsdb
        self.leaves_: dict[str, dict[str, Leaf]] = {}
        self.filters_: dict[str, set] = {}
        self._built: dict[str, Any] = {}

    def _sync(self, iface: str) -> None:
        qos = self.ovsdb.qos.get(iface)
        if self._built.get(iface) != qos:
            self._built[iface] = qos
            self.leaves_[iface] = {}
            self.filters_[iface] = set()

    def classes(self, iface: str) -> dict[str, ClassCounters]:
        self._sync(iface)
        qos = self.ovsdb.qos.get(iface)
        return {htb_classid(q.queue_id): ClassCounters(0, 0, 0) for q in qos.queues} if isinstance(qos, OvsdbQos) else {}

    def leaves(self, iface: str, classes=None) -> dict[str, Leaf]:
        self._sync(iface)
        return {c: self.leaves_[iface].get(c, Leaf("pfifo", 1000)) for c in self.classes(iface)
                if classes is None or c in classes}

    def filters(self, iface: str) -> set:
        self._sync(iface)
        return set(self.filters_[iface])

    def replace_leaf(self, iface: str, cls: str, leaf: tuple[str, ...]) -> None:
        self._sync(iface)
        limit = int(leaf[leaf.index("limit") + 1]) if "limit" in leaf else None
        self.leaves_[iface][cls] = Leaf(leaf[0], limit)

    def replace_filters(self, iface: str, marks) -> None:
        self._sync(iface)
        self.filters_[iface] = {(family, dscp, htb_classid(q)) for family in FILTER_FAMILIES for dscp, q in marks}

    def ifindex(self, iface: str) -> int:
        return 1000 + sum(map(ord, iface))


class QueuedWorker(Worker):
    """The real worker, run when the test's event loop gets to it instead of in a greenthread."""

    def __init__(self, *args):
        super().__init__(*args)
        self.pending: list = []

    def submit(self, jobs) -> None:
        self.pending.extend(jobs)

    def sweep_orphans(self) -> None:
        self.pending.append(SWEEP)


class FakeController(qos_app.QosController):
    def __init__(self, ovsdb: FakeOvsdb, state_file: Path, policy: Path | None = None, tc: FakeTc | None = None):
        self._fake_ovsdb, self._state_file, self._policy_file = ovsdb, state_file, policy
        self.clock = 1000.0
        self.posted: collections.deque = collections.deque()
        self.answers: list = []
        self.later: list = []
        super().__init__()
        self.tc = tc or FakeTc(ovsdb)
        self.worker = QueuedWorker(self.ovsdb.view("fake"), self.tc,
                                   lambda results: self.posted.append(qos_app.EventJobsDone(results)))
        self.workers = {"fake": self.worker}
        self.datapaths: dict[int, FakeDatapath] = {}
        self.handlers = {qos_app.EventJobsDone: self._jobs_done, qos_app.EventTcChanged: self._tc_changed,
                         qos_app.EventPollDue: self._poll_due, qos_app.EventRefresh: self._refresh_due,
                         qos_app.EventRequest: self._request, qos_app.EventConfirmDue: self._confirm_due,
                         qos_app.EventRemotes: self._remotes}

    def _settings(self) -> Settings:
        return Settings(policy=self._policy_file, state_file=self._state_file, ovsdb=("fake",), owner="test",
                        api=("127.0.0.1", 0), api_token="", metrics=("127.0.0.1", 0))

    def _open(self):
        remotes = Remotes(("fake",), lambda name: self._fake_ovsdb)
        remotes.connect_all_once()
        return remotes

    def _later(self, seconds: float, event) -> None:
        self.later.append(event)

    def _start_poller(self, dp_id: int):
        return None

    def _now(self) -> float:
        return self.clock

    def send_event(self, name, ev) -> None:
        self.posted.append(ev)

    def reply_to_request(self, req, rep) -> None:
        self.answers.append(rep)

    def another(self) -> FakeController:
        """A second controller process on the same OVSDB, state file and devices: a restart, or a standby."""
        return FakeController(self._fake_ovsdb, self._state_file, self._policy_file, self.tc)

    # --- what the test does ------------------------------------------------------------------------
    def connect(self, dp: FakeDatapath) -> None:
        self.datapaths[dp.id] = dp
        self._state_change(SimpleNamespace(datapath=dp, state=MAIN_DISPATCHER))
        self.settle()

    def disconnect(self, dp: FakeDatapath) -> None:
        self._state_change(SimpleNamespace(datapath=dp, state=DEAD_DISPATCHER))
        self.settle()

    def request(self, op: str, arg: Any = None):
        """A REST request as the app answers it: (result, error)."""
        self.begin(op, arg)
        self.settle()
        (answer,) = self.answers
        return answer.result, answer.error

    def begin(self, op: str, arg: Any = None) -> None:
        """A REST request handled, nothing else yet: what it sent is still unanswered."""
        req = qos_app.EventRequest(op, arg)
        req.src = "rest"
        self.answers.clear()
        self._request(req)

    def poll(self, seconds: float = 1.0) -> None:
        """Time passes, then every switch is polled, its replies delivered."""
        self.clock += seconds
        for dp_id in list(self.datapaths):
            self.posted.append(qos_app.EventPollDue(dp_id, self.clock))
        self.settle()

    def settle(self) -> None:
        while True:
            if self.posted:
                event = self.posted.popleft()
                self.handlers[type(event)](event)
            elif self.worker.pending:
                batch, self.worker.pending = self.worker.pending, []
                self.posted.append(qos_app.EventJobsDone(self.worker.execute(batch)))
            elif any(dp.replies for dp in self.datapaths.values()):
                dp = next(dp for dp in self.datapaths.values() if dp.replies)
                self._deliver(dp, *dp.replies.popleft())
            else:
                return

    def _deliver(self, dp: FakeDatapath, kind: str, xid: int, body) -> None:
        if kind == "barrier":
            self._barrier(SimpleNamespace(msg=SimpleNamespace(datapath=dp, xid=xid)))
        elif kind == "error":
            self._error(SimpleNamespace(msg=SimpleNamespace(datapath=dp, xid=xid, type=body[0], code=body[1])))
        elif kind == "count":
            self._flow_count(SimpleNamespace(msg=SimpleNamespace(datapath=dp, xid=xid, body=body)))
        else:
            more = kind == "port" and any(r[0] == "port" and r[1] == xid for r in dp.replies)
            msg = SimpleNamespace(datapath=dp, xid=xid, body=body, flags=ofp.OFPMPF_REPLY_MORE if more else 0)
            handler = {"flow": self._flow_stats, "queue": self._queue_stats, "port": self._port_stats,
                       "meter": self._meter_stats, "meter_config": self._meter_config,
                       "meter_features": self._meter_features}[kind]
            handler(SimpleNamespace(msg=msg))


# --- the study topology under the app ---------------------------------------------------------------

S1 = {1: "s1-eth1", 2: "s1-eth2", 3: "s1-eth3"}
S2 = {1: "s2-eth1", 3: "s2-eth3", 4: "s2-eth4"}
CAPACITY = 5_000_000


def study_net(tmp_path: Path) -> SimpleNamespace:
    s1, s2 = FakeDatapath(1, S1), FakeDatapath(2, S2)
    ovsdb = FakeOvsdb(s1, s2)
    app = FakeController(ovsdb, tmp_path / "state.json")
    return SimpleNamespace(app=app, ovsdb=ovsdb, s1=s1, s2=s2, tmp=tmp_path)


def shipped(name: str) -> dict:
    return load_document(f"policies/{name}.yaml")


def up(net, policy="reserve"):
    net.app.connect(net.s1)
    net.app.connect(net.s2)
    result, error = net.app.request("set_policy", shipped(policy))
    assert error is None
    return result


def mode(net, iface="s1-eth1"):
    qos = net.ovsdb.qos.get(iface)
    return getattr(qos, "mode", qos)


def flood(net, tcp_bps: float, udp_bps: float) -> None:
    """A second of s1 port 1 sending at capacity: TCP's and UDP's class rules count what they steer."""
    tx = net.s1.traffic[1]
    tx.tx_bytes += CAPACITY // 8
    tx.tx_packets += CAPACITY // 8 // 1500
    for entry in net.s1.table.values():
        if entry.cookie == COOKIE | CLASSIFIED | 3:
            entry.bytes += int(udp_bps / 8)
        if entry.cookie == COOKIE | CLASSIFIED | 4:
            entry.bytes += int(tcp_bps / 8)
