"""One switch connection kept as the policy says: a valve, as Faucet calls it. Events and the injected
`now` go in with a read-only view of the world beyond the switch (controller/core/view.py); the actions
it wants done come out. It holds no pointer to its controller; forgetting it is one `del`.

It reads what the switch holds before it changes anything (its flows and meters, from statistics),
plans the difference against the policy (controller/core/plan.py) and what OVSDB holds, and asks for
it: a flow batch ended by a barrier (flowsync.py), OVSDB/tc jobs for the ports (portjobs.py). Every
poll (poller.py) compares again, so a flow deleted or a QoS cleared by hand is repaired within a poll or
two, and feeds the congestion detector, whose decisions change what the plan wants.

It writes only while its controller is active and the switch has confirmed it as OpenFlow master on
this very connection (role.py): a controller deposed while it hung, or whose role request the switch
refused, sends nothing that changes the switch (a fresh connection starts as an "equal", which may
write, and so must not).
"""
from __future__ import annotations

from typing import Any

from controller.core import actions as act
from controller.core import events as ev
from controller.core.bridges import BridgeInfo
from controller.core.fabric import NO_FABRIC
from controller.core.flowsync import FlowSync
from controller.core.meters import meter_id
from controller.core.part import LOG, Link, SwitchPart
from controller.core.plan import plan, steered_ports
from controller.core.poll import PollRound
from controller.core.poller import Poller
from controller.core.portjobs import PortJobs
from controller.core.queues import OvsdbQos
from controller.core.role import RoleManager
from controller.core.site import site_switch
from controller.core.switch_state import SwitchState
from controller.core.telemetry import SwitchTelemetry
from controller.core.view import Mode, SwitchView

BRIDGE_RETRIES, BRIDGE_RETRY_SECONDS = 50, 0.2
FROM_THE_SWITCH = (ev.PacketIn, ev.PortsChanged, ev.RoleReply, ev.ErrorReply, ev.BarrierReply, ev.FlowStatsReply,
                   ev.FlowsChanged, ev.FlowRemoved, ev.MeterFeaturesReply, ev.MeterConfigReply, ev.MeterStatsReply,
                   ev.QueueStatsReply, ev.PortStatsReply, ev.EchoReply)
IS_SLAVE = "OFPET_BAD_REQUEST/OFPBRC_IS_SLAVE"


