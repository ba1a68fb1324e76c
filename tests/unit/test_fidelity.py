"""topo/harness/fidelity.py: each signal of the fidelity monitor, on synthetic samples."""
import pytest

from controller.adapters.tc import ClassCounters
from topo.harness.fidelity import Received, Sample, assess, bdp_packets
from topo.net.iperf import Interval

CAPACITY = 5_000_000
TCP_CLASS = "1:2"


def samples(seconds=4.0, utilisation=1.0, tcp_drops=0.0, udp_drops=0.0, wait=0.02, classes=("1:2", "1:3")):
    """Every 0.25 s from t=0: the port sending at `utilisation`, the classes dropping so many per second,
    ovs-vswitchd waiting `wait` of the time."""
    out = []
    for k in range(int(seconds / 0.25) + 1):
        t = 0.25 * k
        sent = int(utilisation * CAPACITY / 8 * t / len(classes))
        drops = {"1:2": int(tcp_drops * t), "1:3": int(udp_drops * t), "1:1": int(udp_drops * t)}
        counters = {c: ClassCounters(sent, int(t * 400 / len(classes)), drops[c]) for c in classes}
        counters["1:fffe"] = ClassCounters(sent * len(classes), 999 * k, 0)   # the parent: never counted
        out.append(Sample(t, counters, int(wait * 1e9 * t), int(0.03 * 1e6 * t)))
    return out


def tcp(rates, seconds=0.25):
    return [Received([Interval(k * seconds, (k + 1) * seconds, bps) for k, bps in enumerate(rates)], 0.0)]


FULL = tcp([4.3e6] * 16)


def test_a_quiet_healthy_step_is_faithful_and_reports_its_numbers():
    verdict = assess(samples(udp_drops=200), 0.0, 4.0, CAPACITY, TCP_CLASS, 0, FULL)
    assert verdict["faithful"] and verdict["fidelity_notes"] == []
    numbers = verdict["fidelity"]
    assert numbers["bottleneck_utilisation"] == pytest.approx(1.0, abs=0.01)
    assert numbers["queue_drops"] == 800 and numbers["tcp_queue_drops"] == 0
    assert numbers["datapath_wait_ratio"] == pytest.approx(0.02) and numbers["cpu_pressure_ratio"] == pytest.approx(0.03)
    assert numbers["receiver_gap_seconds"] == 0.0 and numbers["samples"] == 17


def test_retransmits_the_queue_does_not_explain_are_losses_outside_it():
    ok = assess(samples(tcp_drops=5, udp_drops=200), 0.0, 4.0, CAPACITY, TCP_CLASS, 2 * 20 + 10, FULL)
    assert ok["faithful"]                                   # 50 retransmits against 20 drops: at the bound
    lost = assess(samples(tcp_drops=5, udp_drops=200), 0.0, 4.0, CAPACITY, TCP_CLASS, 51, FULL)
    assert not lost["faithful"]
    assert lost["fidelity_notes"] == ["TCP retransmitted 51 segments while its queue dropped 20: packets were lost "
                                      "outside the queue the policy controls"]


def test_drops_in_the_second_before_the_window_explain_the_retransmits_that_spill_into_it():
    # auto: the FIFO drops TCP until the controller programs the queues, just before the step's window
    before = samples(seconds=1.0, udp_drops=40, classes=("1:1",))            # one FIFO, 40 drops a second
    after = [Sample(s.t + 1.0, s.classes, s.datapath_wait_ns, s.cpu_pressure_us) for s in samples(udp_drops=200)[1:]]
    spilled = assess(before + after, 1.5, 5.0, CAPACITY, TCP_CLASS, 2 * 20 + 10, FULL)
    assert spilled["faithful"], spilled["fidelity_notes"]   # 20 drops in [0.5, 1.0]; none in the window
    long_before = assess(before + after, 2.5, 5.0, CAPACITY, TCP_CLASS, 2 * 20 + 10, FULL)
    assert not long_before["faithful"]                       # the same drops over a second earlier explain nothing


def test_drops_just_after_the_window_explain_the_retransmits_of_the_interval_that_overlaps_its_end():
    # reserve: UDP's step ends, TCP takes the rate it left and its class drops 25 packets in the gap before
    # the next step; the sender's interval [3.5, 4.0] overlaps a window ending at 3.7 and brings in their
    # retransmits in part (measured: 24 of them, with no drop inside the window)
    inside = samples(seconds=3.75, udp_drops=200)
    last = inside[-1]
    tcp_class = last.classes[TCP_CLASS]
    gap = [Sample(3.95, {**last.classes, TCP_CLASS: ClassCounters(tcp_class.bytes + 50_000, tcp_class.packets + 40,
                                                                 tcp_class.drops + 25)},
                  last.datapath_wait_ns, last.cpu_pressure_us)]
    retransmits = 24                             # over 2 * 0 + 10: the window's own drops do not explain them
    assert assess(inside + gap, 0.0, 3.7, CAPACITY, TCP_CLASS, retransmits, FULL)["faithful"]
    assert not assess(inside, 0.0, 3.7, CAPACITY, TCP_CLASS, retransmits, FULL)["faithful"]


