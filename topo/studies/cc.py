"""TCP congestion-control algorithms, one at a time:  topo/run.py cc [--quick] [--algorithms A ...]

The study (docs/references.md, section 2) ran one iperf3 flow per algorithm through a 10 Gbit/s tbf. On OVS's
userspace datapath a Gbit-class bottleneck is bound by the CPU, not by the queue, so the default here
is the main study's: one TCP flow h1 → h4 through the 5 Mbit/s FIFO of policy `none`, each algorithm
on a fresh network. --delay and --loss add netem to both directions of the h1–h4 path (docs/references.md
section 3 compares Reno and Cubic at 15 and 150 ms, with and without 1 % loss); a kernel without
netem refuses them (run it in the VM: topo/run.py vm -- cc --delay 150ms). Everything is read from
iperf3's JSON: the sender's per-interval cwnd and rttvar, its RTT summary and retransmits, and the
receiver's throughput.
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from statistics import mean
from typing import Any

from topo.harness import capabilities
from topo.harness.launch import Host
from topo.harness.report import Panel, bar_figure, markdown_table
from topo.studies.base import (
    Settings,
    Study,
    Trial,
    TrialContext,
    UsageError,
    add_trial_arguments,
    common_window,
    equal_trial,
    faithful_cell,
    fidelity_notes,
    measure,
    network_under,
    policy_document,
    say_unavailable,
    settings,
    trial_fidelity,
)
from topo.topos import StudyTopo

# docs/references.md, section 2, as published (10 Gbit/s tbf): cwnd (packets), RTT (ms), RTT var (ms), Mbit/s.
PUBLISHED = {"bbr": (552.6, 82.7, 75.6, 1150), "cubic": (1276.5, 391.9, 156.1, 919),
             "reno": (835.5, 99.6, 77.3, 836), "bic": (2311.7, 1285.8, 770.4, 1181),
             "vegas": (306.9, 132.4, 137.2, 802)}
_DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_DELAY_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def delay_seconds(delay: str | None) -> float:
    """'150ms' → 0.15 (None: no added delay)."""
    if delay is None:
        return 0.0
    found = _DELAY.match(delay)
    if not found:
        raise ValueError(f"{delay!r} is not a delay such as 150ms")
    number, unit = found.groups()
    return float(number) * _DELAY_UNIT[unit]


@dataclass(frozen=True)
class Plan:
    setup: Settings
    document: dict
    algorithms: list[str] | None
    delay: str | None
    loss: float | None


class CcStudy(Study):
    name = "cc"
    description = "TCP congestion-control algorithms, one flow each through the bottleneck."
    figure_name = "cc.png"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        add_trial_arguments(p, seconds=30, quick_seconds=8, bottleneck="5Mbit", queue_packets=25)
        p.add_argument("--algorithms", nargs="+", metavar="NAME",
                       help="run only these (default: every algorithm this kernel offers)")
        p.add_argument("--delay", help="one-way delay added to each direction of the h1–h4 path, e.g. 150ms "
                                       "(needs netem)")
        p.add_argument("--loss", type=float, help="loss in percent added to each direction of the path, e.g. 1 "
                                                  "(needs netem)")

    def plan(self, args: argparse.Namespace) -> Plan:
        setup = settings(args)
        if args.delay is not None and not _DELAY.match(args.delay):
            raise UsageError(f"--delay: {args.delay!r} is not a delay; write e.g. 15ms")
        if args.loss is not None and not 0 < args.loss < 100:
            raise UsageError(f"--loss: {args.loss:g} is not a percentage above 0 and below 100")
        return Plan(setup, policy_document("none", setup.bottleneck_bps, setup.queue_packets), args.algorithms,
                    args.delay, args.loss)

    def trials(self, plan: Plan, host: Host) -> list[Trial]:
        if (plan.delay or plan.loss) and not host.environment["netem"]:
            raise UsageError("--delay/--loss need netem, which this kernel lacks; run the study in the VM: "
                             "python3 topo/run.py vm -- cc ...")
        algorithms, skipped = capabilities.choose_tcp(plan.algorithms, capabilities.tcp_algorithms(),
                                                      host.capabilities)
        say_unavailable("TCP algorithms this kernel lacks, skipped", skipped)
        if not algorithms:
            raise UsageError(f"none of the requested algorithms is available here (see {capabilities.TCP_AVAILABLE})")
        return [Trial(a, a, plan.setup.seconds, partial(_one_algorithm, a, plan)) for a in algorithms]

    def summary(self, plan: Plan, host: Host, done: dict[str, dict], prometheus_url: str | None) -> dict[str, Any]:
        return {"scenario": plan.setup.scenario(flow="h1 -> h4", policy="none", delay=plan.delay,
                                                loss_percent=plan.loss,
                                                rtt_variance="mean of iperf3's per-interval rttvar"),
                "environment": host.environment, "algorithms": done,
                "skipped": capabilities.choose_tcp(plan.algorithms, capabilities.tcp_algorithms(),
                                                   host.capabilities)[1]}

    def table(self, summary: dict[str, Any]) -> str:
        return table(summary)

    def figure(self, summary: dict[str, Any], path: Path) -> None:
        figure(summary, path)


def _one_algorithm(algorithm: str, plan: Plan, ctx: TrialContext) -> dict[str, Any]:
    topo = StudyTopo(delay=plan.delay, loss=plan.loss)
    with network_under(ctx, topo, plan.document, [("h1", "h4")]) as net:
        flow = {"name": f"h1-h4_{algorithm}", "from": "h1", "to": "h4", "protocol": "tcp", "cc": algorithm}
        ran, monitor = measure(ctx, net, equal_trial(plan.setup, [flow]), plan.setup)
    return {**sender_metrics(ran[0].require()),
            **trial_fidelity(monitor.samples, common_window(ran, plan.setup.seconds), plan.setup.bottleneck_bps, ran,
                             2 * delay_seconds(plan.delay), plan.setup.queue_packets, plan.loss)}


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
            "throughput (Mbit/s)", "retransmits", "faithful"]
    rows = [[name, r["cwnd_mean_packets"], r["cwnd_max_packets"], r["rtt_mean_ms"], r["rttvar_mean_ms"],
             r["throughput_mbps"], r["retransmits"], faithful_cell(r)] for name, r in summary["algorithms"].items()]
    measured = markdown_table(head, rows) + fidelity_notes(summary["algorithms"])
    published = markdown_table(["algorithm", "cwnd (packets)", "RTT (ms)", "RTT var (ms)", "throughput (Mbit/s)"],
                               [[name, *map(str, values)] for name, values in PUBLISHED.items()])
    scenario = summary["scenario"]
    path = "".join([f", {scenario['delay']} one way" if scenario.get("delay") else "",
                    f", {scenario['loss_percent']:g} % loss each way" if scenario.get("loss_percent") else ""])
    lines = [f"Measured: one flow h1 → h4 through a {scenario['bottleneck'] / 1e6:g} Mbit/s FIFO of "
             f"{scenario['queue_packets']} packets{path}, {scenario['seconds']:g} s each.", "", measured]
    fallbacks = [f"{name} ran as {r['congestion_control']}" for name, r in summary["algorithms"].items()
                 if r.get("congestion_control") not in (None, name)]
    if fallbacks:
        lines += ["In the kernel's fallback: " + ", ".join(fallbacks) + " (DCTCP needs ECN marks, which this FIFO "
                  "does not set).", ""]
    if summary["skipped"]:
        lines += ["Not in this kernel, skipped: " + ", ".join(summary["skipped"]) + ".", ""]
    lines += ["Published (docs/references.md, section 2; a 10 Gbit/s tbf, so only the ranking compares):", "",
              published]
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


STUDY = CcStudy()
