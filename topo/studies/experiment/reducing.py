"""What a trial's run produced, reduced to its results (summary.json's trials, typed in summary.py); and the
experiment's summary around them.

Per step (and the time after the steps, if a flow ran on): each flow's goodput, all of them together,
Jain's index over the TCP flows, each queued port's classes (by name: the default class is `default`),
whether the host starved, the probe's and the ping's round trips. A flow whose test did not start, or
died, is a result: its goodput is what it delivered (nothing where it never ran), with the reason, in
each step from the one it stopped in. Over the whole run: each TCP flow's sender numbers, the queues seen
under each port's classes and what they dropped themselves, each link event as it was done, what the
controller decided; the probe's RTT alone on the path before the flows; the fidelity monitor's verdict.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from controller.adapters.tc import ClassCounters
from controller.core.plan import HTB_PARENT, htb_classid
from controller.core.policy import Policy
from topo.harness import fidelity, prometheus
from topo.harness.launch import Host
from topo.harness.report import jain_index
from topo.net import iperf, ping, probe
from topo.net.experimentfile import TrialSpec
from topo.net.traffic import Flow, LinkState, Ping, Probe, Ran
from topo.net.trafficfile import FlowSpec, Traffic
from topo.studies.base import SETTLE_SECONDS, trial_fidelity
from topo.studies.experiment.planning import Plan
from topo.studies.experiment.summary import (
    Backlog,
    ClassStep,
    Event,
    ExperimentSummary,
    FlowScenario,
    FlowStep,
    Leaf,
    PortStep,
    Recorded,
    Scenario,
    Step,
    TrialResult,
    Verdict,
)

STARVED_PRESSURE = 0.2       # share of a step the host's runnable tasks waited for a CPU: the emulator decided


class QueuedPort(NamedTuple):
    """A switch port with a declared rate: the controller queues it, the run watches it."""
    dp_id: str
    port: int
    iface: str
    bps: int


@dataclass(frozen=True)
class Watched:
    """The trial's queued ports and what watched each (by interface) while the traffic ran."""
    ports: list[QueuedPort]
    monitors: dict[str, fidelity.Monitor]


def summary(plan: Plan, host: Host, done: dict[str, TrialResult], delays_applied: bool,
            prometheus_url: str | None) -> ExperimentSummary:
    """The experiment's summary: its scenario (`plan`'s), the host, the trials done so far."""
    first = plan.experiment.trials[0].traffic   # every trial has its steps (experimentfile.same_steps)
    scenario: Scenario = {
        "topo": plan.experiment.topo, "topo_params": plan.experiment.params, "step_seconds": first.step_seconds,
        "steps": first.steps, "seconds": first.seconds, "settle_seconds": SETTLE_SECONDS,
        "links": [{"ends": [f"{s}:{p}" for s, p in link.ends], "bps": link.bps,
                   "delay": link.delay if delays_applied else None} for link in plan.loaded.links]}
    out: ExperimentSummary = {"scenario": scenario, "environment": host.environment, "trials": done}
    if prometheus_url:
        out["prometheus"] = _recorded(prometheus_url, done, host.out / "prometheus")
    return out


