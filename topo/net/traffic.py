"""The traffic runner every study uses: iperf3 flows, pauses, pings and irtt latency probes across a
network.

Traffic is a list of lanes that run at the same time; within a lane each item starts when the one
before it ends, so the main study's UDP steps follow each other without overlapping however late
a test's closing exchange comes through a congested queue. Every flow has its own iperf3 server.
Every process writes to a file under the trial's raw folder (topo/net/network.py says why), and
the JSON is read once the process has exited. A probe has an irtt server of its own, stopped when the
runner is done (irtt servers run until they are stopped).

iperf3 (3.12, and upstream still) opens a UDP test with one datagram each way and no retransmission:
the client sends its connect datagram, then sleeps in recv() on the UDP socket for up to 30 s
(SO_RCVTIMEO in iperf_udp_connect) and fails with "unable to read from stream socket: Resource
temporarily unavailable". A bottleneck's full FIFO drops that datagram now and then, and a UDP flow that
starts beside TCP's slow start meets one. The runner sees a UDP client asleep in the kernel's datagram
wait (the only blocking UDP recv an iperf3 sender makes) and, once it has slept longer than the
bottleneck can hold a packet, starts it again against a fresh server on a port of its own (the first
server is still tearing the failed test down, its listener closed for a moment), and says so in the
flow's record.

A test does not start when its client does: the client's TCP handshake and parameters cross the same
queue, and a SYN that a full FIFO drops is sent again only after a second (then two more). iperf3's
intervals count from the test's start, and its JSON dates that start to the whole second only, so the
runner watches each flow's server, a hundred times a second until it has, for the moment it takes the
test's data streams (the server's clock starts there) and dates the flow from that.

Under QoS a flow that cannot start, or dies, is a result, not an error: a UDP test whose connect datagram
was lost CONNECT_ATTEMPTS times (its class full from the start), a test that has not begun when its
planned time is over (its control connection unanswered: a link down on its path), one that fails on its
own (iperf3's error), wrote no JSON, or overran its time, is ended and its reason kept in its record
(Ran.error); its lane waits out the test's planned time, so what follows it in the lane starts when it
would have. A link taken down or up (LinkState) is an item too: Mininet's configLinkStatus, dated as it
is done.
"""
from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topo.net import iperf, probe
from topo.net.network import Network

SLACK_SECONDS = 30.0      # beyond an item's length: a closing exchange through a full queue
POLL_SECONDS = 0.1
START_POLL_SECONDS = 0.01  # while a flow's server has not yet taken its data streams
LISTEN_SECONDS = 5.0      # for a new iperf3 server to listen
EXIT_SECONDS = 2.0        # for the servers to exit once the runner is done
DATAGRAM_WAIT = "__skb_wait_for_more_packets"   # /proc/PID/wchan of a process blocked in a datagram recv
ESTABLISHED = "01"        # /proc/net/{tcp,udp}: a connected socket
CONNECT_ATTEMPTS = 3      # of a UDP test whose connect datagram got no reply
FRAME_BITS = 1514 * 8


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
    tos: int | None = None             # the IP TOS byte its packets carry (DSCP << 2)


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


@dataclass(frozen=True)
class Probe:
    """An isochronous flow measured with irtt (topo/net/probe.py): a voice call's packets every 20 ms."""
    name: str
    src: str
    dst: str
    seconds: float
    label: str = ""


@dataclass(frozen=True)
class LinkState:
    """The link between nodes `a` and `b` taken down or brought up, in Mininet's words (both its ends)."""
    a: str
    b: str
    up: bool
    seconds: float = 0.0
    label: str = ""

    @property
    def name(self) -> str:
        return f"{self.a}-{self.b} {'up' if self.up else 'down'}"


Item = Flow | Pause | Ping | Probe | LinkState


