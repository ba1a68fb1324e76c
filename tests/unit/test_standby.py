"""Active/standby and fencing (controller/core/controller.py, switch.py): the controller without its
owner's OVSDB lock is the switches' OpenFlow slave, changes nothing and refuses changes; when the lock
comes to it, it becomes master with a newer generation id and adopts what the active one programmed.
A controller writes to a switch only once the switch has confirmed it as master on that connection:
not with a role request refused, not when deposed while it hung, not on a fresh connection."""
import json
from types import SimpleNamespace

import pytest

from controller.core import actions as act
from controller.core import events as ev
from controller.core.authority import LEASE_SECONDS, Alone, Pair
from controller.core.cluster import Cluster
from controller.core.controller import Standby
from controller.core.errors import Indeterminate, StorageError
from controller.core.flowsync import REREAD_SECONDS
from controller.core.jobs import Job
from controller.core.member import Member
from controller.core.view import Role
from tests.unit.fakes import S1_FLOWS, FakeConnection, FakeSwitch, flood, mode, shipped, slow_polls, up

MASTER, SLAVE = FakeSwitch.ofproto.OFPCR_ROLE_MASTER, FakeSwitch.ofproto.OFPCR_ROLE_SLAVE


@pytest.fixture
def pair(net):
    """The study's switches under an active controller that has programmed auto's reservation, and a
    standby of the same owner connected to them."""
    up(net, "auto")
    for _ in range(2):
        flood(net, 2.5e6, 2.5e6)
        net.app.poll()
    assert mode(net) == "reserve" and net.s1.steering()
    standby = net.app.another()                      # the active one holds the lock
    for dp in (net.s1, net.s2):
        dp.sent.clear()
        standby.connect(dp)
    return SimpleNamespace(net=net, active=net.app, standby=standby)


def writes(switch) -> list:
    return [type(m).__name__ for m in switch.sent if type(m).__name__ in ("OFPFlowMod", "OFPMeterMod")]


def test_the_standby_is_a_slave_that_changes_nothing_and_refuses_changes(pair):
    standby, s1 = pair.standby, pair.net.s1
    assert standby.authority.role == "standby" and s1.role == SLAVE
    assert s1.generation_id == 1                     # the active one's: a slave's must not be stale either
    standby.poll()
    assert {type(m).__name__ for m in s1.sent} == {"OFPRoleRequest", "OFPMeterFeaturesStatsRequest",
                                                   "OFPMeterConfigStatsRequest", "OFPFlowStatsRequest", "OFPSetAsync",
                                                   "ONFFlowMonitorStatsRequest"}   # it hears others' changes too
    _, error = standby.request(ev.ClearPolicy)
    assert isinstance(error, Standby) and "standby" in str(error)
    status, _ = standby.request(ev.GetStatus)
    assert status["role"] == "standby" and standby.snapshot.role == "standby"


def test_a_take_over_reads_the_switch_anew_and_puts_back_what_changed_while_it_was_standby(pair):
    standby, net = pair.standby, pair.net
    standby.poll()                                   # the standby has read s1's flow table ...
    removed = max(net.s1.table)                      # ... and then one of the policy's entries goes by hand
    net.s1.delete_by_hand(removed)
    pair.active.exit()
    standby.advance(2.5)
    net.ovsdb.holder = standby.session
    standby.remotes_changed()
    assert standby.authority.role == "active" and net.s1.role == MASTER
    assert removed in net.s1.table                   # at the take-over, not at a later poll


def test_the_standby_takes_over_when_the_lock_is_its_and_keeps_what_the_active_one_programmed(pair):
    standby, net = pair.standby, pair.net
    pair.active.exit()                               # the active one died: its lock is released to us
    standby.advance(2.5)
    assert standby.request(ev.GetStatus)[0]["switches"]["0000000000000001"]["role_since"] < standby.clock
    pair.net.ovsdb.holder = standby.session
    standby.remotes_changed()
    assert standby.authority.role == "active" and net.s1.role == MASTER
    # When the switch confirmed the new master, in wall-clock time, for tools that time a take-over.
    assert standby.request(ev.GetStatus)[0]["switches"]["0000000000000001"]["role_since"] == standby.clock
    assert net.s1.generation_id == 2 == net.ovsdb.generation_ids   # newer than the dead one's, kept in OVSDB
    assert standby.keeper.policy.name == "auto"             # the policy the active one saved
    net.app = standby
    for _ in range(3):                               # the flood goes on: nothing rolled back and put again
        flood(net, 2.5e6, 2.5e6)
        standby.poll()
    assert mode(net) == "reserve" and writes(net.s1) == [] and not standby.decisions.last
    for _ in range(6):                               # calm: its own rollback, then a new episode is answered
        standby.poll()
    assert net.s1.steering() == set()
    for _ in range(2):
        flood(net, 2.5e6, 2.5e6)
        standby.poll()
    assert [d["action"] for d in standby.decisions.last] == ["rollback", "program"] and net.s1.steering()