def result(trial: TrialSpec, ran: list[Ran], watched: Watched, status: dict[str, Any], policy: Policy,
           unloaded: Ran | None, rtt_seconds: float, queue_packets: int | None,
           loss_percent: float | None) -> TrialResult:
    """The trial's results from what ran (`unloaded`: the probe alone before it), the ports `watched`, the
    controller's `status` after it, and its `policy`. `rtt_seconds`, `queue_packets` and `loss_percent`:
    the path's, for the fidelity verdict."""
    spec = trial.traffic
    names = {htb_classid(c.queue): c.name for c in policy.classes} | {htb_classid(0): "default"}
    t0 = min(min(r.launched or r.started, r.started) for r in ran)
    probed = next((r for r in ran if isinstance(r.item, Probe)), None)
    trips = probe.round_trips(probed.doc) if probed is not None and probed.doc else []
    pinged = next((r.text or "" for r in ran if isinstance(r.item, Ping)), "")
    steps: list[Step] = []
    for k, (a, b) in enumerate(spec.periods()):
        lo, hi = t0 + a + SETTLE_SECONDS, t0 + b
        flows = {f.name: _flow_step(f, k, (a, b), ran, lo, hi, t0) for f in spec.flows}
        tcp = [v["mbps"] for f, v in zip(spec.flows, flows.values()) if not f.udp and v["mbps"] is not None]
        rates = [v["mbps"] for v in flows.values() if v["mbps"] is not None]
        queued = {f"{p.dp_id}:{p.port}": port_step(watched.monitors[p.iface].samples, lo, hi, p.bps, names)
                  for p in watched.ports}
        pressure = [q["cpu_pressure"] for q in queued.values() if q["cpu_pressure"] is not None]
        step: Step = {"step": k, "window_s": [round(lo - t0, 3), round(hi - t0, 3)], "flows": flows,
                      "aggregate_mbps": round(sum(rates), 3) if rates else None,
                      "jain_tcp": round(jain_index(tcp), 3) if len(tcp) >= 2 and any(tcp) else None,
                      "ports": queued, "starved": bool(pressure) and max(pressure) > STARVED_PRESSURE}
        if spec.probe:
            step["probe"] = probe.summary(trips, lo, hi)
        if spec.ping:
            step["ping_rtt_ms"] = ping.summary(pinged, lo, hi)
        steps.append(step)
    decisions = [{**d, "at_s": round(d["time"] - t0, 3)} for d in status.get("decisions", [])
                 if t0 <= d["time"] <= t0 + spec.seconds + 30]
    senders = {f.name: iperf.sender_metrics(r.doc) for f in spec.flows if not f.udp
               for r in ran if isinstance(r.item, Flow) and r.item.name == f.name and r.doc and not r.error}
    leaves = {f"{p.dp_id}:{p.port}": {names.get(cls, cls): Leaf(kinds=sorted(kinds),
                                                                drops=watched.monitors[p.iface].leaf_drops.get(cls))
                                      for cls, kinds in watched.monitors[p.iface].queues.items() if cls != HTB_PARENT}
              for p in watched.ports}
    out: TrialResult = {
        "policy": trial.policy, "nonblocking": trial.nonblocking, "flows": flows_scenario(spec),
        "t0": round(t0, 3), "seconds": spec.seconds, "steps": steps, "events": _events(spec, ran, t0),
        "tcp": senders, "leaves": leaves, "decisions": decisions,
        "fidelity": verdict(t0, spec, ran, watched, rtt_seconds, queue_packets, loss_percent)}
    if unloaded is not None:
        out["probe_unloaded"] = (probe.alone(unloaded.doc) if unloaded.doc else None) or \
            {"error": unloaded.error or "no packet sent"}
    return out


def flows_scenario(spec: Traffic) -> list[FlowScenario]:
    """The trial's flows as summary.json names them."""
    return [{"name": f.name, "from": f.src, "to": f.dst, "protocol": f.protocol, "start_s": f.start, "end_s": f.end,
             "cc": f.cc, "offered_mbps": list(f.mbps) if f.udp else None} for f in spec.flows]


def verdict(t0: float, spec: Traffic, ran: list[Ran], watched: Watched, rtt_seconds: float,
            queue_packets: int | None, loss_percent: float | None) -> Verdict | None:
    """The fidelity monitor's verdict on the trial (base.trial_fidelity) at its busiest queued port, over
    the whole traffic past its first settling second, or, with link events, up to the first one (a link cut
    stalls TCP and idles a port, which the monitor would lay on the emulator); None where no port queued, or
    no step came before the first event. It judges the TCP flows that run through that window (one that
    starts or ends inside it is silent around its own time, not stalled), and holds their retransmits to
    what every queued port dropped: a flow across a fabric answers drops wherever its path queued."""
    end = min([spec.seconds, *(e.at_step * spec.step_seconds for e in spec.events)])
    lo, hi = t0 + SETTLE_SECONDS, t0 + end
    if hi <= lo:
        return None
    busiest = max(watched.ports, default=None,
                  key=lambda p: port_step(watched.monitors[p.iface].samples, lo, hi, p.bps, {})["utilisation"] or 0.0)
    if busiest is None:
        return None
    through = {f.name for f in spec.flows if f.start == 0 and f.end >= end}
    judged = [r for r in ran if not isinstance(r.item, Flow) or r.item.name in through]
    dropped = sum(c["drops"] for p in watched.ports
                  for c in port_step(watched.monitors[p.iface].samples, lo, hi, p.bps, {})["classes"].values())
    dropped += sum(d or 0 for p in watched.ports for cls, d in watched.monitors[p.iface].leaf_drops.items()
                   if cls != HTB_PARENT)
    found = trial_fidelity(watched.monitors[busiest.iface].samples, (lo, hi), busiest.bps, judged, rtt_seconds,
                           queue_packets, loss_percent, dropped)
    return {"port": f"{busiest.dp_id}:{busiest.port}", "faithful": found["faithful"],
            "fidelity_notes": found["fidelity_notes"], "fidelity": found["fidelity"]}


