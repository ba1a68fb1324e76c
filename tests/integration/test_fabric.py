"""The controller's own forwarding on a network with loops, on real OVS and Mininet hosts: a leaf-spine (every leaf
cabled to every spine) under the shipped `auto` policy for any network. Every host reaches every other with no
storm; a spine link cut under a 10 ms ping, or gone silent, is routed around; two TCP elephants that ECMP put on
one uplink are moved apart, and get about twice one link."""
from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request

import pytest
from mininet.topo import Topo

from controller.core.policy import for_any_network, load_document
from tests.integration.conftest import NOTHING_LEFT, leftovers, requires_ovs
from topo.harness.controller import controller
from topo.net.network import network

pytestmark = requires_ovs
LINK_MBIT = 5
METRICS = "http://127.0.0.1:9101/metrics"


class LeafSpine(Topo):
    """Spines s1, s2; leaves s11.. (datapath ids 0x11..), each cabled to every spine (ports 1, 2), hosts after."""

    def build(self, leaves=2, hosts=(2, 3)):
        spines = [self.addSwitch(f"s{i}", dpid=str(i)) for i in (1, 2)]
        n = 0
        for i in range(leaves):
            leaf = self.addSwitch(f"s1{i + 1}", dpid=f"1{i + 1}")
            for spine in spines:
                self.addLink(leaf, spine)
            for _ in range(hosts[i]):
                n += 1
                self.addLink(self.addHost(f"h{n}"), leaf)


def put(client, paths: str) -> None:
    doc = for_any_network(load_document("policies/auto.yaml"))
    client.put_policy({**doc, "network": {**doc["network"], "paths": paths}})


def declare_links(net) -> None:
    """Each spine link's rate, as the launcher declares a link's bw=: the controller shapes it."""
    for switch in net.net.switches:
        for intf in switch.intfList():
            link = intf.link
            if link and {link.intf1.node.name[0], link.intf2.node.name[0]} == {"s"}:
                switch.vsctl("set", "interface", intf.name, f"external_ids:ovs-qos-capacity={LINK_MBIT}Mbit")


def uplink(net, leaf: str, mac: str) -> int:
    """The port the leaf sends `mac`'s traffic by: its routing entry (table 2) writes it into the metadata."""
    flows = net.net.get(leaf).cmd(f"ovs-ofctl -O OpenFlow13 dump-flows {leaf} table=2,dl_dst={mac}")
    return int(re.search(r"write_metadata:0x([0-9a-f]+)/", flows).group(1), 16)


def packet_ins() -> dict[str, float]:
    text = urllib.request.urlopen(METRICS, timeout=5).read().decode()
    return {kind: float(value) for kind, value in re.findall(r'ovsqos_fabric_packet_ins_total\{kind="(\w+)"\} (\S+)',
                                                              text)}


