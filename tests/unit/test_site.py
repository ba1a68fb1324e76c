"""A switch the policy does not list, under its `network:` section (controller/core/site.py): the
controller learns where hosts are from the packets the switch sends it, forwards them, and gives the
switch a hand-written table's shape (an entry per MAC and class, with its output port), so classes are
steered and counted per port; ports whose capacity is declared queue as the policy says."""
from __future__ import annotations

from typing import Any

import pytest

from controller.core import actions as act
from controller.core import events as ev
from controller.core.bridges import BridgeInfo
from controller.core.errors import PolicyError
from controller.core.flows import rule_index
from controller.core.jobs import JobResult
from controller.core.policy import for_any_network, load_document, parse_policy
from controller.core.site import CONTROLLER, FLOOD
from controller.core.switch import Switch
from controller.core.view import Mode, SwitchView
from tests.unit.test_switch import REMOTE, read_tables, sent

PORTS = {1: "s1-eth1", 2: "s1-eth2", 3: "s1-eth3"}
ANY = parse_policy(for_any_network(load_document("policies/auto.yaml")))
H1, H2 = "00:00:00:00:00:01", "00:00:00:00:00:02"
BROADCAST = "ff:ff:ff:ff:ff:ff"


class Replica:
    """OVSDB's replica: a bridge whose port 1 declares 5 Mbit/s (a link's bw=), reads only."""

    def __init__(self) -> None:
        self.names = (REMOTE,)
        self.qos: dict[str, Any] = {}
        self.generation = (1,)
        self.declared = {1: 5_000_000}
        self.delays: dict[int, int] = {}

    def bridge(self, dp_id: int, pinned: str | None = None) -> BridgeInfo | None:
        return BridgeInfo("s1", "netdev", dict(PORTS), REMOTE, declared=dict(self.declared),
                          delays=dict(self.delays)) if dp_id == 1 else None

    def port_qos(self, remote: str, iface: str) -> Any:
        return self.qos.get(iface)


def view(replica: Replica, policy: Any = ANY, active: bool = True) -> SwitchView:
    return SwitchView(policy, Mode.IN_FORCE, active, active, 5, replica)


def frame(dst: str, src: str) -> bytes:
    return bytes.fromhex(dst.replace(":", "")) + bytes.fromhex(src.replace(":", "")) + b"\x08\x00" + bytes(46)


def mastered(replica: Replica, policy: Any = ANY) -> tuple[Switch, list[act.SwitchAction]]:
    sw = Switch(conn=7, dp_id=1, ports=frozenset(PORTS), now=100.0, phase=0.5)
    out = sw.handle(ev.BridgeDue(7, 0), 100.0, view(replica, policy))
    (ask,) = sent(out, act.RoleRequest)
    (claim,) = sent(sw.handle(ev.RoleReply(7, ask.xid, "equal", None), 100.0, view(replica, policy)), act.RoleRequest)
    sw.handle(ev.RoleReply(7, claim.xid, "master", 5), 100.0, view(replica, policy))
    out = read_tables(sw, replica, out)
    for barrier in sent(out, act.Barrier):      # the first batch done: the next one is sent at once
        sw.handle(ev.BarrierReply(7, barrier.xid), 100.0, view(replica, policy))
    return sw, out


def flows_to(out: list[act.SwitchAction]) -> dict[tuple[tuple[str, Any], ...], tuple[Any, ...]]:
    return {m.entry.match: m.entry.actions for m in sent(out, act.AddFlow) + sent(out, act.ModifyFlow)}


@pytest.fixture
def replica() -> Replica:
    return Replica()


def test_an_unlisted_switch_starts_with_its_misses_sent_here_and_its_declared_link_queued(replica):
    sw, out = mastered(replica)
    assert flows_to(out) == {(): (("output", CONTROLLER),)}
    (submit,) = [a for a in out if isinstance(a, act.Submit)]
    assert [(j.port_no, j.qos) for j in submit.jobs] == [(1, True)]          # port 1 declared its rate; 2, 3 did not
    assert sw.state is not None and [(p.port_no, p.capacity_bps, p.queues) for p in sw.state.switch.ports] == \
        [(1, 5_000_000, "auto")]


