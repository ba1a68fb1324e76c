"""A lone Switch (controller/core/switch.py), built and driven without its controller: events and an
injected `now` in, actions out, a read-only view of the world beside it. And the controller's own
entry point (controller/core/controller.py) driven with an OVSDB replica that refuses everything but
its reads, and no store at all: every I/O leaves as an action, every outcome comes back as an event."""
from __future__ import annotations

import logging
from typing import Any

import pytest

from controller.core import actions as act
from controller.core import events as ev
from controller.core.authority import Pair
from controller.core.bridges import BridgeInfo
from controller.core.controller import Controller
from controller.core.jobs import JobResult
from controller.core.keeper import SAVED_ABSENT, SAVED_POLICY
from controller.core.policy import load_document, parse_policy
from controller.core.portjobs import TC_SWEEP_SECONDS, PortJobs
from controller.core.queues import desired_qos
from controller.core.role import not_older
from controller.core.stats import PortCounters, QueueCounters
from controller.core.switch import Switch
from controller.core.view import Mode, SwitchView

REMOTE = "unix:/fake/db.sock"
S1 = {1: "s1-eth1", 2: "s1-eth2", 3: "s1-eth3"}
AUTO = parse_policy(load_document("policies/auto.yaml"))
STALE = "OFPET_ROLE_REQUEST_FAILED/OFPRRFC_STALE"


class Replica:
    """OVSDB as the adapters' replica holds it: reads only. Anything else a caller tries raises."""

    def __init__(self) -> None:
        self.names = (REMOTE,)
        self.qos: dict[str, Any] = {}
        self.generation = (1,)

    def bridge(self, dp_id: int, pinned: str | None = None) -> BridgeInfo | None:
        return BridgeInfo("s1", "netdev", dict(S1), REMOTE) if dp_id == 1 else None

    def port_qos(self, remote: str, iface: str) -> Any:
        return self.qos.get(iface)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the core did I/O: ovsdb.{name}")


def view(replica: Replica, generation: int = 0, active: bool = True, epoch: int = 0) -> SwitchView:
    return SwitchView(AUTO, Mode.IN_FORCE, active, active, generation, replica, epoch)


def sent(actions: list[act.SwitchAction], kind: type) -> list[Any]:
    return [m for a in actions if isinstance(a, act.Send) for m in a.messages if isinstance(m, kind)]


def stats(actions: list[act.SwitchAction], kind: str) -> list[act.StatsRequest]:
    return [m for m in sent(actions, act.StatsRequest) if m.kind == kind]


@pytest.fixture
def replica() -> Replica:
    return Replica()


def connected(replica: Replica) -> tuple[Switch, list[act.SwitchAction]]:
    sw = Switch(conn=7, dp_id=1, ports=frozenset(S1), now=100.0, phase=0.5)
    return sw, sw.handle(ev.BridgeDue(7, 0), 100.0, view(replica))


def mastered(replica: Replica) -> Switch:
    """Connected, claimed as master with generation id 5, its (empty) tables read."""
    sw, out = connected(replica)
    (ask,) = sent(out, act.RoleRequest)
    out = sw.handle(ev.RoleReply(7, ask.xid, "equal", None), 100.0, view(replica))
    out = sw.handle(ev.RoleDue(), 100.0, view(replica, 5))
    (claim,) = sent(out, act.RoleRequest)
    sw.handle(ev.RoleReply(7, claim.xid, "master", 5), 100.0, view(replica, 5))
    return sw


def asked(sw: Switch) -> list[act.SwitchAction]:
    """The statistics requests the switch has in flight, as the actions that sent them."""
    return [act.Send(7, tuple(act.StatsRequest(xid, kind) for xid, (_, kind) in sw.link.requests.items()))]


