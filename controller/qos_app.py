"""os-ken (or Ryu) app: the thin shim between OpenFlow/OVSDB events and the pure core.

Run:  osken-manager --config-file controller/qos.conf controller/qos_app.py

It installs the policy's flows on each OpenFlow 1.3 switch, keeps each QoS
port's queues in OVSDB as the policy and congestion say, polls port and queue
statistics, serves a REST API and Prometheus metrics on loopback, and on exit
removes every QoS/Queue row it created.
"""
from __future__ import annotations

import collections
import logging
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# osken-manager loads this file by path; make the `controller` package importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402
from prometheus_client import CollectorRegistry, make_wsgi_app  # noqa: E402

from controller.compat import (App, CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, cfg, hub,  # noqa: E402
                               ofp_event, ofproto_v1_3, set_ev_cls)
from controller.congestion import Decision  # noqa: E402
from controller.flows import COOKIE, COOKIE_MASK, FlowEntry  # noqa: E402
from controller.metrics import ControllerCollector, Snapshot  # noqa: E402
from controller.ovsdb import DEFAULT_DB, BridgeInfo, Ovsdb, OvsdbError  # noqa: E402
from controller.policy import Policy, PolicyError, parse_policy  # noqa: E402
from controller.rest import make_app  # noqa: E402
from controller.stats import FlowCounters, PortCounters, QueueCounters, RateTracker  # noqa: E402
from controller.switch_state import SwitchState  # noqa: E402
from controller.tc import FIFO_KINDS, Tc, htb_classid  # noqa: E402

LOG = logging.getLogger("qos_app")
CONF = cfg.CONF
CONF.register_opts([
    cfg.StrOpt("policy", default="", help="policy file (YAML) to apply at start"),
    cfg.StrOpt("ovsdb", default=DEFAULT_DB, help="OVSDB remote"),
    cfg.StrOpt("owner", default="default", help="external_ids tag that marks this instance's QoS rows"),
    cfg.StrOpt("api_host", default="127.0.0.1"),
    cfg.PortOpt("api_port", default=8080),
    cfg.StrOpt("metrics_host", default="127.0.0.1"),
    cfg.PortOpt("metrics_port", default=9101),
], group="qos")


@dataclass
class Switch:
    """A connected datapath and what we last put on it."""
    datapath: Any
    bridge: BridgeInfo
    state: SwitchState | None = None
    flows: dict[tuple, FlowEntry] = field(default_factory=dict)   # (priority, match) → entry
    qos: dict[int, Any] = field(default_factory=dict)             # port_no → QosSpec in OVSDB


