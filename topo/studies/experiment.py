"""Your own network and traffic under the controller, once per policy:

    sudo python topo/run.py --topo FILE:NAME [--topo-param k=v ...] --traffic FILE [--policy none reserve auto]

The topology comes from a Mininet custom file (topo/net/custom.py), the traffic from a traffic file
(topo/net/trafficfile.py), and each policy is put as it is for any network (its `network:` section,
its `switches:` left out): the controller learns the hosts and queues every link the topology gave a
bw=. Each policy runs on a fresh network; every queued port is watched (its HTB classes' bytes and
drops, the host's CPU pressure) while the traffic runs. The results say, per step, each flow's goodput
(TCP's retransmits, UDP's loss), Jain's index over the TCP flows, each queued port's use and drops per
class, and what `auto` decided, where and when.
"""
from __future__ import annotations

import argparse
import subprocess
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from controller.core.bridges import CAPACITY_KEY
from controller.core.plan import HTB_PARENT, htb_classid
from controller.core.policy import Policy, for_any_network, load_document, parse_policy
from topo.harness import fidelity, prometheus
from topo.harness.launch import Host, note
from topo.harness.report import Panel, bar_figure, jain_index, markdown_table
from topo.net import custom, iperf, probe, traffic, trafficfile
from topo.net.network import Network, network
from topo.net.traffic import Flow, Probe, Ran
from topo.studies.base import (
    SETTLE_SECONDS,
    Study,
    Trial,
    TrialContext,
    UsageError,
    add_prometheus_argument,
    check_path,
    policy_path,
)

POLICIES = ("none", "reserve", "auto")
QUICK_STEP_SECONDS = 4
LOADED = 0.25               # a queued port this busy (of its capacity) at some step is a bottleneck in the results
BOTTLENECK_FIGURE = "bottlenecks.png"
AFTER = "after"              # the row of the time after the last step, when a flow runs on
STARVED_PRESSURE = 0.2       # share of a step the host's runnable tasks waited for a CPU: the emulator decided


@dataclass(frozen=True)
class Plan:
    topo_spec: str
    params: dict[str, Any]
    loaded: custom.Loaded
    traffic: trafficfile.Traffic
    documents: dict[str, dict]


class ExperimentStudy(Study):
    name = "experiment"
    description = "Your own network (a Mininet custom file) and traffic (a traffic file) under each policy."
    figure_name = "throughput.png"
    records = True

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--topo", required=True, metavar="FILE:NAME",
                       help="a Mininet custom file and a topology in its topos dict, as mn --custom FILE --topo NAME")
        p.add_argument("--topo-param", nargs="*", default=[], metavar="K=V", help="the topology's parameters")
        p.add_argument("--traffic", required=True, type=Path, metavar="FILE", help="the traffic file (YAML)")
        p.add_argument("--policy", nargs="+", default=list(POLICIES), metavar="NAME",
                       help="policies/NAME.yaml or a path, each run on its own network (default none reserve auto)")
        add_prometheus_argument(p)

    def plan(self, args: argparse.Namespace) -> Plan:
        try:
            params = custom.parse_params(args.topo_param)
            loaded = custom.load(args.topo, params)
            spec = trafficfile.load(args.traffic)
        except (custom.TopologyError, trafficfile.TrafficFileError) as err:
            raise UsageError(str(err)) from None
        hosts = set(loaded.topo.hosts())
        missing = sorted(spec.hosts() - hosts)
        if missing:
            raise UsageError(f"{args.traffic}: host {missing[0]} is not in {args.topo} (it has "
                             f"{', '.join(sorted(hosts))}); fix from/to")
        if args.quick:
            spec = trafficfile.Traffic(QUICK_STEP_SECONDS, spec.steps, _rescaled(spec, QUICK_STEP_SECONDS), spec.probe)
        return Plan(args.topo, params, loaded, spec, {name: policy_for_any_network(name) for name in args.policy})

    def trials(self, plan: Plan, host: Host) -> list[Trial]:
        if plan.loaded.delays:
            note(f"link delay not applied (this launcher does not yet put netem on switch links): "
                 f"{', '.join(plan.loaded.delays)}")
        seconds = plan.traffic.seconds + (trafficfile.UNLOADED_SECONDS if plan.traffic.probe else 0)
        return [Trial(name, name, seconds, partial(_one_policy, name, plan)) for name in plan.documents]

    def summary(self, plan: Plan, host: Host, done: dict[str, dict], prometheus_url: str | None) -> dict[str, Any]:
        t = plan.traffic
        scenario = {"topo": plan.topo_spec, "topo_params": plan.params, "step_seconds": t.step_seconds,
                    "steps": t.steps, "seconds": t.seconds, "settle_seconds": SETTLE_SECONDS,
                    "flows": [{"name": f.name, "from": f.src, "to": f.dst, "protocol": f.protocol,
                               "start_s": f.start, "end_s": f.end, "cc": f.cc,
                               "offered_mbps": list(f.mbps) if f.udp else None} for f in t.flows],
                    "links": [{"ends": [f"{s}:{p}" for s, p in link.ends], "bps": link.bps}
                              for link in plan.loaded.links]}
        summary: dict[str, Any] = {"scenario": scenario, "environment": host.environment, "policies": done}
        if prometheus_url:
            summary["prometheus"] = _recorded(prometheus_url, done, host.out / "prometheus")
        return summary

    def table(self, summary: dict[str, Any]) -> str:
        return table(summary)

    def figure(self, summary: dict[str, Any], path: Path) -> None:
        figure(summary, path)


