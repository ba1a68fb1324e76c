"""The core's timers in one greenthread (controller/adapters/timers.py): none early, in time order, an earlier
timer not held behind a later one the greenthread already sleeps for, and timers with slack handed over
together at the earliest deadline."""
import time

from controller.adapters.timers import Timers
from controller.compat import hub
from controller.core import events as ev


def test_due_in_time_order_and_none_early():
    now = [100.0]
    timers = Timers(lambda events: None, clock=lambda: now[0])
    first, second, third = ev.PollDue(1, 1.0), ev.PollDue(2, 2.0), ev.PollDue(3, 3.0)
    timers.add(0.5, second)
    timers.add(0.2, first)
    timers.add(0.5, third)           # as late as `second`: after it, in the order asked
    assert timers.due(100.19) == []
    assert timers.due(100.2) == [first]
    assert timers.due(100.49) == []
    assert timers.due(101.0) == [second, third]
    assert timers.due(200.0) == []


def test_the_runner_wakes_at_the_earliest_deadline_and_takes_every_timer_whose_time_has_come():
    timers = Timers(lambda events: None, clock=lambda: 100.0)
    a, b, c, d = (ev.PollDue(n, float(n)) for n in range(4))
    timers.add(0.2, a, slack=0.3)    # due at 100.2, by 100.5
    timers.add(0.4, b, slack=0.3)    # due at 100.4, by 100.7
    assert timers.deadline() == 100.5
    timers.add(0.3, c)               # no slack: due and deadline at 100.3, before a's
    assert timers.deadline() == 100.3
    assert timers.due(100.3) == [a, c]   # a rides along with c; b's time has not come
    assert timers.deadline() == 100.7    # the fired ones' deadlines no longer count
    timers.add(0.9, d, slack=0.1)
    assert timers.due(100.7) == [b]
    assert timers.deadline() == 101.0
    assert timers.due(101.0) == [d] and timers.deadline() is None


def test_an_earlier_timer_wakes_the_sleeping_greenthread():
    posted: list[tuple[float, ev.Event]] = []
    timers = Timers(lambda events: posted.extend((time.monotonic(), event) for event in events))
    runner = hub.spawn(timers.run)
    try:
        late, early = ev.PollDue(1, 1.0), ev.PollDue(2, 2.0)
        start = time.monotonic()
        timers.add(0.8, late)
        hub.sleep(0.05)              # the runner now sleeps until `late`
        assert posted == []
        timers.add(0.05, early)
        hub.sleep(0.4)
        assert [event for _, event in posted] == [early]   # not held until the later timer
        hub.sleep(0.6)
        assert [event for _, event in posted] == [early, late]
        assert posted[1][0] - start >= 0.8
    finally:
        hub.kill(runner)


def test_timers_with_slack_are_posted_together_at_the_first_deadline_and_none_early():
    posted: list[tuple[float, list[ev.Event]]] = []
    timers = Timers(lambda events: posted.append((time.monotonic(), list(events))))
    runner = hub.spawn(timers.run)
    try:
        start = time.monotonic()
        polls = [ev.PollDue(n, float(n)) for n in range(3)]
        for n, poll in enumerate(polls):
            timers.add(0.1 + 0.05 * n, poll, slack=0.3)   # due at 0.1, 0.15 and 0.2; the first by 0.4
        hub.sleep(0.3)
        assert posted == []          # each is due, none must fire yet
        hub.sleep(0.3)
        assert [events for _, events in posted] == [polls]   # one hand-over of all three
        assert posted[0][0] - start >= 0.4
    finally:
        hub.kill(runner)
