"""os-ken (or Ryu) app: the thin shim between os-ken's events and the pure core.

Run:  osken-manager --config-file controller/qos.conf controller/qos_app.py
  or: ryu-manager --config-file controller/qos.conf controller/qos_app.py

Every decision is the core's (controller/core/controller.py): this app turns os-ken's events into the
core's events, and the core's actions into OpenFlow messages, OVSDB/tc jobs, REST answers and timers.
One writer: OpenFlow events, REST requests, timers, the OVSDB/tc workers' results and netlink's
announcements all enter through this app's event queue, so the core never changes under a handler.
OVSDB and tc work goes to one worker greenthread per OVSDB remote (controller/adapters/worker.py), and
each remote is connected by a greenthread of its own, so a host that does not answer delays nothing.
On exit the controller leaves flows and queues as they are (a restart adopts them);
DELETE /qos/v1/policy is what removes them.
"""
from __future__ import annotations

import itertools
import logging
import os
import signal
import sys
import time
from typing import Any, assert_never

import eventlet.hubs
from prometheus_client import CollectorRegistry

from controller.adapters import config, openflow
from controller.adapters.appevents import EventCore, EventReply, EventRequest
from controller.adapters.ha import chosen
from controller.adapters.heap import Heap
from controller.adapters.hostlock import SwitchLocks
from controller.adapters.listeners import (
    PortInUse,
    check_free,
    guard_openflow,
    listen,
    raise_file_limit,
    serve,
)
from controller.adapters.metrics import CachedExposition, ControllerCollector
from controller.adapters.ovsdb import LockHeld
from controller.adapters.process import EXIT_FAILED, fail, stop, throw, wake_on_signals
from controller.adapters.remotes import on_this_host
from controller.adapters.rest import MakeRequest, make_app
from controller.adapters.tc import Tc, TcEvents
from controller.adapters.timers import Timers
from controller.adapters.worker import Worker
from controller.compat import (
    CONF,
    DEAD_DISPATCHER,
    FRAMEWORK,
    MAIN_DISPATCHER,
    App,
    hub,
    ofp_event,
    ofproto_v1_3,
    set_ev_cls,
)
from controller.core import actions as act
from controller.core import events as ev
from controller.core.controller import Controller
from controller.core.errors import PolicyError
from controller.core.policy import load_document, parse_policy
from controller.core.stats import Multipart

LOG = logging.getLogger("qos_app")
LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"
config.register(CONF)

REQUEST_TIMEOUT = 30.0
FIRST_REMOTE_WAIT = 5.0     # at start, how long the first remote (the lock's) may take before the API opens
REPLIES = [ofp_event.EventOFPFlowStatsReply, ofp_event.EventOFPFlowRemoved,
           ofp_event.EventOFPMeterConfigStatsReply, ofp_event.EventOFPMeterStatsReply,
           ofp_event.EventOFPMeterFeaturesStatsReply, ofp_event.EventOFPQueueStatsReply,
           ofp_event.EventOFPPortStatsReply, ofp_event.EventOFPBarrierReply, ofp_event.EventOFPErrorMsg,
           ofp_event.EventOFPRoleReply, ofp_event.EventOFPEchoReply, ofp_event.EventOFPPacketIn,
           ofp_event.EventOFPExperimenterStatsReply, ofp_event.EventOFPExperimenter]


