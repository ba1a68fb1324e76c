"""An experiment file: a network, and the trials run on it, each on a fresh network under its policy.

    topo: ../topos.py:qosstudy        # FILE:NAME, as mn --custom FILE --topo NAME
    topo_params: {bw: 5}              # the topology's parameters
    policy: none                      # a policy, or a list of them: one trial each
    ports: {queue_packets: 25}        # set on every queued port, over the policy's network.ports
    traffic: study.yaml               # a traffic file, or the traffic itself (topo/net/trafficfile.py)
    trials:                           # or trials that differ in policy, ports or traffic
      - {name: reno, traffic: {step_seconds: 30, flows: [{name: bulk, from: h1, to: h4, cc: reno}]}}
    nonblocking: true                 # and one more trial, `nonblocking`: the same hosts on one switch

A trial takes what it does not say from the file's top level. Paths are relative to the file. Every
trial's traffic has the same steps, since the results compare the trials step by step. A trial with
`nonblocking: true` runs on one switch that blocks nothing, every host on it by a link like its own
(topo/net/custom.py), under its policy: what the hosts could get, which the results hold the other
trials to; the top-level `nonblocking: true` adds such a trial, named nonblocking, under policy none,
with the file's traffic. Every problem is one ExperimentFileError naming the file, the field and the fix.

Pure: a document in, an Experiment out; the policies are read and checked where the experiment runs.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from controller.core import document
from topo.net import trafficfile

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,31}$")


class ExperimentFileError(ValueError):
    """An experiment that cannot run; the message names the file, the field and the fix."""


_mapping = partial(document.mapping, error=ExperimentFileError)
_keys = partial(document.known_keys, error=ExperimentFileError, kind="experiment")


NONBLOCKING = "nonblocking"       # the name of the trial the top-level `nonblocking: true` adds


@dataclass(frozen=True)
class TrialSpec:
    name: str
    policy: str                        # a policy's name (policies/NAME.yaml) or a YAML file's path
    ports: dict[str, Any]              # over the policy's network.ports
    traffic: trafficfile.Traffic
    nonblocking: bool = False          # on one switch that blocks nothing, not on the topology


@dataclass(frozen=True)
class Experiment:
    topo: str                          # FILE:NAME
    params: dict[str, Any]
    trials: tuple[TrialSpec, ...]


def load(path: Path) -> Experiment:
    return parse(document.read_yaml(path, str(path), error=ExperimentFileError, what="experiment file"), str(path),
                 path.parent)


def parse(doc: Any, where: str, folder: Path) -> Experiment:
    doc = _mapping(doc, where)
    _keys(doc, where, ("topo", "topo_params", "policy", "ports", "traffic", "trials", NONBLOCKING))
    topo = doc.get("topo")
    if not isinstance(topo, str) or ":" not in topo:
        raise ExperimentFileError(f"{where}: topo: {topo!r} is not FILE:NAME; e.g. topo: ../topos.py:parkinglot")
    file, _, name = topo.rpartition(":")
    params = _mapping(doc.get("topo_params", {}), f"{where}: topo_params")
    ports = _mapping(doc.get("ports", {}), f"{where}: ports")
    policy = doc.get("policy", "none")
    policies = policy if isinstance(policy, list) else [policy]
    for i, p in enumerate(policies):
        _policy(p, f"{where}: policy" + (f"[{i}]" if isinstance(policy, list) else ""))
    if "trials" in doc and isinstance(policy, list):
        raise ExperimentFileError(f"{where}: policy: a list makes one trial per policy; with trials, give each "
                                  "trial its policy")
    traffic = doc.get("traffic")
    if "trials" in doc:
        listed = doc["trials"]
        if not isinstance(listed, list) or not listed:
            raise ExperimentFileError(f"{where}: trials: not a list of trials; e.g. - {{name: reno, traffic: ...}}")
        trials = [_trial(t, f"{where}: trials[{i}]", folder, policy, ports, traffic) for i, t in enumerate(listed)]
    else:
        base = _traffic(traffic, f"{where}: traffic", folder)
        trials = [TrialSpec(trial_name(p), _path(p, folder), dict(ports), base) for p in policies]
    if _flag(doc.get(NONBLOCKING, False), f"{where}: {NONBLOCKING}"):
        spec = _traffic(traffic, f"{where}: traffic", folder) if traffic is not None else trials[0].traffic
        trials.append(TrialSpec(NONBLOCKING, "none", dict(ports), spec, nonblocking=True))
    names = [t.name for t in trials]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise ExperimentFileError(f"{where}: two trials are named {twice}; give each trial its own name")
    same_steps(trials, where)
    return Experiment(f"{os.path.normpath(folder / file)}:{name}", params, tuple(trials))


def trial_name(policy: str) -> str:
    """A trial named after its policy: the name, or the file's stem."""
    return Path(policy).stem if policy.endswith((".yaml", ".yml")) else policy


