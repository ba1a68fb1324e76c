"""One switch's statistics polls, the rates they give and the congestion detector they feed (a part of
controller/core/switch.py).

Every interval, from the switch's own phase so that many switches' polls spread over it (as Faucet's
Gauge does), a poll asks for the classified flows' and counting meters' counters (the class rates), the
queues' (their drops) and the ports'; the whole flow table every WHOLE_TABLE_POLLS polls (every
MONITORED_TABLE_POLLS on a switch whose flow monitor says what others change). `auto` ports
near their capacity are fast polled besides. Once every reply of a poll is in (controller/core/poll.py),
the ports' rates go to the detector (controller/core/switch_state.py), whose decisions are returned.
"""
from __future__ import annotations

from controller.core import actions as act
from controller.core import events as ev
from controller.core.congestion import PROGRAM
from controller.core.flows import CLASSIFIED
from controller.core.part import LOG, Link, SwitchPart
from controller.core.plan import ActualFlow
from controller.core.poll import PollRound
from controller.core.stats import PortCounters, PortRates, RateTracker
from controller.core.switch_state import SwitchState
from controller.core.view import SwitchView

WHOLE_TABLE_POLLS = 10        # the whole flow table is read every this many polls
MONITORED_TABLE_POLLS = 60    # ... of a switch whose flow monitor says what others change (a meter's band, not)
SILENT_SECONDS, SILENT_POLLS = 10.0, 3   # a switch that answers no poll for this long (and as many polls) is dead
# A slow poll may be sent up to this share of the interval late, with others that fell due meanwhile: at 500
# switches a second, a wake-up of the event loop for each cost more than the poll (docs/benchmarks.md). A fast
# poll (a port near its capacity) is sent on time.
POLL_SLACK = 0.05
SAY_EVERY = 10.0   # seconds between the log lines that say which switches' polls ran late


