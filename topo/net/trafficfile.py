"""A traffic file: the flows of an experiment, by name, checked before anything starts.

    step_seconds: 10
    flows:
      - {name: bulk, from: h1, to: h5, protocol: tcp, cc: cubic}
      - {name: flood, from: h3, to: h6, protocol: udp, steps: [0, 4, 8, 12]}
      - {name: cross, from: h2, to: h4, protocol: udp, rate: 12Mbit, start_step: 2}
    probe: {from: h2, to: h6}
    ping: {from: h1, to: h5, interval: 0.2}

The experiment has `steps` steps, or as many as the longest `steps` list (every such list must have
that length), or one. A flow runs from its start (`start_step`, or `start` in seconds) for `duration` seconds or to
the end of the last step. A flow's `start` and `duration` may carry it past the last step (e.g. TCP alone
after a flood, then UDP alone after TCP): the experiment then lasts until its last flow ends, and that
time after the steps is reported as one more period. A UDP flow sends `rate` (a rate with its unit) or,
step by step, the Mbit/s of `steps` (0: it rests that step; such a flow ends with the last step). TCP
takes `cc` (the kernel's congestion control) and `streams`. `dscp` marks the flow's packets. With a
`probe`, the probe first runs alone for UNLOADED_SECONDS (the path's own RTT), then beside the flows
for the whole experiment. A `ping` (ICMP echo every `interval` seconds, 0.2 by default) runs beside
the flows for the whole experiment too.

Instead of listing flows (or beside them), `pattern` names what data-centre studies run, one flow per
host in the topology's order (topo/net/patterns.py), each shaped as a flow is (protocol, rate, cc,
start_step, duration, ...):

    pattern: {kind: stride, n: 4, protocol: tcp}          # or a list of patterns
    pattern: [{kind: random, seed: 1, duration: 20}, {kind: staggered, edge: 0.5, pod: 0.3, start_step: 2}]

Its flows are named after it and their hosts (stride4_h1-h5, random1_h3-h9, staggered0_h2-h1); they are
laid on the hosts once the topology is known (expanded()). `events` change links during the run, in
Mininet's words: `events: [{at_step: 4, link: [s1, s2], state: down}]` (and `up`), each at the start of its
step; that the link exists is checked against the topology too. Every problem is one TrafficFileError
naming the file, the field and the fix.

Pure: a document in, a Traffic out; turning it into the traffic runner's lanes is lanes().
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from controller.core import document
from topo.net import patterns
from topo.net.traffic import Flow, Item, LinkState, Pause, Ping, Probe

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(bit|kbit|mbit|gbit)\s*$", re.IGNORECASE)
_UNITS = {"bit": 1e-6, "kbit": 1e-3, "mbit": 1.0, "gbit": 1e3}
MAX_SECONDS = 24 * 3600
UNLOADED_SECONDS = 4         # the probe alone before the flows: the path's RTT with nothing queued


class TrafficFileError(ValueError):
    """A traffic file that cannot run; the message names the file, the field and the fix."""


_mapping = partial(document.mapping, error=TrafficFileError)
_keys = partial(document.known_keys, error=TrafficFileError, kind="traffic")
_whole = partial(document.whole, error=TrafficFileError)


@dataclass(frozen=True)
class FlowSpec:
    name: str
    src: str
    dst: str
    protocol: str                        # tcp | udp
    start: int                           # seconds from the experiment's start
    end: int                             # seconds from the experiment's start
    cc: str | None = None
    streams: int = 1
    mbps: tuple[float, ...] = ()         # UDP: the rate in each period (a constant rate: the same in every one)
    dscp: int | None = None

    @property
    def udp(self) -> bool:
        return self.protocol == "udp"


@dataclass(frozen=True)
class PatternSpec:
    pattern: patterns.Pattern
    flow: FlowSpec                       # each of its flows, but for its name's end, its from and its to
    where: str                           # the file and field: what the topology refuses is said there


@dataclass(frozen=True)
class LinkEvent:
    at_step: int
    link: tuple[str, str]
    up: bool
    where: str

    @property
    def state(self) -> str:
        return "up" if self.up else "down"


@dataclass(frozen=True)
class Traffic:
    step_seconds: int
    steps: int
    flows: tuple[FlowSpec, ...]
    probe: tuple[str, str] | None
    ping: tuple[str, str, float] | None = None      # from, to, interval (s)
    patterns: tuple[PatternSpec, ...] = ()          # not yet laid on the hosts (expanded())
    events: tuple[LinkEvent, ...] = ()

    @property
    def grid_seconds(self) -> int:
        """Where the last step ends."""
        return self.step_seconds * self.steps

    @property
    def seconds(self) -> int:
        """How long the experiment lasts: its steps, or longer if a flow runs past them."""
        return max([self.grid_seconds, *(f.end for f in self.flows), *(p.flow.end for p in self.patterns)])

    def periods(self) -> list[tuple[int, int]]:
        """(start, end) in seconds of each step, and of the time after the last step if a flow runs on."""
        size = self.step_seconds
        spans = [(k * size, (k + 1) * size) for k in range(self.steps)]
        return spans + ([(self.grid_seconds, self.seconds)] if self.seconds > self.grid_seconds else [])

    def hosts(self) -> set[str]:
        return {h for f in self.flows for h in (f.src, f.dst)} | set(self.probe or ()) | set((self.ping or ())[:2])


def load(path: Path) -> Traffic:
    return parse(document.read_yaml(path, str(path), error=TrafficFileError, what="traffic file"), str(path))


def parse(doc: Any, where: str = "traffic") -> Traffic:
    doc = _mapping(doc, where)
    _keys(doc, where, ("step_seconds", "steps", "flows", "pattern", "probe", "ping", "events"))
    step_seconds = _whole(doc.get("step_seconds", 10), f"{where}: step_seconds", 2, MAX_SECONDS)
    flows_doc = doc.get("flows", [])
    pattern_doc = doc.get("pattern", [])
    patterns_doc = pattern_doc if isinstance(pattern_doc, list) else [pattern_doc]
    if not isinstance(flows_doc, list) or not (flows_doc or patterns_doc):
        raise TrafficFileError(f"{where}: flows: missing or empty; list the flows, e.g. "
                               "- {name: bulk, from: h1, to: h4, protocol: tcp}, or name a pattern, e.g. "
                               "pattern: {kind: stride, n: 4}")
    lengths = [len(f["steps"]) for f in (*flows_doc, *patterns_doc)
               if isinstance(f, dict) and isinstance(f.get("steps"), list)]
    steps = _whole(doc["steps"], f"{where}: steps", 1, 1000) if "steps" in doc else max(lengths, default=1)
    flows = tuple(_flow(f, f"{where}: flows[{i}]", step_seconds, steps) for i, f in enumerate(flows_doc))
    one = not isinstance(pattern_doc, list)
    specs = tuple(_pattern(d, f"{where}: pattern" + ("" if one else f"[{i}]"), step_seconds, steps)
                  for i, d in enumerate(patterns_doc))
    if Traffic(step_seconds, steps, flows, None, patterns=specs).seconds > step_seconds * steps:
        flows = tuple(_on_past_the_steps(f) for f in flows)     # a constant rate goes on past them
        specs = tuple(replace(p, flow=_on_past_the_steps(p.flow)) for p in specs)
    _named_once(flows, f"{where}: flows")
    probe = None
    if doc.get("probe") is not None:
        p = _mapping(doc["probe"], f"{where}: probe")
        _keys(p, f"{where}: probe", ("from", "to"))
        probe = (_host(p.get("from"), f"{where}: probe.from"), _host(p.get("to"), f"{where}: probe.to"))
    ping = None
    if doc.get("ping") is not None:
        p = _mapping(doc["ping"], f"{where}: ping")
        _keys(p, f"{where}: ping", ("from", "to", "interval"))
        interval = p.get("interval", 0.2)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0.01 <= interval <= 10:
            raise TrafficFileError(f"{where}: ping.interval: {interval!r} is not seconds from 0.01 to 10; e.g. 0.2")
        ping = (_host(p.get("from"), f"{where}: ping.from"), _host(p.get("to"), f"{where}: ping.to"), float(interval))
    events_doc = doc.get("events", [])
    if not isinstance(events_doc, list):
        raise TrafficFileError(f"{where}: events: not a list; e.g. events: [{{at_step: 2, link: [s1, s2], "
                               "state: down}]")
    events = tuple(_event(e, f"{where}: events[{i}]", steps) for i, e in enumerate(events_doc))
    return Traffic(step_seconds, steps, flows, probe, ping, specs, events)


def expanded(traffic: Traffic, hosts: list[str], groups: dict[str, tuple[str, str]] | None) -> Traffic:
    """`traffic` with its patterns laid on `hosts` (the topology's, in its order; `groups`: each host's
    edge switch and pod, where the topology says)."""
    flows = list(traffic.flows)
    for spec in traffic.patterns:
        try:
            pairs = patterns.pairs(spec.pattern, hosts, groups)
        except patterns.PatternError as err:
            raise TrafficFileError(f"{spec.where}: {err}") from None
        flows += [replace(spec.flow, name=f"{spec.flow.name}_{a}-{b}", src=a, dst=b) for a, b in pairs]
        _named_once(flows, spec.where)
    return replace(traffic, flows=tuple(flows), patterns=())


def _on_past_the_steps(f: FlowSpec) -> FlowSpec:
    """A UDP flow of one rate keeps it in the period after the steps."""
    return replace(f, mbps=f.mbps + f.mbps[-1:]) if f.udp and len(set(f.mbps)) == 1 else f


def _named_once(flows: tuple[FlowSpec, ...] | list[FlowSpec], where: str) -> None:
    names = [f.name for f in flows]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise TrafficFileError(f"{where}: two flows are named {twice}; give each flow its own name")


_PATTERN_KEYS = {"stride": ("n",), "random": ("seed",), "staggered": ("edge", "pod", "seed")}


def _pattern(doc: Any, where: str, step_seconds: int, steps: int) -> PatternSpec:
    doc = _mapping(doc, where)
    kind = doc.get("kind")
    if kind not in _PATTERN_KEYS:
        raise TrafficFileError(f"{where}.kind: {kind!r} is not a pattern; use {', '.join(_PATTERN_KEYS)}")
    own = _PATTERN_KEYS[kind]
    _keys(doc, where, ("kind", *own, *_SHAPE_KEYS))
    seed = _whole(doc.get("seed", 0), f"{where}.seed", 0, 2**32 - 1)
    if kind == "stride":
        if "n" not in doc:
            raise TrafficFileError(f"{where}.n: missing; stride n sends host i to host i + n, e.g. n: 4")
        pattern = patterns.Pattern(kind, n=_whole(doc["n"], f"{where}.n", 1, 100_000))
        label = f"stride{pattern.n}"
    elif kind == "random":
        pattern, label = patterns.Pattern(kind, seed=seed), f"random{seed}"
    else:
        edge, pod = (_share(doc.get(k), f"{where}.{k}") for k in ("edge", "pod"))
        if edge + pod > 1:
            raise TrafficFileError(f"{where}: edge {edge:g} and pod {pod:g} add up to more than 1; the rest goes "
                                   "outside the pod, so keep their sum at most 1")
        pattern, label = patterns.Pattern(kind, seed=seed, edge=edge, pod=pod), f"staggered{seed}"
    shape = {k: v for k, v in doc.items() if k in _SHAPE_KEYS}
    return PatternSpec(pattern, _shaped(shape, where, label, "", "", step_seconds, steps), where)


def _share(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise TrafficFileError(f"{where}: {value!r} is not a probability from 0 to 1; e.g. 0.5")
    return float(value)


def _event(doc: Any, where: str, steps: int) -> LinkEvent:
    doc = _mapping(doc, where)
    _keys(doc, where, ("at_step", "link", "state"))
    at = doc.get("at_step")
    if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < steps:
        raise TrafficFileError(f"{where}.at_step: {at!r} is not a step of the run (0 to {steps - 1}); an event "
                               "happens at the start of a step")
    link = doc.get("link")
    if not isinstance(link, list) or len(link) != 2 or link[0] == link[1]:
        raise TrafficFileError(f"{where}.link: {link!r} is not a link; name its two ends, e.g. link: [s1, s2]")
    ends = (_host(link[0], f"{where}.link[0]"), _host(link[1], f"{where}.link[1]"))
    state = doc.get("state")
    if state not in ("down", "up"):
        raise TrafficFileError(f"{where}.state: {state!r} is not down or up")
    return LinkEvent(at, ends, state == "up", where)


_SHAPE_KEYS = ("protocol", "cc", "streams", "rate", "steps", "dscp", "start_step", "start", "duration")


def _flow(doc: Any, where: str, step_seconds: int, steps: int) -> FlowSpec:
    doc = _mapping(doc, where)
    _keys(doc, where, ("name", "from", "to", *_SHAPE_KEYS))
    name = doc.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise TrafficFileError(f"{where}.name: {name!r} is not a name; use a letter then letters, digits, - or _")
    where = f"{where} ({name})"
    src, dst = _host(doc.get("from"), f"{where}.from"), _host(doc.get("to"), f"{where}.to")
    if src == dst:
        raise TrafficFileError(f"{where}.to: the same host as from; send to another host")
    return _shaped(doc, where, name, src, dst, step_seconds, steps)


def _shaped(doc: dict[Any, Any], where: str, name: str, src: str, dst: str, step_seconds: int,
            steps: int) -> FlowSpec:
    """A flow's shape (protocol, its times, its rate or congestion control) from `doc`."""
    protocol = doc.get("protocol", "tcp")
    if protocol not in ("tcp", "udp"):
        raise TrafficFileError(f"{where}.protocol: {protocol!r} is not tcp or udp")
    grid = step_seconds * steps
    if "start" in doc and "start_step" in doc:
        raise TrafficFileError(f"{where}.start: give start or start_step, not both")
    start = _whole(doc["start"], f"{where}.start", 0, MAX_SECONDS - 2) if "start" in doc else \
        _whole(doc.get("start_step", 0), f"{where}.start_step", 0, steps - 1) * step_seconds
    end = start + _whole(doc["duration"], f"{where}.duration", 2, MAX_SECONDS - start) if "duration" in doc else grid
    if end - start < 2:
        raise TrafficFileError(f"{where}.start: {start} s leaves the flow under 2 s before the last step ends at "
                               f"{grid} s; start it earlier or give it a duration")
    dscp = _whole(doc["dscp"], f"{where}.dscp", 0, 63) if "dscp" in doc else None
    if protocol == "tcp":
        for key in ("rate", "steps"):
            if key in doc:
                raise TrafficFileError(f"{where}.{key}: a TCP flow takes what the network gives it; remove {key} "
                                       "or make the flow protocol: udp")
        cc = doc.get("cc")
        if cc is not None and (not isinstance(cc, str) or not _NAME.match(cc)):
            raise TrafficFileError(f"{where}.cc: {cc!r} is not a congestion control's name; e.g. cubic, reno, bbr")
        streams = _whole(doc.get("streams", 1), f"{where}.streams", 1, 128)
        return FlowSpec(name, src, dst, "tcp", start, end, cc, streams, dscp=dscp)
    for key in ("cc", "streams"):
        if key in doc:
            raise TrafficFileError(f"{where}.{key}: only TCP flows have {key}; remove it or make the flow tcp")
    if ("rate" in doc) == ("steps" in doc):
        raise TrafficFileError(f"{where}: a UDP flow needs rate (e.g. rate: 12Mbit) or steps (Mbit/s per step), "
                               "one of them")
    if "rate" in doc:
        mbps: tuple[float, ...] = (_rate(doc["rate"], f"{where}.rate"),) * steps
    else:
        values = doc["steps"]
        if not isinstance(values, list) or len(values) != steps:
            have = len(values) if isinstance(values, list) else "not a list"
            raise TrafficFileError(f"{where}.steps: {have} steps where the experiment has {steps}; give every steps "
                                   f"list {steps} rates")
        mbps = tuple(_step(v, f"{where}.steps[{i}]") for i, v in enumerate(values))
        if end > grid:
            raise TrafficFileError(f"{where}.duration: a flow with steps ends with the last step, at {grid} s; "
                                   "shorten it, or give it a rate to run past the steps")
    return FlowSpec(name, src, dst, "udp", start, end, mbps=mbps, dscp=dscp)


