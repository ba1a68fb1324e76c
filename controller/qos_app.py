"""os-ken (or Ryu) app: the shim between OpenFlow, OVSDB, tc, REST and the pure core.

Run:  osken-manager --config-file controller/qos.conf controller/qos_app.py

One writer. OpenFlow events, REST requests, the statistics timers, the OVSDB/tc worker and the
netlink watcher all enter through this app's event queue, so its state never changes under a
handler's feet. Every change is planned by the pure core (controller/core/plan.py) against what
the switch and OVSDB hold, never against a memory of what was sent: flow batches end with a
barrier, OpenFlow errors are matched to their message by xid, and every poll compares again, so a
flow deleted or a QoS cleared by hand is repaired within a poll or two. OVSDB and tc work goes to
a worker greenthread per OVSDB remote (controller/adapters/worker.py), so OpenFlow handling never
waits on it, and one OVS host that does not answer never stalls the others (controller/adapters/
remotes.py).

A restart is not an outage: the policy in force is saved (controller/adapters/statefile.py), and
a new process adopts what the switches and OVSDB already hold, changing only what differs.
Active/standby (`standby = true`): the controller holding its owner's OVSDB lock, as ovn-northd
does, is active and the switches' OpenFlow master; the other connects to them as slave, sends
nothing that changes them, polls nothing, and takes over (master with a newer generation id, the
saved policy re-read, what is there adopted) when the lock comes to it. On exit
the controller leaves flows and queues as they are; DELETE /qos/v1/policy is what removes them.
"""
from __future__ import annotations

import collections
import logging
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# osken-manager loads this file by path; make the `controller` package importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry, make_wsgi_app  # noqa: E402

from controller.adapters import config, openflow, statefile  # noqa: E402
from controller.adapters.listeners import PortInUse, check_free, listen, serve  # noqa: E402
from controller.adapters.metrics import ControllerCollector, Snapshot  # noqa: E402
from controller.adapters.ovsdb import BridgeInfo, Ovsdb, OvsdbError  # noqa: E402
from controller.adapters.remotes import Remotes, on_this_host  # noqa: E402
from controller.adapters.rest import Busy, make_app  # noqa: E402
from controller.adapters.tc import Tc, TcEvents  # noqa: E402
from controller.adapters.worker import Job, Result, Worker  # noqa: E402
from controller.compat import (CONF, DEAD_DISPATCHER, MAIN_DISPATCHER, App, EventBase,  # noqa: E402
                               EventReplyBase, EventRequestBase, hub, ofp_event, ofproto_v1_3, set_ev_cls)
from controller.core.flows import CLASSIFIED  # noqa: E402
from controller.core.congestion import Decision  # noqa: E402
from controller.core.errors import PolicyError  # noqa: E402
from controller.core.meters import MeterChanges, desired_meters, is_ours, meter_id  # noqa: E402
from controller.core.plan import ABSENT, ActualFlow, FlowChanges, plan  # noqa: E402
from controller.core.policy import Policy, load_document, parse_policy  # noqa: E402
from controller.core.queues import OvsdbQos  # noqa: E402
from controller.core.stats import (FlowCounters, MeterCounters, Multipart, PortCounters, QueueCounters,  # noqa: E402
                                   RateTracker)
from controller.core.switch_state import SwitchState  # noqa: E402

LOG = logging.getLogger("qos_app")
LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"
config.register(CONF)

UNSET, CLEARED, ACTIVE = "unset", "cleared", "active"   # no policy yet (hands off) / cleared / in force
ROLE_ACTIVE, ROLE_STANDBY = "active", "standby"
REQUEST_TIMEOUT = 30.0
CONFIRM_SECONDS = 20.0        # a change is answered once every switch is in sync, or after this saying what is not
CONFIRMED = ("set_policy", "clear_policy")
BRIDGE_RETRIES, BRIDGE_RETRY_SECONDS = 50, 0.2
WHOLE_TABLE_POLLS = 10        # the whole flow table is read every this many polls
TC_SWEEP_SECONDS = 300.0      # netlink announces tc changes; a slow sweep catches any it dropped
# Requests whose replies are stale once a batch has been sent after them, by what they ask.
REQUEST_KINDS = {"OFPAggregateStatsRequest": "count", "OFPMeterConfigStatsRequest": "meters",
                 "OFPMeterStatsRequest": "meter stats"}


class EventRequest(EventRequestBase):
    def __init__(self, op: str, arg: Any):
        super().__init__()
        self.op, self.arg = op, arg


class EventReply(EventReplyBase):
    def __init__(self, dst, result: Any = None, error: Exception | None = None):
        super().__init__(dst)
        self.result, self.error = result, error


class EventPollDue(EventBase):
    def __init__(self, dp_id: int, due: float):
        super().__init__()
        self.dp_id, self.due = dp_id, due


class EventJobsDone(EventBase):
    def __init__(self, results: list[Result]):
        super().__init__()
        self.results = results


class EventTcChanged(EventBase):
    def __init__(self, indexes: set[int] | None):
        super().__init__()
        self.indexes = indexes


class EventConfirmDue(EventBase):
    """A confirmed change's time to be answered has come, settled or not."""


class EventRemotes(EventBase):
    """The OVSDB remotes' states, which of them connected just now, and whether we hold the lock."""
    def __init__(self, connected: dict[str, bool], new: list[str], locked: bool = True, taken: bool = False):
        super().__init__()
        self.connected, self.new, self.locked, self.taken = connected, new, locked, taken


class EventRefresh(EventBase):
    def __init__(self, dp_id: int, tries: int):
        super().__init__()
        self.dp_id, self.tries = dp_id, tries


@dataclass
class Batch:
    """A flow batch (with the meters its flows use) sent and not yet confirmed by its barrier."""
    changes: FlowChanges
    meters: MeterChanges
    xids: set[int]
    errors: list[str] = field(default_factory=list)
    meters_unknown: bool = False      # a meter added was there already: read what it is


@dataclass
class Poll:
    due: float
    sent: float