@dataclass
class Ran:
    """One item as it ran: launcher wall-clock times, and what it produced. A flow's `started` is when its
    server took the test's data streams (its intervals count from there); `launched`, when its client was."""
    item: Item
    started: float
    ended: float
    doc: dict[str, Any] | None = None   # a flow's iperf3 client JSON (server output included)
    text: str | None = None             # a ping's output
    error: str | None = None            # why a flow's test failed or never started (iperf3's, or the runner's)
    connect_restarts: int = 0           # times a UDP test was started again, its connect datagram lost
    launched: float = 0.0

    @property
    def flow(self) -> Flow:
        """The item, which must be an iperf3 flow."""
        if not isinstance(self.item, Flow):
            raise TypeError(f"{self.item} is not a flow")
        return self.item

    def require(self) -> dict[str, Any]:
        """The flow's JSON, or TrafficError when its test failed."""
        if self.error or self.doc is None:
            raise TrafficError(self.error or f"{self.item} left no result")
        return self.doc


def connect_seconds(bottleneck_bps: float, queue_packets: int) -> float:
    """How long a UDP client may wait for iperf3's connect reply before the runner counts the datagram
    lost: four times the longest a full queue of full-size frames takes to drain, at least a second."""
    return max(1.0, 4 * queue_packets * FRAME_BITS / bottleneck_bps)


@dataclass
class _Running:
    ran: Ran
    proc: Any                           # None for a pause, or for a flow that ended early (its lane waits)
    deadline: float
    until: float                        # when the item is planned to end: its lane goes on then, or later; a
                                        # flow whose test has not begun by then is given up
    asleep_since: float | None = None   # a UDP client in its connect wait, since when
    begun: bool = True                  # whether a flow's server has taken its data streams


def planned_seconds(lanes: list[list[Item]]) -> float:
    """How long the lanes take as planned: the longest lane's items one after the other."""
    return max((sum(item.seconds for item in lane) for lane in lanes), default=0.0)


def run(net: Network, lanes: list[list[Item]], raw_dir: Path, connect_wait: float,
        tick: Callable[[str, float], None] = lambda label, elapsed: None,
        on_start: Callable[[Item], None] = lambda item: None) -> list[Ran]:
    """Run every lane; returns what ran, in start order. `connect_wait`: seconds a UDP client may wait for
    its connect reply (connect_seconds()). `tick(label, elapsed)` about 10 times a second (100 while a flow
    starts) with the label of the item started last; `on_start(item)` as each item starts."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    servers = _Servers(net, raw_dir)
    try:
        for item in (item for lane in lanes for item in lane):
            if isinstance(item, Flow):
                servers.start(item)
            elif isinstance(item, Probe):
                servers.start_probe(item)
        servers.wait_listening()
        done = _drive(net, lanes, raw_dir, servers, connect_wait, tick, on_start)
    finally:
        servers.stop()
    for ran in done:
        _collect(ran, raw_dir)
    for stderr in raw_dir.glob("*.stderr"):
        if stderr.stat().st_size == 0:
            stderr.unlink()
    return done


def _drive(net: Network, lanes: list[list[Item]], raw_dir: Path, servers: _Servers, connect_wait: float,
           tick: Callable[[str, float], None], on_start: Callable[[Item], None]) -> list[Ran]:
    """Start each lane's items in turn until every lane is done."""
    t0 = time.time()
    cursors = [0] * len(lanes)
    running: dict[int, _Running] = {}
    done: list[Ran] = []
    label = ""
    while True:
        now = time.time()
        for k, lane in enumerate(lanes):
            if k in running:
                state = running[k]
                item = state.ran.item
                if state.proc is not None:
                    if state.proc.poll() is None:
                        if not state.begun and isinstance(item, Flow) and servers.serving(item):
                            state.ran.started, state.begun = time.time(), True
                        if now > state.deadline:
                            _give_up(state, f"{_describe(item)} did not finish within "
                                            f"{state.deadline - state.ran.launched:g} s")
                        elif not state.begun and now > state.until:
                            _give_up(state, _never_started(state))
                        elif _connect_lost(state, now, connect_wait):
                            if state.ran.connect_restarts + 1 < CONNECT_ATTEMPTS:
                                _restart(net, state, servers, raw_dir)
                            else:
                                _give_up(state, _never_started(state))
                        continue
                    state.ran.ended, state.proc = now, None
                if now < state.until:      # a pause, or a flow that ended before its time: its lane waits
                    continue
                if isinstance(item, Pause | LinkState):
                    state.ran.ended = now
                del running[k]
            if cursors[k] < len(lane):
                item = lane[cursors[k]]
                cursors[k] += 1
                on_start(item)
                proc = _start(net, item, raw_dir, servers.ports)
                launched = time.time()
                ran = Ran(item, launched, launched, launched=launched)
                running[k] = _Running(ran, proc, launched + item.seconds + SLACK_SECONDS, launched + item.seconds,
                                      begun=not isinstance(item, Flow))
                done.append(ran)
                label = item.label or label
        if not running:
            break
        tick(label, now - t0)
        time.sleep(POLL_SECONDS if all(s.begun for s in running.values()) else START_POLL_SECONDS)
    return done


