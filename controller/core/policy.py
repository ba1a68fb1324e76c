"""Policy files validated into typed objects.

A policy says which flow entries each switch gets, which traffic classes exist,
and how each QoS port is queued: `fifo` (one queue at the port's capacity),
`reserve` (a linux-htb class per traffic class, with min/max rates) or `auto`
(fifo until the port is congested, reserve while it is). Every problem is one
PolicyError whose message names the field and says how to fix it.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.core.congestion import CongestionConfig
from controller.core.document import load_yaml
from controller.core.errors import PolicyError

QUEUE_MODES = ("fifo", "reserve", "auto")
DISCIPLINES = ("fifo", "sfq", "codel", "fq_codel", "red")   # the qdisc under each HTB class
DEFAULT_QUEUE_PACKETS = 1000                                # Linux's default txqueuelen
IP_PROTOS = {"icmp": 1, "tcp": 6, "udp": 17}
ETH_TYPE_IPV4 = 0x0800
# OpenFlow 1.3's reserved ports a flow may output to, by the name a policy uses.
SPECIAL_OUTPUTS = {"normal": 0xFFFFFFFA, "flood": 0xFFFFFFFB, "in_port": 0xFFFFFFF8, "controller": 0xFFFFFFFD}
MAX_PORT = 0xFEFF
_RATE_UNITS = {"": 1, "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
# OVS's linux-htb hands the kernel each rate as 32-bit bytes per second: above that it wraps.
MAX_RATE_BPS = (2**32 - 1) * 8
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$", re.IGNORECASE)


@dataclass(frozen=True)
class TrafficClass:
    name: str
    queue: int          # OpenFlow queue id; HTB class 1:(queue+1) on Linux
    min_share: float    # fraction of the port's capacity reserved for the class
    max_share: float    # fraction of the port's capacity the class may borrow up to
    dscp: int           # mark that carries the queue choice to tc on the userspace datapath
    priority: int       # HTB: spare bandwidth goes first to the lowest number


@dataclass(frozen=True)
class FlowRule:
    priority: int
    match: tuple[tuple[str, Any], ...]   # os-ken OFPMatch keyword arguments, sorted
    outputs: tuple[int, ...]             # OpenFlow port numbers, SPECIAL_OUTPUTS' included
    traffic_class: str | None            # steer into this class's queue when the port reserves


@dataclass(frozen=True)
class PortPolicy:
    port_no: int
    capacity_bps: int
    queues: str          # one of QUEUE_MODES
    queue_packets: int = DEFAULT_QUEUE_PACKETS   # packet limit of each class's queue
    discipline: str = "fifo"                      # one of DISCIPLINES


@dataclass(frozen=True)
class SwitchPolicy:
    name: str
    dp_id: int
    flows: tuple[FlowRule, ...]
    ports: tuple[PortPolicy, ...]

    def port(self, port_no: int) -> PortPolicy | None:
        return next((p for p in self.ports if p.port_no == port_no), None)


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    classes: tuple[TrafficClass, ...]
    switches: tuple[SwitchPolicy, ...]
    poll_interval: float
    congestion: CongestionConfig

    def switch(self, dp_id: int) -> SwitchPolicy | None:
        return next((s for s in self.switches if s.dp_id == dp_id), None)

    def traffic_class(self, name: str) -> TrafficClass:
        return next(c for c in self.classes if c.name == name)


def load_document(path: str | Path) -> Any:
    """A policy file's document, read safely (controller/core/document.py), its fields not yet checked."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise PolicyError(f"{path}: cannot read policy file ({err.strerror}); check the path") from None
    return load_yaml(data, str(path))


def load_policy(path: str | Path) -> Policy:
    return parse_policy(load_document(path))


