"""OVSDB and tc work the core asks of a remote's worker (controller/adapters/worker.py), and what the
worker reports back. Pure data: the core plans jobs, the worker carries them out off the event loop."""
from __future__ import annotations

from dataclasses import dataclass, field

from controller.core.queues import QosSpec


@dataclass(frozen=True)
class Job:
    dp_id: int
    conn: int                   # the switch connection that asked: a reconnected switch ignores the old one's
    port_no: int
    iface: str
    userspace: bool
    spec: QosSpec | None        # the queues the port must have; None: ours off the port
    qos: bool                   # OVSDB must change; False: only check the port's tc
    rebuild: bool = False       # take the QoS off first, so that OVS builds its qdisc anew
    tags: tuple[tuple[str, str], ...] = ()   # external_ids beside the owner tag (policy, dp_id)
    epoch: int = 0              # a cluster member's ownership epoch of the switch, a condition of the write
    bare: bool = False          # OVSDB held no QoS on the port: OVS keeps no qdisc there, so no filter of ours


@dataclass
class JobResult:
    job: Job
    error: str | None = None
    tc: list[str] = field(default_factory=list)   # what was changed on the device
    ifindex: int | None = None
    missing: bool = False                         # a check found the QoS's HTB classes gone from the device
