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
"""
from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

SLOW_SECONDS = 0.05    # a full collection this long means a heap worth freezing
THAW_SECONDS = 600.0


class Heap:
    def __init__(self, slow: float = SLOW_SECONDS, clock: Callable[[], float] = time.perf_counter):
        self.slow, self._clock = slow, clock
        self._started: float | None = None
        self.frozen_after: float | None = None   # how long the full collection took that froze the heap last

    def run(self, sleep: Callable[[float], None]) -> None:
        """The app's green thread: freeze after slow collections from now on, thaw every THAW_SECONDS."""
        self.install()
        while True:
            sleep(THAW_SECONDS)
            self.thaw()

    def install(self) -> None:
        gc.callbacks.append(self._collected)

    def uninstall(self) -> None:
        gc.callbacks.remove(self._collected)

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
