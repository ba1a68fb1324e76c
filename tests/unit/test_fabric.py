"""The controller's own forwarding on networks with loops (controller/core/fabric.py), through the real core and
the real OpenFlow adapter on fake switches cabled together (tests/unit/fakenet.py): links found by its signed
probes, hosts reached along installed paths, nothing flooded around a loop, failures routed around."""
from __future__ import annotations

import pytest

from bench.bench_paths import fat_tree
from controller.core import events as ev
from controller.core import frames
from controller.core.policy import for_any_network, load_document
from controller.core.topology import EDGE_SETTLE, LINK_LOST, LINK_TIMEOUT, PROBE_SECONDS, Role
from tests.unit.fakenet import BROADCAST, FakeNet

AUTO = for_any_network(load_document("policies/auto.yaml"))


def network(tmp_path, links, hosts, paths: str = "ecmp") -> FakeNet:
    policy = {**AUTO, "network": {**AUTO["network"], "paths": paths}}
    net = FakeNet(tmp_path, links, hosts, policy)
    net.app.advance(EDGE_SETTLE + 2 * PROBE_SECONDS)
    return net


@pytest.fixture
def tree4(tmp_path) -> FakeNet:
    return network(tmp_path, *fat_tree(4))


def fabric(net: FakeNet):
    return net.app.core.forwarding.fabric


def test_a_fat_tree_is_found_and_every_host_reaches_every_other_with_nothing_flooded_around_a_loop(tree4):
    assert len(fabric(tree4).topology.peer) == 2 * 32          # k=4: 16 aggregation-core, 16 aggregation-edge links
    names = list(tree4.hosts)
    unreached = [(a, b) for a in names for b in names if a != b and not tree4.ping(a, b)]
    assert unreached == [] and tree4.storms == 0


def test_a_broadcast_reaches_every_other_host_once(tree4):
    before = {name: host.received for name, host in tree4.hosts.items()}
    h1 = tree4.hosts["h1"]
    tree4.send(h1, frames.mac_bytes(BROADCAST) + frames.mac_bytes(h1.mac) + b"\x88\xb5" + bytes(46))
    tree4.app.settle()
    assert {name: host.received - before[name] for name, host in tree4.hosts.items()} == \
        {name: int(name != "h1") for name in tree4.hosts}
    assert tree4.storms == 0


@pytest.mark.parametrize("put_after", [0.0, 0.1, 3.0])
def test_a_new_port_forwards_nothing_until_it_is_known_to_face_a_host(tmp_path, put_after):
    """Whether the policy comes with the switches, a moment after them (the rules are said again once the new
    ports have turned edge, however the rounds fall) or seconds after them (a port nobody probed is new)."""
    net = FakeNet(tmp_path, [(1, 2), (2, 3), (3, 1)], {1: 1, 3: 1}, AUTO, put_after=put_after)   # a loop
    assert not net.ping("h1", "h2") and net.storms == 0
    net.app.advance(EDGE_SETTLE + PROBE_SECONDS)
    assert net.ping("h1", "h2") and net.storms == 0


def test_a_probe_a_host_forges_or_sends_again_makes_no_link(tmp_path):
    net = FakeNet(tmp_path, *fat_tree(4), AUTO)
    topology = fabric(net).topology
    h1, h5 = net.hosts["h1"], net.hosts["h5"]
    # While h1's port is new, the controller probes it: h1 keeps one, as a host could.
    net.app.advance(PROBE_SECONDS)
    (_, kept), *_ = [out for out in net.switches[h1.at[0]].packet_outs if out[0] == [h1.at[1]]]
    net.app.advance(EDGE_SETTLE)
    assert net.ping("h5", "h1")                              # both have been heard on their ports
    links = dict(topology.peer)
    net.send(h1, frames.probe_frame(b"not the controller's key", 99, 1, int(net.app.clock * 1000), b"12345678"))
    net.send(h5, kept)                                       # sent again by a host elsewhere, to fake a link
    net.send(h1, kept)                                       # or back where it came from
    net.app.settle()
    assert topology.peer == links
    assert topology.refused == {"forged": 1, "a host's port": 2}
    assert topology.role(h1.at, net.app.clock) is Role.EDGE and topology.role(h5.at, net.app.clock) is Role.EDGE


