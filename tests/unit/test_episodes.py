"""topo/studies/main/episodes.py: reaction and recovery of each congestion episode of an `auto` run; the
reaction measured on the switch, when bytes begin to land in a class of the reservation."""

from topo.studies.main.episodes import episodes, steered_at

RESERVATION = 4.0      # Mbit/s; recovered at 80 % of it: 3.2 Mbit/s


def onsets(*offered: float, seconds: float = 10.0) -> list[float]:
    """The UDP onsets the switch sees when steps of `seconds` offer these rates: the start of each step
    with UDP after one without."""
    return [k * seconds for k, rate in enumerate(offered) if rate > 0 and (k == 0 or offered[k - 1] == 0)]


def series(rates: dict[tuple[float, float], float], end: float, default: float = 4.5) -> list[dict]:
    """TCP in 0.5 s intervals from 0 to `end`: `default` Mbit/s except where a [from, to) range says otherwise."""
    out, t = [], 0.0
    while t < end:
        rate = next((r for (lo, hi), r in rates.items() if lo <= t < hi), default)
        out.append({"t": t, "seconds": 0.5, "tcp_mbps": rate})
        t += 0.5
    return out


def arrivals(*ranges: tuple[float, float], end: float = 60.0) -> list[tuple[float, dict[str, int]]]:
    """The bottleneck's classes sampled every 10 ms: the default class always busy, UDP's class (1:3) receiving
    bytes only within `ranges`."""
    out, udp, t = [], 0, 0.0
    while t < end:
        if any(lo <= t < hi for lo, hi in ranges):
            udp += 1500
        out.append((round(t, 3), {"1:1": int(t * 600_000), "1:3": udp, "1:fffe": int(t * 600_000) + udp}))
        t += 0.01
    return out


def program(t: float) -> dict:
    return {"action": "program", "t": t}


def rollback(t: float) -> dict:
    return {"action": "rollback", "t": t}


def test_one_episode_has_its_onset_reaction_recovery_and_rollback():
    # UDP from 10 s; the controller programs at 11.2 s; TCP is below 3.2 Mbit/s from 10 s to 12.5 s
    tcp = series({(10.0, 12.5): 1.5}, end=40.0)
    found = episodes(onsets(0, 4, 0, 0), [program(11.2), rollback(35.0)], tcp, RESERVATION, arrivals((11.21, 35.0)))
    assert found == [{"onset_s": 10.0, "steered_s": 11.22, "programmed_s": 11.2, "rolled_back_s": 35.0,
                      "reaction_seconds": 1.22, "decision_seconds": 1.2, "recovery_seconds": 3.0}]


def test_the_onset_is_the_first_udp_to_reach_the_switch():
    tcp = series({(20.0, 21.0): 2.0}, end=40.0)
    found = episodes(onsets(0, 0, 6, 0), [program(20.8)], tcp, RESERVATION, arrivals((20.805, 40.0)))
    assert found[0]["onset_s"] == 20.0
    assert found[0]["reaction_seconds"] == 0.81 and found[0]["decision_seconds"] == 0.8
    assert found[0]["recovery_seconds"] == 1.5       # the end of the 21.0–21.5 s interval
    assert found[0]["rolled_back_s"] is None


def test_recovery_is_zero_when_tcp_never_dipped():
    found = episodes(onsets(0, 4, 0), [program(10.5), rollback(25.0)], series({}, end=30.0), RESERVATION,
                     arrivals((10.5, 25.0)))
    assert found[0]["recovery_seconds"] == 0.0
    assert found[0]["reaction_seconds"] == 0.51


def test_a_dip_before_the_onset_does_not_count():
    tcp = series({(0.0, 3.0): 1.0}, end=30.0)     # TCP slow start, before any UDP
    found = episodes(onsets(0, 4, 0), [program(10.5)], tcp, RESERVATION, arrivals((10.5, 30.0)))
    assert found[0]["recovery_seconds"] == 0.0


def test_a_program_before_any_udp_onset_has_no_reaction():
    found = episodes(onsets(0, 0, 4), [program(5.0)], series({}, end=30.0), RESERVATION, arrivals())
    assert found == [{"onset_s": 20.0, "steered_s": None, "programmed_s": 5.0, "rolled_back_s": None,
                      "reaction_seconds": None, "decision_seconds": None, "recovery_seconds": None}]


def test_a_program_in_a_run_without_udp_has_no_onset():
    found = episodes(onsets(0, 0), [program(5.0)], series({}, end=20.0), RESERVATION, arrivals())
    assert found[0]["onset_s"] is None
    assert found[0]["reaction_seconds"] is None


