"""controller/core/flows.py, queues.py and switch_state.py with the shipped policies: what a switch should hold."""
from pathlib import Path

import pytest

from controller.core.competition import class_contention, served_first
from controller.core.flows import COOKIE, COOKIE_MASK, desired_flows
from controller.core.policy import load_document, parse_policy
from controller.core.queues import QosSpec, QueueSpec, desired_qos, fifo_qos, leaf_spec, reserve_qos
from controller.core.stats import PortRates
from controller.core.switch_state import SwitchState

POLICIES = Path(__file__).resolve().parents[2] / "policies"
NONE, RESERVE, AUTO = (parse_policy(load_document(POLICIES / f"{name}.yaml")) for name in ("none", "reserve", "auto"))
CAPACITY = 5_000_000
UDP_RULE, TCP_RULE = 2, 3      # indexes of s1's classified flows in the shipped policies


def s1(policy):
    return policy.switch(1)


def actions(state_or_entries, index):
    entries = state_or_entries.flows(state_or_entries.reserving) if isinstance(state_or_entries, SwitchState) else state_or_entries
    return entries[index].actions


def rates(tx_bps: float, tx_pps: float, tx_drops_ps: float = 0.0, interval: float = 1.0) -> PortRates:
    return PortRates(rx_bps=0.0, tx_bps=tx_bps, rx_pps=0.0, tx_pps=tx_pps, rx_drops_ps=0.0,
                     tx_drops_ps=tx_drops_ps, rx_errors_ps=0.0, tx_errors_ps=0.0, interval=interval)


FULL = rates(5e6, 420)                           # the port sends at its capacity, no drops
CONTENTION = {"tcp": 2.7e6, "udp": 2.3e6}        # TCP well short of its 4 Mbit/s reservation
CALM = rates(1e6, 90)


# --- flows ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("userspace", [False, True], ids=["kernel", "userspace"])
def test_none_steers_nothing_into_a_queue(userspace):
    for switch in NONE.switches:
        state = SwitchState(NONE, switch, userspace=userspace)
        for entry in state.flows(state.reserving):
            assert [a[0] for a in entry.actions] == ["output"] * len(entry.actions)


def test_reserve_on_the_userspace_datapath_marks_dscp_then_queues_then_outputs():
    state = SwitchState(RESERVE, s1(RESERVE), userspace=True)
    assert actions(state, UDP_RULE) == (("set_field", "ip_dscp", 2), ("set_queue", 2), ("output", 1))
    assert actions(state, TCP_RULE) == (("set_field", "ip_dscp", 1), ("set_queue", 1), ("output", 1))


def test_reserve_on_the_kernel_datapath_only_queues_then_outputs():
    state = SwitchState(RESERVE, s1(RESERVE), userspace=False)
    assert actions(state, UDP_RULE) == (("set_queue", 2), ("output", 1))
    assert actions(state, TCP_RULE) == (("set_queue", 1), ("output", 1))


def test_the_mark_is_the_class_dscp_and_the_queue_its_queue_id():
    doc = load_document(POLICIES / "reserve.yaml")
    doc["classes"]["tcp"]["dscp"] = 10
    doc["classes"]["udp"]["dscp"] = 46
    policy = parse_policy(doc)
    state = SwitchState(policy, s1(policy), userspace=True)
    assert actions(state, UDP_RULE) == (("set_field", "ip_dscp", 46), ("set_queue", 2), ("output", 1))
    assert actions(state, TCP_RULE) == (("set_field", "ip_dscp", 10), ("set_queue", 1), ("output", 1))


def test_reserve_leaves_unclassified_flows_and_the_other_switch_alone():
    state = SwitchState(RESERVE, s1(RESERVE), userspace=True)
    assert actions(state, 0) == (("output", 1),)
    assert actions(state, 1) == (("output", 3),)
    s2 = SwitchState(RESERVE, RESERVE.switch(2), userspace=True)
    assert [e.actions for e in s2.flows(s2.reserving)] == [(("output", 4),), (("output", 1),), (("output", 4),), (("output", 4),),
                                                          (("output", 1),), (("output", 3),)]


