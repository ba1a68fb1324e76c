"""Policy files validated into typed objects.

A policy says which flow entries each switch gets, which traffic classes exist,
and how each QoS port is queued: `fifo` (one queue at the port's capacity),
`reserve` (a linux-htb class per traffic class, with min/max rates) or `auto`
(fifo until the port is congested, reserve while it is). Every problem is one
PolicyError whose message names the field and says how to fix it. A policy file
may name a `base:` file and override its fields (load_document).
"""
from __future__ import annotations

import dataclasses
import functools
import ipaddress
import math
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.core.congestion import CongestionConfig
from controller.core.document import known_keys, load_yaml, mapping, read_file
from controller.core.errors import PolicyError as PolicyError  # re-exported: the error of a bad policy
from controller.core.paths import ECMP, PATH_MODES

QUEUE_MODES = ("fifo", "reserve", "auto")
QOS_TYPES = ("linux-htb", "linux-hfsc")                      # OVS QoS types with min/max queues on Linux
DISCIPLINES = ("fifo", "sfq", "codel", "fq_codel", "red")   # the qdisc under each HTB class
DEFAULT_QUEUE_PACKETS = 1000                                # Linux's default txqueuelen
IP_PROTOS = {"icmp": 1, "tcp": 6, "udp": 17, "icmpv6": 58}
ETH_TYPES = {"ipv4": 0x0800, "ipv6": 0x86DD, "arp": 0x0806}
ETH_TYPE_IPV4, ETH_TYPE_IPV6 = ETH_TYPES["ipv4"], ETH_TYPES["ipv6"]
MATCH_FIELDS = ("in_port", "eth_type", "eth_src", "eth_dst", "ipv4_src", "ipv4_dst", "ipv6_src", "ipv6_dst",
                "ip_proto", "ip_dscp", "tcp_src", "tcp_dst", "udp_src", "udp_dst")
