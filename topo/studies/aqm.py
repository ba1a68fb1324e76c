"""Queue disciplines at the bottleneck:  topo/run.py aqm [--quick] [--disciplines D ...]

The study (docs/references.md, section 4) compared RED, SFQ and REM on an ns-2 dumbbell. Here: five TCP flows
sndI → rcvI at once through the 10 Mbit/s bottleneck of policy `dumbbell`, and a ping from snd1 to
rcv1 every 0.2 s for the delay under load, once per discipline on a fresh network; beside the ping,
the main study's latency probe (a voice call's packets, topo/net/probe.py) from snd1 to rcv1, so that
disciplines and reservations are read on one scale.

Where the discipline sits: OVS's classless QoS types (linux-sfq, linux-codel, linux-fq_codel) install
their qdisc as the port's root with no rate limit, so they cannot make a 10 Mbit/s bottleneck of a
veth. The study keeps OVS's linux-htb at the bottleneck rate and the policy names the discipline,
which the controller puts under the HTB class on both ends of the bottleneck; the class sets the
rate, the discipline decides which packet waits or is dropped. On the userspace datapath "fifo" is
a head-drop FIFO (controller/core/queues.py says why).
Disciplines the kernel lacks are reported as unavailable and not run; nothing stands in for them.
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from statistics import mean
from typing import Any

from controller.adapters.tc import ClassCounters
from controller.core.plan import htb_classid
from controller.core.policy import DISCIPLINES
from topo.harness import capabilities
from topo.harness.fidelity import Sample
from topo.harness.launch import Host
from topo.harness.report import Panel, bar_figure, jain_index, markdown_table, reasons_text
from topo.net import probe
from topo.net.traffic import Ping, Probe, Ran
from topo.studies.base import (
    Settings,
    Study,
    StudyError,
    Trial,
    TrialContext,
    UsageError,
    add_trial_arguments,
    common_window,
    equal_trial,
    faithful_cell,
    fidelity_notes,
    flows_of,
    measure,
    network_under,
    policy_document,
    received_mbps,
    say_unavailable,
    settings,
    trial_fidelity,
)
from topo.topos import BOTTLENECK, DumbbellTopo

PAIRS = 5                              # DumbbellTopo(n=5), as policies/dumbbell.yaml forwards
PING_INTERVAL = 0.2
QUEUED_CLASS = htb_classid(0)          # a fifo port has the one class; s1-eth1 carries the data, s2-eth1 the ACKs
# docs/references.md, section 4, as published (ns-2, 10 Mbit/s, 100 s).
PUBLISHED = {"RED": ("5.53", "60.03/67.25", "37157 / 151", "0.41", "59.45"),
             "SFQ": ("6.64", "60.03/90.01", "42554 / 56", "0.13", "68.08"),
             "REM": ("7.51", "60.03/92.96", "49117 / 66", "0.13", "78.58")}
_PING_REPLY = re.compile(r"^\[(\d+\.\d+)\].* time=([\d.]+) ms")
_PING_TOTALS = re.compile(r"(\d+) packets transmitted, (\d+) received")



@dataclass(frozen=True)
class Plan:
    setup: Settings
    documents: dict[str, dict]          # discipline → the dumbbell policy queued by it
    disciplines: list[str]
    cc: str


class AqmStudy(Study):
    name = "aqm"
    description = "Queue disciplines at a 10 Mbit/s bottleneck shared by five TCP flows."
    figure_name = "aqm.png"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        add_trial_arguments(p, seconds=30, quick_seconds=10, bottleneck="10Mbit", queue_packets=100)
        p.add_argument("--disciplines", nargs="+", choices=DISCIPLINES, metavar="NAME",
                       help=f"run only these, of {', '.join(DISCIPLINES)} (default: all this kernel has)")
        p.add_argument("--cc", default="cubic", metavar="ALG", help="the flows' TCP algorithm (default cubic)")

    def plan(self, args: argparse.Namespace) -> Plan:
        setup = settings(args)
        documents = {d: policy_document("dumbbell", setup.bottleneck_bps, setup.queue_packets, d) for d in DISCIPLINES}
        return Plan(setup, documents, list(args.disciplines or DISCIPLINES), args.cc)

    def trials(self, plan: Plan, host: Host) -> list[Trial]:
        _, lacking = capabilities.choose_tcp([plan.cc], capabilities.tcp_algorithms(), host.capabilities)
        if lacking:
            raise UsageError(f"--cc {plan.cc}: {lacking[plan.cc]}")
        absent = _absent(plan, host)
        say_unavailable("queue disciplines this kernel lacks, not run", absent)
        runnable = [d for d in plan.disciplines if d not in absent]
        if not runnable:
            raise UsageError("none of the requested disciplines is available in this kernel")
        return [Trial(d, d, plan.setup.seconds, partial(_one_discipline, d, plan)) for d in runnable]

    def summary(self, plan: Plan, host: Host, done: dict[str, dict], prometheus_url: str | None) -> dict[str, Any]:
        return {"scenario": plan.setup.scenario(
            policy="dumbbell", congestion_control=plan.cc, flows=[f"snd{i} -> rcv{i}" for i in range(1, PAIRS + 1)],
            placement=f"the queue under OVS linux-htb's class {QUEUED_CLASS} on both ends of the bottleneck, put "
                      "there by the controller from the policy's discipline; the HTB class holds the bottleneck "
                      "rate (OVS's classless linux-sfq/-codel/-fq_codel QoS types put the qdisc at the port's root "
                      "without a rate limit, so cannot shape it)",
            loss_rate="TCP retransmits / packets sent (bytes sent / MSS), from iperf3",
            delay=f"ping -i {PING_INTERVAL} snd1 -> rcv1 under load",
            backlog=f"{BOTTLENECK}'s queue, sampled every 0.25 s"),
            "environment": host.environment, "disciplines": done, "unavailable": _absent(plan, host)}

    def table(self, summary: dict[str, Any]) -> str:
        return table(summary)

    def figure(self, summary: dict[str, Any], path: Path) -> None:
        figure(summary, path)


def _absent(plan: Plan, host: Host) -> dict[str, str]:
    kinds = {d: tc_kind(d, host.datapath) for d in plan.disciplines}
    missing = capabilities.unavailable(host.capabilities, list(kinds.values()), "qdisc")
    return {d: missing[kind] for d, kind in kinds.items() if kind in missing}


def tc_kind(discipline: str, datapath: str) -> str:
    """The qdisc kind the controller puts under the class for `discipline` (controller/core/queues.py)."""
    if discipline == "fifo":
        return "pfifo_head_drop" if datapath == "user" else "pfifo"
    return discipline


def parse_ping(text: str) -> tuple[list[tuple[float, float]], int, int]:
    """(reply time, RTT ms) of each reply of `ping -D`, and the packets transmitted and received."""
    replies = [(float(m.group(1)), float(m.group(2))) for m in map(_PING_REPLY.match, text.splitlines()) if m]
    totals = _PING_TOTALS.search(text)
    return replies, int(totals.group(1)) if totals else 0, int(totals.group(2)) if totals else 0


def _link_bps(counted: list[tuple[float, ClassCounters]]) -> float | None:
    """What the bottleneck's class sent per second between its first and last sample (headers included).
    The receivers' means cannot say it: over a window of a few seconds a receiver that read late
    reports a burst, and on a busy host their sum exceeded the link by a fifth."""
    if len(counted) < 2 or counted[-1][0] <= counted[0][0]:
        return None
    (t0, first), (t1, last) = counted[0], counted[-1]
    return (last.bytes - first.bytes) * 8 / (t1 - t0)


def discipline_result(ran: list[Ran], span: tuple[float, float], bottleneck_bps: int,
                      samples: list[Sample], ping_text: str, queues_seen: set[str],
                      leaf_drops: int = 0, probed: Ran | None = None) -> dict[str, Any]:
    """Throughput, utilisation, loss, delay and backlog of one discipline's run, over `span`. A queue's
    drops are the most of its class's count and its own (`leaf_drops`): HTB counts what the queue
    refuses at enqueue, an AQM counts what it drops at dequeue too."""
    runs = flows_of(ran)
    flows = [received_mbps(run, span) for run in runs]
    docs = [run.require() for run in runs]
    sent_packets = sum(doc["end"]["sum_sent"]["bytes"] / doc["start"]["tcp_mss_default"] for doc in docs)
    retransmits = sum(doc["end"]["sum_sent"]["retransmits"] for doc in docs)
    counted = [(s.t, s.classes[QUEUED_CLASS]) for s in samples if QUEUED_CLASS in s.classes]
    inside = [(t, c) for t, c in counted if span[0] <= t <= span[1]]
    queued = [c for _, c in inside]
    replies, transmitted, received = parse_ping(ping_text)
    rtts = [rtt for t, rtt in replies if span[0] <= t <= span[1]]
    last: ClassCounters | None = counted[-1][1] if counted else None
    link = _link_bps(inside)
    return {
        "flows_mbps": flows, "throughput_mbps": None if link is None else round(link / 1e6, 3),
        "utilisation": None if link is None else round(link / bottleneck_bps, 3),
        "jain_index": round(jain_index(flows), 3) if any(flows) else None,
        "retransmits": retransmits, "packets_sent": round(sent_packets),
        "loss_rate": round(retransmits / sent_packets, 5) if sent_packets else None,
        "queue_drops": max(last.drops, leaf_drops) if last else None,
        "queue_packets_sent": last.packets if last else None,
        "delay_ms": {"min": min(rtts, default=None), "mean": _mean(rtts), "max": max(rtts, default=None),
                     "replies": len(rtts), "ping_transmitted": transmitted, "ping_received": received},
        "backlog": {"mean_packets": _mean([q.backlog_packets for q in queued]),
                    "max_packets": max((q.backlog_packets for q in queued), default=None),
                    "mean_bytes": _mean([q.backlog_bytes for q in queued]),
                    "max_bytes": max((q.backlog_bytes for q in queued), default=None), "samples": len(queued)},
        **(probe.summary(probe.round_trips(probed.doc), *span) if probed is not None and probed.doc else {}),
        "leaf_kinds_seen": sorted(queues_seen),
        "congestion_control": sorted({doc["end"].get("sender_tcp_congestion") for doc in docs}),
    }


def table(summary: dict[str, Any]) -> str:
    head = ["discipline", "throughput (Mbit/s)", "utilisation (%)", "loss rate (%)", "queue drops",
            "delay min/mean/max (ms)", "probe RTT median/p95 (ms), lost", "backlog mean/max (packets)",
            "Jain's index", "faithful"]
    rows = []
    for name, r in summary["disciplines"].items():
        delay, backlog = r["delay_ms"], r["backlog"]
        rows.append([name, r["throughput_mbps"], _percent(r["utilisation"]), _percent(r["loss_rate"]),
                     r["queue_drops"], "/".join(_num(delay[k]) for k in ("min", "mean", "max")), _probe_cell(r),
                     f"{_num(backlog['mean_packets'])}/{_num(backlog['max_packets'])}", r["jain_index"],
                     faithful_cell(r)])
    scenario = summary["scenario"]
    lines = [f"Measured: {PAIRS} {scenario['congestion_control']} flows through a {scenario['bottleneck'] / 1e6:g} "
             f"Mbit/s bottleneck (HTB class, discipline as its leaf, limit {scenario['queue_packets']} packets), "
             f"{scenario['seconds']:g} s each; loss rate = TCP retransmits / packets sent (iperf3).", "",
             markdown_table(head, rows) + fidelity_notes(summary["disciplines"])]
    if summary["unavailable"]:
        lines += [f"Not in this kernel, not run: {reasons_text(summary['unavailable'])}.", ""]
    lines += ["Published (docs/references.md, section 4; ns-2, 40 ms bottleneck delay, 100 s):", "",
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
        Panel("RTT under load (ms)", {"ping mean": [r["delay_ms"]["mean"] for r in rows],
                                      "ping max": [r["delay_ms"]["max"] for r in rows],
                                      "probe p95": [r.get("probe_rtt_ms", {}).get("p95") for r in rows]}),
        Panel("backlog (packets)", {"mean": [r["backlog"]["mean_packets"] for r in rows],
                                    "max": [r["backlog"]["max_packets"] for r in rows]}),
        Panel("loss rate (%)", {"retransmits / sent": [_scaled(r["loss_rate"], 100) for r in rows]}),
    ])


def _one_discipline(discipline: str, plan: Plan, ctx: TrialContext) -> dict[str, Any]:
    pairs = [(f"snd{i}", f"rcv{i}") for i in range(1, PAIRS + 1)]
    seconds = plan.setup.seconds
    flows = [{"name": f"{s}-{d}", "from": s, "to": d, "protocol": "tcp", "cc": plan.cc} for s, d in pairs]
    traffic = equal_trial(plan.setup, flows, probe={"from": "snd1", "to": "rcv1"})
    with network_under(ctx, DumbbellTopo(n=PAIRS), plan.documents[discipline], pairs) as net:
        ran, monitor = measure(ctx, net, traffic, plan.setup, [[Ping("ping", "snd1", "rcv1", seconds + 1,
                                                                     PING_INTERVAL)]])
    kind, seen = tc_kind(discipline, ctx.host.datapath), monitor.queues.get(QUEUED_CLASS, set())
    if seen != {kind}:
        raise StudyError(f"{BOTTLENECK}: the queue under {QUEUED_CLASS} was not {kind} throughout the run "
                         f"(seen: {sorted(seen) or 'nothing'})")
    span = common_window(ran, seconds)
    ping = next(r for r in ran if isinstance(r.item, Ping))
    probed = next(r for r in ran if isinstance(r.item, Probe))
    leaf_drops = monitor.leaf_drops.get(QUEUED_CLASS, 0)
    result = discipline_result(ran, span, plan.setup.bottleneck_bps, monitor.samples, ping.text or "", seen, leaf_drops,
                               probed)
    return {**result,
            **trial_fidelity(monitor.samples, span, plan.setup.bottleneck_bps, ran, leaf_drops=leaf_drops)}


def _probe_cell(result: dict[str, Any]) -> str:
    rtt = result.get("probe_rtt_ms")
    if not rtt:
        return "–"
    lost = result.get("probe_loss_percent")
    return f"{_num(rtt['median'])}/{_num(rtt['p95'])}, {'–' if lost is None else f'{lost:g} %'}"


def _mean(values: list[float]) -> float | None:
    return round(mean(values), 3) if values else None


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else round(value * factor, 3)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.2f}"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


STUDY = AqmStudy()
