import pytest

from controller.core.stats import (
    ALL_ONES,
    FlowCounters,
    Multipart,
    PortCounters,
    PortRates,
    QueueCounters,
    QueueRates,
    RateTracker,
)

DP, PORT, QUEUE = 1, 2, 0


def port_counters(rx_bytes=0, tx_bytes=0, rx_packets=0, tx_packets=0, rx_dropped=0, tx_dropped=0,
                  rx_errors=0, tx_errors=0) -> PortCounters:
    return PortCounters(rx_bytes, tx_bytes, rx_packets, tx_packets, rx_dropped, tx_dropped,
                        rx_errors, tx_errors)


def sent(tx_bytes: int) -> PortCounters:
    return port_counters(tx_bytes=tx_bytes)


def test_first_sample_has_no_rate():
    tracker = RateTracker()
    assert tracker.port(DP, PORT, sent(1000), now=5.0) is None
    assert tracker.queue(DP, PORT, QUEUE, QueueCounters(1000, 10, 0), now=5.0) is None


def test_rates_are_deltas_per_second_with_bytes_as_bits():
    tracker = RateTracker()
    tracker.port(DP, PORT, port_counters(1000, 2000, 10, 20, 1, 2, 3, 4), now=10.0)
    rates = tracker.port(DP, PORT, port_counters(3000, 6000, 30, 60, 3, 6, 9, 12), now=12.0)
    assert rates == PortRates(rx_bps=8000.0, tx_bps=16000.0, rx_pps=10.0, tx_pps=20.0,
                              rx_drops_ps=1.0, tx_drops_ps=2.0, rx_errors_ps=3.0, tx_errors_ps=4.0,
                              interval=2.0)


def test_each_sample_becomes_the_next_baseline():
    tracker = RateTracker()
    tracker.port(DP, PORT, sent(0), now=0.0)
    tracker.port(DP, PORT, sent(1000), now=1.0)
    assert tracker.port(DP, PORT, sent(1500), now=2.0).tx_bps == 4000.0


def test_64_bit_wrap_counts_across_the_wrap():
    tracker = RateTracker()
    tracker.port(DP, PORT, sent(2**64 - 1000), now=0.0)
    assert tracker.port(DP, PORT, sent(500), now=1.0).tx_bps == 1500 * 8


def test_reset_rebaselines_and_the_next_sample_is_measured_from_it():
    tracker = RateTracker()
    tracker.port(DP, PORT, sent(10**9), now=0.0)
    assert tracker.port(DP, PORT, sent(100), now=1.0) is None
    assert tracker.port(DP, PORT, sent(900), now=2.0).tx_bps == 800 * 8


def test_reset_of_one_counter_rebaselines_the_whole_sample():
    tracker = RateTracker()
    tracker.port(DP, PORT, port_counters(tx_bytes=1000, rx_errors=50), now=0.0)
    assert tracker.port(DP, PORT, port_counters(tx_bytes=2000, rx_errors=0), now=1.0) is None
    rates = tracker.port(DP, PORT, port_counters(tx_bytes=2500, rx_errors=1), now=2.0)
    assert (rates.tx_bps, rates.rx_errors_ps) == (500 * 8, 1.0)


@pytest.mark.parametrize("late", [1.0, 0.5])
def test_duplicate_or_late_reply_is_ignored_and_keeps_the_baseline(late):
    tracker = RateTracker()
    tracker.port(DP, PORT, sent(0), now=0.0)
    tracker.port(DP, PORT, sent(1000), now=1.0)
    assert tracker.port(DP, PORT, sent(99_999), now=late) is None
    assert tracker.port(DP, PORT, sent(3000), now=2.0).tx_bps == 2000 * 8


def test_gap_longer_than_max_gap_rebaselines():
    tracker = RateTracker(max_gap=10.0)
    tracker.port(DP, PORT, sent(0), now=0.0)
    assert tracker.port(DP, PORT, sent(10**6), now=10.5) is None
    assert tracker.port(DP, PORT, sent(10**6 + 100), now=11.5).tx_bps == 800.0


def test_gap_within_max_gap_gives_the_average_over_the_gap():
    tracker = RateTracker(max_gap=10.0)
    tracker.port(DP, PORT, sent(0), now=0.0)
    rates = tracker.port(DP, PORT, sent(5000), now=10.0)
    assert (rates.tx_bps, rates.interval) == (4000.0, 10.0)


