"""Claims of the core's and the fidelity monitor's docstrings that no other test checked: each of these once
let a hand mutation of the code live (tests/mutants.py names it beside each test). What is asserted is
what a user sees: the switch's flows and meters, OVSDB's QoS, the device's queues, the API's answer,
the monitor's numbers."""
from dataclasses import replace

import pytest

from controller.adapters.tc import ClassCounters, Leaf
from controller.core import events as ev
from controller.core.authority import LEASE_SECONDS, TAKEOVER_SECONDS
from controller.core.congestion import PROGRAM, CongestionConfig, PortCongestion, PortSample
from controller.core.flows import COOKIE
from controller.core.flowsync import REREAD_SECONDS
from controller.core.meters import COUNTING, METER_BASE, is_ours
from controller.core.portjobs import TC_SWEEP_SECONDS
from tests.unit.fakes import S1_FLOWS, TCP, UDP, VOICE, mode, shipped, up
from tests.unit.test_core import MARKS, steering_sent_while, whole_table_reads
from topo.harness import fidelity

# --- flows: a rule whose match changed is replaced (mutant plan-match) --------------------------------

def test_a_rule_whose_match_changed_is_replaced_not_kept_beside_the_policy(net):
    up(net)
    old = (1000, (("in_port", 1),))
    assert old in net.s1.table
    doc = shipped("reserve")
    doc["switches"]["s1"]["flows"][1]["match"] = {"in_port": 1, "eth_dst": "00:00:00:00:00:01"}   # same actions
    result, error = net.app.request(ev.SetPolicy, doc)
    assert error is None and result["in_sync"] is True, result
    assert old not in net.s1.table
    assert (1000, (("eth_dst", "00:00:00:00:00:01"), ("in_port", 1))) in net.s1.table
    assert len(net.s1.table) == S1_FLOWS


# --- tc: the leaves' packet limit, checked on news and by the slow sweep (tc-limit, tc-sweep) -------------

def a_leaf_changed_by_hand(net) -> tuple[dict, str]:
    """One of s1-eth1's class queues given another packet limit, of the same kind, by hand: (the leaves as
    the policy has them, the class changed)."""
    before = net.app.tc.leaves("s1-eth1")
    cls, leaf = sorted(before.items())[0]
    assert leaf.limit is not None
    net.app.tc.leaves_["s1-eth1"][cls] = Leaf(leaf.kind, leaf.limit + 7)
    assert net.app.tc.leaves("s1-eth1") != before
    return before, cls


def test_a_leaf_whose_packet_limit_was_changed_by_hand_is_put_back_when_netlink_says_so(net):
    up(net)
    before, _ = a_leaf_changed_by_hand(net)
    net.app.handle(ev.TcChanged(frozenset({net.app.tc.ifindex("s1-eth1")})))
    net.app.settle()
    assert net.app.tc.leaves("s1-eth1") == before
    assert net.app.snapshot.drift_repairs() == {"tc": 1}


def test_a_tc_change_netlink_did_not_announce_is_put_back_by_the_slow_sweep(net):
    up(net)
    before, cls = a_leaf_changed_by_hand(net)
    net.app.advance(TC_SWEEP_SECONDS - 30)     # polls go on; nothing told the controller of the change
    assert net.app.tc.leaves("s1-eth1")[cls] != before[cls]
    net.app.advance(60)
    assert net.app.tc.leaves("s1-eth1") == before


# --- congestion: "at or above" the utilisation threshold (hot-ge) --------------------------------------

def test_a_port_exactly_at_the_utilisation_threshold_and_losing_packets_is_hot():
    config = CongestionConfig(utilisation=0.9, loss_ratio=0.01, samples=2)
    detector = PortCongestion(config)
    at_threshold = PortSample(tx_bps=4_500_000, tx_pps=950, drops_ps=50, capacity_bps=5_000_000)
    assert at_threshold.utilisation == config.utilisation
    decisions = [detector.observe(at_threshold, t) for t in (0.0, 1.0)]
    assert decisions[0] is None and decisions[1] is not None and decisions[1].action == PROGRAM


# --- meters: a policed class is counted by its own meter, not a second one (meters-policed-counted) -------

