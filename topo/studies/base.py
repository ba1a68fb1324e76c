"""Every study behind one small interface, run by one driver.

A study turns its command line into a plan (checked before anything starts: a bad flag or policy
exits 2 and touches nothing), the plan into trials (each on a fresh network, with its traffic described
as a traffic file, topo/net/trafficfile.py, and run by the one traffic runner, topo/net/traffic.py), and
their results into a summary, a table and a figure.
The driver does the rest for every study: the host lock and probes (topo/harness/launch.py), the
controller, Prometheus and the live exporter where the study records series, the progress bar,
summary.json rewritten after every trial (an interrupted run keeps what finished; a run that fails
after a trial writes that trial's table and figure too), exit codes (0 done, 1 could not run, 2 usage,
130 interrupted).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

# Not from controller.adapters.ovsdb: python-ovs would import eventlet, which warns on the launcher's stderr.
from controller.core.policy import LOCAL_OVSDB, PolicyError, load_document, parse_policy, parse_rate
from topo.harness import cluster, fidelity
from topo.harness.controller import ControllerClient, ControllerError, controller
from topo.harness.launch import USAGE_ERROR, Host, LaunchError, launched, note
from topo.harness.live import LiveThroughput
from topo.harness.progress import ProgressBar
from topo.harness.prometheus import PrometheusError, prometheus
from topo.harness.report import reasons_text, write_json
from topo.net import iperf
from topo.net.network import Network, network
from topo.net.ovs_instance import CONTROLLER_ADDRESS, InstanceError, OvsInstance, ovs_instance
from topo.net.traffic import Flow, Ran, TrafficError

REPO = Path(__file__).resolve().parents[2]
_ALGORITHM = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
SETTLE_SECONDS = 1.0          # left out of every mean: connection set-up and slow start


class UsageError(ValueError):
    """The command line asks for something that cannot run; the message says what to change."""


class StudyError(RuntimeError):
    """The study could not be carried out (connectivity, switches, queues)."""


# What ends a run that could not be carried out (exit 1); the trials finished before keep their results.
RUN_FAILED = (ControllerError, StudyError, TrafficError, PrometheusError, PolicyError, InstanceError)


@dataclass(frozen=True)
class TrialContext:
    client: ControllerClient
    host: Host
    raw_dir: Path                                  # where this trial's raw output goes
    tick: Callable[[str, float], None]             # progress: label, seconds since its traffic started
    live: LiveThroughput | None                    # the live exporter, for studies that record
    placed: dict[str, OvsInstance] = field(default_factory=dict)   # switches on a second OVS (--ovs-instances 2)


PlanT = TypeVar("PlanT")
ResultT = TypeVar("ResultT")
SummaryT = TypeVar("SummaryT", bound=Mapping[str, Any])


@dataclass(frozen=True)
class Trial(Generic[ResultT]):
    label: str                                     # e.g. "reserve 2/3", "cubic"
    raw: str                                       # its folder under raw/
    seconds: float                                 # length of its traffic, for the progress bar
    run: Callable[[TrialContext], ResultT]


class Study(Generic[PlanT, ResultT, SummaryT]):
    """What a study provides; the driver (`run`) calls these in order. Its plan, each trial's result and
    its summary are of its own types."""
    name = ""
    description = ""
    records = False           # Prometheus records the controller while the trials run
    live = False              # and the launcher's live exporter (the main study's flows and probe) beside it

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def plan(self, args: argparse.Namespace) -> PlanT:
        """Everything the trials need, validated; raise UsageError (or PolicyError) on bad input."""
        raise NotImplementedError

    def trials(self, plan: PlanT, host: Host) -> list[Trial[ResultT]]:
        raise NotImplementedError

    def summary(self, plan: PlanT, host: Host, done: dict[str, ResultT], prometheus_url: str | None) -> SummaryT:
        raise NotImplementedError

    def table(self, summary: SummaryT) -> str:
        raise NotImplementedError

    def figure(self, summary: SummaryT, path: Path) -> None:
        raise NotImplementedError

    figure_name = "figure.png"


def parser_for(study: Study[Any, Any, Any], prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=study.description)
    p.add_argument("--quick", action="store_true", help="shorter runs, for a first look")
    p.add_argument("--out", type=Path, help="results folder (default results/<timestamp>[-<command>])")
    p.add_argument("--datapath", choices=("auto", "user", "kernel"), default="auto",
                   help="OVS datapath; auto picks kernel where the OVS module is loaded, else userspace")
    study.add_arguments(p)
    return p


def run(study: Study[Any, Any, Any], argv: list[str], prog: str) -> int:
    args = parser_for(study, prog).parse_args(argv)
    try:
        check_out(args.out)
        plan = study.plan(args)
    except (UsageError, PolicyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_ERROR
    done: dict[str, Any] = {}
    try:
        with launched(args.out, args.datapath, "" if study.name == "main" else study.name) as host:
            try:
                summary = _run_trials(study, plan, host, args, done)
            except KeyboardInterrupt:
                if done:
                    write_json(host.out / "summary.json", {**study.summary(plan, host, done, None),
                                                           "complete": False, "interrupted": True})
                raise
            except RUN_FAILED as err:
                if not done:
                    raise
                # What finished is a result, with its table and figure, whatever ended the run after it.
                _results(study, {**study.summary(plan, host, done, None), "complete": False, "error": str(err)},
                         host.out)
                print(f"error: {err}; the {len(done)} finished trial(s) have their results in {host.out}",
                      file=sys.stderr)
                return 1
            print(_results(study, summary, host.out))
            print(f"results in {host.out}")
            return 0
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_ERROR
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code
    except RUN_FAILED as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: network, processes and queues cleaned up" +
              (f"; summary.json keeps the {len(done)} finished" if done else ""), file=sys.stderr)
        return 130


def _results(study: Study[Any, Any, Any], summary: Any, out: Path) -> str:
    """summary.json, table.md and the figure written to `out`; the table."""
    write_json(out / "summary.json", summary)
    table = study.table(summary)
    (out / "table.md").write_text(table)
    study.figure(summary, out / study.figure_name)
    return table


def check_out(out: Path | None) -> None:
    """--out: a folder the run can make (its missing parents too) and write in, checked before anything starts."""
    if out is None:
        return
    folder = next(p for p in (out.absolute(), *out.absolute().parents) if p.exists())
    if not folder.is_dir():
        raise UsageError(f"--out {out}: {folder} is not a folder; choose a folder's path")
    try:   # a folder made and removed: access() says yes to root in /proc and /sys, where nothing can be made
        os.rmdir(tempfile.mkdtemp(dir=folder))
    except OSError:
        raise UsageError(f"--out {out}: no folder can be made in {folder} (read-only, not yours, or not a real "
                         "folder); choose another folder") from None


def _run_trials(study: Study[Any, Any, Any], plan: Any, host: Host, args: argparse.Namespace,
                done: dict[str, Any]) -> dict[str, Any]:
    controllers = getattr(plan, "controllers", 1)   # the main study's --controllers
    if controllers > 1:
        cluster.check_host(controllers)              # before anything starts, or is said
    trials = study.trials(plan, host)
    bar = ProgressBar(total=sum(t.seconds for t in trials))
    try:
        with ExitStack() as stack:
            url = None
            live = None
            if study.records:
                members = [f"127.0.0.1:{m.metrics}" for m in cluster.members(controllers)] if controllers > 1 else []
                url = stack.enter_context(prometheus(host.out / "prometheus", args.prometheus, host.record, members))
            if study.live:
                live = stack.enter_context(closing(LiveThroughput(args.metrics_port)))
            placed = {}
            if getattr(args, "ovs_instances", 1) == 2:   # the study's s2 on a second OVS, reached over TCP
                placed = {"s2": stack.enter_context(ovs_instance(record=host.record))}
            # With a second OVS the controller listens where its namespace reaches it, and reaches its OVSDB.
            remotes = (LOCAL_OVSDB, *(i.remote for i in placed.values())) if placed else ()
            openflow_host = CONTROLLER_ADDRESS if placed else None
            client = stack.enter_context(
                cluster.cluster(host.out, controllers, host.record, remotes, openflow_host) if controllers > 1 else
                controller(host.out / "controller.log", host.record, ovsdb=remotes, openflow_host=openflow_host))
            offset = 0.0
            for k, trial in enumerate(trials):
                bar.start_part(f"{trial.label} ({k + 1}/{len(trials)})", offset)
                offset += trial.seconds
                done[trial.label] = trial.run(TrialContext(client, host, host.out / "raw" / trial.raw, bar.tick, live,
                                                           placed))
                write_json(host.out / "summary.json", {**study.summary(plan, host, done, None), "complete": False})
            if url:
                time.sleep(2)   # the last second's scrape
            return {**study.summary(plan, host, done, url), "complete": True}
    finally:
        bar.finish()


# --- what trials share ------------------------------------------------------------------------

def policy_path(name: str) -> Path:
    """--policy NAME: policies/NAME.yaml, or a path to a YAML file."""
    path = Path(name) if name.endswith((".yaml", ".yml")) else REPO / "policies" / f"{name}.yaml"
    if not path.is_file():
        raise PolicyError(f"--policy {name}: no file {path}; choose one of "
                          f"{', '.join(p.stem for p in sorted((REPO / 'policies').glob('*.yaml')))}")
    return path


def policy_document(name: str, capacity_bps: int, queue_packets: int, discipline: str = "fifo",
                    police_bps: int | None = None) -> dict:
    """policies/<name>.yaml (or a path), validated, every port with the study's rate and queue, and every
    policed class held to `police_bps`, or by default to its min share of the study's rate (with the
    default burst, 100 ms at that rate)."""
    doc = load_document(policy_path(name))   # its base merged in
    policy = parse_policy(doc)   # named errors before anything is overridden
    for switch in doc["switches"].values():
        for port in (switch or {}).get("ports", {}).values():
            port.update(capacity=capacity_bps, queue_packets=queue_packets, discipline=discipline)
    for cls in policy.classes:
        if cls.police:
            doc["classes"][cls.name]["police"] = {"rate": police_bps or round(cls.min_share * capacity_bps)}
    parse_policy(doc)
    return doc


@contextmanager
def network_under(ctx: TrialContext, topo, document: dict, reach: list[tuple[str, str]]) -> Iterator[Network]:
    """`topo` up under `document`'s flows and queues, each (src, dst) of `reach` able to ping."""
    policy = parse_policy(document)
    # The new switches must connect to no policy: what a previous trial left must not shape them.
    ctx.client.clear_policy()
    with network(topo, ctx.host.datapath, ctx.host.record, ctx.client.openflow_ports, ctx.placed) as net:
        wanted = {f"{s.dp_id:016x}" for s in policy.switches}
        ctx.client.wait(lambda s: wanted <= set(s["switches"]), 30, "every switch connected")
        ctx.client.put_policy(document)
        ctx.client.wait(lambda s: queues_in_force(s, policy), 20, f"policy {policy.name}'s queues in force")
        for src, dst in reach:
            check_path(net, src, dst)
        yield net


