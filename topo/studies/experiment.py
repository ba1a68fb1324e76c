"""Your own network and traffic under the controller, once per trial:

    sudo python topo/run.py --topo FILE:NAME [--topo-param k=v ...] --traffic FILE [--policy none reserve auto]
    sudo python topo/run.py --experiment FILE

The topology comes from a Mininet custom file (topo/net/custom.py), the traffic from a traffic file
(topo/net/trafficfile.py); an experiment file (topo/net/experimentfile.py) names both and its trials,
and the flags above are the experiment of one trial per policy. Each trial's policy is put as it is
for any network (its `network:` section, its `switches:` left out): the controller learns the hosts
and queues every link the topology gave a bw=. Each trial runs on a fresh network; every queued port
is watched (its HTB classes' bytes, drops and backlog, the host's CPU pressure) while the traffic
runs. The results say, per step, each flow's goodput (TCP's retransmits, UDP's loss), Jain's index
over the TCP flows, each queued port's use and drops per class, and what `auto` decided, where and
when; per trial, each TCP flow's sender numbers (cwnd, RTT) and the fidelity monitor's verdict.
The cc, fairness and aqm studies are such experiments, with tables of their own (their modules).
"""
from __future__ import annotations

import argparse
import subprocess
from contextlib import ExitStack
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from controller.adapters.tc import ClassCounters
from controller.core.bridges import CAPACITY_KEY, DELAY_KEY
from controller.core.plan import HTB_PARENT, htb_classid
from controller.core.policy import Policy, PolicyError, PortRule, for_any_network, load_document, parse_policy
from topo.harness import capabilities, fidelity, prometheus
from topo.harness.launch import Host, note
from topo.harness.report import Panel, bar_figure, jain_index, markdown_table
from topo.net import custom, experimentfile, iperf, ping, probe, traffic, trafficfile
from topo.net.network import Network, network
from topo.net.traffic import Flow, Ping, Probe, Ran
from topo.studies.base import (
    REPO,
    SETTLE_SECONDS,
    Settings,
    Study,
    Trial,
    TrialContext,
    UsageError,
    add_prometheus_argument,
    check_path,
    fidelity_notes,
    policy_path,
    trial_fidelity,
)

POLICIES = ("none", "reserve", "auto")
QUICK_STEP_SECONDS = 4
LOADED = 0.25               # a queued port this busy (of its capacity) at some step is a bottleneck in the results
BOTTLENECK_FIGURE = "bottlenecks.png"
EXPERIMENT_FILE = "experiment.yaml"
TOPOS = REPO / "topo" / "topos.py"
AFTER = "after"              # the row of the time after the last step, when a flow runs on
STARVED_PRESSURE = 0.2       # share of a step the host's runnable tasks waited for a CPU: the emulator decided


@dataclass(frozen=True)
class Plan:
    experiment: experimentfile.Experiment
    loaded: custom.Loaded
    documents: dict[str, dict]        # each trial's policy, for any network, with the trial's ports
    path_rtt_seconds: float = 0.0     # delay the topology adds to the flows' path, both ways (the fidelity verdict)
    path_loss_percent: float | None = None
    study: Any = None                 # what a study made of an experiment (cc, fairness, aqm) keeps for its table
    document: dict | None = None      # such a study's experiment file, written to the results as EXPERIMENT_FILE