def test_an_auto_ports_policed_class_passes_its_policing_meter_and_no_counting_meter(net):
    doc = shipped("auto")
    doc["classes"]["udp"]["police"] = {"rate": "500kbit", "burst": "50kbit"}
    net.app.connect(net.s1)
    net.app.connect(net.s2)
    result, error = net.app.request(ev.SetPolicy, doc)
    assert error is None and result["in_sync"], (result, error)
    ours = {m for m in net.s1.meters if is_ours(m)}
    counting = {m for m in ours if m & COUNTING}
    assert METER_BASE | 2 in ours                   # udp's (queue 2) policing meter
    assert len(counting) == 2                       # tcp's and voice's flows only: udp's meter counts udp
    meters_of = {e.cookie: net.s1.meters_of(e) for e in net.s1.table.values()}
    assert meters_of[UDP] == {METER_BASE | 2}
    assert len(meters_of[TCP]) == len(meters_of[VOICE]) == 1 and meters_of[TCP] | meters_of[VOICE] == counting


# --- the policy: fast polls no slower than the slow ones (fast-poll-bound) --------------------------------

def test_a_fast_poll_interval_longer_than_the_poll_interval_is_refused_by_name(net):
    up(net)
    doc = shipped("auto")
    doc["congestion"]["poll_interval"] = 0.5
    doc["congestion"]["fast_poll_interval"] = 1.0
    _, error = net.app.request(ev.SetPolicy, doc)
    assert error is not None and str(error).startswith("congestion.fast_poll_interval: ")
    assert net.app.keeper.policy.name == "reserve"


# --- the fidelity monitor: what a queue dropped over the block, not since it was made (monitor-drops) -------

class FakeNetlink:
    """tc as the monitor reads it: each look at the queues gets the next of `looks` (class → its leaf)."""

    def __init__(self, *looks: dict[str, Leaf]):
        self.looks = list(looks)

    def leaves(self, iface: str) -> dict[str, Leaf]:
        return self.looks.pop(0)

    def classes(self, iface: str) -> dict[str, ClassCounters]:
        return {"1:2": ClassCounters(0, 0, 0)}

    def close(self) -> None:
        pass


def monitored(monkeypatch, netlink: FakeNetlink) -> fidelity.Monitor:
    monkeypatch.setattr(fidelity, "Tc", lambda: netlink)
    monkeypatch.setattr(fidelity, "_pids", lambda name: [])
    with fidelity.Monitor("s1-eth1") as monitor:
        pass
    assert not netlink.looks          # it looked at the start and at the end
    return monitor


def test_the_monitor_reports_what_each_queue_dropped_during_its_block_only(monkeypatch):
    monitor = monitored(monkeypatch, FakeNetlink(
        {"1:2": Leaf("fq_codel", None, drops=1000), "1:3": Leaf("pfifo", 25, drops=40)},
        {"1:2": Leaf("fq_codel", None, drops=1030), "1:3": Leaf("pfifo", 25, drops=40)}))
    assert monitor.leaf_drops == {"1:2": 30, "1:3": 0}
    assert monitor.queues == {"1:2": {"fq_codel"}, "1:3": {"pfifo"}}
    assert len(monitor.samples) >= 1


def test_the_monitor_counts_no_drops_for_a_queue_replaced_during_its_block(monkeypatch):
    monitor = monitored(monkeypatch, FakeNetlink(
        {"1:2": Leaf("pfifo", 25, drops=1000)},
        {"1:2": Leaf("fq_codel", None, drops=5), "1:3": Leaf("pfifo", 25, drops=9)}))   # replaced; new
    assert monitor.leaf_drops == {}
    assert monitor.queues == {"1:2": {"pfifo", "fq_codel"}, "1:3": {"pfifo"}}


# --- order without waiting (plan.py's docstring), whichever of the switch and OVSDB answers first ---------
# (mutants plan-steered and plan-reserving-now; tests/unit/fakes.py Harness.jobs_first)

@pytest.mark.parametrize("jobs_first", [False, True], ids=["flows land first", "OVSDB changes first"])
def test_flows_steer_into_a_ports_queues_only_once_ovsdb_holds_them(net, jobs_first):
    up(net, "none")
    net.app.jobs_first = jobs_first
    record: list = []
    steering_sent_while(net, record)
    result, _ = net.app.request(ev.SetPolicy, shipped("reserve"))
    assert result["in_sync"] is True and mode(net) == "reserve" and len(net.s1.steering()) == 3
    steers = [m for kind, m in record if kind == "steer"]
    assert steers and set(steers) == {"reserve"}, record   # every steering flow mod met the queues there


