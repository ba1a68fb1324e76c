"""One trial of the other studies (cc, fairness, aqm): a fresh network whose bottleneck queue is in
force, iperf3 flows across it, and the measurement window their means are taken over.

The network comes up as in the main study (topo/study.py, bring_up): both switches connected, the
policy put, its queues in force, the path checked. Then the leaf qdisc of the bottleneck's HTB default
class is set explicitly: the discipline under test for aqm, a pfifo of the chosen limit otherwise, so
what queues at the bottleneck is stated by the study rather than inherited from the device.
The leaf goes away with the network's interfaces.
"""
from __future__ import annotations

import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from controller.tc_filters import htb_classes, htb_classid
from topo import iperf
from topo.controller_client import ControllerClient
from topo.network import Network
from topo.study import BOTTLENECK_IFACES, StudyError, bring_up, check_path, collect, wait_for

DEFAULT_CLASS = htb_classid(0)    # OVS's linux-htb sends everything not steered elsewhere to queue 0
LEAF_HANDLE = "10:"
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


def fifo_leaf(queue_packets: int) -> list[str]:
    return ["pfifo", "limit", str(queue_packets)]


@contextmanager
def trial(ctx: TrialContext, topo, document: dict, leaf: list[str],
          reach: list[tuple[str, str]]) -> Iterator[Network]:
    """`topo` up under `document`, every bottleneck end queued by `leaf`, each (src, dst) reachable."""
    with bring_up(ctx.client, topo, document, ctx.datapath, ctx.queue_packets) as net:
        for iface in BOTTLENECK_IFACES:
            _set_leaf(iface, leaf)
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


def _set_leaf(iface: str, leaf: list[str]) -> None:
    deadline = time.monotonic() + 10
    while DEFAULT_CLASS not in htb_classes(iface):   # OVS builds the classes a moment after OVSDB
        if time.monotonic() > deadline:
            raise StudyError(f"{iface}: OVS did not build HTB class {DEFAULT_CLASS} within 10 s")
        time.sleep(0.1)
    done = subprocess.run(["tc", "qdisc", "replace", "dev", iface, "parent", DEFAULT_CLASS, "handle", LEAF_HANDLE,
                           *leaf], capture_output=True, text=True)
    if done.returncode != 0:
        raise StudyError(f"{iface}: tc refused leaf '{' '.join(leaf)}': {done.stderr.strip()}")


def _check_congestion_control(run: FlowRun) -> None:
    """A flow that asked for an algorithm must have run with it (iperf3 reports what the socket had)."""
    wanted, used = run.flow.congestion_control, run.doc.get("end", {}).get("sender_tcp_congestion")
    if wanted and used != wanted:
        raise StudyError(f"{run.flow.name}: asked for TCP {wanted}, the sender ran {used}")
