"""What one switch should look like under a policy, and how congestion changes it.

Pure: the app feeds it rates and time and reconciles the switch and OVSDB with
what it returns (flows(), qos()). Ports in `reserve` mode always have their class
queues; `auto` ports get them while congested; `fifo` ports never do.
"""
from __future__ import annotations

from controller.congestion import Decision, PortCongestion, PortSample
from controller.flows import FlowEntry, desired_flows
from controller.policy import Policy, SwitchPolicy
from controller.queues import QosSpec, desired_qos
from controller.stats import PortRates


class SwitchState:
    def __init__(self, policy: Policy, switch: SwitchPolicy, userspace: bool):
        self.policy = policy
        self.switch = switch
        self.userspace = userspace
        self.reserving = frozenset(p.port_no for p in switch.ports if p.queues == "reserve")
        self._detectors = {p.port_no: PortCongestion(policy.congestion) for p in switch.ports}

    def flows(self) -> tuple[FlowEntry, ...]:
        return desired_flows(self.policy, self.switch, self.reserving, mark_dscp=self.userspace)

    def qos(self) -> dict[int, QosSpec]:
        return {p.port_no: desired_qos(self.policy, p, p.port_no in self.reserving)
                for p in self.switch.ports}

    def congested(self, port_no: int) -> bool:
        detector = self._detectors.get(port_no)
        return bool(detector and detector.congested)

    def observe(self, port_no: int, rates: PortRates, queue_drops_ps: float, now: float) -> Decision | None:
        """Feed one port's rates; returns the decision when an `auto` port must change queues."""
        port = self.switch.port(port_no)
        if port is None or rates.tx_bps is None or rates.tx_pps is None:
            return None
        drops = queue_drops_ps + (rates.tx_drops_ps or 0.0)
        decision = self._detectors[port_no].observe(
            PortSample(rates.tx_bps, rates.tx_pps, drops, port.capacity_bps), now)
        if decision is None or port.queues != "auto":
            return None
        if decision.action == "program":
            self.reserving |= {port_no}
        else:
            self.reserving -= {port_no}
        return decision
