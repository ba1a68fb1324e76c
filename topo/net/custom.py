"""A topology from a Mininet custom file, loaded as `mn --custom FILE --topo NAME,k=v` loads it.

FILE is Python that defines a `topos` dict of name → a Topo class or a callable that returns a Topo.
Its switch-to-switch links' `bw=` (Mbit/s) and `delay=` declare the link: the launcher declares both on
the link's two interfaces (external_ids:ovs-qos-capacity and ovs-qos-delay), and the controller, the one
owner of those ports' qdiscs, shapes the rate with its OVS QoS and puts netem of the delay under each
class (controller/core/queues.py). So the link itself is made a plain veth pair, never a TCLink whose
HTB or netem would fight OVS over the root qdisc. The delay needs netem, which is said once where the
kernel lacks it.
A host's link with `bw=` is shaped at both ends, by whoever owns each end's root qdisc: the host's end
(in the host's namespace, which OVS never touches) is Mininet's TCLink at that rate, with the link's
delay, loss and jitter: what the host sends. The switch's end is a plain port declared as a switch
link's is, so what the host receives queues there under the policy (a TCLink's HTB there would be
replaced by the controller's QoS, or fight it). A host link without bw= is left as written.
Loops are the controller's to handle (it finds the links and forwards loop-free): the launcher builds
any graph, and needs to know nothing of how the controller forwards.
"""
from __future__ import annotations

import heapq
import re
import runpy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mininet.link import TCLink
from mininet.topo import Topo

from controller.core.policy import PolicyError, delay_us

NONBLOCKING_SWITCH = "nb"   # the one switch of a non-blocking trial (nonblocking_topo()), datapath id 1
_SHAPING = ("bw", "delay", "loss", "jitter", "max_queue_size", "use_htb")


class TopologyError(ValueError):
    """A topology that cannot run; the message names the file, the field and the fix."""


@dataclass(frozen=True)
class DeclaredLink:
    """A link with a rate: its switch ends queue (both of a switch-to-switch link, one of a host's)."""
    ends: tuple[tuple[str, int], tuple[str, int]]   # (node, port) each: an OpenFlow port on a switch
    bps: int
    delay: str | None      # one way, as written (e.g. 10ms)
    queued: tuple[tuple[str, int], ...]             # the ends on switches


@dataclass
class Loaded:
    topo: Any                      # a mininet.topo.Topo
    links: list[DeclaredLink]
    delays: list[str]              # the links' delays, which this launcher applies only where netem exists
    groups: dict[str, tuple[str, str]] | None = None   # each host's edge switch and pod (Topo.host_groups())

    def hosts(self) -> list[str]:
        """The hosts in the topology's order (h1, h2, ... h10: Mininet's natural sort)."""
        return list(self.topo.hosts(sort=True))

    def linked(self, a: str, b: str) -> bool:
        return any({a, b} == {x, y} for x, y in self.topo.links())

    def neighbours(self, node: str) -> list[str]:
        return sorted({y if x == node else x for x, y in self.topo.links() if node in (x, y)})


