"""Policy → the OVS QoS (linux-htb, or linux-hfsc) a port should have, and the queue under each of its classes.

Pure. Queue 0 is the HTB default class: OVS sends everything not steered elsewhere there, so it
must exist in every QoS (docs/datapath.md).

Each class's queue (its leaf qdisc) is the port's discipline, `queue_packets` long. A FIFO drops
from the head on the userspace datapath: a tail drop makes the kernel answer OVS's sendmmsg with
ENOBUFS, and OVS (netdev_linux_sock_batch_send, 3.1) then abandons the rest of its send batch,
so packets of other classes vanish uncounted (measured: 8 % of TCP's segments, none of them
dropped by TCP's own class). A head drop answers NET_XMIT_CN, which AF_PACKET does not report.

An emulated link whose interface declares a delay gets netem under each class (leaf_chain): a packet
waits out the delay there, and HTB takes it at the class's rate once it is due. A FIFO's place is taken
by netem's own: its limit counts what is in flight as well as what waits, so it is the queue's length
plus what the delay holds at the link's rate, and its drops are tail drops at enqueue, which HTB counts
as the class's (OVS's queue statistics, so `auto`'s loss, see them). A class offered more than its rate
keeps (offered - rate) x delay more packets in flight, its queue that much shorter; Mininet's TCLink
(netem with max_queue_size) has the same. Any other discipline goes below netem, whose limit then only
has to hold what is in flight; its drops happen as netem hands packets on, which HTB does not count,
as it counts no AQM's dequeue drops. netem's tail drop is why the launcher declares delays on the
kernel datapath only (the userspace datapath's ENOBUFS, above).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from controller.core.policy import Policy, PortPolicy

MTU_BYTES = 1514      # a full Ethernet frame: RED's byte thresholds, and what a delay holds in flight
NETEM_LIMIT = 10_000  # packets netem may hold in flight above another discipline: 100 ms of 1.2 Gbit/s
FIFO_KINDS = ("pfifo", "pfifo_head_drop")


@dataclass(frozen=True)
class QueueSpec:
    queue_id: int
    min_bps: int
    max_bps: int
    traffic_class: str      # "default" for queue 0
    priority: int = 0       # HTB borrowing order: lower first


@dataclass(frozen=True)
class OvsdbQos:
    """What OVSDB holds for a port: the QoS row and its Queue rows, as read back."""
    mode: str
    max_bps: int
    queues: tuple[QueueSpec, ...]
    qos_type: str = "linux-htb"


@dataclass(frozen=True)
class QosSpec:
    mode: str               # "fifo" or "reserve"
    max_bps: int
    queues: tuple[QueueSpec, ...]
    marks: tuple[tuple[int, int], ...]   # (dscp, queue_id) for tc filters on the userspace datapath
    leaf: tuple[str, ...]                # tc qdisc spec under every class: kind, then its arguments
    qos_type: str = "linux-htb"          # linux-hfsc has no HTB priority: OVS ignores the queues' priority
    delay_us: int = 0                    # an emulated link's one-way delay: netem under each class (leaf_chain)

    @property
    def ovsdb(self) -> OvsdbQos:
        return OvsdbQos(self.mode, self.max_bps, self.queues, self.qos_type)


def leaf_spec(port: PortPolicy, userspace: bool) -> tuple[str, ...]:
    limit = str(port.queue_packets)
    if port.discipline == "fifo":
        return ("pfifo_head_drop" if userspace else "pfifo", "limit", limit)
    if port.discipline == "sfq":
        return ("sfq", "limit", limit, "perturb", "10")
    if port.discipline in ("codel", "fq_codel"):
        return (port.discipline, "limit", limit)
    # red: tc's own defaults for a byte limit: max a quarter of it, min a third of max; burst as tc requires.
    limit_bytes = port.queue_packets * MTU_BYTES
    high = limit_bytes // 4
    low, avpkt = high // 3, 1000
    return ("red", "limit", str(limit_bytes), "min", str(low), "max", str(high), "avpkt", str(avpkt),
            "burst", str((2 * low + high) // (3 * avpkt) + 1), "bandwidth", f"{port.capacity_bps}bit")


def fifo_qos(port: PortPolicy, userspace: bool, delay_us: int = 0) -> QosSpec:
    """One queue at the port's capacity: the study's single FIFO bottleneck."""
    queue = QueueSpec(0, port.capacity_bps, port.capacity_bps, "default")
    return QosSpec("fifo", port.capacity_bps, (queue,), (), leaf_spec(port, userspace), port.qos_type, delay_us)


def reserve_qos(policy: Policy, port: PortPolicy, userspace: bool, delay_us: int = 0) -> QosSpec:
    """An HTB class per traffic class; queue 0 keeps what the classes do not reserve. In queue order, as
    OVSDB's queues read back (a policy may list its classes in any order)."""
    cap = port.capacity_bps
    ordered = sorted(policy.classes, key=lambda c: c.queue)
    classes = [QueueSpec(c.queue, max(int(cap * c.min_share), 1), int(cap * c.max_share), c.name, c.priority)
               for c in ordered]
    # Queue 0 keeps exactly the rest; HTB needs a positive rate, and 1 % keeps ARP and
    # unclassified traffic alive even when the classes reserve everything.
    default_min = max(cap - sum(q.min_bps for q in classes), cap // 100)
    queues = [QueueSpec(0, default_min, cap, "default"), *classes]
    marks = tuple((c.dscp, c.queue) for c in ordered)
    return QosSpec("reserve", cap, tuple(queues), marks, leaf_spec(port, userspace), port.qos_type, delay_us)


def desired_qos(policy: Policy, port: PortPolicy, reserving: bool, userspace: bool, delay_us: int = 0) -> QosSpec:
    return reserve_qos(policy, port, userspace, delay_us) if reserving else fifo_qos(port, userspace, delay_us)


def leaf_chain(spec: QosSpec) -> tuple[tuple[str, ...], ...]:
    """The qdiscs under each class, from the class down: its queue, or on a delayed link netem (alone in a
    FIFO's place, else above the discipline). Each a tc qdisc spec: kind, then its arguments."""
    if not spec.delay_us:
        return (spec.leaf,)
    netem = ("netem", "delay", f"{spec.delay_us}us", "limit")
    if spec.leaf[0] in FIFO_KINDS:
        in_flight = math.ceil(spec.max_bps * spec.delay_us / 1e6 / 8 / MTU_BYTES)
        return (netem + (str(packet_limit(spec.leaf) + in_flight),),)
    return (netem + (str(NETEM_LIMIT),), spec.leaf)


def leaf_in_force(spec: QosSpec) -> tuple[str, int | None, int]:
    """How a class's leaf reads back when it is what `spec` says (controller/adapters/tc.py, Tc.leaves):
    the kind of the queue at the bottom, its packet limit (a FIFO's or netem's; None for the others, which
    are compared by kind), and netem's delay above it."""
    bottom = leaf_chain(spec)[-1]
    limited = bottom[0] in FIFO_KINDS or bottom[0] == "netem"
    return bottom[0], packet_limit(bottom) if limited else None, spec.delay_us


def packet_limit(qdisc: tuple[str, ...]) -> int:
    return int(qdisc[qdisc.index("limit") + 1])
