"""The core (controller/core/controller.py, switch.py) driven through connect, policy changes,
congestion, drift, errors and restarts, with fake switches, OVSDB and tc (tests/unit/fakes.py) behind the
real OpenFlow adapter and worker. What is asserted is what the switch and OVSDB end up holding, and what
a client is told."""
from collections import deque
from dataclasses import replace

import pytest

from controller.core import events as ev
from controller.core.errors import PolicyError
from controller.core.flows import CLASSIFIED, COOKIE
from controller.core.flowsync import REREAD_SECONDS
from controller.core.peers import NOT_CONNECTED
from controller.core.plan import FOREIGN
from controller.core.poller import SAY_EVERY, LatePolls
from tests.unit.fakes import S1_FLOWS, S2_FLOWS, TCP, UDP, VOICE, flood, mode, shipped, slow_polls, study_net, up

MARKS = {(family, dscp, cls) for family in ("ipv4", "ipv6") for dscp, cls in ((1, "1:2"), (2, "1:3"), (3, "1:4"))}


# --- a policy put, confirmed --------------------------------------------------------------------

def test_a_policy_is_answered_once_switches_flows_queues_and_filters_hold_it(net):
    result = up(net)
    assert result == {"applied": "reserve", "changed": True, "revision": 1, "in_sync": True}
    assert len(net.s1.table) == S1_FLOWS and len(net.s2.table) == S2_FLOWS
    assert mode(net) == "reserve" and mode(net, "s2-eth1") == "fifo"
    assert net.s1.steering() == {TCP, UDP, VOICE}   # the classified rules steer
    assert net.app.tc.filters("s1-eth1") == MARKS
    assert {leaf.kind for leaf in net.app.tc.leaves("s1-eth1").values()} == {"pfifo_head_drop"}
    assert all(type(m).__name__ in ("OFPFlowMod", "OFPBarrierRequest", "OFPFlowStatsRequest",
                                    "OFPMeterFeaturesStatsRequest", "ONFFlowMonitorStatsRequest",
                                    "OFPMeterConfigStatsRequest", "OFPRoleRequest", "OFPSetAsync") for m in net.s1.sent)
    assert net.s1.role == net.s1.ofproto.OFPCR_ROLE_MASTER


def steering_sent_while(net, record):
    """Record OVSDB's mode of s1-eth1 each time a flow mod that steers (set_queue) reaches s1, and the
    steering flows s1 holds each time OVSDB's QoS of s1-eth1 changes."""
    process, apply = net.s1.process, net.ovsdb.apply

    def watched_process(conn, msg):
        if type(msg).__name__ == "OFPFlowMod" and any(type(a).__name__ == "OFPActionSetQueue"
                                                      for i in msg.instructions for a in getattr(i, "actions", ())):
            record.append(("steer", mode(net)))
        process(conn, msg)

    def watched_apply(changes, *args, **kwargs):
        if "s1-eth1" in changes:
            record.append(("queues", len(net.s1.steering())))
        apply(changes, *args, **kwargs)
    net.s1.process, net.ovsdb.apply = watched_process, watched_apply


def test_flows_steer_into_queues_only_once_ovsdb_holds_them(net):
    up(net, "none")
    record = []
    steering_sent_while(net, record)
    net.app.request(ev.SetPolicy, shipped("reserve"))
    assert record[0] == ("queues", 0)                                   # the queues first, nothing steered yet
    assert [r for r in record if r[0] == "steer"] == [("steer", "reserve")] * 3   # then the steering, on them
    assert mode(net) == "reserve" and len(net.s1.steering()) == 3


def test_the_same_policy_put_again_changes_nothing(net):
    up(net)
    sent, transactions = len(net.s1.sent), net.ovsdb.transactions
    result, _ = net.app.request(ev.SetPolicy, shipped("reserve"))
    assert result == {"applied": "reserve", "changed": False, "revision": 1, "in_sync": True}
    assert len(net.s1.sent) == sent and net.ovsdb.transactions == transactions


def test_a_bad_policy_changes_nothing_and_names_the_field(net):
    up(net)
    bad = shipped("reserve")
    bad["switches"]["s1"]["ports"][1]["capacity"] = "1e30"
    _, error = net.app.request(ev.SetPolicy, bad)
    assert isinstance(error, PolicyError) and str(error).startswith("switches.s1.ports.1.capacity: '1e30'")
    missing = shipped("reserve")
    missing["switches"]["s1"]["ports"] = {9: {"capacity": "5Mbit"}}
    _, error = net.app.request(ev.SetPolicy, missing)
    assert str(error).startswith("switches.s1.ports.9: bridge 0000000000000001 of switch s1 has no OpenFlow port 9")
    assert net.app.keeper.policy.name == "reserve" and mode(net) == "reserve"