def policy_for_any_network(name: str) -> dict:
    """policies/<name>.yaml (or a path) as it is for any network, validated."""
    document = for_any_network(load_document(policy_path(name)))
    parse_policy(document)
    return document


def _recorded(url: str, done: dict[str, dict], data_dir: Path) -> dict[str, Any]:
    """What Prometheus holds of each queued port's sending rate as the controller saw it, per policy: the
    query, and its points over the policy's traffic."""
    recorded: dict[str, Any] = {"url": url, "data_dir": str(data_dir), "queries": {}}
    for name, result in done.items():
        for port in result["steps"][0]["ports"] if result["steps"] else ():
            dp_id, number = port.split(":")
            expr = f'8 * rate(ovsqos_port_tx_bytes_total{{dp_id="{dp_id}",port="{number}"}}[5s]) / 1e6'
            recorded["queries"][f"{name} {port}"] = prometheus.recorded(url, expr, result["t0"],
                                                                        result["t0"] + result["seconds"])
    return recorded


def _rescaled(spec: trafficfile.Traffic, seconds: int) -> tuple[trafficfile.FlowSpec, ...]:
    def scale(s: int) -> int:
        return s * seconds // spec.step_seconds
    return tuple(trafficfile.FlowSpec(f.name, f.src, f.dst, f.protocol, scale(f.start),
                                      max(scale(f.end), scale(f.start) + 2), f.cc, f.streams, f.mbps, f.dscp)
                 for f in spec.flows)


def _one_policy(name: str, plan: Plan, ctx: TrialContext) -> dict[str, Any]:
    loaded = custom.load(plan.topo_spec, plan.params)     # a fresh Topo for a fresh network
    document = plan.documents[name]
    ctx.client.clear_policy()   # the new switches connect to no policy: nothing of the last trial shapes them
    with network(loaded.topo, ctx.host.datapath, ctx.host.record, ctx.client.openflow_ports) as net:
        ports = _declare(net, loaded.links)
        dpids = {net.host(s).dpid for s in loaded.topo.switches()}
        ctx.client.wait(lambda s: dpids <= set(s["switches"]), 30, "every switch connected")
        ctx.client.put_policy(document)
        mode = (document.get("network", {}).get("ports") or {}).get("queues", "fifo")
        want = "fifo" if mode == "fifo" else "reserve"
        ctx.client.wait(lambda s: all(s["switches"].get(dp, {}).get("ports", {}).get(str(port), {}).get("queues")
                                      == want for dp, port, _, _ in ports), 30, f"policy {name}'s queues on every link")
        for f in plan.traffic.flows:
            check_path(net, f.src, f.dst)
        if plan.traffic.probe:
            check_path(net, *plan.traffic.probe)
        lanes = trafficfile.lanes(plan.traffic)
        slowest = min(bps for _, _, _, bps in ports) if ports else 10**9
        wait = traffic.connect_seconds(slowest, 25)
        unloaded = traffic.run(net, trafficfile.unloaded(plan.traffic), ctx.raw_dir, wait, ctx.tick)
        before = trafficfile.UNLOADED_SECONDS if unloaded else 0
        with ExitStack() as stack:
            monitors = {iface: stack.enter_context(fidelity.Monitor(iface)) for _, _, iface, _ in ports}
            ran = traffic.run(net, lanes, ctx.raw_dir, wait, lambda label, t: ctx.tick(label, before + t))
        status = ctx.client.status()
    return result(plan.traffic, ran, ports, monitors, status, parse_policy(document), *unloaded)


