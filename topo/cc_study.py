"""TCP congestion-control algorithms, one at a time:  topo/run.py cc [--quick] [--algorithms A ...]

The study (STUDY.md section 2) ran one iperf3 flow per algorithm through a 10 Gbit/s tbf. On OVS's
userspace datapath a Gbit-class bottleneck is bound by the CPU, not by the queue, so the default here
is the main study's: one TCP flow h1 → h4 through the 5 Mbit/s FIFO of policy `none`, each algorithm
on a fresh network. Everything is read from iperf3's JSON: the sender's per-interval cwnd and rttvar,
its end-of-test RTT summary and retransmits, and the receiver's throughput.
"""
from __future__ import annotations

import argparse
from functools import partial
from statistics import mean
from typing import Any

from topo import capabilities
from topo.study_command import (Settings, UsageError, choose_tcp, finish, guarded, launch, parser, policy,
                                run_trials, say_unavailable, settings)
from topo.study_report import Panel, bar_figure, markdown_table
from topo.topos import StudyTopo
from topo.trial import Flow, TrialContext, run_flows, trial

# STUDY.md section 2, as published (10 Gbit/s tbf): cwnd (packets), RTT (ms), RTT var (ms), Mbit/s.
PUBLISHED = {"bbr": (552.6, 82.7, 75.6, 1150), "cubic": (1276.5, 391.9, 156.1, 919),
             "reno": (835.5, 99.6, 77.3, 836), "bic": (2311.7, 1285.8, 770.4, 1181),
             "vegas": (306.9, 132.4, 137.2, 802)}

PARSER = parser("cc", "TCP congestion-control algorithms, one flow each through the bottleneck.",
                seconds=30, quick_seconds=8, bottleneck="5Mbit", queue_packets=25)
PARSER.add_argument("--algorithms", nargs="+", metavar="NAME",
                    help="run only these (default: every algorithm this kernel offers)")


def sender_metrics(doc: dict[str, Any]) -> dict[str, Any]:
    """One TCP flow's numbers from its iperf3 client JSON (with --get-server-output).

    cwnd is iperf3's snd_cwnd (bytes) over the MSS; RTT figures are the kernel's smoothed RTT as iperf3
    sampled it; "RTT var" is the mean of the per-interval rttvar (the kernel's mean deviation of RTT).
    """
    mss = doc["start"]["tcp_mss_default"]
    streams = [i["streams"][0] for i in doc["intervals"] if not i["streams"][0].get("omitted")]
    sender = doc["end"]["streams"][0]["sender"]
    return {
        "throughput_mbps": round(doc["server_output_json"]["end"]["sum_received"]["bits_per_second"] / 1e6, 3),
        "rtt_mean_ms": sender["mean_rtt"] / 1000, "rtt_min_ms": sender["min_rtt"] / 1000,
        "rtt_max_ms": sender["max_rtt"] / 1000,
        "rttvar_mean_ms": round(mean(s["rttvar"] for s in streams) / 1000, 3),
        "cwnd_mean_packets": round(mean(s["snd_cwnd"] for s in streams) / mss, 1),
        "cwnd_max_packets": round(sender["max_snd_cwnd"] / mss, 1),
        "retransmits": doc["end"]["sum_sent"]["retransmits"],
        "mss_bytes": mss,
        "congestion_control": doc["end"].get("sender_tcp_congestion"),
    }


def table(summary: dict[str, Any]) -> str:
    head = ["algorithm", "cwnd mean (packets)", "cwnd max (packets)", "RTT mean (ms)", "RTT var (ms)",
            "throughput (Mbit/s)", "retransmits"]
    rows = [[name, r["cwnd_mean_packets"], r["cwnd_max_packets"], r["rtt_mean_ms"], r["rttvar_mean_ms"],
             r["throughput_mbps"], r["retransmits"]] for name, r in summary["algorithms"].items()]
    measured = markdown_table(head, rows)
    published = markdown_table(["algorithm", "cwnd (packets)", "RTT (ms)", "RTT var (ms)", "throughput (Mbit/s)"],
                               [[name, *map(str, values)] for name, values in PUBLISHED.items()])
    bottleneck = summary["scenario"]["bottleneck"] / 1e6
    lines = [f"Measured: one flow h1 → h4 through a {bottleneck:g} Mbit/s FIFO of "
             f"{summary['scenario']['queue_packets']} packets, {summary['scenario']['seconds']:g} s each.", "",
             measured]
    if summary["skipped"]:
        lines += ["Not in this kernel, skipped: " + ", ".join(summary["skipped"]) + ".", ""]
    lines += ["Published (STUDY.md section 2; a 10 Gbit/s tbf, so only the ranking compares):", "", published]
    return "\n".join(lines)


def figure(summary: dict[str, Any], path) -> None:
    names = list(summary["algorithms"])
    rows = [summary["algorithms"][n] for n in names]
    bottleneck = summary["scenario"]["bottleneck"] / 1e6
    bar_figure(path, f"One TCP flow per algorithm, {bottleneck:g} Mbit/s FIFO bottleneck", names, [
        Panel("throughput (Mbit/s)", {"throughput": [r["throughput_mbps"] for r in rows]},
              line=(bottleneck, "bottleneck")),
        Panel("RTT (ms)", {"mean": [r["rtt_mean_ms"] for r in rows], "max": [r["rtt_max_ms"] for r in rows]}),
    ])


def main(argv: list[str] | None = None) -> int:
    return guarded(lambda: _study(PARSER.parse_args(argv)))


def _study(args: argparse.Namespace) -> int:
    setup = settings(args)
    document = policy("none", setup)
    host = launch("cc", setup)
    caps = host.capabilities
    algorithms, skipped = choose_tcp(args.algorithms, capabilities.tcp_algorithms(), caps)
    say_unavailable("TCP algorithms this kernel lacks, skipped", skipped)
    if not algorithms:
        raise UsageError(f"none of the requested algorithms is available here (see {capabilities.TCP_AVAILABLE})")
    measured = run_trials(host, setup, {a: partial(_one_algorithm, a, document, setup) for a in algorithms})
    summary = {"scenario": setup.scenario(flow="h1 -> h4", policy="none",
                                          rtt_variance="mean of iperf3's per-interval rttvar"),
               "environment": host.environment, "algorithms": measured, "skipped": skipped}
    return finish(host.out, summary, table(summary), lambda path: figure(summary, path), "cc.png")


def _one_algorithm(algorithm: str, document: dict, setup: Settings, ctx: TrialContext) -> dict[str, Any]:
    with trial(ctx, StudyTopo(), document, [("h1", "h4")]) as net:
        [run] = run_flows(net, [Flow(f"h1-h4_{algorithm}", "h1", "h4", congestion_control=algorithm)],
                          setup.seconds, ctx.raw_dir, lambda elapsed: ctx.tick(f"TCP {algorithm}", elapsed))
    return sender_metrics(run.doc)
