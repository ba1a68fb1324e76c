"""The core's timers (act.Later), all in one greenthread.

Every switch's poll is a timer, so at 500 switches polled each second there are 500 timers a second and more.
A greenthread made for each (the framework's spawn_after) cost about 50 µs a timer, with its greenlet, its
event and the hub's own timer; one greenthread that sleeps until the earliest of a heap's entries costs a
few. Timers that fell due together (while the loop was busy) are handed over in one wake-up; none early, for
the core compares its deadlines with the time it is given.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable

from controller.compat import hub
from controller.core import events as ev


class Timers:
    def __init__(self, post: Callable[[ev.Event], None], clock: Callable[[], float] = time.monotonic):
        """`post`: hands an event to the event loop (may wait while the loop's queue is full)."""
        self._post, self._clock = post, clock
        self._heap: list[tuple[float, int, ev.Event]] = []
        self._order = itertools.count()            # equal times fire in the order they were asked
        self._asleep_until: float | None = None    # while the runner waits: until when
        self._wake = hub.Queue()                   # a token put here wakes the runner before that

    def add(self, seconds: float, event: ev.Event) -> None:
        at = self._clock() + seconds
        heapq.heappush(self._heap, (at, next(self._order), event))
        if self._asleep_until is not None and at < self._asleep_until:
            self._asleep_until = None    # woken once, however many earlier timers come before it runs
            self._wake.put(None)

    def due(self, now: float) -> list[ev.Event]:
        """The events whose time has come, in time order; taken out."""
        events = []
        while self._heap and self._heap[0][0] <= now:
            events.append(heapq.heappop(self._heap)[2])
        return events

    def run(self) -> None:
        """The greenthread: each due event posted, then asleep until the next one (or until woken)."""
        while True:
            for event in self.due(self._clock()):
                self._post(event)
            at = self._heap[0][0] if self._heap else None
            self._asleep_until = at if at is not None else float("inf")
            try:
                self._wake.get(timeout=None if at is None else max(at - self._clock(), 0.0))
            except hub.QueueEmpty:
                pass
            self._asleep_until = None
