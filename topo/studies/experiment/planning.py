"""An experiment planned, before anything starts: the command line or the files read, the topology built
(not started), the traffic laid on its hosts, every trial's policy read for any network, and everything
checked that can be, so a mistake is one line and exit 2 and nothing is left behind."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from controller.core.policy import PolicyError, PortRule, for_any_network, load_document, parse_policy
from topo.harness import capabilities
from topo.net import custom, experimentfile, trafficfile
from topo.studies.base import REPO, UsageError, policy_path

POLICIES = ("none", "reserve", "auto")
QUICK_STEP_SECONDS = 4
TOPOS = REPO / "topo" / "topos.py"


@dataclass(frozen=True)
class Plan:
    experiment: experimentfile.Experiment   # every trial's traffic laid on the topology's hosts
    loaded: custom.Loaded
    documents: dict[str, dict]        # each trial's policy, for any network, with the trial's ports
    path_rtt_seconds: float = 0.0     # delay the topology adds to the flows' path, both ways (the fidelity verdict)
    path_loss_percent: float | None = None
    study: Any = None                 # what a study made of an experiment (cc, fairness, aqm) keeps for its table
    document: dict | None = None      # such a study's experiment file, written to the results as EXPERIMENT_FILE


def from_args(args: argparse.Namespace) -> Plan:
    """The plan of the command line: an experiment file, or --topo, --traffic and --policy."""
    try:
        experiment = of_command_line(args)
    except (custom.TopologyError, trafficfile.TrafficFileError, experimentfile.ExperimentFileError) as err:
        raise UsageError(str(err)) from None
    return prepared(experiment, str(args.experiment or args.traffic), QUICK_STEP_SECONDS if args.quick else None)


def of_command_line(args: argparse.Namespace) -> experimentfile.Experiment:
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


def prepared(experiment: experimentfile.Experiment, where: str, quick_step_seconds: int | None = None,
             **more: Any) -> Plan:
    """The plan of `experiment` (from `where`), checked: its topology builds (and, for a non-blocking trial,
    its hosts on one switch), its patterns lay on its hosts, it has every host the traffic names and every
    link its events change, every trial's policy is good; with `quick_step_seconds`, its steps that long."""
    try:
        loaded = custom.load(experiment.topo, experiment.params)
        if any(t.nonblocking for t in experiment.trials):
            custom.load(experiment.topo, experiment.params, nonblocking=True)
        trials = tuple(_laid(t, loaded, experiment.topo) for t in experiment.trials)
    except (custom.TopologyError, trafficfile.TrafficFileError) as err:
        raise UsageError(str(err)) from None
    hosts = set(loaded.topo.hosts())
    for trial in trials:
        missing = sorted(trial.traffic.hosts() - hosts)
        if missing:
            which = "" if all(t.traffic == trial.traffic for t in trials) else f"trial {trial.name}: "
            raise UsageError(f"{where}: {which}host {missing[0]} is not in {experiment.topo} (it has "
                             f"{', '.join(loaded.hosts())}); fix from/to")
    if quick_step_seconds:
        trials = tuple(experimentfile.rescaled(t, quick_step_seconds) for t in trials)
    experiment = replace(experiment, trials=trials)
    return Plan(experiment, loaded, {t.name: trial_policy(t) for t in trials}, **more)


def _laid(trial: experimentfile.TrialSpec, loaded: custom.Loaded, topo: str) -> experimentfile.TrialSpec:
    """The trial with its traffic's patterns laid on the topology's hosts (the same for every trial, a
    non-blocking one too), and its link events checked against the topology's links. A non-blocking trial
    runs without them: they name links its one switch does not have."""
    traffic = trafficfile.expanded(trial.traffic, loaded.hosts(), loaded.groups)
    if trial.nonblocking:
        return replace(trial, traffic=replace(traffic, events=()))
    for event in traffic.events:
        a, b = event.link
        if not loaded.linked(a, b):
            ends = f"{a}'s links go to {', '.join(loaded.neighbours(a))}" if loaded.neighbours(a) else \
                f"{a} is not in it"
            raise trafficfile.TrafficFileError(f"{event.where}.link: {a}-{b} is not a link of {topo} ({ends}); "
                                               "fix link")
    return replace(trial, traffic=traffic)


def study_experiment(setup: Any, topo: str, params: dict[str, Any], ports: dict[str, Any],
                     trials: list[dict[str, Any]]) -> dict[str, Any]:
    """A study's experiment file: topo/topos.py's `topo` with its bottleneck at the study's rate (its
    Settings), each trial under policy none (one FIFO per queued port) with `ports`."""
    return {"topo": f"{TOPOS}:{topo}", "topo_params": {"bw": setup.bottleneck_bps / 1e6, **params},
            "policy": "none", "ports": ports, "trials": trials}


def study_plan(document: dict[str, Any], name: str, **more: Any) -> Plan:
    """The plan of a study's experiment file (`document`, its paths absolute)."""
    try:
        experiment = experimentfile.parse(document, f"the {name} study's experiment", Path("/"))
    except experimentfile.ExperimentFileError as err:
        raise UsageError(str(err)) from None
    return prepared(experiment, f"the {name} study", document=document, **more)


def keeping(plan: Plan, names: set[str]) -> Plan:
    """`plan` with only the trials named (those a study found this kernel can run)."""
    return replace(plan, experiment=replace(plan.experiment,
                                            trials=tuple(t for t in plan.experiment.trials if t.name in names)))


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