class ExperimentStudy(Study):
    name = "experiment"
    description = "Your own network (a Mininet custom file) and traffic (a traffic file) under each policy."
    figure_name = "throughput.png"
    records = True

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--experiment", type=Path, metavar="FILE",
                       help="an experiment file (YAML): the topology, the traffic and the trials, in one file")
        p.add_argument("--topo", metavar="FILE:NAME",
                       help="a Mininet custom file and a topology in its topos dict, as mn --custom FILE --topo NAME")
        p.add_argument("--topo-param", nargs="*", default=[], metavar="K=V", help="the topology's parameters")
        p.add_argument("--traffic", type=Path, metavar="FILE", help="the traffic file (YAML)")
        p.add_argument("--policy", nargs="+", metavar="NAME",
                       help="policies/NAME.yaml or a path, each run on its own network (default none reserve auto)")
        add_prometheus_argument(p)

    def plan(self, args: argparse.Namespace) -> Plan:
        try:
            experiment = self.experiment(args)
        except (custom.TopologyError, trafficfile.TrafficFileError, experimentfile.ExperimentFileError) as err:
            raise UsageError(str(err)) from None
        return prepared(experiment, str(args.experiment or args.traffic), QUICK_STEP_SECONDS if args.quick else None)

    def experiment(self, args: argparse.Namespace) -> experimentfile.Experiment:
        """The experiment the command line names: an experiment file, or --topo, --traffic and --policy."""
        if args.experiment:
            for flag in ("topo", "traffic", "policy"):
                if getattr(args, flag):
                    raise UsageError(f"--{flag}: the experiment file {args.experiment} says it; leave --{flag} out")
            if args.topo_param:
                raise UsageError(f"--topo-param: the experiment file {args.experiment} says it (topo_params); leave "
                                 "--topo-param out")
            return experimentfile.load(args.experiment)
        if not args.topo or not args.traffic:
            raise UsageError("give --experiment FILE, or --topo FILE:NAME and --traffic FILE (docs/experiments.md)")
        traffic_spec = trafficfile.load(args.traffic)
        trials = [experimentfile.TrialSpec(experimentfile.trial_name(p), p, {}, traffic_spec)
                  for p in args.policy or POLICIES]
        return experimentfile.Experiment(args.topo, custom.parse_params(args.topo_param), tuple(trials))

    def trials(self, plan: Plan, host: Host) -> list[Trial]:
        for trial in plan.experiment.trials:
            why = lacking(trial, queue_rule(plan.documents[trial.name]), host.capabilities, host.datapath)
            if why:
                raise UsageError(f"trial {trial.name}: {why}; this kernel cannot run it: leave the trial out, or "
                                 "run the experiment in the VM (topo/run.py vm -- ...)")
        if plan.document:
            (host.out / EXPERIMENT_FILE).write_text(yaml.safe_dump(plan.document, sort_keys=False))
        why = delays_lacking(host)
        if plan.loaded.delays and why:
            note(f"link delay not applied ({why}): {', '.join(plan.loaded.delays)}")
        return [Trial(t.name, t.name, t.traffic.seconds + (trafficfile.UNLOADED_SECONDS if t.traffic.probe else 0),
                      partial(_one_trial, t, plan)) for t in plan.experiment.trials]

    def summary(self, plan: Plan, host: Host, done: dict[str, dict], prometheus_url: str | None) -> dict[str, Any]:
        first = plan.experiment.trials[0].traffic   # every trial has its steps (experimentfile.same_steps)
        scenario = {"topo": plan.experiment.topo, "topo_params": plan.experiment.params,
                    "step_seconds": first.step_seconds, "steps": first.steps, "seconds": first.seconds,
                    "settle_seconds": SETTLE_SECONDS,
                    "links": [{"ends": [f"{s}:{p}" for s, p in link.ends], "bps": link.bps,
                               "delay": None if delays_lacking(host) else link.delay}
                              for link in plan.loaded.links]}
        summary: dict[str, Any] = {"scenario": scenario, "environment": host.environment, "trials": done}
        if prometheus_url:
            summary["prometheus"] = _recorded(prometheus_url, done, host.out / "prometheus")
        return summary

    def table(self, summary: dict[str, Any]) -> str:
        return table(summary)

    def figure(self, summary: dict[str, Any], path: Path) -> None:
        figure(summary, path)


def queue_rule(document: dict) -> PortRule:
    """How a trial's policy (for any network) queues the links: its network.ports as the parser reads it,
    defaults filled in (a policy without one: the parser's defaults)."""
    network = parse_policy(document).network
    return network.ports if network and network.ports else PortRule("fifo")


