"""A cluster's members sharing the switches (controller/core/cluster.py, and the controller with one): the
ring as intent, ownership won in etcd and lost with the key, the lease that fences a member cut off."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core import actions as act
from controller.core import events as ev
from controller.core.cluster import HOLD_DOWN_SECONDS, SAFE_SHARE, Cluster, Ring
from controller.core.controller import Controller
from controller.core.keeper import CONFIRM_SECONDS, SAVED_ABSENT
from controller.core.member import Member
from controller.core.peers import NO_OWNER
from tests.unit.test_openapi import schema_errors
from tests.unit.test_switch import REMOTE, S1, Replica, sent

DPIDS = range(1, 1001)


def report(members, owners=None, revision=10, policy=None, refreshed_at=0.0) -> ev.ClusterChanged:
    return ev.ClusterChanged(tuple(members), owners or {}, revision, policy, refreshed_at)


def test_the_ring_spreads_the_switches_and_a_join_moves_about_one_in_n():
    three, four = Ring(["a", "b", "c"]), Ring(["a", "b", "c", "d"])
    for ring in (three, four, Ring(["m1", "m2", "m3"])):                   # each holds a fair share
        shares = [sum(ring.owner(dp) == m for dp in DPIDS) / len(DPIDS) for m in ring.members]
        assert all(abs(share - 1 / len(shares)) <= 0.03 for share in shares), shares
    moved = [dp for dp in DPIDS if three.owner(dp) != four.owner(dp)]
    assert all(four.owner(dp) == "d" for dp in moved)                      # only to the new member
    assert len(moved) <= (1 / 4 + 0.03) * len(DPIDS)
    two = Ring(["a", "c"])                                                 # b leaves: only b's move
    assert all(two.owner(dp) == three.owner(dp) for dp in DPIDS if three.owner(dp) != "b")


def test_a_member_enters_the_ring_only_after_the_hold_down():
    cluster = Cluster("a", 6)
    cluster.report(report(["a", "c"]), 0.0, [])
    assert cluster.ring.members == ["a", "c"]                              # there before us: established
    cluster.report(report(["a", "b", "c"]), 1.0, [])
    assert cluster.ring.members == ["a", "c"]                              # b is new: not yet
    cluster.report(report(["a", "b", "c"]), 1.0 + HOLD_DOWN_SECONDS, [])
    assert cluster.ring.members == ["a", "b", "c"]


def test_a_member_claims_the_free_switches_the_ring_gives_it_and_no_other():
    cluster = Cluster("a", 6)
    cluster.report(report(["a", "b"]), 0.0, [])
    mine = [dp for dp in range(1, 40) if Ring(["a", "b"]).owner(dp) == "a"]
    theirs = [dp for dp in range(1, 40) if dp not in mine]
    owned = {theirs[0]: "b", mine[0]: "b"}                                 # b holds one the ring gives a: wait
    actions, _ = cluster.report(report(["a", "b"], owned), HOLD_DOWN_SECONDS, range(1, 40))
    assert {a.dp_id for a in actions if isinstance(a, act.ClaimSwitch)} == set(mine) - {mine[0]}
    again, _ = cluster.report(report(["a", "b"], owned), HOLD_DOWN_SECONDS + 1, range(1, 40))
    assert again == []                                                     # claims in flight are not repeated
    assert cluster.claimed(ev.SwitchClaimed(mine[1], 77)) and cluster.owns(mine[1])
    assert not cluster.claimed(ev.SwitchClaimed(mine[2], None)) and not cluster.owns(mine[2])


def test_a_key_etcd_no_longer_holds_is_lost_but_not_one_claimed_after_the_read():
    cluster = Cluster("a", 6)
    cluster.claimed(ev.SwitchClaimed(5, 20))
    _, lost = cluster.report(report(["a"], {}, revision=19), 0.0, [5])    # read before the claim
    assert not lost and cluster.owns(5)
    _, lost = cluster.report(report(["a"], {5: "b"}, revision=25), 1.0, [5])
    assert lost == {5} and not cluster.owns(5)


def test_a_switch_the_ring_gives_another_member_is_handed_over():
    cluster = Cluster("a", 6)
    cluster.report(report(["a", "b"]), 0.0, [])
    dp = next(dp for dp in range(1, 100) if Ring(["a", "b"]).owner(dp) == "b")
    cluster.claimed(ev.SwitchClaimed(dp, 30))                              # ours while b was not in the ring
    actions, lost = cluster.report(report(["a", "b"], {dp: "a"}, 31), HOLD_DOWN_SECONDS, [dp])
    assert actions == [act.ReleaseSwitch(dp, 30)] and lost == {dp} and not cluster.owns(dp)


def test_a_member_writes_only_within_its_safe_share_of_the_lease():
    cluster = Cluster("a", 6)
    assert not cluster.confirmed(0.0)
    cluster.report(report(["a"], refreshed_at=100.0), 100.5, [])
    assert cluster.confirmed(100.0 + SAFE_SHARE * 6 - 0.01)
    assert not cluster.confirmed(100.0 + SAFE_SHARE * 6)
    cluster.report(ev.ClusterChanged(None, {}, 0, None, None), 101.0, [])  # etcd did not answer: nothing anew
    assert not cluster.confirmed(104.0)


@pytest.fixture
def member():
    ctl = Controller(Replica(), owner="o", saved=ev.PolicyLoaded(SAVED_ABSENT), authority=Member(Cluster("a", 6)),
                     wall=lambda: 0.0)
    out = ctl.handle(ev.SwitchUp(7, 1, frozenset(S1)), 0.0)
    (ask,) = sent(out, act.RoleRequest)
    out = ctl.handle(ev.RoleReply(7, ask.xid, "equal", None), 0.0)
    assert [(m.role, m.generation) for m in sent(out, act.RoleRequest)] == [("slave", 0)]   # not ours yet
    return ctl


def test_a_member_masters_a_switch_with_its_keys_revision_once_it_owns_it(member):
    out = member.handle(report(["a"], refreshed_at=HOLD_DOWN_SECONDS), HOLD_DOWN_SECONDS)
    assert out == [act.ClaimSwitch(1, renew=False)]
    out = member.handle(ev.SwitchClaimed(1, 42), HOLD_DOWN_SECONDS)
    assert [(m.role, m.generation) for m in sent(out, act.RoleRequest)] == [("master", 42)]
    status = member.handle(ev.GetStatus("s"), HOLD_DOWN_SECONDS)[0].result
    assert status["role"] == "member" and status["switches"]["0000000000000001"]["owner"] == "a"


def test_a_member_whose_key_another_holds_now_stands_down_and_one_cut_off_refuses_changes(member):
    member.handle(report(["a"], refreshed_at=HOLD_DOWN_SECONDS), HOLD_DOWN_SECONDS)
    member.handle(ev.SwitchClaimed(1, 42), HOLD_DOWN_SECONDS)
    out = member.handle(report(["a", "b"], {1: "b"}, revision=60, refreshed_at=5.0), 5.0)
    assert [(m.role, m.generation) for m in sent(out, act.RoleRequest)] == [("slave", 0)]
    out = member.handle(ev.ClearPolicy("delete"), 5.0 + SAFE_SHARE * 6)   # its last refresh too long ago
    (answer,) = out
    assert "coordination lost" in str(answer.error)
    assert member.handle(ev.GetStatus("s"), 10.0)[0].result["role"] == "coordination lost"


def test_a_policy_put_through_another_member_is_put_in_force_here(member):
    from controller.core.policy import load_document
    document = load_document("policies/reserve.yaml")
    member.handle(report(["a"], policy=(12, document), refreshed_at=1.0), 1.0)
    assert member.keeper.policy is not None and member.keeper.policy.name == "reserve"
    member.handle(report(["a"], policy=(13, None), refreshed_at=2.0), 2.0)
    assert member.keeper.policy is None and str(member.keeper.mode) == "cleared"


def test_the_ring_passes_over_a_member_for_the_switches_it_cannot_reach():
    ring = Ring(["a", "b", "c"])
    for dp in DPIDS:
        owner = ring.owner(dp)
        other = ring.owner(dp, frozenset({owner}))
        assert other != owner and other is not None
        assert ring.owner(dp, frozenset({"a", "b", "c"})) == owner            # no one reaches it: as before
    # Passing over b moves b's switches only, spread over the others.
    moved = {dp: ring.owner(dp, frozenset({"b"})) for dp in DPIDS if ring.owner(dp) == "b"}
    assert all(ring.owner(dp, frozenset({"b"})) == ring.owner(dp) for dp in DPIDS if dp not in moved)
    assert set(moved.values()) == {"a", "c"}


def test_a_member_cut_off_from_a_switchs_ovsdb_for_a_lease_hands_it_to_one_that_reaches_it():
    a, b = Cluster("a", 6), Cluster("b", 6)
    mine = next(dp for dp in DPIDS if Ring(["a", "b"]).owner(dp) == "a")
    for member in (a, b):
        member.report(report(["a", "b"]), 0.0, [mine])
    a.claimed(ev.SwitchClaimed(mine, 30))
    assert a.reach([mine], 1.0) == [] and a.reach([mine], 6.9) == []      # a moment's cut moves nothing
    assert a.reach([mine], 7.0) == [act.Unreachable(frozenset({mine}))]
    assert a.reach([mine], 8.0) == []                                     # said once
    told = ev.ClusterChanged(("a", "b"), {mine: "a"}, 40, None, 8.0, {"a": frozenset({mine})})
    actions, lost = a.report(told, 8.0, [mine])
    assert actions == [act.ReleaseSwitch(mine, 30)] and lost == {mine}
    after = ev.ClusterChanged(("a", "b"), {}, 41, None, 8.0, {"a": frozenset({mine})})
    actions, _ = b.report(after, 8.0, [mine])
    assert actions == [act.ClaimSwitch(mine, renew=False)]                 # b reaches it: b takes it
    assert a.reach([], 9.0) == [act.Unreachable(frozenset())]             # reached again: said at once


def test_a_member_tells_the_others_of_a_switch_whose_ovsdb_stayed_down_a_lease_time(member):
    member.handle(ev.RemotesChanged({REMOTE: True}), 0.0)
    def told(now):
        out = member.handle(report(["a"], refreshed_at=now), now)
        return [a for a in out if isinstance(a, act.Unreachable)]
    assert told(1.0) == []
    member.handle(ev.RemotesChanged({REMOTE: False}, errors={REMOTE: "Connection refused"}), 2.0)
    assert told(3.0) == [] and told(8.9) == []                 # first seen cut at 3.0; the lease is 6 s
    assert told(9.0) == [act.Unreachable(frozenset({1}))]
    member.handle(ev.RemotesChanged({REMOTE: True}), 9.5)
    assert told(10.0) == [act.Unreachable(frozenset())]


def held(in_sync: bool, errors=None) -> dict:
    return {"in_sync": in_sync, "settled": True, "errors": errors or {}}


def test_a_change_is_answered_for_every_switch_once_its_owner_says_it_holds_it(member):
    from controller.core.policy import load_document
    document = load_document("policies/reserve.yaml")                      # names s1 (1) and s2 (2)
    member.handle(report(["a", "b"], {1: "b"}, refreshed_at=1.0), 1.0)     # b owns s1; s2 has no owner
    assert [a for a in member.handle(ev.SetPolicy("put", document), 1.0) if isinstance(a, act.SavePolicy)]
    out = member.handle(ev.PolicySaved(None, 50), 1.0)
    assert not [a for a in out if isinstance(a, act.Answer)]                # b has not said anything yet
    assert act.PublishSync(ev.MemberSync(50, {})) in out                    # ours: we own none of them
    older = report(["a", "b"], {1: "b"}, refreshed_at=1.5)
    older = ev.ClusterChanged(older.members, older.owners, 51, (50, document), 1.5, {},
                              {"b": ev.MemberSync(49, {1: held(True)})})
    assert not [a for a in member.handle(older, 1.5) if isinstance(a, act.Answer)]   # the policy before
    busy = ev.ClusterChanged(older.members, older.owners, 52, (50, document), 1.8, {},
                             {"b": ev.MemberSync(50, {1: {"in_sync": False, "settled": False, "errors": {}}})})
    assert not [a for a in member.handle(busy, 1.8) if isinstance(a, act.Answer)]    # still at it
    said = ev.ClusterChanged(older.members, older.owners, 52, (50, document), 2.0, {},
                             {"b": ev.MemberSync(50, {1: held(True)})})
    (answer,) = [a for a in member.handle(said, 2.0) if isinstance(a, act.Answer)]
    assert answer.result["switches"] == {"0000000000000001": {"owner": "b", "in_sync": True},
                                         "0000000000000002": {"owner": None, "in_sync": False}}
    assert answer.result["not_in_sync"] == {"0000000000000002": NO_OWNER} and answer.result["in_sync"] is False
    assert schema_errors(answer.result, "Applied") == []                   # as the API's document says


def test_a_change_for_any_network_waits_for_every_switch_another_member_owns(member):
    """A policy's network: section concerns every switch, named or not: the answer waits for their owners."""
    from controller.core.policy import for_any_network, load_document
    document = for_any_network(load_document("policies/reserve.yaml"))      # names no switch at all
    member.handle(report(["a", "b"], {7: "b"}, refreshed_at=1.0), 1.0)
    member.handle(ev.SetPolicy("put", document), 1.0)
    assert not [a for a in member.handle(ev.PolicySaved(None, 50), 1.0) if isinstance(a, act.Answer)]
    said = ev.ClusterChanged(("a", "b"), {7: "b"}, 51, (50, document), 2.0, {},
                             {"b": ev.MemberSync(50, {7: held(True)})})
    (answer,) = [a for a in member.handle(said, 2.0) if isinstance(a, act.Answer)]
    assert answer.result["switches"] == {"0000000000000007": {"owner": "b", "in_sync": True}}
    assert answer.result["in_sync"] is True


