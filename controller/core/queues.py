"""Policy → the OVS QoS (linux-htb, or linux-hfsc) a port should have, and the queue under each of its classes.

Pure. Queue 0 is the HTB default class: OVS sends everything not steered elsewhere there, so it
must exist in every QoS (docs/datapath.md).

Each class's queue (its leaf qdisc) is the port's discipline, `queue_packets` long. A FIFO drops
from the head on the userspace datapath: a tail drop makes the kernel answer OVS's sendmmsg with
ENOBUFS, and OVS (netdev_linux_sock_batch_send, 3.1) then abandons the rest of its send batch,
so packets of other classes vanish uncounted (measured: 8 % of TCP's segments, none of them
dropped by TCP's own class). A head drop answers NET_XMIT_CN, which AF_PACKET does not report.
"""
from __future__ import annotations

from dataclasses import dataclass

from controller.core.policy import Policy, PortPolicy

MTU_BYTES = 1514      # a full Ethernet frame, for RED's byte thresholds


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


def fifo_qos(port: PortPolicy, userspace: bool) -> QosSpec:
    """One queue at the port's capacity: the study's single FIFO bottleneck."""
    queue = QueueSpec(0, port.capacity_bps, port.capacity_bps, "default")
    return QosSpec("fifo", port.capacity_bps, (queue,), (), leaf_spec(port, userspace), port.qos_type)


def reserve_qos(policy: Policy, port: PortPolicy, userspace: bool) -> QosSpec:
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
    return QosSpec("reserve", cap, tuple(queues), marks, leaf_spec(port, userspace), port.qos_type)


def desired_qos(policy: Policy, port: PortPolicy, reserving: bool, userspace: bool) -> QosSpec:
    return reserve_qos(policy, port, userspace) if reserving else fifo_qos(port, userspace)
