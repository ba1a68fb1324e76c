"""Queue disciplines at the bottleneck:  topo/run.py aqm [--quick] [--disciplines D ...]

The study (docs/references.md, section 4) compared RED, SFQ and REM on an ns-2 dumbbell. Here: five TCP flows
sndI → rcvI at once through the 10 Mbit/s bottleneck of topo/topos.py's dumbbell, and a ping from snd1 to
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

The study is an experiment (topo/studies/experiment/) of one trial per discipline, written to the
results as experiment.yaml: `topo/run.py --experiment results/.../experiment.yaml` runs it again.
"""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from controller.core.policy import DISCIPLINES
from topo.harness import capabilities
from topo.harness.launch import Host
from topo.harness.report import Panel, bar_figure, jain_index, markdown_table, reasons_text
from topo.studies.base import (
    Settings,
    StudyError,
    Trial,
    TrialContext,
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
from topo.studies.experiment.planning import Plan, keeping, study_experiment, study_plan, tc_kind
from topo.studies.experiment.summary import TrialResult

PAIRS = 5                              # DumbbellTopo(n=5)
PING_INTERVAL = 0.2
QUEUED_CLASS = "default"               # a fifo port's one class, as the experiment's results name it
# docs/references.md, section 4, as published (ns-2, 10 Mbit/s, 100 s).
PUBLISHED = {"RED": ("5.53", "60.03/67.25", "37157 / 151", "0.41", "59.45"),
             "SFQ": ("6.64", "60.03/90.01", "42554 / 56", "0.13", "68.08"),
             "REM": ("7.51", "60.03/92.96", "49117 / 66", "0.13", "78.58")}


@dataclass(frozen=True)
class Extra:
    setup: Settings
    disciplines: list[str]
    cc: str


class AqmStudy(Experiment[dict[str, Any]]):
    """An experiment of one trial per discipline (study_experiment), with its own table."""
    name = "aqm"
    description = "Queue disciplines at a 10 Mbit/s bottleneck shared by five TCP flows."
    figure_name = "aqm.png"
    records = False

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        add_trial_arguments(p, seconds=30, quick_seconds=10, bottleneck="10Mbit", queue_packets=100)
        p.add_argument("--disciplines", nargs="+", choices=DISCIPLINES, metavar="NAME",
                       help=f"run only these, of {', '.join(DISCIPLINES)} (default: all this kernel has)")
        p.add_argument("--cc", default="cubic", metavar="ALG", help="the flows' TCP algorithm (default cubic)")

    def plan(self, args: argparse.Namespace) -> Plan:
        setup = settings(args)
        check_algorithms("--cc", [args.cc])
        disciplines = list(dict.fromkeys(args.disciplines or DISCIPLINES))
        flows = [{"name": f"snd{i}-rcv{i}", "from": f"snd{i}", "to": f"rcv{i}", "protocol": "tcp", "cc": args.cc}
                 for i in range(1, PAIRS + 1)]
        traffic = equal_trial(setup, flows, probe={"from": "snd1", "to": "rcv1"},
                              ping={"from": "snd1", "to": "rcv1", "interval": PING_INTERVAL})
        document = study_experiment(setup, "dumbbell", {"n": PAIRS}, {"queue_packets": setup.queue_packets}, [
            {"name": d, "ports": {"discipline": d}, "traffic": traffic} for d in disciplines])
        return study_plan(document, self.name, study=Extra(setup, disciplines, args.cc))

    def trials(self, plan: Plan, host: Host) -> list[Trial]:
        extra: Extra = plan.study
        _, lacking = capabilities.choose_tcp([extra.cc], capabilities.tcp_algorithms(), host.capabilities)
        if lacking:
            raise UsageError(f"--cc {extra.cc}: {lacking[extra.cc]}")
        absent = _absent(extra, host)
        say_unavailable("queue disciplines this kernel lacks, not run", absent)
        runnable = {t.name for t in plan.experiment.trials if t.name not in absent}
        if not runnable:
            raise UsageError("none of the requested disciplines is available in this kernel")
        return [replace(t, run=partial(_checked, t.run, tc_kind(t.label, host.datapath)))
                for t in super().trials(keeping(plan, runnable), host)]

    def summary(self, plan: Plan, host: Host, done: dict[str, TrialResult],
                prometheus_url: str | None) -> dict[str, Any]:
        extra: Extra = plan.study
        summary: dict[str, Any] = {**self.experiment_summary(plan, host, done, prometheus_url)}
        summary["scenario"] = {**summary["scenario"], **extra.setup.scenario(
            policy="none", congestion_control=extra.cc, flows=[f"snd{i} -> rcv{i}" for i in range(1, PAIRS + 1)],
            placement="the queue under OVS linux-htb's one class on both ends of the bottleneck, put there by the "
                      "controller from the policy's discipline; the HTB class holds the bottleneck rate (OVS's "
                      "classless linux-sfq/-codel/-fq_codel QoS types put the qdisc at the port's root without a "
                      "rate limit, so cannot shape it)",
            loss_rate="TCP retransmits / packets sent (bytes sent / MSS), from iperf3",
            delay=f"ping -i {PING_INTERVAL} snd1 -> rcv1 under load",
            backlog="the bottleneck's queue, sampled every 0.25 s")}
        return {**summary, "disciplines": {d: discipline_result(res) for d, res in done.items()},
                "unavailable": _absent(extra, host)}

    def table(self, summary: dict[str, Any]) -> str:
        return table(summary)

    def figure(self, summary: dict[str, Any], path: Path) -> None:
        figure(summary, path)


def _checked(run, kind: str, ctx: TrialContext) -> TrialResult:
    """A discipline's trial, refused unless the discipline was the bottleneck's queue throughout."""
    res = run(ctx)
    port = (res["fidelity"] or {}).get("port")
    seen = res["leaves"].get(port, {}).get(QUEUED_CLASS, {}).get("kinds", [])
    if seen != [kind]:
        raise StudyError(f"{port}: the queue under the bottleneck's class was not {kind} throughout the run "
                         f"(seen: {seen or 'nothing'})")
    return res


def _absent(extra: Extra, host: Host) -> dict[str, str]:
    kinds = {d: tc_kind(d, host.datapath) for d in extra.disciplines}
    missing = capabilities.unavailable(host.capabilities, list(kinds.values()), "qdisc")
    return {d: missing[kind] for d, kind in kinds.items() if kind in missing}


def discipline_result(res: TrialResult) -> dict[str, Any]:
    """A discipline's row, from its trial's result (one step): throughput and utilisation at the
    bottleneck (its busiest port), loss, delay under load, backlog, Jain's index over the flows. A
    queue's drops are the most of its class's count and its own: HTB counts what the queue refuses at
    enqueue, an AQM counts what it drops at dequeue too."""
    (step,) = res["steps"]
    verdict = res["fidelity"]
    assert verdict is not None, "the study's bottleneck is queued: its verdict is there"
    use = step["ports"][verdict["port"]]
    queued: Mapping[str, Any] = use["classes"].get(QUEUED_CLASS, {})
    leaf: Mapping[str, Any] = res["leaves"].get(verdict["port"], {}).get(QUEUED_CLASS, {})
    flows = [step["flows"][f["name"]]["mbps"] or 0.0 for f in res["flows"]]
    senders = list(res["tcp"].values())
    sent = sum(s["packets_sent"] for s in senders)
    retransmits = sum(s["retransmits"] for s in senders)
    backlog = queued.get("backlog_packets", {})
    throughput = queued.get("mbps")
    return {
        "flows_mbps": flows, "throughput_mbps": throughput, "utilisation": use["utilisation"],
        "jain_index": round(jain_index(flows), 3) if any(flows) else None,
        "retransmits": retransmits, "packets_sent": sent,
        "loss_rate": round(retransmits / sent, 5) if sent else None,
        "queue_drops": max(queued.get("drops", 0), leaf.get("drops") or 0) if queued else None,
        "delay_ms": step["ping_rtt_ms"],
        "backlog": {"mean_packets": backlog.get("mean"), "max_packets": backlog.get("max"),
                    "samples": backlog.get("samples", 0)},
        **(step.get("probe") or {}),
        "leaf_kinds_seen": leaf.get("kinds", []),
        "congestion_control": sorted({c for s in senders if (c := s["congestion_control"])}),
        **verdict,
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


def _probe_cell(result: dict[str, Any]) -> str:
    rtt = result.get("probe_rtt_ms")
    if not rtt:
        return "–"
    lost = result.get("probe_loss_percent")
    return f"{_num(rtt['median'])}/{_num(rtt['p95'])}, {'–' if lost is None else f'{lost:g} %'}"


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else round(value * factor, 3)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.2f}"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


STUDY = AqmStudy()
