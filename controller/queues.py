"""Policy → the OVS QoS (linux-htb) a port should have.

Pure. Queue 0 is the HTB default class: OVS sends everything not steered
elsewhere there, so it must exist in every QoS (PLATFORM.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from controller.policy import Policy, PortPolicy


@dataclass(frozen=True)
class QueueSpec:
    queue_id: int
    min_bps: int
    max_bps: int
    traffic_class: str      # "default" for queue 0
    priority: int = 0       # HTB borrowing order: lower first


@dataclass(frozen=True)
class QosSpec:
    mode: str               # "fifo" or "reserve"
    max_bps: int
    queues: tuple[QueueSpec, ...]
    marks: tuple[tuple[int, int], ...]   # (dscp, queue_id) for tc filters on the userspace datapath


def fifo_qos(port: PortPolicy) -> QosSpec:
    """One queue at the port's capacity: the study's single FIFO bottleneck."""
    queue = QueueSpec(0, port.capacity_bps, port.capacity_bps, "default")
    return QosSpec("fifo", port.capacity_bps, (queue,), ())


def reserve_qos(policy: Policy, port: PortPolicy) -> QosSpec:
    """An HTB class per traffic class; queue 0 keeps what the classes do not reserve."""
    cap = port.capacity_bps
    classes = [QueueSpec(c.queue, max(int(cap * c.min_share), 1), int(cap * c.max_share), c.name, c.priority)
               for c in policy.classes]
    # Queue 0 keeps exactly the rest; HTB needs a positive rate, and 1 % keeps ARP and
    # unclassified traffic alive even when the classes reserve everything.
    default_min = max(cap - sum(q.min_bps for q in classes), cap // 100)
    queues = [QueueSpec(0, default_min, cap, "default"), *classes]
    marks = tuple((c.dscp, c.queue) for c in policy.classes)
    return QosSpec("reserve", cap, tuple(queues), marks)


def desired_qos(policy: Policy, port: PortPolicy, reserving: bool) -> QosSpec:
    return reserve_qos(policy, port) if reserving else fifo_qos(port)