def lacking(trial: experimentfile.TrialSpec, rule: PortRule, caps: dict[str, capabilities.Capability],
            datapath: str) -> str | None:
    """What of `trial` (its links queued by `rule`) the host of `caps` lacks: the queue discipline of
    its ports, or a flow's congestion control; None when it has both."""
    kind = tc_kind(rule.discipline, datapath)
    missing = capabilities.unavailable(caps, [kind], "qdisc")
    if missing:
        return f"ports.discipline {rule.discipline}: {missing[kind]}"
    wanted = sorted({f.cc for f in trial.traffic.flows if f.cc})
    skipped = capabilities.choose_tcp(wanted, capabilities.tcp_algorithms(), caps)[1] if wanted else {}
    return next((f"cc {cc}: {why}" for cc, why in skipped.items()), None)


def tc_kind(discipline: str, datapath: str) -> str:
    """The qdisc kind the controller puts under the class for `discipline` (controller/core/queues.py)."""
    if discipline == "fifo":
        return "pfifo_head_drop" if datapath == "user" else "pfifo"
    return discipline


def keeping(plan: Plan, names: set[str]) -> Plan:
    """`plan` with only the trials named (those a study found this kernel can run)."""
    return replace(plan, experiment=replace(plan.experiment,
                                            trials=tuple(t for t in plan.experiment.trials if t.name in names)))


def study_experiment(setup: Settings, topo: str, params: dict[str, Any], ports: dict[str, Any],
                     trials: list[dict[str, Any]]) -> dict[str, Any]:
    """A study's experiment file: topo/topos.py's `topo` with its bottleneck at the study's rate, each
    trial under policy none (one FIFO per queued port) with `ports`."""
    return {"topo": f"{TOPOS}:{topo}", "topo_params": {"bw": setup.bottleneck_bps / 1e6, **params},
            "policy": "none", "ports": ports, "trials": trials}


def study_plan(document: dict[str, Any], name: str, **more: Any) -> Plan:
    """The plan of a study's experiment file (`document`, its paths absolute)."""
    try:
        experiment = experimentfile.parse(document, f"the {name} study's experiment", Path("/"))
    except experimentfile.ExperimentFileError as err:
        raise UsageError(str(err)) from None
    return prepared(experiment, f"the {name} study", document=document, **more)


def prepared(experiment: experimentfile.Experiment, where: str, quick_step_seconds: int | None = None,
             **more: Any) -> Plan:
    """The plan of `experiment` (from `where`), checked: its topology builds, it has every host the
    traffic names, every trial's policy is good; with `quick_step_seconds`, its steps that long."""
    try:
        loaded = custom.load(experiment.topo, experiment.params)
    except custom.TopologyError as err:
        raise UsageError(str(err)) from None
    hosts = set(loaded.topo.hosts())
    for trial in experiment.trials:
        missing = sorted(trial.traffic.hosts() - hosts)
        if missing:
            which = "" if all(t.traffic is trial.traffic for t in experiment.trials) else f"trial {trial.name}: "
            raise UsageError(f"{where}: {which}host {missing[0]} is not in {experiment.topo} (it has "
                             f"{', '.join(sorted(hosts))}); fix from/to")
    if quick_step_seconds:
        experiment = replace(experiment, trials=tuple(experimentfile.rescaled(t, quick_step_seconds)
                                                      for t in experiment.trials))
    return Plan(experiment, loaded, {t.name: trial_policy(t) for t in experiment.trials}, **more)


def trial_policy(trial: experimentfile.TrialSpec) -> dict:
    """The trial's policy as it is for any network, its ports set over the policy's network.ports, validated."""
    document = for_any_network(load_document(policy_path(trial.policy)))
    if trial.ports:
        network = document.setdefault("network", {})
        network["ports"] = {**(network.get("ports") or {}), **trial.ports}
    try:
        parse_policy(document)
    except PolicyError as err:
        raise PolicyError(f"trial {trial.name}: {err}") from None
    return document


def _recorded(url: str, done: dict[str, dict], data_dir: Path) -> dict[str, Any]:
    """What Prometheus holds of each queued port's sending rate as the controller saw it, per trial: the
    query, and its points over the trial's traffic."""
    recorded: dict[str, Any] = {"url": url, "data_dir": str(data_dir), "queries": {}}
    for name, result in done.items():
        for port in result["steps"][0]["ports"] if result["steps"] else ():
            dp_id, number = port.split(":")
            expr = f'8 * rate(ovsqos_port_tx_bytes_total{{dp_id="{dp_id}",port="{number}"}}[5s]) / 1e6'
            recorded["queries"][f"{name} {port}"] = prometheus.recorded(url, expr, result["t0"],
                                                                        result["t0"] + result["seconds"])
    return recorded