def test_an_active_controller_whose_lock_another_took_stands_down(pair):
    standby, net = pair.standby, pair.net
    net.ovsdb.holder = standby.session               # the lock went to the standby (the active one was cut off)
    pair.active.remotes_changed()
    net.s1.sent.clear()
    pair.active.poll()
    assert pair.active.authority.role == "standby" and net.s1.role == SLAVE and writes(net.s1) == []


def test_a_deposed_active_that_resumes_writes_nothing_anywhere(pair):
    """The active one hangs (SIGSTOP); the standby takes the lock and the switches; the old one resumes
    with a flood's worth of work queued, as if it were still active."""
    active, standby, net = pair.active, pair.standby, pair.net
    net.ovsdb.holder = standby.session               # OVSDB gave the lock away while the active one hung
    standby.remotes_changed()
    assert standby.authority.role == "active" and net.s1.generation == 2
    net.s1.sent.clear()
    net.s2.sent.clear()
    table = {key: list(entry.instructions) for key, entry in net.s1.table.items()}
    for _ in range(8):                               # calm: the old active would roll back, if it could write
        active.poll()
    # OpenFlow 1.3 tells a demoted master nothing, but its heartbeat no longer commits (OVSDB: not the
    # lock's owner), so its lease ran out before it had anything to write: it sent no write at all.
    assert writes(net.s1) == [] and writes(net.s2) == []
    assert active.authority.role == "standby" and net.s1.generation == 2
    assert {key: list(entry.instructions) for key, entry in net.s1.table.items()} == table
    assert mode(net) == "reserve" and net.s1.steering()   # the new active's reservation stands


def test_a_fresh_connection_is_an_equal_and_gets_no_write_before_the_switch_says_master(net):
    """An equal may write to OVS; a controller must not, until the switch has confirmed it as master."""
    up(net)
    net.app.exit()
    deposed = net.app.another()                      # no lock: what a controller cut off from OVSDB is
    net.ovsdb.holder = net.app.another().session     # ... while another one holds it
    deposed.core.authority.role = Role.ACTIVE        # and which has not heard yet, its lease still running
    deposed.core.authority.confirmed_at = deposed.clock
    net.s1.delete_by_hand()                             # something to repair, if it wrongly could
    net.s1.sent.clear()
    deposed.connect(net.s1)
    deposed.poll()
    assert writes(net.s1) == [] and net.s1.table == {}


def test_a_role_request_refused_as_stale_is_claimed_again_above_the_switchs_generation(net):
    """Another owner used the bridge before: it holds a generation id beyond this owner's counter."""
    net.s1.generation = 57
    up(net)
    assert net.s1.role == MASTER and net.s1.generation_id == 58 == net.ovsdb.generation_ids
    assert net.s2.generation_id == 58                # every switch follows the newest claim
    assert len(net.s1.table) == S1_FLOWS and mode(net) == "reserve"


def test_a_stale_refusal_after_the_claim_is_claimed_again_and_written_after(net):
    up(net)
    net.s1.delete_by_hand()
    net.s1.generation = 1000                         # another controller mastered it meanwhile, and left
    net.app.disconnect(net.s1)
    net.app.connect(net.s1)                          # our claim (1) is stale: learn 1000, claim 1001
    net.app.poll()
    assert net.s1.generation_id == 1001 and len(net.s1.table) == S1_FLOWS


def test_a_connection_claiming_a_live_switchs_datapath_id_does_not_displace_it(net):
    up(net)
    impostor = FakeSwitch(99, {7: "x"})              # says it is datapath 1, and answers nothing useful
    rival = net.app.connect(impostor, claims=1)
    net.app.advance(1.0)                             # s1 answers the echo: the impostor is closed
    assert rival in net.app.closed and net.app.switches[1].conn == net.app.conn_of(net.s1)
    net.app.disconnect(impostor, rival)              # its departure does not forget the switch
    net.s1.delete_by_hand()
    net.app.poll()
    assert len(net.s1.table) == S1_FLOWS and "0000000000000001" in net.app.request(ev.GetStatus)[0]["switches"]
    _, error = net.app.request(ev.ClearPolicy)
    assert error is None and net.s1.table == {} and mode(net) is None


