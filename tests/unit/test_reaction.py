"""auto at the speed of the queue (controller/core/switch.py, switch_state.py, meters.py): an `auto` port
carries its reservation's classes from the start, its classified flows pass counting meters (read
fresh where flow counters lag), and while it carries half its capacity or more it is polled every
fast_poll_interval. A flood onset there is answered within two fast polls, by one flow batch; a lone
flow's loss (BBR's start-up), a one-poll blip or an idle port program nothing and cost nothing."""
import pytest

from controller.core import actions as act
from controller.core import events as ev
from controller.core.meters import COUNTING_BAND, METER_BASE, counting_meter_id
from controller.core.poller import POLL_SLACK
from tests.unit.fakes import CAPACITY, TCP, UDP, VOICE, mode, shipped, up  # noqa: E402   rules 3, 2 and 6 of s1


def lone_tcp(net, drops_ps: float = 0.0) -> None:
    net.s1.load, net.s1.class_load = {1: CAPACITY}, {TCP: 0.96 * CAPACITY}
    net.s1.drop_load = {(1, 0): drops_ps} if drops_ps else {}


def udp_flood(net, udp_bps: float) -> None:
    """TCP squeezed by UDP in the shared FIFO, which drops what exceeds the port."""
    net.s1.load = {1: CAPACITY}
    net.s1.class_load = {TCP: 2.5e6, UDP: udp_bps}
    net.s1.drop_load = {(1, 0): (2.5e6 + udp_bps - CAPACITY) / 8 / 1500}


def fast_requests(net) -> int:
    return sum(type(m).__name__ == "OFPPortStatsRequest" and m.port_no != net.s1.ofproto.OFPP_ANY
               for m in net.s1.sent)


def test_auto_classes_are_ready_and_its_classified_flows_pass_counting_meters(net):
    up(net, "auto")
    assert mode(net) == "reserve" and net.s1.steering() == set()
    band = (COUNTING_BAND.rate_kbps, COUNTING_BAND.burst_kbits)
    assert {m: (d.bands[0].rate, d.bands[0].burst_size) for m, d in net.s1.meters.items()} == {
        counting_meter_id(2): band, counting_meter_id(3): band, counting_meter_id(6): band}
    metered = {e.cookie: net.s1.meters_of(e) for e in net.s1.table.values() if net.s1.meters_of(e)}
    assert metered == {UDP: {counting_meter_id(2)}, TCP: {counting_meter_id(3)}, VOICE: {counting_meter_id(6)}}
    assert net.s2.meters == {}                     # no auto port there
    up_reserve = net.app.request(ev.SetPolicy, shipped("reserve"))
    assert up_reserve[0]["in_sync"] and net.s1.meters == {}     # nor on a port that always reserves


def test_a_flood_onset_beside_a_lone_flow_is_answered_within_two_fast_polls(net):
    up(net, "auto")
    lone_tcp(net, drops_ps=1.2)                    # cubic alone: a drop now and then
    net.app.advance(5.0)
    assert net.app.decisions.last == deque_of() and net.app.switches[1].poller.watched == {1}
    onset = net.app.clock + 0.013                  # any phase against the polls
    net.app.advance(0.013)
    udp_flood(net, 8e6)
    net.app.advance(0.5)
    (decision,) = net.app.decisions.last
    # The flood and TCP offer over 1.2 times the port: the first fast poll after the onset decides.
    assert decision["action"] == "program" and decision["time"] - onset <= 0.06, decision["time"] - onset
    assert "overload" in decision["reason"] and net.s1.steering() == {TCP, UDP, VOICE}


@pytest.mark.parametrize("max_meter", [1000, 0])   # its classes' rates from counting meters, or from flows
def test_a_lone_flow_losing_packets_at_capacity_programs_nothing(net, max_meter):
    """An idle class's rate is 0, not a bit/s more: a class served first (voice) sending anything at a port that
    loses packets would be answered."""
    net.s1.max_meter = max_meter
    up(net, "auto")
    lone_tcp(net, drops_ps=200.0)                  # BBR's start-up overshoot, and worse, for 10 s
    net.app.advance(10.0)
    assert list(net.app.decisions.last) == [] and net.s1.steering() == set()


