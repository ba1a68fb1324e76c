"""An experiment's summary as a reader sees it: table.md and the figures.

The table: each flow's goodput per step (✗ where its test did not start or died, the reason under the
table; † where the host's CPU was short), or, where the trials have more flows than a table can show,
each trial's aggregate; each trial's aggregate goodput and its fraction of the non-blocking trial's,
when one ran; the probe's round trips; each bottleneck's classes; what the controller decided. A step
whose start changed a link says so beside its number, in the tables and the figures.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from topo.harness.report import Panel, bar_figure, markdown_table
from topo.studies.base import SETTLE_SECONDS, fidelity_notes
from topo.studies.experiment.reducing import STARVED_PRESSURE
from topo.studies.experiment.summary import ExperimentSummary, FlowStep, PortStep, TrialResult

LOADED = 0.25               # a queued port this busy (of its capacity) at some step is a bottleneck in the results
BOTTLENECK_FIGURE = "bottlenecks.png"
AFTER = "after"              # the row of the time after the last step, when a flow runs on
MAX_FLOW_COLUMNS = 12        # more flows than this (all trials together) and the table shows aggregates only
FAILED, STARVED = " ✗", " †"


def table(summary: ExperimentSummary) -> str:
    trials = summary["trials"]
    labels = [_label(k, summary) for k in periods(summary)]
    scenario = summary["scenario"]
    after = " (after: from the last step to the last flow's end)" if AFTER in periods(summary) else ""
    window = f"each step of {scenario['step_seconds']} s past its first {SETTLE_SECONDS:g} s{after}"
    lines: list[str] = []
    if _per_flow(summary):
        head = ["step"] + [f"{t}: {f['name']}" for t, res in trials.items() for f in res["flows"]]
        rows = [[label, *(_flow_cell(res["steps"][k]["flows"][f["name"]], res["steps"][k]["starved"])
                          for res in trials.values() for f in res["flows"])] for k, label in enumerate(labels)]
        lines += [f"Goodput per flow (Mbit/s), {window}, on {scenario['topo']}:", "", markdown_table(head, rows)]
    if not _per_flow(summary) or _reference(summary):
        lines += [_aggregates(summary, labels, window), ""]
    if any(s["starved"] for res in trials.values() for s in res["steps"]):
        lines.append(f"† the host's CPU was short (pressure above {STARVED_PRESSURE:.0%}): the emulator, not the "
                     "policy, may have decided that step.\n")
    failures = _failures(summary)
    if failures:
        lines += ["✗ a flow that did not start, or stopped, in that step (its goodput is what it delivered):",
                  *failures, ""]
    notes = fidelity_notes({t: v for t, res in trials.items() if (v := res["fidelity"]) is not None})
    if notes:
        lines.append(notes)
    if any("probe" in s for res in trials.values() for s in res["steps"]):
        trips: list[list[Any]] = [[label, *(_rtt(res["steps"][k].get("probe")) for res in trials.values())]
                                  for k, label in enumerate(labels)]
        if any("probe_unloaded" in res for res in trials.values()):
            trips.insert(0, ["alone", *(_rtt(res.get("probe_unloaded")) for res in trials.values())])
        lines += ["The probe's round-trip time, median / p95 (ms), and its packets lost (alone: on the idle path "
                  "before the flows):", "", markdown_table(["step", *trials], trips)]
    ports = loaded_ports(summary)
    if ports:
        fabric = _on_the_topology(summary)
        uses: list[list[Any]] = [[label, port, *(_port_cell(res["steps"][k]["ports"].get(port))
                                                 for res in fabric.values())]
                                 for port in ports for k, label in enumerate(labels)]
        lines += ["Each bottleneck (a queued port at least a quarter busy at some step), per step: its use of its "
                  "capacity, and each class's Mbit/s (packets it dropped):", "",
                  markdown_table(["step", "port", *fabric], uses)]
    for t, res in trials.items():
        for d in res["decisions"]:
            what = f"traffic to {d['host']} moved from port {d['port']} to {d['to_port']}" if d["action"] == "move" \
                else f"port {d['port']} {d['action']}"
            lines.append(f"- {t}: switch {d['dp_id']} {what} at {d['at_s']:.2f} s ({d['reason']})")
    return "\n".join(lines) + "\n"


def _aggregates(summary: ExperimentSummary, labels: list[str], window: str) -> str:
    """Each trial's flows together per step and over the steps; with a non-blocking trial, each one's
    share of what the hosts got on it."""
    trials = summary["trials"]
    reference = _reference(summary)
    steps = range(len(labels))
    rows: list[list[Any]] = []
    for k in [*steps, None]:
        row: list[Any] = [labels[k] if k is not None else "mean"]
        base = _aggregate(trials[reference], k) if reference else None
        for res in trials.values():
            value = _aggregate(res, k)
            share = f" ({value / base:.2f})" if value is not None and base and not res["nonblocking"] else ""
            starved = STARVED if k is not None and k < len(res["steps"]) and res["steps"][k]["starved"] else ""
            row.append(("–" if value is None else f"{value:.2f}{share}") + starved)
        rows.append(row)
    held = f", and (in brackets) its fraction of the non-blocking trial's ({reference})" if reference else ""
    return "\n".join([f"Aggregate goodput (Mbit/s: every flow of the trial together), {window}{held}:", "",
                      markdown_table(["step", *trials], rows)])


def _aggregate(res: TrialResult, k: int | None) -> float | None:
    """The trial's aggregate at step `k`, or its mean over the steps it has one (k None)."""
    if k is not None:
        return res["steps"][k]["aggregate_mbps"] if k < len(res["steps"]) else None
    values = [s["aggregate_mbps"] for s in res["steps"] if s["aggregate_mbps"] is not None]
    return sum(values) / len(values) if values else None