def test_clearing_takes_every_flow_and_queue_of_ours_off(net):
    up(net)
    result, _ = net.app.request(ev.ClearPolicy)
    assert result == {"cleared": "reserve", "revision": 2, "in_sync": True}
    assert net.s1.table == {} and net.s2.table == {} and net.ovsdb.qos == {}


# --- congestion ------------------------------------------------------------------------------------

def test_auto_programs_by_steering_into_its_ready_classes_and_rolls_back_by_steering_out(net):
    up(net, "auto")
    assert mode(net) == "reserve" and net.s1.steering() == set()   # the classes are there, unused
    record = []
    steering_sent_while(net, record)
    for _ in range(2):                              # the first poll only reads the counters
        flood(net, tcp_bps=2.5e6, udp_bps=2.5e6)   # TCP well short of its 4 Mbit/s reservation
        net.app.poll()
    assert net.s1.steering() == {TCP, UDP, VOICE}
    assert [d["action"] for d in net.app.decisions.last] == ["program"]
    assert record == [("steer", "reserve")] * 3     # one flow batch: no QoS change at all
    record.clear()
    for _ in range(6):                              # calm: the port idles for the hold time
        net.app.poll()
    assert [d["action"] for d in net.app.decisions.last] == ["program", "rollback"]
    assert mode(net) == "reserve" and net.s1.steering() == set() and record == []


def test_putting_the_same_auto_policy_again_keeps_a_reserving_port_reserving(net):
    up(net, "auto")
    for _ in range(2):
        flood(net, 2.5e6, 2.5e6)
        net.app.poll()
    assert mode(net) == "reserve"
    doc = shipped("auto")
    doc["description"] = "same ports and thresholds, new words"
    result, _ = net.app.request(ev.SetPolicy, doc)
    assert result["changed"] is True and mode(net) == "reserve" and net.s1.steering()


def test_a_restarted_controller_keeps_a_reserving_auto_port_reserving_until_it_is_calm(net, tmp_path):
    up(net, "auto")
    for _ in range(2):
        flood(net, 2.5e6, 2.5e6)
        net.app.poll()
    assert mode(net) == "reserve"
    net.app.exit()
    restarted = net.app.another()
    net.s1.sent.clear()
    restarted.connect(net.s1)
    restarted.connect(net.s2)
    net.app = restarted
    for _ in range(3):                             # the flood goes on: nothing is rolled back and put again
        flood(net, 2.5e6, 2.5e6)
        restarted.poll()
    assert net.s1.steering() and net.s1.flow_mods() == [] and restarted.decisions.last == deque()
    for _ in range(6):                             # calm for the hold time: rolled back as usual
        restarted.poll()
    assert [d["action"] for d in restarted.decisions.last] == ["rollback"] and net.s1.steering() == set()


# --- drift --------------------------------------------------------------------------------------------

def test_flows_deleted_on_the_switch_are_back_after_the_next_poll(net):
    up(net)
    net.s1.delete_by_hand()
    net.app.poll()
    assert len(net.s1.table) == S1_FLOWS and net.s1.steering()
    assert net.app.snapshot.drift_repairs() == {"flows": 1}


def whole_table_reads(dp) -> int:
    return sum(type(m).__name__ == "OFPFlowStatsRequest" and not m.cookie_mask & CLASSIFIED for m in dp.sent)


@pytest.mark.parametrize("monitors, polls, reads", [(False, 20, 2), (True, 60, 1)])
def test_a_steady_switch_reads_its_whole_flow_table_every_ten_polls_or_sixty_if_it_says_each_change(
        net, monitors, polls, reads):
    net.s1.monitors = monitors
    up(net)
    before = whole_table_reads(net.s1)
    for _ in range(polls):
        net.app.poll()
    assert whole_table_reads(net.s1) - before == reads
    assert net.app.snapshot.drift_repairs() == {}


def queue_reads(dp) -> int:
    return sum(type(m).__name__ == "OFPQueueStatsRequest" for m in dp.sent)


def test_a_switch_whose_ports_send_nothing_has_its_queues_read_only_in_a_poll_that_finds_one_sent(net):
    up(net)
    net.app.poll()                               # the first reading of every port: a baseline
    net.app.poll()                               # nothing moved since
    before = queue_reads(net.s1)
    for _ in range(20):                          # the whole flow table twice, the queues never
        net.app.poll()
    assert queue_reads(net.s1) == before
    net.s1.queues[(1, 1)] = (15_000, 10, 0)
    net.s1.load = {1: 120_000}                   # port 1 sends: its queues are read in the poll that finds it
    net.app.poll()
    assert queue_reads(net.s1) - before == 1
    assert net.app.snapshot.switches[1].queues[(1, 1)].tx_bytes == 15_000


def classified_reads(dp) -> int:
    return sum(type(m).__name__ == "OFPFlowStatsRequest" and bool(m.cookie_mask & CLASSIFIED) for m in dp.sent)