def test_a_blip_programs_nothing(net):
    """Three full-size UDP packets and three drops within one fast poll's window: one hot sample, not two."""
    up(net, "auto")
    lone_tcp(net)
    net.app.advance(3.0)
    net.app.advance(net.app.switches[1].poller.next_fast - net.app.clock + 0.01)   # just after a fast poll
    net.s1.class_load = {TCP: 0.96 * CAPACITY, UDP: 3 * 1500 * 8 / 0.01}
    net.s1.drop_load = {(1, 0): 300.0}
    net.app.advance(0.01)
    lone_tcp(net)
    net.app.advance(3.0)
    assert list(net.app.decisions.last) == []


def test_a_blip_across_a_slow_poll_programs_nothing(net):
    """A port fast polls watch is judged by their samples alone: a slow poll that reads it in the middle
    of a blip splits the blip's counters but is not a second hot sample (it would halve the time a burst
    must last to program). Fast polls every 70 ms, so slow ones fall at another phase each second."""
    net.app.connect(net.s1)
    net.app.connect(net.s2)
    policy = shipped("auto")
    policy["congestion"]["fast_poll_interval"] = 0.07
    assert net.app.request(ev.SetPolicy, policy)[1] is None
    lone_tcp(net, drops_ps=1.2)                    # cubic alone: a drop now and then
    net.app.advance(3.0)
    poller = net.app.switches[1].poller

    def slow_fires() -> float:                    # the slow poll's timer, late by up to its slack
        return next(at for at, _, e in net.app.timers if isinstance(e, ev.PollDue) and not e.fast)

    while poller.next_fast is None or not poller.next_fast + 0.01 < slow_fires() < poller.next_fast + 0.06:
        net.app.advance(0.001)                     # until a slow poll comes 10-60 ms after the next fast one
    net.app.advance(poller.next_fast - net.app.clock + 0.001)       # just after that fast poll
    slow = slow_fires()
    net.s1.class_load = {TCP: 0.96 * CAPACITY, UDP: 3 * 1500 * 8 / 0.07}    # three packets between the fast polls
    net.s1.drop_load = {(1, 0): 300.0}
    net.app.advance(slow - net.app.clock + 0.001)  # the slow poll reads the blip's first part ...
    assert slow_fires() > slow and poller.next_fast > net.app.clock
    net.app.advance(poller.next_fast - net.app.clock - 0.001)       # ... the next fast poll its end
    lone_tcp(net, drops_ps=1.2)
    net.app.advance(3.0)
    assert list(net.app.decisions.last) == []


def test_an_idle_auto_port_is_not_fast_polled(net):
    up(net, "auto")
    net.app.advance(10.0)
    assert fast_requests(net) == 0 and net.app.switches[1].poller.watched == frozenset()
    lone_tcp(net)
    net.app.advance(3.0)
    assert fast_requests(net) >= 20                # 20 a second once it carries half its capacity or more


def test_the_flood_ending_rolls_back_after_the_hold_by_steering_out(net):
    up(net, "auto")
    lone_tcp(net)
    net.app.advance(3.0)
    udp_flood(net, 8e6)
    net.app.advance(2.0)
    lone_tcp(net, drops_ps=1.2)                    # TCP alone again: no classes compete
    net.app.advance(2.9)                           # the hold is 3 s
    assert [d["action"] for d in net.app.decisions.last] == ["program"]
    net.app.advance(2.0)                           # (UDP counts as competing for a second after it stopped)
    assert [d["action"] for d in net.app.decisions.last] == ["program", "rollback"]
    assert net.s1.steering() == set() and mode(net) == "reserve"


def deque_of(*items):
    from collections import deque
    return deque(items)


def test_counting_meters_are_ours_and_told_from_policing_ones():
    from controller.core.meters import counted_rule, is_ours, meter_id
    assert is_ours(counting_meter_id(0)) and counting_meter_id(0) == METER_BASE | 0x8001
    assert counted_rule(counting_meter_id(41)) == 41 and counted_rule(meter_id(2)) is None
    assert act.StatsRequest(1, act.PORTS, 1).port == 1


