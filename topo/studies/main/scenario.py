"""The study's parameters: defaults, a YAML scenario file, command-line overrides, validation.

Pure. Every problem is a ScenarioError naming the field.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from controller.core.document import read_file, whole
from controller.core.policy import PolicyError, parse_rate
from topo.net.netem import DELAY

SLACK_PER_STEP = 1          # TCP outlasts the steps: a UDP test's control exchange may start it late
TCP_GONE_SECONDS = 2        # after TCP's -t: its last segments and close are through
LONE_UDP = "udp_alone"


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the field and the fix."""


def parse_delay(value: Any, where: str) -> str | None:
    """A one-way delay as netem takes it, e.g. 5ms; None for none."""
    if value in (None, "", "none"):
        return None
    if not DELAY.match(str(value)):
        raise ScenarioError(f"{where}: {value!r} is not a delay; write e.g. 5ms, 500us or 0.1s, or none")
    return str(value)


@dataclass(frozen=True)
class Scenario:
    bottleneck_bps: int = 5_000_000
    delay: str | None = "5ms"             # one way on the h1–h4 path; needs netem
    udp_steps_mbps: tuple[float, ...] = (0, 2, 4, 6, 8, 10, 12)
    step_seconds: float = 10.0
    settle_seconds: float = 1.0           # left out of each step's mean
    cooldown_seconds: float = 8.0         # TCP alone after the last step (auto's roll-back shows here)
    tcp_congestion_control: str | None = None   # None: the kernel's default
    queue_packets: int = 25               # FIFO limit of the bottleneck's queues (the study's max_queue_size)
    tcp_flows: int = 1                    # parallel TCP flows h1 → h4
    repeat: int = 1                       # runs of each policy, each on a fresh network
    idle_ports: int = 0                   # extra auto ports on idle bridges the controller also polls
    lone_udp_mbps: float | None = None    # UDP alone once TCP has ended (None: 80 % of the bottleneck; 0: none)


    def __post_init__(self) -> None:
        # iperf3 reads -t as a whole number of seconds: 2.5 would silently run 2.
        for key, low in (("step_seconds", 2), ("cooldown_seconds", 0)):   # a UDP step is an iperf3 test of 2 s or more
            value = getattr(self, key)
            if value != int(value) or value < low:
                raise ScenarioError(f"{key}: {value!r} is not a whole number of seconds >= {low}")
        for key, low, high in (("tcp_flows", 1, 16), ("repeat", 1, 50), ("queue_packets", 1, 100_000),
                               ("idle_ports", 0, 10_000)):
            whole(getattr(self, key), key, low, high, error=ScenarioError)
        if self.settle_seconds >= self.step_seconds:
            raise ScenarioError("settle_seconds: must be shorter than step_seconds, or no second is measured")

    @property
    def lone_udp(self) -> float:
        """The rate of the UDP flow run alone after TCP: what a policy makes of an otherwise idle link."""
        return round(0.8 * self.bottleneck_bps / 1e6, 3) if self.lone_udp_mbps is None else self.lone_udp_mbps

    @property
    def tcp_seconds(self) -> float:
        return len(self.udp_steps_mbps) * self.step_seconds + self.cooldown_seconds

    def traffic(self, probe: bool = True) -> dict[str, Any]:
        """The study's traffic as a traffic file (topo/net/trafficfile.py) holds it: TCP h1 → h4 through the
        steps, the cooldown and a slack second per step; beside it UDP h1 → h4 stepping up; UDP alone once
        TCP has ended; with `probe`, the probe h2 → h3."""
        step = int(self.step_seconds)
        tcp_end = int(self.tcp_seconds) + SLACK_PER_STEP * len(self.udp_steps_mbps)
        tcp: dict[str, Any] = {"name": "tcp", "from": "h1", "to": "h4", "protocol": "tcp", "duration": tcp_end,
                               **({"cc": self.tcp_congestion_control} if self.tcp_congestion_control else {}),
                               **({"streams": self.tcp_flows} if self.tcp_flows > 1 else {})}
        flows = [tcp, {"name": "udp", "from": "h1", "to": "h4", "protocol": "udp",
                       "steps": [int(r) if r == int(r) else r for r in self.udp_steps_mbps]}]
        if self.lone_udp:
            flows.append({"name": LONE_UDP, "from": "h1", "to": "h4", "protocol": "udp",
                          "rate": f"{self.lone_udp:g}Mbit", "start": tcp_end + TCP_GONE_SECONDS, "duration": step})
        return {"step_seconds": step, "flows": flows, **({"probe": {"from": "h2", "to": "h3"}} if probe else {})}

    def quick(self) -> Scenario:
        """The same steps held about 3 s: a whole run well under 2 minutes."""
        return dataclasses.replace(self, step_seconds=3.0, cooldown_seconds=6.0)


def load_scenario(path: str | Path | None, overrides: dict[str, Any]) -> Scenario:
    doc: dict[str, Any] = {}
    if path is not None:
        try:
            doc = yaml.safe_load(read_file(path, str(path))) or {}
        except PolicyError as err:
            raise ScenarioError(str(err)) from None
        except (OSError, yaml.YAMLError) as err:
            raise ScenarioError(f"{path}: cannot read scenario ({err}); check the file") from None
        if not isinstance(doc, dict):
            raise ScenarioError(f"{path}: a scenario is a mapping of fields to values")
    doc.update({k: v for k, v in overrides.items() if v is not None})
    return parse_scenario(doc)


def parse_scenario(doc: dict[str, Any]) -> Scenario:
    fields = {f.name for f in dataclasses.fields(Scenario)} - {"bottleneck_bps"} | {"bottleneck"}
    for key in doc:
        if key not in fields:
            raise ScenarioError(f"{key}: unknown scenario field; use one of {', '.join(sorted(fields))}")
    values: dict[str, Any] = {}
    if "bottleneck" in doc:
        try:
            values["bottleneck_bps"] = parse_rate(doc["bottleneck"], "bottleneck")
        except PolicyError as err:
            raise ScenarioError(str(err)) from None
    for key in ("step_seconds", "settle_seconds", "cooldown_seconds", "lone_udp_mbps"):
        if key in doc:
            values[key] = _number(doc[key], key, 0)
    if "udp_steps_mbps" in doc:
        steps = doc["udp_steps_mbps"]
        if not isinstance(steps, (list, tuple)) or not steps:
            raise ScenarioError("udp_steps_mbps: give a list of rates in Mbit/s, e.g. [0, 2, 4]")
        values["udp_steps_mbps"] = tuple(_number(s, "udp_steps_mbps", 0) for s in steps)
    for key in ("queue_packets", "tcp_flows", "repeat", "idle_ports"):   # checked as the Scenario is made
        if key in doc:
            values[key] = doc[key]
    if "delay" in doc:
        values["delay"] = parse_delay(doc["delay"], "delay")
    if "tcp_congestion_control" in doc:
        values["tcp_congestion_control"] = None if doc["tcp_congestion_control"] in (None, "", "none") else \
            str(doc["tcp_congestion_control"])
    return Scenario(**values)


def _number(value: Any, where: str, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
        raise ScenarioError(f"{where}: {value!r} is not a number >= {low}")
    return float(value)
