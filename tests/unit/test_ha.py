"""The one seam for high availability (controller/core/ha.py): alone, one of a pair, or a cluster's member, each
a whole implementation of the interface the controller asks, and the lone controller what it always was."""
from __future__ import annotations

import inspect

import pytest

from controller.core import actions as act
from controller.core import events as ev
from controller.core.authority import Alone, Pair
from controller.core.cluster import Cluster
from controller.core.controller import Controller
from controller.core.ha import Authority
from controller.core.keeper import SAVED_POLICY
from controller.core.member import Member
from controller.core.peers import NO_OWNER, NOT_CONNECTED
from controller.core.policy import load_document
from tests.unit.test_switch import REMOTE, S1, Replica, sent

INTERFACE = sorted({name for name in vars(Authority) if not name.startswith("_")} | set(Authority.__annotations__))


@pytest.mark.parametrize("way", [Alone, Pair, Member])
def test_each_way_implements_every_member_of_the_interface_as_it_is_declared(way):
    for name in INTERFACE:
        declared = getattr(Authority, name, None)
        assert hasattr(way, name), f"{way.__name__}.{name}"
        if isinstance(declared, property):
            assert isinstance(getattr(way, name), property), f"{way.__name__}.{name}: a property"
        elif callable(declared):
            assert inspect.signature(getattr(way, name)) == inspect.signature(declared), f"{way.__name__}.{name}"
    assert isinstance(way.shares, bool)


def test_the_controller_is_alone_unless_told_otherwise():
    assert isinstance(Controller(Replica(), owner="o", saved=ev.PolicyLoaded("absent"), wall=lambda: 0.0).authority,
                      Alone)


def test_a_lone_controller_claims_ids_in_ovsdb_fences_no_one_beats_no_heartbeat_and_shares_nothing():
    """What a controller without [coordination] or a standby did before the seam: it is active from the start,
    masters its switches with a generation id claimed in OVSDB above the switch's, conditions no write on an
    epoch, asks nothing of OVSDB's lock on a report of the remotes, and its status names no owner or cluster."""
    ctl = Controller(Replica(), owner="o", saved=ev.PolicyLoaded(SAVED_POLICY, load_document("policies/auto.yaml")),
                     wall=lambda: 0.0)
    out = ctl.handle(ev.SwitchUp(7, 1, frozenset(S1)), 0.0)
    (ask,) = sent(out, act.RoleRequest)
    out = ctl.handle(ev.RoleReply(7, ask.xid, "equal", 5), 0.0)          # the switch has seen id 5
    assert act.ClaimGeneration(5) in out
    out = ctl.handle(ev.GenerationClaimed(6), 0.0)
    assert [(m.role, m.generation) for m in sent(out, act.RoleRequest)] == [("master", 6)]
    assert ctl.handle(ev.RemotesChanged({REMOTE: True}, (), locked=True), 1.0) == []
    view = ctl.view(1, 1.0)
    assert (view.active, view.confirmed, view.generation, view.epoch) == (True, True, 6, 0)
    status = ctl.handle(ev.GetStatus("s"), 1.0)[0].result
    assert status["role"] == "active" and "cluster" not in status
    assert "owner" not in status["switches"]["0000000000000001"]
    assert ctl.handle(ev.SetPolicy("put", load_document("policies/reserve.yaml")), 1.0)[0] == \
        act.SavePolicy(load_document("policies/reserve.yaml"), 1)           # never refused: no lease to lapse
    with pytest.raises(AssertionError, match="without a cluster"):
        ctl.handle(ev.SwitchClaimed(1, 42), 1.0)


def test_a_lone_controller_saves_a_put_of_the_policy_in_force_while_another_put_is_being_saved():
    """Its copy answers "unchanged" only while no save of its own is in flight: the policy in force may be
    another by the time that save is answered, and the last PUT is the one that stays in force."""
    auto, reserve = load_document("policies/auto.yaml"), load_document("policies/reserve.yaml")
    ctl = Controller(Replica(), owner="o", saved=ev.PolicyLoaded(SAVED_POLICY, auto), wall=lambda: 0.0)
    assert ctl.handle(ev.SetPolicy("first", reserve), 1.0) == [act.SavePolicy(reserve, 1)]
    assert ctl.handle(ev.SetPolicy("again", auto), 1.0) == [act.SavePolicy(auto, 2)]
    ctl.handle(ev.PolicySaved(None, 1), 1.5)
    ctl.handle(ev.PolicySaved(None, 2), 1.5)
    assert ctl.handle(ev.GetPolicy("get"), 2.0)[0].result == {"policy": auto, "revision": 2}


def test_each_way_says_what_it_is_and_what_its_writes_carry():
    alone, pair, member = Alone(), Pair(active=True), Member(Cluster("a", 6.0))
    for way in (alone, pair):
        way.claimed(7)
    pair.beaten(ev.Beaten(100.0, ok=True))
    member.cluster.claimed(ev.SwitchClaimed(1, 42))
    member.cluster.confirmed_at = 100.0
    assert [(w.owns(1), w.owns(2)) for w in (alone, pair, member)] == [(True, True), (True, True), (True, False)]
    assert [(w.generation_of(1), w.epoch_of(1)) for w in (alone, pair, member)] == [(7, 0), (7, 7), (42, 42)]
    assert [w.label(101.0) for w in (alone, pair, member)] == ["active", "active", "member"]
    assert [w.refusal(200.0, "o") is None for w in (alone, pair, member)] == [True, False, False]
    assert [w.shares for w in (alone, pair, member)] == [False, False, True]
    assert [w.peers().absent for w in (alone, pair, member)] == [NOT_CONNECTED, NOT_CONNECTED, NO_OWNER]
    assert [w.status() for w in (alone, pair)] == [{}, {}] and set(member.status()) == {"cluster"}
    assert member.about(1) == {"owner": "a"} and alone.about(1) == {} == pair.about(1)
