"""Bridges with many ports and no hosts, for scale: the benchmark's (bench/scale.py) and the main
study's --idle-ports. Userspace bridges (datapath_type=netdev) of OVS internal ports, OpenFlow 1.3,
secure fail mode, each with its own datapath id, pointed at the controller; created in one
OVSDB transaction and removed in one, however the caller ends (recorded first, so a killed run's
are removed too).
"""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from topo.harness.host import RunRecord


@dataclass(frozen=True)
class IdleBridge:
    name: str
    dp_id: int
    ports: tuple[int, ...]          # OpenFlow port numbers, 1..N


@contextmanager
def idle_bridges(total_ports: int, per_bridge: int, prefix: str = "idle", first_dp_id: int = 0x1000,
                 controller: str = "tcp:127.0.0.1:6653", record: RunRecord | None = None) -> Iterator[list[IdleBridge]]:
    """`total_ports` ports on bridges of at most `per_bridge` ports each."""
    bridges = []
    for k, start in enumerate(range(0, total_ports, per_bridge)):
        count = min(per_bridge, total_ports - start)
        bridges.append(IdleBridge(f"{prefix}{k}", first_dp_id + k, tuple(range(1, count + 1))))
    if record:
        record.network(bridges=[b.name for b in bridges], links=[], hosts={})
    try:
        if bridges:   # one transaction for all: vswitchd reconfigures once, not once per bridge
            args = ["ovs-vsctl", "--timeout=120"]
            for bridge in bridges:
                args += ["--", "--may-exist", "add-br", bridge.name, "--", "set", "bridge", bridge.name,
                         "datapath_type=netdev", "protocols=OpenFlow13", "fail_mode=secure",
                         f"other_config:datapath-id={bridge.dp_id:016x}", "--", "set-controller", bridge.name,
                         controller]
                for port in bridge.ports:
                    iface = f"{bridge.name}p{port}"
                    args += ["--", "--may-exist", "add-port", bridge.name, iface, "--", "set", "interface", iface,
                             "type=internal", f"ofport_request={port}"]
            subprocess.run(args, check=True, capture_output=True, text=True)
        yield bridges
    finally:
        if bridges:
            args = ["ovs-vsctl", "--timeout=120"]
            for bridge in bridges:
                args += ["--", "--if-exists", "del-br", bridge.name]
            subprocess.run(args, capture_output=True)


def policy_switches(bridges: list[IdleBridge], capacity: str, queues: str = "auto") -> dict:
    """Policy entries for `bridges`: each port forwarded the normal way, and queued as `queues`."""
    return {bridge.name: {"dp_id": bridge.dp_id,
                          "flows": [{"priority": 1000, "match": {"in_port": port}, "actions": [{"output": "normal"}]}
                                    for port in bridge.ports],
                          "ports": {port: {"capacity": capacity, "queues": queues} for port in bridge.ports}}
            for bridge in bridges}
