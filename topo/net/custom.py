"""A topology from a Mininet custom file, loaded as `mn --custom FILE --topo NAME,k=v` loads it.

FILE is Python that defines a `topos` dict of name → a Topo class or a callable that returns a Topo.
Its switch-to-switch links' `bw=` (Mbit/s) and `delay=` declare the link: the launcher declares both on
the link's two interfaces (external_ids:ovs-qos-capacity and ovs-qos-delay), and the controller, the one
owner of those ports' qdiscs, shapes the rate with its OVS QoS and puts netem of the delay under each
class (controller/core/queues.py). So the link itself is made a plain veth pair, never a TCLink whose
HTB or netem would fight OVS over the root qdisc. The delay needs netem, which is said once where the
kernel lacks it.
A network with a loop is refused: the controller's learning floods, and nothing here runs STP.
"""
from __future__ import annotations

import re
import runpy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.core.policy import PolicyError, delay_us


class TopologyError(ValueError):
    """A topology that cannot run; the message names the file, the field and the fix."""


@dataclass(frozen=True)
class DeclaredLink:
    """A switch-to-switch link with a rate: both its ends queue."""
    ends: tuple[tuple[str, int], tuple[str, int]]   # (switch, OpenFlow port) each
    bps: int
    delay: str | None      # one way, as written (e.g. 10ms)


@dataclass
class Loaded:
    topo: Any                      # a mininet.topo.Topo
    links: list[DeclaredLink]      # ports filled in by Mininet when the network is built (ports())
    delays: list[str]              # the links' delays, which this launcher applies only where netem exists


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


def load(spec: str, params: dict[str, Any]) -> Loaded:
    """`spec` is FILE:NAME."""
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
    return _plain(topo, f"{path}:{name}")


def _plain(topo: Any, where: str) -> Loaded:
    """Switch-to-switch links stripped of their TCLink (their bw= and delay= recorded), a loop refused."""
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
    parent = {s: s for s in switches}
    for src, dst, info in topo.links(sort=True, withInfo=True):
        if src in switches and dst in switches:
            a, b = _root(parent, src), _root(parent, dst)
            if a == b:
                raise TopologyError(f"--topo {where}: the link {src}-{dst} closes a loop; this launcher runs no STP, "
                                    "and a learning switch floods around a loop for ever: remove a link")
            parent[a] = b
            bw, delay = info.get("bw"), _delay(info.get("delay"), f"--topo {where}: link {src}-{dst}")
            for k in ("loss", "jitter"):
                if info.get(k):
                    raise TopologyError(f"--topo {where}: link {src}-{dst} {k}={info[k]!r}; a switch-to-switch link "
                                        f"takes bw= and delay= only (its ports' qdiscs are the controller's): put "
                                        f"{k}= on a host's link")
            for k in ("cls", "bw", "delay", "max_queue_size", "use_htb", "params1", "params2"):
                info.pop(k, None)
            if bw is not None:
                if isinstance(bw, bool) or not isinstance(bw, (int, float)) or bw <= 0:
                    raise TopologyError(f"--topo {where}: link {src}-{dst} bw={bw!r}; give a rate in Mbit/s, e.g. bw=5")
                links.append(DeclaredLink(((info["node1"], info["port1"]), (info["node2"], info["port2"])),
                                          int(bw * 1e6), delay))
            elif delay:
                raise TopologyError(f"--topo {where}: link {src}-{dst} delay={delay!r} without bw=; its delay goes "
                                    "above the queues the controller gives the link, which need its rate: add bw=")
            if delay:
                delays.append(f"{src}-{dst} {delay}")
        elif src not in switches and dst not in switches:
            raise TopologyError(f"--topo {where}: link {src}-{dst} joins two hosts; put a switch between them")
    return Loaded(topo, links, delays)


def _delay(value: Any, where: str) -> str | None:
    """A link's delay= as netem takes it (None, '' and 0 are none)."""
    if value in (None, "", 0):
        return None
    try:
        return str(value) if delay_us(str(value), "delay") else None
    except PolicyError:
        raise TopologyError(f"{where} delay={value!r}; write it with its unit, e.g. delay='10ms'") from None


def one_way_seconds(loaded: Loaded, src: str, dst: str) -> float:
    """The delay the declared links add from node `src` to node `dst` (without a loop there is one path)."""
    delays = {frozenset((a, b)): delay_us(link.delay, "delay") / 1e6
              for link in loaded.links if link.delay for (a, _), (b, _) in [link.ends]}
    near: dict[str, set[str]] = {}
    for a, b in loaded.topo.links():
        near.setdefault(a, set()).add(b)
        near.setdefault(b, set()).add(a)
    came: dict[str, str | None] = {src: None}
    todo = [src]
    while todo:
        node = todo.pop()
        for other in near.get(node, ()):
            if other not in came:
                came[other] = node
                todo.append(other)
    total, node = 0.0, dst
    while (before := came.get(node)) is not None:
        total += delays.get(frozenset((before, node)), 0.0)
        node = before
    return total


def _dpid(switch: str, given: Any, where: str) -> int:
    """The datapath id Mininet gives the switch: its dpid= (hex), else the first number in its name."""
    try:
        return int(str(given).replace(":", ""), 16) if given else int(re.findall(r"\d+", switch)[0])
    except (ValueError, IndexError):
        raise TopologyError(f"--topo {where}: switch {switch} has no datapath id (dpid={given!r}, and no number in "
                            "its name); give addSwitch a dpid= in hex, or a name such as s3") from None


def _root(parent: dict[str, str], node: str) -> str:
    while parent[node] != node:
        node = parent[node]
    return node
