"""Policing: a class's `police` becomes an OpenFlow meter on the switches that steer it (controller/core/
meters.py), sent in the flows' batch in the order the switch needs, read back, repaired, adopted after a
restart, refused where the switch has no meters, and its counters exported. The app runs against the fake
switch of tests/unit/fakes.py, whose meter table behaves as OVS's does (a flow naming a missing meter is
refused; deleting a meter deletes its flows)."""
import pytest

from controller.core import events as ev
from controller.core.meters import METER_BASE, MeterChanges, desired_meters, meter_changes, meter_id
from controller.core.policy import Police, load_document, parse_policy
from controller.core.poller import MONITORED_TABLE_POLLS, WHOLE_TABLE_POLLS
from controller.core.switch_state import SwitchState
from tests.unit.fakes import S1_FLOWS, shipped, up

UDP_METER = METER_BASE | 2       # the udp class has queue 2


# --- the pure part ---------------------------------------------------------------------------------

def test_a_policed_class_gets_a_meter_only_on_switches_that_steer_it():
    policy = parse_policy(load_document("policies/police.yaml"))
    assert desired_meters(policy, policy.switch(1)) == {UDP_METER: Police(500, 50)}
    assert desired_meters(policy, policy.switch(2)) == {}     # s2's flows carry no class


def test_the_classified_flows_of_a_policed_class_pass_its_meter_first():
    policy = parse_policy(load_document("policies/police.yaml"))
    flows = SwitchState(policy, policy.switch(1), userspace=True).flows(frozenset())
    metered = {f.match: f.actions for f in flows if f.actions[0][0] == "meter"}
    assert list(metered.values()) == [(("meter", UDP_METER), ("output", 1))]
    assert dict(next(iter(metered))).get("ip_proto") == 17


def test_meter_changes_add_modify_and_delete_only_what_differs():
    desired = {meter_id(1): Police(100, 10), meter_id(2): Police(200, 20)}
    actual = {meter_id(2): Police(300, 20), meter_id(3): Police(1, 1)}
    changes = meter_changes(desired, actual)
    assert changes == MeterChanges(add=((meter_id(1), Police(100, 10)),), modify=((meter_id(2), Police(200, 20)),),
                                   delete=(meter_id(3),))
    assert changes.applied_to(actual) == desired
    assert not meter_changes(desired, desired)


# --- the app ------------------------------------------------------------------------------------------

def band(dp, meter=UDP_METER) -> tuple[int, int]:
    (drop,) = dp.meters[meter].bands
    return drop.rate, drop.burst_size


def test_police_puts_the_meter_before_the_flows_that_use_it(net):
    assert up(net, "police") == {"applied": "police", "changed": True, "revision": 1, "in_sync": True}
    assert band(net.s1) == (500, 50) and net.s2.meters == {}
    assert sum(UDP_METER in net.s1.meters_of(e) for e in net.s1.table.values()) == 1
    assert not any(sw.openflow_errors for sw in net.app.snapshot.switches.values())
    assert net.ovsdb.qos["s1-eth1"].mode == "fifo"          # no queues: the meter alone


def test_a_changed_rate_modifies_the_meter_in_place_and_keeps_its_flow(net):
    up(net, "police")
    doc = shipped("police")
    doc["classes"]["udp"]["police"] = {"rate": "1Mbit"}
    result, _ = net.app.request(ev.SetPolicy, doc)
    assert result["in_sync"] and band(net.s1) == (1000, 100)
    assert [m.command for m in net.s1.meter_mods()] == [net.s1.ofproto.OFPMC_ADD, net.s1.ofproto.OFPMC_MODIFY]


def test_dropping_police_takes_the_meter_off_after_the_flows_stop_using_it(net):
    up(net, "police")
    flows = len(net.s1.table)
    result, _ = net.app.request(ev.SetPolicy, shipped("reserve"))
    assert result["in_sync"] and net.s1.meters == {}
    # Deleting a meter deletes every flow still naming it: had it gone first, the flows would be gone too.
    assert len(net.s1.table) == flows and not any(net.s1.meters_of(e) for e in net.s1.table.values())


def test_clearing_takes_our_meters_off_and_leaves_anothers(net):
    up(net, "police")
    other = net.s1.ofproto_parser.OFPMeterMod(net.s1, net.s1.ofproto.OFPMC_ADD, 0, 7, [])
    net.s1.meters[7] = other
    net.app.request(ev.ClearPolicy)
    assert net.s1.meters == {7: other} and net.s1.table == {}


def test_a_meter_deleted_by_hand_is_back_with_its_flow_after_the_next_poll(net):
    up(net, "police")
    flows = len(net.s1.table)
    net.s1.send_msg(net.s1.ofproto_parser.OFPMeterMod(net.s1, net.s1.ofproto.OFPMC_DELETE, 0, UDP_METER, []))
    net.s1.replies.clear()
    assert len(net.s1.table) == flows - 1
    net.app.poll()
    assert band(net.s1) == (500, 50) and len(net.s1.table) == flows
    assert net.app.snapshot.drift_repairs().get("meters") == 1 and not any(sw.openflow_errors for sw in net.app.snapshot.switches.values())