def parse_policy(document: Any) -> Policy:
    doc = _mapping(document, "policy")
    _known_keys(doc, "policy", ("name", "description", "classes", "switches", "congestion"))
    name = _string(doc.get("name"), "name")
    classes = _classes(doc.get("classes", {}))
    poll_interval, congestion = _congestion(doc.get("congestion", {}))
    switches_doc = _mapping(doc.get("switches"), "switches")
    if not switches_doc:
        raise PolicyError("switches: no switch defined; add at least one switch with dp_id and flows")
    switches = tuple(_switch(str(n), s, classes) for n, s in switches_doc.items())
    dp_ids = [s.dp_id for s in switches]
    if len(set(dp_ids)) != len(dp_ids):
        raise PolicyError("switches: two switches share a dp_id; give each switch its own dp_id")
    return Policy(name=name, description=str(doc.get("description", "")), classes=classes,
                  switches=switches, poll_interval=poll_interval, congestion=congestion)


def parse_rate(value: Any, where: str) -> int:
    """'5Mbit', '500kbit', 5000000 → bit/s."""
    if isinstance(value, bool):
        raise PolicyError(f"{where}: {value!r} is not a rate; write e.g. 5Mbit or 500kbit")
    if isinstance(value, (int, float)):
        bps = value
    else:
        m = _RATE.match(str(value))
        unit = m.group(2).lower() if m else None
        if unit not in _RATE_UNITS:
            raise PolicyError(f"{where}: {value!r} is not a rate; write e.g. 5Mbit or 500kbit")
        bps = float(m.group(1)) * _RATE_UNITS[unit]
    if not math.isfinite(bps) or int(bps) <= 0:
        raise PolicyError(f"{where}: {value!r} is not a positive rate of at least 1 bit/s; write e.g. 5Mbit")
    if bps > MAX_RATE_BPS:
        raise PolicyError(f"{where}: {value!r} is above {MAX_RATE_BPS} bit/s (34.36 Gbit/s), the most OVS's "
                          "linux-htb can set; lower it")
    return int(bps)


def _share(value: Any, where: str) -> float:
    """'80%' or 0.8 → 0.8 of the port's capacity."""
    text = str(value).strip()
    try:
        share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise PolicyError(f"{where}: {value!r} is not a share of the port; write e.g. 80%") from None
    if not 0 <= share <= 1:
        raise PolicyError(f"{where}: {value!r} is outside 0%..100%; write a share such as 80%")
    return share


def _classes(doc: Any) -> tuple[TrafficClass, ...]:
    classes = []
    for name, spec in _mapping(doc, "classes").items():
        where = f"classes.{name}"
        spec = _mapping(spec, where)
        _known_keys(spec, where, ("queue", "min", "max", "dscp", "priority"))
        queue = _int(spec.get("queue"), f"{where}.queue", 1, 0xfffe)
        min_share = _share(spec.get("min", 0), f"{where}.min")
        max_share = _share(spec.get("max", "100%"), f"{where}.max")
        if max_share < min_share:
            raise PolicyError(f"{where}.max: below {where}.min; raise max or lower min")
        dscp = _int(spec.get("dscp", queue), f"{where}.dscp", 1, 63)
        priority = _int(spec.get("priority", 0), f"{where}.priority", 0, 7)
        classes.append(TrafficClass(str(name), queue, min_share, max_share, dscp, priority))
    for field in ("queue", "dscp"):
        values = [getattr(c, field) for c in classes]
        if len(set(values)) != len(values):
            raise PolicyError(f"classes: two classes share a {field}; give each class its own {field}")
    if sum(c.min_share for c in classes) > 1 + 1e-9:   # 33% + 56% + 11% is 1.0000000000000002
        raise PolicyError("classes: the min shares add up to more than 100%; lower them")
    return tuple(classes)


def _congestion(doc: Any) -> tuple[float, CongestionConfig]:
    doc = _mapping(doc, "congestion")
    fields = {f.name: f for f in dataclasses.fields(CongestionConfig)}
    _known_keys(doc, "congestion", ("poll_interval", *fields))
    poll_interval = _number(doc.get("poll_interval", 1.0), "congestion.poll_interval", 0.05, 60)
    values = {}
    for key, value in doc.items():
        if key == "poll_interval":
            continue
        where = f"congestion.{key}"
        if key == "samples":
            values[key] = _int(value, where, 1, 1000)
        elif key == "hold_seconds":
            values[key] = _number(value, where, 0, 3600)
        else:
            values[key] = _share(value, where)
    config = CongestionConfig(**values)
    if config.clear_utilisation > config.utilisation:
        raise PolicyError("congestion.clear_utilisation: above congestion.utilisation; "
                          "set it lower so the state cannot flap")
    return poll_interval, config


