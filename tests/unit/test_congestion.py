import pytest

from controller.core.congestion import PROGRAM, ROLLBACK, CongestionConfig, PortCongestion, PortSample, bitrate

CAPACITY = 10e6
DEFAULT = CongestionConfig()


def sample(utilisation: float, loss_ratio: float) -> PortSample:
    """A poll of a 10 Mbit/s port offered 1000 packets per second."""
    drops = 1000 * loss_ratio
    return PortSample(tx_bps=utilisation * CAPACITY, tx_pps=1000 - drops, drops_ps=drops,
                      capacity_bps=CAPACITY)


HOT = sample(0.99, 0.05)
CALM = sample(0.1, 0.0)
FULL_NO_LOSS = sample(1.0, 0.0)   # one elastic TCP flow filling the link
LUKEWARM = sample(0.7, 0.005)     # neither hot nor calm under the default config


def feed(detector: PortCongestion, samples, start: float = 0.0) -> list:
    """Observe one sample per second; the decisions as (action, at)."""
    decisions = (detector.observe(s, start + i) for i, s in enumerate(samples))
    return [(d.action, d.at) for d in decisions if d is not None]


def congested_detector(config: CongestionConfig = DEFAULT) -> PortCongestion:
    detector = PortCongestion(config)
    assert feed(detector, [HOT] * config.samples) == [(PROGRAM, config.samples - 1.0)]
    return detector


def test_programs_after_the_configured_consecutive_hot_samples():
    detector = PortCongestion(CongestionConfig(samples=3))
    assert feed(detector, [HOT, HOT, HOT]) == [(PROGRAM, 2.0)]
    assert detector.congested


def test_a_cold_sample_between_hot_ones_restarts_the_count():
    detector = PortCongestion(DEFAULT)
    assert feed(detector, [HOT, LUKEWARM, HOT, CALM, HOT]) == []
    assert not detector.congested
    assert feed(detector, [HOT], start=5.0) == [(PROGRAM, 5.0)]


def test_a_detector_rests_only_while_not_congested_and_without_a_hot_sample_in_a_row():
    # The switch skips an idle port's sample while its detector rests: that sample must change nothing.
    detector = PortCongestion(CongestionConfig(samples=3))
    assert detector.resting
    feed(detector, [HOT])
    assert not detector.resting                  # an idle sample now would end the streak
    feed(detector, [CALM])
    assert detector.resting
    assert not congested_detector().resting      # an idle sample now would count towards calm


def test_high_utilisation_without_loss_never_programs():
    detector = PortCongestion(DEFAULT)
    assert feed(detector, [FULL_NO_LOSS] * 100) == []


def test_loss_without_high_utilisation_never_programs():
    detector = PortCongestion(DEFAULT)
    assert feed(detector, [sample(0.5, 0.3)] * 100) == []


def test_zero_loss_ratio_lets_utilisation_alone_decide_both_ways():
    detector = PortCongestion(CongestionConfig(loss_ratio=0.0))
    assert feed(detector, [FULL_NO_LOSS] * 100) == [(PROGRAM, 1.0)]
    # loss-free but half full is not calm: only utilisation below clear_utilisation clears
    assert feed(detector, [sample(0.7, 0.0)] * 10, start=100.0) == []
    assert feed(detector, [CALM] * 4, start=110.0) == [(ROLLBACK, 113.0)]


def test_steady_flood_programs_exactly_once_and_never_rolls_back():
    detector = PortCongestion(DEFAULT)
    assert feed(detector, [HOT] * 100) == [(PROGRAM, 1.0)]
    assert detector.congested


def test_clearing_needs_hold_seconds_of_continuous_calm():
    detector = congested_detector()
    assert feed(detector, [CALM, CALM, CALM], start=10.0) == []
    assert detector.congested
    assert feed(detector, [CALM], start=13.0) == [(ROLLBACK, 13.0)]
    assert not detector.congested