class Switch:
    def __init__(self, conn: int, dp_id: int, ports: frozenset[int], now: float, phase: float):
        """`ports`: its OpenFlow ports as it announced them; `phase`: where its polls fall in the interval."""
        self.link = Link(conn, dp_id, SwitchTelemetry())
        self.ports = ports
        self.bridge: BridgeInfo | None = None
        self.state: SwitchState | None = None             # desired; None: the policy has nothing for it
        self.role = RoleManager(self.link)
        self.flows = FlowSync(self.link)
        self.jobs = PortJobs(self.link, now)
        self.poller = Poller(self.link, phase)
        self.in_sync = False
        self.settled = False                              # nothing in flight: in sync, or failed until the next poll
        self.ovsdb_generation: tuple[int, ...] = ()       # what OVSDB held at the last reconcile
        self.ovsdb_held: tuple[BridgeInfo, dict[int, Any]] | None = None   # what it held of ours then: bridge, QoS
        self.taken_over = False                           # what the switch holds is read once it confirms us master

    @property
    def parts(self) -> tuple[SwitchPart, ...]:
        return self.role, self.flows, self.jobs, self.poller

    @property
    def conn(self) -> int:
        return self.link.conn

    @property
    def dp_id(self) -> int:
        return self.link.dp_id

    @property
    def telemetry(self) -> SwitchTelemetry:
        return self.link.telemetry

    def handle(self, event: ev.SwitchEvent, now: float, view: SwitchView) -> list[act.SwitchAction]:
        if isinstance(event, FROM_THE_SWITCH):
            self.poller.heard = now      # it answers: however late its polls' replies, the connection lives
        match event:
            case ev.BridgeDue():
                self.find_bridge(event.tries, view, now)
            case ev.PortsChanged():
                self.ports = event.ports
                # OVSDB numbers a new port a moment after the switch reports it: read until it has.
                self.link.later(BRIDGE_RETRY_SECONDS, ev.BridgeDue(self.conn, BRIDGE_RETRIES))
            case ev.PollDue():
                self._poll_due(event, view, now)
            case ev.RoleReply():
                if self.role.reply(event, view, now):
                    if self.taken_over:      # read anew what another controller may have changed
                        self.taken_over = False
                        for part in self.parts:
                            part.read_anew()
                    self.reconcile(view)
            case ev.ErrorReply():
                self._error(event)
            case ev.BarrierReply():
                if self.flows.barrier(event):
                    self.reconcile(view)
            case ev.FlowStatsReply():
                what, epoch = self.link.answered(event.xid)
                current = self.flows.current(epoch)
                self._decide(self.poller.flows(event, now), view, now)
                if self.flows.flow_table(event, what, current):
                    self.reconcile(view)
            case ev.FlowsChanged():
                if event.xid:
                    self.link.answered(event.xid)
                    self.flows.monitored = True
                if (event.cookies is None or event.cookies) and self.role.writable(view):
                    self.flows.changed()   # a slave's monitor hears its master's writes: nothing to put right
            case ev.FlowRemoved():
                self.flows.removed(event.cookie)
            case ev.TableDue():
                self.flows.table_due()
            case ev.MeterFeaturesReply():
                self.link.answered(event.xid)
                self.flows.cannot_police = event.cannot_police
                if self.state is not None:
                    self.state.counting = event.cannot_police is None
            case ev.MeterConfigReply():
                if self.flows.meter_config(event, self.flows.current(self.link.answered(event.xid)[1])):
                    self.reconcile(view)
            case ev.MeterStatsReply():
                current = self.flows.current(self.link.answered(event.xid)[1])
                self._decide(self.poller.meters(event, now), view, now)
                self._meter_telemetry(event)
                self.flows.meter_set(event, current)
            case ev.QueueStatsReply():
                self.link.answered(event.xid)
                self._decide(self.poller.queues(event, now), view, now)
            case ev.PortStatsReply():
                self.link.answered(event.xid)
                self._decide(self.poller.ports(event, now), view, now)
            case ev.JobsDone():
                self.jobs.done(list(event.results))
                self.reconcile(view)
            case ev.TcChanged():
                ports = {p for p, index in self.jobs.ifindex.items() if event.devices is None or index in event.devices}
                if self.jobs.tc_changed(ports):
                    self.reconcile(view)
            case ev.PolicyInstalled():   # no retry, so not held back to the next poll as one is
                self.jobs.policy_installed()
                self.flows.failed = False
                self.find_bridge(0, view, now)   # OVSDB as it is now: the policy may name a port numbered since
                self._set_state(view)
                self.reconcile(view)
            case ev.RoleDue():
                self.role.due(view)
            case ev.TakingOver():
                if self.bridge is not None:   # read again; a fresh state adopts what is there
                    # Only the claim now, the reads once the switch confirmed it: a hundred switches taken
                    # over at once then answer their role requests first, not behind their flow tables.
                    self.role.claim(view)
                    self.taken_over = True
                    self.state = None
                    self._set_state(view)
                    self.poller.start(view, now)
            case ev.StandingDown():
                for part in self.parts:
                    part.stand_down()
                self.role.due(view)
            case ev.Reconcile():
                self.reconcile(view)
            case ev.FabricChanged():
                self._set_state(view)
                self.reconcile(view)
            case ev.Relieved():
                if self.state is not None:
                    self.state.relieved(event.port_no, event.moved)
                    self.reconcile(view)
            case ev.PacketIn() | ev.EchoReply():   # the controller's: the fabric's packets, a rival's claim
                pass
        return self.link.drain()

    # --- the bridge behind the switch ----------------------------------------------------------------
    def find_bridge(self, tries: int, view: SwitchView, now: float) -> None:
        """Read the switch's bridge from OVSDB; again shortly while its ports are not all numbered."""
        pinned = view.policy.switch(self.dp_id) if view.policy else None
        bridge = view.ovsdb.bridge(self.dp_id, pinned.ovsdb if pinned else None)
        complete = bridge is not None and bridge.ports and self.ports <= set(bridge.ports)
        if not complete and tries > 0:
            self.link.later(BRIDGE_RETRY_SECONDS, ev.BridgeDue(self.conn, tries - 1))
        if bridge is None:
            if tries == 0:
                LOG.error("datapath %016x is not an OVS bridge in %s; ignoring it", self.dp_id,
                          ", ".join(view.ovsdb.names))
            return
        if bridge == self.bridge:
            return
        first = self.bridge is None
        self.bridge = bridge
        self._set_state(view)
        if not first:
            self.reconcile(view)
            return
        LOG.info("switch %016x (%s, datapath %s, OVSDB %s) connected", self.dp_id, bridge.name,
                 bridge.datapath_type or "system", bridge.remote)
        self.role.ask()
        self.link.send(act.HearAsSlave(self.link.xid()))
        self.flows.start()
        self.poller.start(view, now)

    def _set_state(self, view: SwitchView) -> None:
        policy = view.policy
        switch_policy = policy.switch(self.dp_id) if policy and self.bridge else None
        if policy and policy.network and self.bridge and switch_policy is None:
            switch_policy = site_switch(policy, self.dp_id, self.bridge, view.fabric or NO_FABRIC)
        if policy and self.bridge and switch_policy is None:
            LOG.warning("switch %016x is not in policy %s; nothing of ours stays on it", self.dp_id, policy.name)
        previous, self.state = self.state, None
        if policy and switch_policy and self.bridge:
            self.state = SwitchState(policy, switch_policy, self.bridge.userspace, previous=previous,
                                     counting=self.flows.cannot_police is None, delays=self.bridge.delays)
        self.poller.forget_unwatched(self.state)
        for port in switch_policy.ports if switch_policy else ():
            if port.queues == "auto":   # counted from 0, so that Prometheus' increase() sees the first event
                for action in ("program", "rollback"):
                    self.telemetry.events.setdefault((port.port_no, action), 0)

    # --- what the switch says ------------------------------------------------------------------------
    def _error(self, reply: ev.ErrorReply) -> None:
        if self.role.refused(reply) or self.flows.error(reply):
            return
        self.telemetry.count(self.telemetry.openflow_errors, reply.what)
        LOG.error("switch %016x refused message xid %d: %s", self.dp_id, reply.xid, reply.what)
        if reply.what == IS_SLAVE:
            self.role.demoted()

    def _poll_due(self, due: ev.PollDue, view: SwitchView, now: float) -> None:
        if not self.poller.due(due, view, now, self.flows.flows,
                               bool(self.flows.meters or self.state and self.state.meters), self.flows.monitored):
            return
        retry = self.jobs.poll(now) or self.flows.failed
        self.flows.failed = False
        moved = self.ovsdb_generation != view.ovsdb.generation
        if moved and self.bridge is not None:   # a capacity or delay declared since: the bridge read again
            bridge = view.ovsdb.bridge(self.dp_id, self.bridge.remote)
            if bridge is not None and bridge != self.bridge:
                self.bridge = bridge
                self._set_state(view)
            # Another switch's bridge or queues: nothing to plan here. Planned again, every switch of a site cost a
            # bridge joining it time that grew with the site (docs/benchmarks.md).
            elif (self.bridge, self._held(view, self.bridge)) == self.ovsdb_held:
                self.ovsdb_generation, moved = view.ovsdb.generation, False
        # Else nothing can differ; and while the worker changes its ports, their end reconciles the switch.
        if (retry or moved) and not self.jobs.busy:
            self.reconcile(view)

    def _decide(self, round_: PollRound | None, view: SwitchView, now: float) -> None:
        decisions = self.poller.answered(round_, self.state, view, now)
        for decided in decisions:
            decision = decided.decision
            LOG.info("switch %016x port %d: %s — %s", self.dp_id, decided.port_no, decision.action, decision.reason)
            self.telemetry.count(self.telemetry.events, (decided.port_no, decision.action))
            self.link.do(decided)
        if decisions:
            self.reconcile(view)

    def _meter_telemetry(self, reply: ev.MeterStatsReply) -> None:
        state = self.state
        classes = {meter_id(c.queue): c.name for c in state.policy.classes} if state else {}
        for meter in reply.counters:
            counted = state.counted_class(meter) if state else None
            if counted is not None:
                classes[meter] = counted[1]
        self.telemetry.meters = {(m, classes.get(m, "")): c for m, c in reply.counters.items()}

    # --- reconciliation ------------------------------------------------------------------------------
    def reconcile(self, view: SwitchView) -> None:
        """Plan what differs between the policy and what the switch and OVSDB hold, and start it: the
        flow plan as a batch, the port plan as jobs."""
        flows, meters, bridge = self.flows.flows, self.flows.meters, self.bridge
        if not self.role.writable(view) or view.mode is Mode.UNSET or bridge is None:
            return
        if flows is None or meters is None:   # being read: planned once they are in, and no change answered before
            self.settled = False
            return
        self.ovsdb_generation = view.ovsdb.generation
        held = self._held(view, bridge)
        self.ovsdb_held = bridge, held
        actual = {port_no: qos for port_no, qos in held.items()
                  if qos is not None or (self.state and self.state.switch.port(port_no))}
        self.jobs.read(bridge, actual)
        reserve = {p for p, q in actual.items() if isinstance(q, OvsdbQos) and q.mode == "reserve"}
        steered = steered_ports(flows) & reserve
        if self.state and not self.state.adopted:
            self.state.adopt(steered)
        todo = plan(self.state, flows, actual, meters)
        self.flows.sync(todo.flows, todo.meters)
        tags = (("dp_id", f"{self.dp_id:016x}"), ("policy", view.policy.name)) if view.policy else ()
        self.jobs.start(bridge, todo.qos, todo.specs, actual, tags, view.epoch)
        # A check (a job that changes no QoS) is no change: netlink announces every qdisc and filter OVS or
        # we put on a device, and the check that follows must not make a switch that holds its policy look
        # out of sync meanwhile.
        in_sync = not (todo.flows or todo.meters or todo.qos or self.flows.batches or self.jobs.changing()
                       or self.errors())
        if in_sync and not self.in_sync:   # said once per arrival: bench/scale.py --join times a switch by it
            LOG.info("switch %016x in sync", self.dp_id)
        self.in_sync = in_sync
        self.settled = not (self.flows.pending(todo.flows, todo.meters) or self.jobs.busy
                            or todo.qos.keys() - self.jobs.failed)
        for port_no, qos in actual.items():
            self.telemetry.programmed[port_no] = port_no in steered
            if isinstance(qos, OvsdbQos):
                self.telemetry.capacity_bps[port_no] = qos.max_bps

    @staticmethod
    def _held(view: SwitchView, bridge: BridgeInfo) -> dict[int, Any]:
        """What OVSDB holds on each port of the bridge (view.ovsdb.port_qos)."""
        return {port_no: view.ovsdb.port_qos(bridge.remote, iface) for port_no, iface in bridge.ports.items()}

    def errors(self) -> dict[str, str]:
        """What is not in sync, and why."""
        return {key: why for part in self.parts for key, why in part.errors().items()}

    # --- what a client sees --------------------------------------------------------------------------
    def status(self, view: SwitchView) -> dict[str, Any]:
        assert self.bridge is not None
        ports = {}
        steered = steered_ports(self.flows.flows or {})
        state = self.state
        for port in state.switch.ports if state else ():
            assert state is not None
            iface = self.bridge.ports.get(port.port_no)
            actual = view.ovsdb.port_qos(self.bridge.remote, iface) if iface else None
            ports[str(port.port_no)] = {"iface": iface, "mode": port.queues,
                                        "queues": actual.mode if isinstance(actual, OvsdbQos) else actual,
                                        "steered": port.port_no in steered, "congested": state.congested(port.port_no)}
        return {"bridge": self.bridge.name, "ovsdb": self.bridge.remote, "datapath_type": self.bridge.datapath_type,
                "role": str(self.role.role), "flows": len(self.flows.flows or {}), "in_sync": self.in_sync,
                "not_in_sync": self.errors(), "ports": ports}
