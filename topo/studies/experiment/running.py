"""One trial of an experiment run: a fresh network of its topology (or, for a non-blocking trial, its hosts
on one switch), each declared link's rate and delay told to OVS for the controller, the trial's policy put
and in force, every flow's path checked, then its traffic run (topo/net/traffic.py) while every queued
port is watched; what ran goes to the reduction (reducing.py)."""
from __future__ import annotations

import subprocess
from contextlib import ExitStack
from functools import partial

import yaml

from controller.core.bridges import CAPACITY_KEY, DELAY_KEY
from controller.core.policy import parse_policy
from topo.harness import fidelity
from topo.harness.launch import Host, note
from topo.net import custom, experimentfile, traffic, trafficfile
from topo.net.network import Network, network
from topo.studies.base import Trial, TrialContext, UsageError, check_path
from topo.studies.experiment import reducing
from topo.studies.experiment.planning import Plan, lacking, queue_rule
from topo.studies.experiment.reducing import QueuedPort
from topo.studies.experiment.summary import TrialResult

EXPERIMENT_FILE = "experiment.yaml"


def trials(plan: Plan, host: Host) -> list[Trial[TrialResult]]:
    """The plan's trials, once this host is known to run them (refused in one line before any network
    starts where it cannot)."""
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
                  partial(one_trial, t, plan)) for t in plan.experiment.trials]


def delays_lacking(host: Host) -> str | None:
    """Why the links' delays cannot be applied here, or None. netem drops at the tail, which on the userspace
    datapath loses other classes' packets uncounted (controller/core/queues.py)."""
    if not host.environment["netem"]:
        return "this kernel lacks netem"
    return "netem's tail drops need the kernel datapath" if host.datapath != "kernel" else None


def one_trial(trial: experimentfile.TrialSpec, plan: Plan, ctx: TrialContext) -> TrialResult:
    # A fresh Topo for a fresh network.
    loaded = custom.load(plan.experiment.topo, plan.experiment.params, nonblocking=trial.nonblocking)
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
        ctx.client.wait(lambda s: all(s["switches"].get(p.dp_id, {}).get("ports", {}).get(str(p.port), {})
                                      .get("queues") == want for p in ports), 30,
                        f"policy {trial.policy}'s queues on every link")
        for f in spec.flows:
            check_path(net, f.src, f.dst)
        if spec.probe:
            check_path(net, *spec.probe)
        slowest = min((p.bps for p in ports), default=10**9)
        wait = traffic.connect_seconds(slowest, rule.queue_packets)
        unloaded = traffic.run(net, trafficfile.unloaded(spec), ctx.raw_dir, wait, ctx.tick)
        before = trafficfile.UNLOADED_SECONDS if unloaded else 0
        with ExitStack() as stack:
            monitors = {p.iface: stack.enter_context(fidelity.Monitor(p.iface)) for p in ports}
            ran = traffic.run(net, trafficfile.lanes(spec), ctx.raw_dir, wait,
                              lambda label, t: ctx.tick(label, before + t))
        status = ctx.client.status()
    # The links' delays on the longest TCP path, both ways: whether the queues hold what TCP keeps in flight.
    links_rtt = 2 * max((custom.one_way_seconds(loaded, f.src, f.dst) for f in spec.flows if not f.udp),
                        default=0.0) if delays else 0.0
    return reducing.result(trial, ran, reducing.Watched(ports, monitors), status, parse_policy(document),
                           unloaded[0] if unloaded else None, plan.path_rtt_seconds + links_rtt,
                           rule.queue_packets, plan.path_loss_percent)


def _declare(net: Network, links: list[custom.DeclaredLink], delays: bool) -> list[QueuedPort]:
    """Each declared link's rate, and its delay when `delays`, on the interfaces of its switch ends."""
    ports = []
    for link in links:
        declared = {CAPACITY_KEY: link.bps, **({DELAY_KEY: link.delay} if link.delay and delays else {})}
        for switch, port in link.queued:
            node = net.host(switch)
            iface = node.intfs[port].name
            subprocess.run(["ovs-vsctl", "set", "interface", iface,
                            *(f"external_ids:{key}={value}" for key, value in declared.items())],
                           check=True, capture_output=True, timeout=30)
            ports.append(QueuedPort(node.dpid, port, iface, link.bps))
    return ports