def test_a_flood_that_silences_tcp_at_once_is_still_answered(net):
    """10 Mbit/s into a 25-packet FIFO can stop a TCP sender within one fast poll (retransmission
    timeouts): the class that was active a moment ago, while the port drops packets, is starved, not idle."""
    up(net, "auto")
    lone_tcp(net)
    net.app.advance(3.0)
    onset = net.app.clock
    net.s1.class_load = {UDP: 10e6}                 # TCP offers nothing any more
    net.s1.drop_load = {(1, 0): (10e6 - CAPACITY) / 8 / 1500}
    net.app.advance(0.5)
    (decision,) = net.app.decisions.last
    assert decision["action"] == "program" and decision["time"] - onset <= 0.15


def test_a_port_at_half_its_capacity_is_fast_polled_so_a_flood_just_after_a_slow_poll_is_answered_at_once(net):
    """Fast polls start at clear_utilisation (half the port), below the hot threshold: a flood that starts just
    after a slow poll of a port already busy is answered within two fast polls, not a slow poll later."""
    up(net, "auto")
    net.s1.load, net.s1.class_load = {1: 0.6 * CAPACITY}, {TCP: 0.6 * CAPACITY}
    net.app.advance(3.0)
    fast = fast_requests(net)
    net.app.advance(1.0)
    assert fast_requests(net) - fast >= 10         # every 50 ms, not every second
    poller = net.app.switches[1].poller
    net.app.advance(poller.next_due - net.app.clock + 0.01)
    onset = net.app.clock                          # just after a slow poll
    udp_flood(net, 8e6)
    net.app.advance(0.5)
    (decision,) = net.app.decisions.last
    assert decision["action"] == "program" and decision["time"] - onset <= 0.15, decision["time"] - onset


def test_a_port_no_longer_auto_is_no_longer_fast_polled(net):
    up(net, "auto")
    net.s1.load = {1: 0.6 * CAPACITY}              # busy: fast polled
    net.app.advance(2.0)
    assert net.app.request(ev.SetPolicy, shipped("reserve"))[1] is None   # port 1 reserves for good: nothing to watch
    net.s1.load = {1: 0.6 * CAPACITY}
    net.app.advance(1.0)
    fast = fast_requests(net)
    net.app.advance(2.0)
    assert fast_requests(net) == fast
    assert net.app.request(ev.SetPolicy, shipped("auto"))[1] is None     # auto again, and still busy: fast again
    net.s1.load = {1: 0.6 * CAPACITY}
    net.app.advance(2.0)
    assert fast_requests(net) - fast >= 20


def test_a_refused_port_is_tried_again_once_a_poll_however_fast_a_busy_port_is_polled(net):
    net.ovsdb.refuse = {"s1-eth1"}
    up(net, "auto")
    net.s1.load = {1: 0.6 * CAPACITY}
    net.app.advance(2.0)
    attempts, fast = net.ovsdb.attempts, fast_requests(net)
    net.app.advance(2.0)
    assert fast_requests(net) - fast >= 20 and net.ovsdb.attempts - attempts <= 2


def test_on_a_switch_without_meters_the_classes_rates_come_from_their_flows_counters(net):
    """A class squeezed short of its reservation with no loss (BBR under UDP) is seen by the classes' rates alone;
    with no meters to count them they come from the flows' counters, which the slow polls read (fast polls would
    find them up to half a second old, so this policy polls slowly only)."""
    net.s1.max_meter = 0
    slow = shipped("auto")
    slow["congestion"]["fast_poll_interval"] = 0
    net.app.connect(net.s1)
    net.app.connect(net.s2)
    assert net.app.request(ev.SetPolicy, slow)[1] is None and net.s1.meters == {}
    net.s1.load, net.s1.class_load = {1: CAPACITY}, {TCP: 1e6, UDP: 4e6}
    net.app.advance(3.0)
    (decision,) = net.app.decisions.last
    assert decision["action"] == "program" and "class tcp at 1 Mbit/s" in decision["reason"], decision["reason"]


def test_on_a_switch_without_meters_a_fast_polled_port_reads_its_classes_from_their_flows(net):
    """Fast polls decide a busy port alone: without meters they read its classified flows' counters."""
    net.s1.max_meter = 0
    up(net, "auto")
    net.s1.load, net.s1.class_load = {1: CAPACITY}, {TCP: 1e6, UDP: 4e6}
    net.app.advance(3.0)
    assert net.app.switches[1].poller.watched == {1}
    (decision,) = net.app.decisions.last
    assert decision["action"] == "program" and "class tcp at 1 Mbit/s" in decision["reason"], decision["reason"]