def test_classified_flows_are_read_each_poll_from_a_switch_that_has_some_and_received_anything_only(net):
    """An idle switch's flow counters did not move: they are not read (but with the whole table), and rates of 0
    are what its classes offered."""
    up(net, "none")                              # s2 under none: output flows only
    net.app.poll()
    net.app.poll()                               # its ports' counters known, and not moving
    s1, s2 = classified_reads(net.s1), classified_reads(net.s2)
    for _ in range(8):
        net.app.poll()
    assert classified_reads(net.s1) == s1 and classified_reads(net.s2) == s2
    for _ in range(9):
        net.s1.load = {1: 1_000_000}             # it receives, and sends out of port 1, until the next poll
        net.app.poll()
    assert classified_reads(net.s1) - s1 == 9 and classified_reads(net.s2) == s2


def test_a_flow_changed_in_place_on_a_switch_without_a_flow_monitor_is_put_back_within_ten_polls(net, caplog):
    net.s1.monitors = False
    caplog.set_level("INFO", logger="qos")
    up(net)
    assert "switch 0000000000000001 has no flow monitor (OFPET_BAD_REQUEST/OFPBRC_BAD_EXPERIMENTER); a flow changed " \
        "by hand is found by reading its whole table" in caplog.messages
    assert net.app.snapshot.switches[1].openflow_errors == {}      # a switch without it is no error
    (entry,) = [e for (prio, _), e in net.s1.table.items() if prio == 1000 and e.cookie == COOKIE | 1]
    entry.instructions = []                      # someone's mod-flows: same count, no class flow touched
    for _ in range(10):
        net.app.poll()
    assert entry.instructions and net.app.snapshot.drift_repairs() == {"flows": 1}


def held(dp) -> dict:
    return {key: str(e.instructions) for key, e in dp.table.items()}


@pytest.mark.parametrize("change", ["modify", "add", "delete meter"])
def test_a_change_by_hand_that_the_flow_monitor_says_is_put_back_within_a_second_without_a_poll(net, change):
    doc = shipped("police")
    doc["congestion"] = {**doc.get("congestion", {}), "poll_interval": 60}
    net.app.connect(net.s1)
    net.app.connect(net.s2)
    assert net.app.request(ev.SetPolicy, doc)[1] is None
    net.app.advance(2.0)                         # the polls the last interval had set are behind us
    parser, ofp = net.s1.ofproto_parser, net.s1.ofproto
    (prio, match), entry = next((k, e) for k, e in net.s1.table.items() if net.s1.meters_of(e))
    before = held(net.s1)
    if change == "modify":       # ovs-ofctl mod-flows: same flow, no actions
        net.s1.send_msg(parser.OFPFlowMod(net.s1, cookie=entry.cookie, priority=prio, command=ofp.OFPFC_MODIFY_STRICT,
                                          match=parser.OFPMatch(**dict(match)), instructions=[]))
    elif change == "add":        # a flow of ours that the policy does not hold
        net.s1.send_msg(parser.OFPFlowMod(net.s1, cookie=entry.cookie, priority=prio + 1, command=ofp.OFPFC_ADD,
                                          match=parser.OFPMatch(**dict(match)), instructions=[]))
    else:                        # ovs-ofctl del-meter: its flows go with it, which OpenFlow 1.3 does not say
        (meter,) = net.s1.meters_of(entry)
        net.s1.send_msg(parser.OFPMeterMod(net.s1, ofp.OFPMC_DELETE, 0, meter, []))
    assert held(net.s1) != before
    polls = net.app.snapshot.switches[1].polls
    net.app.advance(REREAD_SECONDS + 0.1)
    assert held(net.s1) == before
    assert net.app.snapshot.switches[1].polls == polls and net.app.snapshot.drift_repairs() == {"flows": 1}


def test_a_classified_flow_changed_in_place_is_put_back_at_the_next_poll(net):
    up(net)
    (entry,) = [e for e in net.s1.table.values() if e.cookie == COOKIE | CLASSIFIED | 3]
    entry.instructions = []
    net.app.poll()
    assert entry.instructions and net.s1.steering() == {TCP, UDP, VOICE}


def test_a_qos_cleared_in_ovsdb_is_back_after_the_next_poll(net, caplog):
    up(net)
    del net.ovsdb.qos["s1-eth1"]
    net.app.poll()
    assert mode(net) == "reserve" and net.app.tc.filters("s1-eth1") == MARKS
    assert net.app.snapshot.drift_repairs() == {"qos": 1}
    assert "switch 0000000000000001: drift (qos) repaired: port 1 (s1-eth1): OVSDB holds no QoS, not what we put" \
        in caplog.messages


def test_filters_changed_on_the_device_are_fixed_when_netlink_says_so(net):
    up(net)
    net.app.tc.filters_["s1-eth1"] = set()
    net.app.handle(ev.TcChanged(frozenset({net.app.tc.ifindex("s1-eth1")})))
    net.app.settle()
    assert net.app.tc.filters("s1-eth1") == MARKS
    assert net.app.snapshot.drift_repairs() == {"tc": 1}