def _events(spec: Traffic, ran: list[Ran], t0: float) -> list[Event]:
    """Each link event of the traffic, and when the runner did it (the runner does them in step order)."""
    done = [r for r in ran if isinstance(r.item, LinkState)]
    planned = sorted(spec.events, key=lambda e: e.at_step)
    return [{"at_step": e.at_step, "link": list(e.link), "state": e.state,
             "at_s": round(r.started - t0, 3) if r is not None else None}
            for e, r in zip(planned, [*done, *[None] * (len(planned) - len(done))])]


def _flow_step(f: FlowSpec, k: int, period: tuple[int, int], ran: list[Ran], lo: float, hi: float,
               t0: float) -> FlowStep:
    """Flow `f` in step `k` (its `period`, its window lo-hi): what the receiver got, and, where its test failed,
    why, from the step it stopped delivering in."""
    name = f.name if not f.udp else f"{f.name}_{k}"
    r = next((r for r in ran if isinstance(r.item, Flow) and r.item.name == name), None)
    if r is None or not (f.start < period[1] and f.end > period[0]):
        return {"mbps": None}
    doc = r.doc or {}
    received = iperf.received(doc)
    out: FlowStep
    if r.error is None:
        mean = iperf.window_mean_bps(received, r.started, lo, hi)
        out = {"mbps": None if mean is None else round(mean / 1e6, 3)}
    else:
        out = {"mbps": round(iperf.window_delivered_bps(received, r.started, lo, hi) / 1e6, 3)}
        last = max((i.end for i in received), default=None)
        if last is None or r.started + last < hi - 2 * iperf.RECEIVER_SECONDS:
            out["failed"] = r.error
    # Its test began in this step (when its server took the data), if it began at all.
    if (received or r.error is None) and lo - SETTLE_SECONDS <= r.started < hi:
        out["started_s"] = round(r.started - t0, 3)
    if f.udp:
        out["offered_mbps"] = f.mbps[k]
        out["lost_percent"] = doc.get("end", {}).get("sum", {}).get("lost_percent")
    else:
        out["retransmits"] = iperf.window_retransmits(iperf.sent(doc), r.started, lo, hi)
    return out


def port_step(samples: list[fidelity.Sample], lo: float, hi: float, capacity_bps: int,
              names: dict[str, str]) -> PortStep:
    """A queued port over a step: its use of the capacity, and each HTB class's rate and drops."""
    inside = [s for s in samples if lo <= s.t <= hi]
    if len(inside) < 2:
        return {"utilisation": None, "classes": {}, "cpu_pressure": None}
    first, last = inside[0], inside[-1]
    span = last.t - first.t
    classes: dict[str, ClassStep] = {
        names.get(cls, cls): {"mbps": round((c.bytes - first.classes[cls].bytes) * 8 / span / 1e6, 3),
                              "drops": c.drops - first.classes[cls].drops,
                              "backlog_packets": _backlog([s.classes[cls] for s in inside if cls in s.classes])}
        for cls, c in last.classes.items() if cls in first.classes and cls != HTB_PARENT}
    busy = sum(c["mbps"] for c in classes.values()) * 1e6 / capacity_bps if classes else None
    pressure = None if first.cpu_pressure_us is None or last.cpu_pressure_us is None else \
        round((last.cpu_pressure_us - first.cpu_pressure_us) / 1e6 / span, 3)
    return {"utilisation": None if busy is None else round(busy, 3), "classes": classes, "cpu_pressure": pressure}


def _backlog(counted: list[ClassCounters]) -> Backlog:
    """A class's queue over a step, as sampled: its mean and its most packets, and how many samples."""
    return {"mean": round(sum(c.backlog_packets for c in counted) / len(counted), 3),
            "max": max(c.backlog_packets for c in counted), "samples": len(counted)}


def _recorded(url: str, done: dict[str, TrialResult], data_dir: Path) -> Recorded:
    """What Prometheus holds of each queued port's sending rate as the controller saw it, per trial: the
    query, and its points over the trial's traffic."""
    recorded: Recorded = {"url": url, "data_dir": str(data_dir), "queries": {}}
    for name, res in done.items():
        for port in res["steps"][0]["ports"] if res["steps"] else ():
            dp_id, number = port.split(":")
            expr = f'8 * rate(ovsqos_port_tx_bytes_total{{dp_id="{dp_id}",port="{number}"}}[5s]) / 1e6'
            start = res["t0"]
            recorded["queries"][f"{name} {port}"] = prometheus.recorded(url, expr, start, start + res["seconds"])
    return recorded
