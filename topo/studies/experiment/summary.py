"""summary.json of an experiment, typed as docs/schema/experiment-summary.json describes it (a test checks
every run's against the schema). Rates in Mbit/s, times in seconds from the traffic's start."""
from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from topo.harness.prometheus import RecordedQuery
from topo.net.iperf import SenderNumbers


class Link(TypedDict):
    ends: list[str]                  # node:port each
    bps: int
    delay: str | None                # where applied


class Scenario(TypedDict):
    topo: str                        # FILE:NAME
    topo_params: dict[str, Any]
    step_seconds: int
    steps: int
    seconds: int
    settle_seconds: float
    links: list[Link]


# "from" is a keyword: the functional form.
FlowScenario = TypedDict("FlowScenario", {"name": str, "from": str, "to": str, "protocol": str, "start_s": int,
                                          "end_s": int, "cc": str | None, "offered_mbps": list[float] | None})


class FlowStep(TypedDict):
    mbps: float | None               # the receiver's goodput; None: not planned then; 0 where a failed flow was not
    started_s: NotRequired[float]
    retransmits: NotRequired[int]
    offered_mbps: NotRequired[float]
    lost_percent: NotRequired[float | None]
    failed: NotRequired[str]         # why its test did not start, or did not run to its end


class Backlog(TypedDict):
    mean: float
    max: int
    samples: int


class ClassStep(TypedDict):
    mbps: float
    drops: int
    backlog_packets: Backlog


class PortStep(TypedDict):
    utilisation: float | None
    classes: dict[str, ClassStep]
    cpu_pressure: float | None


class Step(TypedDict):
    step: int
    window_s: list[float]
    flows: dict[str, FlowStep]
    aggregate_mbps: float | None     # every flow's goodput together
    jain_tcp: float | None
    ports: dict[str, PortStep]       # dp_id:port
    starved: bool
    probe: NotRequired[dict[str, Any]]         # topo/net/probe.py's summary
    ping_rtt_ms: NotRequired[dict[str, Any]]   # topo/net/ping.py's


class Leaf(TypedDict):
    kinds: list[str]
    drops: int | None


class Verdict(TypedDict):
    port: str
    faithful: bool
    fidelity_notes: list[str]
    fidelity: dict[str, Any]         # topo/harness/fidelity.py's numbers


class Event(TypedDict):
    at_step: int
    link: list[str]
    state: str                       # down | up
    at_s: float | None               # when the runner changed it; None where it was not run


class TrialResult(TypedDict):
    policy: str
    nonblocking: bool                # run on one switch that blocks nothing (the optimum)
    flows: list[FlowScenario]
    t0: float                        # Unix time
    seconds: int
    steps: list[Step]
    events: list[Event]
    tcp: dict[str, SenderNumbers]
    leaves: dict[str, dict[str, Leaf]]
    decisions: list[dict[str, Any]]  # as the controller reports them (/status), each with its at_s
    fidelity: Verdict | None
    probe_unloaded: NotRequired[dict[str, Any]]


class Recorded(TypedDict):
    url: str
    data_dir: str
    queries: dict[str, RecordedQuery]


class ExperimentSummary(TypedDict):
    scenario: Scenario
    environment: dict[str, Any]
    trials: dict[str, TrialResult]
    complete: NotRequired[bool]
    interrupted: NotRequired[bool]
    error: NotRequired[str]          # what ended the run before its last trial
    prometheus: NotRequired[Recorded]