def first_hop(net: FakeNet, src: str, dst: str) -> int:
    """The port the source's switch sends toward `dst` by."""
    rules = net.app.core.forwarding.rules[net.hosts[src].at[0]]
    return dict(rules.routes)[net.hosts[dst].mac]


def test_a_link_that_goes_down_is_routed_around_at_once_and_used_again_when_it_is_back(tree4):
    assert tree4.ping("h1", "h16")
    port = first_hop(tree4, "h1", "h16")
    edge = tree4.hosts["h1"].at[0]
    (agg, _), = [peer for end, peer in tree4.peer.items() if end == (edge, port)]
    tree4.link(edge, agg, "down")
    assert first_hop(tree4, "h1", "h16") != port
    assert tree4.ping("h1", "h16")                           # no time passed: the port status was enough
    tree4.link(edge, agg, "up")
    tree4.app.advance(2 * PROBE_SECONDS)
    assert first_hop(tree4, "h1", "h16") == port and tree4.ping("h1", "h16") and tree4.storms == 0


def test_a_link_that_goes_silent_is_lost_within_a_second(tree4):
    assert tree4.ping("h1", "h16")
    edge = tree4.hosts["h1"].at[0]
    port = first_hop(tree4, "h1", "h16")
    (agg, agg_port), = [peer for end, peer in tree4.peer.items() if end == (edge, port)]
    tree4.cut |= {(edge, port), (agg, agg_port)}             # frames lost both ways, ports still up
    tree4.app.advance(LINK_TIMEOUT - PROBE_SECONDS)
    assert not tree4.ping("h1", "h16")
    tree4.app.advance(1.0 - (LINK_TIMEOUT - PROBE_SECONDS))
    assert tree4.ping("h1", "h16") and first_hop(tree4, "h1", "h16") != port
    assert fabric(tree4).topology.role((edge, port), tree4.app.clock) is Role.QUIET   # not flooded into


def test_a_controller_that_hears_every_probe_late_loses_no_link(tree4):
    """Its probes come back 0.5-1 s after they were sent (a busy controller, a busy OVS): silence is judged by
    when they were sent, so no link is lost for it."""
    links = dict(fabric(tree4).topology.peer)
    for switch in tree4.switches.values():
        switch.late = True
    for _ in range(12):
        tree4.app.advance(0.5)
        for switch in tree4.switches.values():
            switch.release()
    assert fabric(tree4).topology.peer == links


def test_a_lone_link_gone_silent_is_lost_once_no_probe_is_heard_for_a_while(tmp_path):
    net = network(tmp_path, [(1, 2)], {1: 1, 2: 1})
    net.cut |= {(1, 1), (2, 1)}                                # nothing else is heard to compare it with
    net.app.advance(LINK_LOST - PROBE_SECONDS)
    assert fabric(net).topology.peer
    net.app.advance(2 * PROBE_SECONDS)
    assert not fabric(net).topology.peer


@pytest.mark.parametrize("paths, uplinks", [("one", 1), ("ecmp", 2)])
def test_one_path_takes_the_first_uplink_and_ecmp_shares_both(tmp_path, paths, uplinks):
    net = network(tmp_path, *fat_tree(4), paths=paths)
    remote = [name for name, host in net.hosts.items() if host.at[0] != net.hosts["h1"].at[0]]
    assert all(net.ping("h1", name) for name in remote)
    assert len({first_hop(net, "h1", name) for name in remote}) == uplinks


def test_probes_cost_one_packet_per_link_end_and_round_and_none_to_hosts(tree4):
    sent = sum(len(s.packet_outs) for s in tree4.switches.values())
    tree4.app.advance(10.0)
    assert sum(len(s.packet_outs) for s in tree4.switches.values()) - sent == 2 * 32 * 10.0 / PROBE_SECONDS


MBIT = 1_000_000
TCP, UDP = 6, 17


def adaptive(tmp_path) -> FakeNet:
    net = FakeNet(tmp_path, *fat_tree(4), {**AUTO, "network": {**AUTO["network"], "paths": "adaptive"}},
                  capacity=10 * MBIT)
    net.app.advance(EDGE_SETTLE + 2 * PROBE_SECONDS)
    assert all(net.ping("h1", b) for b in net.hosts if b != "h1")      # every host heard from
    return net


