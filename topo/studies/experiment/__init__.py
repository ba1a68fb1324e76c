"""Your own network and traffic under the controller, once per trial:

    sudo python topo/run.py --topo FILE:NAME [--topo-param k=v ...] --traffic FILE [--policy none reserve auto]
    sudo python topo/run.py --experiment FILE

The topology comes from a Mininet custom file (topo/net/custom.py), the traffic from a traffic file
(topo/net/trafficfile.py); an experiment file (topo/net/experimentfile.py) names both and its trials,
and the flags above are the experiment of one trial per policy. Each trial's policy is put as it is
for any network (its `network:` section, its `switches:` left out): the controller finds the network
and queues every link the topology gave a bw=. In four steps, a module each:
planning.py (the command line or the files, checked before anything starts), running.py (a trial on
a fresh network), reducing.py (what ran, as results: summary.py types them, as
docs/schema/experiment-summary.json describes them), reporting.py (the table and the figures).
The cc, fairness and aqm studies are such experiments, with tables of their own (their modules).
"""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from topo.harness.launch import Host
from topo.studies.base import Study, Trial, add_prometheus_argument
from topo.studies.experiment import planning, reducing, reporting, running
from topo.studies.experiment.planning import Plan
from topo.studies.experiment.summary import ExperimentSummary, TrialResult

SummaryT = TypeVar("SummaryT", bound=Mapping[str, Any])


class Experiment(Study[Plan, TrialResult, SummaryT]):
    """What every experiment shares (cc, fairness and aqm are experiments too): its trials, and the
    experiment's summary, which a study extends with its own fields."""
    records = True

    def trials(self, plan: Plan, host: Host) -> list[Trial[TrialResult]]:
        return running.trials(plan, host)

    def experiment_summary(self, plan: Plan, host: Host, done: dict[str, TrialResult],
                           prometheus_url: str | None) -> ExperimentSummary:
        return reducing.summary(plan, host, done, not running.delays_lacking(host), prometheus_url)


class ExperimentStudy(Experiment[ExperimentSummary]):
    name = "experiment"
    description = "Your own network (a Mininet custom file) and traffic (a traffic file) under each policy."
    figure_name = "throughput.png"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        add_experiment_arguments(p)

    def plan(self, args: argparse.Namespace) -> Plan:
        return planning.from_args(args)

    def summary(self, plan: Plan, host: Host, done: dict[str, TrialResult],
                prometheus_url: str | None) -> ExperimentSummary:
        return self.experiment_summary(plan, host, done, prometheus_url)

    def table(self, summary: ExperimentSummary) -> str:
        return reporting.table(summary)

    def figure(self, summary: ExperimentSummary, path: Path) -> None:
        reporting.figure(summary, path)


def add_experiment_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiment", type=Path, metavar="FILE",
                   help="an experiment file (YAML): the topology, the traffic and the trials, in one file")
    p.add_argument("--topo", metavar="FILE:NAME",
                   help="a Mininet custom file and a topology in its topos dict, as mn --custom FILE --topo NAME")
    p.add_argument("--topo-param", nargs="*", default=[], metavar="K=V", help="the topology's parameters")
    p.add_argument("--traffic", type=Path, metavar="FILE", help="the traffic file (YAML)")
    p.add_argument("--policy", nargs="+", metavar="NAME",
                   help="policies/NAME.yaml or a path, each run on its own network (default none reserve auto)")
    add_prometheus_argument(p)


STUDY = ExperimentStudy()