def test_a_switch_holding_its_policy_stays_in_sync_while_its_tc_is_checked(net):
    up(net)
    net.app.handle(ev.TcChanged(frozenset({net.app.tc.ifindex("s1-eth1")})))   # OVS's or our own tc change
    assert net.app.pending_jobs                  # the check, not yet done
    assert net.app.request(ev.GetStatus)[0]["switches"]["0000000000000001"]["in_sync"] is True


def test_another_tools_qos_is_left_alone(net):
    net.ovsdb.qos["s1-eth1"] = FOREIGN
    up(net)
    assert net.ovsdb.qos["s1-eth1"] == FOREIGN


def test_another_tools_qos_put_on_a_port_of_ours_is_left_alone_and_not_called_a_repair(net, caplog):
    up(net)
    net.ovsdb.qos["s1-eth1"] = FOREIGN               # another tool replaced our QoS
    net.app.poll()
    net.app.poll()
    assert net.ovsdb.qos["s1-eth1"] == FOREIGN and "qos" not in net.app.snapshot.drift_repairs()
    assert [r.message for r in caplog.records if "another tool" in r.message] == \
        ["switch 0000000000000001 port 1 (s1-eth1): another tool's QoS is on it; left alone"]
    del net.ovsdb.qos["s1-eth1"]                     # the other tool takes its QoS off: ours back, no repair either
    net.app.poll()
    assert mode(net) == "reserve" and "qos" not in net.app.snapshot.drift_repairs()
    net.ovsdb.qos["s1-eth1"] = FOREIGN               # and puts it on again: said again
    net.app.poll()
    assert len([r for r in caplog.records if "another tool" in r.message]) == 2


# --- errors -------------------------------------------------------------------------------------------

def test_an_openflow_error_is_matched_to_its_message_counted_and_shown(net):
    net.s1.refuse_cookies = {COOKIE | 1}
    result = up(net)
    assert result["in_sync"] is False
    assert "OFPET_BAD_ACTION/OFPBAC_BAD_OUT_PORT" in result["not_in_sync"]["0000000000000001"]["flows"]
    assert net.app.snapshot.switches[1].openflow_errors == {"OFPET_BAD_ACTION/OFPBAC_BAD_OUT_PORT": 1}
    status, _ = net.app.request(ev.GetStatus)
    assert status["switches"]["0000000000000001"]["in_sync"] is False


def test_an_ovsdb_refusal_is_shown_and_tried_again_once_a_poll(net, caplog):
    net.ovsdb.refuse = {"s1-eth1"}
    result = up(net)
    assert result["in_sync"] is False and mode(net) is None
    transactions = net.ovsdb.transactions
    net.app.settle()
    assert net.ovsdb.transactions == transactions      # no retry storm between polls
    net.app.poll()
    net.app.poll()
    assert len([m for m in caplog.messages if "port 1 (s1-eth1): port 's1-eth1' refused" in m]) == 1   # said once
    net.ovsdb.refuse = set()
    net.app.poll()
    assert mode(net) == "reserve"
    assert net.app.request(ev.GetStatus)[0]["switches"]["0000000000000001"]["in_sync"] is True


# --- connections and restarts --------------------------------------------------------------------------

def test_a_restarted_controller_adopts_what_is_there_and_sends_no_change(net, tmp_path):
    up(net)
    net.app.exit()
    restarted = net.app.another()   # the saved policy, the same switches
    for dp in (net.s1, net.s2):
        dp.sent.clear()
        restarted.connect(dp)
    assert restarted.keeper.policy.name == "reserve"
    assert {type(m).__name__ for m in net.s1.sent} == {   # reads only
        "OFPRoleRequest", "OFPMeterFeaturesStatsRequest", "OFPMeterConfigStatsRequest", "OFPFlowStatsRequest", "OFPSetAsync",
        "ONFFlowMonitorStatsRequest"}
    assert restarted.request(ev.GetStatus)[0]["switches"]["0000000000000001"]["in_sync"] is True


def test_a_change_is_answered_when_the_switch_it_waited_for_leaves(net):
    # A study tears its network down while clearing the policy: the switch goes before its barrier.
    up(net)
    net.app.begin(ev.ClearPolicy)                # flow deletions sent, their barrier not yet answered
    assert net.app.answers == []
    net.s1.replies.clear()
    net.s2.replies.clear()
    net.app.disconnect(net.s1)
    net.app.disconnect(net.s2)
    (answer,) = net.app.answers                  # answered at once, not when its time runs out
    assert answer.error is None and answer.result["in_sync"] is False
    assert answer.result["not_in_sync"] == {"0000000000000001": NOT_CONNECTED, "0000000000000002": NOT_CONNECTED}