def _declare(net: Network, links: list[custom.DeclaredLink]) -> list[tuple[str, int, str, int]]:
    """Each declared link's rate on both its interfaces; (dp_id, port, interface, bit/s) of each."""
    ports = []
    for link in links:
        for switch, port in link.ends:
            node = net.host(switch)
            iface = node.intfs[port].name
            subprocess.run(["ovs-vsctl", "set", "interface", iface, f"external_ids:{CAPACITY_KEY}={link.bps}"],
                           check=True, capture_output=True, timeout=30)
            ports.append((node.dpid, port, iface, link.bps))
    return ports


def result(spec: trafficfile.Traffic, ran: list[Ran], ports: list[tuple[str, int, str, int]],
           monitors: dict[str, fidelity.Monitor], status: dict[str, Any], policy: Policy,
           unloaded: Ran | None = None) -> dict[str, Any]:
    """Per step (and the time after the steps, if a flow ran on): each flow, Jain's index over the TCP
    flows, each queued port's classes (by name: the default class is `default`), and whether the host
    starved; what the controller decided; and the probe's RTT alone on the path before the flows."""
    names = {htb_classid(c.queue): c.name for c in policy.classes} | {htb_classid(0): "default"}
    for r in ran:
        if isinstance(r.item, Flow):
            r.require()
    t0 = min(min(r.launched or r.started, r.started) for r in ran)
    probed = next((r for r in ran if isinstance(r.item, Probe)), None)
    trips = probe.round_trips(probed.doc) if probed is not None and probed.doc else []
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
                      **({"probe": probe.summary(trips, lo, hi)} if spec.probe else {})})
    decisions = [{**d, "at_s": round(d["time"] - t0, 3)} for d in status.get("decisions", [])
                 if t0 <= d["time"] <= t0 + spec.seconds + 30]
    return {"t0": round(t0, 3), "seconds": spec.seconds, "steps": steps, "decisions": decisions,
            **({"probe_unloaded": _unloaded(unloaded)} if unloaded is not None else {})}


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
    classes = {names.get(cls, cls): {"mbps": round((c.bytes - first.classes[cls].bytes) * 8 / span / 1e6, 3),
                                     "drops": c.drops - first.classes[cls].drops}
               for cls, c in last.classes.items() if cls in first.classes and cls != HTB_PARENT}
    busy = sum(c["mbps"] for c in classes.values()) * 1e6 / capacity_bps if classes else None
    pressure = None if first.cpu_pressure_us is None or last.cpu_pressure_us is None else \
        round((last.cpu_pressure_us - first.cpu_pressure_us) / 1e6 / span, 3)
    return {"utilisation": None if busy is None else round(busy, 3), "classes": classes, "cpu_pressure": pressure}