def test_a_change_whose_owner_never_says_is_answered_at_the_deadline_naming_it(member):
    from controller.core.policy import load_document
    document = load_document("policies/reserve.yaml")
    member.handle(report(["a", "b"], {1: "b", 2: "b"}, refreshed_at=1.0), 1.0)
    member.handle(ev.SetPolicy("put", document), 1.0)
    member.handle(ev.PolicySaved(None, 50), 1.0)
    failing = ev.ClusterChanged(("a", "b"), {1: "b", 2: "b"}, 51, (50, document), 2.0, {},
                                {"b": ev.MemberSync(50, {1: held(False, {"port 1": "OVSDB refused"})})})
    assert not [a for a in member.handle(failing, 2.0) if isinstance(a, act.Answer)]   # s2: nothing said
    (answer,) = [a for a in member.handle(ev.ConfirmDue(), 1.0 + CONFIRM_SECONDS + 0.1) if isinstance(a, act.Answer)]
    assert answer.result["not_in_sync"] == {"0000000000000001": {"port 1": "OVSDB refused"},
                                            "0000000000000002": "its owner, member b, has not said it holds "
                                                                "this change yet"}
    assert answer.result["switches"]["0000000000000002"] == {"owner": "b", "in_sync": False}


def test_a_switch_that_comes_in_sync_on_its_own_reply_is_published_with_it(member):
    """The published record follows a switch's own replies, not only the events that touch every switch."""
    from controller.core.jobs import JobResult
    from controller.core.policy import load_document
    member.handle(report(["a"], policy=(12, load_document("policies/reserve.yaml")), refreshed_at=HOLD_DOWN_SECONDS),
                  HOLD_DOWN_SECONDS)
    out = member.handle(ev.SwitchClaimed(1, 42), HOLD_DOWN_SECONDS)
    (claim,) = sent(out, act.RoleRequest)
    member.handle(ev.RoleReply(7, claim.xid, "master", 42), HOLD_DOWN_SECONDS)
    replies = {act.METER_FEATURES: lambda xid: ev.MeterFeaturesReply(7, xid, None),
               act.METER_CONFIG: lambda xid: ev.MeterConfigReply(7, xid, {}),
               act.FLOWS: lambda xid: ev.FlowStatsReply(7, xid, {}, {}),
               act.FLOW_MONITOR: lambda xid: ev.FlowsChanged(7, xid, frozenset())}
    out = []
    for xid, (_, kind) in list(member.switches[1].link.requests.items()):   # its tables: nothing of ours
        out += member.handle(replies[kind](xid), HOLD_DOWN_SECONDS)
    (barrier,), (submit,) = sent(out, act.Barrier), [a for a in out if isinstance(a, act.Submit)]
    for job in submit.jobs:                                               # OVSDB holds what the jobs put
        member.ovsdb.qos[job.iface] = job.spec.ovsdb if job.spec else None
    out = member.handle(ev.JobsDone(tuple(JobResult(job) for job in submit.jobs)), HOLD_DOWN_SECONDS)
    assert not any(a.sync.switches[1]["in_sync"] for a in out if isinstance(a, act.PublishSync))
    out = member.handle(ev.BarrierReply(7, barrier.xid), HOLD_DOWN_SECONDS)   # the classes ready: steered now
    assert not [a for a in out if isinstance(a, act.PublishSync)]          # nothing new to say: still at it
    (barrier,) = sent(out, act.Barrier)
    out = member.handle(ev.BarrierReply(7, barrier.xid), HOLD_DOWN_SECONDS)   # its flows confirmed: in sync
    assert [a.sync.switches for a in out if isinstance(a, act.PublishSync)] == [{1: held(True)}]
    assert not [a for a in member.handle(ev.PollDue(7, 1e9), HOLD_DOWN_SECONDS) if isinstance(a, act.PublishSync)]