def test_flow_entries_keep_the_policy_priority_and_match():
    entries = desired_flows(RESERVE, s1(RESERVE), frozenset({1}), mark_dscp=False)
    assert [e.priority for e in entries] == [1000, 1000, 40000, 40000, 1000, 2000, 50000]
    assert dict(entries[UDP_RULE].match) == {"in_port": 3, "eth_type": 0x0800, "ip_proto": 17}


def test_a_classified_flow_to_a_port_that_is_not_reserving_is_not_steered():
    entries = desired_flows(RESERVE, s1(RESERVE), frozenset({2}), mark_dscp=True)
    assert actions(entries, UDP_RULE) == (("output", 1),)


@pytest.mark.parametrize("policy", [NONE, RESERVE, AUTO], ids=lambda p: p.name)
def test_cookies_carry_the_controller_mark_and_number_the_rules(policy):
    for switch in policy.switches:
        cookies = [e.cookie for e in desired_flows(policy, switch, frozenset({1}), mark_dscp=True)]
        assert all(c & COOKIE_MASK == COOKIE for c in cookies)
        low = [c & ~COOKIE_MASK for c in cookies]
        assert len(set(low)) == len(low) == len(switch.flows)
        assert 0 not in low


def test_rule_class_maps_a_cookie_back_to_port_and_class():
    state = SwitchState(RESERVE, s1(RESERVE), userspace=False)
    cookies = [e.cookie for e in state.flows(state.reserving)]
    assert state.rule_class(cookies[UDP_RULE]) == (1, "udp")
    assert state.rule_class(cookies[TCP_RULE]) == (1, "tcp")
    assert state.rule_class(cookies[0]) is None         # ours, but unclassified


@pytest.mark.parametrize("cookie", [0, 0x1234, 0x4242_0000_0000_0003, COOKIE, COOKIE | 5, COOKIE | 0xFFFF],
                         ids=["zero", "foreign-low", "foreign-high", "mark-only", "past-the-rules", "far"])
def test_rule_class_is_none_for_a_cookie_that_is_not_one_of_our_rules(cookie):
    state = SwitchState(RESERVE, s1(RESERVE), userspace=False)
    assert state.rule_class(cookie) is None


# --- queues -----------------------------------------------------------------------------------------

def test_fifo_is_one_queue_at_the_port_capacity():
    port = s1(NONE).port(1)
    assert fifo_qos(port, userspace=False) == QosSpec("fifo", CAPACITY, (QueueSpec(0, CAPACITY, CAPACITY, "default"),),
                                                      (), ("pfifo", "limit", "1000"))


def test_reserve_has_the_default_queue_and_one_queue_per_class():
    spec = reserve_qos(RESERVE, s1(RESERVE).port(1), userspace=False)
    assert spec.mode == "reserve"
    assert spec.max_bps == CAPACITY
    by_class = {q.traffic_class: q for q in spec.queues}
    assert [q.queue_id for q in spec.queues] == [0, 1, 2, 3]               # in queue order, as OVSDB reads back
    assert by_class["tcp"] == QueueSpec(1, 4_000_000, 5_000_000, "tcp", priority=1)   # min 80 % of capacity
    assert by_class["udp"] == QueueSpec(2, 500_000, 5_000_000, "udp", priority=2)
    assert by_class["voice"] == QueueSpec(3, 250_000, 500_000, "voice", priority=0)   # served first
    assert by_class["default"].queue_id == 0
    assert by_class["default"].max_bps == CAPACITY
    assert spec.marks == ((1, 1), (2, 2), (3, 3))