@dataclass
class Switch:
    dp: Any
    connection: int                                  # a number of its own for every connection of the switch
    bridge: BridgeInfo | None = None
    state: SwitchState | None = None                 # desired; None: the policy has nothing for it
    flows: dict[int, ActualFlow] | None = None       # what the switch holds; None until it has said
    meters: dict[int, Any] | None = None             # our meters on it → band (None: not ours to keep); ditto
    meter_features: Any = None                       # OFPMeterFeaturesStats, once it has said
    epoch: int = 0                                   # flow batches sent: a reply to an older request is stale
    requests: dict[int, tuple[int, str]] = field(default_factory=dict)   # xid → (epoch when sent, what)
    table_polls: int = 0                             # polls since the whole flow table was read
    batches: dict[int, Batch] = field(default_factory=dict)       # barrier xid → batch
    busy: set[int] = field(default_factory=set)      # ports with a worker job in flight
    applied: dict[int, OvsdbQos | None] = field(default_factory=dict)   # what we last put in OVSDB
    tc_check: set[int] = field(default_factory=set)  # ports whose tc may have changed
    failed: set[int] = field(default_factory=set)    # ports whose last job failed: tried again next poll
    flows_failed: bool = False                       # the switch refused a flow batch: tried again next poll
    missing: set[int] = field(default_factory=set)   # ports whose HTB classes a check found gone
    rebuild: set[int] = field(default_factory=set)   # ports whose QoS must be taken off and put back
    ifindex: dict[int, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)   # what is not in sync, and why
    in_sync: bool = False
    settled: bool = False                            # nothing in flight: in sync, or failed until the next poll
    poll: Poll | None = None
    poller: Any = None
    swept: float = 0.0
    generation: int = -1                             # the OVSDB generation the last reconcile saw


