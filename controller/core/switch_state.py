"""What one switch should look like under a policy, and how congestion changes it.

Pure: the app feeds it rates and time; controller/core/plan.py compares what flows() and qos()
return with what the switch and OVSDB hold. Ports in `reserve` mode always have their class
queues and their flows steer into them; `fifo` ports never have them. `auto` ports always have them
too (pre-provisioned): while calm no flow steers into them, so every packet shares the default
class, one FIFO at the port's capacity; congestion makes the flows steer, which takes one flow batch
and no qdisc rebuild.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from controller.core.competition import Competition
from controller.core.congestion import Decision, PortCongestion
from controller.core.flows import FlowEntry, desired_flows, rule_cookies
from controller.core.meters import counted_rule, counted_rules, desired_meters
from controller.core.policy import Police, Policy, SwitchPolicy
from controller.core.queues import QosSpec, desired_qos
from controller.core.stats import PortRates


class SwitchState:
    def __init__(self, policy: Policy, switch: SwitchPolicy, userspace: bool, previous: SwitchState | None = None,
                 counting: bool = False, delays: dict[int, int] | None = None):
        """`counting`: the switch has meters, so `auto` ports' classified flows pass counting meters.
        `delays`: port → the one-way delay (µs) its interface declares for an emulated link."""
        self.policy = policy
        self.switch = switch
        self.userspace = userspace
        self.delays = delays or {}
        self.counting = counting
        self.reserving = frozenset(p.port_no for p in switch.ports if p.queues == "reserve")
        self.auto = frozenset(p.port_no for p in switch.ports if p.queues == "auto")
        self._counted = frozenset(counted_rules(policy, switch))
        self.cookies = rule_cookies(switch)
        self._rules = {cookie: index for index, cookie in enumerate(self.cookies)}
        # Routes whose rates adaptive paths read (controller/core/site.py): cookie → the host they lead to.
        self.routes = {cookie: str(dict(rule.match)["eth_dst"]) for cookie, rule in zip(self.cookies, switch.flows)
                       if rule.counted and rule.traffic_class is None}
        self._detectors = {p.port_no: PortCongestion(policy.congestion) for p in switch.ports}
        self._competition = Competition(policy, switch.ports)
        self.adopted = previous is not None     # a new state looks once at what the ports have (adopt)
        self._meters: dict[bool, Mapping[int, Police]] = {}   # counting → meters
        if previous is not None:
            self._carry_over(previous)

    def adopt(self, reserving_now: set[int]) -> None:
        """Once, for a state made without a previous one (a start, a restart, a standby taking over): an
        `auto` port found reserving keeps its reservation, congested until calm for the hold time,
        rather than being rolled back and programmed again."""
        for port in self.switch.ports:
            if port.queues == "auto" and port.port_no in reserving_now:
                self.reserving |= {port.port_no}
                self._detectors[port.port_no].adopt()
        self.adopted = True

    def _carry_over(self, previous: SwitchState) -> None:
        """A port the new policy leaves as it was keeps its congestion state: putting the same policy
        again must not reset a detector or roll back a reserving `auto` port."""
        if previous.policy.congestion != self.policy.congestion or previous.policy.classes != self.policy.classes:
            return
        for port in self.switch.ports:
            if port == previous.switch.port(port.port_no) and port.queues == "auto":
                self._detectors[port.port_no] = previous._detectors[port.port_no]
                if port.port_no in previous.reserving:
                    self.reserving |= {port.port_no}

    @property
    def meters(self) -> Mapping[int, Police]:
        """Meter id → its band (worked out once for each value of `counting`: every poll asks)."""
        meters = self._meters.get(self.counting)
        if meters is None:
            meters = self._meters[self.counting] = MappingProxyType(desired_meters(self.policy, self.switch,
                                                                                   self.counting))
        return meters

    def flows(self, reserving: frozenset[int] | set[int]) -> tuple[FlowEntry, ...]:
        """The flows while the ports in `reserving` have their class queues in force."""
        return desired_flows(self.policy, self.switch, frozenset(reserving), mark_dscp=self.userspace,
                             counted=self._counted if self.counting else frozenset(), cookies=self.cookies)

    def qos(self, reserving: frozenset[int] | set[int]) -> dict[int, QosSpec]:
        """Each port's queues: class queues for the ports in `reserving`, and always for `auto` ports."""
        return {p.port_no: desired_qos(self.policy, p, p.port_no in reserving or p.port_no in self.auto,
                                       self.userspace, self.delays.get(p.port_no, 0))
                for p in self.switch.ports}

    def counted_class(self, meter: int) -> tuple[int, str] | None:
        """(output port, class) of the flow rule a counting meter of ours counts."""
        index = counted_rule(meter)
        if index is None or index not in self._counted:
            return None
        rule = self.switch.flows[index]
        assert rule.traffic_class is not None
        return rule.outputs[0], rule.traffic_class

    def congested(self, port_no: int) -> bool:
        detector = self._detectors.get(port_no)
        return bool(detector and detector.congested)

    def resting(self, port_no: int) -> bool:
        """Whether an idle sample would change nothing for the port (true of a port without a detector)."""
        detector = self._detectors.get(port_no)
        return detector is None or detector.resting

    def rule_class(self, cookie: int) -> tuple[int, str] | None:
        """(output port, class) of the classified rule behind a flow's cookie."""
        index = self._rules.get(cookie)
        if index is None:
            return None
        rule = self.switch.flows[index]
        return (rule.outputs[0], rule.traffic_class) if rule.traffic_class else None

    def observe(self, port_no: int, rates: PortRates, queue_drops_ps: float, class_bps: dict[str, float],
                now: float, defer: bool = False) -> Decision | None:
        """Feed one port's rates; returns the decision when an `auto` port must change queues. `defer`: a program
        is not put in force but asked about (relieved()): traffic may be moved off the port instead."""
        port = self.switch.port(port_no)
        if port is None or rates.tx_bps is None or rates.tx_pps is None:
            return None
        sample = self._competition.sample(port, rates, queue_drops_ps + (rates.tx_drops_ps or 0.0), class_bps, now)
        decision = self._detectors[port_no].observe(sample, now)
        if decision is None or port.queues != "auto":
            return None
        if decision.action == "rollback":
            self.reserving -= {port_no}
        elif not defer:
            self.reserving |= {port_no}
        return decision

    def relieved(self, port_no: int, moved: bool) -> None:
        """The answer to a deferred program: traffic was moved off the port (it is calm until the detector says
        otherwise), or it was not (the port reserves)."""
        if moved:
            self._detectors[port_no].reset()
        elif self.switch.port(port_no) is not None:
            self.reserving |= {port_no}