def test_a_recovery_from_etcd_losing_its_data_stays_in_the_status_until_the_next_one():
    cluster = Cluster("a", 6)
    cluster.report(report(["a"]), 0.0, [])
    assert "etcd_restored" not in cluster.status()
    restored = ev.ClusterChanged(("a",), {}, 30, None, 0.5, restored="its revision went back from 20 to 2")
    cluster.report(restored, 1.0, [])
    cluster.report(report(["a"], revision=31), 2.0, [])
    assert cluster.status()["etcd_restored"] == "its revision went back from 20 to 2"


def test_a_claim_whose_answer_was_lost_is_resolved_by_putting_our_key_again():
    cluster = Cluster("a", 6)
    (claim,), _ = cluster.report(report(["a"]), 0.0, [5])
    assert claim == act.ClaimSwitch(5, renew=False)
    assert not cluster.claimed(ev.SwitchClaimed(5, None))       # etcd committed it, but the answer was lost
    actions, _ = cluster.report(report(["a"], {5: "a"}, revision=30), 2.0, [5])
    assert actions == [act.ClaimSwitch(5, renew=True)]            # ours in etcd, unknown here: put again
    assert cluster.claimed(ev.SwitchClaimed(5, 31)) and cluster.owns(5)
    assert cluster.report(report(["a"], {5: "a"}, revision=32), 3.0, [5])[0] == []