def read_tables(sw: Switch, replica: Replica, out: list[act.SwitchAction], epoch: int = 0,
                seen: SwitchView | None = None) -> list[act.SwitchAction]:
    """Answer the requests for meters and flows in `out` as a switch with nothing of ours would (under `seen`,
    by default auto's view with generation id 5)."""
    actions: list[act.SwitchAction] = []
    seen = seen or view(replica, 5, epoch=epoch)
    for req in sent(out, act.StatsRequest):
        if req.kind == act.METER_FEATURES:
            actions += sw.handle(ev.MeterFeaturesReply(7, req.xid, None), 100.0, seen)
        elif req.kind == act.METER_CONFIG:
            actions += sw.handle(ev.MeterConfigReply(7, req.xid, {}), 100.0, seen)
        elif req.kind == act.FLOWS:
            actions += sw.handle(ev.FlowStatsReply(7, req.xid, {}, {}), 100.0, seen)
    return actions


def jobs_done(sw: Switch, replica: Replica, jobs: tuple[Any, ...], seen: SwitchView, error: str | None = None) -> None:
    """OVSDB holds what the jobs put, and their results (each failed with `error`, if given) come back."""
    for job in jobs:
        replica.qos[job.iface] = job.spec.ovsdb if job.spec else None
    sw.handle(ev.JobsDone(tuple(JobResult(job, error) for job in jobs)), 100.0, seen)


def test_a_switch_that_connects_is_asked_its_role_and_tables_before_anything_is_written(replica):
    sw, out = connected(replica)
    assert [m.role for m in sent(out, act.RoleRequest)] == ["nochange"]
    assert {m.kind for m in sent(out, act.StatsRequest)} == {act.METER_FEATURES, act.METER_CONFIG, act.FLOWS,
                                                             act.FLOW_MONITOR}
    assert not sent(out, act.AddFlow) and not [a for a in out if isinstance(a, act.Submit)]
    (timer,) = [a for a in out if isinstance(a, act.Later)]
    assert timer.event == ev.PollDue(7, 100.5) and timer.seconds == pytest.approx(0.5)   # its phase of the interval
    assert timer.slack == pytest.approx(0.05)      # a slow poll may go with others up to 5 % of the interval late


def test_a_master_claim_waits_for_a_generation_id_newer_than_the_switchs(replica):
    sw, out = connected(replica)
    (ask,) = sent(out, act.RoleRequest)
    out = sw.handle(ev.RoleReply(7, ask.xid, "equal", 9), 100.0, view(replica, generation=3))
    assert out == [act.NeedGeneration(1, 9)]           # 3 is older than the switch's 9: nothing sent
    out = sw.handle(ev.RoleDue(), 100.0, view(replica, generation=10))
    assert [(m.role, m.generation) for m in sent(out, act.RoleRequest)] == [("master", 10)]


def test_no_claim_master_or_slave_is_sent_before_the_switch_has_said_its_generation_id(replica):
    """A claim below the switch's id would only be refused: a new id of ours, or standing down, before the switch
    answered what it has seen, sends nothing; its answer is claimed above."""
    sw, out = connected(replica)
    (ask,) = sent(out, act.RoleRequest)
    assert sw.handle(ev.RoleDue(), 100.0, view(replica, generation=3)) == []
    assert sw.handle(ev.StandingDown(), 100.0, view(replica, active=False)) == []
    out = sw.handle(ev.RoleReply(7, ask.xid, "equal", 2), 100.0, view(replica, active=False))
    assert [(m.role, m.generation) for m in sent(out, act.RoleRequest)] == [("slave", 2)]


def test_a_standby_claims_slave_with_the_switchs_own_id(replica):
    sw, out = connected(replica)
    (ask,) = sent(out, act.RoleRequest)
    out = sw.handle(ev.RoleReply(7, ask.xid, "equal", 4), 100.0, view(replica, active=False))
    assert [(m.role, m.generation) for m in sent(out, act.RoleRequest)] == [("slave", 4)]