@pytest.mark.parametrize("interruption", [HOT, LUKEWARM])
def test_interrupted_calm_restarts_the_hold_timer(interruption):
    detector = congested_detector()
    assert feed(detector, [CALM, CALM, interruption, CALM, CALM, CALM], start=10.0) == []
    assert feed(detector, [CALM], start=16.0) == [(ROLLBACK, 16.0)]


def test_hold_is_measured_in_injected_seconds_not_samples():
    detector = congested_detector()
    assert detector.observe(CALM, 10.0) is None
    assert detector.observe(CALM, 12.9) is None
    assert detector.observe(CALM, 13.0).action == ROLLBACK


def test_full_link_without_loss_is_calm_so_congestion_clears():
    detector = congested_detector()
    assert feed(detector, [FULL_NO_LOSS] * 4, start=10.0) == [(ROLLBACK, 13.0)]


def test_rollback_then_a_new_flood_is_a_new_episode():
    detector = PortCongestion(DEFAULT)
    # the flood returns right after the rollback: the new episode still needs its own hot samples
    assert feed(detector, [HOT] * 5 + [CALM] * 4 + [HOT] * 5) == [
        (PROGRAM, 1.0), (ROLLBACK, 8.0), (PROGRAM, 10.0)]


def test_a_sample_both_hot_and_calm_by_thresholds_counts_as_hot_so_it_cannot_flap():
    config = CongestionConfig(loss_ratio=0.01, clear_loss_ratio=0.1)
    detector = PortCongestion(config)
    assert feed(detector, [HOT] * 100) == [(PROGRAM, 1.0)]


def test_decision_carries_the_numbers_of_the_deciding_sample():
    detector = PortCongestion(DEFAULT)
    flood = PortSample(tx_bps=4.98e6, tx_pps=688, drops_ps=312, capacity_bps=5e6)
    detector.observe(flood, 0.0)
    decision = detector.observe(flood, 1.0)
    assert (decision.action, decision.at) == (PROGRAM, 1.0)
    assert decision.utilisation == pytest.approx(0.996)
    assert decision.loss_ratio == pytest.approx(0.312)
    assert decision.reason == "tx 4.98 Mbit/s = 99.6% of 5 Mbit/s, loss 31.2%; loss ≥ 1.0% for 2 samples"


SQUEEZED = "class tcp at 2.75 Mbit/s < 90% of its 4 Mbit/s while udp takes 2 Mbit/s"


def test_contention_without_loss_programs_and_says_why():
    detector = PortCongestion(DEFAULT)
    squeezed = PortSample(tx_bps=4.99e6, tx_pps=420, drops_ps=0, capacity_bps=5e6, contention=SQUEEZED)
    assert detector.observe(squeezed, 0.0) is None
    decision = detector.observe(squeezed, 1.0)
    assert decision.action == PROGRAM
    assert decision.reason.endswith(f"{SQUEEZED}; contention for 2 samples")


def test_contention_on_a_link_with_room_is_not_congestion():
    detector = PortCongestion(DEFAULT)
    roomy = PortSample(tx_bps=3e6, tx_pps=300, drops_ps=0, capacity_bps=5e6, contention=SQUEEZED)
    assert all(detector.observe(roomy, float(t)) is None for t in range(20))


def test_contention_keeps_congestion_from_clearing():
    detector = congested_detector()
    squeezed = PortSample(tx_bps=4.99e6, tx_pps=420, drops_ps=0, capacity_bps=5e6, contention=SQUEEZED)
    assert all(detector.observe(squeezed, 10.0 + t) is None for t in range(20))
    assert detector.congested


def test_rollback_reason_has_the_calm_numbers():
    detector = congested_detector()
    calm = PortSample(tx_bps=250e6, tx_pps=20_000, drops_ps=0, capacity_bps=1e9)
    assert detector.observe(calm, 10.0) is None
    decision = detector.observe(calm, 13.5)
    assert (decision.action, decision.utilisation, decision.loss_ratio) == (ROLLBACK, 0.25, 0.0)
    assert decision.reason == "tx 250 Mbit/s = 25.0% of 1 Gbit/s, loss 0.0%, calm for 3.5 s ≥ 3 s"