def test_a_key_of_ours_we_never_learnt_of_for_a_switch_no_longer_connected_to_us_is_given_up():
    """A claim commits, its answer is lost, and the switch's connection to us goes: the key etcd shows as ours is
    deleted (at the revision etcd shows), rather than holding the switch for no one for as long as we live."""
    etcd = Etcd()
    etcd.join("a")
    cluster = Cluster("a", 4)
    (claim,), _ = cluster.report(etcd.read(0.0), 0.0, [5])
    etcd.claim("a", claim)                                        # committed in etcd ...
    assert not cluster.claimed(ev.SwitchClaimed(5, None))         # ... its answer lost
    actions, _ = cluster.report(etcd.read(1.0), 1.0, [])          # and switch 5 is not connected to us now
    for action in actions:
        etcd.release("a", action)
    assert 5 not in etcd.keys and not cluster.owns(5)


def test_a_switch_we_own_but_no_longer_reach_over_openflow_is_released_after_a_lease():
    cluster = Cluster("a", 6)
    cluster.report(report(["a"]), 0.0, [5])
    assert cluster.claimed(ev.SwitchClaimed(5, 20))
    assert cluster.report(report(["a"], {5: "a"}, revision=21), 1.0, []) == ([], set())     # gone: the clock starts
    assert cluster.report(report(["a"], {5: "a"}, revision=22), 6.5, [5]) == ([], set())    # back before a lease
    assert cluster.report(report(["a"], {5: "a"}, revision=23), 7.0, []) == ([], set())
    actions, lost = cluster.report(report(["a"], {5: "a"}, revision=24), 13.0, [])
    assert actions == [act.ReleaseSwitch(5, 20)] and lost == {5} and not cluster.owns(5)


