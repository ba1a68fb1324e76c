"""What the network's parts and the launcher share: how a child process is stopped, and the record
they report what they start to. The launcher's record (topo/harness/host.py's RunRecord, kept on disk
so that the next launcher removes what a killed one left) is one; the network only reports to it.
"""
from __future__ import annotations

import subprocess
import time
from typing import Protocol


class Recorder(Protocol):
    """Told of each process, bridge, link and Mininet host as it is made."""

    def process(self, pid: int, what: str) -> None: ...

    def network(self, bridges: list[str], links: list[str], hosts: dict[str, int]) -> None: ...


def end(proc: subprocess.Popen | None, seconds: float) -> None:
    """A child of this launcher stopped (None: none was started): SIGTERM, then SIGKILL if it has not exited
    within `seconds`."""
    end_all([proc] if proc else [], seconds)


def end_all(procs: list[subprocess.Popen], seconds: float) -> None:
    """Children stopped together, each given the same `seconds` after its SIGTERM."""
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + seconds
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