def test_a_reconnected_switch_whose_old_connection_is_dead_is_taken_once_the_echo_goes_unanswered(net):
    up(net)
    old = net.app.conn_of(net.s1)
    net.app.conns[old].answers_echo = False          # the old connection is half dead
    new = net.app.connect(net.s1)                    # the same bridge, a new connection
    net.app.advance(4.0)
    assert old in net.app.closed and net.app.switches[1].conn == new


def test_an_active_cut_off_from_ovsdb_stops_writing_and_speaking_as_active_within_its_lease(net):
    """Its heartbeats stop committing: it cannot tell whether a standby has the lock by now, so after
    LEASE_SECONDS it writes nothing, refuses changes, never touches the saved policy, and says so."""
    up(net)
    saved = net.ovsdb.policy_text
    net.ovsdb.connected = False                      # cut off: its heartbeats fail
    net.app.advance(LEASE_SECONDS + 1)
    status, _ = net.app.request(ev.GetStatus)
    assert status["role"] == "unconfirmed" and net.app.snapshot.role == "unconfirmed"
    _, error = net.app.request(ev.SetPolicy, shipped("auto"))
    assert isinstance(error, Standby) and "has not confirmed" in str(error)
    assert net.ovsdb.policy_text == saved
    net.s1.delete_by_hand()                             # something to repair, if it wrongly could
    net.s1.sent.clear()
    net.app.poll()
    assert writes(net.s1) == [] and net.s1.table == {}
    net.ovsdb.connected = True                       # back, the lock still its own: confirmed, and it repairs
    net.app.poll()
    net.app.poll()
    assert net.app.request(ev.GetStatus)[0]["role"] == "active" and len(net.s1.table) == S1_FLOWS


def test_a_deposed_actives_tc_write_after_the_take_over_is_refused_by_the_new_generation(pair):
    """tc has no lock to assert: the pair's generation id is its epoch of every switch (raised in OVSDB, under the
    switch's host lock where tc is written), so an active that stalled after its last check of the lock, and
    whose own clock still says its lease runs, writes nothing once the new active has raised it."""
    net, active, standby = pair.net, pair.active, pair.standby
    assert net.ovsdb.epochs == {1: 1, 2: 1}          # the active's generation id, raised on each switch it wrote
    sw = active.switches[1]
    port_no, spec = next(iter(sw.jobs.specs.items()))
    late = Job(1, sw.conn, port_no, sw.bridge.ports[port_no], True, spec, True, epoch=active.authority.epoch_of(1))
    net.ovsdb.holder = standby.session               # the active one stalls; the lock goes to the standby
    standby.remotes_changed()
    assert standby.authority.role == "active" and net.ovsdb.epochs == {1: 2, 2: 2}
    written = active.tc.writes
    [result] = active.worker.execute([late])         # it resumes with the job it had checked
    assert active.authority.confirmed(active.clock) and active.tc.writes == written
    assert result.error == "another controller of this owner holds it now (epoch 2, ours 1)"


def test_a_deposed_actives_put_is_refused_by_ovsdb_and_changes_nothing(pair):
    """The pair's policy is saved by a transaction that asserts the lock: an active that has not yet learnt the
    lock went (its lease still runs by its own clock) cannot overwrite what the new active saved."""
    net, active, standby = pair.net, pair.active, pair.standby
    net.ovsdb.holder = standby.session
    standby.remotes_changed()
    saved = net.ovsdb.policy_text
    assert active.authority.confirmed(active.clock) and '"name": "auto"' in saved
    _, error = active.request(ev.SetPolicy, shipped("reserve"))
    assert isinstance(error, StorageError) and "this controller may no longer hold the pair's lock" in str(error)
    assert net.ovsdb.policy_text == saved and active.keeper.policy.name == "auto"


def test_a_put_whose_save_ovsdb_did_not_answer_is_indeterminate_and_its_revision_is_not_given_again(net):
    up(net, "auto")
    revision = net.app.keeper.revision
    net.ovsdb.slow = True
    _, error = net.app.request(ev.SetPolicy, shipped("reserve"))
    assert isinstance(error, Indeterminate) and f"a revision above {revision} is it" in str(error), error
    assert net.app.keeper.policy.name == "auto" and json.loads(net.ovsdb.policy_text)["revision"] == revision + 1
    net.ovsdb.slow = False
    result, error = net.app.request(ev.SetPolicy, shipped("reserve"))
    assert error is None and result["revision"] == revision + 2
    assert json.loads(net.ovsdb.policy_text)["revision"] == revision + 2