def test_the_default_queue_keeps_exactly_what_the_classes_do_not_reserve():
    spec = reserve_qos(RESERVE, s1(RESERVE).port(1), userspace=False)
    assert spec.queues[0].min_bps == 250_000
    assert sum(q.min_bps for q in spec.queues) == CAPACITY


def test_reserve_honours_max_shares_and_keeps_one_percent_for_the_default_queue():
    doc = load_document(POLICIES / "reserve.yaml")
    doc["classes"] = {"tcp": {"queue": 1, "min": "60%", "max": "70%", "dscp": 10},
                      "udp": {"queue": 2, "min": "40%", "max": "50%", "dscp": 46}}
    del doc["switches"]["s1"]["flows"][6]          # the voice flow: no voice class here
    del doc["network"]["classify"][2]
    policy = parse_policy(doc)
    spec = reserve_qos(policy, policy.switch(1).port(1), userspace=False)
    assert [(q.queue_id, q.min_bps, q.max_bps) for q in spec.queues] == [
        (0, 50_000, 5_000_000), (1, 3_000_000, 3_500_000), (2, 2_000_000, 2_500_000)]
    assert spec.marks == ((10, 1), (46, 2))


def test_desired_qos_chooses_by_reservation():
    port = s1(AUTO).port(1)
    assert desired_qos(AUTO, port, reserving=False, userspace=False).mode == "fifo"
    assert desired_qos(AUTO, port, reserving=True, userspace=False).mode == "reserve"


def _port(**fields):
    doc = load_document(POLICIES / "reserve.yaml")
    doc["switches"]["s1"]["ports"][1].update(fields)
    return parse_policy(doc).switch(1).port(1)


def test_a_fifo_queue_drops_from_the_head_on_the_userspace_datapath_only():
    # A tail drop there makes OVS abandon the rest of its send batch (controller/core/queues.py).
    port = _port(queue_packets=25)
    assert leaf_spec(port, userspace=True) == ("pfifo_head_drop", "limit", "25")
    assert leaf_spec(port, userspace=False) == ("pfifo", "limit", "25")
    assert reserve_qos(RESERVE, port, userspace=True).leaf == ("pfifo_head_drop", "limit", "25")


@pytest.mark.parametrize("discipline, expected", [
    ("sfq", ("sfq", "limit", "100", "perturb", "10")),
    ("codel", ("codel", "limit", "100")),
    ("fq_codel", ("fq_codel", "limit", "100")),
    ("red", ("red", "limit", "151400", "min", "12616", "max", "37850", "avpkt", "1000", "burst", "22",
             "bandwidth", "5000000bit")),
])
def test_a_port_discipline_becomes_every_class_queue(discipline, expected):
    port = _port(queue_packets=100, discipline=discipline)
    assert leaf_spec(port, userspace=True) == leaf_spec(port, userspace=False) == expected


# --- congestion drives the auto policy ----------------------------------------------------------------

def test_auto_starts_like_none_with_its_classes_ready_and_nothing_steered_into_them():
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    assert state.reserving == frozenset()
    assert state.qos(state.reserving)[1].mode == "reserve"          # pre-provisioned: reacting rebuilds no qdisc
    assert actions(state, UDP_RULE) == (("output", 1),)             # ... but every packet shares queue 0
    assert not state.congested(1)


