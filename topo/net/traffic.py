"""The traffic runner every study uses: iperf3 flows, pauses and pings across a network.

Traffic is a list of lanes that run at the same time; within a lane each item starts when the one
before it ends, so the main study's UDP steps follow each other without overlapping however late
a test's closing exchange comes through a congested queue. Every flow has its own iperf3 server.
Every process writes to a file under the trial's raw folder (topo/net/network.py says why), and
the JSON is read once the process has exited.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

from topo.net import iperf
from topo.net.network import Network

SLACK_SECONDS = 30.0      # beyond an item's length: a closing exchange through a full queue
POLL_SECONDS = 0.1


class TrafficError(RuntimeError):
    """A traffic tool failed or did not finish."""


@dataclass(frozen=True)
class Flow:
    name: str                          # label and raw file name
    src: str
    dst: str
    seconds: int
    udp_mbps: float | None = None      # None: TCP
    congestion_control: str | None = None
    parallel: int = 1                  # TCP streams in the one test (iperf3 -P)
    label: str = ""                    # for the progress bar


@dataclass(frozen=True)
class Pause:
    seconds: float
    label: str = ""


@dataclass(frozen=True)
class Ping:
    name: str
    src: str
    dst: str
    seconds: float
    interval: float = 0.2
    label: str = ""


Item = Union[Flow, Pause, Ping]


@dataclass
class Ran:
    """One item as it ran: launcher wall-clock times, and what it produced."""
    item: Item
    started: float
    ended: float
    doc: dict[str, Any] | None = None   # a flow's iperf3 client JSON (server output included)
    text: str | None = None             # a ping's output
    error: str | None = None            # why a flow's test failed (iperf3's own message)

    def require(self) -> dict[str, Any]:
        """The flow's JSON, or TrafficError when its test failed."""
        if self.error:
            raise TrafficError(self.error)
        return self.doc


def run(net: Network, lanes: list[list[Item]], raw_dir: Path,
        tick: Callable[[str, float], None] = lambda label, elapsed: None,
        on_start: Callable[[Item], None] = lambda item: None) -> list[Ran]:
    """Run every lane; returns what ran, in start order. `tick(label, elapsed)` about 10 times a second
    with the label of the item started last; `on_start(item)` as each item starts."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    flows = [item for lane in lanes for item in lane if isinstance(item, Flow)]
    ports = {flow.name: iperf.BASE_PORT + k for k, flow in enumerate(flows)}
    for flow in flows:
        net.popen(flow.dst, iperf.server_args(ports[flow.name]), raw_dir / f"{flow.name}.server.json")
    time.sleep(0.5)   # the servers listen
    t0 = time.time()
    cursors = [0] * len(lanes)
    running: dict[int, tuple[Ran, Any, float]] = {}   # lane → (record, process or None, deadline)
    done: list[Ran] = []
    label = ""
    while True:
        now = time.time()
        for k, lane in enumerate(lanes):
            if k in running:
                ran, proc, deadline = running[k]
                finished = proc.poll() is not None if proc else now >= ran.started + ran.item.seconds
                if not finished:
                    if now > deadline:
                        raise TrafficError(f"{_describe(ran.item)} did not finish within "
                                           f"{deadline - ran.started:g} s")
                    continue
                ran.ended = now
                del running[k]
            if cursors[k] < len(lane):
                item = lane[cursors[k]]
                cursors[k] += 1
                on_start(item)
                proc = _start(net, item, raw_dir, ports)
                ran = Ran(item, time.time(), 0.0)
                running[k] = (ran, proc, ran.started + item.seconds + SLACK_SECONDS)
                done.append(ran)
                label = item.label or label
        if not running:
            break
        tick(label, now - t0)
        time.sleep(POLL_SECONDS)
    for ran in done:
        _collect(ran, raw_dir)
    for stderr in raw_dir.glob("*.stderr"):
        if stderr.stat().st_size == 0:
            stderr.unlink()
    return done


def _start(net: Network, item: Item, raw_dir: Path, ports: dict[str, int]):
    if isinstance(item, Pause):
        return None
    if isinstance(item, Ping):
        return net.popen(item.src, ["ping", "-D", "-i", str(item.interval), "-w", f"{item.seconds:g}",
                                    net.host(item.dst).IP()], raw_dir / f"{item.name}.txt")
    return net.popen(item.src, iperf.client_args(net.host(item.dst).IP(), ports[item.name], item.seconds,
                                                 udp_mbps=item.udp_mbps, congestion_control=item.congestion_control,
                                                 parallel=item.parallel),
                     raw_dir / f"{item.name}.json")


def _collect(ran: Ran, raw_dir: Path) -> None:
    item = ran.item
    if isinstance(item, Ping):
        ran.text = (raw_dir / f"{item.name}.txt").read_text()
    elif isinstance(item, Flow):
        path = raw_dir / f"{item.name}.json"
        try:
            ran.doc = json.loads(path.read_text())
        except ValueError:
            stderr = path.with_name(path.name + ".stderr").read_text().strip()
            raise TrafficError(f"iperf3 wrote no JSON ({path.name}): {stderr[:200]}") from None
        if iperf.error(ran.doc):   # under a flood a test can fail on its own: the study decides what that costs
            ran.error = f"iperf3 failed ({path.name}): {iperf.error(ran.doc)}"
            return
        wanted, used = item.congestion_control, ran.doc.get("end", {}).get("sender_tcp_congestion")
        if wanted and used not in (wanted, FALLBACKS.get(wanted)):   # iperf3 reports what the socket really had
            raise TrafficError(f"{item.name}: asked for TCP {wanted}, the sender ran {used}")


# The name the kernel gives an algorithm in its own documented fallback: DCTCP on a connection that did
# not negotiate ECN runs as "dctcp-reno" (net/ipv4/tcp_dctcp.c). The study says so beside its numbers.
FALLBACKS = {"dctcp": "dctcp-reno"}


def _describe(item: Item) -> str:
    if isinstance(item, Flow):
        what = f"UDP {item.udp_mbps:g} Mbit/s" if item.udp_mbps is not None else "TCP"
        return f"{what} iperf3 {item.name} ({item.src} -> {item.dst})"
    return f"ping {item.name}" if isinstance(item, Ping) else "pause"
