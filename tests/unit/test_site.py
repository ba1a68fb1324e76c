"""A switch the policy does not list, under its `network:` section (controller/core/site.py): its tables
from what the fabric says of it (tests/unit/test_fabric.py runs them), each egress port with a hand-written
table's shape of classes, so classes are steered and counted per port; ports whose capacity is declared
queue as the policy says."""
from __future__ import annotations

from typing import Any

import pytest

from controller.core import actions as act
from controller.core import events as ev
from controller.core.bridges import BridgeInfo
from controller.core.errors import PolicyError
from controller.core.fabric import FabricRules
from controller.core.flows import rule_cookies
from controller.core.jobs import JobResult
from controller.core.policy import SwitchPolicy, for_any_network, load_document, parse_policy
from controller.core.site import CLASSES_TABLE, CONTROLLER, FROM_EDGE, GROUP, PORT_BITS, site_switch
from controller.core.switch import Switch
from controller.core.view import Mode, SwitchView
from tests.unit.test_switch import REMOTE, read_tables, sent

PORTS = {1: "s1-eth1", 2: "s1-eth2", 3: "s1-eth3"}
ANY = parse_policy(for_any_network(load_document("policies/auto.yaml")))
H1, H2 = "00:00:00:00:00:01", "00:00:00:00:00:02"


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


def test_an_unlisted_switch_starts_with_its_probes_sent_here_and_its_declared_link_queued(replica):
    sw, out = mastered(replica)
    forwarding = {m for m in flows_to(out) if not any(k == "metadata" for k, _ in m)}
    # Nothing is known of its ports yet: probes to the controller, misses too, and no port forwarded from.
    assert forwarding == {(("eth_type", 0x88CC),), (("eth_type", 0x0806),), (("eth_dst", GROUP),), ()}
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


def rules(**fabric: object) -> SwitchPolicy:
    known = {"edge": frozenset({3}), "links": frozenset({1}), "tree": frozenset({1}), "hosts": ((H1, 3),),
             "routes": ((H1, 3), (H2, 1))} | fabric
    return site_switch(ANY, 1, Replica().bridge(1), FabricRules(**known))


def test_each_port_that_forwards_gets_the_classes_of_a_hand_written_table_in_table_3():
    policy = rules(edge=frozenset({2, 3}), hosts=((H1, 3),))
    by_port = {p: [r for r in policy.flows if r.table == CLASSES_TABLE and ("metadata", (p, PORT_BITS)) in r.match]
               for p in (1, 2, 3)}
    # Its output, one rule per class rule (tcp, udp, voice) and one per class mark kept from upstream.
    assert [len(by_port[p]) for p in (1, 2, 3)] == [7, 0, 7]          # the link's, H1's; not idle port 2's
    assert all(r.outputs == (3,) for r in by_port[3]) and {r.traffic_class for r in by_port[3]} == {None, "tcp",
                                                                                                    "udp", "voice"}


def test_a_host_or_a_link_that_comes_or_goes_leaves_every_other_rule_its_cookie():
    before, after = rules(), rules(hosts=((H1, 3), (H2, 2)), edge=frozenset({2, 3}), routes=((H1, 3), (H2, 2)))
    cookies = dict(zip(before.flows, rule_cookies(before)))
    kept = [(rule, cookie) for rule, cookie in zip(after.flows, rule_cookies(after)) if rule in cookies]
    assert len(kept) > len(after.flows) / 2 and all(cookies[rule] == cookie for rule, cookie in kept)
    # H2's route moved from the link to port 2: the same rule (table, priority, match), other actions.
    moved = {r.match: (r.write_metadata, c) for r, c in zip(after.flows, rule_cookies(after)) if r.table == 2}
    was = {r.match: (r.write_metadata, c) for r, c in zip(before.flows, rule_cookies(before)) if r.table == 2}
    h2 = (("eth_dst", H2),)
    assert moved[h2][0] == (2, PORT_BITS) and was[h2][0] == (1, PORT_BITS) and moved[h2][1] == was[h2][1]


def test_the_ports_table_sends_probes_here_and_forwards_from_known_ports_only():
    table0 = {r.match: (r.outputs, r.goto, r.write_metadata) for r in rules(edge=frozenset({3})).flows if r.table == 0}
    assert table0 == {(("eth_type", 0x88CC),): ((CONTROLLER,), None, None),
                      (("in_port", 3),): ((), 1, (FROM_EDGE, FROM_EDGE)),      # a host's: on to its sources
                      (("in_port", 1),): ((), 2, None)}                        # a link's: on to routing


def test_what_is_flooded_goes_along_the_tree_and_out_of_edge_ports_and_a_link_off_the_tree_drops_it():
    """From a link or a port a host was heard on: a host's first frames elsewhere go to the controller."""
    policy = rules(edge=frozenset({3, 4}), links=frozenset({1, 2}), tree=frozenset({1}))
    flood = {dict(r.match)["in_port"]: r.outputs for r in policy.flows
             if r.table == 2 and ("eth_dst", GROUP) in r.match}
    assert flood == {1: (3, 4), 2: (), 3: (1, 4)}


@pytest.mark.parametrize("network, message", [
    ({"forwarding": "normal"}, "network.forwarding: 'normal' is not a forwarding this controller does"),
    ({"paths": "random"}, "network.paths: 'random' is not a way of choosing paths"),
    ({"paths": "adaptive"}, None),
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
