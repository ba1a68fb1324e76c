"""One switch connection kept as the policy says: the core's state machine per switch (pure).

It reads what the switch holds before it changes anything (its flows and meters, from statistics),
plans the difference against the policy (controller/core/plan.py) and what OVSDB holds, and asks for
it: a flow batch ended by a barrier, OVSDB/tc jobs for the ports. What the switch holds is taken from
the barrier that confirms a batch, or read again after an error, never from a memory of what was sent.
Every poll compares again, so a flow deleted or a QoS cleared by hand is repaired within a poll or two.

It writes only while its controller is active and the switch has confirmed it as OpenFlow master on
this very connection: a controller deposed while it hung, or whose role request the switch refused,
sends nothing that changes the switch (the switch would refuse it anyway once another is master; a
fresh connection starts as an "equal", which may write, and so must not).

Time is the injected `now`; everything it wants done goes to the controller's outbox as actions.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from controller.core import actions as act
from controller.core import events as ev
from controller.core.bridges import BridgeInfo
from controller.core.flows import CLASSIFIED
from controller.core.jobs import Job, JobResult
from controller.core.meters import MeterChanges, meter_id
from controller.core.plan import ABSENT, ActualFlow, FlowChanges, plan, steered_ports
from controller.core.poll import PollRound
from controller.core.queues import OvsdbQos, QosSpec
from controller.core.stats import PortCounters
from controller.core.switch_state import SwitchState

if TYPE_CHECKING:
    from controller.core.controller import Controller

LOG = logging.getLogger("qos")
WHOLE_TABLE_POLLS = 10        # the whole flow table is read every this many polls
TC_SWEEP_SECONDS = 300.0      # netlink announces tc changes; a slow sweep catches any it dropped
BRIDGE_RETRIES, BRIDGE_RETRY_SECONDS = 50, 0.2
UNKNOWN_METERS = "the switch has not said yet which meters it has"
IS_SLAVE = "OFPET_BAD_REQUEST/OFPBRC_IS_SLAVE"
# What a role reply answers: the question (nochange) or a claim.
ASKED, CLAIMED = "asked", "claimed"


@dataclass
class Batch:
    """A flow batch (with the meters its flows use) sent and not yet confirmed by its barrier."""
    changes: FlowChanges
    meters: MeterChanges
    xids: frozenset[int]
    errors: list[str] = field(default_factory=list)
    meters_unknown: bool = False      # a meter added was there already: read what it is


class Switch:
    def __init__(self, ctl: Controller, conn: int, dp_id: int, ports: frozenset[int]):
        self.ctl, self.conn, self.dp_id, self.ports = ctl, conn, dp_id, ports
        self.bridge: BridgeInfo | None = None
        self.state: SwitchState | None = None             # desired; None: the policy has nothing for it
        self.flows: dict[int, ActualFlow] | None = None   # what the switch holds; None until it has said
        self.meters: dict[int, Any] | None = None         # our meters on it → band; ditto
        self.cannot_police: str | None = UNKNOWN_METERS   # why its meters cannot police; None: they can
        self.role = "unknown"                             # master, slave, equal or refused, as the switch said
        self.learned = False                              # the switch has said its bridge's generation id
        self.generation_seen: int | None = None           # that id (None: it never had one)
        self.epoch = 0                                    # flow batches sent: a reply to an older request is stale
        self.requests: dict[int, tuple[int, str]] = {}    # xid → (epoch when sent, what was asked)
        self.roles: dict[int, str] = {}                   # xid of a role request → ASKED or CLAIMED
        self.table_polls = 0                              # polls since the whole flow table was read
        self.batches: dict[int, Batch] = {}               # barrier xid → batch
        self.busy: dict[int, bool] = {}                   # ports with a worker job in flight → it changes QoS
        self.applied: dict[int, OvsdbQos | None] = {}     # what we last put in OVSDB
        self.tc_check: set[int] = set()                   # ports whose tc may have changed
        self.failed: set[int] = set()                     # ports whose last job failed: tried again next poll
        self.flows_failed = False                         # the switch refused a batch: tried again next poll
        self.missing: set[int] = set()                    # ports whose HTB classes a check found gone
        self.rebuild: set[int] = set()                    # ports whose QoS must be taken off and put back
        self.ifindex: dict[int, int] = {}
        self.errors: dict[str, str] = {}                  # what is not in sync, and why
        self.in_sync = False
        self.settled = False                              # nothing in flight: in sync, or failed until the next poll
        self.poll: PollRound | None = None
        self.next_due: float | None = None                # the poll timer in force (an older one is ignored)
        self.fast: PollRound | None = None                # a fast poll of the watched ports, under way
        self.next_fast: float | None = None               # its timer in force
        self.watched: frozenset[int] = frozenset()        # `auto` ports near their capacity: fast polled
        self.sending: set[int] | None = None              # ports whose tx counters moved at the last poll
        self.swept = 0.0
        self.ovsdb_generation: tuple[int, ...] = ()       # what OVSDB held at the last reconcile
        self._xid = 0

    # --- sending -----------------------------------------------------------------------------------
    def xid(self) -> int:
        self._xid = self._xid % 0x7FFF_FFFF + 1
        return self._xid

    def send(self, *messages: act.Message) -> None:
        self.ctl.out.append(act.Send(self.conn, messages))

    def ask(self, kind: str, port: int | None = None) -> int:
        """A statistics request, remembered with the epoch it was sent in."""
        xid = self.xid()
        self.requests[xid] = (self.epoch, kind)
        self.send(act.StatsRequest(xid, kind, port))
        return xid

    @property
    def writable(self) -> bool:
        return self.ctl.active and self.role == "master"

    # --- the bridge behind the switch ----------------------------------------------------------------
    def find_bridge(self, tries: int) -> None:
        """Read the switch's bridge from OVSDB; again shortly while its ports are not all numbered."""
        pinned = self.ctl.policy.switch(self.dp_id) if self.ctl.policy else None
        bridge = self.ctl.ovsdb.bridge(self.dp_id, pinned.ovsdb if pinned else None)
        complete = bridge is not None and bridge.ports and self.ports <= set(bridge.ports)
        if not complete and tries > 0:
            self.ctl.out.append(act.Later(BRIDGE_RETRY_SECONDS, ev.BridgeDue(self.conn, tries - 1)))
        if bridge is None:
            if tries == 0:
                LOG.error("datapath %016x is not an OVS bridge in %s; ignoring it", self.dp_id,
                          ", ".join(self.ctl.ovsdb.names))
            return
        if bridge == self.bridge:
            return
        first = self.bridge is None
        self.bridge = bridge
        self.set_state()
        if not first:
            self.reconcile()
            return
        LOG.info("switch %016x (%s, datapath %s, OVSDB %s) connected", self.dp_id, bridge.name,
                 bridge.datapath_type or "system", bridge.remote)
        self.ask_role()
        # What it can do and what it holds, before anything is changed.
        for kind in (act.METER_FEATURES, act.METER_CONFIG, act.FLOWS):
            self.ask(kind)
        self.start_polling()

    def set_state(self) -> None:
        policy = self.ctl.policy
        switch_policy = policy.switch(self.dp_id) if policy and self.bridge else None
        if policy and self.bridge and switch_policy is None:
            LOG.warning("switch %016x is not in policy %s; nothing of ours stays on it", self.dp_id, policy.name)
        previous, self.state = self.state, None
        if policy and switch_policy and self.bridge:
            self.state = SwitchState(policy, switch_policy, self.bridge.userspace, previous=previous,
                                     counting=self.cannot_police is None)
        self.watched = self.watched & self.state.auto if self.state else frozenset()
        for port in switch_policy.ports if switch_policy else ():
            if port.queues == "auto":   # counted from 0, so that Prometheus' increase() sees the first event
                for action in ("program", "rollback"):
                    self.ctl.snapshot.events.setdefault((self.dp_id, port.port_no, action), 0)

    # --- OpenFlow role -----------------------------------------------------------------------------
    def ask_role(self) -> None:
        """Ask the switch its bridge's generation id (a role request that changes nothing); the answer
        decides the claim (role_reply)."""
        xid = self.xid()
        self.roles[xid] = ASKED
        self.send(act.RoleRequest(xid, "nochange"))

    def claim_role(self) -> None:
        """Master with the controller's generation id when active, else slave; only once the switch has
        said its generation id (a claim older than it is refused)."""
        if self.bridge is None or not self.learned:
            return
        generation = self.ctl.generation_for(self)
        if generation is None:        # the controller could not claim an id newer than the switch's
            return
        xid = self.xid()
        self.roles[xid] = CLAIMED
        self.send(act.RoleRequest(xid, "master" if self.ctl.active else "slave", generation))

    def role_reply(self, reply: ev.RoleReply) -> None:
        what = self.roles.pop(reply.xid, None)
        if what is None:
            return
        self.generation_seen = reply.generation
        if what == ASKED:
            self.learned = True
            self.claim_role()
            return
        self.role = reply.role
        if self.writable:
            self.reconcile()

    # --- replies -------------------------------------------------------------------------------------
    def error(self, reply: ev.ErrorReply) -> None:
        if reply.xid in self.roles:   # a claim refused (stale): not ours to write; learn the id and try again
            self.roles.pop(reply.xid)
            self.role = "refused"
            LOG.warning("switch %016x refused our role request: %s", self.dp_id, reply.what)
            self.ask_role()
            return
        batch = next((b for b in self.batches.values() if reply.xid in b.xids), None)
        if batch is not None and reply.what == "OFPET_METER_MOD_FAILED/OFPMMFC_METER_EXISTS":
            # Ours, from before: a restart, or a change another controller of ours made. Adopted as it is,
            # and put right if it differs once it has been read.
            batch.meters_unknown = True
            LOG.info("switch %016x: a meter we added was there already (xid %d); adopting it", self.dp_id,
                     reply.xid)
            return
        key = (self.dp_id, reply.what)
        self.ctl.snapshot.openflow_errors[key] = self.ctl.snapshot.openflow_errors.get(key, 0) + 1
        if batch is not None:
            batch.errors.append(f"{reply.what} (xid {reply.xid})")
        LOG.error("switch %016x refused message xid %d: %s", self.dp_id, reply.xid, reply.what)
        if reply.what == IS_SLAVE and self.role == "master":
            # Another controller became master: ours no more. Learn its generation id; claim again only
            # if this controller is still the active one (generation_for asks OVSDB, which knows).
            self.role = "slave"
            self.ask_role()

    def barrier(self, reply: ev.BarrierReply) -> None:
        batch = self.batches.pop(reply.xid, None)
        if batch is None:
            return
        if batch.errors:
            self.errors["flows"] = "; ".join(batch.errors)
            self.flows_failed = True
            self.flows = self.meters = None   # not what we think: ask the switch
            self.ask(act.METER_CONFIG)
            self.ask(act.FLOWS)
        else:
            self.errors.pop("flows", None)
            self.flows = batch.changes.applied_to(self.flows or {})
            self.meters = batch.meters.applied_to(self.meters or {})
            if batch.meters_unknown:
                self.meters = None
                self.ask(act.METER_CONFIG)
        self.reconcile()

    def _current(self, xid: int) -> tuple[str | None, bool]:
        """What a reply answers, and whether what it says is what the switch holds now: asked after our
        last batch, with none in flight."""
        epoch, what = self.requests.pop(xid, (None, None))
        return what, epoch == self.epoch and not self.batches

    def _round(self, xid: int) -> PollRound | None:
        """The poll (slow or fast) that awaits this reply, if any; it awaits it no more."""
        for round_ in (self.poll, self.fast):
            if round_ is not None and round_.answered(xid):
                return round_
        return None

    def flow_stats(self, reply: ev.FlowStatsReply, now: float) -> None:
        what, current = self._current(reply.xid)
        round_ = self._round(reply.xid)
        if round_ is not None:
            round_.flows, round_.at["flows"] = reply.counters, now
            self._answered(round_, now)
        if not current or self.flows is None and what != act.FLOWS:
            return
        actual = reply.flows
        if what == act.CLASSIFIED_FLOWS:
            if actual != {c: f for c, f in (self.flows or {}).items() if c & CLASSIFIED}:
                self.ask(act.FLOWS)   # something changed: read the whole table
            return
        if actual == self.flows:
            return
        if self.flows is not None:
            self.ctl.drift(self, "flows", _difference(actual, self.flows, "flows"))
        self.flows = actual
        self.reconcile()

    def flow_count(self, reply: ev.FlowCountReply) -> None:
        _, current = self._current(reply.xid)
        if current and self.flows is not None and reply.count != len(self.flows):
            self.ask(act.FLOWS)   # flows added or removed: read the whole table

    def meter_features(self, reply: ev.MeterFeaturesReply) -> None:
        self.requests.pop(reply.xid, None)
        self.cannot_police = reply.cannot_police
        if self.state is not None:
            self.state.counting = reply.cannot_police is None

    def meter_config(self, reply: ev.MeterConfigReply) -> None:
        _, current = self._current(reply.xid)
        if not current or reply.meters == self.meters:
            return
        if self.meters is not None:
            self.ctl.drift(self, "meters", _difference(reply.meters, self.meters, "meters"))
        self.meters = reply.meters
        self.reconcile()

    def meter_stats(self, reply: ev.MeterStatsReply, now: float) -> None:
        _, current = self._current(reply.xid)
        round_ = self._round(reply.xid)
        if round_ is not None:
            round_.meters, round_.at["meters"] = reply.counters, now
            self._answered(round_, now)
        classes = {meter_id(c.queue): c.name for c in self.state.policy.classes} if self.state else {}
        for meter in reply.counters:
            counted = self.state.counted_class(meter) if self.state else None
            if counted is not None:
                classes[meter] = counted[1]
        self.ctl.snapshot.meters[self.dp_id] = {(m, classes.get(m, "")): c for m, c in reply.counters.items()}
        if current and self.meters is not None and reply.counters.keys() != self.meters.keys():
            # Meters added or removed (and with a meter, its flows): nothing is planned until they are read.
            self.ctl.drift(self, "meters", f"{len(reply.counters.keys() ^ self.meters.keys())} meters added or "
                                           "removed")
            self.meters = None
            self.ask(act.METER_CONFIG)

    def queue_stats(self, reply: ev.QueueStatsReply, now: float) -> None:
        round_ = self._round(reply.xid)
        if round_ is not None and round_.fast:   # one port's: the others' counters stay as they were
            self.ctl.snapshot.queues.setdefault(self.dp_id, {}).update(reply.queues)
        else:                                    # every port's: only the queues in the reply exist now
            self.ctl.snapshot.queues[self.dp_id] = reply.queues
        if round_ is not None:
            round_.queues = {**(round_.queues or {}), **reply.queues}
            round_.at["queues"] = now
            self._answered(round_, now)

    def port_stats(self, reply: ev.PortStatsReply, now: float) -> None:
        round_ = self._round(reply.xid)
        ports = self.ctl.snapshot.ports
        if round_ is not None and not round_.fast:
            self.sending = {port_no for port_no, counters in reply.ports.items()
                            if _sent(ports.get((self.dp_id, port_no)), counters)}
        for port_no, counters in reply.ports.items():
            ports[(self.dp_id, port_no)] = counters
        if round_ is not None:
            round_.ports = {**(round_.ports or {}), **reply.ports}
            round_.at["ports"] = now
            self._answered(round_, now)

    # --- polls ---------------------------------------------------------------------------------------
    def start_polling(self) -> None:
        """Poll every interval, from a random offset so that many switches' polls spread over it (as
        Faucet's Gauge does)."""
        if not self.ctl.active or self.bridge is None:
            return
        self.next_due = self.ctl.now + self.ctl.rng.uniform(0, self.ctl.interval)
        self.ctl.out.append(act.Later(self.next_due - self.ctl.now, ev.PollDue(self.conn, self.next_due)))

    def poll_due(self, due: ev.PollDue) -> None:
        if due.fast:
            self._fast_poll_due(due)
            return
        if due.due != self.next_due:
            return      # a timer of polling stopped or restarted since
        if not self.ctl.active or self.bridge is None:
            self.next_due = None
            return
        now, interval = self.ctl.now, self.ctl.interval
        self.next_due = max(due.due + interval, now)
        self.ctl.out.append(act.Later(self.next_due - now, ev.PollDue(self.conn, self.next_due)))
        lag = now - due.due
        self.ctl.snapshot.poll_lag[self.dp_id] = lag
        if self.poll is not None or lag > interval:
            self.ctl.late(self, lag, now - self.poll.sent if self.poll else 0.0)
        retry = bool(self.failed or self.flows_failed)
        self.failed.clear()   # what failed is tried again, once a poll
        self.flows_failed = False
        # The whole flow table now and then (and at once when the count or the classified flows differ
        # from what we hold): a flow changed in place is found within WHOLE_TABLE_POLLS polls.
        self.table_polls = (self.table_polls + 1) % WHOLE_TABLE_POLLS
        whole = self.table_polls == 0
        waiting = set()
        if whole:
            waiting.add(self.ask(act.FLOWS))
        else:
            # A switch without classified flows has no class rates to read; one added is counted.
            if self.flows is None or any(cookie & CLASSIFIED for cookie in self.flows):
                waiting.add(self.ask(act.CLASSIFIED_FLOWS))
            self.ask(act.FLOW_COUNT)
        if self.meters or (self.state and self.state.meters):
            waiting.add(self.ask(act.METER_STATS))
            if whole:
                self.ask(act.METER_CONFIG)
        # A port that sent nothing since the last poll has queue counters that did not move either: a
        # switch of idle ports has its queues read with the whole table only (its ports are still read).
        if whole or self.sending is None or self.sending:
            waiting.add(self.ask(act.QUEUES))
        waiting.add(self.ask(act.PORTS))
        self.poll = PollRound(due.due, now, waiting)
        if now - self.swept > TC_SWEEP_SECONDS:
            self.swept = now
            self.tc_check |= set(self.ifindex)
        # Else nothing can differ; and while the worker changes its ports, their end reconciles the switch.
        if (retry or self.tc_check or self.ovsdb_generation != self.ctl.ovsdb.generation) and not self.busy:
            self.reconcile()

    def _fast_poll_due(self, due: ev.PollDue) -> None:
        """The ports near their capacity only: their port and queue counters, and the meters'."""
        if due.due != self.next_fast:
            return
        if not self.ctl.active or not self.watched or self.fast is not None:
            self.next_fast = None   # stopped; or the last one is still unanswered: the next answer resumes
            return
        now = self.ctl.now
        waiting = {self.ask(kind, port) for port in sorted(self.watched) for kind in (act.QUEUES, act.PORTS)}
        if self.state and self.state.counting and self.state.meters:
            waiting.add(self.ask(act.METER_STATS))
        self.fast = PollRound(due.due, now, waiting, fast=True)
        self.next_fast = None

    def _answered(self, round_: PollRound, now: float) -> None:
        """Once every reply of a poll is in: rates, then the detector, port by port."""
        if not round_.complete:
            return
        if round_.fast:
            self.fast = None
        else:
            self.poll = None
            self.ctl.snapshot.poll_duration[self.dp_id] = now - round_.sent
            self.ctl.snapshot.polls[self.dp_id] = self.ctl.snapshot.polls.get(self.dp_id, 0) + 1
        class_bps = self._class_rates(round_)
        drops: dict[int, float] = {}
        rates = self.ctl.rates
        for (port_no, queue_id), queue_counters in (round_.queues or {}).items():
            queue = rates.queue(self.dp_id, port_no, queue_id, queue_counters, round_.at["queues"])
            if queue is not None and queue.tx_errors_ps is not None:
                drops[port_no] = drops.get(port_no, 0.0) + queue.tx_errors_ps
        fast = self.ctl.policy.fast_poll_interval if self.ctl.policy else 0.0
        decided = False
        for port_no, port_counters in (round_.ports or {}).items():
            port = rates.port(self.dp_id, port_no, port_counters, round_.at["ports"])
            if port is None or self.state is None:
                continue
            if not port.tx_pps and not port.tx_drops_ps and not drops.get(port_no) and self.state.resting(port_no):
                self.watched -= {port_no}
                self.ctl.snapshot.congested[(self.dp_id, port_no)] = False
                continue    # it sent nothing, dropped nothing and is at rest: most ports, most polls
            self._watch(port_no, port.tx_bps)
            # A port fast polls watch is decided by them alone: a slow poll's sample would be a second long.
            if not round_.fast and fast and port_no in self.watched:
                continue
            decision = self.state.observe(port_no, port, drops.get(port_no, 0.0), class_bps.get(port_no, {}),
                                          round_.at["ports"])
            self.ctl.snapshot.congested[(self.dp_id, port_no)] = self.state.congested(port_no)
            if decision is not None:
                self.ctl.decided(self, port_no, decision)
                decided = True
        if fast and self.watched and self.next_fast is None and self.fast is None:
            self.next_fast = max(round_.due + fast, now) if round_.fast else now + fast
            self.ctl.out.append(act.Later(self.next_fast - now, ev.PollDue(self.conn, self.next_fast, fast=True)))
        if decided:
            self.reconcile()

    def _watch(self, port_no: int, tx_bps: float | None) -> None:
        """An `auto` port at half its capacity or more is fast polled (a flood onset there is answered in
        a fraction of a second); one below it is left to the slow poll, at no cost."""
        if self.state is None or port_no not in self.state.auto or tx_bps is None:
            return
        port = self.state.switch.port(port_no)
        assert port is not None
        busy = tx_bps >= self.state.policy.congestion.clear_utilisation * port.capacity_bps
        self.watched = self.watched | {port_no} if busy else self.watched - {port_no}

    def _class_rates(self, round_: PollRound) -> dict[int, dict[str, float]]:
        """Output port → class → bit/s offered, from the classified flows' counters, and from the counting
        meters' where there are some (the flows' may be half a second old)."""
        rates = self.ctl.rates
        class_bps: dict[int, dict[str, float]] = {}
        counted: dict[int, dict[str, float]] = {}
        for cookie, counters in (round_.flows or {}).items():
            owner = self.state.rule_class(cookie) if self.state else None
            flow = rates.flow(self.dp_id, cookie, counters, round_.at["flows"])
            if owner is not None and flow is not None and flow.bps is not None:
                classes = class_bps.setdefault(owner[0], {})
                classes[owner[1]] = classes.get(owner[1], 0.0) + flow.bps
        for meter, meter_counters in (round_.meters or {}).items():
            owner = self.state.counted_class(meter) if self.state else None
            measured = rates.meter(self.dp_id, meter, meter_counters, round_.at["meters"])
            if owner is not None and measured is not None and measured.bps is not None:
                classes = counted.setdefault(owner[0], {})
                classes[owner[1]] = classes.get(owner[1], 0.0) + measured.bps
        return class_bps | counted

    # --- tc and the worker ---------------------------------------------------------------------------------
    def tc_changed(self, ports: set[int]) -> None:
        # A busy port is checked once its job is done: the job may have looked before the change.
        self.tc_check |= ports
        if ports - self.busy.keys():
            self.reconcile()

    def jobs_done(self, results: list[JobResult]) -> None:
        for result in results:
            job = result.job
            self.busy.pop(job.port_no, None)
            key = f"port {job.port_no} ({job.iface})"
            if result.error:
                if self.errors.get(key) != result.error:   # said once; retried on every poll
                    LOG.error("switch %016x %s: %s", job.dp_id, key, result.error)
                self.errors[key] = result.error
                self.failed.add(job.port_no)
                self.tc_check.add(job.port_no)
            else:
                self.errors.pop(key, None)
                if job.qos:
                    self.applied[job.port_no] = job.spec.ovsdb if job.spec else None
                    LOG.info("switch %016x %s: %s", job.dp_id, key, _queues(job.spec))
                elif result.tc:
                    self.ctl.drift(self, "tc", f"{key}: {'; '.join(result.tc)}")
                self._missing(job, result)
            if result.ifindex:
                self.ifindex[job.port_no] = result.ifindex
                self.ctl.ports_by_ifindex[result.ifindex] = (self.dp_id, job.port_no)
        self.reconcile()

    def _missing(self, job: Job, result: JobResult) -> None:
        if not result.missing:
            self.missing.discard(job.port_no)
        elif not job.qos:
            # Gone for a moment while OVS rebuilds them, or for good (a `tc qdisc del` by hand): look again
            # next poll, and rebuild the QoS if they are still gone then.
            if job.port_no in self.missing:
                self.ctl.drift(self, "tc", f"port {job.port_no} ({job.iface}): the HTB qdisc is gone from the "
                                           "device; rebuilding the QoS")
                self.missing.discard(job.port_no)
                self.rebuild.add(job.port_no)
            else:
                self.missing.add(job.port_no)
                self.failed.add(job.port_no)
                self.tc_check.add(job.port_no)

    # --- reconciliation ------------------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Plan what differs between the policy and what the switch and OVSDB hold, and start it."""
        ctl = self.ctl
        if not self.writable or ctl.mode == "unset" or self.bridge is None or self.flows is None \
                or self.meters is None:
            return
        bridge = self.bridge
        self.ovsdb_generation = ctl.ovsdb.generation
        qos = {}
        for port_no, iface in bridge.ports.items():
            actual = ctl.ovsdb.port_qos(bridge.remote, iface)
            if actual is not None or (self.state and self.state.switch.port(port_no)):
                qos[port_no] = actual
                if port_no in self.applied and actual not in (self.applied[port_no], ABSENT) \
                        and port_no not in self.busy:
                    ctl.drift(self, "qos", f"port {port_no} ({iface}): OVSDB holds {_mode(actual)}, not what we put")
                    del self.applied[port_no]
        reserve = {p for p, q in qos.items() if isinstance(q, OvsdbQos) and q.mode == "reserve"}
        steered = steered_ports(self.flows) & reserve
        if self.state and not self.state.adopted:
            self.state.adopt(steered)
        todo = plan(self.state, self.flows, qos, self.meters)
        cannot = self.cannot_police if todo.meters.add or todo.meters.modify else None
        if cannot:   # said once; a set_policy with it is refused, this is a switch come later
            self.errors["meters"] = f"{cannot}: its flows that police are left out; remove police from their " \
                                    "classes or run the bridge on a datapath with meters"
        elif (todo.flows or todo.meters) and not self.batches and not self.flows_failed:
            self.errors.pop("meters", None)
            self._send_batch(todo.flows, todo.meters)
        waiting = self.busy.keys() | self.failed
        jobs = [self._job(port_no, spec, True) for port_no, spec in todo.qos.items() if port_no not in waiting]
        for port_no in (self.tc_check | self.rebuild) - waiting - todo.qos.keys():
            spec = todo.specs.get(port_no)
            if spec is not None and isinstance(qos.get(port_no), OvsdbQos):
                jobs.append(self._job(port_no, spec, port_no in self.rebuild, rebuild=port_no in self.rebuild))
        # A port's check is done by the job that starts now; one still busy keeps its mark for later.
        started = {job.port_no for job in jobs}
        self.tc_check -= started
        self.rebuild -= started
        if jobs:
            self.busy.update((job.port_no, job.qos) for job in jobs)
            ctl.out.append(act.Submit(bridge.remote, tuple(jobs)))
        # A check (a job that changes no QoS) is no change: netlink announces every qdisc and filter OVS or
        # we put on a device, and the check that follows must not make a switch that holds its policy look
        # out of sync meanwhile.
        self.in_sync = not (todo.flows or todo.meters or todo.qos or self.batches or any(self.busy.values())
                            or self.errors)
        self.settled = not (self.batches or self.busy or ((todo.flows or todo.meters) and not self.flows_failed
                                                          and not cannot) or todo.qos.keys() - self.failed)
        ctl.snapshot.in_sync[self.dp_id] = self.in_sync
        for port_no, actual in qos.items():
            key = (self.dp_id, port_no)
            ctl.snapshot.programmed[key] = port_no in steered
            if isinstance(actual, OvsdbQos):
                ctl.snapshot.capacity_bps[key] = actual.max_bps

    def _job(self, port_no: int, spec: QosSpec | None, qos: bool, rebuild: bool = False) -> Job:
        assert self.bridge is not None
        policy = self.ctl.policy
        tags = (("dp_id", f"{self.dp_id:016x}"), ("policy", policy.name)) if policy else ()
        return Job(self.dp_id, self.conn, port_no, self.bridge.ports[port_no], self.bridge.userspace, spec, qos,
                   rebuild, tags)

    def _send_batch(self, changes: FlowChanges, meters: MeterChanges) -> None:
        """Meters the flows will use, the flow changes, the meters no flow uses any more, then a barrier."""
        messages: list[act.Message] = [
            *(act.MeterMod(self.xid(), "add", m, band) for m, band in meters.add),
            *(act.MeterMod(self.xid(), "modify", m, band) for m, band in meters.modify),
            *(act.DeleteFlow(self.xid(), cookie) for cookie in changes.delete),
            *(act.ModifyFlow(self.xid(), entry) for entry in changes.modify),
            *(act.AddFlow(self.xid(), entry) for entry in changes.add),
            *(act.MeterMod(self.xid(), "delete", m) for m in meters.delete)]
        barrier = self.xid()
        self.send(*messages, act.Barrier(barrier))
        self.batches[barrier] = Batch(changes, meters, frozenset(m.xid for m in messages))
        self.epoch += 1
        LOG.info("switch %016x: flows -%d ~%d +%d%s", self.dp_id, len(changes.delete), len(changes.modify),
                 len(changes.add), f", meters -{len(meters.delete)} ~{len(meters.modify)} +{len(meters.add)}"
                 if meters else "")

    # --- what a client sees --------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        assert self.bridge is not None
        ports = {}
        steered = steered_ports(self.flows or {})
        for port in self.state.switch.ports if self.state else ():
            assert self.state is not None
            iface = self.bridge.ports.get(port.port_no)
            actual = self.ctl.ovsdb.port_qos(self.bridge.remote, iface) if iface else None
            ports[str(port.port_no)] = {"iface": iface, "mode": port.queues,
                                        "queues": actual.mode if isinstance(actual, OvsdbQos) else actual,
                                        "steered": port.port_no in steered,
                                        "congested": self.state.congested(port.port_no)}
        return {"bridge": self.bridge.name, "ovsdb": self.bridge.remote, "datapath_type": self.bridge.datapath_type,
                "role": self.role, "flows": len(self.flows or {}), "in_sync": self.in_sync,
                "not_in_sync": dict(self.errors), "ports": ports}


def _difference(actual: dict[int, Any], known: dict[int, Any], what: str) -> str:
    """How what a switch holds differs from what we thought it held, for the drift log."""
    return (f"{len(actual.keys() ^ known.keys())} {what} added or removed, "
            f"{sum(actual[k] != known[k] for k in actual.keys() & known.keys())} changed")


def _mode(actual: Any) -> str:
    return f"{actual.mode} queues" if isinstance(actual, OvsdbQos) else actual or "no QoS"


def _queues(spec: QosSpec | None) -> str:
    if spec is None:
        return "queues removed"
    return f"{spec.mode} queues " + ", ".join(f"{q.queue_id}:{q.traffic_class} {q.min_bps}-{q.max_bps} bit/s"
                                              for q in spec.queues)


def _sent(before: PortCounters | None, after: PortCounters) -> bool:
    """Whether a port sent, or failed to send, anything between two readings (unknown: yes)."""
    return before is None or (before.tx_packets, before.tx_dropped, before.tx_errors) != \
        (after.tx_packets, after.tx_dropped, after.tx_errors)