def test_a_mastered_switch_gets_the_plan_as_one_batch_and_its_ports_as_jobs(replica):
    sw = mastered(replica)
    assert sw.flows.flows is None                   # nothing is planned before the tables are read
    out = read_tables(sw, replica, asked(sw))
    adds, barriers = sent(out, act.AddFlow), sent(out, act.Barrier)
    assert len(adds) == 7 and len(barriers) == 1     # s1's seven flows, one barrier after them
    (submit,) = [a for a in out if isinstance(a, act.Submit)]
    assert submit.remote == REMOTE and [(j.port_no, j.qos) for j in submit.jobs] == [(1, True)]   # the auto port
    assert not sw.in_sync
    sw.handle(ev.BarrierReply(7, barriers[0].xid), 100.0, view(replica, 5))
    jobs_done(sw, replica, submit.jobs, view(replica, 5))
    assert sw.in_sync and sw.settled


def test_a_poll_after_ovsdb_changed_elsewhere_plans_nothing_and_after_a_change_to_its_own_port_repairs_it(
        replica, monkeypatch):
    from controller.core import switch
    sw = synced(replica)
    planned: list[int] = []
    monkeypatch.setattr(switch, "plan", lambda *args, real=switch.plan: planned.append(1) or real(*args))
    replica.generation = (2,)                        # another switch's bridge joined and its queues were put
    due = sw.poller.next_due
    assert due is not None
    out = sw.handle(ev.PollDue(7, due), due, view(replica, 5))
    assert sent(out, act.StatsRequest) and planned == [] and sw.in_sync
    out = sw.handle(ev.PollDue(7, due + 1), due + 1, view(replica, 5))
    assert planned == []                              # nor at the next
    (iface,) = replica.qos                           # this switch's port: its QoS cleared by hand
    del replica.qos[iface]
    replica.generation = (3,)
    out = sw.handle(ev.PollDue(7, due + 2), due + 2, view(replica, 5))
    assert planned == [1]
    assert [j.iface for a in out if isinstance(a, act.Submit) for j in a.jobs] == [iface]


def test_a_cluster_member_raises_the_switchs_epoch_before_its_first_write_and_carries_it_on_each(replica):
    sw = mastered(replica)
    out = read_tables(sw, replica, asked(sw), epoch=42)
    (submit,) = [a for a in out if isinstance(a, act.Submit)]
    assert submit.epochs == ((1, 42),) and [j.epoch for j in submit.jobs] == [42]
    (barrier,) = sent(out, act.Barrier)
    sw.handle(ev.BarrierReply(7, barrier.xid), 100.0, view(replica, 5, epoch=42))
    jobs_done(sw, replica, submit.jobs, view(replica, 5, epoch=42))
    # Compared again with nothing to change (as when its lease is confirmed after a lapse): raised once, so no
    # OVSDB write. (A poll after OVSDB moved elsewhere would not reconcile at all: it holds what it held.)
    out = sw.handle(ev.Reconcile(), 101.0, view(replica, 5, epoch=42))
    assert sw.in_sync and not [a for a in out if isinstance(a, act.Submit)]
    # Taken over under a newer epoch (the switch was another member's meanwhile): raised, though no port
    # needs a change, so that the member it was taken from can write nothing more.
    out = sw.handle(ev.RoleDue(), 102.0, view(replica, 77, epoch=77))
    (claim,) = sent(out, act.RoleRequest)
    out = sw.handle(ev.RoleReply(7, claim.xid, "master", 77), 102.0, view(replica, 77, epoch=77))
    out += read_tables(sw, replica, asked(sw), epoch=77)
    assert [(a.epochs, a.jobs) for a in out if isinstance(a, act.Submit)] == [(((1, 77),), ())]