def colliding(net: FakeNet) -> tuple[str, str]:
    """Two hosts of another pod whose traffic from h1's and h2's switch leaves by the same uplink."""
    far = [name for name, host in net.hosts.items() if host.at[0] not in (7, 8)]   # pod 1's edge switches: 7, 8
    for a in far:
        for b in far:
            if a < b and net.path("h1", a)[0] == net.path("h2", b)[0]:
                return a, b
    raise AssertionError("ECMP spread every pair: no collision to test")


def test_two_elephants_on_one_uplink_beside_an_idle_one_are_moved_apart_and_back_once_it_is_quiet(tmp_path):
    net = adaptive(tmp_path)
    a, b = colliding(net)
    flows = [("h1", a, 6 * MBIT, TCP), ("h2", b, 6 * MBIT, TCP)]
    for _ in range(3):
        net.offer(flows, 10 * MBIT)
        net.app.poll()
    assert net.path("h1", a)[0] != net.path("h2", b)[0]       # each on an uplink of its own
    (move,) = [d for d in net.app.core.decisions.last if d["action"] == "move"]
    assert "elephants collide" in move["reason"] and not net.app.core.forwarding.fabric.routes.placement.hot.get(
        net.path("h1", a)[0])
    assert all(net.ping("h1", x) and net.ping("h2", x) for x in (a, b))
    for _ in range(5):                                         # quiet for longer than the hold time
        net.app.poll()
    assert net.app.core.forwarding.fabric.routes.placement.overrides == {}
    assert net.path("h1", a)[0] == net.path("h2", b)[0]        # ECMP's own choice again
    back = [d for d in net.app.core.decisions.last if d["action"] == "move"][1:]
    assert back and all(d["reason"] == "quiet" and d["bit_rate"] == 0 for d in back)   # it sends nothing now


def test_one_elephant_alone_is_left_where_it_is(tmp_path):
    net = adaptive(tmp_path)
    a, _ = colliding(net)
    for _ in range(3):
        net.offer([("h1", a, 12 * MBIT, TCP)], 10 * MBIT)
        net.app.poll()
    assert not [d for d in net.app.core.decisions.last if d["action"] == "move"]


def twin_links(tmp_path) -> FakeNet:
    """Two switches with two links between them (either may carry any host's traffic), three hosts on each."""
    net = FakeNet(tmp_path, [(1, 2), (1, 2)], {1: 3, 2: 3}, {**AUTO, "network": {**AUTO["network"],
                  "paths": "adaptive"}}, capacity=5 * MBIT)
    net.app.advance(EDGE_SETTLE + 2 * PROBE_SECONDS)
    assert all(net.ping("h1", b) for b in net.hosts if b != "h1")
    return net


def link_ports_reserving(net: FakeNet) -> set[tuple[int, int]]:
    return {(dp, port) for dp in net.switches for port in net.app.core.switches[dp].state.reserving}


def flooded_beside_tcp_to_one_host(tmp_path) -> tuple[FakeNet, tuple[int, int]]:
    """Twin links, a flood beside a TCP flow to the same host for two polls: nothing can be moved apart, so the
    link they share reserves. The net and that link."""
    net = twin_links(tmp_path)
    link = net.path("h1", "h4")[0]
    for _ in range(2):
        net.offer([("h1", "h4", 2.5 * MBIT, TCP), ("h2", "h4", 8 * MBIT, UDP)], 5 * MBIT)
        net.app.poll()
    assert link in link_ports_reserving(net)
    return net, link


def test_a_flood_beside_a_tcp_flow_to_the_same_host_cannot_be_moved_apart_so_the_link_reserves(tmp_path):
    net, link = flooded_beside_tcp_to_one_host(tmp_path)
    assert not [d for d in net.app.core.decisions.last if d["action"] == "move"]
    (program,) = [d for d in net.app.core.decisions.last if d["action"] == "program"]
    assert (int(program["dp_id"], 16), program["port"]) == link


