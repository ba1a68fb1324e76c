"""The core's timers (act.Later), all in one greenthread, those that may wait handed over together.

Every switch's poll is a timer, so at 500 switches polled each second there are 500 timers a second and more.
A greenthread made for each (the framework's spawn_after) cost about 50 µs a timer, with its greenlet, its
event and the hub's own timer; one greenthread that sleeps until the earliest of a heap's entries costs a
few. Each wake-up and each event it posts still cost about 40 µs of CPU (an eventlet timeout and a queue hop
to the event loop), so a timer may carry a slack: it is due at its time and must have fired by its time
plus the slack. The greenthread sleeps until the earliest such deadline and then hands over, as one event,
every timer whose time has come: 500 polls a second with 50 ms of slack are some 20 wake-ups, not 500. None
fires early, for the core compares its deadlines with the time it is given.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable

from controller.compat import hub
from controller.core import events as ev


class Timers:
    def __init__(self, post: Callable[[list[ev.Event]], None], clock: Callable[[], float] = time.monotonic):
        """`post`: hands events to the event loop, as one (may wait while the loop's queue is full)."""
        self._post, self._clock = post, clock
        self._heap: list[tuple[float, int, ev.Event]] = []   # by the time each is due
        self._deadlines: list[tuple[float, int]] = []        # by the time each must have fired (fired ones linger)
        self._waiting: set[int] = set()                      # the timers not fired yet
        self._order = itertools.count()            # equal times fire in the order they were asked
        self._asleep_until: float | None = None    # while the runner waits: until when
        self._wake = hub.Queue()                   # a token put here wakes the runner before that

    def add(self, seconds: float, event: ev.Event, slack: float = 0.0) -> None:
        at, order = self._clock() + seconds, next(self._order)
        heapq.heappush(self._heap, (at, order, event))
        heapq.heappush(self._deadlines, (at + slack, order))
        self._waiting.add(order)
        if self._asleep_until is not None and at + slack < self._asleep_until:
            self._asleep_until = None    # woken once, however many earlier timers come before it runs
            self._wake.put(None)

    def due(self, now: float) -> list[ev.Event]:
        """The events whose time has come, in time order; taken out."""
        events = []
        while self._heap and self._heap[0][0] <= now:
            _, order, event = heapq.heappop(self._heap)
            self._waiting.discard(order)
            events.append(event)
        return events

    def deadline(self) -> float | None:
        """When the next waiting timer must have fired."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][1] not in self._waiting:
            heapq.heappop(deadlines)
        return deadlines[0][0] if deadlines else None

    def run(self) -> None:
        """The greenthread: the due events posted, then asleep until the next deadline (or until woken)."""
        while True:
            events = self.due(self._clock())
            if events:
                self._post(events)
            at = self.deadline()
            self._asleep_until = at if at is not None else float("inf")
            try:
                self._wake.get(timeout=None if at is None else max(at - self._clock(), 0.0))
            except hub.QueueEmpty:
                pass
            self._asleep_until = None