def test_without_a_tcp_class_every_drop_may_be_tcps():
    # a single FIFO (policy none): UDP's drops and TCP's share the queue
    verdict = assess(samples(udp_drops=200, classes=("1:1",)), 0.0, 4.0, CAPACITY, None, 400, FULL)
    assert verdict["faithful"]


def test_a_stall_without_drops_is_flagged_but_one_the_queue_explains_is_not():
    stalled = tcp([4.3e6] * 4 + [0.0] * 6 + [4.3e6] * 6)
    quiet = assess(samples(udp_drops=200), 0.0, 4.0, CAPACITY, TCP_CLASS, 0, stalled)
    assert any(note.startswith("TCP stalled for 1.50 s") for note in quiet["fidelity_notes"])
    explained = assess(samples(tcp_drops=40, udp_drops=200), 0.0, 4.0, CAPACITY, TCP_CLASS, 20, stalled)
    assert explained["faithful"]
    lossy = assess(samples(udp_drops=200), 0.0, 4.0, CAPACITY, TCP_CLASS, 0, stalled, path_loss=0.01)
    assert lossy["faithful"]                     # netem's loss explains a retransmission timeout


def test_an_idle_bottleneck_that_drops_nothing_is_the_emulator_falling_behind():
    idle = assess(samples(utilisation=0.6), 0.0, 4.0, CAPACITY, TCP_CLASS, 0, FULL)
    assert idle["fidelity_notes"] == ["the bottleneck carried 60% of its capacity while dropping 0 packets: the "
                                      "senders did not fill an unsaturated queue (emulator too slow)"]
    congested = assess(samples(utilisation=0.6, udp_drops=50), 0.0, 4.0, CAPACITY, TCP_CLASS, 0, FULL)
    assert congested["faithful"]                             # a dropping queue is the policy's outcome


def test_an_idle_link_behind_a_queue_shorter_than_the_bdp_is_tcps_not_the_emulators():
    # 5 Mbit/s and 300 ms: 124 full frames in flight, and a 25-packet queue; Reno halves below the BDP.
    assert round(bdp_packets(5e6, 0.3)) == 124
    long_path = assess(samples(utilisation=0.6), 0.0, 4.0, CAPACITY, TCP_CLASS, 0, FULL, bdp_exceeds_queue=True)
    assert long_path["faithful"]
    lossy_path = assess(samples(utilisation=0.8), 0.0, 4.0, CAPACITY, TCP_CLASS, 0, FULL, path_loss=0.01)
    assert lossy_path["faithful"]                # random loss keeps a loss-based TCP below the link too


def test_losses_a_path_is_set_to_make_are_not_losses_outside_the_queue():
    lossy = samples(utilisation=0.95)
    assert not assess(lossy, 0.0, 4.0, CAPACITY, TCP_CLASS, 30, FULL)["faithful"]
    assert assess(lossy, 0.0, 4.0, CAPACITY, TCP_CLASS, 30, FULL, path_loss=0.01)["faithful"]


def test_what_an_aqm_drops_at_dequeue_counts_as_the_queues_drops():
    codel = samples(utilisation=0.95)                 # the HTB class saw no drop: CoDel dropped at dequeue
    assert not assess(codel, 0.0, 4.0, CAPACITY, None, 100, FULL)["faithful"]
    judged = assess(codel, 0.0, 4.0, CAPACITY, None, 100, FULL, queue_drops_at_least=80)
    assert judged["faithful"] and judged["fidelity"]["queue_drops"] == 80


def test_a_starved_datapath_and_a_silent_receiver_are_flagged():
    starved = assess(samples(udp_drops=100, wait=0.4), 0.0, 4.0, CAPACITY, TCP_CLASS, 0, FULL)
    assert starved["fidelity_notes"] == ["ovs-vswitchd waited for a CPU 40% of the time: the datapath was starved"]
    silent = assess(samples(udp_drops=100), 0.0, 4.0, CAPACITY, TCP_CLASS, 0, tcp([4.3e6] * 8))
    assert silent["fidelity_notes"] == ["the receiver reported nothing for 2.00 s"]


def test_a_class_that_appears_mid_window_counts_from_its_second_sample():
    # auto programs its queues: before, one FIFO class; after, three
    before = samples(seconds=2.0, udp_drops=100, classes=("1:1",))
    after = [Sample(s.t + 2.25, s.classes, s.datapath_wait_ns, s.cpu_pressure_us)
             for s in samples(seconds=1.75, udp_drops=100)]
    verdict = assess(before + after, 0.0, 4.0, CAPACITY, TCP_CLASS, 0, FULL)
    assert verdict["fidelity"]["queue_drops"] == 200 + 175
    assert verdict["fidelity"]["tcp_queue_drops"] == 200    # all drops while no tcp class existed


def test_too_few_samples_is_said_not_guessed():
    verdict = assess(samples()[:1], 0.0, 4.0, CAPACITY, TCP_CLASS, 0, FULL)
    assert verdict["fidelity_notes"] == ["fewer than two samples of the bottleneck in this window"]