class QosController(App):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        conf = CONF.qos
        self.ovsdb = Ovsdb(conf.ovsdb, owner=conf.owner)
        self.tc = Tc()
        stale = self.ovsdb.remove_all()
        if stale:
            LOG.info("removed %d QoS/Queue rows left by an earlier run", stale)
        self.policy: Policy | None = None
        self.document: Any = None
        self.switches: dict[int, Switch] = {}
        self.rates = RateTracker()
        self.queue_drops: dict[tuple[int, int], dict[int, float]] = {}
        self.class_bps: dict[tuple[int, int], dict[str, float]] = {}
        self.snapshot = Snapshot()
        self.decisions: collections.deque[dict] = collections.deque(maxlen=1000)
        self.registry = CollectorRegistry()
        self.registry.register(ControllerCollector(lambda: self.snapshot))
        self._workers: list = []
        if conf.policy:
            try:
                self.set_policy(yaml.safe_load(Path(conf.policy).read_text()))
            except (OSError, yaml.YAMLError, PolicyError) as err:
                LOG.error("policy %s: %s", conf.policy, err)
                self.close()
                raise SystemExit(2)
        # osken-manager cleans up (close()) on KeyboardInterrupt only: make SIGTERM do the same,
        # and SIGINT too where a background start left it ignored.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _interrupt)

    # --- life cycle -------------------------------------------------------------------------
    def start(self):
        super().start()
        conf = CONF.qos
        self._workers = [
            hub.spawn(self._poll_loop),
            hub.spawn(hub.WSGIServer((conf.api_host, conf.api_port), make_app(self)).serve_forever),
            hub.spawn(hub.WSGIServer((conf.metrics_host, conf.metrics_port),
                                     make_wsgi_app(self.registry)).serve_forever),
        ]
        LOG.info("REST on %s:%d, metrics on %s:%d", conf.api_host, conf.api_port,
                 conf.metrics_host, conf.metrics_port)

    def stop(self):
        for worker in self._workers:
            hub.kill(worker)
        super().stop()

    def close(self):
        removed = self.ovsdb.remove_all()
        LOG.info("exit: removed %d QoS/Queue rows", removed)
        self.ovsdb.close()
        self.tc.close()

    # --- REST -------------------------------------------------------------------------------
    def policy_document(self) -> Any:
        return self.document

    def set_policy(self, document: Any) -> str:
        """Validate, check against the connected switches, then apply; on error nothing changes."""
        try:
            policy = parse_policy(document)
            for sw in self.switches.values():
                self._check_ports(policy, sw.bridge, sw.datapath.id)
        except PolicyError:
            self.snapshot.load_error = True
            raise
        self.policy, self.document = policy, document
        self.snapshot.load_error = False
        self.snapshot.policy = policy.name
        LOG.info("policy %s in force", policy.name)
        for sw in list(self.switches.values()):   # _adopt yields; switches come and go meanwhile
            self._adopt(sw)
        return policy.name

    def clear_policy(self) -> str | None:
        """No policy: take our flows and queues off every switch (a launcher does this between runs)."""
        name = self.policy.name if self.policy else None
        self.policy = self.document = self.snapshot.policy = None
        for sw in list(self.switches.values()):
            self._adopt(sw)
        LOG.info("policy %s cleared", name)
        return name

    def status(self) -> dict:
        switches = {}
        for dp_id, sw in self.switches.items():
            ports = {}
            if sw.state is not None:
                for p in sw.state.switch.ports:
                    spec = sw.qos.get(p.port_no)
                    ports[str(p.port_no)] = {
                        "iface": sw.bridge.ports.get(p.port_no), "mode": p.queues,
                        "queues": spec.mode if spec else None,
                        "congested": sw.state.congested(p.port_no)}
            switches[f"{dp_id:016x}"] = {"bridge": sw.bridge.name, "datapath_type": sw.bridge.datapath_type,
                                          "flows": len(sw.flows), "ports": ports}
        return {"policy": self.policy.name if self.policy else None, "switches": switches,
                "decisions": list(self.decisions)}

    # --- OpenFlow events --------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev):
        dp = ev.msg.datapath
        bridge = self._bridge(dp.id)
        if bridge is None:
            LOG.error("datapath %016x is not an OVS bridge in %s; ignoring it", dp.id, CONF.qos.ovsdb)
            return
        sw = Switch(dp, bridge)
        self.switches[dp.id] = sw
        # Start from a clean slate: whatever flows of ours a previous run left.
        parser = dp.ofproto_parser
        dp.send_msg(parser.OFPFlowMod(dp, cookie=COOKIE, cookie_mask=COOKIE_MASK, table_id=dp.ofproto.OFPTT_ALL,
                                      command=dp.ofproto.OFPFC_DELETE, out_port=dp.ofproto.OFPP_ANY,
                                      out_group=dp.ofproto.OFPG_ANY))
        LOG.info("switch %016x (%s, datapath %s) connected", dp.id, bridge.name, bridge.datapath_type or "system")
        if self.policy is not None:
            self._adopt(sw)

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def _switch_gone(self, ev):
        dp_id = ev.datapath.id
        sw = self.switches.pop(dp_id, None) if dp_id is not None else None
        if sw is None:
            return
        # A bridge that went away leaves our QoS rows unreferenced: remove them now.
        for port_no in list(sw.qos):
            self._remove_queues(sw, port_no)
        self.rates.forget_datapath(dp_id)
        for table in (self.snapshot.ports, self.snapshot.capacity_bps, self.snapshot.congested,
                      self.snapshot.programmed, self.queue_drops, self.class_bps):
            for key in [k for k in table if k[0] == dp_id]:
                del table[key]
        for key in [k for k in self.snapshot.queues if k[0] == dp_id]:
            del self.snapshot.queues[key]
        LOG.info("switch %016x left", dp_id)

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flow_stats(self, ev):
        dp_id, now = ev.msg.datapath.id, time.monotonic()
        sw = self.switches.get(dp_id)
        if sw is None or sw.state is None:
            return
        per_class: dict[tuple[int, int], dict[str, float]] = {}
        for stat in ev.msg.body:
            owner = sw.state.rule_class(stat.cookie)
            rates = self.rates.flow(dp_id, stat.cookie, FlowCounters(stat.byte_count, stat.packet_count), now)
            if owner is not None and rates is not None and rates.bps is not None:
                port_no, name = owner
                classes = per_class.setdefault((dp_id, port_no), {})
                classes[name] = classes.get(name, 0.0) + rates.bps
        for key in [k for k in self.class_bps if k[0] == dp_id]:
            del self.class_bps[key]
        self.class_bps.update(per_class)

    @set_ev_cls(ofp_event.EventOFPQueueStatsReply, MAIN_DISPATCHER)
    def _queue_stats(self, ev):
        dp_id, now = ev.msg.datapath.id, time.monotonic()
        drops: dict[tuple[int, int], dict[int, float]] = {}
        for stat in ev.msg.body:
            counters = QueueCounters(stat.tx_bytes, stat.tx_packets, stat.tx_errors)
            self.snapshot.queues[(dp_id, stat.port_no, stat.queue_id)] = counters
            rates = self.rates.queue(dp_id, stat.port_no, stat.queue_id, counters, now)
            if rates is not None and rates.tx_errors_ps is not None:
                drops.setdefault((dp_id, stat.port_no), {})[stat.queue_id] = rates.tx_errors_ps
        # Only the queues in this reply exist now; older ones went with a QoS change.
        for key in [k for k in self.queue_drops if k[0] == dp_id]:
            del self.queue_drops[key]
        self.queue_drops.update(drops)

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def _port_stats(self, ev):
        dp_id, now = ev.msg.datapath.id, time.monotonic()
        sw = self.switches.get(dp_id)
        for stat in ev.msg.body:
            counters = PortCounters(stat.rx_bytes, stat.tx_bytes, stat.rx_packets, stat.tx_packets,
                                    stat.rx_dropped, stat.tx_dropped, stat.rx_errors, stat.tx_errors)
            self.snapshot.ports[(dp_id, stat.port_no)] = counters
            rates = self.rates.port(dp_id, stat.port_no, counters, now)
            if rates is None or sw is None or sw.state is None:
                continue
            key = (dp_id, stat.port_no)
            decision = sw.state.observe(stat.port_no, rates, sum(self.queue_drops.get(key, {}).values()),
                                        self.class_bps.get(key, {}), now)
            self.snapshot.congested[(dp_id, stat.port_no)] = sw.state.congested(stat.port_no)
            if decision is not None:
                self._decide(sw, stat.port_no, decision)

    # --- reconciliation ---------------------------------------------------------------------
    def _adopt(self, sw: Switch) -> None:
        """Put the current policy (or none) on a switch: flows and queues, from scratch."""
        switch_policy = self.policy.switch(sw.datapath.id) if self.policy else None
        if switch_policy is None:
            if self.policy:
                LOG.warning("switch %016x is not in policy %s; leaving it without flows",
                            sw.datapath.id, self.policy.name)
            sw.state = None
        else:
            sw.state = SwitchState(self.policy, switch_policy, sw.bridge.userspace)
        for port_no in set(sw.qos) - {p.port_no for p in (switch_policy.ports if switch_policy else ())}:
            self._remove_queues(sw, port_no)
        if sw.state is not None:
            self._sync_queues(sw)
        self._sync_flows(sw)

    def _decide(self, sw: Switch, port_no: int, decision: Decision) -> None:
        dp_id, decided = sw.datapath.id, time.time()
        LOG.info("switch %016x port %d: %s — %s", dp_id, port_no, decision.action, decision.reason)
        # Queues exist before flows steer into them; steering stops before queues go.
        if decision.action == "program":
            self._sync_queues(sw)
            self._sync_flows(sw)
        else:
            self._sync_flows(sw)
            self._sync_queues(sw)
        key = (dp_id, port_no, decision.action)
        self.snapshot.events[key] = self.snapshot.events.get(key, 0) + 1
        done = time.time()
        LOG.info("switch %016x port %d: %s done in %.0f ms", dp_id, port_no, decision.action, (done - decided) * 1e3)
        self.decisions.append({"time": done, "decided": decided, "dp_id": f"{dp_id:016x}", "port": port_no,
                            "action": decision.action, "reason": decision.reason,
                            "utilisation": decision.utilisation, "loss_ratio": decision.loss_ratio})

    def _sync_queues(self, sw: Switch) -> None:
        dp_id = sw.datapath.id
        for port_no, spec in sw.state.qos().items():
            if sw.qos.get(port_no) == spec:
                continue
            iface = sw.bridge.ports.get(port_no)
            if iface is None:
                LOG.error("switch %016x has no port %d; its queues are not applied", dp_id, port_no)
                continue
            if sw.bridge.userspace and port_no in sw.qos:
                # HTB refuses to delete a class a filter points at: filters go first.
                self._tc_call(iface, self.tc.replace_filters, iface, ())
            try:
                self.ovsdb.apply_qos(iface, spec, {"policy": self.policy.name, "dp_id": f"{dp_id:016x}"})
            except OvsdbError as err:
                LOG.error("switch %016x port %d (%s): %s", dp_id, port_no, iface, err)
                continue
            sw.qos[port_no] = spec
            self.snapshot.capacity_bps[(dp_id, port_no)] = spec.max_bps
            self.snapshot.programmed[(dp_id, port_no)] = spec.mode == "reserve"
            LOG.info("switch %016x port %d (%s): %s queues %s", dp_id, port_no, iface, spec.mode,
                     ", ".join(f"{q.queue_id}:{q.traffic_class} {q.min_bps}-{q.max_bps} bit/s" for q in spec.queues))
            self._sync_tc(iface, spec, sw.bridge.userspace, wait=True)

    def _remove_queues(self, sw: Switch, port_no: int) -> None:
        iface = sw.bridge.ports.get(port_no)
        if iface is not None:
            self.ovsdb.remove_qos(iface)
        sw.qos.pop(port_no, None)
        for table in (self.snapshot.capacity_bps, self.snapshot.programmed, self.snapshot.congested):
            table.pop((sw.datapath.id, port_no), None)

    def _sync_tc(self, iface: str, spec, userspace: bool, wait: bool) -> None:
        """Each class's leaf queue as the policy says, and the DSCP filters on the userspace datapath."""
        wanted = [htb_classid(q.queue_id) for q in spec.queues]
        for _ in range(30 if wait else 1):   # OVS builds the HTB classes a moment after the OVSDB commit
            if set(wanted) <= set(self._tc_call(iface, self.tc.classes, iface) or ()):
                break
            if wait:
                hub.sleep(0.1)
        else:
            if wait:
                LOG.warning("%s: HTB classes not there yet; queues and filters will follow on the next poll", iface)
            return
        leaves = self._tc_call(iface, self.tc.leaves, iface) or {}
        for cls in wanted:
            if not _leaf_matches(leaves.get(cls), spec.leaf):
                self._tc_call(iface, self.tc.replace_leaf, iface, cls, spec.leaf)
                LOG.info("%s: %s queue under class %s", iface, " ".join(spec.leaf), cls)
        if userspace and self._tc_call(iface, self.tc.filters, iface) != {(d, htb_classid(q)) for d, q in spec.marks}:
            self._tc_call(iface, self.tc.replace_filters, iface, spec.marks)
            LOG.info("%s: tc filters for DSCP marks %s", iface, spec.marks)

    @staticmethod
    def _tc_call(iface: str, method, *args):
        try:
            return method(*args)
        except OSError as err:   # the device went away, or the kernel refused: the next poll retries
            LOG.error("%s: tc: %s", iface, err)
            return None

    def _sync_flows(self, sw: Switch) -> None:
        dp = sw.datapath
        ofp, parser = dp.ofproto, dp.ofproto_parser
        wanted = {(e.priority, e.match): e for e in (sw.state.flows() if sw.state else ())}
        for key in set(sw.flows) - set(wanted):
            priority, match = key
            dp.send_msg(parser.OFPFlowMod(dp, cookie=COOKIE, cookie_mask=COOKIE_MASK, priority=priority,
                                          command=ofp.OFPFC_DELETE_STRICT, out_port=ofp.OFPP_ANY,
                                          out_group=ofp.OFPG_ANY, match=parser.OFPMatch(**dict(match))))
        for key, entry in wanted.items():
            if sw.flows.get(key) != entry:
                dp.send_msg(_flow_mod(dp, entry))
        sw.flows = wanted

    def _poll_loop(self) -> None:
        while True:
            try:
                self._poll_once()
            except Exception:   # noqa: BLE001 - a dead poll loop would end congestion handling silently
                LOG.exception("statistics poll failed; polling goes on")
            hub.sleep(self.policy.poll_interval if self.policy else 1.0)

    def _poll_once(self) -> None:
        # Snapshots: tc and OVSDB calls yield to other greenthreads (REST, events) that change these.
        for sw in list(self.switches.values()):
            dp = sw.datapath
            ofp, parser = dp.ofproto, dp.ofproto_parser
            # Flow and queue stats first: the port-stats handler reads their rates.
            dp.send_msg(parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY,
                                                   COOKIE, COOKIE_MASK, parser.OFPMatch()))
            dp.send_msg(parser.OFPQueueStatsRequest(dp, 0, ofp.OFPP_ANY, ofp.OFPQ_ALL))
            dp.send_msg(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY))
            for port_no, spec in list(sw.qos.items()):
                iface = sw.bridge.ports.get(port_no)
                if iface is not None and sw.qos.get(port_no) == spec:
                    self._sync_tc(iface, spec, sw.bridge.userspace, wait=False)

    # --- OVSDB lookups ------------------------------------------------------------------------
    def _bridge(self, dp_id: int) -> BridgeInfo | None:
        # The Interface rows get their ofport a moment after the bridge connects.
        for _ in range(20):
            bridge = self.ovsdb.bridge(dp_id)
            if bridge is not None and bridge.ports:
                return bridge
            hub.sleep(0.1)
        return self.ovsdb.bridge(dp_id)

    @staticmethod
    def _check_ports(policy: Policy, bridge: BridgeInfo, dp_id: int) -> None:
        switch = policy.switch(dp_id)
        for port in switch.ports if switch else ():
            if port.port_no not in bridge.ports:
                raise PolicyError(f"switches.{switch.name}.ports.{port.port_no}: bridge {bridge.name} has no "
                                  f"OpenFlow port {port.port_no} (it has {sorted(bridge.ports)}); fix the port number")


def _flow_mod(dp, entry: FlowEntry):
    ofp, parser = dp.ofproto, dp.ofproto_parser
    actions = []
    for action in entry.actions:
        kind = action[0]
        if kind == "output":
            port = action[1]
            actions.append(parser.OFPActionOutput(
                port if isinstance(port, int) else getattr(ofp, f"OFPP_{port.upper()}"), ofp.OFPCML_NO_BUFFER))
        elif kind == "set_queue":
            actions.append(parser.OFPActionSetQueue(action[1]))
        else:
            actions.append(parser.OFPActionSetField(**{action[1]: action[2]}))
    instructions = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
    return parser.OFPFlowMod(dp, cookie=entry.cookie, priority=entry.priority, command=ofp.OFPFC_ADD,
                             match=parser.OFPMatch(**dict(entry.match)), instructions=instructions)


def _leaf_matches(leaf, spec: tuple[str, ...]) -> bool:
    """Whether the leaf in force is the kind (and, for a FIFO, the length) the policy asks for."""
    if leaf is None or leaf.kind != spec[0]:
        return False
    return spec[0] not in FIFO_KINDS or leaf.limit == int(spec[spec.index("limit") + 1])


def _interrupt(signum, frame):
    raise KeyboardInterrupt