def test_unsupported_counter_gives_none_and_the_others_still_count():
    tracker = RateTracker()
    tracker.port(DP, PORT, port_counters(tx_bytes=0, rx_errors=ALL_ONES), now=0.0)
    rates = tracker.port(DP, PORT, port_counters(tx_bytes=1000, rx_errors=ALL_ONES), now=1.0)
    assert rates.rx_errors_ps is None
    assert rates.tx_bps == 8000.0


@pytest.mark.parametrize("before, after", [(5, ALL_ONES), (ALL_ONES, 5)])
def test_counter_turning_unsupported_or_supported_is_neither_wrap_nor_reset(before, after):
    tracker = RateTracker()
    tracker.port(DP, PORT, port_counters(tx_bytes=0, tx_dropped=before), now=0.0)
    rates = tracker.port(DP, PORT, port_counters(tx_bytes=1000, tx_dropped=after), now=1.0)
    assert rates.tx_drops_ps is None
    assert rates.tx_bps == 8000.0


def test_queue_rates():
    tracker = RateTracker()
    tracker.queue(DP, PORT, QUEUE, QueueCounters(2**64 - 100, 10, ALL_ONES), now=0.0)
    rates = tracker.queue(DP, PORT, QUEUE, QueueCounters(900, 30, ALL_ONES), now=2.0)
    assert rates == QueueRates(tx_bps=1000 * 8 / 2, tx_pps=10.0, tx_errors_ps=None, interval=2.0)


def test_queue_reset_rebaselines():
    tracker = RateTracker()
    tracker.queue(DP, PORT, QUEUE, QueueCounters(5000, 50, 5), now=0.0)
    assert tracker.queue(DP, PORT, QUEUE, QueueCounters(100, 1, 0), now=1.0) is None
    assert tracker.queue(DP, PORT, QUEUE, QueueCounters(200, 2, 3), now=2.0).tx_errors_ps == 3.0


def test_flows_known_unchanged_give_their_next_rate_over_the_time_since_then_not_since_their_last_read():
    tracker = RateTracker(max_gap=10.0)
    tracker.flow(DP, 5, FlowCounters(1000, 10), now=0.0)
    tracker.queue(DP, PORT, QUEUE, QueueCounters(1000, 10, 0), now=0.0)
    assert tracker.unchanged(DP, "flow", 29.5) == [5]     # the switch received nothing for 29.5 s: not read
    assert tracker.flow(DP, 5, FlowCounters(2000, 20), now=30.0).bps == 16_000.0
    assert tracker.queue(DP, PORT, QUEUE, QueueCounters(1000, 10, 40), now=30.0) is None   # a gap is a gap


def test_port_and_each_queue_keep_their_own_baseline():
    tracker = RateTracker()
    tracker.port(DP, PORT, sent(0), now=0.0)
    tracker.queue(DP, PORT, 0, QueueCounters(0, 0, 0), now=0.0)
    tracker.queue(DP, PORT, 1, QueueCounters(10**6, 0, 0), now=0.0)
    assert tracker.port(DP, PORT, sent(100), now=1.0).tx_bps == 800.0
    assert tracker.queue(DP, PORT, 0, QueueCounters(200, 0, 0), now=1.0).tx_bps == 1600.0
    assert tracker.queue(DP, PORT, 1, QueueCounters(10**6 + 300, 0, 0), now=1.0).tx_bps == 2400.0


def test_multipart_parts_are_joined_in_order_and_kept_apart_by_switch_kind_and_xid():
    parts = Multipart()
    assert parts.add(1, "port", 7, ["a", "b"], more=True) is None
    assert parts.add(2, "port", 7, ["x"], more=True) is None          # another switch, same xid
    assert parts.add(1, "queue", 7, ["q"], more=False) == ["q"]       # another kind: whole on its own
    assert parts.add(1, "port", 7, ["c"], more=False) == ["a", "b", "c"]
    assert parts.add(1, "port", 7, ["d"], more=False) == ["d"]        # a new reply starts afresh


def test_a_switch_that_leaves_mid_reply_leaves_no_parts_behind():
    parts = Multipart()
    parts.add(1, "port", 7, ["a"], more=True)
    parts.add(2, "port", 8, ["x"], more=True)
    parts.forget(1)
    assert parts.add(1, "port", 7, ["b"], more=False) == ["b"]
    assert parts.add(2, "port", 8, ["y"], more=False) == ["x", "y"]
