"""A network of fake switches (tests/unit/fakes.py) cabled together, with hosts on their edge ports, under one
controller (the Harness): the controller's own forwarding (controller/core/fabric.py) tested without OVS.

Frames cross it synchronously: a switch's tables (its real OpenFlow entries, as the controller installed
them) send a frame out of ports, into the switch or host at the other end of each, or to the controller as a
packet-in, which the Harness hands to the core; the core's packet-outs leave the switch the same way. A frame
that crosses more than MAX_HOPS links is a storm: counted, and dropped. Hosts answer ARP for their address and
ICMP echo, as a Mininet host's kernel does.
"""
from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.core import events as ev
from controller.core.policy import parse_policy
from tests.unit.fakes import FakeOvsdb, FakeSwitch, Harness, read_fields

MAX_HOPS = 32
BROADCAST = "ff:ff:ff:ff:ff:ff"


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def _ip(text: str) -> bytes:
    return bytes(int(x) for x in text.split("."))


@dataclass
class Host:
    name: str
    mac: str
    ip: str
    at: tuple[int, int]
    arp: dict[str, str] = field(default_factory=dict)       # IPv4 → MAC, as its kernel caches it
    echoed: set[str] = field(default_factory=set)           # the hosts whose echo reply it received
    owed: set[str] = field(default_factory=set)             # echo replies waiting for an ARP answer
    received: int = 0                                       # frames it got


