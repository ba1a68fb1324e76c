"""Mininet topologies, registered in `topos` so `mn --custom topo/topos.py --topo qosstudy` and the
launcher build the same networks: the study's, a dumbbell, a parking lot, and two data-centre fabrics
with loops and spare paths, a k-ary fat-tree and a leaf-spine (their host_groups() say which hosts
share an edge switch and a pod, for staggered traffic: topo/net/patterns.py).

Switch-to-switch links are plain veth pairs: the bottleneck's rate is shaped by the controller's
OVS QoS on the switch ports, the only owner of their root qdisc (a TCLink there would fight OVS
over it). Delay, where netem exists, goes on the host side of the end hosts' links, one per
direction of the h1–h4 path, away from the QoS ports.
Port numbers follow the study's flow entries: s1 port 1 → s2, 2 → h2, 3 → h1; s2 port 1 → s1,
3 → h3, 4 → h4.
"""
from mininet.link import TCLink
from mininet.topo import Topo

BOTTLENECK = "s1-eth1"   # s1's port to s2, in both topologies: where the data's traffic queues


def _delayed(delay, loss=None):
    """netem on the host side of a link: `delay` and `loss` (percent) on the packets the host sends."""
    params = {**({"delay": delay} if delay else {}), **({"loss": loss} if loss else {})}
    return {"cls": TCLink, "params1": params} if params else {}


class StudyTopo(Topo):
    """h1, h2 on s1; h3, h4 on s2; s1–s2 is the bottleneck (`bw` Mbit/s, declared for the controller when
    given); `delay` one way and `loss` (percent) on each direction of the h1–h4 path."""

    def build(self, delay=None, loss=None, bw=None):
        s1, s2 = self.addSwitch("s1", dpid="1"), self.addSwitch("s2", dpid="2")
        self.addLink(s1, s2, port1=1, port2=1, **({"bw": bw} if bw else {}))
        for name, switch, port, delayed in (("h1", s1, 3, True), ("h2", s1, 2, False),
                                            ("h3", s2, 3, False), ("h4", s2, 4, True)):
            self.addLink(self.addHost(name), switch, port2=port, **(_delayed(delay, loss) if delayed else {}))


class DumbbellTopo(Topo):
    """n senders on s1, n receivers on s2, s1–s2 the bottleneck (`bw` Mbit/s, declared for the controller
    when given); host ports 2.. on each side."""

    def build(self, n=5, delay=None, bw=None):
        s1, s2 = self.addSwitch("s1", dpid="1"), self.addSwitch("s2", dpid="2")
        self.addLink(s1, s2, port1=1, port2=1, **({"bw": bw} if bw else {}))
        for i in range(1, n + 1):
            self.addLink(self.addHost(f"snd{i}"), s1, port2=i + 1, **_delayed(delay))
            self.addLink(self.addHost(f"rcv{i}"), s2, port2=i + 1)


class ParkingLotTopo(Topo):
    """n bottlenecks in a line: s1 – s2 – ... – s(n+1), each link `bw` Mbit/s (the last one `last_bw`, when
    given: the tighter one). Two hosts on each switch, h1 h2 on s1, h3 h4 on s2, ...: h1 to the last
    switch's hosts crosses every bottleneck, and the hosts of the switches between send cross traffic over
    one or a few. The links' bw= and `delay` (one way, e.g. '10ms') are what the launcher declares to the
    controller (topo/net/custom.py); `mn --custom topo/topos.py --topo parkinglot` builds it too (without a
    TCLink, mn ignores bw= and delay=)."""

    def build(self, n=2, bw=5, last_bw=None, delay=None):
        switches = [self.addSwitch(f"s{i + 1}", dpid=str(i + 1)) for i in range(n + 1)]
        for i, (a, b) in enumerate(zip(switches, switches[1:])):
            self.addLink(a, b, bw=last_bw if last_bw and i == n - 1 else bw, **({"delay": delay} if delay else {}))
        for i, switch in enumerate(switches):
            for k in (1, 2):
                self.addLink(self.addHost(f"h{2 * i + k}"), switch)


def _rated(bw):
    return {"bw": bw} if bw else {}