def test_contention_programs_the_reservation_and_calm_rolls_it_back():
    state = SwitchState(AUTO, s1(AUTO), userspace=True)
    assert state.observe(1, FULL, 0.0, CONTENTION, now=9.95) is None   # auto takes two hot samples
    decision = state.observe(1, FULL, 0.0, CONTENTION, now=10.0)
    assert decision is not None
    assert (decision.action, decision.at) == ("program", 10.0)
    assert "class tcp at 2.7 Mbit/s" in decision.reason
    assert state.congested(1)
    assert state.reserving == frozenset({1})
    assert actions(state, UDP_RULE) == (("set_field", "ip_dscp", 2), ("set_queue", 2), ("output", 1))
    assert actions(state, TCP_RULE) == (("set_field", "ip_dscp", 1), ("set_queue", 1), ("output", 1))
    assert state.qos(state.reserving)[1].mode == "reserve"

    # hold_seconds is 3: calm from t=11 rolls back at t=14, not before
    calm = {"tcp": 1e6}
    assert [state.observe(1, CALM, 0.0, calm, now=t) for t in (11.0, 12.0, 13.0)] == [None, None, None]
    assert state.qos(state.reserving)[1].mode == "reserve"
    decision = state.observe(1, CALM, 0.0, calm, now=14.0)
    assert decision is not None
    assert (decision.action, decision.at) == ("rollback", 14.0)
    assert "calm for 3 s" in decision.reason
    assert not state.congested(1)
    assert state.reserving == frozenset()
    assert actions(state, UDP_RULE) == (("output", 1),)
    assert state.qos(state.reserving)[1].mode == "reserve"           # the classes stay, unused


def test_a_hot_sample_during_the_hold_restarts_it():
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    assert state.observe(1, FULL, 0.0, CONTENTION, now=-0.05) is None
    assert state.observe(1, FULL, 0.0, CONTENTION, now=0.0).action == "program"
    assert state.observe(1, CALM, 0.0, {}, now=1.0) is None
    assert state.observe(1, CALM, 0.0, {}, now=2.0) is None
    assert state.observe(1, FULL, 0.0, CONTENTION, now=3.0) is None      # still congested: no new program
    assert state.observe(1, CALM, 0.0, {}, now=4.0) is None              # 4.0 - 1.0 would be 3 s
    assert state.reserving == frozenset({1})
    assert state.observe(1, CALM, 0.0, {}, now=7.0).action == "rollback"


@pytest.mark.parametrize("policy, mode", [(RESERVE, "reserve"), (NONE, "fifo")], ids=["reserve", "none"])
def test_ports_that_are_not_auto_never_change_but_report_congestion(policy, mode):
    state = SwitchState(policy, s1(policy), userspace=False)
    hot = [state.observe(1, FULL, 0.0, CONTENTION, now=t) for t in (0.0, 1.0, 2.0)]
    assert hot == [None, None, None]
    assert state.congested(1)              # the default config takes 2 hot samples
    assert state.qos(state.reserving)[1].mode == mode
    calm = [state.observe(1, CALM, 0.0, {}, now=t) for t in (3.0, 4.0, 5.0, 6.0, 7.0)]
    assert calm == [None] * 5
    assert not state.congested(1)
    assert state.qos(state.reserving)[1].mode == mode


def test_a_port_without_tx_counters_or_outside_the_policy_decides_nothing():
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    no_tx = PortRates(None, None, None, None, None, None, None, None, interval=1.0)
    assert state.observe(1, no_tx, 0.0, CONTENTION, now=0.0) is None
    assert state.observe(2, FULL, 0.0, CONTENTION, now=0.0) is None
    assert not state.congested(1) and not state.congested(2)


def test_queue_drops_count_as_loss_when_classes_compete():
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    # TCP gets its reservation, UDP is active: no contention, but 5 % of the packets are dropped
    state.observe(1, rates(5e6, 400), 21.0, {"tcp": 4.2e6, "udp": 0.8e6}, now=0.0)
    decision = state.observe(1, rates(5e6, 400), 21.0, {"tcp": 4.2e6, "udp": 0.8e6}, now=0.05)
    assert decision is not None and decision.action == "program"
    assert "loss ≥ 1.0%" in decision.reason


def test_a_lone_class_losing_packets_does_not_program():
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    lossy = rates(5e6, 400, tx_drops_ps=21.0)     # 5 % loss at full utilisation
    for t in range(5):
        assert state.observe(1, lossy, 0.0, {"udp": 5e6}, now=float(t)) is None
    assert not state.congested(1)
    assert state.reserving == frozenset()