def _one_trial(trial: experimentfile.TrialSpec, plan: Plan, ctx: TrialContext) -> dict[str, Any]:
    loaded = custom.load(plan.experiment.topo, plan.experiment.params)     # a fresh Topo for a fresh network
    document = plan.documents[trial.name]
    spec = trial.traffic
    ctx.client.clear_policy()   # the new switches connect to no policy: nothing of the last trial shapes them
    with network(loaded.topo, ctx.host.datapath, ctx.host.record, ctx.client.openflow_ports) as net:
        delays = not delays_lacking(ctx.host)
        ports = _declare(net, loaded.links, delays)
        dpids = {net.host(s).dpid for s in loaded.topo.switches()}
        ctx.client.wait(lambda s: dpids <= set(s["switches"]), 30, "every switch connected")
        ctx.client.put_policy(document)
        rule = queue_rule(document)
        want = "fifo" if rule.queues == "fifo" else "reserve"
        ctx.client.wait(lambda s: all(s["switches"].get(dp, {}).get("ports", {}).get(str(port), {}).get("queues")
                                      == want for dp, port, _, _ in ports), 30,
                        f"policy {trial.policy}'s queues on every link")
        for f in spec.flows:
            check_path(net, f.src, f.dst)
        if spec.probe:
            check_path(net, *spec.probe)
        slowest = min(bps for _, _, _, bps in ports) if ports else 10**9
        wait = traffic.connect_seconds(slowest, rule.queue_packets)
        unloaded = traffic.run(net, trafficfile.unloaded(spec), ctx.raw_dir, wait, ctx.tick)
        before = trafficfile.UNLOADED_SECONDS if unloaded else 0
        with ExitStack() as stack:
            monitors = {iface: stack.enter_context(fidelity.Monitor(iface)) for _, _, iface, _ in ports}
            ran = traffic.run(net, trafficfile.lanes(spec), ctx.raw_dir, wait,
                              lambda label, t: ctx.tick(label, before + t))
        status = ctx.client.status()
    measured = result(spec, ran, ports, monitors, status, parse_policy(document), *unloaded)
    # The links' delays on the longest TCP path, both ways: whether the queues hold what TCP keeps in flight.
    links_rtt = 2 * max((custom.one_way_seconds(loaded, f.src, f.dst) for f in spec.flows if not f.udp),
                        default=0.0) if delays else 0.0
    return {"policy": trial.policy, "flows": flows_scenario(spec), **measured,
            "fidelity": verdict(measured["t0"], spec, ran, ports, monitors, plan.path_rtt_seconds + links_rtt,
                                rule.queue_packets, plan.path_loss_percent)}


def flows_scenario(spec: trafficfile.Traffic) -> list[dict[str, Any]]:
    """The trial's flows as summary.json names them."""
    return [{"name": f.name, "from": f.src, "to": f.dst, "protocol": f.protocol, "start_s": f.start, "end_s": f.end,
             "cc": f.cc, "offered_mbps": list(f.mbps) if f.udp else None} for f in spec.flows]


def delays_lacking(host: Host) -> str | None:
    """Why the links' delays cannot be applied here, or None. netem drops at the tail, which on the userspace
    datapath loses other classes' packets uncounted (controller/core/queues.py)."""
    if not host.environment["netem"]:
        return "this kernel lacks netem"
    return "netem's tail drops need the kernel datapath" if host.datapath != "kernel" else None


def _declare(net: Network, links: list[custom.DeclaredLink], delays: bool) -> list[tuple[str, int, str, int]]:
    """Each declared link's rate, and its delay when `delays`, on both its interfaces; (dp_id, port,
    interface, bit/s) of each."""
    ports = []
    for link in links:
        declared = {CAPACITY_KEY: link.bps, **({DELAY_KEY: link.delay} if link.delay and delays else {})}
        for switch, port in link.ends:
            node = net.host(switch)
            iface = node.intfs[port].name
            subprocess.run(["ovs-vsctl", "set", "interface", iface,
                            *(f"external_ids:{key}={value}" for key, value in declared.items())],
                           check=True, capture_output=True, timeout=30)
            ports.append((node.dpid, port, iface, link.bps))
    return ports


