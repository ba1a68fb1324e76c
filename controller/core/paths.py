"""Paths over the discovered links (pure): hop counts, each switch's next hops toward a destination switch,
a spanning tree for what is flooded, and the candidate paths a flow may be moved onto.

A graph is {switch: [(port, neighbour switch, its port), ...]} (controller/core/topology.py's `graph()`). Every
choice among equals is made by a hash that every member of a cluster computes alike (CRC-32, not
Python's salted `hash`), so that members compute the same paths for the switches each owns.
"""
from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterator

Graph = dict[int, list[tuple[int, int, int]]]
Path = tuple[tuple[int, int], ...]        # (switch, port it leaves by), from the first switch to the last's
MAX_PATHS = 64                            # candidate paths kept for one pair of switches
EXTRA_HOPS = 2                            # a candidate may be this many hops longer than the shortest

ONE, ECMP, ADAPTIVE = "one", "ecmp", "adaptive"
PATH_MODES = (ONE, ECMP, ADAPTIVE)


def hops_to(graph: Graph, target: int) -> dict[int, int]:
    """Each switch that can reach `target` → its hop count (links are both ways)."""
    hops = {target: 0}
    todo = deque([target])
    while todo:
        here = todo.popleft()
        for _, other, _ in graph.get(here, ()):
            if other not in hops:
                hops[other] = hops[here] + 1
                todo.append(other)
    return hops


def next_hops(graph: Graph, here: int, hops: dict[int, int]) -> list[int]:
    """The ports of `here` on a shortest path toward the switch `hops` counts to, in port order."""
    mine = hops.get(here)
    return [] if mine is None else [port for port, other, _ in graph.get(here, ()) if hops.get(other) == mine - 1]


def pick(choices: list[int], mode: str, mac: str, dp_id: int) -> int:
    """One of equal `choices` toward host `mac` from switch `dp_id`: the first (`one`), or one chosen by their
    hash (`ecmp`, `adaptive`)."""
    if mode == ONE or len(choices) == 1:
        return choices[0]
    return choices[zlib.crc32(f"{mac}/{dp_id}".encode()) % len(choices)]


def tree(graph: Graph) -> set[tuple[int, int]]:
    """The (switch, port) ends of a spanning tree of each connected part, grown breadth first from its
    lowest datapath id: what is flooded crosses these links only, so it reaches every switch once."""
    ends: set[tuple[int, int]] = set()
    reached: set[int] = set()
    for root in sorted(graph):
        if root in reached:
            continue
        reached.add(root)
        todo = deque([root])
        while todo:
            here = todo.popleft()
            for port, other, their_port in graph[here]:
                if other not in reached:
                    reached.add(other)
                    todo.append(other)
                    ends |= {(here, port), (other, their_port)}
    return ends


def candidates(graph: Graph, src: int, dst: int) -> list[Path]:
    """Loop-free paths from switch `src` to switch `dst`, at most EXTRA_HOPS longer than the shortest,
    shortest first (then in port order), at most MAX_PATHS of them."""
    hops = hops_to(graph, dst)
    found: list[Path] = []
    if src not in hops:
        return found
    for length in range(hops[src], hops[src] + EXTRA_HOPS + 1):
        for path in _walk(graph, src, dst, hops, length, (), {src}):
            found.append(path)
            if len(found) == MAX_PATHS:
                return found
    return found


def _walk(graph: Graph, here: int, dst: int, hops: dict[int, int], length: int, path: Path,
          visited: set[int]) -> Iterator[Path]:
    """The paths from `here` that reach `dst` in exactly `length` hops in all."""
    if here == dst:
        if len(path) == length:
            yield path
        return
    for port, other, _ in graph.get(here, ()):
        if other in visited or other not in hops or len(path) + 1 + hops[other] > length:
            continue
        visited.add(other)
        yield from _walk(graph, other, dst, hops, length, (*path, (here, port)), visited)
        visited.discard(other)
