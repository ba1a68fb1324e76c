"""Two flows sharing one bottleneck, and how fairly:  topo/run.py fairness [--quick] [--pairs A:B ...]

Cases (docs/references.md, section 3): two TCP flows of different algorithms at once, h1 → h4 and h2 → h3, for
every pair among cubic, reno and bbr that this kernel has; and one TCP flow against a UDP flow
offered at twice the bottleneck rate. Both flows share the single FIFO of policy `shared`. Each
flow's throughput is what its receiver got while both ran (past the first second); fairness is
Jain's index J = (Σx)² / (n·Σx²): 1 when the flows got the same, 1/n when one got everything.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from topo.harness import capabilities
from topo.harness.launch import Host
from topo.harness.report import Panel, bar_figure, jain_index, markdown_table, reasons_text
from topo.net.traffic import Ran
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
    flows_of,
    measure,
    network_under,
    policy_document,
    received_mbps,
    say_unavailable,
    settings,
    trial_fidelity,
)
from topo.topos import StudyTopo

MIXED_PAIRS = (("cubic", "reno"), ("bbr", "cubic"), ("bbr", "reno"))
FIRST, SECOND = ("h1", "h4"), ("h2", "h3")
# docs/references.md, section 3, as published (Mbit/s of each flow): the study's pairs were of one algorithm.
PUBLISHED = {"cubic vs cubic": (8.32, 1.61), "reno vs reno": (9.14, 0.154), "TCP vs UDP at 10 Mbit/s": (0.537, 9.30)}


@dataclass(frozen=True)
class Plan:
    setup: Settings
    document: dict
    pairs: list[tuple[str, str]]
    tcp_vs_udp: str


class FairnessStudy(Study):
    name = "fairness"
    description = "Two flows through one FIFO bottleneck: throughputs and Jain's index."
    figure_name = "fairness.png"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        add_trial_arguments(p, seconds=30, quick_seconds=10, bottleneck="5Mbit", queue_packets=25)
        p.add_argument("--pairs", nargs="+", metavar="A:B",
                       help="TCP pairs to run, first on h1 → h4 (default: "
                            + " ".join(f"{a}:{b}" for a, b in MIXED_PAIRS) + ", those this kernel has)")
        p.add_argument("--tcp-vs-udp", default="cubic", metavar="ALG",
                       help="the TCP algorithm that meets the UDP flow (default cubic)")

    def plan(self, args: argparse.Namespace) -> Plan:
        setup = settings(args)
        pairs = parse_pairs(args.pairs) if args.pairs else list(MIXED_PAIRS)
        return Plan(setup, policy_document("shared", setup.bottleneck_bps, setup.queue_packets), pairs, args.tcp_vs_udp)

    def trials(self, plan: Plan, host: Host) -> list[Trial]:
        lacking = _lacking(plan, host)
        if plan.tcp_vs_udp in lacking:
            raise UsageError(f"--tcp-vs-udp {plan.tcp_vs_udp}: {lacking[plan.tcp_vs_udp]}")
        say_unavailable("pairs with an algorithm this kernel lacks, skipped", _skipped(plan, lacking))
        udp = {"name": f"{'-'.join(SECOND)}_udp", "from": SECOND[0], "to": SECOND[1], "protocol": "udp",
               "rate": f"{2 * plan.setup.bottleneck_bps / 1e6:g}Mbit"}
        cases = {f"{a} vs {b}": [_flow(FIRST, a), _flow(SECOND, b)]
                 for a, b in plan.pairs if a not in lacking and b not in lacking}
        cases[f"{plan.tcp_vs_udp} vs UDP"] = [_flow(FIRST, plan.tcp_vs_udp), udp]
        return [Trial(name, name.replace(" ", "_"), plan.setup.seconds,
                      partial(_one_case, name, equal_trial(plan.setup, flows), plan)) for name, flows in cases.items()]

    def summary(self, plan: Plan, host: Host, done: dict[str, dict], prometheus_url: str | None) -> dict[str, Any]:
        return {"scenario": plan.setup.scenario(policy="shared", udp_offered_mbps=2 * plan.setup.bottleneck_bps / 1e6,
                                                throughput="receiver's mean while both flows ran, first second "
                                                           "left out"),
                "environment": host.environment, "cases": list(done.values()),
                "skipped": _skipped(plan, _lacking(plan, host))}

    def table(self, summary: dict[str, Any]) -> str:
        return table(summary)

    def figure(self, summary: dict[str, Any], path: Path) -> None:
        figure(summary, path)


def parse_pairs(texts: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for text in texts:
        a, sep, b = text.partition(":")
        if not (sep and a and b) or ":" in b:
            raise UsageError(f"--pairs: {text!r} is not two algorithms as A:B, e.g. cubic:reno")
        pairs.append((a, b))
    return pairs


def case_result(name: str, ran: list[Ran], span: tuple[float, float]) -> dict[str, Any]:
    """Each flow's throughput over `span` (launcher clock) and their Jain's index."""
    flows = [_flow_numbers(r, span) for r in flows_of(ran)]
    rates = [f["mbps"] for f in flows]
    first = min(r.started for r in flows_of(ran))
    return {"name": name, "flows": flows, "jain_index": round(jain_index(rates), 3) if any(rates) else None,
            "window_s": [round(span[0] - first, 3), round(span[1] - first, 3)]}


def table(summary: dict[str, Any]) -> str:
    head = ["case", f"first flow ({' → '.join(FIRST)})", "Mbit/s", f"second flow ({' → '.join(SECOND)})",
            "Mbit/s", "Jain's index", "faithful"]
    rows = [[c["name"], _label(c["flows"][0]), c["flows"][0]["mbps"], _label(c["flows"][1]),
             c["flows"][1]["mbps"], _index(c["jain_index"]), faithful_cell(c)] for c in summary["cases"]]
    published = [[name, str(a), str(b), _index(round(jain_index((a, b)), 3))] for name, (a, b) in PUBLISHED.items()]
    scenario = summary["scenario"]
    lines = [f"Measured: both flows at once through a {scenario['bottleneck'] / 1e6:g} Mbit/s FIFO of "
             f"{scenario['queue_packets']} packets, {scenario['seconds']:g} s per case.", "",
             markdown_table(head, rows) + fidelity_notes({c["name"]: c for c in summary["cases"]})]
    if summary["skipped"]:
        lines += [f"Skipped: {reasons_text(summary['skipped'])}.", ""]
    lines += ["Published (docs/references.md, section 3; Jain's index computed here from the two rates):", "",
              markdown_table(["case", "flow 1 (Mbit/s)", "flow 2 (Mbit/s)", "Jain's index"], published)]
    return "\n".join(lines)


def figure(summary: dict[str, Any], path) -> None:
    cases = summary["cases"]
    bottleneck = summary["scenario"]["bottleneck"] / 1e6
    bar_figure(path, f"Two flows sharing a {bottleneck:g} Mbit/s FIFO bottleneck", [c["name"] for c in cases], [
        Panel("throughput (Mbit/s)",
              {f"first flow ({' → '.join(FIRST)})": [c["flows"][0]["mbps"] for c in cases],
               f"second flow ({' → '.join(SECOND)})": [c["flows"][1]["mbps"] for c in cases]},
              line=(bottleneck, "bottleneck"),
              annotations=[f"J = {_index(c['jain_index'])}" for c in cases]),
    ])


def _lacking(plan: Plan, host: Host) -> dict[str, str]:
    wanted = sorted({a for pair in plan.pairs for a in pair} | {plan.tcp_vs_udp})
    return capabilities.choose_tcp(wanted, capabilities.tcp_algorithms(), host.capabilities)[1]


def _skipped(plan: Plan, lacking: dict[str, str]) -> dict[str, str]:
    return {f"{a} vs {b}": "; ".join(f"{x}: {lacking[x]}" for x in dict.fromkeys((a, b)) if x in lacking)
            for a, b in plan.pairs if a in lacking or b in lacking}


def _flow(ends: tuple[str, str], cc: str) -> dict[str, Any]:
    """A TCP flow between `ends` with congestion control `cc`, as a traffic file names it."""
    return {"name": f"{'-'.join(ends)}_{cc}", "from": ends[0], "to": ends[1], "protocol": "tcp", "cc": cc}


def _one_case(name: str, traffic: dict[str, Any], plan: Plan, ctx: TrialContext) -> dict[str, Any]:
    with network_under(ctx, StudyTopo(), plan.document, [FIRST, SECOND]) as net:
        ran, monitor = measure(ctx, net, traffic, plan.setup)
    span = common_window(ran, plan.setup.seconds)
    return {**case_result(name, ran, span), **trial_fidelity(monitor.samples, span, plan.setup.bottleneck_bps, ran)}


def _flow_numbers(ran: Ran, span: tuple[float, float]) -> dict[str, Any]:
    flow, end = ran.flow, ran.require()["end"]
    numbers: dict[str, Any] = {"flow": f"{flow.src} -> {flow.dst}", "mbps": received_mbps(ran, span),
                               "start_delay_s": round(ran.started - ran.launched, 3)}
    if flow.udp_mbps is None:
        return {**numbers, "protocol": "tcp", "congestion_control": flow.congestion_control,
                "retransmits": end["sum_sent"]["retransmits"]}
    return {**numbers, "protocol": "udp", "offered_mbps": flow.udp_mbps, "lost_percent": end["sum"]["lost_percent"],
            "connect_restarts": ran.connect_restarts}


def _label(flow: dict[str, Any]) -> str:
    return flow["congestion_control"] if flow["protocol"] == "tcp" else f"UDP at {flow['offered_mbps']:g} Mbit/s"


def _index(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


STUDY = FairnessStudy()