def test_loss_ratio_is_zero_when_nothing_is_offered():
    assert PortSample(tx_bps=0, tx_pps=0, drops_ps=0, capacity_bps=CAPACITY).loss_ratio == 0.0


@pytest.mark.parametrize("capacity", [0, -1e6])
def test_capacity_must_be_positive(capacity):
    with pytest.raises(ValueError):
        PortSample(tx_bps=0, tx_pps=0, drops_ps=0, capacity_bps=capacity)


def test_loss_of_a_lone_class_is_not_congestion():
    # TCP slow start alone on the port: full and lossy, but no other class to protect it from.
    detector = PortCongestion(CongestionConfig(samples=1))
    lone = PortSample(tx_bps=4.99e6, tx_pps=400, drops_ps=33, capacity_bps=5e6, competing=False)
    assert all(detector.observe(lone, float(t)) is None for t in range(10))
    competing = PortSample(tx_bps=4.99e6, tx_pps=400, drops_ps=33, capacity_bps=5e6, competing=True)
    assert detector.observe(competing, 10.0).action == PROGRAM


def test_loss_exactly_at_the_clear_ratio_is_not_calm():
    """Calm is loss below clear_loss_ratio: a congested port that loses exactly that share keeps its reservation."""
    at_clear = sample(0.7, DEFAULT.clear_loss_ratio)
    assert at_clear.loss_ratio == DEFAULT.clear_loss_ratio and not DEFAULT.is_hot(at_clear)
    detector = congested_detector()
    assert feed(detector, [at_clear] * 10, start=2.0) == [] and detector.congested
    assert feed(detector, [sample(0.7, 0.0009)] * 4, start=12.0) == [(ROLLBACK, 15.0)]
    # Calm is utilisation below clear_utilisation too: exactly half the port, losing, is not.
    assert not DEFAULT.is_calm(sample(DEFAULT.clear_utilisation, 0.005))


def test_a_port_found_reserving_needs_as_many_hot_samples_as_any_after_its_rollback():
    detector = PortCongestion(DEFAULT)
    detector.adopt()                             # a restarted controller found the reservation in force
    assert feed(detector, [CALM] * 4) == [(ROLLBACK, 3.0)]
    assert feed(detector, [HOT], start=4.0) == [] and not detector.congested   # one hot sample is a blip
    assert feed(detector, [HOT], start=5.0) == [(PROGRAM, 5.0)]


def test_loss_exactly_at_the_loss_ratio_is_the_reason_said():
    detector = PortCongestion(DEFAULT)
    at_ratio = sample(0.99, DEFAULT.loss_ratio)
    decisions = [detector.observe(at_ratio, float(t)) for t in range(2)]
    assert decisions[1] is not None and decisions[1].reason.endswith("; loss ≥ 1.0% for 2 samples")


def test_a_rate_is_said_in_its_unit_and_nothing_in_bit_s():
    assert [bitrate(b) for b in (0, 999, 1500, 5e6, 2.5e9)] == ["0 bit/s", "999 bit/s", "1.5 kbit/s", "5 Mbit/s",
                                                               "2.5 Gbit/s"]


def offered(by: float, alone: bool = False) -> PortSample:
    """A full port whose classes offer `by` times its capacity (counted before the queue), with no loss yet: the
    first poll after a flood's onset, its queue still filling."""
    return PortSample(tx_bps=CAPACITY, tx_pps=1000, drops_ps=0, capacity_bps=CAPACITY, alone=alone,
                      offered_bps=by * CAPACITY)


def test_two_classes_offering_well_over_the_capacity_program_in_one_sample():
    detector = PortCongestion(DEFAULT)
    decision = detector.observe(offered(2.5), 1.0)
    assert decision is not None and decision.action == PROGRAM and "250% of it: overload" in decision.reason


@pytest.mark.parametrize("sample_", [offered(1.15), offered(2.5, alone=True)], ids=["a blip's few packets", "a lone flow"])
def test_a_little_over_the_capacity_or_one_class_alone_is_no_overload(sample_):
    assert PortCongestion(DEFAULT).observe(sample_, 1.0) is None