def test_a_pair_that_kept_its_policy_in_a_shared_file_takes_it_from_there_until_its_first_change(net):
    net.app.state_file.write_text(json.dumps({"policy": shipped("reserve"), "saved": 0}))
    net.app.exit()
    assert net.ovsdb.policy_text is None
    restarted = net.app.another()                    # the lock is free: it is the active one
    assert restarted.authority.role == "active" and restarted.keeper.policy.name == "reserve"
    restarted.remotes_changed()
    _, error = restarted.request(ev.SetPolicy, shipped("auto"))
    assert error is None and '"name": "auto"' in net.ovsdb.policy_text


def test_a_master_refused_as_stale_learns_the_switchs_id_claims_above_it_and_puts_the_switch_right(net, caplog):
    """Another owner's controller masters s1 with a newer id and empties its table; our next claim of s1 (a new id
    of ours, claimed for s2) is refused as stale. s1 is asked its id again, claimed above it, and repaired."""
    up(net)
    rival = FakeConnection(net.s1)
    rival.send_msg(rival.ofproto_parser.OFPRoleRequest(rival, MASTER, 1000))
    net.s1.delete_by_hand()
    net.app.disconnect(net.s2)
    net.s2.generation = 500                          # s2 saw a newer id too: ours becomes 501, claimed everywhere
    net.app.connect(net.s2)
    assert "switch 0000000000000001 refused our role request: OFPET_ROLE_REQUEST_FAILED/OFPRRFC_STALE" in \
        caplog.messages                               # s1 refused the claim of 501
    net.app.poll()
    assert (net.s1.role, net.s1.generation_id) == (MASTER, 1001) and len(net.s1.table) == S1_FLOWS


def test_a_hung_active_has_stopped_by_its_own_clock_before_its_standby_steals_the_lock(pair):
    """LEASE_SECONDS against TAKEOVER_SECONDS: an active that hangs (no heartbeat, no event) and resumes at the
    moment its standby steals the lock no longer speaks or writes as the active one."""
    net, active, standby = pair.net, pair.active, pair.standby
    for _ in range(30):                              # the standby watches the heartbeat stand still
        standby.advance(1.0)
        if net.ovsdb.holder is standby.session:
            break
    assert net.ovsdb.holder is standby.session
    active.clock = standby.clock                     # it resumes, and has heard nothing yet
    status, _ = active.request(ev.GetStatus)
    assert status["role"] == "unconfirmed"
    _, error = active.request(ev.SetPolicy, shipped("reserve"))
    assert isinstance(error, Standby) and "has not confirmed" in str(error)


def steal_after(standby, net, limit: int = 30) -> int:
    """Seconds of the standby's reports until it has taken the lock."""
    for second in range(1, limit + 1):
        standby.advance(1.0)
        if net.ovsdb.holder is standby.session:
            return second
    raise AssertionError(f"no steal in {limit} s")


def test_a_standby_steals_the_lock_once_the_heartbeat_has_stood_still_for_8_s(pair):
    """docs/operations.md: "a standby that sees the heartbeat stand still for 8 s steals the lock"."""
    assert steal_after(pair.standby, pair.net) == 8


def test_a_standby_whose_reports_stopped_for_more_than_3_s_watches_the_heartbeat_afresh(pair):
    """Its copy of OVSDB may be as old as the gap: the 8 s of stillness count from its first report after it."""
    standby, net = pair.standby, pair.net
    standby.advance(5.0)                             # 5 s of a still heartbeat, watched
    standby.clock += 4.0                             # then the standby itself stopped: 4 s between two reports
    standby.advance(0.0)                             # the late report: 9 s since the heartbeat moved, by the clock
    assert net.ovsdb.holder is not standby.session
    assert steal_after(standby, net) == 8


def test_a_standby_whose_reports_came_3_s_apart_goes_on_watching(pair):
    """A gap of 3 s is no stop ("more than 3 s"): the stillness it saw before counts."""
    standby, net = pair.standby, pair.net
    standby.advance(5.0)
    standby.clock += 3.0                             # the next report 3 s after the last: 8 s of stillness then
    standby.advance(0.0)
    assert net.ovsdb.holder is standby.session