def test_a_changed_leaf_limit_is_checked_on_the_device_though_ovsdb_is_unchanged(replica):
    """A policy that changes only a class's queue length changes no QoS row; the device must follow."""
    sw = mastered(replica)
    out = read_tables(sw, replica, asked(sw))
    (submit,) = [a for a in out if isinstance(a, act.Submit)]
    for job in submit.jobs:
        replica.qos[job.iface] = job.spec.ovsdb if job.spec else None
    sw.handle(ev.BarrierReply(7, sent(out, act.Barrier)[0].xid), 100.0, view(replica, 5))
    sw.handle(ev.JobsDone(tuple(JobResult(job) for job in submit.jobs)), 100.0, view(replica, 5))
    document = load_document("policies/auto.yaml")
    document["switches"]["s1"]["ports"][1]["queue_packets"] = 40
    longer = parse_policy(document)
    port = longer.switch(1).port(1)
    assert desired_qos(longer, port, True, True).ovsdb == desired_qos(AUTO, AUTO.switch(1).port(1), True, True).ovsdb
    out = sw.handle(ev.PolicyInstalled(), 101.0, SwitchView(longer, Mode.IN_FORCE, True, True, 5, replica))
    (check,) = [j for a in out if isinstance(a, act.Submit) for j in a.jobs]
    assert (check.port_no, check.qos) == (1, False) and check.spec == desired_qos(longer, longer.switch(1).port(1),
                                                                                   True, True)


