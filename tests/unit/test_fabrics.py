"""Networks with loops and spare paths, and what data-centre experiments run on them, before anything starts:
topo/topos.py's fat-tree and leaf-spine as Mininet would build them (nodes, links, ports, datapath ids),
loops accepted, a host's link shaped at both ends by their owners, the path a flow's delay is read on,
the traffic patterns (topo/net/patterns.py) and link events of a traffic file, and an experiment's
non-blocking trial (topo/net/custom.py, trafficfile.py, experimentfile.py, the experiment's planning)."""
from __future__ import annotations

import collections
import textwrap
from pathlib import Path

import pytest
import yaml

from topo.net import custom, experimentfile, patterns, trafficfile
from topo.net.traffic import LinkState, Pause
from topo.studies.base import UsageError
from topo.studies.experiment import planning
from topo.topos import FatTreeTopo, LeafSpineTopo

ROOT = Path(__file__).resolve().parents[2]
TOPOS = ROOT / "topo" / "topos.py"


def traffic(text: str) -> trafficfile.Traffic:
    return trafficfile.parse(yaml.safe_load(text), "t.yaml")


def switch_links(topo) -> list[tuple[str, str]]:
    return [(a, b) for a, b in topo.links() if topo.isSwitch(a) and topo.isSwitch(b)]


def test_a_k4_fat_tree_has_its_16_hosts_20_switches_and_48_links_named_where_they_are():
    t = FatTreeTopo(k=4)
    assert (len(t.hosts()), len(t.switches()), len(t.links())) == (16, 20, 48)
    assert t.hosts(sort=True) == [f"h{i}" for i in range(1, 17)]
    kinds = collections.Counter("core" if s.startswith("core") else s[2:-1] for s in t.switches())
    assert kinds == {"core": 4, "agg": 8, "edge": 8}
    dpids = {s: int(t.nodeInfo(s)["dpid"], 16) for s in t.switches()}
    assert len(set(dpids.values())) == 20
    assert (dpids["core3"], dpids["p1agg2"], dpids["p4edge2"]) == (0x10003, 0x20102, 0x30402)
    # Hosts in pod order, k/2 on each edge switch; each edge switch up to both of its pod's aggregation switches,
    # each of those up to k/2 cores, each core down to every pod.
    groups = t.host_groups()
    assert [groups[f"h{i}"] for i in (1, 2, 3, 5, 16)] == [("p1edge1", "pod1"), ("p1edge1", "pod1"),
                                                           ("p1edge2", "pod1"), ("p2edge1", "pod2"),
                                                           ("p4edge2", "pod4")]
    near = collections.defaultdict(set)
    for a, b in t.links():
        near[a].add(b)
        near[b].add(a)
    assert near["p1edge1"] == {"h1", "h2", "p1agg1", "p1agg2"}
    assert near["p1agg1"] == {"p1edge1", "p1edge2", "core1", "core2"} and near["p1agg2"] >= {"core3", "core4"}
    assert near["core1"] == {f"p{p}agg1" for p in range(1, 5)}
    ports = {(a, b): (info["port1"], info["port2"]) for a, b, info in t.links(withInfo=True)}
    assert ports[("p1edge1", "p1agg2")] == (2, 3) and ports[("h2", "p1edge1")][1] == 4
    assert ports[("p3agg2", "core4")] == (2, 3)            # agg 2's second uplink, to core 4's port for pod 3


@pytest.mark.parametrize("k, hosts, switches, links", [(2, 2, 5, 6), (6, 54, 45, 162), (8, 128, 80, 384)])
def test_every_even_k_gives_the_fat_tree_counts(k, hosts, switches, links):
    t = FatTreeTopo(k=k)
    assert (len(t.hosts()), len(t.switches()), len(t.links())) == (hosts, switches, links)
    assert len({t.nodeInfo(s)["dpid"] for s in t.switches()}) == switches


def test_a_fat_trees_k_must_be_even_and_the_launcher_says_so_in_a_line():
    with pytest.raises(custom.TopologyError, match=r"building it failed \(ValueError: k=3: a fat-tree's k is an even"):
        custom.load(f"{TOPOS}:fattree", {"k": 3})


def test_a_leaf_spine_links_every_leaf_to_every_spine():
    t = LeafSpineTopo(spines=2, leaves=3, hosts_per_leaf=2)
    assert (len(t.hosts()), len(t.switches()), len(t.links())) == (6, 5, 12)
    assert sorted(switch_links(t)) == sorted((f"leaf{i}", f"spine{j}") for i in (1, 2, 3) for j in (1, 2))
    assert t.host_groups()["h3"] == ("leaf2", "leaf2")
    assert len({t.nodeInfo(s)["dpid"] for s in t.switches()}) == 5