def test_a_link_that_reserved_because_nothing_could_be_moved_rolls_back_once_the_flood_ends(tmp_path):
    """Only a program is deferred to adaptive paths: a rollback asks nothing of them (asked, it would find nothing
    to move and reserve the link again, for good)."""
    net, link = flooded_beside_tcp_to_one_host(tmp_path)
    for _ in range(5):                             # quiet for longer than the hold time
        net.app.poll()
    assert link not in link_ports_reserving(net)
    rollbacks = [d for d in net.app.core.decisions.last if d["action"] == "rollback"]
    assert [(int(d["dp_id"], 16), d["port"]) for d in rollbacks] == [link]


def test_a_flood_beside_a_tcp_flow_to_another_host_is_moved_onto_the_idle_link_and_nothing_reserves(tmp_path):
    net = twin_links(tmp_path)
    tcp_to, flood_to = next((a, b) for a in ("h4", "h5", "h6") for b in ("h4", "h5", "h6")
                            if a != b and net.path("h1", a) == net.path("h2", b))
    for _ in range(2):
        net.offer([("h1", tcp_to, 2.5 * MBIT, TCP), ("h2", flood_to, 8 * MBIT, UDP)], 5 * MBIT)
        net.app.poll()
    assert net.path("h1", tcp_to) != net.path("h2", flood_to)
    assert link_ports_reserving(net) == set()
    assert [d["action"] for d in net.app.core.decisions.last] == ["move"]


def test_a_standby_hears_what_the_active_one_hears_and_forwards_at_once_when_it_takes_over(tree4):
    standby = tree4.app.another()                  # the active one holds the lock: this one is every switch's slave
    for switch in tree4.switches.values():
        standby.connect(switch)
    for _ in range(8):                               # both run: the active one's probes, which the standby
        tree4.app.advance(PROBE_SECONDS)             # hears too, and by which, a second on, it knows the edge
        standby.clock = tree4.app.clock              # ports as the active one does
        standby.advance(0.0)
    assert all(tree4.ping("h1", b) for b in tree4.hosts if b != "h1")
    standby.settle()
    heard = standby.core.forwarding.fabric
    assert heard.topology.peer == fabric(tree4).topology.peer and heard.hosts.at == fabric(tree4).hosts.at
    assert not any(sw.role.writable(standby.core.view(dp, standby.clock)) for dp, sw in standby.core.switches.items())
    tree4.app.exit()                                # the active one is gone: its lock goes with it
    standby.remotes_changed()
    for switch in tree4.switches.values():
        switch.net = tree4                          # (the FakeNet drives the standby's harness from here)
    tree4.app = standby
    assert tree4.ping("h16", "h1") and tree4.storms == 0


def test_switches_of_edge_ports_only_are_passed_over_until_a_cable_plugged_in_makes_a_port_new(tmp_path):
    net = FakeNet(tmp_path, [(1, 2)], {1: 1, 2: 1}, AUTO)
    net.cut = {(1, 1), (2, 1)}                       # the link's cable is not plugged in yet: its ports face nothing
    net.app.advance(EDGE_SETTLE + 2 * PROBE_SECONDS)
    topology = fabric(net).topology
    assert topology.roles(1, net.app.clock) == {1: Role.EDGE, 2: Role.EDGE} and topology.unprobed == {1, 2}
    sent = net.switches[1].packet_outs[:]
    net.app.advance(2.0)
    assert net.switches[1].packet_outs == sent and not net.ping("h1", "h2")
    net.cut.clear()                                  # plugged in at s2: its port goes down and up, s1's stays up
    s2 = net.switches[2]
    for down in ({1}, set()):
        net.app.handle(ev.PortsChanged(net.app.conn_of(s2), s2.ports, frozenset(down)))
    net.app.advance(EDGE_SETTLE + PROBE_SECONDS)     # s2 probes its new port; s1 hears it on its edge port
    assert topology.role((1, 1), net.app.clock) is Role.LINK and net.ping("h1", "h2")
    sent = len(net.switches[1].packet_outs)
    net.app.advance(1.0)                             # a link port of s1 now: s1 probes it too
    assert len(net.switches[1].packet_outs) - sent == 1.0 / PROBE_SECONDS