def test_a_members_copy_answers_no_change_etcd_does_unchanged_if_match_conflict_or_unknown(member):
    """A linearizable register: a PUT equal to this member's copy still goes to etcd (another member may have
    changed it since), If-Match goes with it, and the store's verdict is the answer."""
    from controller.core.errors import Conflict, Indeterminate
    from controller.core.policy import load_document
    document = load_document("policies/reserve.yaml")
    member.handle(report(["a"], policy=(40, document), refreshed_at=1.0), 1.0)
    assert member.keeper.revision == 40 and member.keeper.policy.name == "reserve"
    saves = [a for a in member.handle(ev.SetPolicy("same", document), 1.0) if isinstance(a, act.SavePolicy)]
    assert saves == [act.SavePolicy(document, 41, None)]               # not answered "unchanged" from the copy
    member.handle(ev.PolicySaved(None, 40, changed=False), 1.0)
    assert member.keeper.revision == 40
    saves = [a for a in member.handle(ev.SetPolicy("cas", document, expect=39), 1.0) if isinstance(a, act.SavePolicy)]
    assert saves == [act.SavePolicy(document, 41, 39)]                  # etcd, not the copy, compares
    (answer,) = [a for a in member.handle(ev.PolicySaved(None, 45, conflict=True), 1.0) if isinstance(a, act.Answer)]
    assert isinstance(answer.error, Conflict) and answer.error.current == 45
    member.handle(ev.SetPolicy("lost", document), 1.0)
    (answer,) = member.handle(ev.PolicySaved("etcd: Read timed out", indeterminate=True), 1.0)
    assert isinstance(answer.error, Indeterminate) and "above 40" in str(answer.error)
    assert member.keeper.revision == 40