def test_a_change_that_never_settles_is_answered_when_its_time_is_up(net):
    """The API says: answered once every switch holds it, "or after 20 s, saying which do not"."""
    up(net)
    net.app.begin(ev.SetPolicy, shipped("none"))
    net.s1.replies.clear()                       # s1 never answers the barrier of its new flows
    net.app.settle()
    net.app.advance(19.9)
    assert net.app.answers == []
    net.app.advance(0.2)
    (answer,) = net.app.answers
    assert not answer.result["in_sync"] and list(answer.result["not_in_sync"]) == ["0000000000000001"]


def test_a_port_ovsdb_numbered_after_the_last_read_can_be_named_at_once(net):
    # OVS opens a device it could not open at first on a later reconfiguration; the port status that
    # says so, and the re-read of OVSDB that follows it, come a moment after OVSDB numbers the port.
    numbered = net.ovsdb.bridges[1]
    net.ovsdb.bridges[1] = replace(numbered, ports={2: "s1-eth2", 3: "s1-eth3"})
    net.s1.ports = frozenset({2, 3})
    net.app.connect(net.s1)
    net.app.connect(net.s2)
    net.app.advance(20)                          # every re-read after the connection has run
    net.ovsdb.bridges[1] = numbered
    result, error = net.app.request(ev.SetPolicy, shipped("reserve"))
    assert error is None and result["in_sync"] and mode(net) == "reserve"


def test_a_port_added_back_gets_its_queues_however_late_ovsdb_numbers_it(net):
    up(net)
    numbered = net.ovsdb.bridges[1]
    net.ovsdb.bridges[1] = replace(numbered, ports={2: "s1-eth2", 3: "s1-eth3"})   # s1-eth1 deleted ...
    net.ovsdb.qos.pop("s1-eth1")                                                 # ... and its QoS with it
    net.app.handle(ev.PortsChanged(net.app.conn_of(net.s1), frozenset({2, 3})))
    net.app.advance(20)
    net.app.handle(ev.PortsChanged(net.app.conn_of(net.s1), frozenset({1, 2, 3})))   # back, not yet numbered
    net.app.advance(3)
    assert mode(net) is None
    net.ovsdb.bridges[1] = numbered
    net.app.advance(1)
    assert mode(net) == "reserve"


# --- OVSDB remotes ----------------------------------------------------------------------------------

def test_a_switch_pinned_to_a_remote_the_controller_lacks_is_refused_by_name(net):
    up(net)
    doc = shipped("none")
    doc["switches"]["s1"]["ovsdb"] = "tcp:192.0.2.1:6640"
    _, error = net.app.request(ev.SetPolicy, doc)
    assert str(error) == ("switches.s1.ovsdb: tcp:192.0.2.1:6640 is not one of this controller's OVSDB remotes "
                          "(fake); fix it, or add it to the controller's ovsdb option")
    assert net.app.keeper.policy.name == "reserve"


def test_status_shows_each_remote_and_the_remote_of_each_switch(net):
    up(net)
    net.app.handle(ev.RemotesChanged({"fake": True}))
    net.app.settle()
    status, _ = net.app.request(ev.GetStatus)
    assert status["ovsdb"] == {"fake": {"connected": True}}
    assert status["switches"]["0000000000000001"]["ovsdb"] == "fake"
    assert net.app.snapshot.ovsdb_connected == {"fake": True}


def test_a_malformed_saved_policy_starts_without_a_policy_and_leaves_the_switches_as_they_are(net):
    up(net)
    net.app.exit()
    net.ovsdb.policy_text = "{}"                     # valid JSON, not a saved policy (the pair keeps it in OVSDB)
    restarted = net.app.another()
    net.s1.sent.clear()
    restarted.connect(net.s1)
    restarted.connect(net.s2)
    restarted.poll()
    assert restarted.keeper.mode == "unset" and restarted.keeper.policy is None
    assert net.s1.flow_mods() == [] and len(net.s1.table) == S1_FLOWS and mode(net) == "reserve"


def test_a_policy_put_live_is_checked_as_the_offline_checker_checks_it(net):
    """Flows' in_port and outputs too, not only the ports: one check (core/bridges.check_ports) for both."""
    from controller.core.bridges import check_bridges
    from controller.core.policy import parse_policy
    up(net)
    doc = shipped("reserve")
    doc["switches"]["s1"]["flows"][0]["match"]["in_port"] = 9
    with __import__("pytest").raises(PolicyError) as offline:
        check_bridges(parse_policy(doc), {1: set(net.s1.ports), 2: set(net.s2.ports)})
    _, error = net.app.request(ev.SetPolicy, doc)
    assert str(error) == str(offline.value) == (
        "switches.s1.flows[0].match.in_port: bridge 0000000000000001 of switch s1 has no OpenFlow port 9 (it has "
        "1, 2, 3); fix the port number")
    assert net.app.keeper.policy.name == "reserve"