class FakeNet:
    def __init__(self, tmp: Path, links: list[tuple[int, int]], hosts: dict[int, int], policy: dict[str, Any],
                 capacity: int | None = None, put_after: float = 0.0):
        """`links`: switch pairs cabled together (ports numbered in order, links first); `hosts`: switch →
        how many hosts it has (h1, h2, ... in switch order); `capacity`: what every link's ports declare (bit/s),
        as the launcher declares a link's bw=; `put_after`: seconds between the switches connecting and the
        policy put."""
        ports: dict[int, int] = {}
        self.peer: dict[tuple[int, int], tuple[int, int]] = {}
        for a, b in links:
            ports[a], ports[b] = ports.get(a, 0) + 1, ports.get(b, 0) + 1
            self.peer[(a, ports[a])], self.peer[(b, ports[b])] = (b, ports[b]), (a, ports[a])
        self.hosts: dict[str, Host] = {}
        for dp in sorted(hosts):
            for _ in range(hosts[dp]):
                ports[dp] = ports.get(dp, 0) + 1
                n = len(self.hosts) + 1
                self.hosts[f"h{n}"] = Host(f"h{n}", f"00:00:00:00:{n // 256:02x}:{n % 256:02x}", f"10.0.{n // 256}.{n % 256}",
                                           (dp, ports[dp]))
        self.by_end = {h.at: h for h in self.hosts.values()}
        self.switches = {dp: FakeSwitch(dp, {p: f"s{dp}-eth{p}" for p in range(1, n + 1)})
                         for dp, n in sorted(ports.items())}
        for switch in self.switches.values():
            switch.net, switch.down = self, set()
            if capacity:
                switch.bridge = dataclasses.replace(switch.bridge, declared={
                    port: capacity for (dp, port) in self.peer if dp == switch.id})
        self.cut: set[tuple[int, int]] = set()                # link ends whose frames are lost (a silent failure)
        self.storms = 0
        self.crossed = 0                                      # link crossings, in all
        self.ovsdb = FakeOvsdb(*self.switches.values())
        self.app = Harness(self.ovsdb, tmp / "state.json")
        for switch in self.switches.values():
            self.app.connect(switch)
        self.app.advance(put_after)
        result, error = self.app.request(ev.SetPolicy, policy)
        assert error is None, error
        parse_policy(policy)

    # --- frames -----------------------------------------------------------------------------------------
    def leave(self, switch: FakeSwitch, port: int, data: bytes, fields: dict, hops: int) -> None:
        """A frame out of `port` of `switch`: into the switch or host at the other end."""
        end = (switch.id, port)
        if port in switch.down or end in self.cut:
            return
        if hops >= MAX_HOPS:
            self.storms += 1
            return
        if end in self.peer:
            dp, other = self.peer[end]
            if other not in self.switches[dp].down:
                self.crossed += 1
                self.switches[dp].receive(other, data, fields, hops + 1)
        elif end in self.by_end:
            self._host_gets(self.by_end[end], data)

    def send(self, host: Host, data: bytes) -> None:
        dp, port = host.at
        self.switches[dp].receive(port, data, read_fields(data), 0)

    def _host_gets(self, host: Host, data: bytes) -> None:
        dst = ":".join(f"{b:02x}" for b in data[0:6])
        if dst not in (host.mac, BROADCAST):
            return
        host.received += 1
        eth_type = int.from_bytes(data[12:14], "big")
        if eth_type == 0x0806:
            op, sha, spa, tpa = struct.unpack_from("!H6s4s", data, 20) + (data[38:42],)
            sender = ".".join(map(str, spa))
            host.arp[sender] = ":".join(f"{b:02x}" for b in sha)
            if op == 1 and ".".join(map(str, tpa)) == host.ip:
                self.send(host, arp_frame(2, host, sender, host.arp[sender]))
            if sender in host.owed:
                host.owed.discard(sender)
                self.send(host, icmp_frame(host, host.arp[sender], sender, 0))
        elif eth_type == 0x0800 and data[23] == 1:
            src = ".".join(map(str, data[26:30]))
            if data[34] == 8 and src in host.arp:
                self.send(host, icmp_frame(host, host.arp[src], src, 0))
            elif data[34] == 8:                     # its kernel asks who has the sender's address first
                host.owed.add(src)
                self.send(host, arp_frame(1, host, src, BROADCAST))
            elif data[34] == 0:
                host.echoed.add(src)

    # --- what a test does ---------------------------------------------------------------------------------
    def ping(self, a: str, b: str) -> bool:
        """`a` pings `b` once (ARP first, as a kernel does, and again while it has no answer)."""
        src, dst = self.hosts[a], self.hosts[b]
        if dst.ip not in src.arp:
            self.send(src, arp_frame(1, src, dst.ip, BROADCAST))
            self.app.settle()
        if dst.ip not in src.arp:
            return False
        src.echoed.discard(dst.ip)
        self.send(src, icmp_frame(src, src.arp[dst.ip], dst.ip, 8))
        self.app.settle()
        return dst.ip in src.echoed

    def link(self, a: int, b: int, state: str) -> None:
        """Mininet's `link sA sB down|up`: both ends' interfaces, and each switch says so."""
        for dp, other in ((a, b), (b, a)):
            ports = [p for (d, p), (o, _) in self.peer.items() if d == dp and o == other]
            switch = self.switches[dp]
            (switch.down.update if state == "down" else switch.down.difference_update)(ports)
            self.app.handle(ev.PortsChanged(self.app.conn_of(switch), switch.ports, frozenset(switch.down)))
            self.app.settle()

    def end_of(self, a: int, b: int) -> tuple[int, int]:
        return next(end for end, (o, _) in self.peer.items() if end[0] == a and o == b)

    def path(self, src: str, dst: str) -> list[tuple[int, int]]:
        """The switch ports `src`'s traffic to `dst` leaves by, as the switches' routes say now."""
        mac, (here, _) = self.hosts[dst].mac, self.hosts[src].at
        ends = []
        while here != self.hosts[dst].at[0]:
            port = dict(self.app.core.forwarding.rules[here].routes)[mac]
            ends.append((here, port))
            here = self.peer[(here, port)][0]
        return ends

    def offer(self, flows: list[tuple[str, str, float, int]], capacity: float) -> None:
        """Until the next poll: each (source, destination, bit/s, IP protocol) flow along its path, as the
        switches count it: each route entry and egress class rule its offered rate, each link port what it sends
        (at most its capacity), and what it cannot send dropped from its queue."""
        sent: dict[tuple[int, int], float] = {}
        for switch in self.switches.values():
            switch.load, switch.class_load, switch.drop_load = {}, {}, {}
        for src, dst, bps, proto in flows:
            mac = self.hosts[dst].mac
            for dp, port in self.path(src, dst):
                sent[(dp, port)] = sent.get((dp, port), 0.0) + bps
                switch = self.switches[dp]
                for table, match in ((2, {("eth_dst", mac)}), (3, {("metadata", (port, 0xFFFF_FFFF)), ("ip_proto", proto)})):
                    (cookie,) = [e.cookie for (prio, m), e in switch.tables[table].items()
                                 if match <= set(m) and (table == 2 or prio == 40000)]
                    switch.class_load[cookie] = switch.class_load.get(cookie, 0.0) + bps
        for (dp, port), bps in sent.items():
            self.switches[dp].load[port] = min(bps, capacity)
            if bps > capacity:
                self.switches[dp].drop_load[(port, 0)] = (bps - capacity) / 8 / 1500


def arp_frame(op: int, src: Host, target_ip: str, dst_mac: str) -> bytes:
    target_mac = "00:00:00:00:00:00" if op == 1 else dst_mac
    body = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, op, _mac(src.mac), _ip(src.ip), _mac(target_mac),
                       _ip(target_ip))
    return _mac(dst_mac) + _mac(src.mac) + b"\x08\x06" + body


def icmp_frame(src: Host, dst_mac: str, dst_ip: str, kind: int) -> bytes:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 0, 0, 64, 1, 0, _ip(src.ip), _ip(dst_ip))
    return _mac(dst_mac) + _mac(src.mac) + b"\x08\x00" + ip + struct.pack("!BBHHH", kind, 0, 0, 0, 0)
