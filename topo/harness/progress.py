"""A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""
from __future__ import annotations

import sys
import time


class ProgressBar:
    WIDTH = 30

    def __init__(self, total: float, stream=sys.stderr):
        self.total = max(total, 1e-9)
        self.stream = stream
        self.tty = stream.isatty()
        self.part, self.offset, self.label = "", 0.0, ""
        self._last_line = 0.0
        self._done = 0.0

    def start_part(self, part: str, offset: float) -> None:
        self.part, self.offset = part, offset

    def tick(self, label: str, elapsed: float) -> None:
        # Never back: a part that ran past its planned length is caught up with, not undone.
        done = self._done = max(self._done, min(1.0, (self.offset + elapsed) / self.total))
        filled = int(done * self.WIDTH)
        line = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done:4.0%}  {self.part}: {label}"
        if self.tty:
            self.stream.write("\r\033[K" + line)
        elif label != self.label or time.monotonic() - self._last_line > 10:
            self.stream.write(line + "\n")
            self._last_line = time.monotonic()
        self.label = label
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
