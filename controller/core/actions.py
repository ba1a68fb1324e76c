"""What the core asks the app to do: OpenFlow messages to send (described here, built by
controller/adapters/openflow.py), connections to close, OVSDB/tc jobs, REST answers, timers, and every
other I/O (a generation id, the saved policy, the lock), each answered by an event.

Every OpenFlow message carries the xid the core chose, so that a reply or an error is matched to what
asked for it by the core itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.core import events as ev
from controller.core.congestion import Decision
from controller.core.flows import FlowEntry
from controller.core.jobs import Job
from controller.core.policy import Police

# --- OpenFlow messages -----------------------------------------------------------------------------

@dataclass(frozen=True)
class AddFlow:
    xid: int
    entry: FlowEntry


@dataclass(frozen=True)
class ModifyFlow:
    """Same priority and match, other actions; the flow's counters are kept."""
    xid: int
    entry: FlowEntry


@dataclass(frozen=True)
class DeleteFlow:
    """Our flow with exactly this cookie, from every table."""
    xid: int
    cookie: int


@dataclass(frozen=True)
class MeterMod:
    xid: int
    command: str                 # add, modify or delete
    meter: int
    band: Police | None = None


@dataclass(frozen=True)
class Barrier:
    xid: int


# Statistics a poll or a check asks for.
FLOWS = "flows"                  # every flow of ours
CLASSIFIED_FLOWS = "classified flows"   # the flows of traffic classes only (their counters are the class rates)
METER_CONFIG = "meter config"
METER_STATS = "meter stats"
METER_FEATURES = "meter features"
QUEUES = "queues"
PORTS = "ports"
FLOW_MONITOR = "flow monitor"     # not statistics: from its reply on, the switch says each change others make


@dataclass(frozen=True)
class StatsRequest:
    xid: int
    kind: str                    # one of the kinds above
    port: int | None = None      # queues and ports: this port only; classified flows: those output to it


@dataclass(frozen=True)
class RoleRequest:
    xid: int
    role: str                    # master, slave, or nochange (to learn the bridge's generation id)
    generation: int = 0


@dataclass(frozen=True)
class Echo:
    xid: int


@dataclass(frozen=True)
class PacketOut:
    """A packet sent out of these ports of the switch (from the controller, so any port may be one)."""
    xid: int
    outputs: tuple[int, ...]
    data: bytes


@dataclass(frozen=True)
class HearAsSlave:
    """Ask the switch to send this connection its packet-ins as a slave too (OpenFlow's asynchronous
    configuration): a standby, or a cluster's member that does not own the switch, hears its probes and hosts
    as the owner does, so that every controller of the network knows the same links and hosts."""
    xid: int


Message = (AddFlow | ModifyFlow | DeleteFlow | MeterMod | Barrier | StatsRequest | RoleRequest | Echo | PacketOut
           | HearAsSlave)
WRITES = (AddFlow, ModifyFlow, DeleteFlow, MeterMod, PacketOut)


# --- actions -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Send:
    conn: int
    messages: tuple[Message, ...]


@dataclass(frozen=True)
class Close:
    """Drop a connection (one that claimed a datapath id it is not)."""
    conn: int


@dataclass(frozen=True)
class Submit:
    """Jobs for the worker of an OVSDB remote; `sweep` also removes our rows no port uses any more; `epochs`
    (datapath id, epoch) raises a cluster member's epochs of switches it now owns, before any write of its."""
    remote: str
    jobs: tuple[Job, ...] = ()
    sweep: bool = False
    epochs: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Answer:
    token: Any
    result: Any = None
    error: Exception | None = None


@dataclass(frozen=True)
class Later:
    """Hand `event` back to the core after `seconds`, or up to `slack` seconds after that: timers that may wait
    are handed back together with others (controller/adapters/timers.py)."""
    seconds: float
    event: ev.Event
    slack: float = 0.0


# I/O the core asks for; the app does it off the event loop and reports with the event named.

@dataclass(frozen=True)
class ClaimGeneration:
    """A new OpenFlow generation id, newer than `above` (events.GenerationClaimed)."""
    above: int


@dataclass(frozen=True)
class SavePolicy:
    """Keep `document` (None: cleared) across restarts (events.PolicySaved). `revision`: what to keep it as (a
    cluster's store numbers its own); `expect`: in a cluster, only if the stored one is still at this revision."""
    document: Any
    revision: int = 0
    expect: int | None = None


@dataclass(frozen=True)
class LoadPolicy:
    """Read the policy the owner's active controller last saved (events.PolicyLoaded)."""


@dataclass(frozen=True)
class Beat:
    """One heartbeat in the first OVSDB remote, as the lock's holder (events.Beaten)."""
    at: float                    # when it is asked for: a confirmation holds from then


@dataclass(frozen=True)
class StealLock:
    """Take the owner's lock from a holder whose heartbeat stood still (events.RemotesChanged follows)."""


@dataclass(frozen=True)
class ClaimSwitch:
    """Create the switch's ownership key on this member's lease (renew: put ours again, for a newer
    revision) in one etcd transaction (events.SwitchClaimed)."""
    dp_id: int
    renew: bool


@dataclass(frozen=True)
class ReleaseSwitch:
    """Delete the switch's ownership key if it is still ours at `revision` (never a later claim of ours): the ring
    gives the switch to another member, or we cannot reach it."""
    dp_id: int
    revision: int


@dataclass(frozen=True)
class Unreachable:
    """Tell the other members which switches this one cannot reach in OVSDB: the ring passes it over for them."""
    dp_ids: frozenset[int]


@dataclass(frozen=True)
class PublishSync:
    """Tell the other members what this one holds of the cluster's policy (a change's answer waits for it)."""
    sync: ev.MemberSync


@dataclass(frozen=True)
class Exit:
    """End the process: this controller must not run beside the one that holds the lock."""
    code: int
    reason: str


Action = (Send | Close | Submit | Answer | Later | ClaimGeneration | SavePolicy | LoadPolicy | Beat | StealLock
          | ClaimSwitch | ReleaseSwitch | Unreachable | PublishSync | Exit)


# What a switch tells its controller (controller/core/switch.py → controller.py); never reaches the app.

@dataclass(frozen=True)
class NeedGeneration:
    """The switch has seen generation id `above` (or none): claiming it as master needs a newer one."""
    dp_id: int
    above: int


@dataclass(frozen=True)
class Decided:
    """The detector changed a port's queues (deferred: asks whether traffic can be moved off it instead)."""
    dp_id: int
    port_no: int
    decision: Decision
    deferred: bool = False


@dataclass(frozen=True)
class Loads:
    """A poll's figures for adaptive paths (controller/core/placement.py): bit/s sent by the switch's link ports,
    bit/s of its routes (host → rate), and the link ports' capacities."""
    dp_id: int
    ports: dict[int, float]
    routes: dict[str, float]
    capacity: dict[int, int]


SwitchAction = Action | NeedGeneration | Decided | Loads
