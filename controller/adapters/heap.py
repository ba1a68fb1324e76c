"""Python's cycle collector in a controller of thousands of ports.

A full collection walks every object the collector tracks, and a member of 10,000 ports holds millions
(OVSDB's replica of the ports' rows, the ports' state and rates): each walk took 0.6-1.2 s, every 7-30 s
while polling (every 2-3 s during an apply), holding the event loop: a poll falling due during one was
sent more than an interval late, and skipped. A full collection is set off by objects that outlived two young
ones: the counters each poll keeps until the next are such objects, and the walk finds no garbage.

So after a full collection that took long, everything it found alive is frozen (gc.freeze): later
collections walk only what was made since. Objects frozen and later dropped are still freed when nothing
refers to them; only a cycle among them would wait for the next thaw, when the frozen objects are handed
back to the collector (one long walk, then frozen again): every THAW_SECONDS.

A young collection is set off when the objects made and not yet freed exceed a threshold: Python's 700 is
passed within the handling of one message (a parsed reply, its event, the rates), objects that die a moment
later. At 500 switches of 20 ports that was about 3.5 young collections a second, 1.0 s of CPU a minute
(each walking whatever that moment had alive: 0.5 ms median, up to 32 ms), and none found garbage. With
YOUNG_OBJECTS none was set off in a steady minute (docs/benchmarks.md).
"""
from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

SLOW_SECONDS = 0.05    # a full collection this long means a heap worth freezing
THAW_SECONDS = 600.0
YOUNG_OBJECTS = 20_000   # made and not yet freed before a young collection (Python's default: 700)


class Heap:
    def __init__(self, slow: float = SLOW_SECONDS, clock: Callable[[], float] = time.perf_counter):
        self.slow, self._clock = slow, clock
        self._started: float | None = None
        self.frozen_after: float | None = None   # how long the full collection took that froze the heap last
        self._thresholds = gc.get_threshold()

    def run(self, sleep: Callable[[float], None]) -> None:
        """The app's green thread: young collections only past YOUNG_OBJECTS, freeze after slow full ones
        from now on, thaw every THAW_SECONDS."""
        self.install()
        while True:
            sleep(THAW_SECONDS)
            self.thaw()

    def install(self) -> None:
        self._thresholds = gc.get_threshold()
        gc.set_threshold(YOUNG_OBJECTS, *self._thresholds[1:])
        gc.callbacks.append(self._collected)

    def uninstall(self) -> None:
        gc.callbacks.remove(self._collected)
        gc.set_threshold(*self._thresholds)

    def thaw(self) -> None:
        """Hand the frozen objects back: the next full collection walks them all once (and frees the cycles
        among them), then freezes what is still alive."""
        gc.unfreeze()

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = self._clock()
            return
        took = self._clock() - self._started if self._started is not None else 0.0
        if took >= self.slow:
            self.frozen_after = took
            gc.freeze()   # just collected: nothing frozen now is garbage