# --- ownership under any sequence of joins, leaves, lost answers and late reports (a property) ---------------

class Etcd:
    """What a cluster's members share in etcd, for the core: each member's membership and its switches' keys, all
    on its lease (gone with it), and the revision every write raises. A claim and a release are carried out as
    the adapter's transactions are (controller/adapters/claims.py)."""

    def __init__(self) -> None:
        self.revision, self.members, self.keys = 1, set(), {}     # keys: switch → (member, its key's revision)

    def write(self) -> int:
        self.revision += 1
        return self.revision

    def join(self, member: str) -> None:
        self.members.add(member)
        self.write()

    def leave(self, member: str) -> None:
        """Its lease revoked, or run out: its keys go with it."""
        self.members.discard(member)
        self.keys = {dp: held for dp, held in self.keys.items() if held[0] != member}
        self.write()

    def claim(self, member: str, claim: act.ClaimSwitch) -> int | None:
        held = self.keys.get(claim.dp_id)
        if held is None if not claim.renew else held is not None and held[0] == member:
            self.keys[claim.dp_id] = (member, self.write())
            return self.revision
        return None

    def release(self, member: str, release: act.ReleaseSwitch) -> None:
        held = self.keys.get(release.dp_id)
        if held is not None and held[0] == member and release.revision == held[1]:
            del self.keys[release.dp_id]
            self.write()

    def read(self, now: float) -> ev.ClusterChanged:
        return ev.ClusterChanged(tuple(sorted(self.members)), {dp: m for dp, (m, _) in self.keys.items()},
                                 self.revision, None, now, revisions={dp: r for dp, (_, r) in self.keys.items()})