def test_a_capacity_declared_later_queues_its_port_at_the_next_poll(replica):
    """`ovs-vsctl set interface IFACE external_ids:ovs-qos-capacity=4Mbit` beside a running controller (mn's way)."""
    sw, out = mastered(replica)
    done(sw, replica, out)
    replica.declared[2] = 4_000_000
    submit = next_poll(sw, replica)
    assert [(j.port_no, j.qos, j.spec.ovsdb.max_bps if j.spec else None) for j in submit.jobs] == [(2, True, 4_000_000)]


def done(sw: Switch, replica: Replica, out: list[act.SwitchAction]) -> act.Submit:
    """The switch's submitted jobs, done: their QoS in OVSDB's replica."""
    (submit,) = [a for a in out if isinstance(a, act.Submit)]
    for job in submit.jobs:
        replica.qos[job.iface] = job.spec.ovsdb if job.spec else None
    sw.handle(ev.JobsDone(tuple(JobResult(job) for job in submit.jobs)), 100.0, view(replica))
    return submit


def next_poll(sw: Switch, replica: Replica) -> act.Submit:
    """The jobs of the next poll once OVSDB moved (something was declared in it)."""
    replica.generation = (replica.generation[0] + 1,)
    out = sw.handle(ev.PollDue(7, sw.poller.next_due or 101.0), 101.0, view(replica))
    (submit,) = [a for a in out if isinstance(a, act.Submit)]
    return submit


def test_a_declared_delay_puts_netem_under_the_classes_of_its_port_and_a_later_one_at_the_next_poll(replica):
    """`ovs-vsctl set interface IFACE external_ids:ovs-qos-delay=10ms`: the launcher's way for a link's delay=."""
    replica.declared[2] = 4_000_000
    replica.delays[1] = 10_000
    sw, out = mastered(replica)
    submit = done(sw, replica, out)
    assert {j.port_no: j.spec.delay_us for j in submit.jobs if j.spec} == {1: 10_000, 2: 0}
    replica.delays[2] = 500
    submit = next_poll(sw, replica)
    # OVSDB's rows stay as they are (the delay is no column of theirs): the port's leaves are checked again.
    assert [(j.port_no, j.qos, j.spec.delay_us if j.spec else None) for j in submit.jobs] == [(2, False, 500)]


def test_a_packet_from_a_new_host_is_flooded_and_its_mac_gets_entries_to_its_port(replica):
    sw, _ = mastered(replica)
    out = sw.handle(ev.PacketIn(7, 3, frame(BROADCAST, H1)), 101.0, view(replica))
    (packet_out,) = sent(out, act.PacketOut)
    assert (packet_out.in_port, packet_out.output) == (3, FLOOD)
    added = flows_to(out)
    assert added[(("eth_dst", H1),)] == (("output", 3),)
    classified = {m: a for m, a in added.items() if ("eth_dst", H1) in m and len(m) > 1}
    # One entry per class rule (tcp, udp, voice) and one per class mark kept from upstream, each to port 3.
    assert len(classified) == 6 and all(a[-1] == ("output", 3) for a in classified.values())
    assert (("eth_dst", H1), ("eth_type", 0x0800), ("ip_proto", 6)) in classified


def test_a_packet_for_a_learned_host_goes_to_its_port_only(replica):
    sw, _ = mastered(replica)
    out = sw.handle(ev.PacketIn(7, 3, frame(BROADCAST, H1)), 101.0, view(replica))
    (batch,) = sent(out, act.Barrier)
    sw.handle(ev.BarrierReply(7, batch.xid), 101.0, view(replica))
    out = sw.handle(ev.PacketIn(7, 2, frame(H1, H2)), 101.1, view(replica))
    (packet_out,) = sent(out, act.PacketOut)
    assert (packet_out.in_port, packet_out.output) == (2, 3)
    assert flows_to(out)[(("eth_dst", H2),)] == (("output", 2),)      # and H2 is learned on port 2


def test_a_host_that_moves_keeps_its_entries_cookies_with_the_new_port(replica):
    sw, out = mastered(replica)
    out = sw.handle(ev.PacketIn(7, 3, frame(BROADCAST, H1)), 101.0, view(replica))
    (batch,) = sent(out, act.Barrier)
    sw.handle(ev.BarrierReply(7, batch.xid), 101.0, view(replica))
    before = {m.entry.match: m.entry.cookie for m in sent(out, act.AddFlow)}
    out = sw.handle(ev.PacketIn(7, 2, frame(BROADCAST, H1)), 102.0, view(replica))
    moved = {m.entry.match: m.entry for m in sent(out, act.ModifyFlow) + sent(out, act.AddFlow)}
    assert moved[(("eth_dst", H1),)].actions == (("output", 2),)
    assert {match: e.cookie for match, e in moved.items()} == {m: c for m, c in before.items() if m in moved}
    assert len(moved) == 7 and rule_index(moved[(("eth_dst", H1),)].cookie) == 1


