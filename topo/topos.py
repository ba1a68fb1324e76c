"""Mininet topologies, registered in `topos` so `mn --custom topo/topos.py --topo qosstudy` and the
launcher build the same networks.

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


topos = {"qosstudy": StudyTopo, "dumbbell": DumbbellTopo, "parkinglot": ParkingLotTopo}