def test_port_drops_without_class_rates_count_as_competing():
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    state.observe(1, rates(5e6, 400, tx_drops_ps=21.0), 0.0, {}, now=0.0)
    decision = state.observe(1, rates(5e6, 400, tx_drops_ps=21.0), 0.0, {}, now=0.05)
    assert decision is not None and decision.action == "program"


# A voice call (about 0.09 Mbit/s, under ACTIVE_SHARE) behind one bulk TCP flow at the port's capacity, polled
# fast (every 0.05 s): 420 packets/s sent, `loss` of what is offered dropped, spread evenly over the polls.
CALL = {"voice": 0.09e6, "tcp": 4.9e6}


def _fast(loss: float) -> PortRates:
    return rates(5e6, 420, tx_drops_ps=420 * loss / (1 - loss), interval=0.05)


def test_a_call_served_first_that_loses_behind_a_bulk_flow_programs_its_reservation_and_keeps_it():
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    # A whole second seen (20 polls), then two hot samples.
    decisions = [state.observe(1, _fast(0.03), 0.0, CALL, now=t / 20) for t in range(30)]
    assert [(t, d.action) for t, d in enumerate(decisions) if d] == [(20, "program")]
    assert "class voice shares a port that lost 3.0% of its packets over 1 s behind tcp" in decisions[20].reason
    # Reserving, the call waits no more, but the flow beside it loses as much: the port stays reserved.
    assert [state.observe(1, _fast(0.03), 0.0, CALL, now=1.5 + t / 20) for t in range(100)] == [None] * 100
    assert state.reserving == {1}


@pytest.mark.parametrize("loss", [0.008, 0.0])
def test_a_call_behind_a_bulk_flow_that_loses_little_programs_nothing(loss):
    # A lone TCP flow loses under 1 % at a drop-tail queue it fills: the call beside it loses about as much.
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    assert [state.observe(1, _fast(loss), 0.0, CALL, now=t / 20) for t in range(100)] == [None] * 100


def test_one_poll_of_a_bulk_flows_burst_of_loss_programs_nothing_for_the_call():
    # 6 % lost in one 0.05 s poll and none in the rest of the second: 0.3 % over the window.
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    samples = [_fast(0.06) if t % 20 == 0 else _fast(0.0) for t in range(60)]
    assert [state.observe(1, sample, 0.0, CALL, now=t / 20) for t, sample in enumerate(samples)] == [None] * 60


def test_a_lossy_port_with_no_call_or_no_bulk_flow_beside_it_programs_nothing():
    for class_bps in ({"tcp": 4.9e6}, {"voice": 0.09e6}, {"voice": 0.09e6, "tcp": 0.1e6}):
        state = SwitchState(AUTO, s1(AUTO), userspace=False)
        assert [state.observe(1, _fast(0.05), 0.0, class_bps, now=t / 20) for t in range(40)] == [None] * 40


def test_the_call_reservation_rolls_back_the_hold_time_after_a_second_without_its_loss():
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    assert [state.observe(1, _fast(0.03), 0.0, CALL, now=t / 20) for t in range(21)][20].action == "program"
    # From 1.05 s on nothing is lost: the second's loss is under 1 % once under a third of it lost 3 %
    # (about 0.7 s on), and the port is calm from then: it rolls back 3 s later.
    after = [state.observe(1, _fast(0.0), 0.0, CALL, now=1.05 + t / 20) for t in range(100)]
    assert [(round(1.05 + t / 20, 2), d.action) for t, d in enumerate(after) if d] == [(4.7, "rollback")]


def test_the_call_reservation_rolls_back_once_the_call_has_ended():
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    assert [state.observe(1, _fast(0.03), 0.0, CALL, now=t / 20) for t in range(21)][20].action == "program"
    ended = [state.observe(1, _fast(0.03), 0.0, {"tcp": 4.9e6}, now=1.5 + t / 20) for t in range(70)]
    assert [d.action for d in ended if d] == ["rollback"] and state.reserving == frozenset()


