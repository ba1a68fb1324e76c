"""The controller's own forwarding on a network with loops, against real OVS and Mininet hosts: how soon every host
reaches every other, what it costs the controller, and how long a link that fails takes from a flow.

    sudo .venv/bin/python -m bench.fabric [--topo topo/topos.py:fattree] [--topo-param k=4] [--paths adaptive]
                                          [--failovers 8] [--idle-seconds 30]

The controller runs with the policy in force before the network starts (as after a restart), so the switches
connect to a controller that forwards for them:

  reachable_seconds    the last switch connected → every host has answered a ping from every other (all pairs
                       pinged at once, again every 0.25 s until each has answered once)
  cpu_share_of_one_core, packet_ins_per_second   the controller (and its children) over --idle-seconds
                       once everything is reachable, and the packets its switches sent it, by kind
  failover_gap_ms      a ping every 10 ms between two hosts in different pods; a link of its path (each time
                       another) taken down as Mininet's `link a b down` does: the pings lost × 10 ms
  silent_gap_ms        the same with the link silenced instead (another tool's drop-all flow on both ends,
                       its ports up): found by the probes that stop crossing it

Each gap is printed with its median, p95 and max.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path
from tempfile import TemporaryDirectory

from bench.process import TICKS, controller_pid, cpu_ticks
from controller.core.policy import for_any_network, load_document
from topo.harness.controller import controller
from topo.net.custom import load, parse_params
from topo.net.network import network

METRICS = "http://127.0.0.1:9101/metrics"
REACH = r'''
targets="$1"; left="$targets"
while [ -n "$left" ]; do
  for ip in $left; do (ping -c1 -W0.25 -q "$ip" >/dev/null 2>&1 && echo "$ip $(date +%s.%N)" >> "$2") & done
  wait; sleep 0.25 & wait
  left=""; for ip in $targets; do grep -q "^$ip " "$2" 2>/dev/null || left="$left $ip"; done
done
'''


def reachable(net, seconds: float) -> float:
    """Every host pings every other until each answered once; when the last pair first answered."""
    hosts = net.hosts
    procs = []
    with TemporaryDirectory() as tmp:
        for host in hosts:
            out = Path(tmp) / host.name
            targets = " ".join(h.IP() for h in hosts if h is not host)
            procs.append(host.popen(["sh", "-c", REACH, "reach", targets, str(out)]))
        deadline = time.time() + seconds
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        return max(float(line.split()[1]) for out in Path(tmp).iterdir() for line in out.read_text().splitlines())


def packet_ins() -> dict[str, float]:
    text = urllib.request.urlopen(METRICS, timeout=5).read().decode()
    return {kind: float(value) for kind, value in
            re.findall(r'ovsqos_fabric_packet_ins_total\{kind="(\w+)"\} (\S+)', text)}


def path_links(net, src, dst) -> list[tuple[str, str]]:
    """The switch-to-switch links src's traffic to dst crosses, as the switches' routing entries say."""
    switch = src.intfList()[0].link.intf2.node
    links: list[tuple[str, str]] = []
    while True:
        flows = switch.cmd(f"ovs-ofctl -O OpenFlow13 dump-flows {switch.name} table=2,dl_dst={dst.MAC()}")
        written = re.search(r"write_metadata:0x([0-9a-f]+)/", flows)
        assert written is not None, f"{switch.name} has no route to {dst.name}: {flows}"
        port = int(written.group(1), 16)
        intf = switch.intfs[port]
        other = intf.link.intf2 if intf.link.intf1 is intf else intf.link.intf1
        if other.node in net.hosts:
            return links
        links.append((switch.name, other.node.name))
        switch = other.node


def lost_ms(net, src, dst, n: int, silent: bool) -> float:
    """Pings lost (× 10 ms) when the n-th link of the path fails (down, or silent) a second into 4 s of pings
    every 10 ms; the link is back, and found again, after."""
    links = path_links(net, src, dst)
    a, b = links[n % len(links)]
    ping = src.popen(["ping", "-i", "0.01", "-w", "4", dst.IP()], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    if silent:
        silence(net, a, b, True)
    else:
        net.configLinkStatus(a, b, "down")
    out = ping.communicate()[0]
    if silent:
        silence(net, a, b, False)
    else:
        net.configLinkStatus(a, b, "up")
    time.sleep(2.0)
    found = re.search(r"(\d+) packets transmitted, (\d+) received", out)
    assert found is not None, out
    sent, received = map(int, found.groups())
    return (sent - received) * 10.0


def silence(net, a: str, b: str, add: bool) -> None:
    for here, there in ((a, b), (b, a)):
        switch = net.get(here)
        port = next(number for intf, number in switch.ports.items()
                    if intf.link and there in (intf.link.intf1.node.name, intf.link.intf2.node.name))
        rule = f"table=0,priority=65535,in_port={port}"
        switch.cmd(f"ovs-ofctl -O OpenFlow13 {'add-flow' if add else '--strict del-flows'} {here} "
                   f"{rule + ',actions=drop' if add else rule}")


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered):.0f}  p95 {p95:.0f}  max {ordered[-1]:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topo", default="topo/topos.py:fattree")
    parser.add_argument("--topo-param", nargs="*", default=["k=4"])
    parser.add_argument("--paths", default="adaptive", choices=("one", "ecmp", "adaptive"))
    parser.add_argument("--failovers", type=int, default=8)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    args = parser.parse_args()
    loaded = load(args.topo, parse_params(args.topo_param))
    with TemporaryDirectory() as tmp, controller(Path(tmp) / "controller.log") as client:
        doc = for_any_network(load_document("policies/auto.yaml"))
        client.put_policy({**doc, "network": {**doc["network"], "paths": args.paths}})
        with network(loaded.topo, "user") as wrapped:
            net = wrapped.net
            switches = {f"{int(s.dpid, 16):016x}" for s in net.switches}
            client.wait(lambda s: switches <= set(s["switches"]), 60, "every switch connected")
            connected = time.time()
            names = set(loaded.topo.switches())
            print(f"switches {len(switches)}, hosts {len(net.hosts)}, links "
                  f"{sum(1 for a, b in loaded.topo.links() if {a, b} <= names)}")
            print(f"reachable_seconds {reachable(net, 60) - connected:.2f}", flush=True)
            pid = controller_pid()
            ticks, before, started = cpu_ticks(pid), packet_ins(), time.monotonic()
            time.sleep(args.idle_seconds)
            took = time.monotonic() - started
            share = (cpu_ticks(pid) - ticks) / TICKS / took
            rates = {k: (v - before.get(k, 0.0)) / took for k, v in packet_ins().items()}
            print(f"cpu_share_of_one_core {share:.3f}  packet_ins_per_second "
                  + ", ".join(f"{k} {v:.1f}" for k, v in sorted(rates.items())), flush=True)
            hosts = net.hosts
            pairs = [(hosts[n % len(hosts)], hosts[(n + len(hosts) // 2) % len(hosts)]) for n in range(args.failovers)]
            down = [lost_ms(net, src, dst, n, silent=False) for n, (src, dst) in enumerate(pairs)]
            silent = [lost_ms(net, src, dst, n, silent=True) for n, (src, dst) in enumerate(pairs)]
            print(f"failover_gap_ms {spread(down)}")
            print(f"silent_gap_ms {spread(silent)}")


if __name__ == "__main__":
    main()