class _Servers:
    """An iperf3 server for each flow, on a port of its own; a restarted flow gets a new one."""

    def __init__(self, net: Network, raw_dir: Path):
        self._net, self._raw_dir = net, raw_dir
        self.ports: dict[str, int] = {}
        self.pids: dict[str, int] = {}      # each flow's current server
        self._starting: list[tuple[Any, int, str]] = []   # (process, port, tcp or udp)
        self._all: list[Any] = []
        self._probes: list[Any] = []
        self._next = iperf.BASE_PORT

    def start(self, flow: Flow) -> None:
        port, self._next = self._next, self._next + 1
        suffix = f".{port}" if flow.name in self.ports else ""
        self.ports[flow.name] = port
        proc = self._net.popen(flow.dst, iperf.server_args(port), self._raw_dir / f"{flow.name}.server{suffix}.json")
        self.pids[flow.name] = proc.pid
        self._starting.append((proc, port, "tcp"))
        self._all.append(proc)

    def serving(self, flow: Flow) -> bool:
        """Whether `flow`'s current server has taken its test's data streams."""
        return _serving(self.pids[flow.name], self.ports[flow.name], flow)

    def start_probe(self, item: Probe) -> None:
        proc = self._net.popen(item.dst, probe.server_args(self._net.host(item.dst).IP()),
                               self._raw_dir / f"{item.name}.server.txt")
        self._starting.append((proc, probe.PORT, "udp"))
        self._probes.append(proc)

    def wait_listening(self) -> None:
        deadline = time.monotonic() + LISTEN_SECONDS
        for proc, port, protocol in self._starting:
            while not _listening(proc.pid, port, protocol):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise TrafficError(f"the {protocol} server for port {port} did not start listening")
                time.sleep(0.02)
        self._starting.clear()

    def stop(self) -> None:
        """Each iperf3 server's own exit once its test is over (its JSON written), else a kill; the irtt
        servers, which serve until stopped, at once."""
        for proc in self._probes:
            proc.terminate()
            proc.wait()
        deadline = time.monotonic() + EXIT_SECONDS
        for proc in self._all:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _restart(net: Network, state: _Running, servers: _Servers, raw_dir: Path) -> None:
    """The UDP test again, from its client's start, against a server of its own."""
    state.proc.terminate()
    state.proc.wait()
    item = state.ran.item
    assert isinstance(item, Flow), item      # only a UDP test is restarted (its connect datagram lost)
    servers.start(item)
    servers.wait_listening()
    state.proc = _start(net, item, raw_dir, servers.ports)
    state.ran.launched = state.ran.started = time.time()
    state.asleep_since, state.begun = None, False
    state.ran.connect_restarts += 1
    state.deadline = state.ran.started + item.seconds + SLACK_SECONDS


def _never_started(state: _Running) -> str:
    """Why a flow's test never began: its UDP connect datagram lost (a client asleep in its connect wait),
    or its connection to its server not answered."""
    if state.asleep_since is not None:
        return f"its connect datagram was lost {state.ran.connect_restarts + 1} times (its path's queue full, or a " \
               "link down): it never started"
    return f"it did not start within its {state.ran.item.seconds:g} s (its connection to its server was not answered)"


def _give_up(state: _Running, why: str) -> None:
    """The item ended now, `why` its record's error; its lane waits out its planned time."""
    state.ran.error = why
    state.proc.terminate()
    state.proc.wait()
    state.ran.ended, state.proc = time.time(), None


