"""Queue disciplines at the bottleneck:  topo/run.py aqm [--quick] [--disciplines D ...]

The study (STUDY.md section 4) compared RED, SFQ and REM on an ns-2 dumbbell. Here: five TCP flows
sndI → rcvI at once through the 10 Mbit/s bottleneck of policy `dumbbell`, and a ping from snd1 to
rcv1 every 0.2 s for the delay under load, once per discipline on a fresh network.

Where the discipline sits: OVS's classless QoS types (linux-sfq, linux-codel, linux-fq_codel) install
their qdisc as the port's root with no rate limit, so they cannot make a 10 Mbit/s bottleneck of a
veth. The study keeps OVS's linux-htb at the bottleneck rate and the policy names the discipline,
which the controller puts under the HTB class on both ends of the bottleneck; the class sets the
rate, the discipline decides which packet waits or is dropped. On the userspace datapath "fifo" is
a head-drop FIFO (controller/queues.py says why).
Disciplines the kernel lacks are reported as unavailable and not run; nothing stands in for them.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from dataclasses import dataclass, field
from functools import partial
from statistics import mean
from typing import Any

from topo import capabilities
from topo.fairness_study import jain_index
from topo.study import BOTTLENECK_IFACES, StudyError
from topo.study_command import (Settings, UsageError, choose_tcp, finish, guarded, launch, parser, policy,
                                run_trials, say_unavailable, settings, unavailable)
from topo.study_report import Panel, bar_figure, markdown_table, reasons_text
from topo.topos import DumbbellTopo
from topo.trial import DEFAULT_CLASS, Flow, FlowRun, TrialContext, received_mbps, run_flows, trial, window

PAIRS = 5                              # DumbbellTopo(n=5), as policies/dumbbell.yaml forwards
DISCIPLINES = ("fifo", "sfq", "codel", "fq_codel", "red")
SAMPLE_SECONDS = 0.5
PING_INTERVAL = 0.2
QUEUED_IFACE = BOTTLENECK_IFACES[0]    # s1-eth1 carries the data, s2-eth1 the ACKs
# STUDY.md section 4, as published (ns-2, 10 Mbit/s, 100 s).
PUBLISHED = {"RED": ("5.53", "60.03/67.25", "37157 / 151", "0.41", "59.45"),
             "SFQ": ("6.64", "60.03/90.01", "42554 / 56", "0.13", "68.08"),
             "REM": ("7.51", "60.03/92.96", "49117 / 66", "0.13", "78.58")}
_PING_REPLY = re.compile(r"^\[(\d+\.\d+)\].* time=([\d.]+) ms")
_PING_TOTALS = re.compile(r"(\d+) packets transmitted, (\d+) received")

PARSER = parser("aqm", "Queue disciplines at a 10 Mbit/s bottleneck shared by five TCP flows.",
                seconds=30, quick_seconds=10, bottleneck="10Mbit", queue_packets=100)
PARSER.add_argument("--disciplines", nargs="+", choices=DISCIPLINES, metavar="NAME",
                    help=f"run only these, of {', '.join(DISCIPLINES)} (default: all this kernel has)")
PARSER.add_argument("--cc", default="cubic", metavar="ALG", help="the flows' TCP algorithm (default cubic)")


@dataclass(frozen=True)
class LeafStats:
    """The bottleneck leaf qdisc's counters at one moment (`tc -s -j qdisc show`)."""
    kind: str
    backlog_bytes: int
    backlog_packets: int
    packets: int                       # sent so far
    drops: int


@dataclass
class QueueSampler:
    """`tc -s -j qdisc show dev <iface>` every SAMPLE_SECONDS, as often as poll() is called."""
    iface: str
    samples: list[tuple[float, LeafStats]] = field(default_factory=list)
    _due: float = 0.0

    def poll(self) -> None:
        now = time.time()
        if now < self._due:
            return
        self._due = now + SAMPLE_SECONDS
        shown = subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", self.iface], capture_output=True, text=True)
        leaf = parse_leaf(shown.stdout)
        if leaf is not None:
            self.samples.append((now, leaf))


def tc_kind(discipline: str, datapath: str) -> str:
    """The qdisc kind the controller puts under the class for `discipline` (controller/queues.py)."""
    if discipline == "fifo":
        return "pfifo_head_drop" if datapath == "user" else "pfifo"
    return discipline


def parse_leaf(tc_json: str, parent: str = DEFAULT_CLASS) -> LeafStats | None:
    """The qdisc attached under HTB class `parent`, from `tc -s -j qdisc show` output."""
    for qdisc in json.loads(tc_json or "[]"):
        if qdisc.get("parent") == parent:
            return LeafStats(qdisc["kind"], qdisc.get("backlog", 0), qdisc.get("qlen", 0), qdisc.get("packets", 0),
                             qdisc.get("drops", 0))
    return None


