"""Cost of the fabric's paths in the core alone (controller/core/fabric.py, routes.py): a k-ary fat-tree's links
and hosts, every switch's FabricRules computed as a refresh computes them, and again after a link is cut.

For k = 8 (80 switches, 128 hosts, 256 links) and k = 16 (320 switches, 1024 hosts, 2048 links) it prints the
time of a whole refresh (every switch's rules, the paths behind them worked out afresh), of one after a link
between an aggregation and a core switch is cut, the largest switch's flow entries (controller/core/site.py)
and the peak memory of building the fabric's state and its rules (measured in a pass of its own).

    .venv/bin/python -m bench.bench_paths [--k 8 16] [--paths ecmp]
"""
from __future__ import annotations

import argparse
import random
import time
import tracemalloc

from controller.core.bridges import BridgeInfo
from controller.core.fabric import Fabric
from controller.core.frames import Probe
from controller.core.policy import for_any_network, load_document, parse_policy
from controller.core.site import site_switch
from controller.core.topology import EDGE_SETTLE

NOW = 100.0


def fat_tree(k: int) -> tuple[list[tuple[int, int]], dict[int, int]]:
    """Links (switch pairs, each cabled once) and hosts per edge switch: cores first, then each pod's
    aggregation and edge switches."""
    half = k // 2
    cores = list(range(1, half * half + 1))
    links: list[tuple[int, int]] = []
    hosts: dict[int, int] = {}
    next_id = len(cores) + 1
    for _ in range(k):
        aggs, edges = list(range(next_id, next_id + half)), list(range(next_id + half, next_id + k))
        next_id += k
        for i, agg in enumerate(aggs):
            links += [(agg, cores[i * half + j]) for j in range(half)]
            links += [(agg, edge) for edge in edges]
        hosts |= dict.fromkeys(edges, half)
    return links, hosts


def build(k: int, paths: str) -> tuple[Fabric, list[tuple[tuple[int, int], tuple[int, int]]]]:
    links, hosts = fat_tree(k)
    ports: dict[int, int] = {}
    cabled = []
    for a, b in links:
        ports[a], ports[b] = ports.get(a, 0) + 1, ports.get(b, 0) + 1
        cabled.append(((a, ports[a]), (b, ports[b])))
    placed = []
    for dp, count in sorted(hosts.items()):
        for _ in range(count):
            ports[dp] += 1
            placed.append((dp, ports[dp]))
    fabric = Fabric(b"key", random.Random(1))
    fabric.routes.set_mode(paths)
    for dp, count in ports.items():
        fabric.connect(dp, range(1, count + 1), (), NOW - 2 * EDGE_SETTLE)
    for n, (src, dst) in enumerate(cabled):
        fabric.topology.heard(Probe(*src, 0, n.to_bytes(8, "big"), b""), dst, NOW, 0)
    for n, end in enumerate(placed):
        fabric.hosts.learn(f"02:00:00:00:{n >> 8:02x}:{n & 0xff:02x}", end)
    return fabric, cabled


def refresh(fabric: Fabric) -> float:
    """Seconds for every switch's rules, the paths worked out afresh."""
    fabric.topology.version += 1
    started = time.perf_counter()
    for dp in fabric.topology.ports:
        fabric.rules(dp, NOW)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--paths", default="ecmp", choices=("one", "ecmp", "adaptive"))
    args = parser.parse_args()
    policy = parse_policy(for_any_network(load_document("policies/auto.yaml")))
    for k in args.k:
        tracemalloc.start()            # a pass of its own: tracing would slow the timed one
        refresh(build(k, args.paths)[0])
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        fabric, cabled = build(k, args.paths)
        whole = refresh(fabric)
        links = len(fabric.topology.peer) // 2
        (agg, core) = next((a, b) for a, b in cabled if b[0] <= (k // 2) ** 2)   # an aggregation-core link
        fabric.topology.set_ports(agg[0], set(fabric.topology.ports[agg[0]]), {agg[1]}, NOW)
        cut = refresh(fabric)
        largest = max(len(site_switch(policy, dp, BridgeInfo(f"s{dp}", "netdev", {p: f"s{dp}-eth{p}" for p in ports}),
                                      fabric.rules(dp, NOW)).flows)
                      for dp, ports in fabric.topology.ports.items())
        print(f"k={k}: {len(fabric.topology.ports)} switches, {len(fabric.hosts.at)} hosts, "
              f"{links} links ({args.paths}): every switch's rules in {whole * 1000:.1f} ms, "
              f"after a link cut {cut * 1000:.1f} ms; largest table {largest} entries; "
              f"peak memory {peak / 2**20:.1f} MiB", flush=True)


if __name__ == "__main__":
    main()