def _listening(pid: int, port: int, protocol: str = "tcp") -> bool:
    """Whether `pid`'s network namespace has a TCP socket listening on `port` (or a UDP one bound to it)."""
    return _sockets(pid, protocol, port, "0A" if protocol == "tcp" else "07") > 0   # LISTEN; bound UDP: CLOSE


def _serving(pid: int, port: int, flow: Flow) -> bool:
    """Whether the iperf3 server `pid` on `port` has taken `flow`'s data streams: beside its control
    connection, one TCP connection a stream, or its UDP socket connected to the client."""
    tcp = _sockets(pid, "tcp", port, ESTABLISHED)
    if flow.udp_mbps is not None:
        return tcp >= 1 and _sockets(pid, "udp", port, ESTABLISHED) >= 1
    return tcp >= 1 + flow.parallel


def _sockets(pid: int, protocol: str, port: int, state: str) -> int:
    """How many of `pid`'s namespace's sockets of `protocol` (v4 and v6) are bound to `port` in `state`."""
    count = 0
    for table in (protocol, protocol + "6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        fields = (line.split() for line in lines)
        count += sum(f[1].rsplit(":", 1)[1] == f"{port:04X}" and f[3] == state for f in fields)
    return count


def _connect_lost(state: _Running, now: float, wait: float) -> bool:
    """Whether a UDP client has slept in its connect wait longer than `wait`: its datagram or the reply lost."""
    item = state.ran.item
    if not isinstance(item, Flow) or item.udp_mbps is None:
        return False
    try:
        asleep = Path(f"/proc/{state.proc.pid}/wchan").read_text() == DATAGRAM_WAIT
    except OSError:
        asleep = False
    if not asleep:
        state.asleep_since = None
        return False
    state.asleep_since = state.asleep_since or now
    return now - state.asleep_since > wait


def _start(net: Network, item: Item, raw_dir: Path, ports: dict[str, int]):
    if isinstance(item, Pause):
        return None
    if isinstance(item, LinkState):
        net.link_state(item.a, item.b, item.up)
        return None
    if isinstance(item, Ping):
        return net.popen(item.src, ["ping", "-D", "-i", str(item.interval), "-w", f"{item.seconds:g}",
                                    net.host(item.dst).IP()], raw_dir / f"{item.name}.txt")
    if isinstance(item, Probe):
        return net.popen(item.src, probe.client_args(net.host(item.dst).IP(), item.seconds,
                                                     str(raw_dir / f"{item.name}.json")),
                         raw_dir / f"{item.name}.txt")
    return net.popen(item.src, iperf.client_args(net.host(item.dst).IP(), ports[item.name], item.seconds,
                                                 udp_mbps=item.udp_mbps, congestion_control=item.congestion_control,
                                                 parallel=item.parallel, tos=item.tos),
                     raw_dir / f"{item.name}.json")


def _collect(ran: Ran, raw_dir: Path) -> None:
    item = ran.item
    if isinstance(item, Ping):
        ran.text = (raw_dir / f"{item.name}.txt").read_text()
    elif isinstance(item, Probe):
        path = raw_dir / f"{item.name}.json"
        try:
            ran.doc = json.loads(path.read_text())
        except (OSError, ValueError):
            stderr = (raw_dir / f"{item.name}.txt.stderr").read_text().strip()
            ran.error = f"irtt wrote no JSON ({path.name}): {stderr[:200]}"
    elif isinstance(item, Flow):
        path = raw_dir / f"{item.name}.json"
        try:
            ran.doc = json.loads(path.read_text())
        except ValueError:
            stderr = path.with_name(path.name + ".stderr").read_text().strip()
            ran.error = ran.error or f"iperf3 wrote no JSON ({path.name}): {stderr[:200]}"
            return
        if ran.error or iperf.error(ran.doc):   # under QoS a test can fail: the study decides what that costs
            ran.error = ran.error or f"iperf3 failed ({path.name}): {iperf.error(ran.doc)}"
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
    if isinstance(item, Probe):
        return f"irtt probe {item.name} ({item.src} -> {item.dst})"
    return f"ping {item.name}" if isinstance(item, Ping) else "pause"