def parse_params(texts: list[str]) -> dict[str, Any]:
    """--topo-param k=v ...: numbers as numbers (as mn reads NAME,k=v), anything else as text."""
    params: dict[str, Any] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.isidentifier():
            raise TopologyError(f"--topo-param {text!r}: write NAME=VALUE, e.g. n=3")
        params[key] = _value(value)
    return params


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def load(spec: str, params: dict[str, Any], nonblocking: bool = False) -> Loaded:
    """`spec` is FILE:NAME; with `nonblocking`, its hosts on one switch instead (nonblocking_topo())."""
    file, sep, name = spec.rpartition(":")
    if not sep or not file or not name:
        raise TopologyError(f"--topo {spec!r}: write FILE:NAME, e.g. topo/topos.py:parkinglot")
    path = Path(file)
    if not path.is_file():
        raise TopologyError(f"--topo {spec}: no file {path}; give the path of a Mininet custom file")
    try:
        scope = runpy.run_path(str(path))
    except Exception as err:   # a user's Python: whatever it raises is its own error, said in a line
        raise TopologyError(f"--topo {path}: the file does not load ({type(err).__name__}: {err}); fix it "
                            f"(mn --custom {path} shows the same)") from None
    topos = scope.get("topos")
    if not isinstance(topos, dict) or not topos:
        raise TopologyError(f"--topo {path}: no topos dict; define topos = {{'NAME': YourTopo}}, as mn --custom "
                            "expects")
    if name not in topos:
        raise TopologyError(f"--topo {path}:{name}: no topology {name!r}; the file has {', '.join(map(str, topos))}")
    try:
        topo = topos[name](**params)
    except Exception as err:
        raise TopologyError(f"--topo {path}:{name}: building it failed ({type(err).__name__}: {err}); check "
                            "--topo-param against its parameters") from None
    return _plain(nonblocking_topo(topo, f"{path}:{name}") if nonblocking else topo, f"{path}:{name}")


def nonblocking_topo(topo: Any, where: str) -> Any:
    """`topo`'s hosts, in its order, on one switch that blocks nothing: each by a link with its own link's
    options (its rate, delay, loss), so what a host may send and receive is what it was; the rest of the
    network is gone, so nothing but the hosts' own links limits them: the optimum a policy is held to."""
    one = Topo()
    switch = one.addSwitch(NONBLOCKING_SWITCH, dpid="1")
    for host in topo.hosts(sort=True):
        links = [info for a, b, info in topo.links(withInfo=True) if host in (a, b)]
        if len(links) != 1:
            raise TopologyError(f"--topo {where}: host {host} has {len(links)} links; a non-blocking switch takes "
                                "hosts of one link each")
        options = {k: v for k, v in links[0].items() if k not in ("node1", "node2", "port1", "port2")}
        if topo.isSwitch(links[0]["node1"]):      # the host's end's own options are params1 on it
            options["params1"], options["params2"] = options.pop("params2", {}), options.pop("params1", {})
        one.addHost(host, **topo.nodeInfo(host))
        one.addLink(host, switch, **options)
    return one


def _plain(topo: Any, where: str) -> Loaded:
    """Switch-to-switch links stripped of their TCLink (their bw= and delay= recorded), a host's link with a
    bw= shaped by a TCLink at its host's end only (its switch end recorded)."""
    switches = set(topo.switches())
    if not switches:
        raise TopologyError(f"--topo {where}: no switch; add one with addSwitch")
    named: dict[int, str] = {}
    for switch in sorted(switches):
        dp_id = _dpid(switch, topo.nodeInfo(switch).get("dpid"), where)
        if dp_id in named:
            raise TopologyError(f"--topo {where}: switches {named[dp_id]} and {switch} both get datapath id {dp_id:x} "
                                "(Mininet takes it from the first number in the name); rename one, or give "
                                "addSwitch a dpid=")
        named[dp_id] = switch
    links: list[DeclaredLink] = []
    delays: list[str] = []
    for src, dst, info in topo.links(sort=True, withInfo=True):
        ends = ((info["node1"], info["port1"]), (info["node2"], info["port2"]))
        queued: tuple[tuple[str, int], ...]
        if src not in switches and dst not in switches:
            raise TopologyError(f"--topo {where}: link {src}-{dst} joins two hosts; put a switch between them")
        bw, delay = info.get("bw"), _delay(info.get("delay"), f"--topo {where}: link {src}-{dst}")
        if bw is not None and (isinstance(bw, bool) or not isinstance(bw, (int, float)) or bw <= 0):
            raise TopologyError(f"--topo {where}: link {src}-{dst} bw={bw!r}; give a rate in Mbit/s, e.g. bw=5")
        if src in switches and dst in switches:
            for k in ("loss", "jitter"):
                if info.get(k):
                    raise TopologyError(f"--topo {where}: link {src}-{dst} {k}={info[k]!r}; a switch-to-switch link "
                                        f"takes bw= and delay= only (its ports' qdiscs are the controller's): put "
                                        f"{k}= on a host's link")
            if bw is None and delay:
                raise TopologyError(f"--topo {where}: link {src}-{dst} delay={delay!r} without bw=; its delay goes "
                                    "above the queues the controller gives the link, which need its rate: add bw=")
            for k in ("cls", *_SHAPING, "params1", "params2"):
                info.pop(k, None)
            queued = ends
        elif bw is not None:
            _host_end_shaped(info, info["node1"] not in switches)
            queued = tuple(end for end in ends if end[0] in switches)
        else:
            continue
        if bw is not None:
            links.append(DeclaredLink(ends, int(bw * 1e6), delay, queued))
        if delay:
            delays.append(f"{src}-{dst} {delay}")
    return Loaded(topo, links, delays, _groups(topo, where))