def result(spec: trafficfile.Traffic, ran: list[Ran], ports: list[tuple[str, int, str, int]],
           monitors: dict[str, fidelity.Monitor], status: dict[str, Any], policy: Policy,
           unloaded: Ran | None = None) -> dict[str, Any]:
    """Per step (and the time after the steps, if a flow ran on): each flow, Jain's index over the TCP
    flows, each queued port's classes (by name: the default class is `default`), whether the host
    starved, the probe's and the ping's round trips; over the whole run: each TCP flow's sender numbers,
    the queues seen under each port's classes and what they dropped themselves, what the controller
    decided; and the probe's RTT alone on the path before the flows."""
    names = {htb_classid(c.queue): c.name for c in policy.classes} | {htb_classid(0): "default"}
    for r in ran:
        if isinstance(r.item, Flow):
            r.require()
    t0 = min(min(r.launched or r.started, r.started) for r in ran)
    probed = next((r for r in ran if isinstance(r.item, Probe)), None)
    trips = probe.round_trips(probed.doc) if probed is not None and probed.doc else []
    pinged = next((r.text or "" for r in ran if isinstance(r.item, Ping)), "")
    steps = []
    for k, (a, b) in enumerate(spec.periods()):
        lo, hi = t0 + a + SETTLE_SECONDS, t0 + b
        flows = {f.name: _flow_step(f, k, ran, lo, hi, t0) for f in spec.flows}
        tcp = [v["mbps"] for f, v in zip(spec.flows, flows.values()) if not f.udp and v["mbps"] is not None]
        queued = {f"{dp}:{port}": _port_step(monitors[iface].samples, lo, hi, bps, names)
                  for dp, port, iface, bps in ports}
        pressure = [p["cpu_pressure"] for p in queued.values() if p["cpu_pressure"] is not None]
        steps.append({"step": k, "window_s": [round(lo - t0, 3), round(hi - t0, 3)], "flows": flows,
                      "jain_tcp": round(jain_index(tcp), 3) if len(tcp) >= 2 and any(tcp) else None,
                      "ports": queued, "starved": bool(pressure) and max(pressure) > STARVED_PRESSURE,
                      **({"probe": probe.summary(trips, lo, hi)} if spec.probe else {}),
                      **({"ping_rtt_ms": ping.summary(pinged, lo, hi)} if spec.ping else {})})
    decisions = [{**d, "at_s": round(d["time"] - t0, 3)} for d in status.get("decisions", [])
                 if t0 <= d["time"] <= t0 + spec.seconds + 30]
    senders = {f.name: iperf.sender_metrics(r.require()) for f in spec.flows if not f.udp
               for r in ran if isinstance(r.item, Flow) and r.item.name == f.name}
    leaves = {f"{dp}:{port}": {names.get(cls, cls): {"kinds": sorted(kinds),
                                                     "drops": monitors[iface].leaf_drops.get(cls)}
                               for cls, kinds in monitors[iface].queues.items() if cls != HTB_PARENT}
              for dp, port, iface, _ in ports}
    return {"t0": round(t0, 3), "seconds": spec.seconds, "steps": steps, "tcp": senders, "leaves": leaves,
            "decisions": decisions, **({"probe_unloaded": _unloaded(unloaded)} if unloaded is not None else {})}