SWITCHES = range(1, 7)
NAMES = ("a", "b", "c")
# Each step: what happens, to which member, and a number (which request in flight; how long a tick is, k/3 s).
# "look" is a read handled at once; "read" then "report" hands the core a report older than what it did since.
STEPS = st.lists(st.tuples(st.sampled_from(("join", "join", "leave", "look", "look", "look", "read", "report", "answer",
                                            "lose", "lose", "unsent", "tick", "tick")),
                           st.sampled_from(NAMES), st.integers(0, 12)), max_size=60)


class Members:
    """Members of one cluster over Etcd, each a Cluster as its controller holds it; their reads (a report handled
    later than it was read) and their etcd requests in flight, carried out in any order."""

    def __init__(self) -> None:
        self.etcd, self.now = Etcd(), 0.0
        self.alive: dict[str, Cluster] = {}
        self.reads: dict[str, list[ev.ClusterChanged]] = {}
        self.flight: dict[str, list[act.Action]] = {}

    def step(self, kind: str, name: str, k: int) -> None:
        if kind == "tick":
            self.now += k / 3
        elif kind == "join" and name not in self.alive:
            self.alive[name], self.reads[name], self.flight[name] = Cluster(name, 4), [], []
            self.etcd.join(name)
        elif name not in self.alive:
            return
        elif kind == "leave":
            del self.alive[name]
            self.etcd.leave(name)
        elif kind == "read":
            self.reads[name].append(self.etcd.read(self.now))
        elif kind == "look" or kind == "report" and self.reads[name]:
            report = self.etcd.read(self.now) if kind == "look" else self.reads[name].pop(0)
            actions, _ = self.alive[name].report(report, self.now, SWITCHES)
            self.flight[name] += [a for a in actions if isinstance(a, act.ClaimSwitch | act.ReleaseSwitch)]
        elif kind in ("answer", "lose", "unsent") and self.flight[name]:
            self.carry_out(name, self.flight[name].pop(k % len(self.flight[name])), kind)

    def carry_out(self, name: str, action: act.Action, how: str = "answer") -> None:
        """`how`: answered; committed but its answer lost ("lose"); or never sent ("unsent")."""
        if isinstance(action, act.ReleaseSwitch):
            self.etcd.release(name, action)
            return
        assert isinstance(action, act.ClaimSwitch)
        revision = None if how == "unsent" else self.etcd.claim(name, action)
        self.alive[name].claimed(ev.SwitchClaimed(action.dp_id, revision if how == "answer" else None))

    def settle(self) -> None:
        """Everything in flight carried out, then reports read and handled in order until nothing changes."""
        for name in self.alive:
            for action in self.flight[name]:
                self.carry_out(name, action)
            self.reads[name], self.flight[name] = [], []
        for _ in range(3 * int(HOLD_DOWN_SECONDS) + 6):
            self.now += 1.0
            for name, cluster in self.alive.items():
                actions, _ = cluster.report(self.etcd.read(self.now), self.now, SWITCHES)
                for action in actions:
                    self.carry_out(name, action)


