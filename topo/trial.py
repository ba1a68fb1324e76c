"""One trial of the other studies (cc, fairness, aqm): a fresh network whose bottleneck queue is in
force, iperf3 flows across it, and the measurement window their means are taken over.

The network comes up as in the main study (topo/study.py, bring_up): both switches connected, the
policy put, its queues in force, the path checked. The policy states the bottleneck's queue (its
length and discipline), and the controller puts it under each HTB class.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from controller.tc import htb_classid
from topo import iperf
from topo.controller_client import ControllerClient
from topo.network import Network
from topo.study import StudyError, bring_up, check_path, collect, wait_for

DEFAULT_CLASS = htb_classid(0)    # OVS's linux-htb sends everything not steered elsewhere to queue 0
SETTLE_SECONDS = 1.0              # left out of every mean: connection set-up and slow start
FLOW_SLACK = 30.0                 # beyond a flow's length: closing exchanges through a full queue


@dataclass(frozen=True)
class Flow:
    name: str                     # label and raw file name
    src: str
    dst: str
    congestion_control: str | None = None
    udp_mbps: float | None = None


@dataclass(frozen=True)
class FlowRun:
    flow: Flow
    doc: dict[str, Any]           # the client's iperf3 JSON, server output included
    launched: float               # launcher clock when the client started


@dataclass(frozen=True)
class TrialContext:
    client: ControllerClient
    datapath: str                 # Mininet OVSSwitch datapath: "user" or "kernel"
    queue_packets: int            # FIFO limit of the bottleneck (txqueuelen and the pfifo leaf)
    raw_dir: Path                 # where this trial's iperf3 JSON goes
    tick: Callable[[str, float], None]   # progress: label, seconds since the flows started


@contextmanager
def trial(ctx: TrialContext, topo, document: dict, reach: list[tuple[str, str]]) -> Iterator[Network]:
    """`topo` up under `document`, each (src, dst) reachable."""
    with bring_up(ctx.client, topo, document, ctx.datapath) as net:
        for src, dst in reach:
            check_path(net, src, dst)
        yield net


def run_flows(net: Network, flows: list[Flow], seconds: float, raw_dir: Path,
              tick: Callable[[float], None]) -> list[FlowRun]:
    """All `flows` at once for `seconds`; `tick(elapsed)` about five times a second meanwhile."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    ports = [iperf.TCP_PORT + k for k in range(len(flows))]
    for flow, port in zip(flows, ports):
        net.popen(flow.dst, iperf.server_args(port))
    time.sleep(0.5)
    clients, launched = [], []
    for flow, port in zip(flows, ports):
        launched.append(time.time())
        clients.append(net.popen(flow.src, iperf.client_args(
            net.host(flow.dst).IP(), port, seconds, udp_mbps=flow.udp_mbps,
            congestion_control=flow.congestion_control)))
    wait_for(lambda: all(c.poll() is not None for c in clients), lambda: tick(time.time() - launched[0]),
             timeout=seconds + FLOW_SLACK, what="iperf3 flows")
    runs = [FlowRun(f, collect(c, raw_dir / f"{f.name}.json"), t) for f, c, t in zip(flows, clients, launched)]
    for run in runs:
        _check_congestion_control(run)
    return runs


def window(runs: list[FlowRun], seconds: float) -> tuple[float, float]:
    """When every flow was running, past its settling second (launcher clock)."""
    return max(r.launched for r in runs) + SETTLE_SECONDS, min(r.launched for r in runs) + seconds


def received_mbps(run: FlowRun, span: tuple[float, float]) -> float:
    """The receiver's mean rate over `span`."""
    bps = iperf.window_mean_bps(iperf.received(run.doc), run.launched, *span)
    return round((bps or 0.0) / 1e6, 3)


def _check_congestion_control(run: FlowRun) -> None:
    """A flow that asked for an algorithm must have run with it (iperf3 reports what the socket had)."""
    wanted, used = run.flow.congestion_control, run.doc.get("end", {}).get("sender_tcp_congestion")
    if wanted and used != wanted:
        raise StudyError(f"{run.flow.name}: asked for TCP {wanted}, the sender ran {used}")