def test_a_fabric_loads_with_its_loops_every_link_declared_and_each_hosts_link_shaped_by_its_ends_owners():
    loaded = custom.load(f"{TOPOS}:fattree", {"k": 4, "bw": 2})
    assert len(loaded.links) == 48 and {link.bps for link in loaded.links} == {2_000_000}
    host_links = [link for link in loaded.links if len(link.queued) == 1]
    assert len(host_links) == 16 and all(link.queued[0][0].startswith("p") for link in host_links)
    assert sum(len(link.queued) for link in loaded.links) == 80      # 32 switch links' both ends, 16 hosts' switch ends
    # A switch link is a plain veth; a host's link a TCLink with the rate on the host's end only.
    infos = {frozenset((a, b)): info for a, b, info in loaded.topo.links(withInfo=True)}
    assert "cls" not in infos[frozenset(("p1edge1", "p1agg1"))] and "bw" not in infos[frozenset(("p1edge1", "p1agg1"))]
    h1 = infos[frozenset(("h1", "p1edge1"))]
    assert h1["cls"].__name__ == "TCLink" and "bw" not in h1
    assert h1["params1"] == {"bw": 2} and h1["params2"] == {}        # node1 is the host
    assert loaded.groups is not None and loaded.groups["h16"] == ("p4edge2", "pod4")
    assert custom.load(f"{TOPOS}:parkinglot", {}).groups is None


def test_a_flows_delay_is_read_on_its_least_delayed_path_and_of_those_the_fewest_hops(tmp_path):
    (tmp_path / "ring.py").write_text(textwrap.dedent('''
        from mininet.topo import Topo

        class Ring(Topo):
            "s1 - s2 - s3 - s4 - s1, 10 ms on s1-s2, 2 ms on the others; h1 on s1, h2 on s2"
            def build(self):
                s = [self.addSwitch(f"s{i}") for i in range(1, 5)]
                for i, (a, b) in enumerate(zip(s, s[1:] + s[:1])):
                    self.addLink(a, b, bw=5, delay="10ms" if i == 0 else "2ms")
                self.addLink(self.addHost("h1"), s[0])
                self.addLink(self.addHost("h2"), s[1])

        topos = {"ring": Ring}
        '''))
    loaded = custom.load(f"{tmp_path / 'ring.py'}:ring", {})
    assert round(custom.one_way_seconds(loaded, "h1", "h2"), 6) == 0.006      # round the ring's far side, not 10 ms
    assert round(custom.one_way_seconds(loaded, "h2", "h1"), 6) == 0.006
    assert custom.one_way_seconds(loaded, "h1", "h1") == 0.0


def test_a_nonblocking_switch_has_the_same_hosts_each_by_a_link_like_its_own():
    loaded = custom.load(f"{TOPOS}:fattree", {"k": 4, "bw": 2}, nonblocking=True)
    topo = loaded.topo
    assert topo.switches() == [custom.NONBLOCKING_SWITCH] and topo.hosts(sort=True) == [f"h{i}" for i in range(1, 17)]
    assert len(topo.links()) == 16 and all(len(link.queued) == 1 and link.bps == 2_000_000 for link in loaded.links)
    unshaped = custom.load(f"{TOPOS}:parkinglot", {}, nonblocking=True)
    assert unshaped.links == [] and len(unshaped.topo.hosts()) == 6


@pytest.mark.parametrize("pattern, expected", [
    (patterns.Pattern("stride", n=1), [("h1", "h2"), ("h2", "h3"), ("h3", "h4"), ("h4", "h1")]),
    (patterns.Pattern("stride", n=2), [("h1", "h3"), ("h2", "h4"), ("h3", "h1"), ("h4", "h2")]),
])
def test_stride_n_sends_each_host_to_the_one_n_further(pattern, expected):
    assert patterns.pairs(pattern, ["h1", "h2", "h3", "h4"], None) == expected


def test_random_sends_each_host_elsewhere_the_same_way_for_the_same_seed():
    hosts = [f"h{i}" for i in range(1, 17)]
    one = patterns.pairs(patterns.Pattern("random", seed=1), hosts, None)
    assert one == patterns.pairs(patterns.Pattern("random", seed=1), hosts, None)
    assert one != patterns.pairs(patterns.Pattern("random", seed=2), hosts, None)
    assert [a for a, _ in one] == hosts and all(a != b for a, b in one)


