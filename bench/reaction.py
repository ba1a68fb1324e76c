"""How fast `auto` answers a flood, measured on the switch, against real OVS and the real controller:

    sudo .venv/bin/python -m bench.reaction [--onsets 24] [--lone-seconds 600] [--idle-ports 1000]

On the study network (h1 → h4 through s1's 5 Mbit/s port, policy auto) one TCP flow runs while UDP
floods of 4-12 Mbit/s start one after another, each at a random phase against the controller's polls,
from a sender in h1 that notes when it sent its first packet. Everything is timed on the switch:

  reaction_seconds     the first flood packet sent → the first bytes in an HTB class of the
                       reservation (s1-eth1's class counters, read every 5 ms): steering took effect
  decision_seconds     the same to the controller's program decision (its log), for comparison
  recovery_seconds     the onset → the end of the first 0.1 s receiver interval at which TCP is back at
                       80 % of its reservation after the flood pushed it below (a dip that began before
                       the steering took effect; 0 when there was none)
  false_programs       program decisions during --lone-seconds of a lone TCP flow, cubic and bbr
  cpu_share_of_one_core  the controller and its children, with --idle-ports idle auto ports beside
                       it: while the flow runs alone, and over the onsets

Each figure is printed with its median, p95 and max. Ctrl-C removes the network, the bridges, the
controller and its rows.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.process import TICKS, controller_pid, cpu_ticks
from controller.adapters.tc import Tc
from topo.harness.controller import ControllerClient, controller
from topo.harness.host import Busy, HostLock
from topo.net import iperf
from topo.net.bridges import idle_bridges
from topo.net.network import Network, network
from topo.studies.base import check_path, policy_document, queues_in_force
from topo.studies.main import IDLE_PORTS_PER_BRIDGE, with_idle_ports
from topo.studies.main.episodes import recovery, steered_at
from topo.topos import BOTTLENECK, StudyTopo

CAPACITY, QUEUE = 5_000_000, 25
RESERVATION_MBPS, RECOVERED = 4.0, 0.8
FLOOD_SECONDS, SLOT_SECONDS = 3.0, 9.0       # a flood, then calm past the 3 s hold and the roll-back
SAMPLE_SECONDS = 0.005
SINK_PORT = 9000
SENDER = r'''
import socket, sys, time
rate, seconds, dst, port = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
payload, gap = b"\0" * 1472, 1500 * 8 / rate
start = time.time()
print(repr(start), flush=True)
n = 0
while time.time() - start < seconds:
    wait = start + n * gap - time.time()
    if wait > 0:
        time.sleep(wait)
    sock.sendto(payload, (dst, port))
    n += 1
'''
SINK = f"import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('0.0.0.0',{SINK_PORT}))\n" \
       "while True: s.recv(4096)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--onsets", type=int, default=24)
    p.add_argument("--lone-seconds", type=float, default=600, help="each of cubic and bbr alone (0: skip)")
    p.add_argument("--idle-ports", type=int, default=1000, help="idle auto ports under the same controller")
    p.add_argument("--cc", default="cubic", help="the TCP beside the floods")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, help="keep the samples and the controller's log here")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("run as root: it builds a Mininet network")
    lock = HostLock()
    try:
        record, _ = lock.acquire(Path("(bench/reaction.py)"))
    except Busy as err:
        sys.exit(f"error: {err}")
    try:
        with tempfile.TemporaryDirectory(prefix="ovsqos-reaction-") as tmp:
            out = args.out or Path(tmp)
            out.mkdir(parents=True, exist_ok=True)
            return run(args, out, record)
    except KeyboardInterrupt:
        print("interrupted: network, bridges, controller and queues removed", file=sys.stderr)
        return 130
    finally:
        record.close()
        lock.release()


def run(args, out: Path, record) -> int:
    rng = random.Random(args.seed)
    doc = policy_document("auto", CAPACITY, QUEUE)
    with controller(out / "controller.log", record) as client, \
            idle_bridges(args.idle_ports, IDLE_PORTS_PER_BRIDGE, record=record) as idle, \
            network(StudyTopo(), "user", record) as net:
        pid = controller_pid()
        client.wait(lambda s: len(s["switches"]) == 2 + len(idle), 120, "every switch connected")
        policy = with_idle_ports(doc, idle)
        client.put_policy(policy)
        from controller.core.policy import parse_policy
        client.wait(lambda s: queues_in_force(s, parse_policy(policy)), 60, "the queues in force")
        check_path(net, "h1", "h4")
        h4 = net.host("h4").IP()
        net.popen("h4", ["python3", "-c", SINK], out / "sink.txt")
        print(f"controller pid {pid}; {len(idle)} idle bridges beside the study's ({args.idle_ports} auto ports)",
              flush=True)

        sampler = ClassSampler()
        tcp_seconds = int(10 + args.onsets * SLOT_SECONDS + 5)
        tcp, tcp_start = _tcp(net, out, h4, 5301, tcp_seconds, args.cc)
        time.sleep(5)                                   # past slow start
        cpu0, at0 = cpu_ticks(pid), time.monotonic()
        time.sleep(5)
        cpu_lone = (cpu_ticks(pid) - cpu0) / TICKS / (time.monotonic() - at0)
        onsets = []
        cpu1, at1 = cpu_ticks(pid), time.monotonic()
        for k in range(args.onsets):
            time.sleep(rng.uniform(0, 1.0))             # a random phase against every poll
            rate = rng.choice((4e6, 6e6, 8e6, 10e6, 12e6))
            sender = net.popen("h1", ["python3", "-c", SENDER, str(rate), str(FLOOD_SECONDS), h4, str(SINK_PORT)],
                               out / f"udp{k}.txt")
            sender.wait(FLOOD_SECONDS + 10)
            onsets.append((rate, float((out / f"udp{k}.txt").read_text().split()[0])))
            time.sleep(max(0.0, SLOT_SECONDS - FLOOD_SECONDS - 1.0))
            print(f"  onset {k + 1}/{args.onsets}: UDP {rate / 1e6:g} Mbit/s", flush=True)
        cpu_onsets = (cpu_ticks(pid) - cpu1) / TICKS / (time.monotonic() - at1)
        tcp.wait(tcp_seconds + 60)
        sampler.stop()
        decisions = [d for d in client.status()["decisions"] if d["action"] == "program"]
        received = iperf.received(json.loads((out / "tcp-5301.json").read_text()))
        false = {cc: _false_programs(net, client, out, h4, 5310 + k, args.lone_seconds, cc)
                 for k, cc in enumerate(("cubic", "bbr")) if args.lone_seconds}
        client.clear_policy()
    results = [measure(rate, onset, sampler.samples, decisions, received, tcp_start) for rate, onset in onsets]
    (out / "onsets.json").write_text(json.dumps(results, indent=1))
    print(f"onsets                 {len(results)} (UDP 4-12 Mbit/s, TCP {args.cc}, random phase)")
    for name in ("reaction_seconds", "decision_seconds", "recovery_seconds"):
        print(f"{name:22} {_spread([r[name] for r in results])}")
    for cc, (count, seconds) in false.items():
        print(f"false_programs_{cc:7} {count} in {seconds:g} s of a lone {cc} flow")
    print(f"cpu_share_of_one_core  {cpu_lone:.3f} with the flow alone, {cpu_onsets:.3f} over the onsets "
          f"({args.idle_ports} idle auto ports beside)")
    return 0


class ClassSampler:
    """The bottleneck's HTB class byte counters every SAMPLE_SECONDS, in a thread of its own."""

    def __init__(self):
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tc = Tc()
        try:
            while not self._stop.wait(SAMPLE_SECONDS):
                self.samples.append((time.time(), {c: k.bytes for c, k in tc.classes(BOTTLENECK).items()}))
        finally:
            tc.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def measure(rate: float, onset: float, samples: list, decisions: list[dict], received: list,
            tcp_start: float) -> dict:
    """One onset, timed on the switch (class counters) and on the receiver (TCP's 0.1 s intervals)."""
    steered = steered_at(samples, onset)
    decided = next((d["time"] for d in decisions if d["time"] >= onset - 0.05), None)
    series = [{"t": i.start, "seconds": i.end - i.start, "tcp_mbps": i.bps / 1e6} for i in received]
    # The dip the flood caused, before the steering took effect, and TCP back at the bar after it.
    recovered = None if steered is None else recovery(series, onset - tcp_start, steered - tcp_start,
                                                      onset - tcp_start + FLOOD_SECONDS, RECOVERED * RESERVATION_MBPS)
    return {"udp_mbps": rate / 1e6, "onset": onset,
            "reaction_seconds": None if steered is None else round(steered - onset, 4),
            "decision_seconds": None if decided is None else round(decided - onset, 4),
            "recovery_seconds": None if recovered is None else round(recovered, 3)}