def test_a_port_that_goes_forgets_the_hosts_learned_on_it(replica):
    sw, _ = mastered(replica)
    sw.handle(ev.PacketIn(7, 3, frame(BROADCAST, H1)), 101.0, view(replica))
    assert sw.learned.ports == {H1: 3}
    sw.handle(ev.PortsChanged(7, frozenset({1, 2})), 102.0, view(replica))
    assert sw.learned.ports == {}


def test_a_standby_neither_forwards_nor_learns(replica):
    sw, _ = mastered(replica)
    out = sw.handle(ev.PacketIn(7, 3, frame(BROADCAST, H1)), 101.0, view(replica, active=False))
    assert not sent(out, act.PacketOut) and sw.learned.ports == {}


def test_a_listed_switch_is_forwarded_by_its_own_table_not_by_learning(replica):
    listed = parse_policy(load_document("policies/auto.yaml"))    # lists s1 (dp_id 1) with its flows
    sw, _ = mastered(replica, listed)
    out = sw.handle(ev.PacketIn(7, 3, frame(BROADCAST, H1)), 101.0, view(replica, listed))
    assert not sent(out, act.PacketOut) and sw.learned.ports == {}


def test_a_runt_or_a_multicast_source_is_not_learned(replica):
    sw, _ = mastered(replica)
    assert not sent(sw.handle(ev.PacketIn(7, 3, b"\x01\x02"), 101.0, view(replica)), act.PacketOut)
    out = sw.handle(ev.PacketIn(7, 3, frame(H2, "01:00:5e:00:00:01")), 101.0, view(replica))
    assert sw.learned.ports == {} and [m.output for m in sent(out, act.PacketOut)] == [FLOOD]


@pytest.mark.parametrize("network, message", [
    ({"forwarding": "normal"}, "network.forwarding: 'normal' is not a forwarding this controller does"),
    ({"classify": [{"match": {"in_port": 1, "ip_proto": "tcp"}, "class": "tcp"}]},
     "network.classify[0].match.in_port: a network-wide class cannot name a port"),
    ({"classify": [{"match": {"ip_proto": "tcp"}, "class": "bulk"}]},
     "network.classify[0].class: 'bulk' is not defined under classes"),
    ({"classify": [{"match": {"ip_proto": "tcp"}, "class": {}}]},     # once a TypeError out of the REST handler
     "network.classify[0].class: {} is not defined under classes"),
    ({"classify": {"tcp": 1}}, "network.classify: expected a list, got dict"),
    ({"classify": [[]]}, "network.classify[0]: expected a mapping"),
    ({"classify": [{"match": {"eth_type": "arp"}, "class": "tcp"}]},
     "network.classify[0].class: classes steer IP packets only"),
    ({"classify": [{"priority": 60000, "match": {"ip_proto": "tcp"}, "class": "tcp"}]},
     "network.classify[0].priority: 60000 is not a whole number from 1001 to 59999"),
    ({"ports": {"queues": "fast"}}, "network.ports.queues: 'fast' is not one of fifo, reserve, auto"),
    ({"ports": {"queues": "auto", "capacity": "5Mbit"}}, None),
    ({"ports": {"queues": "auto", "capacity": 5}},
     "network.ports.capacity: 5 is 5 bit/s, below the 1kbit a port's queues need (a number without a unit is bit/s)"),
    ({"colour": 1}, "network.colour: unknown key"),
])
def test_a_network_section_is_checked_field_by_field(network, message):
    document = {"name": "p", "classes": {"tcp": {"queue": 1, "min": "50%"}}, "network": network}
    if message is None:
        assert parse_policy(document).network is not None
        return
    with pytest.raises(PolicyError) as err:
        parse_policy(document)
    assert str(err.value).startswith(message)


def test_a_policy_for_its_own_switches_only_is_not_one_for_any_network():
    document = load_document("policies/auto.yaml")
    assert "switches" not in for_any_network(document) and "switches" in document
    with pytest.raises(PolicyError, match="network: missing"):
        for_any_network({"name": "p", "switches": {}})