def _switch(name: str, doc: Any, classes: tuple[TrafficClass, ...]) -> SwitchPolicy:
    where = f"switches.{name}"
    doc = _mapping(doc, where)
    _known_keys(doc, where, ("dp_id", "flows", "ports"))
    dp_id = _int(doc.get("dp_id"), f"{where}.dp_id", 1, 2**64 - 1)
    flows = tuple(_flow(f, f"{where}.flows[{i}]", classes)
                  for i, f in enumerate(_list(doc.get("flows", []), f"{where}.flows")))
    ports = tuple(_port(p, spec, f"{where}.ports.{p}")
                  for p, spec in _mapping(doc.get("ports", {}), f"{where}.ports").items())
    numbers = [p.port_no for p in ports]
    if len(set(numbers)) != len(numbers):
        raise PolicyError(f"{where}.ports: a port is listed twice (e.g. as 1 and \"1\"); keep one entry per port")
    return SwitchPolicy(name=name, dp_id=dp_id, flows=flows, ports=ports)


def _port(port_no: Any, doc: Any, where: str) -> PortPolicy:
    number = _int(port_no, where, 1, MAX_PORT)
    doc = _mapping(doc, where)
    _known_keys(doc, where, ("capacity", "queues", "queue_packets", "discipline"))
    if "capacity" not in doc:
        raise PolicyError(f"{where}.capacity: missing; give the port's rate, e.g. 5Mbit")
    queues = doc.get("queues", "fifo")
    if queues not in QUEUE_MODES:
        raise PolicyError(f"{where}.queues: {queues!r} is not one of {', '.join(QUEUE_MODES)}")
    discipline = doc.get("discipline", "fifo")
    if discipline not in DISCIPLINES:
        raise PolicyError(f"{where}.discipline: {discipline!r} is not one of {', '.join(DISCIPLINES)}")
    queue_packets = _int(doc.get("queue_packets", DEFAULT_QUEUE_PACKETS), f"{where}.queue_packets", 1, 100_000)
    return PortPolicy(number, parse_rate(doc["capacity"], f"{where}.capacity"), queues, queue_packets, discipline)


def _flow(doc: Any, where: str, classes: tuple[TrafficClass, ...]) -> FlowRule:
    doc = _mapping(doc, where)
    _known_keys(doc, where, ("priority", "match", "actions", "class"))
    priority = _int(doc.get("priority", 1000), f"{where}.priority", 0, 65535)
    match = _match(doc.get("match", {}), f"{where}.match")
    outputs = tuple(_action(a, f"{where}.actions[{i}]")
                    for i, a in enumerate(_list(doc.get("actions", []), f"{where}.actions")))
    traffic_class = doc.get("class")
    if traffic_class is not None:
        if traffic_class not in {c.name for c in classes}:
            raise PolicyError(f"{where}.class: {traffic_class!r} is not defined under classes; "
                              "define it or fix the name")
        if len(outputs) != 1 or outputs[0] > MAX_PORT:
            raise PolicyError(f"{where}.class: a classified flow needs exactly one output to a "
                              "numbered port; split it into one flow per port")
        if dict(match).get("eth_type") != ETH_TYPE_IPV4:
            raise PolicyError(f"{where}.class: classes steer IPv4 only; add ip_proto or "
                              "eth_type: 0x0800 to the match")
    return FlowRule(priority, match, outputs, traffic_class)


