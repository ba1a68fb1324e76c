"""The traffic patterns data-centre studies use, by name, instead of a list of flows (pure).

Each host, in the topology's order (h1, h2, ... hN), sends one flow; who it sends to:
- stride n: host i to host (i + n) mod N (Hedera's and the Mininet-HiFi reproduction's stride(n));
- random: each host to another host drawn uniformly (several may pick the same one), from a seeded
  generator, so a run repeats;
- staggered (edge, pod): Hedera's staggered probabilities: to a host on its own edge switch with
  probability `edge`, to one elsewhere in its pod with probability `pod`, to one outside its pod
  otherwise. It needs to know which hosts share an edge switch and a pod, which a topology says with
  host_groups() (topo/topos.py's fattree and leafspine do). Where a host has no candidate of the kind
  drawn (a leaf-spine's leaves are pods of one edge each), it draws from the next kind that has one,
  wider first.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = ("stride", "random", "staggered")


@dataclass(frozen=True)
class Pattern:
    kind: str                 # one of KINDS
    n: int = 1                # stride
    seed: int = 0             # random, staggered
    edge: float = 0.0         # staggered: the share of flows to the sender's own edge switch
    pod: float = 0.0          # staggered: to its pod, outside its edge switch


class PatternError(ValueError):
    """The pattern cannot be laid on these hosts; the message says why."""


def pairs(pattern: Pattern, hosts: list[str], groups: dict[str, tuple[str, str]] | None) -> list[tuple[str, str]]:
    """(sender, receiver) for each host, in the order of `hosts`; `groups`: each host's (edge switch, pod)."""
    if len(hosts) < 2:
        raise PatternError(f"{pattern.kind} needs two hosts or more; the topology has {len(hosts)}")
    if pattern.kind == "stride":
        if not 1 <= pattern.n < len(hosts):
            raise PatternError(f"stride n={pattern.n} must be from 1 to {len(hosts) - 1} (the topology has "
                               f"{len(hosts)} hosts)")
        return [(h, hosts[(i + pattern.n) % len(hosts)]) for i, h in enumerate(hosts)]
    draw = random.Random(pattern.seed)
    if pattern.kind == "random":
        return [(h, draw.choice([o for o in hosts if o != h])) for h in hosts]
    if groups is None or any(h not in groups for h in hosts):
        raise PatternError("staggered needs each host's edge switch and pod, which this topology does not give "
                           "(its Topo has no host_groups()); use stride or random, or give the Topo host_groups()")
    out = []
    for h in hosts:
        edge, pod = groups[h]
        near = [o for o in hosts if o != h and groups[o][0] == edge]
        pod_mates = [o for o in hosts if groups[o][1] == pod and groups[o][0] != edge]
        far = [o for o in hosts if groups[o][1] != pod]
        roll = draw.random()
        kinds = [near, pod_mates, far] if roll < pattern.edge else \
            [pod_mates, far, near] if roll < pattern.edge + pattern.pod else [far, pod_mates, near]
        out.append((h, draw.choice(next(k for k in kinds if k))))
    return out