@pytest.mark.parametrize("jobs_first", [False, True], ids=["flows land first", "OVSDB changes first"])
def test_a_port_keeps_its_queues_while_the_switchs_flows_still_steer_into_them(net, jobs_first):
    up(net)
    net.app.jobs_first = jobs_first
    record: list = []
    steering_sent_while(net, record)
    result, _ = net.app.request(ev.SetPolicy, shipped("none"))
    assert result["in_sync"] is True and mode(net) != "reserve" and net.s1.steering() == set()
    queue_changes = [steering for kind, steering in record if kind == "queues"]
    assert queue_changes and set(queue_changes) == {0}, record   # the queues went once nothing steered


# --- tc: an operation netlink refuses is reported and tried again (FakeTc.fail) ---------------------------

def test_a_tc_operation_netlink_refuses_is_reported_and_tried_again_at_the_next_poll(net):
    net.app.tc.fail["replace_filters"] = "Operation not permitted"
    result = up(net)
    assert result["in_sync"] is False and "Operation not permitted" in result["not_in_sync"]["0000000000000001"][
        "port 1 (s1-eth1)"], result
    net.app.poll()
    assert net.app.tc.filters("s1-eth1") == set()
    status = net.app.request(ev.GetStatus)[0]["switches"]["0000000000000001"]
    assert status["in_sync"] is False and "tc: " in status["not_in_sync"]["port 1 (s1-eth1)"]
    del net.app.tc.fail["replace_filters"]
    net.app.poll()
    assert net.app.tc.filters("s1-eth1") == MARKS
    status = net.app.request(ev.GetStatus)[0]["switches"]["0000000000000001"]
    assert status["in_sync"] is True and status["not_in_sync"] == {}
    assert net.app.snapshot.drift_repairs() == {}    # our own work finished late, not a change someone made


# --- OVSDB: the rows a bridge that went left behind are removed, by the active one only -------------------
# (mutants bridge-gone-sweep, standby-sweeps)

def new_remote(app) -> None:
    """The app's report that the OVSDB remote has just connected."""
    app.handle(ev.RemotesChanged(app.remotes.connected(), ("fake",), app.remotes.locked, app.remotes.lock_taken,
                                 app.remotes.heartbeat()))
    app.settle()


def test_the_rows_a_bridge_that_went_left_behind_are_removed(net):
    up(net)
    net.ovsdb.orphans = 2        # s2's QoS and queue, left in OVSDB as its bridge went away
    net.app.disconnect(net.s2)
    assert net.ovsdb.orphans == 0


def test_a_standby_leaves_ovsdb_to_the_active_one_until_it_takes_over(net):
    up(net)
    standby = net.app.another()
    net.ovsdb.orphans = 2        # a dead run's rows, found by both when the remote connects
    new_remote(standby)
    assert standby.authority.role == "standby" and net.ovsdb.orphans == 2
    new_remote(net.app)
    assert net.ovsdb.orphans == 0
    net.ovsdb.orphans = 1
    net.app.exit()
    net.ovsdb.holder = standby.session
    standby.remotes_changed()
    assert standby.authority.role == "active" and net.ovsdb.orphans == 0


# --- OVSDB and tc between two reads: a port OVSDB no longer has, a qdisc deleted by hand ------------------
# (mutants plan-absent, tc-waiting, missing-twice)

def test_a_port_ovsdb_no_longer_has_is_left_alone_until_the_switch_says_it_went(net):
    up(net)
    numbered = net.ovsdb.bridges[1]
    net.ovsdb.bridges[1] = replace(numbered, ports={2: "s1-eth2", 3: "s1-eth3"})   # s1-eth1 deleted ...
    net.ovsdb.qos.pop("s1-eth1")                                                 # ... and its QoS with it
    net.app.poll()                               # before the switch's port status says so
    status = net.app.request(ev.GetStatus)[0]["switches"]["0000000000000001"]
    assert status["in_sync"] is True and status["not_in_sync"] == {}, status
    assert net.ovsdb.writes_to["s1-eth1"] == 1   # only the apply that put it there