def test_a_standby_to_which_ovsdb_was_silent_for_more_than_2_5_s_watches_the_heartbeat_afresh(pair):
    """Its session is probed every second, so a silence that long is its stalled path, not a still heartbeat:
    the 8 s of stillness count from its first report after it (a hung active is replaced that much later)."""
    standby, net = pair.standby, pair.net
    standby.advance(3.0)                             # 3 s of a still heartbeat, watched
    net.ovsdb.silent = 3.0                           # the next report: OVSDB has said nothing to it for 3 s
    standby.advance(1.0)
    net.ovsdb.silent = 0.0
    assert steal_after(standby, net) == 8


def test_a_standby_to_which_ovsdb_was_silent_for_2_5_s_goes_on_watching(pair):
    """A silence of 2.5 s is no stalled path ("more than 2.5 s"): the stillness it saw before counts."""
    standby, net = pair.standby, pair.net
    standby.advance(3.0)
    net.ovsdb.silent = 2.5
    standby.advance(1.0)
    net.ovsdb.silent = 0.0
    assert steal_after(standby, net) == 4


def test_an_active_of_a_pair_writes_within_3_s_of_sending_its_last_confirmed_heartbeat_and_not_after():
    """docs/operations.md: it answers as `active` "only within 3 s of sending the last heartbeat OVSDB committed"."""
    authority = Pair(active=True)
    authority.beaten(ev.Beaten(100.0, ok=True))
    authority.beaten(ev.Beaten(99.0, ok=True))       # an older beat's answer, late: the lease runs from the newest
    authority.beaten(ev.Beaten(101.0, ok=False))     # a beat OVSDB did not commit proves nothing
    assert authority.confirmed(102.999) and not authority.confirmed(103.0)
    assert authority.label(102.0) == "active" and authority.label(103.0) == "unconfirmed"


def test_the_fence_a_lone_controller_a_pair_and_a_cluster_member_carry():
    """The epoch each one's OVSDB and tc writes are conditioned on: none alone (no one to fence), the pair's
    generation id, a cluster member's claim (its key's revision) of the switch."""
    alone, pair = Alone(), Pair(active=True)
    alone.claimed(7)
    pair.claimed(7)
    assert (alone.epoch_of(1), alone.generation_of(1)) == (0, 7)
    assert (pair.epoch_of(1), pair.generation_of(1)) == (7, 7)
    cluster = Cluster("a", 4.0)
    member = Member(cluster)
    cluster.claimed(ev.SwitchClaimed(1, 42))
    assert (member.epoch_of(1), member.generation_of(1)) == (42, 42)
    assert member.need(1, 42) == [act.ClaimSwitch(1, renew=True)]   # a switch saw 42: the key put again, for a newer


def test_an_active_that_stands_down_and_takes_over_again_polls_each_switch_once_an_interval(pair):
    """The poll timer of its first turn is still set when the second turn starts its own: only one of them polls."""
    net, active = pair.net, pair.active
    net.s1.load = {1: 0.6 * 5_000_000}               # busy: fast polled too
    active.advance(1.0)
    net.ovsdb.holder = pair.standby.session
    active.remotes_changed()                         # stood down ...
    net.ovsdb.holder = active.session
    active.remotes_changed()                         # ... and the lock back at once
    assert active.authority.role == "active"
    polls = slow_polls(active, net.s1)
    fast = len([m for m in net.s1.sent if type(m).__name__ == "OFPPortStatsRequest" and m.port_no == 1])
    active.advance(5.0)
    assert 4 <= len(polls) <= 5 and len(polls) == len(set(polls)), polls
    fast = len([m for m in net.s1.sent if type(m).__name__ == "OFPPortStatsRequest" and m.port_no == 1]) - fast
    assert 80 <= fast <= 101, fast                   # every 50 ms, one chain of them


def test_a_standby_whose_active_keeps_beating_never_steals(pair):
    for _ in range(12):                              # both run: the heartbeat moves each second
        pair.active.advance(1.0)
        pair.standby.advance(1.0)
    assert pair.net.ovsdb.holder is pair.active.session and pair.standby.authority.role == "standby"


def test_a_standby_hears_the_active_ones_changes_through_its_flow_monitor_and_reads_nothing_for_them(pair):
    standby, s1 = pair.standby, pair.net.s1
    _, error = pair.active.request(ev.SetPolicy, shipped("reserve"))     # the active one changes s1's flows
    assert error is None
    heard = [msg for conn, msg in s1.replies if conn.role == "slave"]
    assert any(type(msg).__name__ == "OFPExperimenterStatsReply" for msg in heard)   # its monitor's updates
    s1.sent.clear()
    standby.advance(2 * REREAD_SECONDS)
    assert [type(m).__name__ for m in s1.sent if type(m).__name__ == "OFPFlowStatsRequest"] == []