def parse_ping(text: str) -> tuple[list[tuple[float, float]], int, int]:
    """(reply time, RTT ms) of each reply of `ping -D`, and the packets transmitted and received."""
    replies = [(float(m.group(1)), float(m.group(2))) for m in map(_PING_REPLY.match, text.splitlines()) if m]
    totals = _PING_TOTALS.search(text)
    return replies, int(totals.group(1)) if totals else 0, int(totals.group(2)) if totals else 0


def discipline_result(runs: list[FlowRun], span: tuple[float, float], bottleneck_bps: int,
                      samples: list[tuple[float, LeafStats]], ping_text: str) -> dict[str, Any]:
    """Throughput, utilisation, loss, delay and backlog of one discipline's run, over `span`."""
    flows = [received_mbps(run, span) for run in runs]
    total = round(sum(flows), 3)
    sent_packets = sum(run.doc["end"]["sum_sent"]["bytes"] / run.doc["start"]["tcp_mss_default"] for run in runs)
    retransmits = sum(run.doc["end"]["sum_sent"]["retransmits"] for run in runs)
    queued = [leaf for t, leaf in samples if span[0] <= t <= span[1]]
    replies, transmitted, received = parse_ping(ping_text)
    rtts = [rtt for t, rtt in replies if span[0] <= t <= span[1]]
    last = samples[-1][1] if samples else None
    return {
        "flows_mbps": flows, "throughput_mbps": total, "utilisation": round(total * 1e6 / bottleneck_bps, 3),
        "jain_index": round(jain_index(flows), 3) if any(flows) else None,
        "retransmits": retransmits, "packets_sent": round(sent_packets),
        "loss_rate": round(retransmits / sent_packets, 5) if sent_packets else None,
        "queue_drops": last.drops if last else None, "queue_packets_sent": last.packets if last else None,
        "delay_ms": {"min": min(rtts, default=None), "mean": _mean(rtts), "max": max(rtts, default=None),
                     "replies": len(rtts), "ping_transmitted": transmitted, "ping_received": received},
        "backlog": {"mean_packets": _mean([q.backlog_packets for q in queued]),
                    "max_packets": max((q.backlog_packets for q in queued), default=None),
                    "mean_bytes": _mean([q.backlog_bytes for q in queued]),
                    "max_bytes": max((q.backlog_bytes for q in queued), default=None), "samples": len(queued)},
        "leaf_kinds_seen": sorted({leaf.kind for _, leaf in samples}),
        "congestion_control": sorted({run.doc["end"].get("sender_tcp_congestion") for run in runs}),
    }


def table(summary: dict[str, Any]) -> str:
    head = ["discipline", "throughput (Mbit/s)", "utilisation (%)", "loss rate (%)", "queue drops",
            "delay min/mean/max (ms)", "backlog mean/max (packets)", "Jain's index"]
    rows = []
    for name, r in summary["disciplines"].items():
        delay, backlog = r["delay_ms"], r["backlog"]
        rows.append([name, r["throughput_mbps"], _percent(r["utilisation"]), _percent(r["loss_rate"]),
                     r["queue_drops"], "/".join(_num(delay[k]) for k in ("min", "mean", "max")),
                     f"{_num(backlog['mean_packets'])}/{_num(backlog['max_packets'])}", r["jain_index"]])
    scenario = summary["scenario"]
    lines = [f"Measured: {PAIRS} {scenario['congestion_control']} flows through a {scenario['bottleneck'] / 1e6:g} "
             f"Mbit/s bottleneck (HTB class, discipline as its leaf, limit {scenario['queue_packets']} packets), "
             f"{scenario['seconds']:g} s each; loss rate = TCP retransmits / packets sent (iperf3).", "",
             markdown_table(head, rows)]
    if summary["unavailable"]:
        lines += [f"Not in this kernel, not run: {reasons_text(summary['unavailable'])}.", ""]
    lines += ["Published (STUDY.md section 4; ns-2, 40 ms bottleneck delay, 100 s):", "",
              markdown_table(["discipline", "throughput max (Mbit/s)", "delay min/max (ms)", "sent / lost packets",
                              "loss ratio (%)", "utilisation (%)"], [[n, *v] for n, v in PUBLISHED.items()])]
    return "\n".join(lines)