def test_an_htb_qdisc_deleted_by_hand_is_rebuilt_once_it_is_still_gone_a_poll_later(net):
    up(net)
    net.app.tc.delete_root("s1-eth1")
    assert net.app.tc.classes("s1-eth1") == {}
    net.app.handle(ev.TcChanged(frozenset({net.app.tc.ifindex("s1-eth1")})))
    net.app.settle()
    assert net.app.tc.classes("s1-eth1") == {}   # gone for a moment while OVS rebuilds it? looked at again
    net.app.poll()
    net.app.poll()
    assert set(net.app.tc.classes("s1-eth1")) == {"1:1", "1:2", "1:3", "1:4"}
    assert net.app.tc.filters("s1-eth1") == MARKS and mode(net) == "reserve"
    assert net.app.snapshot.drift_repairs().get("tc") == 1


# --- flows: a flow deleted by hand is back a moment after the switch says so, with no poll ----------------------

def test_one_unclassified_flow_deleted_by_hand_is_back_a_moment_after_the_switch_says_so(net):
    up(net)
    (key,) = [k for k, e in net.s1.table.items() if k == (1000, (("in_port", 1),))]
    polls = net.app.snapshot.switches[1].polls
    net.s1.delete_by_hand(key)                  # its cookie has no CLASSIFIED bit: no class rate shows it
    net.app.settle()
    assert key not in net.s1.table              # a moment, in case the bridge is being deleted
    net.app.advance(REREAD_SECONDS)
    assert key in net.s1.table and len(net.s1.table) == S1_FLOWS
    assert net.app.snapshot.switches[1].polls - polls <= 1 and net.app.snapshot.drift_repairs() == {"flows": 1}
    net.s1.delete_by_hand(key)                  # and again
    net.app.advance(REREAD_SECONDS)
    assert key in net.s1.table and net.app.snapshot.drift_repairs() == {"flows": 2}


def test_every_flow_deleted_at_once_costs_one_read(net):
    up(net)
    reads = whole_table_reads(net.s1)
    net.s1.delete_by_hand()                     # seven flows, each said
    net.app.advance(REREAD_SECONDS)
    assert len(net.s1.table) == S1_FLOWS and whole_table_reads(net.s1) - reads == 1


def test_a_bridge_deleted_says_its_flows_went_before_its_connection_closes_and_nothing_is_repaired(net):
    up(net)
    net.s1.delete_by_hand()                     # ovs-vsctl del-br: every flow said deleted, then the close
    net.app.settle()
    net.app.disconnect(net.s1)
    net.s1.sent.clear()
    net.app.advance(2.0)
    assert net.s1.flow_mods() == [] and net.app.snapshot.drift_repairs() == {}


def test_the_flows_a_policy_change_deletes_are_said_back_and_taken_for_no_drift(net):
    up(net)
    reads = whole_table_reads(net.s1)
    net.app.begin(ev.ClearPolicy)
    assert net.s1.table == {}                                  # every flow of ours deleted, each one said
    assert sum(type(m).__name__ == "OFPFlowRemoved" for _, m in net.s1.replies) == S1_FLOWS
    net.app.settle()
    assert net.app.answers[0].error is None
    net.app.advance(REREAD_SECONDS)
    assert net.app.snapshot.drift_repairs() == {} and whole_table_reads(net.s1) == reads


def test_a_flow_deleted_by_hand_before_a_batch_in_flight_reached_the_switch_is_back_after_all(net):
    up(net, "auto")
    (key,) = [k for k, e in net.s1.table.items() if k == (1000, (("in_port", 1),))]
    net.app.jobs_first = True                   # the batch is sent, held on its way to the switch ...
    net.app.begin(ev.SetPolicy, shipped("reserve"))
    assert net.app.pending_sends
    net.s1.delete_by_hand(key)                  # ... which is told to delete the flow first
    net.app.advance(REREAD_SECONDS)
    assert key in net.s1.table and len(net.s1.table) == S1_FLOWS
    reads = whole_table_reads(net.s1)
    assert net.app.request(ev.ClearPolicy)[1] is None and net.s1.table == {}
    assert whole_table_reads(net.s1) == reads   # that read was for that batch only


def test_a_flow_of_ours_we_never_held_said_deleted_changes_nothing(net):
    """Added by hand with our cookie and the flag after the last read, then deleted: not one we knew of."""
    up(net)
    stray = net.s1.ofproto_parser.OFPFlowMod(net.s1, cookie=COOKIE | 0x7777, priority=5, flags=1,
                                             match=net.s1.ofproto_parser.OFPMatch(in_port=3), instructions=[])
    net.s1.send_msg(stray)
    net.s1.delete_by_hand((5, (("in_port", 3),)))
    net.app.advance(REREAD_SECONDS)
    assert len(net.s1.table) == S1_FLOWS and net.app.snapshot.drift_repairs() == {}