def test_a_poll_asks_for_statistics_and_a_flood_is_decided_from_them(replica):
    document = load_document("policies/auto.yaml")
    document["congestion"]["fast_poll_interval"] = 0    # slow polls alone decide
    slow = SwitchView(parse_policy(document), Mode.IN_FORCE, True, True, 5, replica)
    sw = mastered(replica)
    read_tables(sw, replica, asked(sw))
    decisions: list[act.Decided] = []
    tx = drops = 0
    for second in range(1, 5):
        now = 100.5 + second
        out = sw.handle(ev.PollDue(7, sw.poller.next_due or now), now, slow)
        kinds = {m.kind: m.xid for m in sent(out, act.StatsRequest)}
        assert {act.PORTS, act.QUEUES} <= kinds.keys()
        tx += 5_000_000 // 8                        # the port sends at its capacity, and drops 5 %
        drops += 21
        replies: list[ev.Event] = [
            ev.PortStatsReply(7, kinds[act.PORTS], {1: PortCounters(0, tx, 0, tx // 1500, 0, 0, 0, 0)}),
            ev.QueueStatsReply(7, kinds[act.QUEUES], {(1, 0): QueueCounters(tx, tx // 1500, drops)})]
        for kind in (act.CLASSIFIED_FLOWS, act.FLOWS):
            if kind in kinds:
                replies.append(ev.FlowStatsReply(7, kinds[kind], {}, {}))
        if act.METER_STATS in kinds:
            replies.append(ev.MeterStatsReply(7, kinds[act.METER_STATS], {}))
        for reply in replies:
            decisions += [a for a in sw.handle(reply, now, slow) if isinstance(a, act.Decided)]
    assert [(d.port_no, d.decision.action) for d in decisions] == [(1, "program")]
    assert sw.telemetry.events[(1, "program")] == 1 and sw.telemetry.congested[1]


def test_a_standby_controller_drives_a_take_over_a_put_and_a_delete_without_io(replica):
    """The controller's handle() touches no store and no OVSDB but the replica's reads: a take-over asks
    for the saved policy, a PUT and a DELETE ask for it to be saved, and each goes on with the outcome."""
    ctl = Controller(replica, owner="o", saved=ev.PolicyLoaded(SAVED_ABSENT), authority=Pair(active=False),
                     wall=lambda: 0.0)
    ctl.handle(ev.SwitchUp(7, 1, frozenset(S1)), 1.0)
    out = ctl.handle(ev.RemotesChanged({REMOTE: True}, (), locked=True), 2.0)
    assert act.LoadPolicy() in out and act.Beat(2.0) in out and ctl.authority.active
    ctl.handle(ev.PolicyLoaded(SAVED_POLICY, load_document("policies/auto.yaml")), 2.0)
    assert ctl.keeper.policy == AUTO and ctl.keeper.mode is Mode.IN_FORCE
    reserve = load_document("policies/reserve.yaml")
    (answer,) = ctl.handle(ev.SetPolicy("early", reserve), 2.0)    # the lock not confirmed yet: refused
    assert isinstance(answer, act.Answer) and "not confirmed" in str(answer.error)
    ctl.handle(ev.Beaten(2.0, True), 2.1)
    out = ctl.handle(ev.SetPolicy("put", reserve), 3.0)
    assert out == [act.SavePolicy(reserve, 1)] and ctl.keeper.policy == AUTO    # nothing in force before it is saved
    ctl.handle(ev.PolicySaved(None, 1), 3.0)
    assert ctl.keeper.policy is not None and ctl.keeper.policy.name == "reserve"
    out = ctl.handle(ev.ClearPolicy("delete"), 4.0)
    assert out == [act.SavePolicy(None, 2)]
    out = ctl.handle(ev.PolicySaved("disk full"), 4.0)
    (answer,) = [a for a in out if isinstance(a, act.Answer)]
    assert answer.token == "delete" and "disk full" in str(answer.error) and ctl.keeper.policy.name == "reserve"


def test_a_switch_that_leaves_is_forgotten_whole(replica):
    ctl = Controller(replica, owner="o", saved=ev.PolicyLoaded(SAVED_ABSENT), wall=lambda: 0.0)
    ctl.handle(ev.SwitchUp(7, 1, frozenset(S1)), 1.0)
    assert 1 in ctl.switches and 1 in ctl.snapshot(2.0).in_sync
    ctl.handle(ev.SwitchDown(7), 2.0)
    assert ctl.switches == {} and ctl.conns.switches == {} and ctl.snapshot(2.0).in_sync == {}


def test_a_write_refused_as_from_a_slave_demotes_the_switch_and_asks_its_generation_again(replica):
    """Another controller became master: this one writes nothing more to the switch and learns its id."""
    sw = mastered(replica)
    assert sw.role.writable(view(replica, 5))
    out = sw.handle(ev.ErrorReply(7, 999, "OFPET_BAD_REQUEST/OFPBRC_IS_SLAVE"), 101.0, view(replica, 5))
    assert not sw.role.writable(view(replica, 5))
    assert [m.role for m in sent(out, act.RoleRequest)] == ["nochange"]


def test_a_put_while_another_is_being_saved_is_saved_after_it_not_answered_unchanged(replica):
    """In force A; B is being saved; A again must be saved after B, or B would end up in force."""
    auto, reserve = load_document("policies/auto.yaml"), load_document("policies/reserve.yaml")
    ctl = Controller(replica, owner="o", saved=ev.PolicyLoaded(SAVED_POLICY, auto), wall=lambda: 0.0)
    assert ctl.handle(ev.SetPolicy("b", reserve), 1.0) == [act.SavePolicy(reserve, 1)]
    assert ctl.handle(ev.SetPolicy("a", auto), 1.0) == [act.SavePolicy(auto, 2)]
    ctl.handle(ev.PolicySaved(None, 1), 1.0)
    ctl.handle(ev.PolicySaved(None, 2), 1.0)
    assert ctl.keeper.policy == AUTO and ctl.keeper.revision == 2


def test_a_newer_generation_seen_while_a_claim_is_in_flight_is_claimed_above_next():
    authority = Pair(active=True)
    assert authority.need(1, 5) == [act.ClaimGeneration(5)]
    assert authority.need(2, 9) == []                  # one claim at a time
    assert authority.claimed(6) == [act.ClaimGeneration(9)]   # 6 is older than what switch 2 has seen
    assert authority.claimed(10) == [] and authority.generation == 10


def test_ovsdb_changed_by_our_own_job_in_flight_is_no_drift(replica):
    """The worker's transaction lands in OVSDB a moment before its result reaches the core: a reconcile
    in between sees OVSDB differ from what we last put, and must not take our own change for another's."""
    sw = mastered(replica)
    out = read_tables(sw, replica, asked(sw))
    (submit,) = [a for a in out if isinstance(a, act.Submit)]
    sw.handle(ev.BarrierReply(7, sent(out, act.Barrier)[0].xid), 100.0, view(replica, 5))
    jobs_done(sw, replica, submit.jobs, view(replica, 5))
    document = load_document("policies/auto.yaml")
    document["switches"]["s1"]["ports"][1]["capacity"] = "8Mbit"
    faster = SwitchView(parse_policy(document), Mode.IN_FORCE, True, True, 5, replica)
    out = sw.handle(ev.PolicyInstalled(), 101.0, faster)
    (job,) = [j for a in out if isinstance(a, act.Submit) for j in a.jobs]
    replica.qos[job.iface] = job.spec.ovsdb if job.spec else None      # landed, not reported yet
    replica.generation = (2,)
    sw.handle(ev.Reconcile(), 101.1, faster)
    assert sw.telemetry.drift_repairs == {}


def test_the_status_says_why_a_remote_is_not_connected(replica):
    ctl = Controller(replica, owner="o", saved=ev.PolicyLoaded(SAVED_ABSENT), wall=lambda: 0.0)
    ctl.handle(ev.RemotesChanged({REMOTE: False}, errors={REMOTE: "Connection refused"}), 1.0)
    (answer,) = ctl.handle(ev.GetStatus("s"), 1.0)
    assert answer.result["ovsdb"] == {REMOTE: {"connected": False, "error": "Connection refused"}}


def test_only_a_port_that_holds_a_qos_has_filters_to_take_off_before_its_change(replica):
    """A port OVSDB holds no QoS on has no qdisc of OVS's, so none of our filters: its job says so, and the
    worker spares the netlink calls; a port whose queues change or go may still have them."""
    sw = mastered(replica)
    out = read_tables(sw, replica, asked(sw))
    (submit,) = [a for a in out if isinstance(a, act.Submit)]
    assert [(job.port_no, job.qos, job.bare) for job in submit.jobs] == [(1, True, True)]
    for job in submit.jobs:
        replica.qos[job.iface] = job.spec.ovsdb if job.spec else None
    sw.handle(ev.BarrierReply(7, sent(out, act.Barrier)[0].xid), 100.0, view(replica, 5))
    sw.handle(ev.JobsDone(tuple(JobResult(job) for job in submit.jobs)), 100.0, view(replica, 5))
    out = sw.handle(ev.PolicyInstalled(), 101.0, SwitchView(None, Mode.CLEARED, True, True, 5, replica))
    (off,) = [j for a in out if isinstance(a, act.Submit) for j in a.jobs]
    assert (off.port_no, off.spec, off.qos, off.bare) == (1, None, True, False)


def synced(replica: Replica) -> Switch:
    """Mastered with generation id 5, its tables read, its first batch confirmed and its jobs done."""
    sw = mastered(replica)
    out = read_tables(sw, replica, asked(sw))
    (submit,) = [a for a in out if isinstance(a, act.Submit)]
    sw.handle(ev.BarrierReply(7, sent(out, act.Barrier)[0].xid), 100.0, view(replica, 5))
    jobs_done(sw, replica, submit.jobs, view(replica, 5))
    assert sw.in_sync
    return sw


def writes(out: list[act.SwitchAction]) -> list[Any]:
    return [*sent(out, act.AddFlow), *sent(out, act.ModifyFlow), *sent(out, act.DeleteFlow), *sent(out, act.MeterMod),
            *(a for a in out if isinstance(a, act.Submit))]


def test_a_switch_says_in_its_log_once_that_it_holds_the_policy(replica, caplog):
    """bench/scale.py --join times a joining switch from its connection to this line."""
    caplog.set_level(logging.INFO, logger="qos")
    sw = synced(replica)
    sw.reconcile(view(replica, 5))
    assert [r.getMessage() for r in caplog.records if r.getMessage().endswith("in sync")] == ["switch 0000000000000001 in sync"]


def test_a_master_whose_new_claim_is_refused_as_stale_writes_nothing_until_the_switch_confirms_it_again(replica):
    """Another controller claimed the switch with a newer id than ours: our claim with a new id of ours is refused
    as stale. The switch is not ours, so a policy put meanwhile sends it nothing, until it has confirmed our
    claim above the id it has seen."""
    sw = synced(replica)
    out = sw.handle(ev.RoleDue(), 101.0, view(replica, 6))           # a newer id of ours: claimed again
    (claim,) = sent(out, act.RoleRequest)
    out = sw.handle(ev.ErrorReply(7, claim.xid, STALE), 101.0, view(replica, 6))
    (ask,) = sent(out, act.RoleRequest)
    assert ask.role == "nochange" and sw.status(view(replica, 6))["role"] == "refused"
    assert sw.telemetry.openflow_errors == {}                         # a lost claim, not a message refused
    reserve = parse_policy(load_document("policies/reserve.yaml"))
    out = sw.handle(ev.PolicyInstalled(), 101.0, SwitchView(reserve, Mode.IN_FORCE, True, True, 6, replica))
    assert writes(out) == [] and not sw.role.writable(view(replica, 6))
    out = sw.handle(ev.RoleReply(7, ask.xid, "slave", 1000), 101.0, SwitchView(reserve, Mode.IN_FORCE, True, True, 6,
                                                                                 replica))
    assert out == [act.NeedGeneration(1, 1000)]                      # a claim above the switch's 1000 first
    newer = SwitchView(reserve, Mode.IN_FORCE, True, True, 1001, replica)
    (claim,) = sent(sw.handle(ev.RoleDue(), 101.0, newer), act.RoleRequest)
    assert (claim.role, claim.generation) == ("master", 1001)
    out = sw.handle(ev.RoleReply(7, claim.xid, "master", 1001), 101.0, newer)
    assert sent(out, act.ModifyFlow) and sw.status(newer)["role"] == "master"   # reserve's steering, now


def test_generation_ids_are_compared_as_a_signed_distance_so_that_they_may_wrap(replica):
    """OpenFlow 1.3 (6.3.7): an id is stale if (id - the switch's) mod 2**64, read as signed, is negative."""
    assert not_older(3, 2**64 - 3) and not not_older(2**64 - 3, 3)         # 3 follows 2**64-3 across the wrap
    assert not_older(7, 7) and not_older(5 + 2**63 - 1, 5) and not not_older(5 + 2**63, 5)
    sw, out = connected(replica)
    (ask,) = sent(out, act.RoleRequest)
    out = sw.handle(ev.RoleReply(7, ask.xid, "equal", 2**64 - 3), 100.0, view(replica, generation=2**64 - 5))
    assert out == [act.NeedGeneration(1, 2**64 - 3)]                 # older: a newer one is claimed first
    out = sw.handle(ev.RoleDue(), 100.0, view(replica, generation=3))
    assert [(m.role, m.generation) for m in sent(out, act.RoleRequest)] == [("master", 3)]   # wrapped: newer


def test_every_port_is_checked_once_more_than_5_minutes_after_the_last_sweep(replica):
    """netlink announces tc changes; a sweep every 300 s catches one it dropped."""
    sw = mastered(replica)
    jobs = PortJobs(sw.link, now=0.0)
    jobs.ifindex = {1: 11, 3: 13}
    assert TC_SWEEP_SECONDS == 300.0
    assert not jobs.poll(300.0) and jobs.check == set()
    assert jobs.poll(300.5) and jobs.check == {1, 3}
    jobs.check.clear()
    assert not jobs.poll(301.0) and not jobs.poll(600.0) and jobs.poll(601.0)


def test_a_pair_raises_its_first_generation_id_as_the_switchs_epoch(replica):
    sw = mastered(replica)
    out = read_tables(sw, replica, asked(sw), epoch=1)
    (submit,) = [a for a in out if isinstance(a, act.Submit)]
    assert submit.epochs == ((1, 1),)


def test_a_port_whose_queues_failed_is_tried_at_once_under_a_new_policy_and_the_switch_is_not_settled_meanwhile(
        replica):
    """A failed port waits for the next poll before its job is tried again, but a new policy is no retry: the
    DELETE that follows a refused qos_type must not be answered while OVSDB still holds the refused queues (the
    next test's network then found them left behind)."""
    sw = mastered(replica)
    out = read_tables(sw, replica, asked(sw))
    (submit,) = [a for a in out if isinstance(a, act.Submit)]
    sw.handle(ev.BarrierReply(7, sent(out, act.Barrier)[0].xid), 100.0, view(replica, 5))
    jobs_done(sw, replica, submit.jobs, view(replica, 5), "vswitchd did not build the classes")   # rows, no classes
    assert sw.settled and not sw.in_sync        # failed, and shown as such: a PUT is answered so
    cleared = SwitchView(None, Mode.CLEARED, True, True, 5, replica)
    out = sw.handle(ev.PolicyInstalled(), 100.5, cleared)
    (job,) = [j for a in out if isinstance(a, act.Submit) for j in a.jobs]
    assert job.iface == "s1-eth1" and job.qos and job.spec is None     # the queues come off now
    sw.handle(ev.BarrierReply(7, sent(out, act.Barrier)[0].xid), 100.5, cleared)   # and our flows
    assert not sw.settled
    replica.qos[job.iface] = None
    sw.handle(ev.JobsDone((JobResult(job),)), 100.6, cleared)
    assert sw.settled and sw.in_sync and sw.errors() == {}


def test_a_switch_whose_flows_were_refused_sends_a_new_policys_flows_at_once_and_is_not_settled_meanwhile(
        replica):
    """The same for flows: a refused batch is sent again at the next poll, a new policy's at once."""
    sw = mastered(replica)
    out = read_tables(sw, replica, asked(sw))
    adds, (barrier,) = sent(out, act.AddFlow), sent(out, act.Barrier)
    sw.handle(ev.ErrorReply(7, adds[0].xid, "OFPET_BAD_MATCH/OFPBMC_BAD_FIELD"), 100.0, view(replica, 5))
    (submit,) = [a for a in out if isinstance(a, act.Submit)]
    jobs_done(sw, replica, submit.jobs, view(replica, 5))
    out = sw.handle(ev.BarrierReply(7, barrier.xid), 100.0, view(replica, 5))
    assert not sent(read_tables(sw, replica, out), act.Barrier)       # read again; not sent before the next poll
    assert sw.settled and not sw.in_sync and "flows" in sw.errors()   # tried again at the next poll
    document = load_document("policies/auto.yaml")
    document["switches"]["s1"]["ports"][1]["capacity"] = "8Mbit"
    out = sw.handle(ev.PolicyInstalled(), 100.5, SwitchView(parse_policy(document), Mode.IN_FORCE, True, True, 5,
                                                            replica))
    assert sent(out, act.Barrier) and not sw.settled


def test_a_switch_whose_tables_are_being_read_again_is_not_settled_when_a_new_policy_comes(replica):
    """A flow of ours removed by hand has the table read again, and nothing is planned until it is in: a policy
    installed meanwhile must not be answered from what the switch was before (settled, in sync)."""
    police = SwitchView(parse_policy(load_document("policies/police.yaml")), Mode.IN_FORCE, True, True, 5, replica)
    sw = mastered(replica)
    out = read_tables(sw, replica, asked(sw), seen=police)
    assert sent(out, act.MeterMod)
    sw.handle(ev.BarrierReply(7, sent(out, act.Barrier)[0].xid), 100.0, police)
    for submit in [a for a in out if isinstance(a, act.Submit)]:
        jobs_done(sw, replica, submit.jobs, police)
    assert sw.settled and sw.in_sync
    sw.handle(ev.FlowRemoved(7, next(iter(sw.flows.flows or {}))), 101.0, police)
    sw.handle(ev.TableDue(7), 101.5, police)                    # the meters and flows asked again
    sw.handle(ev.PolicyInstalled(), 101.6, view(replica, 5))     # auto, before they are in
    assert not sw.settled