def figure(summary: dict[str, Any], path) -> None:
    """A group per discipline; those the kernel lacks stay as empty, labelled groups."""
    names = [*summary["disciplines"], *summary["unavailable"]]
    empty = {"throughput_mbps": None, "loss_rate": None, "delay_ms": {"mean": None, "max": None},
             "backlog": {"mean_packets": None, "max_packets": None}}
    rows = [summary["disciplines"].get(n, empty) for n in names]
    groups = [n if n in summary["disciplines"] else f"{n}\n(absent)" for n in names]
    bottleneck = summary["scenario"]["bottleneck"] / 1e6
    bar_figure(path, f"{PAIRS} TCP flows through a {bottleneck:g} Mbit/s bottleneck, per queue discipline", groups, [
        Panel("throughput (Mbit/s)", {"all flows": [r["throughput_mbps"] for r in rows]},
              line=(bottleneck, "bottleneck")),
        Panel("ping RTT under load (ms)", {"mean": [r["delay_ms"]["mean"] for r in rows],
                                           "max": [r["delay_ms"]["max"] for r in rows]}),
        Panel("backlog (packets)", {"mean": [r["backlog"]["mean_packets"] for r in rows],
                                    "max": [r["backlog"]["max_packets"] for r in rows]}),
        Panel("loss rate (%)", {"retransmits / sent": [_scaled(r["loss_rate"], 100) for r in rows]}),
    ])


def main(argv: list[str] | None = None) -> int:
    return guarded(lambda: _study(PARSER.parse_args(argv)))


def _study(args: argparse.Namespace) -> int:
    setup = settings(args)
    documents = {d: policy("dumbbell", setup, d) for d in DISCIPLINES}
    host = launch("aqm", setup)
    caps = host.capabilities
    _, lacking = choose_tcp([args.cc], capabilities.tcp_algorithms(), caps)
    if lacking:
        raise UsageError(f"--cc {args.cc}: {lacking[args.cc]}")
    wanted = list(args.disciplines or DISCIPLINES)
    missing = unavailable(caps, [tc_kind(d, host.datapath) for d in wanted], "qdisc")
    lacking_kinds = {d: missing[tc_kind(d, host.datapath)] for d in wanted if tc_kind(d, host.datapath) in missing}
    say_unavailable("queue disciplines this kernel lacks, not run", lacking_kinds)
    runnable = [d for d in wanted if d not in lacking_kinds]
    if not runnable:
        raise UsageError("none of the requested disciplines is available in this kernel")
    done = run_trials(host, setup, {d: partial(_one_discipline, d, args.cc, documents[d], setup) for d in runnable})
    summary = {"scenario": setup.scenario(
        policy="dumbbell", congestion_control=args.cc, flows=[f"snd{i} -> rcv{i}" for i in range(1, PAIRS + 1)],
        placement=f"leaf of OVS linux-htb's class {DEFAULT_CLASS} on {' and '.join(BOTTLENECK_IFACES)}; "
                  "the HTB class holds the bottleneck rate (OVS's classless linux-sfq/-codel/-fq_codel QoS "
                  "types put the qdisc at the port's root without a rate limit, so cannot shape it)",
        loss_rate="TCP retransmits / packets sent (bytes sent / MSS), from iperf3",
        delay=f"ping -i {PING_INTERVAL} snd1 -> rcv1 under load", backlog=f"{QUEUED_IFACE} leaf qdisc, sampled "
                                                                       f"every {SAMPLE_SECONDS} s"),
        "environment": host.environment, "disciplines": done, "unavailable": lacking_kinds}
    return finish(host.out, summary, table(summary), lambda path: figure(summary, path), "aqm.png")


def _one_discipline(discipline: str, cc: str, document: dict, setup: Settings, ctx: TrialContext) -> dict[str, Any]:
    pairs = [(f"snd{i}", f"rcv{i}") for i in range(1, PAIRS + 1)]
    sampler = QueueSampler(QUEUED_IFACE)
    with trial(ctx, DumbbellTopo(n=PAIRS), document, pairs) as net:
        ping = net.popen("snd1", ["ping", "-D", "-i", str(PING_INTERVAL), "-w", f"{setup.seconds + 1:g}",
                                  net.host("rcv1").IP()])

        def tick(elapsed: float) -> None:
            sampler.poll()
            ctx.tick(discipline, elapsed)

        runs = run_flows(net, [Flow(f"{s}-{d}", s, d, congestion_control=cc) for s, d in pairs], setup.seconds,
                         ctx.raw_dir, tick)
        ping_text = ping.communicate(timeout=10)[0]
    (ctx.raw_dir / "ping.txt").write_text(ping_text)
    kind = tc_kind(discipline, ctx.datapath)
    if {leaf.kind for _, leaf in sampler.samples} != {kind}:
        raise StudyError(f"{QUEUED_IFACE}: the leaf under {DEFAULT_CLASS} was not {kind} throughout the run "
                         f"(seen: {sorted({leaf.kind for _, leaf in sampler.samples}) or 'nothing'})")
    return discipline_result(runs, window(runs, setup.seconds), setup.bottleneck_bps, sampler.samples, ping_text)


def _mean(values: list[float]) -> float | None:
    return round(mean(values), 3) if values else None


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else round(value * factor, 3)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.2f}"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"