class QosController(App):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        try:
            self.settings = self._settings()
            mode, document, policy = self._initial_policy()
        except (config.ConfigError, PolicyError) as err:
            _fail(err, 2)
        try:
            self.ovsdb = self._open()
        except (PortInUse, OvsdbError, OSError) as err:
            _fail(err, 1)
        self.mode, self.document, self.policy = mode, document, policy
        self.role = ROLE_ACTIVE if self.ovsdb.locked else ROLE_STANDBY
        self.generation = self._claim() if self.role == ROLE_ACTIVE else 0   # our OpenFlow generation id as master
        self.switches: dict[int, Switch] = {}
        self.rates = RateTracker()
        self.multipart = Multipart()
        # Per switch, so that a reply replaces its switch's entry whole: switch → port → queue or class.
        self.queue_drops: dict[int, dict[int, dict[int, float]]] = {}   # drops per second
        self.class_bps: dict[int, dict[int, dict[str, float]]] = {}     # the classified flows' bit/s
        self.snapshot = Snapshot(policy=policy.name if policy else None, role=self.role)
        self.decisions: collections.deque[dict] = collections.deque(maxlen=1000)
        self.registry = CollectorRegistry()
        self.registry.register(ControllerCollector(lambda: self.snapshot))
        self.tc: Tc | None = None
        self.workers: dict[str, Worker] = {}   # OVSDB remote → its worker
        self._late_logged: set[int] = set()
        self._connections = 0
        self._waiting: list[tuple[EventRequest, dict, float]] = []   # changes answered once in sync
        self._ports_by_ifindex: dict[int, tuple[int, int]] = {}      # device → (switch, port), for netlink
        self._workers: list = []
        LOG.info("owner %s, policy %s (%s), saved in %s", self.settings.owner, policy.name if policy else None,
                 mode, self.settings.state_file)

    # What a unit test replaces with fakes (tests/unit/fakes.py): configuration, sockets and OVSDB,
    # the worker, timers, the clock.
    def _settings(self) -> config.Settings:
        for handler in logging.getLogger().handlers:   # osken-manager's handlers print bare messages
            handler.setFormatter(logging.Formatter(LOG_FORMAT, "%Y-%m-%d %H:%M:%S"))
        return config.settings(CONF)

    def _open(self) -> Remotes:
        """The listeners (refused while another process has a port) and the OVSDB connections (refused
        while another controller of this owner holds a lock; a remote not reached is tried again)."""
        check_free(self.settings.openflow)
        self._api_sock, self._metrics_sock = listen(self.settings.api), listen(self.settings.metrics)
        remotes = Remotes(self.settings.ovsdb, lambda name: Ovsdb(name, owner=self.settings.owner, timeout=10.0,
                                                                 ssl=self.settings.ovsdb_ssl,
                                                                 standby=self.settings.standby))
        remotes.connect_all_once()
        return remotes

    def _watch_remotes(self) -> None:
        """Report every remote's state, and the lock's, each second."""
        while True:
            self._report_remotes([])
            hub.sleep(1.0)

    def _connect_remotes(self) -> None:
        """Connect the remotes not reached yet, with back-off: apart from the reports, which a remote that
        does not answer a connection for minutes must not hold up."""
        while True:
            new = self.ovsdb.connect_due()
            if new:
                self._report_remotes(new)
            hub.sleep(1.0)

    def _report_remotes(self, new: list[str]) -> None:
        self.send_event(self.name, EventRemotes(self.ovsdb.connected(), new, self.ovsdb.locked, self.ovsdb.lock_taken))

    def _later(self, seconds: float, event: EventBase) -> None:
        hub.spawn_after(seconds, self.send_event, self.name, event)

    def _start_poller(self, dp_id: int):
        return hub.spawn(self._poller, dp_id)

    _now = staticmethod(time.monotonic)

    def _initial_policy(self) -> tuple[str, Any, Policy | None]:
        """The configured policy file, else the one saved when this owner last ran."""
        if self.settings.policy is not None:
            document = load_document(self.settings.policy)
            return ACTIVE, document, parse_policy(document)
        try:
            saved, document = statefile.read(self.settings.state_file)
        except (OSError, PolicyError) as err:
            LOG.error("cannot use the saved policy (%s); starting without one, switches left as they are", err)
            return UNSET, None, None
        if saved != statefile.POLICY:
            return (CLEARED if saved == statefile.CLEARED else UNSET), None, None
        try:
            return ACTIVE, document, parse_policy(document)
        except PolicyError as err:
            LOG.error("the saved policy is no longer valid (%s); starting without one, switches left as they are", err)
            return UNSET, None, None

    # --- life cycle -------------------------------------------------------------------------
    def start(self):
        thread = super().start()
        # osken-manager cleans up (close()) on KeyboardInterrupt only: make SIGTERM do the same,
        # and SIGINT too where a background start left it ignored.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _interrupt)
        self.tc = Tc()
        done = lambda results: self.send_event(self.name, EventJobsDone(results))   # noqa: E731
        self.workers = {name: Worker(self.ovsdb.view(name), self.tc if on_this_host(name) else None, done)
                        for name in self.ovsdb.names}
        for worker in self.workers.values() if self.role == ROLE_ACTIVE else ():
            worker.sweep_orphans()   # rows of ours a dead run left on ports that are gone
        self._workers = [*(hub.spawn(w.run) for w in self.workers.values()), hub.spawn(self._watch_tc),
                         hub.spawn(self._watch_remotes), hub.spawn(self._connect_remotes),
                         hub.spawn(serve, self._api_sock, make_app(self, self.settings.api_token)),
                         hub.spawn(serve, self._metrics_sock, make_wsgi_app(self.registry))]
        LOG.info("REST on %s:%d, metrics on %s:%d", *self.settings.api, *self.settings.metrics)
        return thread

    def stop(self):
        for thread in self._workers + [sw.poller for sw in self.switches.values() if sw.poller]:
            hub.kill(thread)
        super().stop()

    def close(self):
        """Leave flows and queues as they are: a restarted controller adopts them (no outage)."""
        self.ovsdb.close()
        if self.tc:
            self.tc.close()
        LOG.info("exit: flows and queues left in place for the next start")

    # --- requests (REST), answered in the event loop ----------------------------------------------
    def call(self, op: str, arg: Any = None) -> Any:
        """From another greenthread: run `op` in the event loop and wait for its answer."""
        req = EventRequest(op, arg)
        req.dst, req.sync, req.reply_q = self.name, True, hub.Queue()
        self.send_event(self.name, req)
        try:
            reply = req.reply_q.get(timeout=REQUEST_TIMEOUT)
        except hub.QueueEmpty:
            raise Busy(f"the controller did not answer within {REQUEST_TIMEOUT:g} s; try again") from None
        if reply.error is not None:
            raise reply.error
        return reply.result

    @set_ev_cls(EventRequest)
    def _request(self, req: EventRequest) -> None:
        try:
            result = getattr(self, f"_op_{req.op}")(req.arg)
        except PolicyError as err:
            self.reply_to_request(req, EventReply(req.src, error=err))
            return
        except Exception as err:   # noqa: BLE001 - answered as a 500; the traceback goes to the log
            LOG.exception("request %s failed", req.op)
            self.reply_to_request(req, EventReply(req.src, error=err))
            return
        if req.op in CONFIRMED and self.role == ROLE_STANDBY:
            self.reply_to_request(req, EventReply(req.src, error=Busy(
                f"this controller is the standby of owner {self.settings.owner}: send changes to the active one")))
            return
        if req.op in CONFIRMED:
            self._waiting.append((req, result, self._now() + CONFIRM_SECONDS))
            self._later(CONFIRM_SECONDS, EventConfirmDue())   # answered then even if nothing else happens
            self._answer_waiting()
        else:
            self.reply_to_request(req, EventReply(req.src, result))

    @set_ev_cls(EventConfirmDue)
    def _confirm_due(self, _ev: EventConfirmDue) -> None:
        self._answer_waiting()

    def _answer_waiting(self) -> None:
        """Answer the changes waiting for every switch to settle (in sync, or failed and shown as such),
        or for their time to run out."""
        if not self._waiting:
            return
        switches = [sw for sw in self.switches.values() if sw.bridge is not None]
        settled, in_sync, now = all(sw.settled for sw in switches), all(sw.in_sync for sw in switches), self._now()
        waiting = []
        for req, result, deadline in self._waiting:
            if settled or now > deadline:
                not_in_sync = {f"{sw.dp.id:016x}": dict(sw.errors) or "in progress" for sw in switches
                               if not sw.in_sync}
                self.reply_to_request(req, EventReply(req.src, {**result, "in_sync": in_sync,
                                                                **({"not_in_sync": not_in_sync} if not_in_sync else {})}))
            else:
                waiting.append((req, result, deadline))
        self._waiting = waiting

    def _op_policy(self, _) -> Any:
        return self.document

    def _op_set_policy(self, document: Any) -> dict:
        """Validate, check against the connected switches, save, then apply; on error nothing changes."""
        try:
            policy = parse_policy(document)
            for switch in policy.switches:
                if switch.ovsdb and switch.ovsdb not in self.ovsdb.names:
                    raise PolicyError(f"switches.{switch.name}.ovsdb: {switch.ovsdb} is not one of this controller's "
                                      f"OVSDB remotes ({', '.join(self.ovsdb.names)}); fix it, or add it to the "
                                      "controller's ovsdb option")
            for sw in self.switches.values():
                if sw.bridge is not None:
                    _check_ports(policy, sw.bridge, sw.dp.id)
                    _check_meters(policy, sw)
        except PolicyError:
            self.snapshot.load_error = True
            raise
        self.snapshot.load_error = False
        if self.mode == ACTIVE and policy == self.policy:
            return {"applied": policy.name, "changed": False}
        statefile.write(self.settings.state_file, document)
        LOG.info("policy %s in force", policy.name)
        self._install(ACTIVE, document, policy)
        return {"applied": policy.name, "changed": True}

    def _op_clear_policy(self, _) -> dict:
        """No policy: take our flows and queues off every switch."""
        name = self.policy.name if self.policy else None
        statefile.write(self.settings.state_file, None)
        self._install(CLEARED, None, None)
        LOG.info("policy %s cleared", name)
        return {"cleared": name}

    def _op_status(self, _) -> dict:
        switches = {}
        for dp_id, sw in self.switches.items():
            if sw.bridge is None:
                continue
            ports = {}
            for port in (sw.state.switch.ports if sw.state else ()):
                iface = sw.bridge.ports.get(port.port_no)
                actual = self.ovsdb.port_qos(sw.bridge.remote, iface) if iface else None
                ports[str(port.port_no)] = {"iface": iface, "mode": port.queues,
                                            "queues": actual.mode if isinstance(actual, OvsdbQos) else actual,
                                            "congested": sw.state.congested(port.port_no)}
            switches[f"{dp_id:016x}"] = {"bridge": sw.bridge.name, "ovsdb": sw.bridge.remote,
                                          "datapath_type": sw.bridge.datapath_type,
                                          "flows": len(sw.flows or {}), "in_sync": sw.in_sync,
                                          "not_in_sync": dict(sw.errors), "ports": ports}
        remotes = {name: {"connected": up, **({"error": self.ovsdb.errors[name]} if name in self.ovsdb.errors else {})}
                   for name, up in self.ovsdb.connected().items()}
        return {"role": self.role, "policy": self.policy.name if self.policy else None, "mode": self.mode,
                "owner": self.settings.owner, "ovsdb": remotes, "switches": switches, "decisions": list(self.decisions)}

    def _install(self, mode: str, document: Any, policy: Policy | None) -> None:
        self.mode, self.document, self.policy = mode, document, policy
        self.snapshot.policy = policy.name if policy else None
        for sw in self.switches.values():
            self._set_state(sw)
            self._reconcile(sw)

    # --- switches ---------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev):
        dp = ev.datapath
        if ev.state == MAIN_DISPATCHER:
            old = self.switches.get(dp.id)
            if old is not None and old.poller:
                hub.kill(old.poller)
            self._connections += 1
            self.switches[dp.id] = Switch(dp, self._connections)
            self._refresh(dp.id, BRIDGE_RETRIES)
            return
        sw = self.switches.get(dp.id) if dp.id is not None else None
        if sw is None or sw.dp is not dp:   # a reconnected switch's old connection dying late
            return
        del self.switches[dp.id]
        if sw.poller:
            hub.kill(sw.poller)
        for forget in (self.rates.forget_datapath, self.multipart.forget, self.snapshot.forget):
            forget(dp.id)
        self.queue_drops.pop(dp.id, None)
        self.class_bps.pop(dp.id, None)
        if sw.bridge is not None and self.role == ROLE_ACTIVE:
            self.workers[sw.bridge.remote].sweep_orphans()   # a bridge that went away leaves our QoS rows behind
        LOG.info("switch %016x left", dp.id)
        self._answer_waiting()        # a change that waited for this switch waits no more

    @set_ev_cls(EventRemotes)
    def _remotes(self, ev: EventRemotes) -> None:
        for name, up in ev.connected.items():
            if self.snapshot.ovsdb_connected.get(name, up) != up:
                (LOG.info if up else LOG.error)("OVSDB %s %s", name, "is back" if up else
                                               "is not connected; its switches' queues wait for it")
        self.snapshot.ovsdb_connected = dict(ev.connected)
        if self.role == ROLE_STANDBY and ev.locked:
            self._take_over()
        elif self.role == ROLE_ACTIVE and ev.taken and self.settings.standby:
            self._stand_down()
        if ev.new:   # bridges that were not found may be in the remote connected now
            for dp_id, sw in self.switches.items():
                if sw.bridge is None:
                    self._refresh(dp_id, BRIDGE_RETRIES)

    @set_ev_cls(EventRefresh)
    def _refresh_due(self, ev: EventRefresh) -> None:
        self._refresh(ev.dp_id, ev.tries)

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev):
        # OVSDB learns a new port's OpenFlow number a moment after the switch announces it.
        self._later(BRIDGE_RETRY_SECONDS, EventRefresh(ev.msg.datapath.id, 5))

    def _refresh(self, dp_id: int, tries: int) -> None:
        """Read the switch's bridge from OVSDB; again shortly while its ports are not all numbered."""
        sw = self.switches.get(dp_id)
        if sw is None:
            return
        pinned = self.policy.switch(dp_id) if self.policy else None
        bridge = self.ovsdb.bridge(dp_id, pinned.ovsdb if pinned else None)
        complete = bridge is not None and bridge.ports and set(sw.dp.ports) - {sw.dp.ofproto.OFPP_LOCAL} \
            <= set(bridge.ports)
        if not complete and tries > 0:
            self._later(BRIDGE_RETRY_SECONDS, EventRefresh(dp_id, tries - 1))
        if bridge is None:
            if tries == 0:
                LOG.error("datapath %016x is not an OVS bridge in %s; ignoring it", dp_id,
                          ", ".join(self.ovsdb.names))
            return
        if bridge == sw.bridge:
            return
        first = sw.bridge is None
        sw.bridge = bridge
        self._set_state(sw)
        if first:
            LOG.info("switch %016x (%s, datapath %s, OVSDB %s) connected", dp_id, bridge.name,
                     bridge.datapath_type or "system", bridge.remote)
            self._send(sw, self._role_request(sw))
            for msg in (openflow.meter_features_request(sw.dp), openflow.meter_config_request(sw.dp),
                        openflow.flow_stats_request(sw.dp)):   # what it can do and holds, before changing anything
                self._send(sw, msg)
            if self.role == ROLE_ACTIVE:
                sw.poller = self._start_poller(dp_id)
        else:
            self._reconcile(sw)

    def _take_over(self) -> None:
        """The lock is ours: the active controller is gone. Become every switch's master (a newer
        generation id than its), take the policy it saved, read what the switches hold, and go on from
        there: what it programmed is adopted (SwitchState.adopt), not rolled back and put again."""
        LOG.warning("owner %s: the OVSDB lock is ours, the active controller is gone; taking over", self.settings.owner)
        self.role = self.snapshot.role = ROLE_ACTIVE
        self.generation = self._claim()
        if self.settings.policy is None:
            self.mode, self.document, self.policy = self._initial_policy()
            self.snapshot.policy = self.policy.name if self.policy else None
        for dp_id, sw in self.switches.items():
            if sw.bridge is None:
                continue
            self._send(sw, self._role_request(sw))
            sw.flows = sw.meters = sw.state = None   # read again; a fresh state adopts what is there
            self._set_state(sw)
            for msg in (openflow.meter_config_request(sw.dp), openflow.flow_stats_request(sw.dp)):
                self._send(sw, msg)
            sw.poller = self._start_poller(dp_id)
        for worker in self.workers.values():
            worker.sweep_orphans()

    def _stand_down(self) -> None:
        """Another controller of our owner has the lock (we were cut off from OVSDB meanwhile): it is the
        active one now. Slave to every switch, and nothing more from us."""
        LOG.warning("owner %s: another controller holds the OVSDB lock; standing by", self.settings.owner)
        self.role = self.snapshot.role = ROLE_STANDBY
        for sw in self.switches.values():
            if sw.poller:
                hub.kill(sw.poller)
                sw.poller = None
            if sw.bridge is not None:
                self._send(sw, self._role_request(sw))

    def _claim(self) -> int:
        generation = self.ovsdb.next_generation_id()
        LOG.info("OpenFlow master with generation id %d", generation)
        return generation

    def _role_request(self, sw: Switch):
        """Master with our generation id; slave with the active one's (a slave's must not be stale either)."""
        if self.role == ROLE_ACTIVE:
            return openflow.role_request(sw.dp, True, self.generation)
        return openflow.role_request(sw.dp, False, self.ovsdb.generation_id())

    def _set_state(self, sw: Switch) -> None:
        switch_policy = self.policy.switch(sw.dp.id) if self.policy and sw.bridge else None
        if self.policy and sw.bridge and switch_policy is None:
            LOG.warning("switch %016x is not in policy %s; nothing of ours stays on it", sw.dp.id, self.policy.name)
        sw.state = SwitchState(self.policy, switch_policy, sw.bridge.userspace, previous=sw.state) \
            if switch_policy else None
        for port in switch_policy.ports if switch_policy else ():
            if port.queues == "auto":   # counted from 0, so that Prometheus' increase() sees the first event
                for action in ("program", "rollback"):
                    self.snapshot.events.setdefault((sw.dp.id, port.port_no, action), 0)

    # --- reconciliation ---------------------------------------------------------------------
    def _reconcile(self, sw: Switch) -> None:
        """Plan what differs between the policy and what the switch and OVSDB hold, and start it."""
        if self.role != ROLE_ACTIVE or self.mode == UNSET or sw.bridge is None or sw.flows is None \
                or sw.meters is None:
            return
        sw.generation = self.ovsdb.generation
        qos = {}
        for port_no, iface in sw.bridge.ports.items():
            actual = self.ovsdb.port_qos(sw.bridge.remote, iface)
            if actual is not None or (sw.state and sw.state.switch.port(port_no)):
                qos[port_no] = actual
                if port_no in sw.applied and actual not in (sw.applied[port_no], ABSENT) and port_no not in sw.busy:
                    self._drift(sw, "qos", f"port {port_no} ({iface}): OVSDB holds {_mode(actual)}, not what we put")
                    del sw.applied[port_no]
        if sw.state and not sw.state.adopted:
            sw.state.adopt({p for p, q in qos.items() if isinstance(q, OvsdbQos) and q.mode == "reserve"})
        todo = plan(sw.state, sw.flows, qos, sw.meters)
        cannot = openflow.meters_missing(sw.dp.ofproto, sw.meter_features) \
            if todo.meters.add or todo.meters.modify else None
        if cannot:   # said once; a set_policy with it is refused (_check_meters), this is a switch come later
            sw.errors["meters"] = f"{cannot}: its flows that police are left out; remove police from their " \
                                  "classes or run the bridge on a datapath with meters"
        elif (todo.flows or todo.meters) and not sw.batches and not sw.flows_failed:
            sw.errors.pop("meters", None)
            self._send_flows(sw, todo.flows, todo.meters)
        waiting = sw.busy | sw.failed
        jobs = [self._job(sw, port_no, spec, True) for port_no, spec in todo.qos.items() if port_no not in waiting]
        for port_no in (sw.tc_check | sw.rebuild) - waiting - todo.qos.keys():
            spec = todo.specs.get(port_no)
            if spec is not None and isinstance(qos.get(port_no), OvsdbQos):
                jobs.append(self._job(sw, port_no, spec, port_no in sw.rebuild, rebuild=port_no in sw.rebuild))
        # A port's check is done by the job that starts now; one still busy keeps its mark for later.
        started = {job.port_no for job in jobs}
        sw.tc_check -= started
        sw.rebuild -= started
        if jobs:
            sw.busy |= {job.port_no for job in jobs}
            self.workers[sw.bridge.remote].submit(jobs)
        sw.in_sync = not (todo.flows or todo.meters or todo.qos or sw.batches or sw.busy or sw.errors)
        sw.settled = not (sw.batches or sw.busy or ((todo.flows or todo.meters) and not sw.flows_failed and not cannot)
                          or todo.qos.keys() - sw.failed)
        self.snapshot.in_sync[sw.dp.id] = sw.in_sync
        self._answer_waiting()
        for port_no, actual in qos.items():
            key = (sw.dp.id, port_no)
            self.snapshot.programmed[key] = isinstance(actual, OvsdbQos) and actual.mode == "reserve"
            if isinstance(actual, OvsdbQos):
                self.snapshot.capacity_bps[key] = actual.max_bps

    def _job(self, sw: Switch, port_no: int, spec, qos: bool, rebuild: bool = False) -> Job:
        tags = (("dp_id", f"{sw.dp.id:016x}"), ("policy", self.policy.name)) if self.policy else ()
        return Job(sw.dp.id, sw.connection, port_no, sw.bridge.ports[port_no], sw.bridge.userspace, spec, qos,
                   rebuild, tags)

    def _send_flows(self, sw: Switch, changes: FlowChanges, meters: MeterChanges) -> None:
        xids = {self._send(sw, msg) for msg in openflow.batch(sw.dp, changes, meters)}
        barrier = self._send(sw, sw.dp.ofproto_parser.OFPBarrierRequest(sw.dp))
        sw.batches[barrier] = Batch(changes, meters, xids)
        sw.epoch += 1
        LOG.info("switch %016x: flows -%d ~%d +%d%s", sw.dp.id, len(changes.delete), len(changes.modify),
                 len(changes.add), f", meters -{len(meters.delete)} ~{len(meters.modify)} +{len(meters.add)}"
                 if meters else "")

    @staticmethod
    def _send(sw: Switch, msg) -> int:
        sw.dp.set_xid(msg)
        kind = msg.__class__.__name__
        if kind == "OFPFlowStatsRequest":
            sw.requests[msg.xid] = (sw.epoch, "classified" if msg.cookie_mask & CLASSIFIED else "table")
        elif kind in REQUEST_KINDS:
            sw.requests[msg.xid] = (sw.epoch, REQUEST_KINDS[kind])
        sw.dp.send_msg(msg)
        return msg.xid

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier(self, ev):
        sw = self.switches.get(ev.msg.datapath.id)
        batch = sw.batches.pop(ev.msg.xid, None) if sw else None
        if batch is None:
            return
        if batch.errors:
            sw.errors["flows"] = "; ".join(batch.errors)
            sw.flows_failed = True
            sw.flows = sw.meters = None   # not what we think: ask the switch
            self._send(sw, openflow.meter_config_request(sw.dp))
            self._send(sw, openflow.flow_stats_request(sw.dp))
        else:
            sw.errors.pop("flows", None)
            sw.flows = batch.changes.applied_to(sw.flows or {})
            sw.meters = batch.meters.applied_to(sw.meters or {})
            if batch.meters_unknown:
                sw.meters = None
                self._send(sw, openflow.meter_config_request(sw.dp))
        self._reconcile(sw)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, MAIN_DISPATCHER)
    def _error(self, ev):
        msg = ev.msg
        dp = msg.datapath
        what = openflow.describe_error(dp.ofproto, msg.type, msg.code)
        sw = self.switches.get(dp.id)
        batch = next((b for b in (sw.batches.values() if sw else ()) if msg.xid in b.xids), None)
        if batch is not None and what == "OFPET_METER_MOD_FAILED/OFPMMFC_METER_EXISTS":
            # Ours, from before: a restart, or a change another controller of ours made. Adopted as it is,
            # and put right if it differs once it has been read.
            batch.meters_unknown = True
            LOG.info("switch %016x: a meter we added was there already (xid %d); adopting it", dp.id, msg.xid)
            return
        key = (dp.id, what)
        self.snapshot.openflow_errors[key] = self.snapshot.openflow_errors.get(key, 0) + 1
        if batch is not None:
            batch.errors.append(f"{what} (xid {msg.xid})")
        LOG.error("switch %016x refused message xid %d: %s", dp.id, msg.xid, what)

    @set_ev_cls(EventJobsDone)
    def _jobs_done(self, ev: EventJobsDone) -> None:
        touched = {}
        for result in ev.results:
            job = result.job
            sw = self.switches.get(job.dp_id)
            if sw is None or sw.connection != job.connection:   # for a connection that is gone
                continue
            sw.busy.discard(job.port_no)
            key = f"port {job.port_no} ({job.iface})"
            if result.error:
                if sw.errors.get(key) != result.error:   # said once; retried on every poll
                    LOG.error("switch %016x %s: %s", job.dp_id, key, result.error)
                sw.errors[key] = result.error
                sw.failed.add(job.port_no)
                sw.tc_check.add(job.port_no)
            else:
                sw.errors.pop(key, None)
                if job.qos:
                    sw.applied[job.port_no] = job.spec.ovsdb if job.spec else None
                    LOG.info("switch %016x %s: %s", job.dp_id, key,
                             f"{job.spec.mode} queues " + ", ".join(
                                 f"{q.queue_id}:{q.traffic_class} {q.min_bps}-{q.max_bps} bit/s"
                                 for q in job.spec.queues) if job.spec else "queues removed")
                elif result.tc:
                    self._drift(sw, "tc", f"{key}: {'; '.join(result.tc)}")
                if result.missing and not job.qos:
                    # Gone for a moment while OVS rebuilds them, or for good (a `tc qdisc del` by hand):
                    # look again next poll, and rebuild the QoS if they are still gone then.
                    if job.port_no in sw.missing:
                        self._drift(sw, "tc", f"{key}: the HTB qdisc is gone from the device; rebuilding the QoS")
                        sw.missing.discard(job.port_no)
                        sw.rebuild.add(job.port_no)
                    else:
                        sw.missing.add(job.port_no)
                        sw.failed.add(job.port_no)
                        sw.tc_check.add(job.port_no)
                elif not result.missing:
                    sw.missing.discard(job.port_no)
            if result.ifindex:
                sw.ifindex[job.port_no] = result.ifindex
                self._ports_by_ifindex[result.ifindex] = (job.dp_id, job.port_no)
            touched[job.dp_id] = sw
        for sw in touched.values():
            self._reconcile(sw)

    def _drift(self, sw: Switch, kind: str, what: str) -> None:
        self.snapshot.drift_repairs[kind] = self.snapshot.drift_repairs.get(kind, 0) + 1
        LOG.warning("switch %016x: drift (%s) repaired: %s", sw.dp.id, kind, what)

    # --- tc changes made by others ------------------------------------------------------------
    def _watch_tc(self) -> None:
        events, ours = TcEvents(), self.tc.portid
        try:
            while True:
                self.send_event(self.name, EventTcChanged(events.next(ours)))
        finally:
            events.close()

    @set_ev_cls(EventTcChanged)
    def _tc_changed(self, ev: EventTcChanged) -> None:
        touched: dict[int, set[int]] = {}
        if ev.indexes is None:   # announcements were lost: any port may have changed
            touched = {dp_id: set(sw.ifindex) for dp_id, sw in self.switches.items()}
        for index in ev.indexes or ():
            if index in self._ports_by_ifindex:
                dp_id, port_no = self._ports_by_ifindex[index]
                touched.setdefault(dp_id, set()).add(port_no)
        for dp_id, ports in touched.items():
            sw = self.switches.get(dp_id)
            if sw is None:
                continue
            # A busy port is checked once its job is done: the job may have looked before the change.
            sw.tc_check |= ports
            if ports - sw.busy:
                self._reconcile(sw)

    # --- statistics -------------------------------------------------------------------------
    def _poller(self, dp_id: int) -> None:
        """Post a poll of one switch every interval, starting at a random offset so that the polls of
        many switches spread over the interval (as Faucet's Gauge does)."""
        due = time.monotonic() + random.uniform(0, self._interval())
        while True:
            hub.sleep(max(0.0, due - time.monotonic()))
            self.send_event(self.name, EventPollDue(dp_id, due))
            due = max(due + self._interval(), time.monotonic())

    def _interval(self) -> float:
        return self.policy.poll_interval if self.policy else 1.0

    @set_ev_cls(EventPollDue)
    def _poll_due(self, ev: EventPollDue) -> None:
        sw = self.switches.get(ev.dp_id)
        if sw is None or sw.bridge is None or self.role != ROLE_ACTIVE:
            return
        now = self._now()
        lag = now - ev.due
        self.snapshot.poll_lag[ev.dp_id] = lag
        if sw.poll is not None or lag > self._interval():
            if ev.dp_id not in self._late_logged:
                self._late_logged.add(ev.dp_id)
                LOG.warning("switch %016x: statistics cannot be polled every %g s (the last poll was %.2f s late "
                            "and took %.2f s); congestion is answered that much later", ev.dp_id, self._interval(),
                            lag, now - sw.poll.sent if sw.poll else 0.0)
        sw.poll = Poll(ev.due, now)
        retry = bool(sw.failed or sw.flows_failed)
        sw.failed.clear()   # what failed is tried again, once a poll
        sw.flows_failed = False
        self._answer_waiting()
        # The whole flow table now and then (and at once when the count or the classified flows differ
        # from what we hold): a flow changed in place is found within WHOLE_TABLE_POLLS polls.
        sw.table_polls = (sw.table_polls + 1) % WHOLE_TABLE_POLLS
        meters = bool(sw.meters) or bool(sw.state and sw.state.meters)
        for msg in openflow.stats_requests(sw.dp, whole_table=sw.table_polls == 0, meters=meters):
            self._send(sw, msg)
        if now - sw.swept > TC_SWEEP_SECONDS:
            sw.swept = now
            sw.tc_check |= set(sw.ifindex)
        # Else nothing can differ; and while the worker changes its ports, their end reconciles the switch.
        if (retry or sw.tc_check or sw.generation != self.ovsdb.generation) and not sw.busy:
            self._reconcile(sw)

    def _parts(self, ev, kind: str) -> list | None:
        msg = ev.msg
        return self.multipart.add(msg.datapath.id, kind, msg.xid, msg.body,
                                  bool(msg.flags & msg.datapath.ofproto.OFPMPF_REPLY_MORE))

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flow_stats(self, ev):
        body = self._parts(ev, "flow")
        sw = self.switches.get(ev.msg.datapath.id)
        if body is None or sw is None:
            return
        epoch, what = sw.requests.pop(ev.msg.xid, (None, None))
        now = self._now()
        per_class: dict[int, dict[str, float]] = {}
        actual = {}
        for stat in body:
            cookie, flow = openflow.actual_flow(stat)
            actual[cookie] = flow
            owner = sw.state.rule_class(cookie) if sw.state else None
            rates = self.rates.flow(sw.dp.id, cookie, FlowCounters(stat.byte_count, stat.packet_count), now)
            if owner is not None and rates is not None and rates.bps is not None:
                classes = per_class.setdefault(owner[0], {})
                classes[owner[1]] = classes.get(owner[1], 0.0) + rates.bps
        self.class_bps[sw.dp.id] = per_class
        if epoch != sw.epoch or sw.batches or sw.flows is None and what != "table":
            return   # asked before our last batch: not what the switch holds now
        if what == "classified":
            if actual != {c: f for c, f in sw.flows.items() if c & CLASSIFIED}:
                self._send(sw, openflow.flow_stats_request(sw.dp))   # something changed: read the whole table
            return
        if actual == sw.flows:
            return
        if sw.flows is not None:
            self._drift(sw, "flows", _difference(actual, sw.flows, "flows"))
        sw.flows = actual
        self._reconcile(sw)

    @set_ev_cls(ofp_event.EventOFPAggregateStatsReply, MAIN_DISPATCHER)
    def _flow_count(self, ev):
        sw = self.switches.get(ev.msg.datapath.id)
        epoch, _ = sw.requests.pop(ev.msg.xid, (None, None)) if sw else (None, None)
        if epoch is None or epoch != sw.epoch or sw.batches or sw.flows is None:
            return
        if ev.msg.body.flow_count != len(sw.flows):   # flows added or removed: read the whole table
            self._send(sw, openflow.flow_stats_request(sw.dp))

    @set_ev_cls(ofp_event.EventOFPMeterFeaturesStatsReply, MAIN_DISPATCHER)
    def _meter_features(self, ev):
        sw = self.switches.get(ev.msg.datapath.id)
        if sw is not None and ev.msg.body:
            sw.meter_features = ev.msg.body[0]

    @set_ev_cls(ofp_event.EventOFPMeterConfigStatsReply, MAIN_DISPATCHER)
    def _meter_config(self, ev):
        body = self._parts(ev, "meter_config")
        sw = self.switches.get(ev.msg.datapath.id)
        if body is None or sw is None:
            return
        epoch, _ = sw.requests.pop(ev.msg.xid, (None, None))
        if epoch != sw.epoch or sw.batches:
            return   # asked before our last batch
        actual = openflow.actual_meters(sw.dp.ofproto, body)
        if actual == sw.meters:
            return
        if sw.meters is not None:
            self._drift(sw, "meters", _difference(actual, sw.meters, "meters"))
        sw.meters = actual
        self._reconcile(sw)

    @set_ev_cls(ofp_event.EventOFPMeterStatsReply, MAIN_DISPATCHER)
    def _meter_stats(self, ev):
        body = self._parts(ev, "meter")
        sw = self.switches.get(ev.msg.datapath.id)
        if body is None or sw is None:
            return
        epoch, _ = sw.requests.pop(ev.msg.xid, (None, None))
        classes = {meter_id(c.queue): c.name for c in sw.state.policy.classes} if sw.state else {}
        ours = {stat.meter_id: MeterCounters(stat.packet_in_count, stat.byte_in_count,
                                             sum(band.packet_band_count for band in stat.band_stats))
                for stat in body if is_ours(stat.meter_id)}
        self.snapshot.meters[sw.dp.id] = {(meter, classes.get(meter, "")): c for meter, c in ours.items()}
        if epoch == sw.epoch and not sw.batches and sw.meters is not None and ours.keys() != sw.meters.keys():
            # Meters added or removed (and with a meter, its flows): nothing is planned until they are read.
            self._drift(sw, "meters", f"{len(ours.keys() ^ sw.meters.keys())} meters added or removed")
            sw.meters = None
            self._send(sw, openflow.meter_config_request(sw.dp))

    @set_ev_cls(ofp_event.EventOFPQueueStatsReply, MAIN_DISPATCHER)
    def _queue_stats(self, ev):
        body = self._parts(ev, "queue")
        if body is None:
            return
        dp_id, now = ev.msg.datapath.id, self._now()
        drops: dict[int, dict[int, float]] = {}
        queues: dict[tuple[int, int], QueueCounters] = {}
        for stat in body:
            counters = queues[(stat.port_no, stat.queue_id)] = \
                QueueCounters(stat.tx_bytes, stat.tx_packets, stat.tx_errors)
            rates = self.rates.queue(dp_id, stat.port_no, stat.queue_id, counters, now)
            if rates is not None and rates.tx_errors_ps is not None:
                drops.setdefault(stat.port_no, {})[stat.queue_id] = rates.tx_errors_ps
        self.snapshot.queues[dp_id] = queues   # only the queues in this reply exist now
        self.queue_drops[dp_id] = drops

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def _port_stats(self, ev):
        body = self._parts(ev, "port")
        sw = self.switches.get(ev.msg.datapath.id)
        if body is None or sw is None:
            return
        dp_id, now = sw.dp.id, self._now()
        if sw.poll is not None:   # the last reply of the poll
            self.snapshot.poll_duration[dp_id] = now - sw.poll.sent
            self.snapshot.polls[dp_id] = self.snapshot.polls.get(dp_id, 0) + 1
            sw.poll = None
        decided = False
        for stat in body:
            counters = PortCounters(stat.rx_bytes, stat.tx_bytes, stat.rx_packets, stat.tx_packets,
                                    stat.rx_dropped, stat.tx_dropped, stat.rx_errors, stat.tx_errors)
            self.snapshot.ports[(dp_id, stat.port_no)] = counters
            rates = self.rates.port(dp_id, stat.port_no, counters, now)
            if rates is None or sw.state is None:
                continue
            key = (dp_id, stat.port_no)
            decision = sw.state.observe(stat.port_no, rates,
                                        sum(self.queue_drops.get(dp_id, {}).get(stat.port_no, {}).values()),
                                        self.class_bps.get(dp_id, {}).get(stat.port_no, {}), now)
            self.snapshot.congested[key] = sw.state.congested(stat.port_no)
            if decision is not None:
                self._decided(sw, stat.port_no, decision)
                decided = True
        if decided:
            self._reconcile(sw)

    def _decided(self, sw: Switch, port_no: int, decision: Decision) -> None:
        dp_id = sw.dp.id
        LOG.info("switch %016x port %d: %s — %s", dp_id, port_no, decision.action, decision.reason)
        key = (dp_id, port_no, decision.action)
        self.snapshot.events[key] = self.snapshot.events.get(key, 0) + 1
        self.decisions.append({"time": time.time(), "dp_id": f"{dp_id:016x}", "port": port_no,
                               "action": decision.action, "reason": decision.reason,
                               "utilisation": decision.utilisation, "loss_ratio": decision.loss_ratio})