def verdict(t0: float, spec: trafficfile.Traffic, ran: list[Ran], ports: list[tuple[str, int, str, int]],
            monitors: dict[str, fidelity.Monitor], rtt_seconds: float, queue_packets: int | None,
            loss_percent: float | None) -> dict[str, Any] | None:
    """The fidelity monitor's verdict on the trial (base.trial_fidelity) at its busiest queued port, over
    the whole traffic past its first settling second; None where no port queued."""
    lo, hi = t0 + SETTLE_SECONDS, t0 + spec.seconds
    busiest = max(ports, default=None, key=lambda p: _port_step(monitors[p[2]].samples, lo, hi, p[3], {})
                  ["utilisation"] or 0.0)
    if busiest is None:
        return None
    dp, port, iface, bps = busiest
    leaf_drops = sum(d for cls, d in monitors[iface].leaf_drops.items() if cls != HTB_PARENT)
    return {"port": f"{dp}:{port}", **trial_fidelity(monitors[iface].samples, (lo, hi), bps, ran, rtt_seconds,
                                                    queue_packets, loss_percent, leaf_drops)}


def _unloaded(ran: Ran) -> dict[str, Any]:
    return (probe.alone(ran.doc) if ran.doc else None) or {"error": ran.error or "no packet sent"}


def _flow_step(f: trafficfile.FlowSpec, k: int, ran: list[Ran], lo: float, hi: float, t0: float) -> dict[str, Any]:
    name = f.name if not f.udp else f"{f.name}_{k}"
    r = next((r for r in ran if isinstance(r.item, Flow) and r.item.name == name), None)
    if r is None:
        return {"mbps": None}
    doc = r.require()
    mean = iperf.window_mean_bps(iperf.received(doc), r.started, lo, hi)
    out: dict[str, Any] = {"mbps": None if mean is None else round(mean / 1e6, 3)}
    if lo - SETTLE_SECONDS <= r.started < hi:   # its test began in this step: when its server took the data
        out["started_s"] = round(r.started - t0, 3)
    if f.udp:
        out |= {"offered_mbps": f.mbps[k], "lost_percent": doc["end"]["sum"].get("lost_percent")}
    else:
        out["retransmits"] = iperf.window_retransmits(iperf.sent(doc), r.started, lo, hi)
    return out


def _port_step(samples: list[fidelity.Sample], lo: float, hi: float, capacity_bps: int,
               names: dict[str, str]) -> dict[str, Any]:
    """A queued port over a step: its use of the capacity, and each HTB class's rate and drops."""
    inside = [s for s in samples if lo <= s.t <= hi]
    if len(inside) < 2:
        return {"utilisation": None, "classes": {}, "cpu_pressure": None}
    first, last = inside[0], inside[-1]
    span = last.t - first.t
    classes: dict[str, dict[str, Any]] = {
        names.get(cls, cls): {"mbps": round((c.bytes - first.classes[cls].bytes) * 8 / span / 1e6, 3),
                              "drops": c.drops - first.classes[cls].drops,
                              "backlog_packets": _backlog([s.classes[cls] for s in inside if cls in s.classes])}
        for cls, c in last.classes.items() if cls in first.classes and cls != HTB_PARENT}
    busy = sum(c["mbps"] for c in classes.values()) * 1e6 / capacity_bps if classes else None
    pressure = None if first.cpu_pressure_us is None or last.cpu_pressure_us is None else \
        round((last.cpu_pressure_us - first.cpu_pressure_us) / 1e6 / span, 3)
    return {"utilisation": None if busy is None else round(busy, 3), "classes": classes, "cpu_pressure": pressure}


def _backlog(counted: list[ClassCounters]) -> dict[str, float]:
    """A class's queue over a step, as sampled: its mean and its most packets, and how many samples."""
    return {"mean": round(sum(c.backlog_packets for c in counted) / len(counted), 3),
            "max": max(c.backlog_packets for c in counted), "samples": len(counted)}


