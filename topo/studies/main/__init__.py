"""The main study: TCP h1 → h4 throughout, UDP h1 → h4 stepping up, under each policy in turn, and a
latency probe h2 → h3 (a voice call's packets, topo/net/probe.py) across the same bottleneck.

Each policy (× each repetition) runs on a fresh network. Before the traffic the probe runs alone for
a few seconds: the unloaded RTT. Prometheus records the controller, the live per-flow throughput and
the probe's RTT; `auto` runs are also scored by their congestion episodes.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from controller.adapters.tc import Tc
from controller.core.policy import PolicyError, parse_policy, parse_rate
from topo.harness import cluster, prometheus
from topo.harness.fault import Fault
from topo.harness.fidelity import Monitor
from topo.harness.launch import Host, note
from topo.harness.onsets import UdpOnsets
from topo.harness.prometheus import tcp_throughput_query
from topo.net import traffic, trafficfile
from topo.net.bridges import IdleBridge, idle_bridges, policy_switches
from topo.net.traffic import Flow, Pause, Probe
from topo.studies.base import (
    Study,
    Trial,
    TrialContext,
    UsageError,
    add_prometheus_argument,
    network_under,
    policy_document,
)
from topo.studies.main import report
from topo.studies.main.episodes import episodes
from topo.studies.main.scenario import Scenario, ScenarioError, load_scenario, parse_delay
from topo.topos import BOTTLENECK, StudyTopo

UDP_INGRESS = "s1-eth3"      # s1's port to h1: where the UDP flood enters the switch
BOTTLENECK_DP_ID = f"{1:016x}"   # s1's (StudyTopo), whose owner --fault kills
IDLE_PORTS_PER_BRIDGE = 20   # --idle-ports: as bench/scale.py lays them out
IDLE_CAPACITY = "100Mbit"
LATENCY_FIGURE = "latency.png"


@dataclass(frozen=True)
class Plan:
    scenario: Scenario
    documents: dict[str, dict]          # policy name → document, in run order
    ovs_instances: int = 1              # 2: s2 on a second OVS
    probe: bool = True                  # the latency probe h2 → h3
    controllers: int = 1                # members of a cluster sharing the switches through etcd
    fault: float | None = None          # seconds into the traffic: kill -9 of s1's owner (topo/harness/fault.py)


class MainStudy(Study[Plan, dict[str, Any], dict[str, Any]]):
    name = "main"
    description = "TCP under a stepped UDP flood through a 5 Mbit/s bottleneck, per QoS policy."
    records = live = True
    figure_name = "throughput.png"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--policy", nargs="+", default=["none", "reserve"], metavar="NAME",
                       help="policies/<NAME>.yaml (or a path), run in this order (default: none reserve)")
        p.add_argument("--scenario", type=Path, help="YAML file of scenario fields (flags override it)")
        p.add_argument("--bottleneck", help="bottleneck rate, e.g. 5Mbit (default 5Mbit)")
        p.add_argument("--delay", help="one-way delay on the h1–h4 path where netem exists, e.g. 5ms; 'none'")
        p.add_argument("--udp-steps", help="offered UDP rates in Mbit/s, e.g. 0,2,4,6,8,10,12")
        p.add_argument("--step-seconds", type=float, help="how long each UDP step lasts (default 10; --quick 3)")
        p.add_argument("--cooldown-seconds", type=float,
                       help="how long TCP runs alone after the last step, where auto's roll-back shows (default 8; "
                            "--quick 6; 0: none)")
        p.add_argument("--queue-packets", type=int, help="packet limit of the bottleneck's queues (default 25)")
        p.add_argument("--cc", dest="tcp_congestion_control", help="TCP congestion control (default: the kernel's)")
        p.add_argument("--tcp-flows", type=int, help="parallel TCP flows h1 → h4 (default 1)")
        p.add_argument("--repeat", type=int, help="run each policy this many times, each on a fresh network "
                                                  "(default 1); steps report the median and the range")
        p.add_argument("--lone-udp", type=float, metavar="MBPS",
                       help="UDP rate run alone once TCP has ended, to show what a policy makes of an idle link "
                            "(default 80%% of the bottleneck; 0: skip)")
        p.add_argument("--police-rate", metavar="RATE",
                       help="rate a policed class is held to, e.g. 1Mbit (default: its min share of the bottleneck, "
                            "what reserve reserves for it)")
        p.add_argument("--ovs-instances", type=int, choices=(1, 2), default=1,
                       help="2: run s2 on a second, independent OVS (its own ovsdb-server on 127.0.0.2:6640 and "
                            "ovs-vswitchd), which the controller reaches over TCP, as it would another host")
        p.add_argument("--controllers", default="1", metavar="N",
                       help="N active controllers sharing the switches through a private etcd (members c1..cN on "
                            "OpenFlow 6653.., REST 8080.., metrics 9101, 9111..); the study PUTs through c1 "
                            "(default 1: one controller, no etcd)")
        p.add_argument("--fault", type=float, metavar="SECONDS",
                       help="with --controllers N: kill -9 the member that owns s1 this long after the traffic "
                            "starts, in each run (started again after it), to see what TCP gets through the failover")
        p.add_argument("--idle-ports", type=int, help="also put N idle auto ports (on bridges of 20) under the "
                                                      "controller, to see the study with a loaded controller")
        add_prometheus_argument(p)
        p.add_argument("--metrics-port", type=int, default=9102, help="launcher exporter port on 127.0.0.1")
        p.add_argument("--probe", choices=("irtt", "none"), default="irtt",
                       help="irtt: a voice call's packets h2 -> h3 every 20 ms, marked EF, measured for RTT, "
                            "jitter and loss (default); none: no latency probe")

    def plan(self, args: argparse.Namespace) -> Plan:
        try:
            scenario = _scenario(args)
        except ScenarioError as err:
            raise UsageError(str(err)) from None
        try:
            police_bps = parse_rate(args.police_rate, "--police-rate") if args.police_rate else None
        except PolicyError as err:
            raise UsageError(str(err)) from None
        documents = {}
        for name in args.policy:
            doc = policy_document(name, scenario.bottleneck_bps, scenario.queue_packets, police_bps=police_bps)
            documents[doc["name"]] = doc
        controllers = _controllers(args)
        if args.fault is not None and controllers < 2:
            raise UsageError("--fault: it kills a member of a cluster; give --controllers 2 or more with it")
        if args.fault is not None and not 0 < args.fault < scenario.tcp_seconds:
            raise UsageError(f"--fault {args.fault:g}: give a time in seconds within the traffic, above 0 and below "
                             f"{scenario.tcp_seconds:g}")
        return Plan(scenario, documents, args.ovs_instances, args.probe == "irtt", controllers, args.fault)

    def trials(self, plan: Plan, host: Host) -> list[Trial[dict[str, Any]]]:
        scenario, env = plan.scenario, host.environment
        if scenario.tcp_congestion_control and scenario.tcp_congestion_control not in env["tcp_congestion_control"]:
            raise UsageError(f"--cc {scenario.tcp_congestion_control}: this kernel offers only "
                             f"{', '.join(env['tcp_congestion_control'])}")
        delay = scenario.delay if scenario.delay and env["netem"] else None
        if scenario.delay and not delay:
            note(f"netem is missing from this kernel: the {scenario.delay} delay is NOT applied")
        repeat = scenario.repeat
        spec = study_traffic(scenario, plan.probe)
        seconds = traffic.planned_seconds(trafficfile.unloaded(spec)) + traffic.planned_seconds(trafficfile.lanes(spec))
        return [Trial(label=name if repeat == 1 else f"{name} {r}/{repeat}", raw=f"{name}/{r}", seconds=seconds,
                      run=partial(_run_policy, name, doc, scenario, delay, plan.probe, plan.fault))
                for name, doc in plan.documents.items() for r in range(1, repeat + 1)]

    def summary(self, plan: Plan, host: Host, done: dict[str, dict[str, Any]],
                prometheus_url: str | None) -> dict[str, Any]:
        scenario = plan.scenario
        delay = scenario.delay if scenario.delay and host.environment["netem"] else None
        policies = {}
        for name, doc in plan.documents.items():
            runs = [result for label, result in done.items() if result["policy"] == name]
            if not runs:
                continue
            reservation = report.reservation_mbps(parse_policy(doc), scenario.bottleneck_bps)
            policies[name] = {**report.aggregate(runs),
                              **({"tcp_reservation_mbps": reservation} if reservation is not None else {})}
        summary = {"scenario": {**dataclasses.asdict(scenario), "tcp_seconds": scenario.tcp_seconds},
                   "bottleneck_mbps": scenario.bottleneck_bps / 1e6,
                   "environment": {**host.environment, "delay_applied": delay,
                                   "notes": [f"netem is missing from this kernel: the {scenario.delay} delay is "
                                             "NOT applied"] if scenario.delay and not delay else []},
                   "ovs_instances": plan.ovs_instances, "policies": policies}
        if plan.controllers > 1:
            summary["controllers"] = {**cluster.described(plan.controllers),
                                      "owners": {label: result.get("owners", {}) for label, result in done.items()}}
        if prometheus_url:
            summary["prometheus"] = _recorded(prometheus_url, policies, host.out / "prometheus")
        return summary

    def table(self, summary: dict[str, Any]) -> str:
        return report.table(summary) + report.owners_line(summary) + report.faults_line(summary)

    def figure(self, summary: dict[str, Any], path: Path) -> None:
        report.figure(summary, path)
        report.latency_figure(summary, path.with_name(LATENCY_FIGURE))


def _scenario(args: argparse.Namespace) -> Scenario:
    steps = None
    parse_delay(args.delay, "--delay")
    if not 1 <= args.metrics_port <= 65535:
        raise ScenarioError(f"--metrics-port: {args.metrics_port} is not a TCP port; give one from 1 to 65535")
    if args.udp_steps is not None:
        try:
            steps = [float(s) for s in args.udp_steps.split(",")]
        except ValueError:
            raise ScenarioError(f"--udp-steps: {args.udp_steps!r} is not a comma-separated list of numbers") from None
    scenario = load_scenario(args.scenario, {"bottleneck": args.bottleneck, "delay": args.delay,
                                             "udp_steps_mbps": steps,
                                             "tcp_congestion_control": args.tcp_congestion_control,
                                             "queue_packets": args.queue_packets, "tcp_flows": args.tcp_flows,
                                             "repeat": args.repeat, "idle_ports": args.idle_ports,
                                             "lone_udp_mbps": args.lone_udp})
    if args.quick:
        scenario = scenario.quick()
    for key in ("step_seconds", "cooldown_seconds"):
        if getattr(args, key) is not None:
            try:
                scenario = dataclasses.replace(scenario, **{key: getattr(args, key)})   # validated on construction
            except ScenarioError as err:   # named as the user wrote it
                raise ScenarioError(str(err).replace(key, "--" + key.replace("_", "-"), 1)) from None
    return scenario


def _controllers(args: argparse.Namespace) -> int:
    count = int(args.controllers) if args.controllers.isdigit() else 0
    if not 1 <= count <= cluster.MAX_MEMBERS:
        raise UsageError(f"--controllers {args.controllers}: give a whole number from 1 to {cluster.MAX_MEMBERS} "
                         "(1, the default: one controller and no etcd)")
    if count > 1 and args.metrics_port in cluster.ports(count):
        raise UsageError(f"--metrics-port {args.metrics_port}: a port of the --controllers {count} members; choose "
                         "another (the default is 9102)")
    return count


def _run_policy(name: str, document: dict, scenario: Scenario, delay: str | None, probe: bool, after: float | None,
                ctx: TrialContext) -> dict:
    policy = parse_policy(document)

    def on_start(item: traffic.Item) -> None:
        # UDP's offered rate as each step starts; not for TCP, nor the unlabelled wait before UDP alone.
        if ctx.live and isinstance(item, Probe):
            ctx.live.probe(ctx.raw_dir / f"{item.name}.txt")
        elif ctx.live and isinstance(item, Flow) and item.udp_mbps is not None:
            ctx.live.step(name, item.udp_mbps)
        elif ctx.live and isinstance(item, Pause) and item.label:
            ctx.live.step(name, 0.0)

    reach = [("h1", "h4"), *([("h2", "h3")] if probe else [])]
    with idle_under(ctx, scenario.idle_ports) as idle, \
            network_under(ctx, StudyTopo(delay=delay), with_idle_ports(document, idle), reach) as net:
        owners = owned(ctx.client.status(), {f"{sw.dp_id:016x}" for sw in policy.switches}, name)
        wait = traffic.connect_seconds(scenario.bottleneck_bps, scenario.queue_packets)
        spec = study_traffic(scenario, probe)
        unloaded = traffic.run(net, trafficfile.unloaded(spec), ctx.raw_dir, wait, ctx.tick)[0] if probe else None
        before = trafficfile.UNLOADED_SECONDS if probe else 0.0
        started = time.time()
        planned = trafficfile.lanes(spec)
        auto = any(p.queues == "auto" for sw in policy.switches for p in sw.ports)
        udp = UdpOnsets(UDP_INGRESS)
        fault = Fault(ctx.client, BOTTLENECK_DP_ID, after, name) \
            if after is not None and isinstance(ctx.client, cluster.ClusterClient) else None
        with Monitor(BOTTLENECK, fine=auto) as monitor, udp if auto else contextlib.nullcontext(), \
                fault or contextlib.nullcontext():
            ran = traffic.run(net, planned, ctx.raw_dir, wait, lambda label, t: ctx.tick(label, before + t), on_start)
        tc = Tc()
        try:
            classes, leaves = tc.classes(BOTTLENECK), tc.leaves(BOTTLENECK)
        finally:
            tc.close()
        decisions = [d for d in ctx.client.status()["decisions"] if d["time"] >= started]
    by_item = {id(r.item): r for r in ran}
    tcp = by_item[id(planned[0][0])]
    tcp.require()
    steps = [by_item[id(item)] for item in planned[1][:len(scenario.udp_steps_mbps)]]   # a period each
    alone = by_item[id(planned[2][-1])] if scenario.lone_udp else None
    probed = by_item[id(planned[-1][0])] if probe else None
    result = report.summarise_run(scenario.bottleneck_bps, scenario.settle_seconds, scenario.udp_steps_mbps, policy,
                                  tcp, steps, monitor.samples, classes, leaves, decisions, alone, probed, unloaded)
    if fault is not None and (happened := fault.result(tcp.started)):
        result["fault"] = happened
    reservation = report.reservation_mbps(policy, scenario.bottleneck_bps)
    if reservation is not None and decisions:
        arrivals = [(round(t - tcp.started, 3), counts) for t, counts in monitor.arrivals]
        result["episodes"] = episodes([round(t - tcp.started, 3) for t in udp.starts], result["decisions"],
                                      result["tcp_series"], reservation, arrivals)
    return {"policy": name, **result, **({"owners": owners} if owners else {})}


def study_traffic(scenario: Scenario, probe: bool) -> trafficfile.Traffic:
    """The scenario's traffic, checked as any traffic file is: lanes in the order tcp, udp, udp_alone, probe."""
    return trafficfile.parse(scenario.traffic(probe), "the study's traffic")