def _match(doc: Any, where: str) -> tuple[tuple[str, Any], ...]:
    doc = _mapping(doc, where)
    fields: dict[str, Any] = {}
    for key, value in doc.items():
        at = f"{where}.{key}"
        if key == "in_port":
            fields[key] = _int(value, at, 1, MAX_PORT)
        elif key == "eth_type":
            fields[key] = _int(value, at, 0, 0xffff)
        elif key in ("eth_src", "eth_dst"):
            if not _MAC.match(str(value)):
                raise PolicyError(f"{at}: {value!r} is not a MAC address; write aa:bb:cc:dd:ee:ff")
            fields[key] = str(value).lower()
        elif key in ("ipv4_src", "ipv4_dst"):
            try:
                net = ipaddress.IPv4Network(str(value))
            except ValueError:
                raise PolicyError(f"{at}: {value!r} is not an IPv4 address or prefix (host bits must be 0)") from None
            # as a switch reports it back: an address, or (address, netmask) for a prefix
            fields[key] = str(net.network_address) if net.prefixlen == 32 else \
                (str(net.network_address), str(net.netmask))
        elif key == "ip_proto":
            if isinstance(value, str) and value not in IP_PROTOS:
                raise PolicyError(f"{at}: {value!r} is not a protocol; use tcp, udp, icmp or a number 0-255")
            fields[key] = IP_PROTOS[value] if isinstance(value, str) else _int(value, at, 0, 255)
        elif key in ("tcp_src", "tcp_dst", "udp_src", "udp_dst"):
            fields[key] = _int(value, at, 0, 65535)
        elif key == "ip_dscp":
            fields[key] = _int(value, at, 0, 63)
        else:
            raise PolicyError(f"{at}: unknown match field; use in_port, eth_type, eth_src, eth_dst, "
                              "ipv4_src, ipv4_dst, ip_proto, tcp_src, tcp_dst, udp_src, udp_dst or ip_dscp")
    # OpenFlow prerequisites: IP fields need eth_type IPv4, L4 ports need their ip_proto.
    if any(k.startswith(("ipv4_", "ip_")) for k in fields):
        if fields.setdefault("eth_type", ETH_TYPE_IPV4) != ETH_TYPE_IPV4:
            raise PolicyError(f"{where}.eth_type: IPv4 fields need eth_type 0x0800")
    for proto in ("tcp", "udp"):
        if any(k.startswith(proto + "_") for k in fields) and fields.get("ip_proto") != IP_PROTOS[proto]:
            raise PolicyError(f"{where}.ip_proto: {proto} ports need ip_proto: {proto}")
    return tuple(sorted(fields.items()))


def _action(doc: Any, where: str) -> Any:
    doc = _mapping(doc, where)
    _known_keys(doc, where, ("output",))
    if "output" not in doc:
        raise PolicyError(f"{where}: missing output; write {{output: 1}}")
    port = doc["output"]
    if isinstance(port, str) and port in SPECIAL_OUTPUTS:
        return SPECIAL_OUTPUTS[port]
    if isinstance(port, str) and not port.strip().lstrip("-").isdigit():
        raise PolicyError(f"{where}.output: {port!r} is not a port; use a number from 1 to {MAX_PORT} or one of "
                          f"{', '.join(SPECIAL_OUTPUTS)}")
    return _int(port, f"{where}.output", 1, MAX_PORT)


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PolicyError(f"{where}: expected a mapping of keys to values, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise PolicyError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _known_keys(doc: dict, where: str, allowed: tuple[str, ...]) -> None:
    for key in doc:
        if key not in allowed:
            raise PolicyError(f"{where}.{key}: unknown key; use one of {', '.join(allowed)}")


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PolicyError(f"{where}: missing or empty; give the policy a name")
    return value


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or value is None:
        raise PolicyError(f"{where}: expected a whole number from {low} to {high}")
    try:
        number = int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError, OverflowError):
        raise PolicyError(f"{where}: {value!r} is not a whole number from {low} to {high}") from None
    if number != value and not isinstance(value, str) or not low <= number <= high:
        raise PolicyError(f"{where}: {value!r} is not a whole number from {low} to {high}")
    return number


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:  # NaN fails too
        raise PolicyError(f"{where}: {value!r} is not a number from {low} to {high}")
    return float(value)
