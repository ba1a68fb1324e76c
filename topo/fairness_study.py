"""Two flows sharing one bottleneck, and how fairly:  topo/run.py fairness [--quick] [--pairs A:B ...]

Cases (STUDY.md section 3): two TCP flows of different algorithms at once, h1 → h4 and h2 → h3, for
every pair among cubic, reno and bbr that this kernel has; and one TCP flow against a UDP flow
offered at twice the bottleneck rate. Both flows share the single FIFO of policy `shared`. Each
flow's throughput is what its receiver got while both ran (past the first second); fairness is
Jain's index J = (Σx)² / (n·Σx²): 1 when the flows got the same, 1/n when one got everything.
"""
from __future__ import annotations

import argparse
from functools import partial
from typing import Any, Iterable

from topo import capabilities
from topo.study_command import (Settings, UsageError, choose_tcp, finish, guarded, launch, parser, policy,
                                run_trials, say_unavailable, settings)
from topo.study_report import Panel, bar_figure, markdown_table, reasons_text
from topo.topos import StudyTopo
from topo.trial import Flow, FlowRun, TrialContext, received_mbps, run_flows, trial, window

MIXED_PAIRS = (("cubic", "reno"), ("bbr", "cubic"), ("bbr", "reno"))
FIRST, SECOND = ("h1", "h4"), ("h2", "h3")
# STUDY.md section 3, as published (Mbit/s of each flow): the study's pairs were of one algorithm.
PUBLISHED = {"cubic vs cubic": (8.32, 1.61), "reno vs reno": (9.14, 0.154), "TCP vs UDP at 10 Mbit/s": (0.537, 9.30)}

PARSER = parser("fairness", "Two flows through one FIFO bottleneck: throughputs and Jain's index.",
                seconds=30, quick_seconds=10, bottleneck="5Mbit", queue_packets=25)
PARSER.add_argument("--pairs", nargs="+", metavar="A:B",
                    help="TCP pairs to run, first on h1 → h4 (default: "
                         + " ".join(f"{a}:{b}" for a, b in MIXED_PAIRS) + ", those this kernel has)")
PARSER.add_argument("--tcp-vs-udp", default="cubic", metavar="ALG",
                    help="the TCP algorithm that meets the UDP flow (default cubic)")


def jain_index(xs: Iterable[float]) -> float:
    """Jain's fairness index of the throughputs `xs`."""
    xs = list(xs)
    if not xs:
        raise ValueError("Jain's index of no flows is undefined")
    if any(x < 0 for x in xs):
        raise ValueError(f"throughputs cannot be negative: {xs}")
    squares = sum(x * x for x in xs)
    if squares == 0:
        raise ValueError("Jain's index is undefined when every flow got nothing")
    return sum(xs) ** 2 / (len(xs) * squares)


