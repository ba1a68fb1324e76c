"""A topology from a Mininet custom file, loaded as `mn --custom FILE --topo NAME,k=v` loads it.

FILE is Python that defines a `topos` dict of name → a Topo class or a callable that returns a Topo.
Its switch-to-switch links' `bw=` (Mbit/s) declares the link's rate, and `delay=`, `jitter=` and
`loss=` (percent) what the link does to its packets. The rate is shaped by the controller's OVS QoS on
both of the link's ports (the launcher declares it on their interfaces, external_ids:ovs-qos-capacity),
so the link itself is never a TCLink, whose HTB would fight OVS over the root qdisc; its delay, jitter
and loss go on a wire of their own in the link's middle (topo/net/wire.py), where the kernel has netem.
A network with a loop is refused: the controller's learning floods, and nothing here runs STP.
"""
from __future__ import annotations

import runpy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topo.net import netem
from topo.net.wire import Wire, wire_limit


class TopologyError(ValueError):
    """A topology that cannot run; the message names the file, the field and the fix."""


@dataclass(frozen=True)
class DeclaredLink:
    """A switch-to-switch link with a rate: both its ends queue."""
    ends: tuple[tuple[str, int], tuple[str, int]]   # (switch, OpenFlow port) each
    bps: int


@dataclass
class Loaded:
    topo: Any                      # a mininet.topo.Topo
    links: list[DeclaredLink]
    wires: dict[str, str]          # wire node → what it carries, e.g. "s1-s2: delay 10ms" (netem where it exists)
    rtt_seconds: float = 0.0       # what the wires add to a round trip, at most (every wire's delay, both ways)
    loss_percent: float = 0.0      # what they lose of a path's packets, at most (their losses summed)

    @property
    def hosts(self) -> list[str]:
        """The topology's hosts; wires are not."""
        return [h for h in self.topo.hosts() if h not in self.wires]


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


def load(spec: str, params: dict[str, Any], with_netem: bool = False) -> Loaded:
    """`spec` is FILE:NAME; `with_netem`: the kernel has netem, so the wires delay."""
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
    return _plain(topo, f"{path}:{name}", with_netem)


def _plain(topo: Any, where: str, with_netem: bool) -> Loaded:
    """Switch-to-switch links stripped of their TCLink (their bw= recorded; their delay=, jitter= and
    loss= moved onto a wire in their middle), a loop refused."""
    switches = set(topo.switches())
    if not switches:
        raise TopologyError(f"--topo {where}: no switch; add one with addSwitch")
    links: list[DeclaredLink] = []
    wires: dict[str, str] = {}
    rtt, lost = 0.0, 0.0
    parent = {s: s for s in switches}
    for src, dst, key, info in topo.links(sort=True, withKeys=True, withInfo=True):
        if src in switches and dst in switches:
            a, b = _root(parent, src), _root(parent, dst)
            if a == b:
                raise TopologyError(f"--topo {where}: the link {src}-{dst} closes a loop; this launcher runs no STP, "
                                    "and a learning switch floods around a loop for ever: remove a link")
            parent[a] = b
            bw = info.get("bw")
            carried = _carried(info, f"--topo {where}: link {src}-{dst}")
            for k in ("cls", "bw", "delay", "loss", "jitter", "max_queue_size", "use_htb", "params1", "params2"):
                info.pop(k, None)
            if bw is not None:
                if isinstance(bw, bool) or not isinstance(bw, (int, float)) or bw <= 0:
                    raise TopologyError(f"--topo {where}: link {src}-{dst} bw={bw!r}; give a rate in Mbit/s, e.g. bw=5")
                links.append(DeclaredLink(((info["node1"], info["port1"]), (info["node2"], info["port2"])),
                                          int(bw * 1e6)))
            if carried:
                limit = wire_limit(int(bw * 1e6) if bw else None, netem.delay_seconds(carried[0]))
                wire = _wire(topo, info, key, netem.args(*carried) if with_netem else None, limit)
                wires[wire] = f"{src}-{dst}: {' '.join(netem.args(*carried))}"
                rtt += 2 * netem.delay_seconds(carried[0])
                lost += carried[2] or 0.0
        elif src not in switches and dst not in switches:
            raise TopologyError(f"--topo {where}: link {src}-{dst} joins two hosts; put a switch between them")
    return Loaded(topo, links, wires, rtt, lost)


def _carried(info: dict[str, Any], where: str) -> tuple[str | None, str | None, float | None] | None:
    """A link's delay, jitter and loss, checked; None when it has none of them."""
    delay, jitter, loss = info.get("delay"), info.get("jitter"), info.get("loss")
    for name, value in (("delay", delay), ("jitter", jitter)):
        if value is not None and not (isinstance(value, str) and netem.DELAY.match(value)):
            raise TopologyError(f"{where} {name}={value!r}; give a time with its unit, e.g. {name}='10ms'")
    if jitter and not delay:
        raise TopologyError(f"{where} jitter={jitter!r} without a delay; give delay= too")
    if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0 <= loss <= 100):
        raise TopologyError(f"{where} loss={loss!r}; give a percentage from 0 to 100, e.g. loss=1")
    return (delay, jitter, loss) if delay or loss else None


def _wire(topo: Any, info: dict[str, Any], key: Any, netem: list[str] | None, limit: int) -> str:
    """The link `info` cut in two at a new wire node, its switches' ports kept; the wire's name."""
    k = 1
    while f"wire{k}" in topo.g.node:
        k += 1
    name = f"wire{k}"
    topo.addNode(name, cls=Wire, netem=netem, limit=limit)
    del topo.g.edge[info["node1"]][info["node2"]][key]
    topo.addLink(info["node1"], name, port1=info["port1"])
    topo.addLink(name, info["node2"], port2=info["port2"])
    return name


def _root(parent: dict[str, str], node: str) -> str:
    while parent[node] != node:
        node = parent[node]
    return node
