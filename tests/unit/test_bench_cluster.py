"""bench/cluster.py's pure helpers: the members' ports and config, who owns what, what moved, what changed."""
from pathlib import Path

from bench.cluster import Member, changes, config_text, members, moved, owners


def test_members_have_their_own_ports_the_first_three_as_the_cluster_test_s():
    assert [(m.name, m.openflow, m.api, m.metrics) for m in members(3)] == [
        ("m1", 6653, 8080, 9101), ("m2", 6654, 8081, 9111), ("m3", 6655, 8082, 9121)]


def test_config_text_names_the_member_its_ports_and_the_etcd():
    text = config_text(Member("m2", 6654, 8081, 9111), "etcd3+http://127.0.0.1:23795", 4, Path("/tmp/m2.json"))
    assert "ofp_tcp_listen_port = 6654" in text and "ofp_tcp_listen_port = 6653" not in text
    qos, coordination = text.split("[qos]\n")[1].split("[coordination]\n")
    assert "api_port = 8081\n" in qos and "metrics_port = 9111\n" in qos and "state_file = /tmp/m2.json\n" in qos
    assert coordination == "backend_url = etcd3+http://127.0.0.1:23795\nmembership_timeout = 4\nmember = m2\n"
    assert "ovsdb" not in qos                             # the shipped default, unless the member has its own
    proxied = config_text(Member("m2", 6654, 8081, 9111, ovsdb="unix:/run/p.sock"), "etcd3+http://e", 4, Path("/s"))
    assert "ovsdb = unix:/run/p.sock\n" in proxied.split("[qos]\n")[1].split("[coordination]\n")[0]


def test_owners_are_the_members_that_say_they_master_and_own_the_switch():
    found = {"m1": {"switches": {"a": {"role": "master", "owner": "m1"}, "b": {"role": "slave", "owner": "m2"}}},
             "m2": {"switches": {"a": {"role": "slave", "owner": "m1"}, "b": {"role": "master", "owner": "m3"}}}}
    assert owners(found, ["a", "b", "c"]) == {"a": "m1", "b": None, "c": None}   # m2 masters b, etcd says m3 owns it


def test_moved_is_the_share_of_switches_whose_owner_changed():
    assert moved({"a": "m1", "b": "m2", "c": "m3", "d": "m3"}, {"a": "m1", "b": "m2", "c": "m1", "d": "m2"}) == 0.5
    assert moved({}, {}) == 0


def test_changes_name_each_port_row_and_bridge_that_differs():
    before = {"port_qos": {"p1": "q1", "p2": "q2"}, "qos": {"q1": "x"}, "queues": {"u1": "y"}, "flows": {"b": ["f"]}}
    after = {"port_qos": {"p1": "q1", "p2": "q3"}, "qos": {"q1": "x"}, "queues": {}, "flows": {"b": ["f", "g"]}}
    assert changes(before, before) == []
    assert changes(before, after) == ["port_qos p2", "queues u1", "flows of b"]


def test_the_policy_puts_every_port_in_auto_with_a_flow_per_port_or_per_bridge():
    from bench.cluster import policy
    from controller.core.policy import parse_policy
    from topo.net.bridges import plan
    bridges = plan(6, 3, prefix="c")
    for flows, count in (("port", 3), ("bridge", 1)):
        doc = policy(bridges, flows)
        parse_policy(doc)                                            # a policy the controller takes
        assert [len(s["flows"]) for s in doc["switches"].values()] == [count, count]
        assert all(p["queues"] == "auto" for s in doc["switches"].values() for p in s["ports"].values())


def test_spread_gives_the_median_the_nearest_rank_95th_percentile_and_the_max():
    from bench.cluster import spread
    assert spread([0.3, 0.1, 0.2]) == "median 0.20 p95 0.30 max 0.30"
    assert spread([k / 100 for k in range(1, 22)]) == "median 0.11 p95 0.20 max 0.21"
    assert spread([]) == "none run"                   # --kills 0