def same_steps(trials: list[TrialSpec], where: str) -> None:
    """The trials are compared step by step: every one has the first one's steps and length."""
    first = trials[0].traffic
    for t in trials[1:]:
        if (t.traffic.step_seconds, t.traffic.steps, t.traffic.seconds) != \
                (first.step_seconds, first.steps, first.seconds):
            raise ExperimentFileError(
                f"{where}: trial {t.name} has {t.traffic.steps} steps of {t.traffic.step_seconds} s over "
                f"{t.traffic.seconds} s, trial {trials[0].name} {first.steps} of {first.step_seconds} s over "
                f"{first.seconds} s; the results compare trials step by step, so give them the same steps")


def rescaled(trial: TrialSpec, step_seconds: int) -> TrialSpec:
    """The trial with its traffic on steps of `step_seconds` (--quick)."""
    t = trial.traffic

    def scale(s: int) -> int:
        return s * step_seconds // t.step_seconds
    flows = tuple(replace(f, start=scale(f.start), end=max(scale(f.end), scale(f.start) + 2)) for f in t.flows)
    return replace(trial, traffic=replace(t, step_seconds=step_seconds, flows=flows))


def _trial(doc: Any, where: str, folder: Path, policy: Any, ports: dict[str, Any], traffic: Any) -> TrialSpec:
    doc = _mapping(doc, where)
    _keys(doc, where, ("name", "policy", "ports", "traffic", NONBLOCKING))
    name = doc.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ExperimentFileError(f"{where}.name: {name!r} is not a name; use a letter then letters, digits, ., - "
                                  "or _")
    where = f"{where} ({name})"
    policy = _policy(doc.get("policy", policy), f"{where}.policy")
    own = _mapping(doc.get("ports", {}), f"{where}.ports")
    spec = _traffic(doc.get("traffic", traffic), f"{where}.traffic", folder)
    return TrialSpec(name, _path(policy, folder), {**ports, **own}, spec,
                     _flag(doc.get(NONBLOCKING, False), f"{where}.{NONBLOCKING}"))


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ExperimentFileError(f"{where}: {value!r} is not true or false")
    return value


def _traffic(value: Any, where: str, folder: Path) -> trafficfile.Traffic:
    if value is None:
        raise ExperimentFileError(f"{where}: missing; give a traffic file's path or the traffic itself")
    try:
        if isinstance(value, str):
            return trafficfile.load(folder / value)
        return trafficfile.parse(value, where)
    except trafficfile.TrafficFileError as err:
        raise ExperimentFileError(str(err)) from None


def _policy(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ExperimentFileError(f"{where}: {value!r} is not a policy; name one (none, reserve, auto) or give a "
                                  "YAML file's path")
    return value


def _path(policy: str, folder: Path) -> str:
    """A policy file is relative to the experiment file; a name stays a name."""
    return os.path.normpath(folder / policy) if policy.endswith((".yaml", ".yml")) else policy