def _tcp(net: Network, out: Path, server: str, port: int, seconds: int, cc: str):
    """A TCP flow h1 → h4, and when it started (its receiver's intervals count from about then)."""
    net.popen("h4", iperf.server_args(port), out / f"tcp-{port}-server.json")
    time.sleep(0.5)
    started = time.time()
    return net.popen("h1", iperf.client_args(server, port, seconds, congestion_control=cc),
                     out / f"tcp-{port}.json"), started


def _false_programs(net: Network, client: ControllerClient, out: Path, server: str, port: int, seconds: float,
                    cc: str) -> tuple[int, float]:
    """Program decisions while one TCP flow runs alone, from its start (slow start included)."""
    started = time.time()
    _tcp(net, out, server, port, int(seconds), cc)[0].wait(seconds + 60)
    programs = [d for d in client.status()["decisions"] if d["action"] == "program" and d["time"] >= started]
    return len(programs), seconds


def _spread(values: list[float | None]) -> str:
    known = sorted(v for v in values if v is not None)
    if not known:
        return "none measured"
    p95 = known[min(len(known) - 1, int(round(0.95 * (len(known) - 1))))]
    missing = f", {len(values) - len(known)} not measured" if len(known) < len(values) else ""
    return f"median {statistics.median(known):.3f}  p95 {p95:.3f}  max {known[-1]:.3f}{missing}"


if __name__ == "__main__":
    sys.exit(main())
