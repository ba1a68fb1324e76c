"""TCP congestion-control algorithms, one at a time:  topo/run.py cc [--quick] [--algorithms A ...]

The study (docs/references.md, section 2) ran one iperf3 flow per algorithm through a 10 Gbit/s tbf. On OVS's
userspace datapath a Gbit-class bottleneck is bound by the CPU, not by the queue, so the default here
is the main study's: one TCP flow h1 → h4 through the 5 Mbit/s FIFO of policy `none`, each algorithm
on a fresh network. --delay and --loss add netem to both directions of the h1–h4 path (docs/references.md
section 3 compares Reno and Cubic at 15 and 150 ms, with and without 1 % loss); a kernel without
netem refuses them (run it in the VM: topo/run.py vm -- cc --delay 150ms). Everything is read from
iperf3's JSON: the sender's per-interval cwnd and rttvar, its RTT summary and retransmits, and the
receiver's throughput.

The study is an experiment (topo/studies/experiment/) of one trial per algorithm, written to the
results as experiment.yaml: `topo/run.py --experiment results/.../experiment.yaml` runs it again.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topo.harness import capabilities
from topo.harness.launch import Host
from topo.harness.report import Panel, bar_figure, markdown_table
from topo.net import netem
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
from topo.studies.experiment.summary import TrialResult

# docs/references.md, section 2, as published (10 Gbit/s tbf): cwnd (packets), RTT (ms), RTT var (ms), Mbit/s.
PUBLISHED = {"bbr": (552.6, 82.7, 75.6, 1150), "cubic": (1276.5, 391.9, 156.1, 919),
             "reno": (835.5, 99.6, 77.3, 836), "bic": (2311.7, 1285.8, 770.4, 1181),
             "vegas": (306.9, 132.4, 137.2, 802)}
class CcStudy(Experiment[dict[str, Any]]):
    """An experiment of one trial per algorithm (study_experiment), with its own table."""
    name = "cc"
    description = "TCP congestion-control algorithms, one flow each through the bottleneck."
    figure_name = "cc.png"
    records = False

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
        if args.delay is not None and not netem.DELAY.match(args.delay):
            raise UsageError(f"--delay: {args.delay!r} is not a delay; write e.g. 15ms")
        if args.loss is not None and not 0 < args.loss < 100:
            raise UsageError(f"--loss: {args.loss:g} is not a percentage above 0 and below 100")
        check_algorithms("--algorithms", args.algorithms or [])
        # Every algorithm that may run; those this kernel lacks are left out once its capabilities are known.
        algorithms = args.algorithms or list(dict.fromkeys([*capabilities.STUDY_TCP, *capabilities.tcp_algorithms()]))
        path = {k: v for k, v in (("delay", args.delay), ("loss", args.loss)) if v is not None}
        document = study_experiment(setup, "qosstudy", path, {"queue_packets": setup.queue_packets}, [
            {"name": a, "traffic": equal_trial(setup, [_flow(a)])} for a in algorithms])
        return study_plan(document, self.name, path_rtt_seconds=2 * netem.delay_seconds(args.delay),
                          path_loss_percent=args.loss, study=Extra(setup, args.algorithms, args.delay, args.loss))

    def trials(self, plan: Plan, host: Host) -> list[Trial]:
        extra: Extra = plan.study
        if (extra.delay or extra.loss) and not host.environment["netem"]:
            raise UsageError("--delay/--loss need netem, which this kernel lacks; run the study in the VM: "
                             "python3 topo/run.py vm -- cc ...")
        algorithms, skipped = _chosen(plan, host)
        say_unavailable("TCP algorithms this kernel lacks, skipped", skipped)
        if not algorithms:
            raise UsageError(f"none of the requested algorithms is available here (see {capabilities.TCP_AVAILABLE})")
        return super().trials(keeping(plan, set(algorithms)), host)

    def summary(self, plan: Plan, host: Host, done: dict[str, TrialResult],
                prometheus_url: str | None) -> dict[str, Any]:
        extra: Extra = plan.study
        summary: dict[str, Any] = {**self.experiment_summary(plan, host, done, prometheus_url)}
        summary["scenario"] = {**summary["scenario"], **extra.setup.scenario(
            flow="h1 -> h4", policy="none", delay=extra.delay, loss_percent=extra.loss,
            rtt_variance="mean of iperf3's per-interval rttvar")}
        return {**summary, "algorithms": {name: _row(name, res) for name, res in done.items()},
                "skipped": _chosen(plan, host)[1]}

    def table(self, summary: dict[str, Any]) -> str:
        return table(summary)

    def figure(self, summary: dict[str, Any], path: Path) -> None:
        figure(summary, path)


@dataclass(frozen=True)
class Extra:
    setup: Settings
    algorithms: list[str] | None         # as asked for; None: every one the kernel offers
    delay: str | None
    loss: float | None


def _flow(algorithm: str) -> dict[str, Any]:
    return {"name": f"h1-h4_{algorithm}", "from": "h1", "to": "h4", "protocol": "tcp", "cc": algorithm}


def _chosen(plan: Plan, host: Host) -> tuple[list[str], dict[str, str]]:
    extra: Extra = plan.study
    return capabilities.choose_tcp(extra.algorithms, capabilities.tcp_algorithms(), host.capabilities)


def _row(name: str, res: TrialResult) -> dict[str, Any]:
    """An algorithm's row: its flow's sender numbers and the fidelity monitor's verdict."""
    return {**res["tcp"][f"h1-h4_{name}"], **dict(res["fidelity"] or {})}


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