def _reference(summary: ExperimentSummary) -> str | None:
    """The non-blocking trial the others are held to, if one ran."""
    return next((t for t, res in summary["trials"].items() if res["nonblocking"]), None)


def _per_flow(summary: ExperimentSummary) -> bool:
    return sum(len(res["flows"]) for res in summary["trials"].values()) <= MAX_FLOW_COLUMNS


def _failures(summary: ExperimentSummary) -> list[str]:
    """One line per trial and flow whose test failed, with the steps it failed in and why."""
    lines = []
    for t, res in summary["trials"].items():
        for f in res["flows"]:
            failed = [(k, s["flows"][f["name"]]["failed"]) for k, s in enumerate(res["steps"])
                      if "failed" in s["flows"][f["name"]]]
            for why in dict.fromkeys(w for _, w in failed):
                at = ", ".join(str(k) for k, w in failed if w == why)
                lines.append(f"- {t}: {f['name']} (step {at}): {why}")
    return lines


def periods(summary: ExperimentSummary) -> list[int | str]:
    """The results' rows: each step by its number, then `after` if a flow ran past the last step."""
    steps = summary["scenario"]["steps"]
    count = max((len(res["steps"]) for res in summary["trials"].values()), default=steps)
    return [*range(steps), *([AFTER] if count > steps else [])]


def _label(k: int | str, summary: ExperimentSummary) -> str:
    """A step's row: its number, and the links its start changed (in any trial)."""
    changed = dict.fromkeys(f"{'-'.join(e['link'])} {e['state']}" for res in summary["trials"].values()
                            for e in res["events"] if e["at_step"] == k)
    return f"{k} ({', '.join(changed)})" if changed else str(k)


def _on_the_topology(summary: ExperimentSummary) -> dict[str, TrialResult]:
    """The trials run on the topology: a non-blocking trial's one switch has ports of its own, not the
    topology's, and no bottleneck to compare."""
    return {t: res for t, res in summary["trials"].items() if not res["nonblocking"]}


def loaded_ports(summary: ExperimentSummary) -> list[str]:
    """The queued ports (dp_id:port) at least LOADED busy at some step of some trial on the topology: the
    bottlenecks, not the ends of a link that only send back acknowledgements."""
    return list(dict.fromkeys(port for res in _on_the_topology(summary).values() for step in res["steps"]
                              for port, use in step["ports"].items() if (use["utilisation"] or 0) >= LOADED))


def _flow_cell(step: FlowStep, starved: bool) -> str:
    value = step["mbps"]
    return ("–" if value is None else f"{value:.2f}") + (FAILED if "failed" in step else "") + \
        (STARVED if starved else "")


def _port_cell(use: PortStep | None) -> str:
    if not use or use["utilisation"] is None:
        return "–"
    classes = ", ".join(f"{name} {c['mbps']:.2f} ({c['drops']})" for name, c in use["classes"].items()
                        if c["mbps"] >= 0.005 or c["drops"])
    return f"{use['utilisation']:.0%}: {classes}" if classes else f"{use['utilisation']:.0%}"


def _rtt(step: dict[str, Any] | None) -> str:
    if not step or step["probe_rtt_ms"]["median"] is None:
        return "–"
    rtt = step["probe_rtt_ms"]
    return f"{rtt['median']:.1f} / {rtt['p95']:.1f}, {step['probe_loss_percent']:g} %"


def figure(summary: ExperimentSummary, path: Path) -> None:
    """A panel per trial of each flow per step (or, with too many flows, one panel of each trial's aggregate);
    and a panel per bottleneck of each trial's classes."""
    groups = [f"step {_label(k, summary)}".replace(" (", "\n(") if isinstance(k, int) else k
              for k in periods(summary)]
    topo = summary["scenario"]["topo"]
    trials = summary["trials"]
    if _per_flow(summary):
        panels = [Panel(f"{t}: goodput (Mbit/s)", {f["name"]: [s["flows"][f["name"]]["mbps"] for s in res["steps"]]
                                                   for f in res["flows"]})
                  for t, res in trials.items()]
        bar_figure(path, f"Each flow per step, {topo}", groups, panels)
    else:
        bar_figure(path, f"Each trial's flows together, per step, {topo}", groups, [
            Panel("aggregate goodput (Mbit/s)", {t: [s["aggregate_mbps"] for s in res["steps"]]
                                                 for t, res in trials.items()})])
    ports = loaded_ports(summary)
    if ports:   # a panel per bottleneck: what each class of each trial got through it
        bar_figure(path.with_name(BOTTLENECK_FIGURE), f"Each bottleneck's classes, {topo}",
                   groups, [Panel(f"{port}: Mbit/s", _class_series(summary, port)) for port in ports])


def _class_series(summary: ExperimentSummary, port: str) -> dict[str, list[float | None]]:
    """"trial: class" → its Mbit/s at `port` in each step, for the classes that carried anything there."""
    series: dict[str, list[float | None]] = {}
    for p, res in _on_the_topology(summary).items():
        at = [s["ports"][port]["classes"] if port in s["ports"] else {} for s in res["steps"]]
        for name in dict.fromkeys(n for classes in at for n, c in classes.items() if c["mbps"]):
            series[f"{p}: {name}"] = [classes[name]["mbps"] if name in classes else None for classes in at]
    return series