def table(summary: dict[str, Any]) -> str:
    trials = summary["trials"]
    head = ["step"] + [f"{t}: {f['name']}" for t, res in trials.items() for f in res["flows"]]
    rows = []
    for k, label in enumerate(periods(summary)):
        row: list[Any] = [label]
        for res in trials.values():
            step = res["steps"][k]
            mark = " †" if step["starved"] else ""
            row += [_mbps(step["flows"][f["name"]]["mbps"]) + mark for f in res["flows"]]
        rows.append(row)
    after = " (after: from the last step to the last flow's end)" if AFTER in periods(summary) else ""
    lines = [f"Goodput per flow (Mbit/s), each step of {summary['scenario']['step_seconds']} s past its first "
             f"{SETTLE_SECONDS:g} s{after}, on {summary['scenario']['topo']}:", "", markdown_table(head, rows)]
    if any(s["starved"] for res in trials.values() for s in res["steps"]):
        lines.append(f"† the host's CPU was short (pressure above {STARVED_PRESSURE:.0%}): the emulator, not the "
                     "policy, may have decided that step.\n")
    notes = fidelity_notes({t: res["fidelity"] for t, res in trials.items() if res.get("fidelity")})
    if notes:
        lines.append(notes)
    if any("probe" in s for res in trials.values() for s in res["steps"]):
        trips: list[list[Any]] = [[label, *(_rtt(res["steps"][k].get("probe")) for res in trials.values())]
                                  for k, label in enumerate(periods(summary))]
        if any("probe_unloaded" in res for res in trials.values()):
            trips.insert(0, ["alone", *(_rtt(res.get("probe_unloaded")) for res in trials.values())])
        lines += ["The probe's round-trip time, median / p95 (ms), and its packets lost (alone: on the idle path "
                  "before the flows):", "", markdown_table(["step", *trials], trips)]
    ports = loaded_ports(summary)
    if ports:
        uses: list[list[Any]] = [[label, port, *(_port_cell(res["steps"][k]["ports"].get(port))
                                                 for res in trials.values())]
                                 for port in ports for k, label in enumerate(periods(summary))]
        lines += ["Each bottleneck (a queued port at least a quarter busy at some step), per step: its use of its "
                  "capacity, and each class's Mbit/s (packets it dropped):", "",
                  markdown_table(["step", "port", *trials], uses)]
    for t, res in trials.items():
        for d in res["decisions"]:
            lines.append(f"- {t}: switch {d['dp_id']} port {d['port']} {d['action']} at {d['at_s']:.2f} s "
                         f"({d['reason']})")
    return "\n".join(lines) + "\n"


def _mbps(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def periods(summary: dict[str, Any]) -> list[int | str]:
    """The results' rows: each step by its number, then `after` if a flow ran past the last step."""
    steps = summary["scenario"]["steps"]
    count = max((len(res["steps"]) for res in summary["trials"].values()), default=steps)
    return [*range(steps), *([AFTER] if count > steps else [])]


def loaded_ports(summary: dict[str, Any]) -> list[str]:
    """The queued ports (dp_id:port) at least LOADED busy at some step of some trial: the bottlenecks, not
    the ends of a link that only send back acknowledgements."""
    return list(dict.fromkeys(port for res in summary["trials"].values() for step in res["steps"]
                              for port, use in step["ports"].items() if (use["utilisation"] or 0) >= LOADED))


def _port_cell(use: dict[str, Any] | None) -> str:
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


def figure(summary: dict[str, Any], path: Path) -> None:
    groups = [f"step {k}" if isinstance(k, int) else k for k in periods(summary)]
    panels = [Panel(f"{t}: goodput (Mbit/s)", {f["name"]: [s["flows"][f["name"]]["mbps"] for s in res["steps"]]
                                               for f in res["flows"]})
              for t, res in summary["trials"].items()]
    bar_figure(path, f"Each flow per step, {summary['scenario']['topo']}", groups, panels)
    ports = loaded_ports(summary)
    if ports:   # a panel per bottleneck: what each class of each trial got through it
        bar_figure(path.with_name(BOTTLENECK_FIGURE), f"Each bottleneck's classes, {summary['scenario']['topo']}",
                   groups, [Panel(f"{port}: Mbit/s", _class_series(summary, port)) for port in ports])


def _class_series(summary: dict[str, Any], port: str) -> dict[str, list[float | None]]:
    """"trial: class" → its Mbit/s at `port` in each step, for the classes that carried anything there."""
    series: dict[str, list[float | None]] = {}
    for p, res in summary["trials"].items():
        at = [s["ports"].get(port, {}).get("classes", {}) for s in res["steps"]]
        for name in dict.fromkeys(n for classes in at for n, c in classes.items() if c["mbps"]):
            series[f"{p}: {name}"] = [classes.get(name, {}).get("mbps") for classes in at]
    return series


STUDY = ExperimentStudy()