@given(STEPS)
@settings(max_examples=1500, deadline=None, derandomize=True)
def test_after_any_joins_leaves_lost_answers_and_late_reports_every_switch_has_one_master(steps):
    members = Members()
    for step in steps:
        members.step(*step)
    members.settle()
    if not members.alive:
        return
    for dp in SWITCHES:
        masters = [name for name, cluster in members.alive.items() if cluster.owns(dp)]
        assert len(masters) == 1, (dp, masters, members.etcd.keys.get(dp))
        assert members.etcd.keys[dp][0] == masters[0]


def test_a_save_answered_after_a_newer_policy_came_from_etcd_leaves_the_newer_one_in_force(member):
    """Our PUT is stored at revision 50, another member's at 60, and our member reads the 60 before its own save's
    answer arrives: the answer says 50 was stored, and 60 stays in force (no switch goes back to 50's)."""
    from controller.core.policy import load_document
    ours, theirs = load_document("policies/reserve.yaml"), load_document("policies/auto.yaml")
    member.handle(report(["a"], policy=(40, load_document("policies/none.yaml")), refreshed_at=1.0), 1.0)
    assert [a for a in member.handle(ev.SetPolicy("put", ours), 1.0) if isinstance(a, act.SavePolicy)]
    member.handle(report(["a"], policy=(60, theirs), refreshed_at=1.5), 1.5)
    assert member.keeper.policy.name == "auto"
    out = member.handle(ev.PolicySaved(None, 50), 1.6)
    (policy,) = member.handle(ev.GetPolicy("get"), 1.6)
    assert policy.result == {"policy": theirs, "revision": 60}
    assert member.handle(ev.GetStatus("s"), 1.6)[0].result["policy"] == "auto"
    out += member.handle(ev.ConfirmDue(), 1.6 + CONFIRM_SECONDS)
    (answer,) = [a for a in out if isinstance(a, act.Answer)]
    assert answer.result["applied"] == "reserve" and answer.result["revision"] == 50


def test_a_member_checks_probes_with_the_clusters_key_once_etcd_gives_it(member):
    from dataclasses import replace

    from controller.core import frames
    key = bytes(range(32))
    probe = frames.read_probe(frames.probe_frame(key, 7, 1, 1000, b"12345678"))
    assert probe is not None and not frames.genuine(member.forwarding.fabric.key, probe)   # its own, until then
    member.handle(replace(report(["a"]), probe_key=key), 1.0)
    assert frames.genuine(member.forwarding.fabric.key, probe)


def test_a_member_is_never_a_standby_a_report_of_the_remotes_only_sweeps_the_new_ones(member):
    """A member takes no OVSDB lock: the reports say it is `locked` (it has no standby), which must not read as a
    lock just given to it (a take-over: the policy loaded again, every switch taken over, every remote swept)."""
    assert member.handle(ev.RemotesChanged({REMOTE: True}, (REMOTE,), locked=True), 1.0) == \
        [act.Submit(REMOTE, sweep=True)]
    assert member.handle(ev.RemotesChanged({REMOTE: True}, (), locked=True), 2.0) == []


def test_a_claim_that_failed_or_is_for_a_switch_not_connected_takes_nothing_over(member):
    member.handle(report(["a"], refreshed_at=HOLD_DOWN_SECONDS), HOLD_DOWN_SECONDS)
    assert member.handle(ev.SwitchClaimed(1, None), HOLD_DOWN_SECONDS) == []
    assert member.handle(ev.SwitchClaimed(2, 43), HOLD_DOWN_SECONDS) == []     # ours, but not connected to us
    assert member.authority.owns(2) and not member.authority.owns(1)


def test_a_member_that_has_not_heard_from_a_switchs_ovsdb_for_a_lease_says_it_cannot_reach_it(member):
    """No report has said the switch's remote is connected: a lease later the others are told, so that a member
    that reaches it takes it."""
    member.handle(report(["a"], refreshed_at=HOLD_DOWN_SECONDS), HOLD_DOWN_SECONDS)
    out = member.handle(report(["a"], refreshed_at=HOLD_DOWN_SECONDS + 6), HOLD_DOWN_SECONDS + 6)
    assert act.Unreachable(frozenset({1})) in out