def table(summary: dict[str, Any]) -> str:
    policies = summary["policies"]
    flows = [f["name"] for f in summary["scenario"]["flows"]]
    head = ["step"] + [f"{p}: {f}" for p in policies for f in flows]
    rows = []
    for k, label in enumerate(periods(summary)):
        row: list[Any] = [label]
        for res in policies.values():
            step = res["steps"][k]
            mark = " †" if step["starved"] else ""
            row += [("–" if step["flows"][f]["mbps"] is None else f"{step['flows'][f]['mbps']:.2f}") + mark
                    for f in flows]
        rows.append(row)
    after = " (after: from the last step to the last flow's end)" if AFTER in periods(summary) else ""
    lines = [f"Goodput per flow (Mbit/s), each step of {summary['scenario']['step_seconds']} s past its first "
             f"{SETTLE_SECONDS:g} s{after}, on {summary['scenario']['topo']}:", "", markdown_table(head, rows)]
    if any(s["starved"] for res in policies.values() for s in res["steps"]):
        lines.append(f"† the host's CPU was short (pressure above {STARVED_PRESSURE:.0%}): the emulator, not the "
                     "policy, may have decided that step.\n")
    if any("probe" in s for res in policies.values() for s in res["steps"]):
        trips: list[list[Any]] = [[label, *(_rtt(res["steps"][k].get("probe")) for res in policies.values())]
                                  for k, label in enumerate(periods(summary))]
        if any("probe_unloaded" in res for res in policies.values()):
            trips.insert(0, ["alone", *(_rtt(res.get("probe_unloaded")) for res in policies.values())])
        lines += ["The probe's round-trip time, median / p95 (ms), and its packets lost (alone: on the idle path "
                  "before the flows):", "", markdown_table(["step", *policies], trips)]
    ports = loaded_ports(summary)
    if ports:
        uses: list[list[Any]] = [[label, port, *(_port_cell(res["steps"][k]["ports"].get(port))
                                                 for res in policies.values())]
                                 for port in ports for k, label in enumerate(periods(summary))]
        lines += ["Each bottleneck (a queued port at least a quarter busy at some step), per step: its use of its "
                  "capacity, and each class's Mbit/s (packets it dropped):", "",
                  markdown_table(["step", "port", *policies], uses)]
    for p, res in policies.items():
        for d in res["decisions"]:
            lines.append(f"- {p}: switch {d['dp_id']} port {d['port']} {d['action']} at {d['at_s']:.2f} s "
                         f"({d['reason']})")
    return "\n".join(lines) + "\n"


def periods(summary: dict[str, Any]) -> list[int | str]:
    """The results' rows: each step by its number, then `after` if a flow ran past the last step."""
    steps = summary["scenario"]["steps"]
    count = max((len(res["steps"]) for res in summary["policies"].values()), default=steps)
    return [*range(steps), *([AFTER] if count > steps else [])]


def loaded_ports(summary: dict[str, Any]) -> list[str]:
    """The queued ports (dp_id:port) at least LOADED busy at some step under some policy: the bottlenecks, not
    the ends of a link that only send back acknowledgements."""
    return list(dict.fromkeys(port for res in summary["policies"].values() for step in res["steps"]
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
    flows = [f["name"] for f in summary["scenario"]["flows"]]
    groups = [f"step {k}" if isinstance(k, int) else k for k in periods(summary)]
    panels = [Panel(f"{p}: goodput (Mbit/s)", {f: [s["flows"][f]["mbps"] for s in res["steps"]] for f in flows})
              for p, res in summary["policies"].items()]
    bar_figure(path, f"Each flow per step, {summary['scenario']['topo']}", groups, panels)
    ports = loaded_ports(summary)
    if ports:   # a panel per bottleneck: what each class of each policy got through it
        bar_figure(path.with_name(BOTTLENECK_FIGURE), f"Each bottleneck's classes, {summary['scenario']['topo']}",
                   groups, [Panel(f"{port}: Mbit/s", _class_series(summary, port)) for port in ports])


def _class_series(summary: dict[str, Any], port: str) -> dict[str, list[float | None]]:
    """"policy: class" → its Mbit/s at `port` in each step, for the classes that carried anything there."""
    series: dict[str, list[float | None]] = {}
    for p, res in summary["policies"].items():
        at = [s["ports"].get(port, {}).get("classes", {}) for s in res["steps"]]
        for name in dict.fromkeys(n for classes in at for n, c in classes.items() if c["mbps"]):
            series[f"{p}: {name}"] = [classes.get(name, {}).get("mbps") for classes in at]
    return series


STUDY = ExperimentStudy()