class FatTreeTopo(Topo):
    """The k-ary fat-tree (Al-Fares et al., SIGCOMM 2008; Hedera's), k even: (k/2)^2 core switches, k pods
    of k/2 aggregation and k/2 edge switches, k/2 hosts on each edge switch; every link `bw` Mbit/s when
    given (declared for the controller: topo/net/custom.py). k=4: 16 hosts, 20 switches, 48 links.

    Names say where a node is: core1..core(k/2)^2; p1agg1 is pod 1's first aggregation switch, p1edge2 its
    second edge switch; hosts h1..h(k^3/4) in pod order (h1, h2 on p1edge1). Datapath ids say it too, in
    hex: core i is 1000i (core 3: 0x10003), aggregation switch i of pod p is 20ppi, edge 30ppi (p1edge2:
    0x30102). Ports: an edge switch's 1..k/2 go up to its pod's aggregation switches, k/2+1..k to its
    hosts; an aggregation switch's 1..k/2 go up to the cores, k/2+1..k down to the edges; a core's port p
    to pod p. Aggregation switch i of every pod reaches cores (i-1)k/2+1 .. ik/2."""

    def build(self, k=4, bw=None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 2 or k % 2:
            raise ValueError(f"k={k!r}: a fat-tree's k is an even whole number, 2 or more (e.g. k=4)")
        half = k // 2
        cores = [self.addSwitch(f"core{i}", dpid=f"{0x10000 + i:x}") for i in range(1, half * half + 1)]
        self._groups = {}
        for pod in range(1, k + 1):
            aggs = [self.addSwitch(f"p{pod}agg{i}", dpid=f"{0x20000 + pod * 0x100 + i:x}")
                    for i in range(1, half + 1)]
            edges = [self.addSwitch(f"p{pod}edge{i}", dpid=f"{0x30000 + pod * 0x100 + i:x}")
                     for i in range(1, half + 1)]
            for i, agg in enumerate(aggs):
                for j in range(half):
                    self.addLink(agg, cores[i * half + j], port1=j + 1, port2=pod, **_rated(bw))
                for j, edge in enumerate(edges):
                    self.addLink(edge, agg, port1=i + 1, port2=half + j + 1, **_rated(bw))
            for edge in edges:
                for m in range(half):
                    host = self.addHost(f"h{len(self._groups) + 1}")
                    self.addLink(host, edge, port2=half + m + 1, **_rated(bw))
                    self._groups[host] = (edge, f"pod{pod}")

    def host_groups(self):
        """Each host's edge switch and pod."""
        return dict(self._groups)


class LeafSpineTopo(Topo):
    """A two-tier Clos: `spines` spine switches, `leaves` leaf switches each linked to every spine,
    `hosts_per_leaf` hosts on each leaf; every link `bw` Mbit/s when given. spine1.., leaf1.. (datapath ids 0x1000i and
    0x2000i), hosts h1..hN in leaf order; a leaf's ports 1..spines go up to the spines, the rest to its hosts;
    a spine's port i to leaf i. A leaf-spine has no pods: each leaf is its own (host_groups())."""

    def build(self, spines=2, leaves=3, hosts_per_leaf=2, bw=None):
        for name, value in (("spines", spines), ("leaves", leaves), ("hosts_per_leaf", hosts_per_leaf)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: a whole number, 1 or more")
        tops = [self.addSwitch(f"spine{i}", dpid=f"{0x10000 + i:x}") for i in range(1, spines + 1)]
        self._groups = {}
        for i in range(1, leaves + 1):
            leaf = self.addSwitch(f"leaf{i}", dpid=f"{0x20000 + i:x}")
            for j, spine in enumerate(tops):
                self.addLink(leaf, spine, port1=j + 1, port2=i, **_rated(bw))
            for m in range(hosts_per_leaf):
                host = self.addHost(f"h{len(self._groups) + 1}")
                self.addLink(host, leaf, port2=spines + m + 1, **_rated(bw))
                self._groups[host] = (leaf, leaf)

    def host_groups(self):
        """Each host's leaf, which is its pod too."""
        return dict(self._groups)


topos = {"qosstudy": StudyTopo, "dumbbell": DumbbellTopo, "parkinglot": ParkingLotTopo, "fattree": FatTreeTopo,
         "leafspine": LeafSpineTopo}
