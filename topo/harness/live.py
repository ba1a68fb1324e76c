"""Live study metrics for Prometheus: per-flow throughput every second while a study runs, and
the latency probe's round trips as they come.

Throughput is read from the switch that delivers to the receiver: s2's per-protocol
accounting flows (policies' priority-40000 entries from the bottleneck port) count what
reached h4, whatever the policy did on s1. The probe's RTTs are read from the irtt client's
per-packet lines as it writes them, into a histogram (its _count's rate is the echoes per
second: 50 when nothing is lost). Exported on 127.0.0.1:9102 by default.
"""
from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

from topo.net import probe as irtt

# From the path's own RTT (under a millisecond here) to a full 25-packet FIFO at 5 Mbit/s and beyond.
RTT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)

# ovs-ofctl prints a flow's flags (the controller's flows carry send_flow_rem) between its counters and its match.
_FLOW = re.compile(r"n_bytes=(\d+), (?:\w+ )*priority=40000,(tcp|udp),in_port=1\b")


def parse_delivered(dump: str) -> dict[str, int]:
    """protocol → bytes of s2's accounting flows in `ovs-ofctl dump-flows` output."""
    found: dict[str, int] = {}
    for line in dump.splitlines():
        if m := _FLOW.search(line):
            found[m.group(2)] = found.get(m.group(2), 0) + int(m.group(1))
    return found


class StudyGauges:
    """The study's series: labels follow the current policy and step, set from s2's byte counts and the
    probe's lines."""

    def __init__(self, flow: str = "h1-h4"):
        self.registry = CollectorRegistry()
        self._throughput = Gauge("ovsqos_study_flow_throughput_bytes_per_second",
                                 "Throughput of a study flow as delivered to its receiver",
                                 ["flow", "protocol", "policy", "udp_offered_bps"], registry=self.registry)
        self._offered = Gauge("ovsqos_study_udp_offered_bytes_per_second",
                              "UDP rate the current study step offers", ["policy"], registry=self.registry)
        self._rtt = Histogram("ovsqos_study_probe_rtt_seconds", "Round-trip time of the latency probe's packets",
                              ["policy"], buckets=RTT_BUCKETS, registry=self.registry)
        self._flow = flow
        self._policy: str | None = None
        self._offered_bps = 0
        self._last: dict[str, int] | None = None
        self._last_at = 0.0
        self._lock = threading.Lock()

    def step(self, policy: str, udp_mbps: float) -> None:
        with self._lock:
            self._policy, self._offered_bps = policy, int(udp_mbps * 1e6)
            self._offered.clear()
            self._offered.labels(policy).set(self._offered_bps / 8)

    def delivered(self, counts: dict[str, int] | None, now: float) -> None:
        """s2's bytes per protocol at `now` (None: s2 could not be read). The previous step's series give
        way to this step's in one go, at the first rate measured in it: a scrape between the two would
        find no throughput at all."""
        last, last_at = self._last, self._last_at
        self._last, self._last_at = counts, now
        with self._lock:
            self._throughput.clear()     # only the current step's series stay exported: dashboards sum them
            if not (counts and last and self._policy):
                return
            for proto, nbytes in counts.items():
                if proto in last and nbytes >= last[proto]:
                    self._throughput.labels(f"{self._flow}/{proto}", proto, self._policy,
                                            str(self._offered_bps)).set((nbytes - last[proto]) / (now - last_at))

    def observe(self, line: str) -> None:
        """One line of the probe client's output."""
        rtt = irtt.live_rtt(line)
        with self._lock:
            if rtt is not None and self._policy:
                self._rtt.labels(self._policy).observe(rtt)


class LiveThroughput(StudyGauges):
    """The gauges, exported over HTTP, with s2 sampled each second and the probe's output followed."""

    def __init__(self, port: int = 9102, bridge: str = "s2", flow: str = "h1-h4"):
        super().__init__(flow)
        self._tailing = threading.Event()        # set: the current tail stops
        self._tails: list[threading.Thread] = []
        self._bridge = bridge
        self._stop = threading.Event()
        start_http_server(port, addr="127.0.0.1", registry=self.registry)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def probe(self, path: Path) -> None:
        """Follow the probe client's output at `path` (it may not exist yet) until the next probe or close()."""
        self._tailing.set()
        self._tailing = threading.Event()
        tail = threading.Thread(target=follow, args=(path, self._tailing, self.observe), daemon=True)
        tail.start()
        self._tails.append(tail)

    def close(self) -> None:
        self._stop.set()
        self._tailing.set()
        self._thread.join()
        for tail in self._tails:
            tail.join()

    def _run(self) -> None:
        while not self._stop.wait(1.0 - (time.monotonic() % 1.0)):
            done = subprocess.run(["ovs-ofctl", "--no-names", "-O", "OpenFlow13", "dump-flows", self._bridge],
                                  capture_output=True, text=True)
            self.delivered(parse_delivered(done.stdout) if done.returncode == 0 else None, time.monotonic())


def follow(path: Path, done: threading.Event, on_line: Callable[[str], None]) -> None:
    """Each whole line written to `path` (which may not exist yet), as it is written, until `done`."""
    while not path.exists():
        if done.wait(0.05):
            return
    with path.open(encoding="utf-8", errors="replace") as lines:
        partial = ""
        while True:
            partial += lines.readline()
            if partial.endswith("\n"):
                on_line(partial)
                partial = ""
            elif done.wait(0.05):       # nothing new: the writer has not finished its next line yet
                return