# --- the worker: a controller that is no longer sure of its lock changes nothing (worker-lock) ------------

def test_jobs_a_controller_asked_for_change_nothing_once_its_lease_ran_out_before_they_ran(net):
    up(net, "none")
    before = dict(net.ovsdb.qos)
    net.app.begin(ev.SetPolicy, shipped("reserve"))   # the queues first: jobs wait for the worker's thread
    assert net.app.pending_jobs
    net.app.clock += LEASE_SECONDS + 1                 # which ran late: no heartbeat confirmed the lock since
    net.app.settle()
    assert net.ovsdb.qos == before and mode(net) != "reserve"


# --- authority: a standby never takes the lock from an active one whose heartbeat moves (heartbeat-moves) ---

def test_a_standby_leaves_the_lock_to_an_active_one_that_keeps_beating(net):
    up(net)
    standby = net.app.another()
    for _ in range(3 * 8):                 # three times the time a still heartbeat is given
        net.app.advance(1.0)               # the active one's report: its heartbeat moves
        standby.clock = net.app.clock
        standby.remotes_changed()          # the standby's: it sees it move
        assert standby.authority.role == "standby" and net.app.authority.role == "active"
        assert net.ovsdb.holder is net.app.session
    # The other way: the active one hangs with its session open (its heartbeat stands still). The standby
    # waits out TAKEOVER_SECONDS, not a second less, then steals the lock and is active.
    hung = standby.clock
    while standby.clock - hung < TAKEOVER_SECONDS - 1:
        standby.clock += 1.0
        standby.remotes_changed()
        assert standby.authority.role == "standby" and net.ovsdb.holder is net.app.session
    standby.clock = hung + TAKEOVER_SECONDS + 1
    standby.remotes_changed()
    standby.remotes_changed()              # the lock's new holder, reported as the app reports it each second
    assert net.ovsdb.holder is standby.session and standby.authority.role == "active"


def test_a_standby_whose_path_to_ovsdb_stalls_steals_nothing_at_the_heal(net):
    """The standby's TCP path to OVSDB stalls 10 s (its reports go on, its replica stands still: the heartbeat
    looks still), then heals: OVSDB's silence meanwhile says the path, not the active one, stood still."""
    up(net)
    standby = net.app.another()
    standby.clock = net.app.clock
    standby.remotes_changed()
    seen = net.ovsdb.beats
    for second in range(1, 11):
        net.app.advance(1.0)                        # the active one beats on ...
        net.ovsdb.beats, moved = seen, net.ovsdb.beats   # ... and the standby's replica does not see it
        net.ovsdb.silent = float(second)            # OVSDB has said nothing to it, not even to its probes
        standby.clock = net.app.clock
        standby.remotes_changed()
        net.ovsdb.beats = moved
        assert standby.authority.role == "standby" and net.ovsdb.holder is net.app.session
    net.ovsdb.silent = 0.0                          # healed: the replica catches up
    standby.clock += 1.0
    standby.remotes_changed()
    assert standby.authority.role == "standby" and net.ovsdb.holder is net.app.session


def test_a_standby_that_was_itself_stopped_watches_the_heartbeat_afresh_before_it_steals(net):
    up(net)
    standby = net.app.another()
    standby.clock = net.app.clock
    standby.remotes_changed()                       # it sees the heartbeat ...
    seen = net.ovsdb.beats
    net.app.advance(9.0)                            # ... then is stopped 9 s while the active one beats on;
    standby.clock = net.app.clock                   # on waking its replica still holds the value it saw (the
    net.ovsdb.beats, moved = seen, net.ovsdb.beats  # stream not read yet): the heartbeat looks still for 9 s
    assert moved > seen
    for _ in range(3):
        standby.clock += 1.0
        standby.remotes_changed()
        assert standby.authority.role == "standby" and net.ovsdb.holder is net.app.session
    net.ovsdb.beats = moved                         # the replica catches up: it moves, nothing is stolen
    standby.clock += 1.0
    standby.remotes_changed()
    assert standby.authority.role == "standby" and net.ovsdb.holder is net.app.session