class Poller(SwitchPart):
    def __init__(self, link: Link, phase: float):
        """`phase`: where in the interval this switch's polls fall, as a fraction of it."""
        super().__init__(link)
        self.phase = phase
        self.rates = RateTracker()
        self.round: PollRound | None = None
        self.next_due: float | None = None                # the poll timer in force (an older one is ignored)
        self.fast: PollRound | None = None                # a fast poll of the watched ports, under way
        self.next_fast: float | None = None               # its timer in force
        self.watched: frozenset[int] = frozenset()        # `auto` ports near their capacity: fast polled
        self.sending: set[int] | None = None              # ports whose tx counters moved at the last poll
        self.receiving: set[int] | None = None            # ... and rx counters
        self.table_polls = 0                              # slow polls sent (every so many reads the whole table)
        self.late_said = False
        self.late: tuple[float, float, float] | None = None   # its first late poll's interval, lag and duration
        self.heard = 0.0                                  # when the switch last said anything (switch.py)

    def start(self, view: SwitchView, now: float) -> None:
        self.heard = now
        if view.active:
            self._schedule(now + self.phase * view.interval, now, view.interval)

    def _schedule(self, at: float, now: float, interval: float) -> None:
        """The next slow poll, due `at`: its timer, with its slack."""
        self.next_due = at
        self.link.later(at - now, ev.PollDue(self.link.conn, at), POLL_SLACK * interval)

    def stand_down(self) -> None:
        self.next_due = self.next_fast = None

    def forget_unwatched(self, state: SwitchState | None) -> None:
        self.watched = self.watched & state.auto if state else frozenset()

    def due(self, due: ev.PollDue, view: SwitchView, now: float, flows: dict[int, ActualFlow] | None,
            meters: bool, monitored: bool) -> bool:
        """Ask for a poll's statistics; whether this was a slow poll's turn (the switch's other parts
        have theirs). `flows`: the switch's flows as known; `meters`: whether it has meters of ours;
        `monitored`: whether its flow monitor says each change other connections make to its flows."""
        if due.fast:
            self._fast_due(due, view, now, meters)
            return False
        if due.due != self.next_due:
            return False     # a timer of polling stopped or restarted since
        if not view.active:
            self.next_due = None
            return False
        interval = view.interval
        if now - self.heard > max(SILENT_SECONDS, SILENT_POLLS * interval) and not view.reachable:
            # Its polls are sent and nothing comes back, nor from its host's OVSDB: a path dead without a close
            # (a cut cable, a host gone). OpenFlow's echo would say so only after minutes; closing it lets the
            # switch connect again, or (in a cluster) another member take it. A switch whose OVSDB still answers
            # is its vswitchd busy (it reconfigures every port of the host for each OVSDB change, over 10 s at
            # 10,000 ports) or hung: closing it would only make every bridge of the host connect again.
            LOG.error("switch %016x has answered no poll for %.0f s; closing its connection", self.link.dp_id,
                      now - self.heard)
            self.heard = now
            self.link.do(act.Close(self.link.conn))
            return False
        lag = now - due.due
        # The polls a stall of the loop made it miss are skipped, not sent back to back, and the switch keeps its
        # phase: polls of many switches that were late together would otherwise fall together from then on.
        self._schedule(due.due + interval * (1 + max(lag, 0.0) // interval), now, interval)
        self.link.telemetry.poll_lag = lag
        if (self.round is not None or lag > interval) and not self.late_said:
            self.late_said = True
            self.late = (interval, lag, now - self.round.sent if self.round else 0.0)   # said by LatePolls
        # The whole flow table now and then (and at once when the classified flows differ from what we hold): a
        # flow changed in place is found within WHOLE_TABLE_POLLS polls, or said at once by the flow monitor, whose
        # switch's table is read only as a net for what it does not say (a meter's band changed by hand). A flow
        # deleted is said by the switch.
        self.table_polls += 1
        whole = self.table_polls % (MONITORED_TABLE_POLLS if monitored else WHOLE_TABLE_POLLS) == 0
        ask = self.link.ask
        waiting = set()
        # The class rates' counters (classified flows, meters) of a switch whose ports received nothing at the
        # last poll are asked for once this poll's port counters say they did: an idle switch's did not move,
        # and at 10,000 idle ports reading them was much of the controller's work.
        rates = []
        if whole:
            waiting.add(ask(act.FLOWS))
        elif flows is None or any(cookie & CLASSIFIED for cookie in flows):
            rates.append(act.CLASSIFIED_FLOWS)   # a switch without classified flows has no class rates to read
        if meters:
            rates.append(act.METER_STATS)
            if whole:
                ask(act.METER_CONFIG)
        idle = not whole and self.receiving == set()
        if not idle:
            waiting |= {ask(kind) for kind in rates}
        # Likewise a queue drops only what its port was given: the queues of a switch whose ports sent nothing at
        # the last poll are read once this poll's port counters say one did (and not at all while none does).
        quiet = self.sending == set()
        if not quiet:
            waiting.add(ask(act.QUEUES))
        waiting.add(ask(act.PORTS))
        self.round = PollRound(due.due, now, waiting, if_received=tuple(rates) if idle else (),
                               if_sent=(act.QUEUES,) if quiet else ())
        return True

    def _fast_due(self, due: ev.PollDue, view: SwitchView, now: float, meters: bool) -> None:
        """The ports near their capacity only: their port and queue counters, and the meters' (their classes'
        rates), or on a switch without meters their classified flows' (maybe half a second old, but the
        classes' rates all the same)."""
        if due.due != self.next_fast:
            return
        if not view.active or not self.watched or self.fast is not None:
            self.next_fast = None   # stopped; or the last one is still unanswered: the next answer resumes
            return
        kinds = (act.QUEUES, act.PORTS) if meters else (act.QUEUES, act.PORTS, act.CLASSIFIED_FLOWS)
        waiting = {self.link.ask(kind, port) for port in sorted(self.watched) for kind in kinds}
        if meters:
            waiting.add(self.link.ask(act.METER_STATS))
        self.fast = PollRound(due.due, now, waiting, fast=True)
        self.next_fast = None

    # --- replies: each fills its poll; the last one of a poll decides ----------------------------------
    def _round(self, xid: int) -> PollRound | None:
        """The poll (slow or fast) that awaits this reply, if any; it awaits it no more."""
        for round_ in (self.round, self.fast):
            if round_ is not None and round_.answered(xid):
                return round_
        return None

    def flows(self, reply: ev.FlowStatsReply, now: float) -> PollRound | None:
        round_ = self._round(reply.xid)
        if round_ is not None:
            round_.flows, round_.at["flows"] = reply.counters, now
        return round_

    def meters(self, reply: ev.MeterStatsReply, now: float) -> PollRound | None:
        round_ = self._round(reply.xid)
        if round_ is not None:
            round_.meters, round_.at["meters"] = reply.counters, now
        return round_

    def queues(self, reply: ev.QueueStatsReply, now: float) -> PollRound | None:
        round_ = self._round(reply.xid)
        queues = self.link.telemetry.queues
        if round_ is None or not round_.fast:   # every port's: only the queues in the reply exist now
            queues.clear()
        queues.update(reply.queues)             # a fast poll's: one port's; the others' stay as they were
        if round_ is not None:
            round_.queues = {**(round_.queues or {}), **reply.queues}
            round_.at["queues"] = now
        return round_

    def ports(self, reply: ev.PortStatsReply, now: float) -> PollRound | None:
        round_ = self._round(reply.xid)
        ports = self.link.telemetry.ports
        if round_ is not None and not round_.fast:
            moved = {port_no for port_no, counters in reply.ports.items() if ports.get(port_no) != counters}
            self.sending = {port_no for port_no in moved if _sent(ports.get(port_no), reply.ports[port_no])}
            self.receiving = {port_no for port_no in moved if _received(ports.get(port_no), reply.ports[port_no])}
            round_.moved = moved
            if self.receiving:
                round_.waiting |= {self.link.ask(kind) for kind in round_.if_received}
            if self.sending:
                round_.waiting |= {self.link.ask(kind) for kind in round_.if_sent}
        ports.update(reply.ports)
        if round_ is not None:
            round_.ports = {**(round_.ports or {}), **reply.ports}
            round_.at["ports"] = now
        return round_

    def answered(self, round_: PollRound | None, state: SwitchState | None, view: SwitchView,
                 now: float) -> list[act.Decided]:
        """Once every reply of a poll is in: rates, then the detector, port by port."""
        if round_ is None or not round_.complete:
            return []
        telemetry = self.link.telemetry
        if round_.fast:
            self.fast = None
        else:
            self.round = None
            telemetry.poll_duration = now - round_.sent
            telemetry.polls += 1
        flow_bps = self._flow_rates(round_)
        class_bps = self._class_rates(round_, flow_bps, state)
        # Adaptive paths (controller/core/placement.py): the links' loads and the routes' rates, to the fabric
        # first, and a program of a link's queues deferred to it, which may move traffic instead.
        links = view.fabric.links if view.fabric is not None and view.fabric.counted and state is not None \
            else frozenset()
        ports = self._port_rates(round_, state)
        if links:
            assert state is not None
            self.link.do(act.Loads(self.link.dp_id, {p: r.tx_bps for p, r in ports.items()
                                                     if p in links and r is not None and r.tx_bps is not None},
                                   {state.routes[c]: bps for c, bps in flow_bps.items() if c in state.routes},
                                   {p.port_no: p.capacity_bps for p in state.switch.ports if p.port_no in links}))
        drops: dict[int, float] = {}
        for (port_no, queue_id), queue_counters in (round_.queues or {}).items():
            queue = self.rates.queue(0, port_no, queue_id, queue_counters, round_.at["queues"])
            if queue is not None and queue.tx_errors_ps is not None:
                drops[port_no] = drops.get(port_no, 0.0) + queue.tx_errors_ps
        fast = view.fast_interval
        decisions = []
        for port_no, port in ports.items():
            if port is None or state is None:
                continue
            if not port.tx_pps and not port.tx_drops_ps and not drops.get(port_no) and state.resting(port_no):
                self.watched -= {port_no}
                telemetry.congested[port_no] = False
                continue    # it sent nothing, dropped nothing and is at rest: most ports, most polls
            self._watch(state, port_no, port.tx_bps)
            # A port fast polls watch is decided by them alone: a slow poll's sample would be a second long.
            if not round_.fast and fast and port_no in self.watched:
                continue
            deferred = port_no in links
            decision = state.observe(port_no, port, drops.get(port_no, 0.0), class_bps.get(port_no, {}),
                                     round_.at["ports"], defer=deferred)
            telemetry.congested[port_no] = state.congested(port_no)
            if decision is not None:
                decisions.append(act.Decided(self.link.dp_id, port_no, decision,
                                             deferred and decision.action == PROGRAM))
        if fast and self.watched and self.next_fast is None and self.fast is None:
            self.next_fast = max(round_.due + fast, now) if round_.fast else now + fast
            self.link.later(self.next_fast - now, ev.PollDue(self.link.conn, self.next_fast, fast=True))
        return decisions

    def _port_rates(self, round_: PollRound, state: SwitchState | None) -> dict[int, PortRates | None]:
        """Port → rates, of the ports the poll read. Of a slow poll, a port whose counters did not move and whose
        detector is at rest is left out (at 10,000 idle ports, their rates were much of the controller's work):
        its rates would all be 0, which would change nothing, and its next rate is over the time since this poll.
        (A fast polled port left out is one a fast poll read a moment before: those decide it.)"""
        read, at = round_.ports or {}, round_.at["ports"]
        if round_.moved is None or state is None:
            return {port_no: self.rates.port(0, port_no, counters, at) for port_no, counters in read.items()}
        rates = {port_no: self.rates.port(0, port_no, counters, at) for port_no, counters in read.items()
                 if port_no in round_.moved or not state.resting(port_no)}
        self.rates.still(0, "port", at)    # after the others' rates: theirs are over the time since their last
        idle = read.keys() - rates.keys()
        if idle:
            self.link.telemetry.congested.update(dict.fromkeys(idle, False))
        return rates

    def _watch(self, state: SwitchState, port_no: int, tx_bps: float | None) -> None:
        """An `auto` port at half its capacity or more is fast polled (a flood onset there is answered in
        a fraction of a second); one below it is left to the slow poll, at no cost."""
        if port_no not in state.auto or tx_bps is None:
            return
        port = state.switch.port(port_no)
        assert port is not None
        busy = tx_bps >= state.policy.congestion.clear_utilisation * port.capacity_bps
        self.watched = self.watched | {port_no} if busy else self.watched - {port_no}

    def _flow_rates(self, round_: PollRound) -> dict[int, float]:
        """Cookie → bit/s, of the flows the poll read (0 for each, of a switch that received nothing)."""
        if round_.flows is None and act.CLASSIFIED_FLOWS in round_.if_received:
            return dict.fromkeys(self.rates.unchanged(0, "flow", round_.at["ports"]), 0.0)
        rates = {}
        for cookie, counters in (round_.flows or {}).items():
            flow = self.rates.flow(0, cookie, counters, round_.at["flows"])
            if flow is not None and flow.bps is not None:
                rates[cookie] = flow.bps
        return rates

    def _class_rates(self, round_: PollRound, flow_bps: dict[int, float],
                     state: SwitchState | None) -> dict[int, dict[str, float]]:
        """Output port → class → bit/s offered, from the classified flows' counters, and from the counting
        meters' where there are some (the flows' may be half a second old)."""
        class_bps: dict[int, dict[str, float]] = {}
        counted: dict[int, dict[str, float]] = {}
        for cookie, bps in flow_bps.items():
            owner = state.rule_class(cookie) if state else None
            if owner is not None:
                classes = class_bps.setdefault(owner[0], {})
                classes[owner[1]] = classes.get(owner[1], 0.0) + bps
        for meter, meter_counters in (round_.meters or {}).items():
            owner = state.counted_class(meter) if state else None
            measured = self.rates.meter(0, meter, meter_counters, round_.at["meters"])
            if owner is not None and measured is not None and measured.bps is not None:
                classes = counted.setdefault(owner[0], {})
                classes[owner[1]] = classes.get(owner[1], 0.0) + measured.bps
        return class_bps | counted


def _received(before: PortCounters | None, after: PortCounters) -> bool:
    """Whether a port received, or dropped on receipt, anything between two readings (unknown: yes)."""
    return before is None or (before.rx_packets, before.rx_dropped, before.rx_errors) != \
        (after.rx_packets, after.rx_dropped, after.rx_errors)


def _sent(before: PortCounters | None, after: PortCounters) -> bool:
    """Whether a port sent, or failed to send, anything between two readings (unknown: yes)."""
    return before is None or (before.tx_packets, before.tx_dropped, before.tx_errors) != \
        (after.tx_packets, after.tx_dropped, after.tx_errors)


class LatePolls:
    """The switches whose statistics could not be polled every interval, each said once, and together: ovs-vswitchd
    answers every bridge of its host late while it reconfigures ports (every port of the host for each OVSDB
    change), so a site's policy put made 100 switches say so within a second. The first is said at once, the
    others at most every SAY_EVERY seconds in one line, by the slowest of them."""

    def __init__(self) -> None:
        self.said_at: float | None = None
        self.unsaid: dict[int, tuple[float, float, float]] = {}   # datapath id → its poll's interval, lag, duration

    def add(self, dp_id: int, late: tuple[float, float, float], now: float) -> None:
        self.unsaid[dp_id] = late
        self.say(now)

    def say(self, now: float) -> None:
        if not self.unsaid or (self.said_at is not None and now - self.said_at < SAY_EVERY):
            return
        dp_id, (interval, lag, took) = max(self.unsaid.items(), key=lambda item: item[1][2])
        more = f" and {len(self.unsaid) - 1} more" if len(self.unsaid) > 1 else ""
        LOG.warning("switch %016x%s: statistics cannot be polled every %g s (the last poll was %.2f s late and took "
                    "%.2f s); congestion is answered that much later", dp_id, more, interval, lag, took)
        self.said_at, self.unsaid = now, {}
