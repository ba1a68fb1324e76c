"""Desired against actual → the changes that make a switch and its ports what the policy says (pure).

Flows of ours are keyed by cookie, one per policy rule (controller/core/flows.py); what the switch
holds comes from its flow statistics. Queues are what OVSDB holds on each port, read back row by
row, against the QosSpec the port should have. Nothing is changed that is already right, so a
restarted controller, or the same policy put again, changes nothing.

Order without waiting: flows steer into a port's class queues only once OVSDB holds them, and a
port keeps its reservation queues while the switch's flows still steer into them. So a program
puts the queues first and a rollback takes the steering off first, each step as soon as the one
before it is confirmed.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from controller.core.flows import FlowEntry
from controller.core.meters import MeterChanges, meter_changes
from controller.core.policy import Police
from controller.core.queues import OvsdbQos, QosSpec, leaf_in_force
from controller.core.switch_state import SwitchState

FOREIGN = "foreign"   # the port has a QoS some other tool made: never touched
ABSENT = "absent"     # the port is not in OVSDB (it is being created or removed): nothing to do yet


@dataclass(frozen=True)
class ActualFlow:
    """One of our flows as the switch reports it."""
    priority: int
    match: tuple[tuple[str, Any], ...]
    actions: tuple[tuple[Any, ...], ...]
    table: int = 0


@dataclass(frozen=True)
class FlowChanges:
    delete: tuple[int, ...] = ()              # cookies whose flows must go
    modify: tuple[FlowEntry, ...] = ()        # same priority and match, other actions (counters kept)
    add: tuple[FlowEntry, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.delete or self.modify or self.add)

    def applied_to(self, flows: dict[int, ActualFlow]) -> dict[int, ActualFlow]:
        """What the switch holds once these changes are confirmed."""
        after = {c: f for c, f in flows.items() if c not in self.delete}
        after.update({e.cookie: ActualFlow(e.priority, e.match, e.actions, e.table) for e in (*self.modify, *self.add)})
        return after


@dataclass(frozen=True)
class Plan:
    flows: FlowChanges
    meters: MeterChanges                      # sent in the flows' batch: added before them, deleted after
    qos: dict[int, QosSpec | None]            # port → the queues it must get (None: ours removed)
    specs: dict[int, QosSpec]                 # port → the queues it should have now (tc is checked against)


def flow_changes(desired: Iterable[FlowEntry], actual: dict[int, ActualFlow]) -> FlowChanges:
    wanted = {e.cookie: e for e in desired}
    delete, modify, add = [], [], []
    for cookie, flow in actual.items():
        entry = wanted.get(cookie)
        if entry is None or (entry.priority, entry.match, entry.table) != (flow.priority, flow.match, flow.table):
            delete.append(cookie)
    for cookie, entry in wanted.items():
        held = actual.get(cookie)
        if held is None or cookie in delete:
            add.append(entry)
        elif held.actions != entry.actions:
            modify.append(entry)
    return FlowChanges(tuple(sorted(delete)), tuple(modify), tuple(add))


def steered_ports(flows: dict[int, ActualFlow]) -> set[int]:
    """Ports whose class queues the switch's flows steer packets into."""
    return {a[1] for f in flows.values() if any(a[0] == "set_queue" for a in f.actions)
            for a in f.actions if a[0] == "output"}


def plan(state: SwitchState | None, flows: dict[int, ActualFlow], qos: dict[int, OvsdbQos | str | None],
         meters: dict[int, Police | None]) -> Plan:
    """`state` None: the switch is in no policy, so nothing of ours stays on it. `qos` holds what OVSDB
    has on every port of the policy and every port that has queues of ours (FOREIGN for another's,
    ABSENT for a port OVSDB does not have); `meters` our meters on the switch."""
    if state is None:
        return Plan(flow_changes((), flows), meter_changes({}, meters),
                    {p: None for p, q in qos.items() if isinstance(q, OvsdbQos)}, {})
    qos = {p: q for p, q in qos.items() if q != ABSENT}
    reserving_now = {p for p, q in qos.items() if isinstance(q, OvsdbQos) and q.mode == "reserve"}
    desired_flows = state.flows(state.reserving & reserving_now)
    desired_qos = state.qos(state.reserving | steered_ports(flows))
    changes: dict[int, QosSpec | None] = {}
    for port, actual in qos.items():
        want = desired_qos.get(port)
        if actual == FOREIGN:
            continue
        if want is None:
            if actual is not None:
                changes[port] = None
        elif actual != want.ovsdb:
            changes[port] = want
    return Plan(flow_changes(desired_flows, flows), meter_changes(state.meters, meters), changes, desired_qos)


@dataclass(frozen=True)
class TcChanges:
    """What a port's tc needs beside its QoS: the leaves to replace and, if they differ, the filters."""
    waiting: bool                               # OVS has not built the HTB classes yet
    leaves: tuple[str, ...] = ()                # classes whose queue is not the policy's
    filters: tuple[tuple[int, int], ...] | None = None   # the marks to set; None: they are right


FILTER_FAMILIES = ("ipv4", "ipv6")   # each mark is filtered for both: a class may steer either


def tc_changes(spec: QosSpec, userspace: bool, classes: set[str], leaves: dict[str, tuple[str, int | None, int]],
               filters: set[tuple[str, int, str]]) -> TcChanges:
    """`leaves`: class → its leaf as Tc.leaves reads it, (kind, packet limit, netem's delay in µs), in force;
    `filters`: (family, dscp, class) in force."""
    wanted = spec_classes(spec)
    if not set(wanted) <= classes:
        return TcChanges(waiting=True)
    want = leaf_in_force(spec)
    bad = tuple(c for c in wanted if leaves.get(c) != want)
    marks = {(family, dscp, htb_classid(q)) for family in FILTER_FAMILIES for dscp, q in spec.marks} \
        if userspace else set()
    return TcChanges(False, bad, spec.marks if userspace and filters != marks else None)


def spec_classes(spec: QosSpec) -> list[str]:
    """The HTB classes of the spec's queues, in queue order."""
    return [htb_classid(q.queue_id) for q in spec.queues]


def htb_classid(queue_id: int) -> str:
    """OVS's linux-htb puts queue N in class 1:(N+1), written in hex as tc does."""
    return f"1:{queue_id + 1:x}"


# OVS's parent of those classes: its counters are the sum of its children's, and no leaf hangs under it.
HTB_PARENT = "1:fffe"