def test_a_restarted_controller_adopts_the_meter_and_sends_nothing(net, tmp_path):
    up(net, "police")
    net.app.exit()
    restarted = net.app.another()
    net.s1.sent.clear()
    restarted.connect(net.s1)
    restarted.connect(net.s2)
    restarted.poll()
    assert net.s1.meter_mods() == [] and net.s1.flow_mods() == []
    assert restarted.request(ev.GetStatus)[0]["switches"]["0000000000000001"]["in_sync"] is True


def test_a_meter_already_there_when_added_is_adopted_not_an_error(net):
    net.app.connect(net.s1)
    net.app.connect(net.s2)
    # Made after the controller read the meters (another run of ours, say), with another rate.
    parser, ofp = net.s1.ofproto_parser, net.s1.ofproto
    net.s1.meters[UDP_METER] = parser.OFPMeterMod(net.s1, ofp.OFPMC_ADD, ofp.OFPMF_KBPS | ofp.OFPMF_BURST | ofp.OFPMF_STATS,
                                                  UDP_METER, [parser.OFPMeterBandDrop(rate=9, burst_size=9)])
    result, error = net.app.request(ev.SetPolicy, shipped("police"))
    assert error is None and result["in_sync"]
    assert band(net.s1) == (500, 50)                       # read back, then modified to the policy's
    assert not any(sw.openflow_errors for sw in net.app.snapshot.switches.values())
    assert "meters" not in net.app.snapshot.drift_repairs()   # ours, adopted: no one else's change
    assert "flows" not in net.app.switches[1].errors()


def test_a_switch_without_meters_refuses_a_policing_policy_by_name(net):
    net.s1.max_meter = 0
    net.app.connect(net.s1)
    net.app.connect(net.s2)
    _, error = net.app.request(ev.SetPolicy, shipped("police"))
    assert str(error).startswith("classes.udp.police: switch s1 (bridge br1) cannot police, the switch has no "
                                 "OpenFlow meters; remove police")
    assert net.s1.table == {} and net.s1.meters == {}
    assert up_reserve_is_fine(net)


def up_reserve_is_fine(net) -> bool:
    result, error = net.app.request(ev.SetPolicy, shipped("reserve"))
    return error is None and result["in_sync"]


def test_meter_counters_reach_the_metrics_with_their_class(net):
    up(net, "police")
    net.s1.meter_traffic[UDP_METER] = (1000, 1_400_000, 600)
    net.app.poll()
    assert net.app.snapshot.switches[1].meters == {(UDP_METER, "udp"): (1000, 1_400_000, 600)}
    net.app.disconnect(net.s1)
    assert 1 not in net.app.snapshot.switches


@pytest.mark.parametrize("monitors, polls", [(False, WHOLE_TABLE_POLLS), (True, MONITORED_TABLE_POLLS)])
def test_a_meter_changed_in_place_by_hand_is_put_back_at_the_whole_tables_read(net, monitors, polls):
    """Its id stays, so the meter statistics show nothing, nor does a flow monitor: the meters' configuration is
    read with the whole table, every ten polls (or sixty, of a switch whose flow monitor says the rest)."""
    net.s1.monitors = monitors
    up(net, "police")
    parser, ofp = net.s1.ofproto_parser, net.s1.ofproto
    net.s1.meters[UDP_METER] = parser.OFPMeterMod(net.s1, ofp.OFPMC_ADD, ofp.OFPMF_KBPS | ofp.OFPMF_BURST | ofp.OFPMF_STATS,
                                                  UDP_METER, [parser.OFPMeterBandDrop(rate=9, burst_size=9)])
    for _ in range(polls):
        net.app.poll()
    assert band(net.s1) == (500, 50) and net.app.snapshot.drift_repairs().get("meters") == 1


def test_a_change_of_flows_alone_sends_no_meter_mod(net):
    """auto's counting meters stay as they are while a flow beside them changes."""
    up(net, "auto")
    mods = len(net.s1.meter_mods())
    doc = shipped("auto")
    doc["switches"]["s1"]["flows"][0]["priority"] = 1001
    result, error = net.app.request(ev.SetPolicy, doc)
    assert error is None and result["in_sync"] and len(net.s1.meter_mods()) == mods


def test_a_switch_without_meters_that_joins_a_policing_policy_is_left_as_it_is_and_says_why(net):
    """Its flows would name meters it cannot hold: nothing is written to it until the policy polices no more."""
    net.app.connect(net.s2)
    assert net.app.request(ev.SetPolicy, shipped("police"))[1] is None
    net.s1.max_meter = 0
    net.app.connect(net.s1)
    net.app.poll()
    s1 = net.app.request(ev.GetStatus)[0]["switches"]["0000000000000001"]
    assert s1["in_sync"] is False and net.s1.table == {} and net.s1.meter_mods() == []
    assert s1["not_in_sync"] == {"meters": "the switch has no OpenFlow meters: nothing of the policy is written to it, "
                                           "whose flows police; remove police from their classes or run the bridge on "
                                           "a datapath with meters"}
    result, error = net.app.request(ev.SetPolicy, shipped("reserve"))
    assert error is None and result["in_sync"] and len(net.s1.table) == S1_FLOWS
