"""What one switch should look like under a policy, and how congestion changes it.

Pure: the app feeds it rates and time and reconciles the switch and OVSDB with
what it returns (flows(), qos()). Ports in `reserve` mode always have their class
queues; `auto` ports get them while congested; `fifo` ports never do.
"""
from __future__ import annotations

from controller.congestion import Decision, PortCongestion, PortSample, bitrate
from controller.flows import COOKIE, COOKIE_MASK, FlowEntry, desired_flows
from controller.policy import Policy, PortPolicy, SwitchPolicy
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
        return {p.port_no: desired_qos(self.policy, p, p.port_no in self.reserving, self.userspace)
                for p in self.switch.ports}

    def congested(self, port_no: int) -> bool:
        detector = self._detectors.get(port_no)
        return bool(detector and detector.congested)

    def rule_class(self, cookie: int) -> tuple[int, str] | None:
        """(output port, class) of the classified rule behind a flow's cookie."""
        index = (cookie & ~COOKIE_MASK) - 1
        if cookie & COOKIE_MASK != COOKIE or not 0 <= index < len(self.switch.flows):
            return None
        rule = self.switch.flows[index]
        return (rule.outputs[0], rule.traffic_class) if rule.traffic_class else None

    def observe(self, port_no: int, rates: PortRates, queue_drops_ps: float, class_bps: dict[str, float],
                now: float) -> Decision | None:
        """Feed one port's rates; returns the decision when an `auto` port must change queues."""
        port = self.switch.port(port_no)
        if port is None or rates.tx_bps is None or rates.tx_pps is None:
            return None
        drops = queue_drops_ps + (rates.tx_drops_ps or 0.0)
        active = sum(bps > ACTIVE_SHARE * port.capacity_bps for bps in class_bps.values())
        sample = PortSample(rates.tx_bps, rates.tx_pps, drops, port.capacity_bps,
                            contention=class_contention(self.policy, port, class_bps),
                            competing=not class_bps or active >= 2)
        decision = self._detectors[port_no].observe(sample, now)
        if decision is None or port.queues != "auto":
            return None
        if decision.action == "program":
            self.reserving |= {port_no}
        else:
            self.reserving -= {port_no}
        return decision


# Below this share of the port a class is idle, not squeezed: no reservation would help it.
ACTIVE_SHARE = 0.01


def class_contention(policy: Policy, port: PortPolicy, class_bps: dict[str, float]) -> str | None:
    """Which active class gets less than its reservation while another takes more than its own."""
    cap, keep = port.capacity_bps, 1 - policy.congestion.shortfall
    for short in policy.classes:
        rate = class_bps.get(short.name)
        if rate is None or not ACTIVE_SHARE * cap < rate < keep * short.min_share * cap:
            continue
        for taker in policy.classes:
            taken = class_bps.get(taker.name, 0.0)
            if taker is not short and taken > taker.min_share * cap:
                return (f"class {short.name} at {bitrate(rate)} < {keep:.0%} of its {bitrate(short.min_share * cap)} "
                        f"while {taker.name} takes {bitrate(taken)}")
    return None