def test_staggered_keeps_its_shares_of_edge_pod_and_elsewhere_and_needs_to_know_the_groups():
    t = FatTreeTopo(k=4)
    hosts, groups = t.hosts(sort=True), t.host_groups()
    kinds: collections.Counter[str] = collections.Counter()
    for seed in range(200):
        for a, b in patterns.pairs(patterns.Pattern("staggered", seed=seed, edge=0.5, pod=0.3), hosts, groups):
            kinds["edge" if groups[a][0] == groups[b][0] else "pod" if groups[a][1] == groups[b][1] else "far"] += 1
    total = sum(kinds.values())
    assert abs(kinds["edge"] / total - 0.5) < 0.03 and abs(kinds["pod"] / total - 0.3) < 0.03
    with pytest.raises(patterns.PatternError, match="staggered needs each host's edge switch and pod"):
        patterns.pairs(patterns.Pattern("staggered", edge=0.5, pod=0.3), hosts, None)
    with pytest.raises(patterns.PatternError, match="stride n=4 must be from 1 to 3"):
        patterns.pairs(patterns.Pattern("stride", n=4), hosts[:4], None)


def test_a_pattern_becomes_one_flow_per_host_named_after_it_shaped_as_written():
    t = traffic("step_seconds: 5\nsteps: 2\npattern:\n  - {kind: stride, n: 2, protocol: udp, rate: 1Mbit}\n"
                "  - {kind: random, seed: 3, start_step: 1}")
    assert t.flows == () and t.seconds == 10 and len(t.patterns) == 2
    laid = trafficfile.expanded(t, ["h1", "h2", "h3", "h4"], None)
    assert [f.name for f in laid.flows[:4]] == ["stride2_h1-h3", "stride2_h2-h4", "stride2_h3-h1", "stride2_h4-h2"]
    assert {(f.protocol, f.mbps, f.start, f.end) for f in laid.flows[:4]} == {("udp", (1.0, 1.0), 0, 10)}
    assert all(f.name.startswith("random3_") and (f.protocol, f.start) == ("tcp", 5) for f in laid.flows[4:])
    assert laid.hosts() == {"h1", "h2", "h3", "h4"} and laid.patterns == ()


@pytest.mark.parametrize("text, message", [
    ("pattern: {kind: shuffle}", "t.yaml: pattern.kind: 'shuffle' is not a pattern; use stride, random, staggered"),
    ("pattern: {kind: stride}", "t.yaml: pattern.n: missing; stride n sends host i to host i + n"),
    ("pattern: {kind: stride, n: 2, seed: 1}", "t.yaml: pattern.seed: unknown key; use one of kind, n, protocol"),
    ("pattern: {kind: staggered, edge: 0.8, pod: 0.3}", "t.yaml: pattern: edge 0.8 and pod 0.3 add up to more than 1"),
    ("pattern: {kind: staggered, edge: 2, pod: 0}", "t.yaml: pattern.edge: 2 is not a probability from 0 to 1"),
    ("pattern: [{kind: random, rate: 1Mbit}]", "t.yaml: pattern[0].rate: a TCP flow takes what the network gives it"),
    ("step_seconds: 5\nsteps: 4\nflows: [{name: a, from: h1, to: h2}]\nevents: [{at_step: 4, link: [s1, s2], "
     "state: down}]", "t.yaml: events[0].at_step: 4 is not a step of the run (0 to 3)"),
    ("flows: [{name: a, from: h1, to: h2}]\nevents: [{at_step: 0, link: [s1], state: down}]",
     "t.yaml: events[0].link: ['s1'] is not a link; name its two ends"),
    ("flows: [{name: a, from: h1, to: h2}]\nevents: [{at_step: 0, link: [s1, s2], state: broken}]",
     "t.yaml: events[0].state: 'broken' is not down or up"),
])
def test_a_bad_pattern_or_event_is_refused_in_one_line(text, message):
    with pytest.raises(trafficfile.TrafficFileError) as err:
        traffic(text)
    assert str(err.value).startswith(message), str(err.value)


def test_link_events_are_a_lane_of_their_own_first_each_at_the_start_of_its_step():
    t = traffic("step_seconds: 5\nsteps: 4\nflows: [{name: a, from: h1, to: h2}]\n"
                "events: [{at_step: 3, link: [s1, s2], state: up}, {at_step: 1, link: [s1, s2], state: down}]")
    lane, flow = trafficfile.lanes(t)
    assert flow[0].name == "a" and lane == [Pause(5), LinkState("s1", "s2", False, label="s1-s2 down"), Pause(10),
                    LinkState("s1", "s2", True, label="s1-s2 up")]


def experiment_file(tmp_path, text: str) -> experimentfile.Experiment:
    (tmp_path / "e.yaml").write_text(text)
    return experimentfile.load(tmp_path / "e.yaml")


