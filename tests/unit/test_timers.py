"""The core's timers in one greenthread (controller/adapters/timers.py): none early, in time order, and an
earlier timer not held behind a later one the greenthread already sleeps for."""
import time

from controller.adapters.timers import Timers
from controller.compat import hub
from controller.core import events as ev


def test_due_in_time_order_and_none_early():
    now = [100.0]
    timers = Timers(lambda event: None, clock=lambda: now[0])
    first, second, third = ev.PollDue(1, 1.0), ev.PollDue(2, 2.0), ev.PollDue(3, 3.0)
    timers.add(0.5, second)
    timers.add(0.2, first)
    timers.add(0.5, third)           # as late as `second`: after it, in the order asked
    assert timers.due(100.19) == []
    assert timers.due(100.2) == [first]
    assert timers.due(100.49) == []
    assert timers.due(101.0) == [second, third]
    assert timers.due(200.0) == []


def test_an_earlier_timer_wakes_the_sleeping_greenthread():
    posted: list[tuple[float, ev.Event]] = []
    timers = Timers(lambda event: posted.append((time.monotonic(), event)))
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