def test_a_switch_of_the_policy_that_is_not_connected_is_named_and_changed_when_it_connects(net):
    net.app.connect(net.s1)
    result, _ = net.app.request(ev.SetPolicy, shipped("reserve"))
    assert result["in_sync"] is False and result["not_in_sync"] == {"0000000000000002": NOT_CONNECTED}
    net.app.connect(net.s2)
    assert len(net.s2.table) == S2_FLOWS and mode(net, "s2-eth1") == "fifo"
    net.app.disconnect(net.s2)
    result, _ = net.app.request(ev.ClearPolicy)      # s2 keeps ours until it is back
    assert result["not_in_sync"] == {"0000000000000002": NOT_CONNECTED} and mode(net, "s2-eth1") == "fifo"
    net.app.connect(net.s2)
    assert net.s2.table == {} and mode(net, "s2-eth1") is None


def test_a_switch_that_answers_no_poll_for_ten_seconds_while_its_ovsdb_is_cut_off_too_has_its_connection_closed(net):
    """A path dead without a close (a cut cable, a host gone) is found by the polls, not after OpenFlow's echo
    gives up minutes later; a slow switch that still answers is left alone."""
    up(net)
    conn = net.app.conn_of(net.s1)
    net.app.advance(8.0)
    net.s1.mute = True
    net.ovsdb.connected = False
    net.app.advance(9.0)
    assert net.app.closed == []
    net.app.advance(3.0)
    assert net.app.closed == [conn]


def test_a_silent_switch_whose_ovsdb_answers_is_kept(net):
    """Its vswitchd busy (at 10,000 ports each OVSDB change reconfigures every port for over 10 s) or hung:
    closing would only make every bridge of the host connect again, to the same vswitchd."""
    up(net)
    net.s1.mute = True
    net.app.advance(60.0)
    assert net.app.closed == []
    net.s1.mute = False
    net.app.advance(2.0)
    assert net.app.closed == []
    assert net.app.request(ev.GetStatus)[0]["switches"]["0000000000000001"]["in_sync"] is True


def test_the_poll_that_closes_a_dead_switchs_connection_writes_nothing_to_its_devices(tmp_path):
    """Let go once found dead: that poll does nothing more for it, not even the retry of a tc write netlink
    refused, which each poll before it tried again. A lone controller's jobs carry no epoch for the unreachable
    OVSDB to refuse, so its worker would write the device; the switch's next connection does it instead."""
    net = study_net(tmp_path, alone=True)
    net.app.tc.fail = {"replace_leaf": "Operation not permitted"}
    up(net)                                      # OVSDB took the queues; their leaves wait, retried at each poll
    conn = net.app.conn_of(net.s1)
    net.s1.mute = True
    net.app.advance(11.0)                        # silent past the limit, but its OVSDB answers: kept
    assert net.app.closed == []
    net.ovsdb.connected = False                  # now its host's OVSDB is cut off too, as the app reports
    net.app.remotes_changed()
    net.app.tc.fail = {}                         # and netlink would take the write
    net.app.advance(1.0)                         # the next poll closes it
    assert net.app.closed == [conn]
    assert "pfifo_head_drop" not in {leaf.kind for leaf in net.app.tc.leaves("s1-eth1").values()}
    net.app.disconnect(net.s1, conn)             # its end, once the close is done
    net.s1.mute, net.ovsdb.connected = False, True
    net.app.remotes_changed()
    net.app.connect(net.s1)
    assert {leaf.kind for leaf in net.app.tc.leaves("s1-eth1").values()} == {"pfifo_head_drop"}


def test_a_switch_busy_when_it_connects_has_ten_seconds_to_answer_counted_from_then(net):
    """Its silence is counted from the connection (poller.start), not from the controller's start: a switch
    whose vswitchd is busy at first is not closed at its first poll."""
    net.s1.stalled = True                        # it answers nothing yet, not even the role request
    conn = net.app.connect(net.s1)
    net.ovsdb.connected = False                  # nor its host's OVSDB: a path gone, not a busy vswitchd
    net.app.advance(9.5)
    assert net.app.closed == []
    net.app.advance(3.0)                         # still nothing: dead after all
    assert net.app.closed == [conn]


def test_a_switch_whose_every_poll_is_answered_after_the_next_is_due_is_slow_not_dead(net):
    up(net)
    net.s1.late = True
    for _ in range(20):                          # each poll answered 1-2 s late: after the next one began
        net.app.advance(1.0)
        net.s1.release()
    assert net.app.closed == []
# --- what stays shown, and for how long ------------------------------------------------------------------

def test_a_flow_error_is_shown_until_the_switch_takes_the_batch_and_not_after(net):
    net.s1.refuse_cookies = {COOKIE | 1}
    assert up(net)["in_sync"] is False
    assert "flows" not in net.app.snapshot.drift_repairs()    # the rest of our own batch, read back, is no drift
    net.s1.refuse_cookies = set()                # the switch takes the batch when it is sent again, a poll later
    net.app.poll()
    s1 = net.app.request(ev.GetStatus)[0]["switches"]["0000000000000001"]
    assert (s1["in_sync"], s1["not_in_sync"]) == (True, {}) and net.app.snapshot.in_sync[1]
    assert len(net.s1.table) == S1_FLOWS