def test_an_experiment_holds_its_trials_to_a_nonblocking_switch_with_the_same_patterns_and_no_events(tmp_path):
    e = experiment_file(tmp_path, f"topo: {TOPOS}:fattree\ntopo_params: {{k: 4, bw: 2}}\npolicy: [none, auto]\n"
                                  "nonblocking: true\ntraffic: {step_seconds: 5, steps: 2, pattern: {kind: random, "
                                  "seed: 1}, events: [{at_step: 1, link: [p1edge1, p1agg1], state: down}]}\n")
    assert [(t.name, t.policy, t.nonblocking) for t in e.trials] == \
        [("none", "none", False), ("auto", "auto", False), ("nonblocking", "none", True)]
    plan = planning.prepared(e, "e.yaml")
    none, auto, ideal = plan.experiment.trials
    assert len(none.traffic.flows) == 16 and none.traffic.flows == ideal.traffic.flows == auto.traffic.flows
    assert none.traffic.events and ideal.traffic.events == ()       # the one switch has no p1edge1-p1agg1


@pytest.mark.parametrize("traffic_text, message", [
    ("{flows: [{name: a, from: h1, to: h3}], events: [{at_step: 0, link: [s1, s3], state: down}]}",
     "e.yaml: traffic: events[0].link: s1-s3 is not a link of {topo} (s1's links go to h1, h2, s2); fix link"),
    ("{pattern: {kind: staggered, edge: 0.5, pod: 0.3}}",
     "e.yaml: traffic: pattern: staggered needs each host's edge switch and pod, which this topology does not "
     "give"),
])
def test_an_event_on_a_link_the_topology_lacks_or_staggered_on_a_topology_of_no_pods_is_one_line(
        tmp_path, traffic_text, message):
    e = experiment_file(tmp_path, f"topo: {TOPOS}:parkinglot\ntraffic: {traffic_text}\n")
    with pytest.raises(UsageError) as err:
        planning.prepared(e, "e.yaml")
    assert str(err.value).startswith(f"{tmp_path}/" + message.format(topo=f"{TOPOS}:parkinglot")), str(err.value)


def test_a_nonblocking_trial_of_its_own_and_a_bad_flag_in_an_experiment_file(tmp_path):
    e = experiment_file(tmp_path, "topo: x.py:y\ntraffic: {flows: [{name: a, from: h1, to: h2}]}\n"
                                  "trials: [{name: fifo}, {name: ideal, nonblocking: true, policy: reserve}]\n")
    assert [(t.name, t.policy, t.nonblocking) for t in e.trials] == [("fifo", "none", False), ("ideal", "reserve", True)]
    with pytest.raises(experimentfile.ExperimentFileError, match=r"e.yaml: nonblocking: 'yes please' is not true"):
        experiment_file(tmp_path, "topo: x.py:y\nnonblocking: yes please\ntraffic: {flows: [{name: a, from: h1, "
                                  "to: h2}]}\n")


def test_the_shipped_fat_tree_traffic_lays_on_its_16_hosts_and_its_experiment_holds_three_policies_to_the_optimum():
    e = experimentfile.load(ROOT / "topo" / "examples" / "fattree-experiment.yaml")
    assert [(t.name, t.policy, t.nonblocking) for t in e.trials] == \
        [("none", "none", False), ("ecmp", "ecmp", False), ("auto", "auto", False), ("nonblocking", "none", True)]
    assert e.topo == f"{TOPOS}:fattree" and e.params == {"k": 4, "bw": 2}
    loaded = custom.load(e.topo, e.params)
    laid = trafficfile.expanded(e.trials[0].traffic, loaded.hosts(), loaded.groups)
    assert (len(laid.flows), laid.seconds, laid.steps) == (32, 40, 4)
    stride, drawn = laid.flows[:16], laid.flows[16:]
    assert all(f.end == 20 and loaded.groups[f.src][1] != loaded.groups[f.dst][1] for f in stride)   # across pods
    assert all(f.start == 20 and f.end == 40 and f.name.startswith("random1_") for f in drawn)


def test_the_patterns_benchmark_runs_each_stride_and_a_random_draw_in_a_step_of_its_own():
    e = experimentfile.load(ROOT / "topo" / "examples" / "fattree-patterns-experiment.yaml")
    assert [t.name for t in e.trials] == ["none", "ecmp", "auto", "nonblocking"]
    loaded = custom.load(e.topo, e.params)
    laid = trafficfile.expanded(e.trials[0].traffic, loaded.hosts(), loaded.groups)
    assert (len(laid.flows), laid.steps, laid.seconds) == (80, 5, 50)
    for step, name in enumerate(("stride1_", "stride2_", "stride4_", "stride8_", "random1_")):
        flows = laid.flows[16 * step:16 * (step + 1)]
        assert all(f.name.startswith(name) and (f.start, f.end) == (10 * step, 10 * step + 10) for f in flows)
    in_pod = [loaded.groups[f.src][1] == loaded.groups[f.dst][1] for f in laid.flows[:64]]
    assert sum(in_pod[:16]) == 12 and sum(in_pod[16:32]) == 8 and not any(in_pod[32:64])   # strides 1, 2; 4, 8