def test_two_episodes_separated_by_a_rollback_each_find_their_own_onset():
    # steps every 10 s: UDP 4 at 10 s, calm 20–40 s, UDP 6 from 40 s
    tcp = series({(10.0, 11.0): 2.0, (40.0, 42.0): 1.0}, end=60.0)
    found = episodes(onsets(0, 4, 0, 0, 6, 6), [program(10.4), rollback(24.0), program(41.0), rollback(58.0)],
                     tcp, RESERVATION, arrivals((10.4, 24.0), (41.005, 58.0)))
    assert [(e["onset_s"], e["programmed_s"], e["rolled_back_s"]) for e in found] == [
        (10.0, 10.4, 24.0), (40.0, 41.0, 58.0)]
    assert [e["reaction_seconds"] for e in found] == [0.41, 1.01]
    assert [e["recovery_seconds"] for e in found] == [1.5, 2.5]


def test_an_episode_does_not_take_the_recovery_of_the_next_one():
    tcp = series({(40.0, 42.0): 1.0}, end=60.0)      # only the second flood squeezes TCP
    found = episodes(onsets(0, 4, 0, 0, 6, 6), [program(10.4), rollback(24.0), program(41.0), rollback(58.0)],
                     tcp, RESERVATION, arrivals((10.4, 24.0), (41.0, 58.0)))
    assert [e["recovery_seconds"] for e in found] == [0.0, 2.5]


def test_recovery_is_none_when_tcp_never_comes_back():
    tcp = series({(10.0, 30.0): 0.5}, end=30.0)
    found = episodes(onsets(0, 8, 8), [program(10.2)], tcp, RESERVATION, arrivals((10.2, 30.0)))
    assert found[0]["reaction_seconds"] == 0.21
    assert found[0]["recovery_seconds"] is None


def test_missing_tcp_rates_count_as_a_dip():
    tcp = series({}, end=20.0)
    tcp[20]["tcp_mbps"] = None      # 10.0–10.5 s, before the queues took effect: no report
    found = episodes(onsets(0, 4), [program(10.5)], tcp, RESERVATION, arrivals((10.5, 20.0)))
    assert found[0]["recovery_seconds"] == 1.0


def test_recovered_share_sets_the_bar():
    tcp = series({(10.0, 12.0): 3.0}, end=20.0)      # 75 % of the reservation
    assert episodes(onsets(0, 4), [program(10.5)], tcp, RESERVATION, arrivals())[0]["recovery_seconds"] == 2.5
    assert episodes(onsets(0, 4), [program(10.5)], tcp, RESERVATION, arrivals(), recovered_share=0.7)[0][
        "recovery_seconds"] == 0.0


def test_no_decisions_no_episodes():
    assert episodes(onsets(0, 4), [], series({}, end=20.0), RESERVATION, arrivals()) == []


def test_a_dip_at_roll_back_is_not_the_onsets():
    # Queues programmed right at onset: TCP never fell; the roll-back's own dip comes later.
    series = [{"t": float(t), "seconds": 1.0, "tcp_mbps": 2.36 if t == 28 else 4.3} for t in range(34)]
    decisions = [{"action": "program", "t": 3.3}, {"action": "rollback", "t": 28.5}]
    (episode,) = episodes([3.2], decisions, series, reservation_mbps=4.0, arrivals=arrivals((3.3, 28.5)))
    assert episode["recovery_seconds"] == 0.0


def test_steering_takes_effect_when_a_class_beside_the_default_one_first_receives_bytes():
    samples = arrivals((5.0, 9.0), end=10.0)
    assert steered_at(samples, onset=4.0) == 5.01     # the first sample that shows bytes newly arrived
    assert steered_at(samples, onset=9.5) is None     # none after the steering ended
    assert steered_at(arrivals(end=10.0), onset=0.0) is None   # the default and parent classes do not count


def test_the_onset_is_the_first_udp_burst_after_the_last_rollback_not_a_step_boundary():
    # the flood reached the switch at 10.03 s, 30 ms before the program; a burst during the episode is not an onset
    found = episodes([10.03, 12.0, 30.0], [program(10.06), rollback(25.0), program(30.2)],
                     series({}, end=40.0), RESERVATION, arrivals((10.065, 25.0), (30.205, 40.0)))
    assert [(e["onset_s"], e["reaction_seconds"]) for e in found] == [(10.03, 0.04), (30.0, 0.21)]