def test_the_policy_load_error_is_shown_until_a_policy_is_taken(net):
    up(net)
    bad = shipped("auto")
    bad["classes"]["udp"]["queue"] = 1           # two classes share a queue
    _, error = net.app.request(ev.SetPolicy, bad)
    assert isinstance(error, PolicyError) and net.app.snapshot.load_error
    _, error = net.app.request(ev.SetPolicy, shipped("auto"))
    assert error is None and not net.app.snapshot.load_error
    net.app.exit()
    assert not net.app.another().snapshot.load_error   # restarted: it has refused nothing yet


def test_a_change_a_busy_switch_takes_seconds_to_hold_is_answered_in_sync_once_it_does(net):
    """vswitchd busy for 5 s (well within CONFIRM_SECONDS): the answer waits for it, rather than saying at once
    that the switch is not in sync."""
    up(net)
    net.s1.stalled = True
    net.app.begin(ev.SetPolicy, shipped("auto"))
    net.app.advance(5.0)
    assert net.app.answers == []
    net.s1.stalled = False
    net.app.advance(1.0)
    (answer,) = net.app.answers
    assert answer.error is None and answer.result["in_sync"] is True


# --- what is not ours -------------------------------------------------------------------------------------

def test_a_switch_outside_the_policy_loses_our_queues_and_keeps_another_tools(net):
    up(net)
    net.ovsdb.qos["s2-eth4"] = FOREIGN               # another tool's QoS on a port of s2
    outside = shipped("reserve")
    del outside["switches"]["s2"], outside["network"]   # s2 in no policy: nothing of ours stays on it
    result, error = net.app.request(ev.SetPolicy, outside)
    assert error is None and result["in_sync"] is True
    assert net.ovsdb.qos["s2-eth4"] == FOREIGN and mode(net, "s2-eth1") is None and net.s2.table == {}
    net.app.poll()
    assert net.ovsdb.writes_to["s2-eth4"] == 0 and net.app.snapshot.in_sync[2]


# --- tc, and the polls, when something goes away for a while ---------------------------------------------

def test_an_htb_qdisc_gone_back_and_gone_again_is_looked_at_again_before_it_is_rebuilt(net):
    """Gone at one check and there at the next is OVS rebuilding it: a later absence starts the count afresh."""
    up(net)
    tc, news = net.app.tc, ev.TcChanged(frozenset({net.app.tc.ifindex("s1-eth1")}))
    writes = net.ovsdb.writes_to["s1-eth1"]
    tc.delete_root("s1-eth1")
    net.app.handle(news)
    net.app.settle()                                 # gone: looked at again at the next poll
    tc.gone.discard("s1-eth1")                       # OVS built it again meanwhile
    net.app.poll()                                   # there
    tc.delete_root("s1-eth1")
    net.app.handle(news)
    net.app.settle()                                 # gone again: for the first time since it was there
    assert net.ovsdb.writes_to["s1-eth1"] == writes and tc.classes("s1-eth1") == {}
    net.app.poll()                                   # still gone: rebuilt
    assert net.ovsdb.writes_to["s1-eth1"] > writes and set(tc.classes("s1-eth1")) == {"1:1", "1:2", "1:3", "1:4"}


def test_after_the_loop_stalls_each_switch_is_polled_once_and_keeps_its_phase(net, caplog):
    """A stalled event loop (a long batch, a paused process) leaves the polls due meanwhile late: each switch is
    polled once then, not once per missed interval, and its polls fall where they fell before, so that many
    switches' polls stay spread over the interval."""
    up(net)
    net.app.advance(0.5)
    s1, s2 = slow_polls(net.app, net.s1), slow_polls(net.app, net.s2)
    net.app.advance(3.0)
    before = {name: {round(t % 1.0, 6) for t in times} for name, times in (("s1", s1), ("s2", s2))}
    assert len(before["s1"]) == len(before["s2"]) == 1 and before["s1"] != before["s2"]
    s1.clear(), s2.clear()
    assert not [m for m in caplog.messages if "cannot be polled" in m]
    resumed = net.app.clock + 5.0
    net.app.clock = resumed                          # the loop stalls: no timer fires for 5 s
    net.app.advance(3.0)
    for name, times in (("s1", s1), ("s2", s2)):
        assert times[0] == resumed and len(times) == len(set(times)) <= 4, (name, times)   # the late poll, once
        assert {round(t % 1.0, 6) for t in times[1:]} == before[name], (name, times)
    assert len([m for m in caplog.messages if "cannot be polled" in m]) == 1     # the first switch at once
    net.app.clock += 5.0                             # and again
    net.app.advance(SAY_EVERY)
    late = [m for m in caplog.messages if "statistics cannot be polled every 1 s" in m]
    assert sorted(m.split(":")[0] for m in late) == ["switch 0000000000000001", "switch 0000000000000002"]  # once each