def lanes(traffic: Traffic) -> list[list[Item]]:
    """The runner's lanes: the link events' (first, so that at a step's start its link changes come
    before what the step starts), then the flows', in their order: a UDP flow's periods one after the
    other (and a rest to the end once it stopped); then the probe's, then the ping's."""
    out: list[list[Item]] = []
    if traffic.events:    # first: a step's link changes before what the step starts
        changes: list[Item] = []
        at = 0
        for e in sorted(traffic.events, key=lambda e: e.at_step):
            changes += [Pause(e.at_step * traffic.step_seconds - at),
                        LinkState(*e.link, e.up, label=f"{'-'.join(e.link)} {e.state}")]
            at = e.at_step * traffic.step_seconds
        out.append(changes)
    for f in traffic.flows:
        lane: list[Item] = [Pause(f.start, f"{f.name} waits")] if f.start else []
        if not f.udp:
            lane.append(Flow(f.name, f.src, f.dst, f.end - f.start, congestion_control=f.cc, parallel=f.streams,
                             label=f.name, tos=_tos(f.dscp)))
        else:
            # A part of the flow in each period it covers, from its start to its end.
            for k, (lo, hi) in enumerate(traffic.periods()):
                a, b = max(f.start, lo), min(f.end, hi)
                if b - a < 1:
                    continue
                label = f"{f.name} {f.mbps[k]:g} Mbit/s"
                if f.mbps[k] > 0 and b - a >= 2:
                    lane.append(Flow(f"{f.name}_{k}", f.src, f.dst, b - a, udp_mbps=f.mbps[k], label=label,
                                     tos=_tos(f.dscp)))
                else:
                    lane.append(Pause(b - a, label))
            if f.end < traffic.seconds:
                lane.append(Pause(traffic.seconds - f.end, f"{f.name} done"))
        out.append(lane)
    if traffic.probe:
        out.append([Probe("probe", *traffic.probe, traffic.seconds, "probe")])
    if traffic.ping:
        src, dst, interval = traffic.ping
        out.append([Ping("ping", src, dst, traffic.seconds, interval, "ping")])
    return out