class QosController(App):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for handler in logging.getLogger().handlers:   # the manager's handlers print bare messages
            handler.setFormatter(logging.Formatter(LOG_FORMAT, "%Y-%m-%d %H:%M:%S"))
        try:
            self.settings = config.settings(CONF)
            document = load_document(str(self.settings.policy)) if self.settings.policy else None
            pinned = (document, parse_policy(document)) if document is not None else None   # refused before OVSDB
            check_free(self.settings.openflow)
            self._api_sock, self._metrics_sock = listen(self.settings.api), listen(self.settings.metrics)
        except (config.ConfigError, PolicyError, PortInUse, OSError) as err:
            fail(err, 2 if isinstance(err, config.ConfigError | PolicyError) else 1)
        raise_file_limit()
        guard_openflow()      # before os-ken starts listening
        settings = self.settings
        self.mode = chosen(settings)     # alone, one of a pair, or a cluster's member: asked alike from here on
        self.ovsdb = self.mode.remotes()
        self._first_tried: bool = False
        self._held: LockHeld | None = None
        self._threads = [hub.spawn(self._connect_remote, name) for name in settings.ovsdb]
        deadline = time.monotonic() + FIRST_REMOTE_WAIT
        while not self._first_tried and time.monotonic() < deadline:
            hub.sleep(0.01)      # the first remote decides active or standby; one that hangs is waited for no more
        if self._held is not None:
            fail(self._held, 1)
        self._load, self._keep, self._read = self.mode.store(self.ovsdb)
        self._saves: Any = hub.Queue()      # the core's SavePolicy actions, for _save_policies
        try:
            self.core = Controller(self.ovsdb, owner=settings.owner, saved=self._load(),
                                   pinned=pinned, authority=self.mode.authority(self.ovsdb), wall=time.time,
                                   probe_key=os.urandom(32))
        except PolicyError as err:
            fail(err, 2)
        self.registry = CollectorRegistry()
        self.registry.register(ControllerCollector(lambda: self.core.snapshot(time.monotonic()),
                                                   self.ovsdb.bridge_reads))
        self.datapaths: dict[int, Any] = {}    # connection → os-ken Datapath
        self._conns = itertools.count(1)
        self.parts = Multipart()
        self.timers = Timers(self._post_all)
        self.tc: Tc | None = None
        self.workers: dict[str, Worker] = {}

    # --- life cycle ------------------------------------------------------------------------------------
    def start(self) -> Any:   # the framework's start()'s value, passed on
        thread = super().start()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, stop)
        signal.signal(signal.SIGHUP, lambda *_: eventlet.hubs.get_hub().schedule_call_global(0, hub.spawn,
                                                                                              self._reload))
        for signum in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, lambda num, _: LOG.info("%s ignored (SIGHUP re-reads the policy file)",
                                                          signal.Signals(num).name))
        self.tc = Tc()
        done = lambda results: self._post(ev.JobsDone(tuple(results)))   # noqa: E731
        may_write = lambda: self.mode.may_write(self.core.authority, time.monotonic())  # noqa: E731
        self.workers = {name: Worker(self.ovsdb.view(name), self.tc if on_this_host(name) else None, done, may_write,
                                     self.mode.unconfirmed,
                                     SwitchLocks.beside(name, hub.sleep) if on_this_host(name) else None)
                        for name in self.ovsdb.names}
        self._threads += [*(hub.spawn(w.run) for w in self.workers.values()), hub.spawn(self._watch_tc),
                          hub.spawn(self._save_policies), hub.spawn(wake_on_signals),
                          hub.spawn(self._watch_remotes), hub.spawn(Heap().run, hub.sleep), hub.spawn(self.timers.run),
                          *(hub.spawn(service, self._post) for service in self.mode.services),
                          hub.spawn(serve, self._api_sock, make_app(self, self.settings.api_token)),
                          hub.spawn(serve, self._metrics_sock, CachedExposition(self.registry))]
        LOG.info("under %s; REST on %s:%d, metrics on %s:%d", "os-ken" if FRAMEWORK == "os_ken" else "Ryu",
                 *self.settings.api, *self.settings.metrics)
        return thread

    def stop(self) -> None:
        for thread in self._threads:
            hub.kill(thread)
        super().stop()

    def close(self) -> None:
        """Leave flows and queues as they are: a restarted controller adopts them (no outage). A member of a
        cluster gives its switches up at once, so that the others take them over within a second."""
        self.mode.leave()
        self.ovsdb.close()
        if self.tc:
            self.tc.close()
        LOG.info("exit: flows and queues left in place for the next start")

    def _reload(self) -> None:
        """SIGHUP, as operators expect of a daemon: the config file and its policy file read again, and the
        policy put in force as a PUT would be; a bad one changes nothing and is said in one line."""
        try:
            if not CONF.reload_config_files():
                LOG.error("SIGHUP: the config file cannot be read again (see above); nothing changed")
                return
            path = config.settings(CONF).policy
            if path is None:
                LOG.warning("SIGHUP: no policy file is configured ([qos] policy); nothing to reload")
                return
            document = load_document(str(path))
        except (config.ConfigError, PolicyError) as err:
            LOG.error("SIGHUP: %s; the policy in force stays", err)
            return
        LOG.info("SIGHUP: %s read again", path)
        self._post(ev.Reload(document))

    # --- OVSDB remotes and netlink, each in a greenthread of its own -----------------------------------------
    def _connect_remote(self, name: str) -> None:
        """Connect one remote, with back-off, whatever the others do."""
        while True:
            try:
                wait = self.ovsdb.connect(name)
            except LockHeld as err:   # another controller of our owner is active, and this one is no standby
                self._held, self._first_tried = err, True
                if hasattr(self, "core"):   # found after the start: the core decides
                    self._post(ev.LockHeld(str(err)))
                return
            self._first_tried |= name == self.ovsdb.names[0]
            if wait is None:
                self._post(self._remotes((name,)))
                return
            hub.sleep(wait)

    def _watch_remotes(self) -> None:
        """Each second: every remote's state and the lock's (the core beats, or watches the holder's beat)."""
        while True:
            self._post(self._remotes())
            hub.sleep(1.0)

    def _remotes(self, new: tuple[str, ...] = ()) -> ev.RemotesChanged:
        return ev.RemotesChanged(self.ovsdb.connected(), new, self.ovsdb.locked, self.ovsdb.lock_taken,
                                 self.ovsdb.heartbeat(), self.ovsdb.silent_for(), dict(self.ovsdb.errors))

    def _watch_tc(self) -> None:
        assert self.tc is not None      # made in start(), before this greenthread
        events, ours = TcEvents(self.tc.ports), self.tc.ports
        try:
            while True:
                devices = events.next(ours)
                self._post(ev.TcChanged(None if devices is None else frozenset(devices)))
        finally:
            events.close()

    # --- into the core ----------------------------------------------------------------------------------
    def _post(self, event: ev.Event) -> None:
        """From any greenthread: hand `event` to the core in the event loop."""
        self._post_all([event])

    def _post_all(self, events: list[ev.Event]) -> None:
        """... several, in one hop to the event loop."""
        self.send_event(self.name, EventCore(tuple(events)))

    @set_ev_cls(EventCore)
    def _core_event(self, wrapped: EventCore) -> None:
        for event in wrapped.events:
            self._handle(event)

    def _fail(self, what: str) -> None:
        LOG.exception("%s failed; exiting (flows and queues stay in place)", what)
        print(f"error: the controller failed {what} (its log has the traceback); exiting", file=sys.stderr, flush=True)
        throw(SystemExit(EXIT_FAILED))

    def _save_policies(self) -> None:
        """The store's writes, in the order asked (and answered), off the event loop: a slow etcd holds up nothing."""
        while True:
            action = self._saves.get()
            try:
                self._post(self._keep(action.document, action.revision, action.expect))
            except Exception:   # noqa: BLE001 - as a handler's: the saves after it would wait for ever
                return self._fail("saving the policy")

    def _handle(self, event: ev.Event) -> None:
        """A handler that raises ends the process (as Faucet's do), non-zero, so that its service starts it
        afresh: never half-alive, its switches held but no longer served. Flows and queues stay for the next."""
        try:
            self._execute(self.core.handle(event, time.monotonic()))
        except Exception:   # noqa: BLE001
            self._fail(f"handling {type(event).__name__}")
            return
        self.mode.turned()   # a cluster's keepalive may refresh our leases

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, event: Any) -> None:
        dp = event.datapath
        if event.state == MAIN_DISPATCHER:
            dp.qos_conn = next(self._conns)
            self.datapaths[dp.qos_conn] = dp
            self._handle(ev.SwitchUp(dp.qos_conn, dp.id, openflow.ports(dp), openflow.down(dp)))
        elif getattr(dp, "qos_conn", None) in self.datapaths:
            del self.datapaths[dp.qos_conn]
            self.parts.forget(dp.qos_conn)
            self._handle(ev.SwitchDown(dp.qos_conn))

    # The state change, not the port status: the framework sends it once it has updated dp.ports, which
    # it does in its own thread, so a port status may reach this app before dp.ports holds the port.
    @set_ev_cls(ofp_event.EventOFPPortStateChange, MAIN_DISPATCHER)
    def _port_status(self, event: Any) -> None:
        dp = event.datapath
        if getattr(dp, "qos_conn", None) in self.datapaths:
            self._handle(ev.PortsChanged(dp.qos_conn, openflow.ports(dp), openflow.down(dp)))

    @set_ev_cls(REPLIES, MAIN_DISPATCHER)
    def _reply(self, event: Any) -> None:
        msg = event.msg
        conn = getattr(msg.datapath, "qos_conn", None)
        if conn not in self.datapaths:
            return
        kind = type(msg).__name__
        if kind in openflow.MULTIPART:
            more = bool(msg.flags & msg.datapath.ofproto.OFPMPF_REPLY_MORE)
            body = self.parts.add(conn, kind, msg.xid, msg.body, more)
            if body is None:
                return
            msg.body = body
        core_event = openflow.reply(conn, msg)
        if core_event is not None:
            self._handle(core_event)

    # --- out of the core -------------------------------------------------------------------------------
    def _execute(self, actions: list[act.Action]) -> None:
        """What the core asked for, each kind of action once (mypy checks that none is left out). OVSDB
        transactions, etcd's round trips and the policy store's writes go to greenthreads, which report back
        by event. A load of the store (at start, and as a pair's standby takes over) is read here: no event is
        handled with the policy it replaces."""
        for action in actions:
            match action:
                case act.Send():
                    dp = self.datapaths.get(action.conn)
                    if dp is not None:
                        for message in action.messages:
                            dp.send_msg(openflow.message(dp, message))
                case act.Submit():
                    worker = self.workers.get(action.remote)
                    if worker is not None:
                        worker.raise_epochs(dict(action.epochs))
                        worker.submit(list(action.jobs))
                        if action.sweep:
                            worker.sweep_orphans()
                case act.Answer() if isinstance(action.token, ev.Reload):
                    if action.error is not None:
                        LOG.error("SIGHUP: %s; the policy in force stays", action.error)
                    else:
                        LOG.info("SIGHUP: %s", action.result)
                case act.Answer():
                    self.reply_to_request(action.token, EventReply(action.token.src, action.result, action.error))
                case act.Later():
                    self.timers.add(action.seconds, action.event, action.slack)
                case act.Close():   # off the loop: os-ken's close posts the switch's end to our own queue, which
                    dp = self.datapaths.get(action.conn)   # when full (128) held the loop waiting for itself
                    if dp is not None:
                        hub.spawn(dp.close)
                case act.ClaimGeneration():
                    hub.spawn(lambda above: self._post(ev.GenerationClaimed(self.ovsdb.claim_generation(above))),
                              action.above)
                case act.SavePolicy():
                    self._saves.put(action)
                case act.ClaimSwitch() | act.ReleaseSwitch() | act.Unreachable() | act.PublishSync():
                    self.mode.execute(action, self._post)
                case act.LoadPolicy():
                    self._handle(self._load())
                case act.Beat():
                    hub.spawn(lambda at: self._post(ev.Beaten(at, self.ovsdb.beat())), action.at)
                case act.StealLock():
                    self.ovsdb.steal_lock()
                case act.Exit():
                    print(f"error: {action.reason}", file=sys.stderr, flush=True)
                    throw(SystemExit(action.code))
                case _:
                    assert_never(action)

    # --- REST: requests answered in the event loop --------------------------------------------------------
    def call(self, make: MakeRequest) -> Any:
        """From another greenthread: the request `make` builds, answered in the event loop; wait for that."""
        req = EventRequest(make)
        req.dst, req.sync, req.reply_q = self.name, True, hub.Queue()
        self.send_event(self.name, req)
        try:
            reply = req.reply_q.get(timeout=REQUEST_TIMEOUT)
        except hub.QueueEmpty:
            raise req.ticket.expire(REQUEST_TIMEOUT) from None
        if reply.error is not None:
            raise reply.error
        return reply.result

    def current_policy(self) -> dict[str, Any]:
        return self._read() if self._read else self.call(ev.GetPolicy)

    @set_ev_cls(EventRequest)
    def _request(self, req: EventRequest) -> None:
        if req.ticket.take():
            self._handle(req.make(req))
        else:
            LOG.warning("a request answered 503 (not taken up within %g s) was dropped unhandled", REQUEST_TIMEOUT)