def test_the_metrics_keep_every_queue_between_slow_polls_and_lose_one_that_went(net):
    """A fast poll reads the busy port's queues only: the others stay as the last slow poll read them, and a queue
    the switch no longer has leaves the metrics at the next slow poll."""
    up(net, "auto")
    net.s1.queues = {(1, 0): (1000, 10, 0), (3, 0): (500, 5, 0)}
    net.s1.load = {1: 0.6 * CAPACITY}
    fast = fast_requests(net)
    net.app.advance(2.0)
    assert fast_requests(net) > fast and set(net.app.snapshot.switches[1].queues) == {(1, 0), (3, 0)}
    del net.s1.queues[(3, 0)]
    net.app.advance(1.0)
    assert set(net.app.snapshot.switches[1].queues) == {(1, 0)}


def test_fast_polls_resume_when_a_port_is_busy_again_on_a_switch_without_meters(net):
    net.s1.max_meter = 0
    up(net, "auto")
    poller = net.app.switches[1].poller
    for load in (0.6, 0.0, 0.6):                   # busy, idle (not fast polled), busy again
        if poller.next_fast is not None:           # the change at a fast poll: the next one's sample is all idle
            net.app.advance(poller.next_fast - net.app.clock)
        net.s1.load = {1: load * CAPACITY}
        net.app.advance(2.0)
        fast = fast_requests(net)
        net.app.advance(1.0)
        assert (fast_requests(net) - fast >= 10) is bool(load), load
    fast = fast_requests(net)
    net.s1.load = {1: 0.6 * CAPACITY}
    net.app.advance(1.0)
    assert fast_requests(net) - fast >= 10


def test_the_poll_metrics_count_each_answered_poll_and_say_an_idle_port_is_not_congested(net):
    up(net, "auto")
    before = net.app.snapshot.switches[1].polls
    net.app.advance(3.0)
    s1 = net.app.snapshot.switches[1]
    assert s1.polls - before == 3 and s1.poll_duration == 0.0
    assert s1.poll_lag == pytest.approx(POLL_SLACK * 1.0)    # the fake fires each timer as late as its slack lets it
    assert s1.congested == {1: False, 2: False, 3: False}


def test_a_port_busy_without_loss_rolls_back_after_the_hold_time(net):
    """Half its capacity and more, two classes, no drop: calm, so the reservation goes after hold_seconds."""
    up(net, "auto")
    for _ in range(2):
        udp_flood(net, 8e6)
        net.app.poll()
    assert net.s1.steering() == {TCP, UDP, VOICE}
    net.s1.load, net.s1.class_load, net.s1.drop_load = {1: 0.8 * CAPACITY}, {TCP: 2e6, UDP: 2e6}, {}
    net.app.advance(4.5)
    assert [d["action"] for d in net.app.decisions.last] == ["program", "rollback"] and net.s1.steering() == set()



def test_a_port_busy_again_after_an_idle_spell_is_fast_polled_from_the_first_poll_that_sees_it(net):
    """An idle port's rates are not worked out at each poll; the first rate after the spell is still over the
    last poll's interval, not averaged over the spell (which would leave a flood unwatched another poll)."""
    up(net, "auto")
    net.app.advance(6.0)                           # every port idle for several polls
    poller = net.app.switches[1].poller
    assert poller.watched == frozenset() and fast_requests(net) == 0
    assert poller.next_due is not None
    net.app.advance(poller.next_due - net.app.clock + 0.05)    # just after a poll
    net.s1.load = {1: 0.9 * CAPACITY}
    net.app.advance(1.0)                           # the next poll: the port busy for 0.95 of its interval
    assert poller.watched == {1}


def test_a_port_that_only_receives_is_shown_not_congested(net):
    """A port whose counters move (it receives) but that sends nothing is measured each poll, and at rest."""
    up(net, "auto")
    net.s1.load = {2: 1e6}                         # port 2 sends: port 1, the lowest numbered, receives it all
    net.app.advance(3.0)
    assert net.app.switches[1].poller.receiving == {1} and net.app.snapshot.switches[1].congested[1] is False