def lost_pings(host, target, seconds: float, during) -> int:
    """A ping every 10 ms for `seconds`; `during()` runs a second in; how many went unanswered."""
    ping = host.popen(f"ping -i 0.01 -w {seconds} {target.IP()}", stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    during()
    out = ping.communicate()[0]
    sent, received = map(int, re.search(r"(\d+) packets transmitted, (\d+) received", out).groups())
    return sent - received


@pytest.fixture(scope="module")
def fabric(tmp_path_factory, recorded):
    tmp = tmp_path_factory.mktemp("fabric")
    with controller(tmp / "controller.log", recorded) as client:
        client.clear_policy()
        with network(LeafSpine(), "user", recorded) as net:
            declare_links(net)
            connected = time.monotonic()
            put(client, "adaptive")
            hosts = net.net.hosts
            while net.net.pingAll(timeout=1) > 0:
                assert time.monotonic() - connected < 10, "hosts do not reach each other within 10 s"
            reached = time.monotonic() - connected
            yield net, client, reached
            client.clear_policy()
    assert leftovers() == NOTHING_LEFT and hosts


def test_every_host_reaches_every_other_quickly_and_only_probes_reach_the_controller(fabric):
    net, client, reached = fabric
    assert reached < 5.0
    before = packet_ins()
    time.sleep(5.0)
    after = packet_ins()
    # 4 links, 2 ends each, a probe every 0.25 s: 32 a second; a storm would be thousands.
    rates = {kind: (after.get(kind, 0.0) - before.get(kind, 0.0)) / 5.0 for kind in after}
    assert 24 <= rates["probe"] <= 40 and sum(r for k, r in rates.items() if k != "probe") < 2, rates
    status = client.status()
    assert len(status["fabric"]["links"]) == 4 and len(status["fabric"]["hosts"]) == 5


def test_a_spine_link_cut_under_a_ping_loses_at_most_a_tenth_of_a_second(fabric):
    net, _, _ = fabric
    h1, h3 = net.net.get("h1"), net.net.get("h3")
    port = uplink(net, "s11", h3.MAC())
    spine = f"s{port}"                                            # s11's port 1 goes to s1, port 2 to s2
    lost = lost_pings(h1, h3, 3, lambda: net.net.configLinkStatus("s11", spine, "down"))
    assert uplink(net, "s11", h3.MAC()) != port and lost <= 10, lost
    net.net.configLinkStatus("s11", spine, "up")
    deadline = time.monotonic() + 3
    while uplink(net, "s11", h3.MAC()) != port:                   # the link is found again, and used
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_spine_link_gone_silent_is_routed_around_within_a_second(fabric):
    net, _, _ = fabric
    h1, h3 = net.net.get("h1"), net.net.get("h3")
    port = uplink(net, "s11", h3.MAC())
    spine = net.net.get(f"s{port}")
    leaf_port = next(i for i in net.net.get("s11").intfList() if i.link and spine in (i.link.intf1.node,
                                                                                      i.link.intf2.node))
    spine_port = leaf_port.link.intf2 if leaf_port.link.intf1 is leaf_port else leaf_port.link.intf1
    # Another tool's drop-all on both ends of the link: nothing crosses it, its ports stay up.
    silence = [(net.net.get("s11"), net.net.get("s11").ports[leaf_port]), (spine, spine.ports[spine_port])]

    def go_silent():
        for switch, number in silence:
            switch.cmd(f"ovs-ofctl -O OpenFlow13 add-flow {switch.name} table=0,priority=65535,in_port={number},"
                       "actions=drop")
    try:
        lost = lost_pings(h1, h3, 4, go_silent)
        assert uplink(net, "s11", h3.MAC()) != port and 0 < lost <= 120, lost
    finally:
        for switch, number in silence:
            switch.cmd(f"ovs-ofctl -O OpenFlow13 --strict del-flows {switch.name} table=0,priority=65535,"
                       f"in_port={number}")


def test_two_elephants_ecmp_put_on_one_uplink_are_moved_apart_and_get_about_two_links(fabric):
    net, client, _ = fabric
    client.wait(lambda s: len(s["fabric"]["links"]) == 4, 5, "every link found again")
    h1, h2 = net.net.get("h1"), net.net.get("h2")
    far = [net.net.get(f"h{i}") for i in (3, 4, 5)]
    # Of three hosts behind the other leaf, two share an uplink of s11 (there are two uplinks).
    a, b = next((a, b) for a in far for b in far if a is not b and uplink(net, "s11", a.MAC())
                == uplink(net, "s11", b.MAC()))
    for host in (a, b):
        host.cmd("iperf3 -s -D -1 >/dev/null 2>&1")
    time.sleep(0.5)
    clients = [src.popen(f"iperf3 -c {dst.IP()} -t 10 -J", stdout=subprocess.PIPE, text=True)
               for src, dst in ((h1, a), (h2, b))]
    results = [json.loads(c.communicate()[0]) for c in clients]
    mbit = [r["end"]["sum_received"]["bits_per_second"] / 1e6 for r in results]
    decisions = client.status()["decisions"]
    moves = [d for d in decisions if d["action"] == "move"]
    assert moves and uplink(net, "s11", a.MAC()) != uplink(net, "s11", b.MAC()), (mbit, decisions)
    assert sum(mbit) >= 1.5 * LINK_MBIT, mbit         # the first second or two, before the move, on one link
