"""What the core is told (controller/core/controller.py handles each): a switch connection's life, the
switch's OpenFlow replies read into the core's own types, timers it asked for, REST requests, what
the OVSDB/tc worker and netlink report, and the outcome of each I/O the core asked for (an action).
The app (controller/qos_app.py) only translates os-ken's events into these; a test builds them directly.

A switch connection is a number of the app's (`conn`), not a datapath id: two connections may claim
one datapath id, and only one of them is the switch (controller/core/controller.py decides which).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.core.jobs import JobResult
from controller.core.plan import ActualFlow
from controller.core.policy import Police
from controller.core.stats import FlowCounters, MeterCounters, PortCounters, QueueCounters

# --- connections -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SwitchUp:
    """A connection finished the OpenFlow handshake claiming `dp_id`, with these OpenFlow ports."""
    conn: int
    dp_id: int
    ports: frozenset[int]
    down: frozenset[int] = frozenset()      # those whose link is down


@dataclass(frozen=True)
class SwitchDown:
    conn: int


@dataclass(frozen=True)
class PortsChanged:
    """The switch announced a port added, changed or removed; `ports` is its set now, `down` those whose
    link is down."""
    conn: int
    ports: frozenset[int]
    down: frozenset[int] = frozenset()


@dataclass(frozen=True)
class PacketIn:
    """A packet the switch sent us (under a policy's `network:`: controller/core/site.py says which)."""
    conn: int
    in_port: int
    data: bytes
    table: int = 0                          # the table whose entry sent it


# --- OpenFlow replies (multipart replies joined whole by the app) -----------------------------------

@dataclass(frozen=True)
class FlowStatsReply:
    conn: int
    xid: int
    flows: dict[int, ActualFlow]            # cookie → the flow, ours only
    counters: dict[int, FlowCounters]       # cookie → its counters


@dataclass(frozen=True)
class FlowsChanged:
    """What the switch's flow monitor says: the flows of ours that another connection added, changed or deleted
    (with their meter too); None: it paused and lost count. `xid`: our monitor request's when it answers it (the
    monitor is in force), 0 in the updates it sends unasked."""
    conn: int
    xid: int
    cookies: frozenset[int] | None


@dataclass(frozen=True)
class FlowRemoved:
    """A flow of ours gone from the switch, deleted by anyone (ourselves too): the switch says so unasked. One that
    goes with its meter is not said (OpenFlow 1.3 has no reason for it): the classified flows' read shows that."""
    conn: int
    cookie: int


@dataclass(frozen=True)
class MeterConfigReply:
    conn: int
    xid: int
    meters: dict[int, Police | None]        # ours → its band (None: not one we would write)


@dataclass(frozen=True)
class MeterStatsReply:
    conn: int
    xid: int
    counters: dict[int, MeterCounters]      # ours only


@dataclass(frozen=True)
class MeterFeaturesReply:
    conn: int
    xid: int
    cannot_police: str | None               # why the switch cannot police, or None when it can


@dataclass(frozen=True)
class QueueStatsReply:
    conn: int
    xid: int
    queues: dict[tuple[int, int], QueueCounters]   # (port, queue) → counters


@dataclass(frozen=True)
class PortStatsReply:
    conn: int
    xid: int
    ports: dict[int, PortCounters]


@dataclass(frozen=True)
class BarrierReply:
    conn: int
    xid: int


@dataclass(frozen=True)
class ErrorReply:
    conn: int
    xid: int
    what: str                               # "OFPET_…/OFP…C_…"


@dataclass(frozen=True)
class RoleReply:
    conn: int
    xid: int
    role: str                               # "master", "slave" or "equal"
    generation: int | None                  # the bridge's generation id; None while none was ever set


@dataclass(frozen=True)
class EchoReply:
    conn: int
    xid: int


# --- timers the core set (actions.Later) ------------------------------------------------------------

@dataclass(frozen=True)
class PollDue:
    conn: int
    due: float                              # when it was meant to run (its lag is measured against it)
    fast: bool = False                      # a fast poll of the ports near their capacity


@dataclass(frozen=True)
class BridgeDue:
    """Read the switch's bridge from OVSDB again (its ports are numbered a moment after they appear)."""
    conn: int
    tries: int


@dataclass(frozen=True)
class TableDue:
    """Read the switch's flow table: it said a flow of ours was deleted a moment ago, and is still there."""
    conn: int


@dataclass(frozen=True)
class ClaimDue:
    """Whether a connection that claims a live switch's datapath id is the switch: its time is up."""
    conn: int


@dataclass(frozen=True)
class DiscoveryDue:
    """A round of the fabric's discovery (controller/core/fabric.py): probes out, silent links lost."""
    due: float


@dataclass(frozen=True)
class ConfirmDue:
    """A change's time to be answered has come, whether every switch is in sync or not."""


# --- REST requests: `token` is the app's handle for the answer (actions.Answer) ------------------------

@dataclass(frozen=True)
class GetPolicy:
    token: Any


ANY_POLICY = -1                    # If-Match: *: the change holds only if some policy is in force


@dataclass(frozen=True)
class SetPolicy:
    token: Any
    document: Any
    expect: int | None = None      # If-Match: the change holds only if the policy in force is at this revision


@dataclass(frozen=True)
class ClearPolicy:
    token: Any
    expect: int | None = None


@dataclass(frozen=True)
class GetStatus:
    token: Any


Request = GetPolicy | SetPolicy | ClearPolicy | GetStatus


# --- what the app did for the core (each answers an action) and what it reports ------------------------

@dataclass(frozen=True)
class Reload:
    """The configured policy file, read again (SIGHUP): put in force as a PUT would be."""
    document: Any


@dataclass(frozen=True)
class JobsDone:
    results: tuple[JobResult, ...]


@dataclass(frozen=True)
class TcChanged:
    """Netlink announced tc changes on these devices (ifindex); None: announcements were lost."""
    devices: frozenset[int] | None


@dataclass(frozen=True)
class RemotesChanged:
    """The OVSDB remotes' states, those connected just now, and the owner's lock on the first remote."""
    connected: dict[str, bool]
    new: tuple[str, ...] = ()
    locked: bool = True                     # this controller holds the lock (or needs none: no standby)
    taken: bool = False                     # another controller of the owner holds it
    heartbeat: int = 0                      # the lock holder's heartbeat, as the first remote holds it
    silent: float = 0.0                     # seconds since the first remote last said anything to us
    errors: dict[str, str] = field(default_factory=dict)   # why a remote is not connected


@dataclass(frozen=True)
class Beaten:
    """The answer to actions.Beat: whether OVSDB committed it (so the lock was ours when it was sent)."""
    at: float
    ok: bool


@dataclass(frozen=True)
class MemberSync:
    """What a member of a cluster says, in etcd, of the switches it owns: the revision of the cluster's policy it
    has in force, and per switch whether it holds it (in_sync), whether it is done trying (settled), and what
    is not in sync and why (errors)."""
    revision: int
    switches: dict[int, dict[str, Any]]


@dataclass(frozen=True)
class ClusterChanged:
    """The coordination service's state, read every second and whenever it changes (controller/core/cluster.py)."""
    members: tuple[str, ...] | None         # the group's members; None: etcd did not answer
    owners: dict[int, str]                  # switch → the member whose ownership key it has
    revision: int                           # etcd's revision when they were read
    policy: tuple[int, Any] | None          # the cluster's policy: (its key's revision, document or None)
    refreshed_at: float | None              # when the lease refresh etcd answered was sent; None: it failed
    unreachable: dict[str, frozenset[int]] = field(default_factory=dict)   # member → switches it cannot reach
    sync: dict[str, MemberSync] = field(default_factory=dict)              # member → what it says it holds
    restored: str | None = None             # etcd lost its data, and this member recovered from it: how
    revisions: dict[int, int] = field(default_factory=dict)   # switch → its ownership key's revision
    probe_key: bytes | None = None          # what the members sign their discovery frames with


@dataclass(frozen=True)
class SwitchClaimed:
    """The answer to actions.ClaimSwitch: the ownership key's revision, or None when another holds it."""
    dp_id: int
    revision: int | None


@dataclass(frozen=True)
class LockHeld:
    """Another controller of our owner holds the lock, and this one is configured without a standby."""
    reason: str


@dataclass(frozen=True)
class GenerationClaimed:
    """The answer to actions.ClaimGeneration: the new id, or None when OVSDB refused it."""
    generation: int | None


@dataclass(frozen=True)
class PolicySaved:
    """The answer to actions.SavePolicy: None, or why the store refused it."""
    error: str | None
    revision: int = 0                       # the revision now in force (in a cluster: the policy key's in etcd)
    changed: bool = True                    # False: the store held this very document already (a cluster's says)
    conflict: bool = False                  # the store's revision was not the one the change expected: `revision`
    indeterminate: bool = False             # the store's answer was lost: `error` says so; it may have saved it


@dataclass(frozen=True)
class PolicyLoaded:
    """The answer to actions.LoadPolicy: what the store holds (one of the SAVED_* kinds of
    controller/core/controller.py, with its document), or why it cannot be read."""
    saved: str
    document: Any = None
    error: str | None = None
    revision: int = 0


# --- what the controller tells one switch (controller/core/switch.py) ----------------------------------

@dataclass(frozen=True)
class PolicyInstalled:
    """The policy in force changed (or a take-over loaded it): desired state anew, then reconcile."""


@dataclass(frozen=True)
class RoleDue:
    """The controller's generation id or role changed: claim the role again where it matters."""


@dataclass(frozen=True)
class TakingOver:
    """The controller became active: read the switch anew, claim it, poll it."""


@dataclass(frozen=True)
class StandingDown:
    """The controller is the standby now: slave, no more polls."""


@dataclass(frozen=True)
class Reconcile:
    """Something outside the switch may differ (OVSDB moved, a check is due): compare again."""


@dataclass(frozen=True)
class Relieved:
    """The answer to a deferred program of a link port's queues: traffic was moved off it, or not (it reserves)."""
    port_no: int
    moved: bool


@dataclass(frozen=True)
class FabricChanged:
    """What the fabric says of the switch changed (links, hosts, paths): its table anew, then reconcile."""


SwitchEvent = (PortsChanged | PacketIn | BridgeDue | TableDue | PollDue | RoleReply | ErrorReply | BarrierReply
               | FlowStatsReply | FlowsChanged | FlowRemoved | MeterFeaturesReply | MeterConfigReply | MeterStatsReply
               | QueueStatsReply | PortStatsReply | EchoReply | JobsDone | TcChanged | PolicyInstalled | RoleDue
               | TakingOver | StandingDown | Reconcile | FabricChanged | Relieved)
Event = (SwitchUp | SwitchDown | PortsChanged | PacketIn | BridgeDue | TableDue | PollDue | RoleReply | ErrorReply
         | BarrierReply | FlowStatsReply | FlowsChanged | FlowRemoved | MeterFeaturesReply | MeterConfigReply
         | MeterStatsReply | QueueStatsReply | PortStatsReply | EchoReply | ClaimDue | DiscoveryDue | ConfirmDue
         | GetPolicy | SetPolicy | ClearPolicy | GetStatus | Reload | JobsDone | TcChanged | RemotesChanged | Beaten
         | ClusterChanged | SwitchClaimed | LockHeld | GenerationClaimed | PolicySaved | PolicyLoaded)