def _host_end_shaped(info: dict[str, Any], host_first: bool) -> None:
    """A host's link as a TCLink whose shaping (rate, delay, loss, jitter) is on the host's end only."""
    shaping = {k: info.pop(k) for k in _SHAPING if k in info}
    own, other = ("params1", "params2") if host_first else ("params2", "params1")
    info[own] = {**info.get(own, {}), **shaping}
    info[other] = {k: v for k, v in info.get(other, {}).items() if k not in _SHAPING}
    info["cls"] = TCLink


def _groups(topo: Any, where: str) -> dict[str, tuple[str, str]] | None:
    """Topo.host_groups(): each host's edge switch and pod, where the topology says (staggered traffic)."""
    say = getattr(topo, "host_groups", None)
    if say is None:
        return None
    groups = say()
    hosts = set(topo.hosts())
    if not isinstance(groups, dict) or set(groups) != hosts or not all(
            isinstance(g, tuple) and len(g) == 2 and g[0] in topo.switches() for g in groups.values()):
        raise TopologyError(f"--topo {where}: host_groups() must give every host (edge switch, pod); fix it")
    return groups


def _delay(value: Any, where: str) -> str | None:
    """A link's delay= as netem takes it (None, '' and 0 are none)."""
    if value in (None, "", 0):
        return None
    try:
        return str(value) if delay_us(str(value), "delay") else None
    except PolicyError:
        raise TopologyError(f"{where} delay={value!r}; write it with its unit, e.g. delay='10ms'") from None


def one_way_seconds(loaded: Loaded, src: str, dst: str) -> float:
    """The delay the declared links add from node `src` to node `dst`, on the path of least declared delay
    (of those, the fewest hops): where a network has several paths, the one the controller may choose is
    not known here, and this is the least a packet can meet."""
    delays = {frozenset(e[0] for e in link.ends): delay_us(link.delay, "delay") / 1e6
              for link in loaded.links if link.delay}
    near: dict[str, set[str]] = {}
    for a, b in loaded.topo.links():
        near.setdefault(a, set()).add(b)
        near.setdefault(b, set()).add(a)
    best = {src: (0.0, 0)}
    todo = [(0.0, 0, src)]
    while todo:
        cost, hops, node = heapq.heappop(todo)
        if node == dst:
            return cost
        if (cost, hops) > best[node]:
            continue
        for other in near.get(node, ()):
            found = (cost + delays.get(frozenset((node, other)), 0.0), hops + 1)
            if found < best.get(other, (float("inf"), 0)):
                best[other] = found
                heapq.heappush(todo, (*found, other))
    return 0.0


def _dpid(switch: str, given: Any, where: str) -> int:
    """The datapath id Mininet gives the switch: its dpid= (hex), else the first number in its name."""
    try:
        return int(str(given).replace(":", ""), 16) if given else int(re.findall(r"\d+", switch)[0])
    except (ValueError, IndexError):
        raise TopologyError(f"--topo {where}: switch {switch} has no datapath id (dpid={given!r}, and no number in "
                            "its name); give addSwitch a dpid= in hex, or a name such as s3") from None