def parse_pairs(texts: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for text in texts:
        a, sep, b = text.partition(":")
        if not (sep and a and b) or ":" in b:
            raise UsageError(f"--pairs: {text!r} is not two algorithms as A:B, e.g. cubic:reno")
        pairs.append((a, b))
    return pairs


def case_result(name: str, runs: list[FlowRun], span: tuple[float, float]) -> dict[str, Any]:
    """Each flow's throughput over `span` (launcher clock) and their Jain's index."""
    flows = [_flow_numbers(run, span) for run in runs]
    rates = [f["mbps"] for f in flows]
    first = min(run.launched for run in runs)
    return {"name": name, "flows": flows, "jain_index": round(jain_index(rates), 3) if any(rates) else None,
            "window_s": [round(span[0] - first, 3), round(span[1] - first, 3)]}


def table(summary: dict[str, Any]) -> str:
    head = ["case", f"first flow ({' → '.join(FIRST)})", "Mbit/s", f"second flow ({' → '.join(SECOND)})",
            "Mbit/s", "Jain's index"]
    rows = [[c["name"], _label(c["flows"][0]), c["flows"][0]["mbps"], _label(c["flows"][1]),
             c["flows"][1]["mbps"], _index(c["jain_index"])] for c in summary["cases"]]
    published = [[name, str(a), str(b), _index(round(jain_index((a, b)), 3))] for name, (a, b) in PUBLISHED.items()]
    scenario = summary["scenario"]
    lines = [f"Measured: both flows at once through a {scenario['bottleneck'] / 1e6:g} Mbit/s FIFO of "
             f"{scenario['queue_packets']} packets, {scenario['seconds']:g} s per case.", "",
             markdown_table(head, rows)]
    if summary["skipped"]:
        lines += [f"Skipped: {reasons_text(summary['skipped'])}.", ""]
    lines += ["Published (STUDY.md section 3; Jain's index computed here from the two rates):", "",
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


def main(argv: list[str] | None = None) -> int:
    return guarded(lambda: _study(PARSER.parse_args(argv)))


def _study(args: argparse.Namespace) -> int:
    setup = settings(args)
    requested = parse_pairs(args.pairs) if args.pairs else list(MIXED_PAIRS)
    document = policy("shared", setup)
    host = launch("fairness", setup)
    caps = host.capabilities
    wanted = sorted({a for pair in requested for a in pair} | {args.tcp_vs_udp})
    _, lacking = choose_tcp(wanted, capabilities.tcp_algorithms(), caps)
    if args.tcp_vs_udp in lacking:
        raise UsageError(f"--tcp-vs-udp {args.tcp_vs_udp}: {lacking[args.tcp_vs_udp]}")
    skipped = {f"{a} vs {b}": "; ".join(f"{x}: {lacking[x]}" for x in dict.fromkeys((a, b)) if x in lacking)
               for a, b in requested if a in lacking or b in lacking}
    say_unavailable("pairs with an algorithm this kernel lacks, skipped", skipped)
    udp_mbps = 2 * setup.bottleneck_bps / 1e6
    cases = {f"{a} vs {b}": [Flow(f"{'-'.join(FIRST)}_{a}", *FIRST, congestion_control=a),
                             Flow(f"{'-'.join(SECOND)}_{b}", *SECOND, congestion_control=b)]
             for a, b in requested if a not in lacking and b not in lacking}
    cases[f"{args.tcp_vs_udp} vs UDP"] = [Flow(f"{'-'.join(FIRST)}_{args.tcp_vs_udp}", *FIRST,
                                               congestion_control=args.tcp_vs_udp),
                                          Flow(f"{'-'.join(SECOND)}_udp", *SECOND, udp_mbps=udp_mbps)]
    done = run_trials(host, setup, {name: partial(_one_case, name, flows, document, setup)
                                    for name, flows in cases.items()})
    summary = {"scenario": setup.scenario(policy="shared", udp_offered_mbps=udp_mbps,
                                          throughput="receiver's mean while both flows ran, first second left out"),
               "environment": host.environment, "cases": list(done.values()), "skipped": skipped}
    return finish(host.out, summary, table(summary), lambda path: figure(summary, path), "fairness.png")


def _one_case(name: str, flows: list[Flow], document: dict, setup: Settings, ctx: TrialContext) -> dict[str, Any]:
    with trial(ctx, StudyTopo(), document, [FIRST, SECOND]) as net:
        runs = run_flows(net, flows, setup.seconds, ctx.raw_dir, lambda elapsed: ctx.tick(name, elapsed))
    return case_result(name, runs, window(runs, setup.seconds))


def _flow_numbers(run: FlowRun, span: tuple[float, float]) -> dict[str, Any]:
    flow, end = run.flow, run.doc["end"]
    numbers: dict[str, Any] = {"flow": f"{flow.src} -> {flow.dst}", "mbps": received_mbps(run, span)}
    if flow.udp_mbps is None:
        return {**numbers, "protocol": "tcp", "congestion_control": flow.congestion_control,
                "retransmits": end["sum_sent"]["retransmits"]}
    return {**numbers, "protocol": "udp", "offered_mbps": flow.udp_mbps, "lost_percent": end["sum"]["lost_percent"]}


def _label(flow: dict[str, Any]) -> str:
    return flow["congestion_control"] if flow["protocol"] == "tcp" else f"UDP at {flow['offered_mbps']:g} Mbit/s"


def _index(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"