@contextlib.contextmanager
def idle_under(ctx: TrialContext, ports: int) -> Iterator[list[IdleBridge]]:
    """--idle-ports' bridges, pointed at every controller the study's switches are pointed at."""
    with idle_bridges(ports, IDLE_PORTS_PER_BRIDGE, record=ctx.host.record) as idle:
        if idle and len(ctx.client.openflow_ports) > 1:
            cluster.point([b.name for b in idle], ctx.client.openflow_ports)
        yield idle


def owned(status: dict, dp_ids: set[str], label: str) -> dict[str, str]:
    """A cluster's switches among `dp_ids` → the member that owns each, said on stderr (plainly when one
    owns them all); {} for one controller."""
    owners = {sw["bridge"]: sw["member"] for dp, sw in status["switches"].items() if dp in dp_ids and "member" in sw}
    if owners:
        one = f"; {next(iter(owners.values()))} owns them all: this run shows no sharing" \
            if len(set(owners.values())) == 1 < len(owners) else ""
        note(f"{label}: {report.owners_text(owners)}{one}")
    return owners


def with_idle_ports(document: dict, bridges: list) -> dict:
    """The policy, and every idle port an auto port at IDLE_CAPACITY forwarded the normal way."""
    return {**document, "switches": {**document["switches"], **policy_switches(bridges, IDLE_CAPACITY)}} \
        if bridges else document


def _recorded(url: str, policies: dict[str, dict], data_dir: Path) -> dict[str, Any]:
    """What Prometheus holds of each policy's TCP throughput: the query and its points."""
    recorded: dict[str, Any] = {"url": url, "data_dir": str(data_dir), "queries": {}}
    for name, result in policies.items():
        runs = result["repetitions"]
        recorded["queries"][name] = prometheus.recorded(url, tcp_throughput_query(name), runs[0]["t0"],
                                                        runs[-1]["t0"] + runs[-1]["cooldown"]["end_s"])
    return recorded


STUDY = MainStudy()