def queues_in_force(status: dict, policy) -> bool:
    """Every QoS port has the queues its mode starts with (auto has its classes ready, nothing steered)."""
    return all(status["switches"].get(f"{sw.dp_id:016x}", {}).get("ports", {}).get(str(p.port_no), {})
               .get("queues") == ("fifo" if p.queues == "fifo" else "reserve")
               for sw in policy.switches for p in sw.ports)


def check_path(net: Network, src: str, dst: str) -> None:
    # Userspace bridges take a moment before forwarding the first packets.
    a, b = net.host(src), net.host(dst)
    for _ in range(10):
        if "1 received" in a.cmd(f"ping -c1 -W1 {b.IP()}"):
            return
        time.sleep(0.5)
    raise StudyError(f"{src} cannot reach {dst}: the flows or the switches are not forwarding")


def equal_trial(setup: Settings, flows: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A trial's traffic as a traffic file (topo/net/trafficfile.py): `flows` for the trial's seconds, in one step."""
    return {"step_seconds": setup.seconds, "flows": flows, **extra}


def flows_of(ran: list[Ran]) -> list[Ran]:
    return [r for r in ran if isinstance(r.item, Flow)]


def trial_fidelity(samples: list[fidelity.Sample], span: tuple[float, float], capacity_bps: int,
                   ran: list[Ran], rtt_seconds: float = 0.0, queue_packets: int | None = None,
                   loss_percent: float | None = None, leaf_drops: int = 0) -> dict[str, Any]:
    """The fidelity monitor's verdict over a trial's common window, for all of its TCP flows.
    `rtt_seconds`: the delay added to the path, both ways; with `queue_packets` it tells whether the
    queue holds the bandwidth-delay product. `loss_percent`: the loss set on the path. `leaf_drops`:
    what the bottleneck's queue itself dropped (an AQM's dequeue drops)."""
    tcp = [r for r in flows_of(ran) if r.flow.udp_mbps is None and r.error is None]   # a failed test: no numbers
    retransmits = sum(iperf.window_retransmits(iperf.sent(r.require()), r.started, *span) for r in tcp)
    short_queue = queue_packets is not None and fidelity.bdp_packets(capacity_bps, rtt_seconds) > queue_packets
    return fidelity.assess(samples, *span, capacity_bps, None, retransmits if tcp else None,
                           [fidelity.Received(iperf.received(r.require()), r.started) for r in tcp], short_queue,
                           (loss_percent or 0.0) / 100, leaf_drops)


def faithful_cell(result: Mapping[str, Any]) -> str:
    return "yes" if result["faithful"] else "no †"


def fidelity_notes(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The fidelity monitor's notes under a table, one line each; nothing when every run was faithful."""
    notes = [f"- {label}: {note}" for label, r in results.items() for note in r["fidelity_notes"]]
    return "\n† not faithful (the emulator, not the studied mechanism, decided):\n" + "\n".join(notes) + "\n" \
        if notes else ""