def unloaded(traffic: Traffic) -> list[list[Item]]:
    """The probe alone, before the flows: the path's RTT with nothing queued (no lane without a probe)."""
    return [[Probe("probe_unloaded", *traffic.probe, UNLOADED_SECONDS, "unloaded RTT")]] if traffic.probe else []


def _tos(dscp: int | None) -> int | None:
    return None if dscp is None else dscp << 2


def _rate(value: Any, where: str) -> float:
    """A rate with its unit → Mbit/s."""
    if isinstance(value, bool) or isinstance(value, (int, float)):
        raise TrafficFileError(f"{where}: {value!r} has no unit; write e.g. {value}Mbit")
    m = _RATE.match(str(value))
    if m is None:
        raise TrafficFileError(f"{where}: {value!r} is not a rate; write e.g. 12Mbit or 500kbit")
    mbps = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not 0 < mbps <= 10_000:
        raise TrafficFileError(f"{where}: {value!r} is not from 1bit to 10Gbit")
    return mbps


def _step(value: Any, where: str) -> float:
    """A step's rate: Mbit/s as a bare number, or a rate with its unit; 0 rests."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 <= value <= 10_000:
            raise TrafficFileError(f"{where}: {value!r} is not from 0 to 10000 Mbit/s")
        return float(value)
    return _rate(value, where)


def _host(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise TrafficFileError(f"{where}: {value!r} is not a host's name; name a host of the topology, e.g. h1")
    return value