def test_served_first_is_the_classes_of_the_lowest_priority_unless_every_class_has_it():
    assert served_first(AUTO) == {"voice"}
    doc = load_document(POLICIES / "auto.yaml")
    even = parse_policy({**doc, "classes": {name: {**spec, "priority": 1} for name, spec in doc["classes"].items()}})
    assert served_first(even) == frozenset()


# --- contention wording -----------------------------------------------------------------------------

def test_a_deferred_program_answered_by_a_move_leaves_the_port_at_rest_and_two_hot_samples_decide_again():
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    assert state.observe(1, FULL, 0.0, CONTENTION, now=0.0, defer=True) is None
    decision = state.observe(1, FULL, 0.0, CONTENTION, now=0.05, defer=True)
    assert decision is not None and decision.action == "program" and state.reserving == frozenset()
    state.relieved(1, moved=True)       # traffic moved off the port: no reservation, and nothing pending
    assert (state.congested(1), state.resting(1), state.reserving) == (False, True, frozenset())
    assert state.observe(1, FULL, 0.0, CONTENTION, now=0.1, defer=True) is None
    again = state.observe(1, FULL, 0.0, CONTENTION, now=0.15, defer=True)
    assert again is not None and again.action == "program"


def test_a_starved_class_still_competes_on_a_port_of_few_large_packets():
    # Jumbo frames: 5 Mbit/s is 70 packets/s. TCP silenced by a flood that loses 10 % still competes.
    state = SwitchState(AUTO, s1(AUTO), userspace=False)
    assert state.observe(1, rates(5e6, 70), 0.0, {"tcp": 4e6, "udp": 1e6}, now=0.0) is None
    flood = rates(5e6, 70, tx_drops_ps=8.0)
    assert state.observe(1, flood, 0.0, {"tcp": 0.0, "udp": 5e6}, now=0.05) is None
    decision = state.observe(1, flood, 0.0, {"tcp": 0.0, "udp": 5e6}, now=0.1)
    assert decision is not None and decision.action == "program"


def test_a_class_just_above_the_active_share_is_squeezed_and_one_below_it_is_idle():
    # 5 % of 5 Mbit/s is 0.25 Mbit/s: TCP at 0.3 competes (short of its 4 Mbit/s), at 0.2 it is idle.
    assert class_contention(AUTO, s1(AUTO).port(1), {"tcp": 0.3e6, "udp": 4.7e6}) is not None
    assert class_contention(AUTO, s1(AUTO).port(1), {"tcp": 0.2e6, "udp": 4.8e6}) is None


def test_class_contention_names_both_classes_and_their_rates():
    message = class_contention(AUTO, s1(AUTO).port(1), CONTENTION)
    assert message == "class tcp at 2.7 Mbit/s < 95% of its 4 Mbit/s while udp takes 2.3 Mbit/s"


@pytest.mark.parametrize("class_bps", [
    {"tcp": 4.0e6, "udp": 1.0e6},     # TCP has its reservation
    {"tcp": 3.85e6, "udp": 1.15e6},   # TCP within auto's 5 % shortfall of its 4 Mbit/s
    {"tcp": 10e3, "udp": 4.9e6},      # TCP idle (below 5 % of the port): nothing to protect
    {"tcp": 3.0e6, "udp": 0.4e6},     # TCP short, but UDP within its own reservation
    {"udp": 5e6},                     # TCP absent
    {},
], ids=["tcp-has-its-share", "tcp-within-shortfall", "tcp-idle", "udp-within-its-own", "tcp-absent", "no-classes"])
def test_no_contention_when_no_active_class_is_squeezed_by_another(class_bps):
    assert class_contention(AUTO, s1(AUTO).port(1), class_bps) is None