def say_unavailable(what: str, reasons: dict[str, str]) -> None:
    if reasons:
        note(f"{what}: {reasons_text(reasons)}")


def add_prometheus_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", choices=("auto", "none"), default="auto",
                   help="auto: record series in the Prometheus on 127.0.0.1:9090, or start Debian's with its data in "
                        "DIR/prometheus (then `topo/run.py report DIR` draws the dashboards); none: no time series")


def check_algorithms(flag: str, names: list[str]) -> None:
    """TCP congestion-control names as the kernel spells them (lowercase)."""
    for name in names:
        if not _ALGORITHM.match(name):
            raise UsageError(f"{flag}: {name!r} is not a congestion control's name; e.g. cubic, reno or bbr")


def add_trial_arguments(p: argparse.ArgumentParser, *, seconds: float, quick_seconds: float, bottleneck: str,
                        queue_packets: int) -> None:
    """The flags of the studies made of equal trials (cc, fairness, aqm)."""
    p.add_argument("--seconds", type=float, help=f"length of each run (default {seconds:g}; with --quick "
                                                 f"{quick_seconds:g})")
    p.add_argument("--bottleneck", default=bottleneck, help=f"bottleneck rate (default {bottleneck})")
    p.add_argument("--queue-packets", type=int, default=queue_packets,
                   help=f"packet limit of the bottleneck queue (default {queue_packets})")
    p.set_defaults(default_seconds=seconds, quick_seconds=quick_seconds)


@dataclass(frozen=True)
class Settings:
    bottleneck_bps: int
    seconds: int
    queue_packets: int
    quick: bool

    def scenario(self, **extra: Any) -> dict[str, Any]:
        return {"bottleneck": self.bottleneck_bps, "seconds": self.seconds, "settle_seconds": SETTLE_SECONDS,
                "queue_packets": self.queue_packets, "quick": self.quick, **extra}


def settings(args: argparse.Namespace) -> Settings:
    try:
        bps = parse_rate(args.bottleneck, "--bottleneck")
    except PolicyError as err:
        raise UsageError(str(err)) from None
    seconds = args.seconds if args.seconds is not None else \
        args.quick_seconds if args.quick else args.default_seconds
    if seconds != int(seconds) or seconds <= SETTLE_SECONDS + 1:
        raise UsageError(f"--seconds: {seconds:g} must be a whole number of seconds above {SETTLE_SECONDS + 1:g} "
                         "(iperf3 runs whole seconds; the first one is left out of every mean)")
    if not 1 <= args.queue_packets <= 100_000:
        raise UsageError(f"--queue-packets: {args.queue_packets} must be from 1 to 100000")
    return Settings(bps, int(seconds), args.queue_packets, args.quick)