def _check_ports(policy: Policy, bridge: BridgeInfo, dp_id: int) -> None:
    switch = policy.switch(dp_id)
    for port in switch.ports if switch else ():
        if port.port_no not in bridge.ports:
            raise PolicyError(f"switches.{switch.name}.ports.{port.port_no}: bridge {bridge.name} has no "
                              f"OpenFlow port {port.port_no} (it has {sorted(bridge.ports)}); fix the port number")


def _check_meters(policy: Policy, sw: Switch) -> None:
    """A policy that polices on a switch whose meter features say it cannot is refused."""
    switch = policy.switch(sw.dp.id)
    if switch is None or sw.meter_features is None or not desired_meters(policy, switch):
        return
    cannot = openflow.meters_missing(sw.dp.ofproto, sw.meter_features)
    if cannot:
        policed = next(c.name for c in policy.classes if c.police and any(r.traffic_class == c.name
                                                                          for r in switch.flows))
        raise PolicyError(f"classes.{policed}.police: switch {switch.name} (bridge {sw.bridge.name}) cannot police, "
                          f"{cannot}; remove police, or run the bridge on a datapath with meters (datapath_type "
                          "netdev, or the kernel's on Linux 4.18 or later)")


def _difference(actual: dict, known: dict, what: str) -> str:
    """How what a switch holds differs from what we thought it held, for the drift log."""
    return (f"{len(actual.keys() ^ known.keys())} {what} added or removed, "
            f"{sum(actual[k] != known[k] for k in actual.keys() & known.keys())} changed")


def _mode(actual) -> str:
    return f"{actual.mode} queues" if isinstance(actual, OvsdbQos) else actual or "no QoS"


def _fail(err: Exception, code: int):
    print(f"error: {err}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def _interrupt(signum, frame):
    raise KeyboardInterrupt