# OpenFlow 1.3's reserved ports a flow may output to, by the name a policy uses.
SPECIAL_OUTPUTS = {"normal": 0xFFFFFFFA, "flood": 0xFFFFFFFB, "in_port": 0xFFFFFFF8, "controller": 0xFFFFFFFD}
MAX_PORT = 0xFEFF
MIN_CAPACITY_BPS = 1000
_RATE_UNITS = {"": 1, "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
# OVS's linux-htb hands the kernel each rate as 32-bit bytes per second: above that it wraps.
MAX_RATE_BPS = (2**32 - 1) * 8
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")     # a link's one-way delay as netem takes it: 5ms, 500us, 0.1s
_DELAY_US = {"us": 1, "ms": 1000, "s": 1_000_000}
MAX_DELAY_US = 60_000_000   # a minute: beyond any path on Earth, and far inside netem's 32-bit clock
LOCAL_OVSDB = "unix:/var/run/openvswitch/db.sock"    # the system's OVS on the controller's host
OVSDB_REMOTE = re.compile(r"^(unix:.+|(tcp|ssl):[^:]+:\d+|(tcp|ssl):\[[0-9a-fA-F:.]+\]:\d+)$")
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$", re.IGNORECASE)
Match = tuple[tuple[str, Any], ...]   # os-ken OFPMatch keyword arguments, sorted
_NETWORKS: dict[int, tuple[type[ipaddress.IPv4Network] | type[ipaddress.IPv6Network], str]] = {
    4: (ipaddress.IPv4Network, "10.0.0.1 or 10.0.0.0/24"),
             6: (ipaddress.IPv6Network, "2001:db8::1 or 2001:db8::/64")}


@dataclass(frozen=True)
class TrafficClass:
    name: str
    queue: int          # OpenFlow queue id; HTB class 1:(queue+1) on Linux
    min_share: float    # fraction of the port's capacity reserved for the class
    max_share: float    # fraction of the port's capacity the class may borrow up to
    dscp: int           # mark that carries the queue choice to tc on the userspace datapath
    priority: int       # HTB: spare bandwidth goes first to the lowest number
    police: Police | None = None   # an OpenFlow meter on the class's flows, whatever the port's queues


@dataclass(frozen=True)
class Police:
    """A meter's one drop band: packets above `rate_kbps` (with `burst_kbits` of slack) are dropped."""
    rate_kbps: int      # OpenFlow meters count in kbit/s
    burst_kbits: int


@dataclass(frozen=True)
class FlowRule:
    priority: int
    match: Match
    outputs: tuple[int, ...]             # OpenFlow port numbers, SPECIAL_OUTPUTS' included
    traffic_class: str | None            # steer into this class's queue when the port reserves
    # Where its match is written, for messages: switches.s1.flows[2].match, or ….match[1] in a list.
    source: str = dataclasses.field(default="", compare=False)
    # The controller's own forwarding (controller/core/site.py) uses several tables; a policy's flows, table 0.
    table: int = 0
    goto: int | None = None                        # then the packet goes on to this table
    write_metadata: tuple[int, int] | None = None  # (value, mask) written into the metadata first
    counted: bool = False                          # its counters are read at every poll (a route's rate)

    @property
    def flow_source(self) -> str:
        """The path of the flow entry it came from, e.g. switches.s1.flows[2]."""
        return self.source.rpartition(".match")[0]


@dataclass(frozen=True)
class PortPolicy:
    port_no: int
    capacity_bps: int
    queues: str          # one of QUEUE_MODES
    queue_packets: int = DEFAULT_QUEUE_PACKETS   # packet limit of each class's queue
    discipline: str = "fifo"                      # one of DISCIPLINES
    qos_type: str = "linux-htb"                   # one of QOS_TYPES


@dataclass(frozen=True)
class PortRule:
    """The queues of every port of a switch under `network:` whose capacity is known: this rule's
    `capacity_bps` when it gives one, else what the port declares (controller/core/site.py)."""
    queues: str
    capacity_bps: int | None = None
    queue_packets: int = DEFAULT_QUEUE_PACKETS
    discipline: str = "fifo"
    qos_type: str = "linux-htb"


@dataclass(frozen=True)
class Classify:
    """Traffic of `match` is of `traffic_class`, wherever it goes (under `network:`)."""
    priority: int
    match: Match
    traffic_class: str
    source: str = dataclasses.field(default="", compare=False)


@dataclass(frozen=True)
class NetworkPolicy:
    """What every switch the policy does not list gets: the controller's own forwarding (links discovered,
    hosts learned, paths chosen among equals as `paths` says), the classes by match, and queues on the ports
    whose capacity is known."""
    classify: tuple[Classify, ...]
    ports: PortRule | None
    paths: str = ECMP


@dataclass(frozen=True)
class SwitchPolicy:
    name: str
    dp_id: int
    flows: tuple[FlowRule, ...]
    ports: tuple[PortPolicy, ...]
    ovsdb: str | None = None    # the OVSDB remote its bridge is in; None: whichever holds its dp_id
    keyed: bool = False         # built by the controller: each flow's cookie comes from its table, priority, match

    def port(self, port_no: int) -> PortPolicy | None:
        return self._by_number.get(port_no)

    @functools.cached_property
    def _by_number(self) -> dict[int, PortPolicy]:     # asked per port and poll: a scan would be O(ports)
        return {p.port_no: p for p in self.ports}


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    classes: tuple[TrafficClass, ...]
    switches: tuple[SwitchPolicy, ...]
    poll_interval: float
    congestion: CongestionConfig
    fast_poll_interval: float          # `auto` ports near their capacity are polled this often (0: never)
    network: NetworkPolicy | None = None   # for the switches not listed

    def switch(self, dp_id: int) -> SwitchPolicy | None:
        return next((s for s in self.switches if s.dp_id == dp_id), None)

    def traffic_class(self, name: str) -> TrafficClass:
        return next(c for c in self.classes if c.name == name)


def load_document(path: str | Path) -> Any:
    """A policy file's document, read safely (controller/core/document.py) and with its bases merged
    in, its fields not yet checked."""
    path = Path(path)
    return _with_bases(_read(path, str(path)), (path,))


def _read(path: Path, where: str) -> Any:
    try:
        data = read_file(path, where)
    except OSError as err:
        raise PolicyError(f"{where}: cannot read policy file ({err.strerror}); check the path") from None
    return load_yaml(data, where)


def _with_bases(document: Any, chain: tuple[Path, ...]) -> Any:
    """`base: other.yaml` (relative to the file that says it): the other file's document, itself
    resolved, with this one's fields merged over it. `chain` is the files read so far, first to last."""
    if not isinstance(document, dict) or "base" not in document:
        return document
    here, name = chain[-1], document.pop("base")
    if not isinstance(name, str) or not name.strip():
        raise PolicyError(f"{here}: base: {_shown(name)} is not a file name; write e.g. base: study.yaml "
                          "(relative to this file)")
    path = Path(os.path.normpath(here.parent / name))   # sub/../c.yaml is c.yaml, as a reader takes it
    where = f"{chain[0]}: base {' → '.join(str(p) for p in (*chain[1:], path))}"
    if os.path.realpath(path) in {os.path.realpath(p) for p in chain}:   # realpath: a symlink loop is read, not raised
        raise PolicyError(f"{where} is a loop; remove base: from one of these files")
    base = _with_bases(_read(path, where), (*chain, path))
    if not isinstance(base, dict):
        raise PolicyError(f"{where}: not a mapping of policy fields; a base holds fields such as classes "
                          "and switches")
    return merge_documents(base, document)


def merge_documents(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` over `base`: mappings merge key by key; anything else, lists included, replaces."""
    merged = dict(base)
    for key, value in override.items():
        both = isinstance(merged.get(key), dict) and isinstance(value, dict)
        merged[key] = merge_documents(merged[key], value) if both else value
    return merged


def for_any_network(document: Any) -> dict[str, Any]:
    """The document without its switches: what it says for any network, every switch under `network:`."""
    if not isinstance(document, dict) or document.get("network") is None:
        raise PolicyError("network: missing; this policy lists its switches only, so it fits only their network; "
                          "add a network: section (docs/experiments.md)")
    return {key: value for key, value in document.items() if key != "switches"}


def parse_policy(document: Any) -> Policy:
    doc = _mapping(document, "policy")
    if "base" in doc:
        raise PolicyError("policy.base: bases are resolved only when a policy is loaded from its file; send the "
                          "resolved policy (python3 -m controller.check --json FILE prints it)")
    _known_keys(doc, "policy", ("name", "description", "classes", "switches", "network", "congestion"))
    name = _label(doc.get("name"), "name")
    description = _text(doc.get("description", ""), "description")
    classes = _classes(doc.get("classes", {}))
    poll_interval, fast_poll_interval, congestion = _congestion(doc.get("congestion", {}))
    network = _network(doc["network"], classes) if doc.get("network") is not None else None
    switches_doc = _mapping(doc.get("switches"), "switches")
    if not switches_doc and network is None:
        raise PolicyError("switches: no switch defined; add a network: section for every switch, or a switch "
                          "with dp_id and flows")
    switches = tuple(_switch(_label(n, f"switches.{_shown(n)}"), s, classes) for n, s in switches_doc.items())
    dp_ids = [s.dp_id for s in switches]
    if len(set(dp_ids)) != len(dp_ids):
        raise PolicyError("switches: two switches share a dp_id; give each switch its own dp_id")
    return Policy(name=name, description=description, classes=classes,
                  switches=switches, poll_interval=poll_interval, congestion=congestion,
                  fast_poll_interval=fast_poll_interval, network=network)


# Priorities of the flows a `network:` switch gets (controller/core/site.py): classify rules lie between
# the learned MACs' own entries and the entries that keep a class's mark from an upstream switch.
LEARNED_PRIORITY, MARKED_PRIORITY = 1000, 60000


def _network(doc: Any, classes: tuple[TrafficClass, ...]) -> NetworkPolicy:
    doc = _mapping(doc, "network")
    _known_keys(doc, "network", ("forwarding", "paths", "classify", "ports"))
    if doc.get("forwarding", "learn") != "learn":
        raise PolicyError(f"network.forwarding: {_shown(doc['forwarding'])} is not a forwarding this controller "
                          "does; write learn (its own: links discovered, hosts learned, any graph)")
    paths = doc.get("paths", ECMP)
    if paths not in PATH_MODES:
        raise PolicyError(f"network.paths: {_shown(paths)} is not a way of choosing paths; write one (one shortest "
                          f"path), ecmp (equal paths shared) or adaptive (shared, and flows moved off a full link)")
    rules = []
    for i, rule in enumerate(_list(doc.get("classify", []), "network.classify")):
        where = f"network.classify[{i}]"
        rule = _mapping(rule, where)
        _known_keys(rule, where, ("priority", "match", "class"))
        priority = _int(rule.get("priority", 40000), f"{where}.priority", LEARNED_PRIORITY + 1, MARKED_PRIORITY - 1)
        match = _match(rule.get("match", {}), f"{where}.match")
        for field in ("in_port", "eth_dst"):
            if field in dict(match):
                raise PolicyError(f"{where}.match.{field}: a network-wide class cannot name a port or a destination "
                                  "MAC (the controller learns them); match on protocols, ports or addresses")
        name = rule.get("class")
        if not isinstance(name, str) or name not in {c.name for c in classes}:
            raise PolicyError(f"{where}.class: {_shown(name)} is not defined under classes; define it or fix the name")
        if dict(match).get("eth_type") not in (ETH_TYPE_IPV4, ETH_TYPE_IPV6):
            raise PolicyError(f"{where}.class: classes steer IP packets only; add ip_proto, an address, or eth_type: "
                              "ipv4 or ipv6 to the match")
        rules.append(Classify(priority, match, name, f"{where}.match"))
    _distinct(rules)
    ports = _port_rule(doc["ports"]) if doc.get("ports") is not None else None
    return NetworkPolicy(tuple(rules), ports, paths)


def _port_rule(doc: Any) -> PortRule:
    where = "network.ports"
    doc = _mapping(doc, where)
    _known_keys(doc, where, ("capacity", "queues", "queue_packets", "discipline", "qos_type"))
    queues, queue_packets, discipline, qos_type = _queueing(doc, where)
    capacity = _capacity(doc["capacity"], f"{where}.capacity") if doc.get("capacity") is not None else None
    return PortRule(queues, capacity, queue_packets, discipline, qos_type)


def parse_rate(value: Any, where: str) -> int:
    """'5Mbit', '500kbit', 5000000 → bit/s."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise PolicyError(f"{where}: {_shown(value)} is not a rate; write e.g. 5Mbit or 500kbit")
    if isinstance(value, (int, float)):
        bps = value
    else:
        m = _RATE.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _RATE_UNITS:
            raise PolicyError(f"{where}: {_shown(value)} is not a rate; write e.g. 5Mbit or 500kbit")
        bps = float(m.group(1)) * _RATE_UNITS[unit]    # too many digits give inf, refused below
    # An int is compared as it is: a JSON number of 400 digits has no float.
    if isinstance(bps, float) and not math.isfinite(bps) or bps > MAX_RATE_BPS:
        raise PolicyError(f"{where}: {_shown(value)} is above {MAX_RATE_BPS} bit/s (34.36 Gbit/s), the most OVS's "
                          "linux-htb can set; lower it")
    if int(bps) <= 0:
        raise PolicyError(f"{where}: {_shown(value)} is not a positive rate of at least 1 bit/s; write e.g. 5Mbit")
    return int(bps)


def delay_us(value: str, where: str) -> int:
    """'10ms' → 10000: a one-way delay in whole microseconds (0: none)."""
    found = DELAY.match(value)
    if not found:
        raise PolicyError(f"{where}: {_shown(value)} is not a delay; write e.g. 10ms, 500us or 0.1s")
    number, unit = found.groups()
    us = round(float(number) * _DELAY_US[unit])
    if us > MAX_DELAY_US:
        raise PolicyError(f"{where}: {_shown(value)} is longer than a minute; write e.g. 10ms")
    return us


def _capacity(value: Any, where: str) -> int:
    """A port's rate: at least 1kbit, or its classes' shares of it round to nothing (a bare number is bit/s, so
    `capacity: 100` is 100 bit/s, not 100 Mbit/s)."""
    bps = parse_rate(value, where)
    if bps < MIN_CAPACITY_BPS:
        raise PolicyError(f"{where}: {_shown(value)} is {bps} bit/s, below the 1kbit a port's queues need (a number "
                          "without a unit is bit/s); write the port's rate with its unit, e.g. 100Mbit")
    return bps


def parse_share(value: Any, where: str) -> float:
    """'80%' or 0.8 → 0.8 of the port's capacity."""
    text = str(value).strip()
    try:
        share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except (ValueError, OverflowError):
        raise PolicyError(f"{where}: {_shown(value)} is not a share of the port; write e.g. 80%") from None
    if not 0 <= share <= 1:
        raise PolicyError(f"{where}: {_shown(value)} is outside 0%..100%; write a share such as 80%")
    return share


def _classes(doc: Any) -> tuple[TrafficClass, ...]:
    classes = []
    for key, spec in _mapping(doc, "classes").items():
        name = _label(str(key) if isinstance(key, int) and not isinstance(key, bool) else key,
                      f"classes.{_shown(key)}")
        where = f"classes.{name}"
        spec = _mapping(spec, where)
        _known_keys(spec, where, ("queue", "min", "max", "dscp", "priority", "police"))
        queue = _int(spec.get("queue"), f"{where}.queue", 1, 0xfffe)
        min_share = parse_share(spec.get("min", 0), f"{where}.min")
        max_share = parse_share(spec.get("max", "100%"), f"{where}.max")
        if max_share < min_share:
            raise PolicyError(f"{where}.max: below {where}.min; raise max or lower min")
        dscp = _int(spec.get("dscp", queue), f"{where}.dscp", 1, 63)
        priority = _int(spec.get("priority", 0), f"{where}.priority", 0, 7)
        police = _police(spec["police"], f"{where}.police") if spec.get("police") is not None else None
        classes.append(TrafficClass(name, queue, min_share, max_share, dscp, priority, police))
    for field in ("queue", "dscp"):
        values = [getattr(c, field) for c in classes]
        if len(set(values)) != len(values):
            raise PolicyError(f"classes: two classes share a {field}; give each class its own {field}")
    if sum(c.min_share for c in classes) > 1 + 1e-9:   # 33% + 56% + 11% is 1.0000000000000002
        raise PolicyError("classes: the min shares add up to more than 100%; lower them")
    return tuple(classes)


def _police(doc: Any, where: str) -> Police:
    """{rate: 1Mbit, burst: 100kbit}; the burst defaults to 100 ms at the rate."""
    doc = _mapping(doc, where)
    _known_keys(doc, where, ("rate", "burst"))
    if "rate" not in doc:
        raise PolicyError(f"{where}.rate: missing; give the rate the class is held to, e.g. 1Mbit")
    rate = parse_rate(doc["rate"], f"{where}.rate")
    burst = parse_rate(doc["burst"], f"{where}.burst") if "burst" in doc else rate // 10
    for key, bits in (("rate", rate), ("burst", burst)):
        if bits < 1000:
            raise PolicyError(f"{where}.{key}: {bits} bit{'/s' if key == 'rate' else 's'} is below 1kbit, the "
                              f"smallest step of an OpenFlow meter; raise it")
    return Police(round(rate / 1000), round(burst / 1000))


def _congestion(doc: Any) -> tuple[float, float, CongestionConfig]:
    doc = _mapping(doc, "congestion")
    fields = {f.name: f for f in dataclasses.fields(CongestionConfig)}
    _known_keys(doc, "congestion", ("poll_interval", "fast_poll_interval", *fields))
    poll_interval = _number(doc.get("poll_interval", 1.0), "congestion.poll_interval", 0.05, 60)
    fast = _number(doc.get("fast_poll_interval", 0.05), "congestion.fast_poll_interval", 0, 60)
    if fast and not 0.01 <= fast <= poll_interval:
        raise PolicyError(f"congestion.fast_poll_interval: {_shown(fast)} is not from 0.01 s to the poll_interval "
                          f"({poll_interval:g} s); or 0 to poll every port at the poll_interval only")
    values: dict[str, Any] = {}
    for key, value in doc.items():
        if key in ("poll_interval", "fast_poll_interval"):
            continue
        where = f"congestion.{key}"
        if key == "samples":
            values[key] = _int(value, where, 1, 1000)
        elif key == "hold_seconds":
            values[key] = _number(value, where, 0, 3600)
        else:
            values[key] = parse_share(value, where)
    config = CongestionConfig(**values)
    if config.clear_utilisation > config.utilisation:
        raise PolicyError("congestion.clear_utilisation: above congestion.utilisation; "
                          "set it lower so the state cannot flap")
    return poll_interval, fast, config


def _switch(name: str, doc: Any, classes: tuple[TrafficClass, ...]) -> SwitchPolicy:
    where = f"switches.{name}"
    doc = _mapping(doc, where)
    _known_keys(doc, where, ("dp_id", "ovsdb", "flows", "ports"))
    dp_id = _int(doc.get("dp_id"), f"{where}.dp_id", 1, 2**64 - 1)
    flows = tuple(rule for i, f in enumerate(_list(doc.get("flows", []), f"{where}.flows"))
                  for rule in _flow(f, f"{where}.flows[{i}]", classes))
    _distinct(flows)
    ports = tuple(_port(p, spec, f"{where}.ports.{p}")
                  for p, spec in _mapping(doc.get("ports", {}), f"{where}.ports").items())
    numbers = [p.port_no for p in ports]
    if len(set(numbers)) != len(numbers):
        raise PolicyError(f"{where}.ports: a port is listed twice (e.g. as 1 and \"1\"); keep one entry per port")
    ovsdb = doc.get("ovsdb")
    if ovsdb is not None and not OVSDB_REMOTE.match(str(ovsdb)):
        raise PolicyError(f"{where}.ovsdb: {_shown(ovsdb)} is not an OVSDB remote; write unix:PATH, tcp:HOST:PORT or "
                          "ssl:HOST:PORT, as in the controller's ovsdb option")
    return SwitchPolicy(name=name, dp_id=dp_id, flows=flows, ports=ports, ovsdb=ovsdb)


def _port(port_no: Any, doc: Any, where: str) -> PortPolicy:
    number = _int(port_no, where, 1, MAX_PORT)
    doc = _mapping(doc, where)
    _known_keys(doc, where, ("capacity", "queues", "queue_packets", "discipline", "qos_type"))
    if "capacity" not in doc:
        raise PolicyError(f"{where}.capacity: missing; give the port's rate, e.g. 5Mbit")
    queues, queue_packets, discipline, qos_type = _queueing(doc, where)
    return PortPolicy(number, _capacity(doc["capacity"], f"{where}.capacity"), queues, queue_packets, discipline,
                      qos_type)


def _queueing(doc: dict[Any, Any], where: str) -> tuple[str, int, str, str]:
    """A port's queues, queue_packets, discipline and qos_type."""
    queues = doc.get("queues", "fifo")
    if queues not in QUEUE_MODES:
        raise PolicyError(f"{where}.queues: {_shown(queues)} is not one of {', '.join(QUEUE_MODES)}")
    discipline = doc.get("discipline", "fifo")
    if discipline not in DISCIPLINES:
        raise PolicyError(f"{where}.discipline: {_shown(discipline)} is not one of {', '.join(DISCIPLINES)}")
    qos_type = doc.get("qos_type", "linux-htb")
    if qos_type not in QOS_TYPES:
        raise PolicyError(f"{where}.qos_type: {_shown(qos_type)} is not one of {', '.join(QOS_TYPES)}")
    queue_packets = _int(doc.get("queue_packets", DEFAULT_QUEUE_PACKETS), f"{where}.queue_packets", 1, 100_000)
    return queues, queue_packets, discipline, qos_type


def _flow(doc: Any, where: str, classes: tuple[TrafficClass, ...]) -> tuple[FlowRule, ...]:
    """One flow entry: a rule per match when `match` is a list, all else shared."""
    doc = _mapping(doc, where)
    _known_keys(doc, where, ("priority", "match", "actions", "class"))
    priority = _int(doc.get("priority", 1000), f"{where}.priority", 0, 65535)
    matches = _matches(doc.get("match", {}), f"{where}.match")
    outputs = tuple(_action(a, f"{where}.actions[{i}]")
                    for i, a in enumerate(_list(doc.get("actions", []), f"{where}.actions")))
    traffic_class = doc.get("class")
    if traffic_class is not None:
        if not isinstance(traffic_class, str):
            raise PolicyError(f"{where}.class: {_shown(traffic_class)} is not a class name; write the name of one "
                              "of the classes")
        _check_classified(traffic_class, matches, outputs, where, classes)
    return tuple(FlowRule(priority, match, outputs, traffic_class, at) for match, at in matches)


def _matches(doc: Any, where: str) -> list[tuple[Match, str]]:
    """(match, its path) for a mapping, or for each mapping of a list."""
    if not isinstance(doc, list):
        return [(_match(doc, where), where)]
    if not doc:
        raise PolicyError(f"{where}: an empty list matches nothing; give one mapping per match, or leave match out "
                          "to match everything")
    return [(_match(m, f"{where}[{i}]"), f"{where}[{i}]") for i, m in enumerate(doc)]


def _check_classified(name: Any, matches: list[tuple[Match, str]], outputs: tuple[int, ...], where: str,
                      classes: tuple[TrafficClass, ...]) -> None:
    if name not in {c.name for c in classes}:
        raise PolicyError(f"{where}.class: {_shown(name)} is not defined under classes; define it or fix the name")
    if len(outputs) != 1 or outputs[0] > MAX_PORT:
        raise PolicyError(f"{where}.class: a classified flow needs exactly one output to a "
                          "numbered port; split it into one flow per port")
    for match, at in matches:
        # The userspace datapath steers by a DSCP mark, which only IP packets carry.
        if dict(match).get("eth_type") not in (ETH_TYPE_IPV4, ETH_TYPE_IPV6):
            target = "the match" if at.endswith(".match") else at.rsplit(".", 1)[1]
            raise PolicyError(f"{where}.class: classes steer IP packets only; add ip_proto, an address, or "
                              f"eth_type: ipv4 or ipv6 to {target}")


def _distinct(rules: Sequence[FlowRule | Classify]) -> None:
    """A switch keeps one flow per priority and match: a second would silently replace the first."""
    seen: dict[tuple[int, Match], FlowRule | Classify] = {}
    for rule in rules:
        first = seen.setdefault((rule.priority, rule.match), rule)
        if first is not rule:
            raise PolicyError(f"{rule.source}: the same priority and match as {first.source}; a switch keeps only "
                              "one of them, so remove one or change its priority")


def _match(doc: Any, where: str) -> Match:
    """os-ken OFPMatch keyword arguments, with OpenFlow 1.3's prerequisites filled in or refused."""
    doc = _mapping(doc, where)
    fields = {key: _match_field(key, value, f"{where}.{key}") for key, value in doc.items()}
    _transport_prerequisites(fields, where)
    _network_prerequisites(fields, where)
    return tuple(sorted(fields.items()))


def _match_field(key: str, value: Any, at: str) -> Any:
    if key == "in_port":
        return _int(value, at, 1, MAX_PORT)
    if key == "eth_type":
        return _eth_type(value, at)
    if key in ("eth_src", "eth_dst"):
        if not _MAC.match(str(value)):
            raise PolicyError(f"{at}: {_shown(value)} is not a MAC address; write aa:bb:cc:dd:ee:ff")
        return str(value).lower()
    if key in ("ipv4_src", "ipv4_dst"):
        return _prefix(value, at, 4)
    if key in ("ipv6_src", "ipv6_dst"):
        return _prefix(value, at, 6)
    if key == "ip_proto":
        if isinstance(value, str) and value not in IP_PROTOS:
            raise PolicyError(f"{at}: {_shown(value)} is not a protocol; use tcp, udp, icmp, icmpv6 or a number 0-255")
        return IP_PROTOS[value] if isinstance(value, str) else _int(value, at, 0, 255)
    if key in ("tcp_src", "tcp_dst", "udp_src", "udp_dst"):
        return _int(value, at, 1, 65535)
    if key == "ip_dscp":
        return _int(value, at, 0, 63)
    raise PolicyError(f"{at}: unknown match field; use {', '.join(MATCH_FIELDS[:-1])} or {MATCH_FIELDS[-1]}")


def _eth_type(value: Any, at: str) -> int:
    if isinstance(value, str) and value in ETH_TYPES:
        return ETH_TYPES[value]
    try:
        return _int(value, at, 0, 0xFFFF)
    except PolicyError:
        raise PolicyError(f"{at}: {_shown(value)} is not an EtherType; use ipv4, ipv6, arp or a number such as "
                          "0x0800") from None


def _prefix(value: Any, at: str, version: int) -> str | tuple[str, str]:
    """An address, or (address, netmask) for a prefix: as os-ken reads the field back from a switch."""
    network, example = _NETWORKS[version]
    try:
        net = network(str(value))
    except ValueError:
        try:
            fixed = network(str(value), strict=False)
        except ValueError:
            raise PolicyError(f"{at}: {_shown(value)} is not an IPv{version} address or prefix; write e.g. "
                              f"{example}") from None
        raise PolicyError(f"{at}: {_shown(value)} has host bits set after the prefix; write {fixed}") from None
    # os-ken prints addresses with inet_ntop, which writes some IPv6 forms (::ffff:a.b.c.d) unlike ipaddress.
    family = socket.AF_INET if version == 4 else socket.AF_INET6
    address = socket.inet_ntop(family, net.network_address.packed)
    if net.prefixlen == net.max_prefixlen:
        return address
    return address, socket.inet_ntop(family, net.netmask.packed)


def _transport_prerequisites(fields: dict[str, Any], where: str) -> None:
    """TCP and UDP ports need their ip_proto: filled in when absent, refused when another."""
    ports = [k for k in fields if k.startswith(("tcp_", "udp_"))]
    if not ports:
        return
    first = ports[0]
    other = next((k for k in ports if k[:3] != first[:3]), None)
    if other is not None:
        raise PolicyError(f"{where}.{other}: cannot match together with {first}, a packet is TCP or UDP; "
                          "put them in two match entries (match may be a list)")
    proto = first[:3]
    have = fields.setdefault("ip_proto", IP_PROTOS[proto])
    if have != IP_PROTOS[proto]:
        name = _name(IP_PROTOS, have, str(have))
        instead = f" or use {name}_{first[4:]}" if name in ("tcp", "udp") else ""
        raise PolicyError(f"{where}.{first}: needs ip_proto {proto}, not {name}; remove ip_proto ({first} "
                          f"implies {proto}){instead}")


def _network_prerequisites(fields: dict[str, Any], where: str) -> None:
    """IP fields need an IP eth_type: filled in (IPv4 unless an IPv6 address says otherwise), refused
    when another. Runs after _transport_prerequisites, so a filled-in ip_proto is covered."""
    v4 = next((k for k in fields if k.startswith("ipv4_")), None)
    v6 = next((k for k in fields if k.startswith("ipv6_")), None)
    if v4 and v6:
        raise PolicyError(f"{where}.{v6}: cannot match together with {v4}, a packet is IPv4 or IPv6; put them "
                          "in two match entries (match may be a list)")
    address = v4 or v6
    if address:
        family, other = ("ipv4", "ipv6") if v4 else ("ipv6", "ipv4")
        have = fields.setdefault("eth_type", ETH_TYPES[family])
        if have != ETH_TYPES[family]:
            raise PolicyError(f"{where}.{address}: needs eth_type {family}, not {_eth_name(have)}; remove "
                              f"eth_type ({address} implies {family}) or use {other}{address[4:]}")
        return
    ip_field = next((k for k in fields if k in ("ip_proto", "ip_dscp") or k.startswith(("tcp_", "udp_"))), None)
    if ip_field is None:
        return
    have = fields.setdefault("eth_type", ETH_TYPE_IPV4)
    if have not in (ETH_TYPE_IPV4, ETH_TYPE_IPV6):
        raise PolicyError(f"{where}.{ip_field}: needs eth_type ipv4 or ipv6, not {_eth_name(have)}; remove "
                          "eth_type (ipv4 is filled in) or set it to ipv6")


def _eth_name(eth_type: int) -> str:
    return _name(ETH_TYPES, eth_type, f"0x{eth_type:04x}")


def _name(names: dict[str, int], number: int, default: str) -> str:
    return next((name for name, n in names.items() if n == number), default)


def _action(doc: Any, where: str) -> Any:
    doc = _mapping(doc, where)
    _known_keys(doc, where, ("output",))
    if "output" not in doc:
        raise PolicyError(f"{where}: missing output; write {{output: 1}}")
    port = doc["output"]
    if isinstance(port, str) and port in SPECIAL_OUTPUTS:
        return SPECIAL_OUTPUTS[port]
    if isinstance(port, str) and not port.strip().lstrip("-").isdigit():
        raise PolicyError(f"{where}.output: {_shown(port)} is not a port; use a number from 1 to {MAX_PORT} or one of "
                          f"{', '.join(SPECIAL_OUTPUTS)}")
    return _int(port, f"{where}.output", 1, MAX_PORT)


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise PolicyError(f"{where}: expected a list, got {type(value).__name__}")
    return value


# One parser's helpers for every document of the project (traffic and experiment files too), raising PolicyError.
_mapping = functools.partial(mapping, error=PolicyError)
_known_keys = functools.partial(known_keys, error=PolicyError, kind="policy")


LABEL_MAX = 64


def _label(value: Any, where: str) -> str:
    """A name that goes into OVSDB's external_ids, Prometheus labels and logs: 1-64 printable characters
    (no control characters such as NUL, no unpaired surrogate: all three must carry it)."""
    if not isinstance(value, str) or not value.strip():
        raise PolicyError(f"{where}: missing or empty; give it a name")
    if len(value) > LABEL_MAX or not value.isprintable():
        raise PolicyError(f"{where}: {_shown(value)} is not a name OVSDB, Prometheus and a log can carry; use 1-"
                          f"{LABEL_MAX} printable characters")
    return value


def _text(value: Any, where: str) -> str:
    """Free text (a description): printable characters and line breaks, encodable as UTF-8."""
    if not isinstance(value, str):
        raise PolicyError(f"{where}: expected text, got {type(value).__name__}")
    if len(value) > 4096 or not value.replace("\n", " ").replace("\t", " ").isprintable():
        raise PolicyError(f"{where}: not plain text; use at most 4096 printable characters and line breaks")
    return value


def _shown(value: Any) -> str:
    """A value as an error message shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or value is None:
        raise PolicyError(f"{where}: expected a whole number from {low} to {high}")
    try:
        number = int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError, OverflowError):
        raise PolicyError(f"{where}: {_shown(value)} is not a whole number from {low} to {high}") from None
    if number != value and not isinstance(value, str) or not low <= number <= high:
        raise PolicyError(f"{where}: {_shown(value)} is not a whole number from {low} to {high}")
    return number


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:  # NaN fails too
        raise PolicyError(f"{where}: {_shown(value)} is not a number from {low} to {high}")
    return float(value)