def test_a_switch_joining_a_site_has_its_own_rules_worked_out_not_everyones(tmp_path):
    from tests.unit.fakes import FakeOvsdb, FakeSwitch, Harness
    switches = [FakeSwitch(dp, {p: f"s{dp}-eth{p}" for p in range(1, 5)}) for dp in range(1, 41)]
    app = Harness(FakeOvsdb(*switches), tmp_path / "state.json")
    assert app.request(ev.SetPolicy, AUTO)[1] is None
    fabric = app.core.forwarding.fabric
    said, rules = [], fabric.rules
    fabric.rules = lambda dp, now: said.append(dp) or rules(dp, now)
    for switch in switches:
        app.connect(switch)
    app.advance(EDGE_SETTLE + PROBE_SECONDS)        # their ports turn edge: each switch's rules once more
    assert sorted(said) == sorted([dp for dp in range(1, 41)] * 2)


def test_a_destination_moved_stays_where_it_went_for_the_hold_time():
    """Rates read before a move took effect may make its new link look full and its old one empty: a destination
    moved is not sent back within the hold time (the real fat-tree's moves went back and forth every second)."""
    from controller.core.congestion import CongestionConfig
    from controller.core.placement import Placement

    class Twin:                      # switches 1 and 2, two links between them; hosts a and b on 2, sent by 1
        overrides: dict = {}

        def next_hop(self, dp, mac):
            return placement.overrides.get((dp, mac), 1) if dp == 1 else None

        def default_hop(self, dp, mac):
            return 1 if dp == 1 else None

        def choices(self, dp, mac):
            return [1, 2] if dp == 1 else []

        def peer(self, end):
            return {(1, 1): (2, 1), (1, 2): (2, 2), (2, 1): (1, 1), (2, 2): (1, 2)}.get(end)

        def home(self, mac):
            return 2

        def switches(self):
            return [1, 2]

    placement, paths, config = Placement(), Twin(), CongestionConfig()
    capacity = {1: 5 * MBIT, 2: 5 * MBIT}
    for now in (0.0, 0.05):                                     # both on link 1: they collide
        placement.observe(1, {1: 5 * MBIT, 2: 0.0}, {"a": 3 * MBIT, "b": 3 * MBIT}, capacity, config, paths, now)
    assert placement.overrides == {(1, "a"): 2} or placement.overrides == {(1, "b"): 2}
    (moved,) = placement.overrides
    # Stale: link 2 looks full of what moved, link 1 empty; its detector asks for relief.
    placement.observe(1, {1: 0.0, 2: 5 * MBIT}, {"a": 3 * MBIT, "b": 3 * MBIT}, capacity, config, paths, 1.2)
    assert placement.relieve((1, 2), config, paths, 1.3, "its queue drops") == []
    assert list(placement.overrides) == [moved]


class Triangle:
    """Switches 1, 2 and 3 in a ring; hosts a and b on 2, sent by 1: straight over 1's port 1, or round by 3
    (1's port 2, then 3's port 2 to 2), a hop longer."""

    def __init__(self, placement):
        self.placement = placement

    def next_hop(self, dp, mac):
        return self.placement.overrides.get((dp, mac), self.default_hop(dp, mac))

    def default_hop(self, dp, mac):
        return {1: 1, 3: 2}.get(dp)

    def choices(self, dp, mac):
        return {1: [1, 2], 3: [2, 1]}.get(dp, [])

    def peer(self, end):
        ends = {(1, 1): (2, 1), (1, 2): (3, 1), (3, 2): (2, 2)}
        return ends.get(end) or {b: a for a, b in ends.items()}.get(end)

    def home(self, mac):
        return 2

    def switches(self):
        return [1, 2, 3]


@pytest.mark.parametrize("shortest_only", [False, True])
def test_a_clusters_member_moves_nothing_onto_a_longer_path(shortest_only):
    """The other members' moves are unknown to a member: moves that each take a hop nearer never loop, longer
    ones may; alone, the longer path with room is taken."""
    from controller.core.congestion import CongestionConfig
    from controller.core.placement import Placement

    placement = Placement(shortest_only=shortest_only)
    paths, config = Triangle(placement), CongestionConfig()
    capacity = {1: 5 * MBIT, 2: 5 * MBIT}
    for now in (0.0, 0.05):                                     # both on the straight link: they collide
        placement.observe(1, {1: 5 * MBIT, 2: 0.0}, {"a": 3 * MBIT, "b": 3 * MBIT}, capacity, config, paths, now)
    assert list(placement.overrides.values()) == ([] if shortest_only else [2])
