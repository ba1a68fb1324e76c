"""Two flows sharing one bottleneck, and how fairly:  topo/run.py fairness [--quick] [--pairs A:B ...]

Cases (docs/references.md, section 3): two TCP flows of different algorithms at once, h1 → h4 and h2 → h3, for
every pair among cubic, reno and bbr that this kernel has; and one TCP flow against a UDP flow
offered at twice the bottleneck rate. Both flows share the single FIFO of policy `none`. Each
flow's throughput is what its receiver got over the run (past the first second); fairness is
Jain's index J = (Σx)² / (n·Σx²): 1 when the flows got the same, 1/n when one got everything.

The study is an experiment (topo/studies/experiment/) of one trial per case, written to the
results as experiment.yaml: `topo/run.py --experiment results/.../experiment.yaml` runs it again.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topo.harness import capabilities
from topo.harness.launch import Host
from topo.harness.report import Panel, bar_figure, jain_index, markdown_table, reasons_text
from topo.net.iperf import SenderNumbers
from topo.studies.base import (
    Settings,
    Trial,
    UsageError,
    add_trial_arguments,
    check_algorithms,
    equal_trial,
    faithful_cell,
    fidelity_notes,
    say_unavailable,
    settings,
)
from topo.studies.experiment import Experiment
from topo.studies.experiment.planning import Plan, keeping, study_experiment, study_plan
from topo.studies.experiment.summary import FlowScenario, FlowStep, TrialResult

MIXED_PAIRS = (("cubic", "reno"), ("bbr", "cubic"), ("bbr", "reno"))
FIRST, SECOND = ("h1", "h4"), ("h2", "h3")
# docs/references.md, section 3, as published (Mbit/s of each flow): the study's pairs were of one algorithm.
PUBLISHED = {"cubic vs cubic": (8.32, 1.61), "reno vs reno": (9.14, 0.154), "TCP vs UDP at 10 Mbit/s": (0.537, 9.30)}
VERSUS = "-vs-"       # a case's trial is named A-vs-B, its row "A vs B"


@dataclass(frozen=True)
class Extra:
    setup: Settings
    pairs: list[tuple[str, str]]
    tcp_vs_udp: str


class FairnessStudy(Experiment[dict[str, Any]]):
    """An experiment of one trial per case (study_experiment), with its own table."""
    name = "fairness"
    description = "Two flows through one FIFO bottleneck: throughputs and Jain's index."
    figure_name = "fairness.png"
    records = False

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
        check_algorithms("--pairs", [a for pair in pairs for a in pair])
        check_algorithms("--tcp-vs-udp", [args.tcp_vs_udp])
        udp = {"name": f"{'-'.join(SECOND)}_udp", "from": SECOND[0], "to": SECOND[1], "protocol": "udp",
               "rate": f"{2 * setup.bottleneck_bps / 1e6:g}Mbit"}
        cases = {f"{a}{VERSUS}{b}": [_flow(FIRST, a), _flow(SECOND, b)] for a, b in pairs}
        cases[f"{args.tcp_vs_udp}{VERSUS}UDP"] = [_flow(FIRST, args.tcp_vs_udp), udp]
        document = study_experiment(setup, "qosstudy", {}, {"queue_packets": setup.queue_packets}, [
            {"name": name, "traffic": equal_trial(setup, flows)} for name, flows in cases.items()])
        return study_plan(document, self.name, study=Extra(setup, pairs, args.tcp_vs_udp))

    def trials(self, plan: Plan, host: Host) -> list[Trial]:
        extra: Extra = plan.study
        lacking = _lacking(extra, host)
        if extra.tcp_vs_udp in lacking:
            raise UsageError(f"--tcp-vs-udp {extra.tcp_vs_udp}: {lacking[extra.tcp_vs_udp]}")
        say_unavailable("pairs with an algorithm this kernel lacks, skipped", _skipped(extra, lacking))
        return super().trials(keeping(plan, {t.name for t in plan.experiment.trials
                                             if not set(t.name.split(VERSUS)) & set(lacking)}), host)

    def summary(self, plan: Plan, host: Host, done: dict[str, TrialResult],
                prometheus_url: str | None) -> dict[str, Any]:
        extra: Extra = plan.study
        summary: dict[str, Any] = {**self.experiment_summary(plan, host, done, prometheus_url)}
        summary["scenario"] = {**summary["scenario"], **extra.setup.scenario(
            policy="none", udp_offered_mbps=2 * extra.setup.bottleneck_bps / 1e6,
            throughput="receiver's mean over the run, first second left out")}
        return {**summary, "cases": [case_result(name, res) for name, res in done.items()],
                "skipped": _skipped(extra, _lacking(extra, host))}

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


def case_result(name: str, res: TrialResult) -> dict[str, Any]:
    """A case's row, from its trial's result: each flow's throughput over the run (its one step) and
    their Jain's index, and the fidelity monitor's verdict."""
    (step,) = res["steps"]
    flows = [_flow_numbers(f, step["flows"][f["name"]], res["tcp"].get(f["name"])) for f in res["flows"]]
    rates = [f["mbps"] or 0.0 for f in flows]
    return {"name": name.replace(VERSUS, " vs "), "flows": flows,
            "jain_index": round(jain_index(rates), 3) if any(rates) else None, "window_s": step["window_s"],
            **dict(res["fidelity"] or {})}


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


def _lacking(extra: Extra, host: Host) -> dict[str, str]:
    wanted = sorted({a for pair in extra.pairs for a in pair} | {extra.tcp_vs_udp})
    return capabilities.choose_tcp(wanted, capabilities.tcp_algorithms(), host.capabilities)[1]


def _skipped(extra: Extra, lacking: dict[str, str]) -> dict[str, str]:
    return {f"{a} vs {b}": "; ".join(f"{x}: {lacking[x]}" for x in dict.fromkeys((a, b)) if x in lacking)
            for a, b in extra.pairs if a in lacking or b in lacking}


def _flow(ends: tuple[str, str], cc: str) -> dict[str, Any]:
    """A TCP flow between `ends` with congestion control `cc`, as a traffic file names it."""
    return {"name": f"{'-'.join(ends)}_{cc}", "from": ends[0], "to": ends[1], "protocol": "tcp", "cc": cc}


def _flow_numbers(flow: FlowScenario, step: FlowStep, sender: SenderNumbers | None) -> dict[str, Any]:
    numbers: dict[str, Any] = {"flow": f"{flow['from']} -> {flow['to']}", "mbps": step["mbps"]}
    if flow["protocol"] == "tcp":
        return {**numbers, "protocol": "tcp", "congestion_control": flow["cc"],
                "retransmits": sender["retransmits"] if sender else None}
    return {**numbers, "protocol": "udp", "offered_mbps": step["offered_mbps"], "lost_percent": step["lost_percent"]}


def _label(flow: dict[str, Any]) -> str:
    return flow["congestion_control"] if flow["protocol"] == "tcp" else f"UDP at {flow['offered_mbps']:g} Mbit/s"


def _index(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


STUDY = FairnessStudy()