def test_switches_whose_polls_ran_late_together_are_said_in_one_line_the_first_at_once(caplog):
    """vswitchd answers every bridge of its host late while it reconfigures ports: 100 switches late within a
    second are two lines, the first switch at once and the others together, by the slowest."""
    late = LatePolls()
    late.add(1, (1.0, 0.05, 0.82), 100.0)
    for dp in range(2, 101):
        late.add(dp, (1.0, 0.01 * (dp % 7), 0.8 + dp / 1000), 100.0 + dp / 200)
    late.say(100.0 + SAY_EVERY - 0.01)
    assert caplog.messages == ["switch 0000000000000001: statistics cannot be polled every 1 s (the last poll was "
                               "0.05 s late and took 0.82 s); congestion is answered that much later"]
    late.say(100.0 + SAY_EVERY)
    late.say(100.0 + 3 * SAY_EVERY)                  # nothing more to say
    assert caplog.messages[1:] == ["switch 0000000000000064 and 98 more: statistics cannot be polled every 1 s (the "
                                   "last poll was 0.02 s late and took 0.90 s); congestion is answered that much later"]


def test_a_poll_answered_while_a_change_is_in_flight_is_no_drift(net):
    """What a switch said before our batch reached it is not someone else's change."""
    up(net, "police")
    net.s1.stalled = True
    for _ in range(10):                               # up to the poll that reads the whole table and the meters
        net.app.advance(1.0)
    net.app.begin(ev.SetPolicy, shipped("auto"))      # flows and meters change, behind that poll's requests
    net.s1.stalled = False
    net.app.settle()
    assert net.app.answers[0].result["in_sync"] is True and net.app.snapshot.drift_repairs() == {}


def test_a_tc_write_netlink_refused_is_done_at_a_poll_once_netlink_takes_it(net):
    net.app.tc.fail = {"replace_leaf": "Operation not permitted"}
    result = up(net)
    assert result["in_sync"] is False and mode(net) == "reserve"     # OVSDB took the queues; their leaves wait
    net.app.tc.fail = {}
    net.app.poll()
    assert {leaf.kind for leaf in net.app.tc.leaves("s1-eth1").values()} == {"pfifo_head_drop"}
    assert net.app.request(ev.GetStatus)[0]["switches"]["0000000000000001"]["in_sync"] is True


def test_a_port_ovsdb_no_longer_has_while_the_switch_still_lists_it_is_left_for_then(net):
    """A port being removed (or added): OVSDB and the switch disagree for a moment, and no job is tried for it."""
    up(net)
    net.ovsdb.bridges[1] = replace(net.ovsdb.bridges[1], ports={2: "s1-eth2", 3: "s1-eth3"})
    transactions = net.ovsdb.attempts
    net.app.handle(ev.TcChanged(None))              # anything that plans s1 again
    net.app.settle()
    s1 = net.app.request(ev.GetStatus)[0]["switches"]["0000000000000001"]
    assert net.ovsdb.attempts == transactions and s1["not_in_sync"] == {}


def test_a_port_the_policy_no_longer_lists_loses_our_queues(net):
    up(net)
    fewer = shipped("reserve")
    del fewer["switches"]["s1"]["ports"]             # s1 keeps its flows; port 1 is no longer the policy's
    result, error = net.app.request(ev.SetPolicy, fewer)
    assert error is None and result["in_sync"] and mode(net) is None and len(net.s1.table) == S1_FLOWS


def test_only_the_port_the_classes_are_steered_out_of_shows_as_programmed(net):
    """The metrics' `programmed` is the port the steering flows output to, not a port whose number a queue id shares:
    port 2 reserves too, and udp's queue is 2."""
    net.app.connect(net.s1)
    net.app.connect(net.s2)
    two = shipped("reserve")
    two["switches"]["s1"]["ports"][2] = {"capacity": "5Mbit", "queues": "reserve"}
    assert net.app.request(ev.SetPolicy, two)[1] is None
    assert net.app.snapshot.switches[1].programmed == {1: True, 2: False}


def test_an_echo_reply_changes_what_no_switch_holds_so_none_of_their_records_is_read_again(net, monkeypatch):
    """os-ken asks every switch for an echo (every 10 s, controller/qos.conf): read again for each, the records
    of 500 switches were 25,000 reads a second, near a third of the event loop's busy time in steady state."""
    from controller.core import held
    up(net)
    reads = []
    monkeypatch.setattr(held, "_holds", lambda sw: reads.append(sw.dp_id) or {})
    conn = next(iter(net.app.core.conns.switches))
    net.app.handle(ev.EchoReply(conn, 12345))
    assert reads == []
