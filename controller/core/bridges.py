"""A policy against the bridges OVSDB has: each switch's dp_id is a bridge's datapath_id, and every
port number the switch names (its ports, its flows' in_port and outputs) is an OpenFlow port of that
bridge. Pure: the caller runs OVSDB_READ (select-only, so read-only) and hands its answer to bridge_ports.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from controller.core.errors import PolicyError
from controller.core.policy import MAX_PORT, Policy, SwitchPolicy

OVSDB_READ = ["Open_vSwitch", *({"op": "select", "table": table, "where": [], "columns": columns}
                                for table, columns in (("Bridge", ["datapath_id", "ports"]),
                                                       ("Port", ["_uuid", "interfaces"]),
                                                       ("Interface", ["_uuid", "ofport"])))]

USERSPACE_DATAPATH = "netdev"
# An Interface's external_ids key that declares its link's rate (e.g. "5Mbit"): set by the study launcher
# for a topology's links with bw=, or by hand (ovs-vsctl set interface IFACE external_ids:ovs-qos-capacity=5Mbit).
CAPACITY_KEY = "ovs-qos-capacity"
# Its one-way delay (e.g. "10ms"), for an emulated link: the controller, owner of the port's qdiscs, puts
# netem under each of its classes (controller/core/queues.py). Set by the launcher where netem exists.
DELAY_KEY = "ovs-qos-delay"


@dataclass(frozen=True)
class BridgeInfo:
    name: str
    datapath_type: str          # "netdev" (userspace) or "system"/"" (kernel)
    ports: dict[int, str]       # OpenFlow port number → interface name
    remote: str = ""            # the OVSDB it is in (controller/adapters/remotes.py fills it in)
    # OpenFlow port number → the capacity its interface declares (bit/s), for a policy's `network:`
    declared: dict[int, int] = field(default_factory=dict)
    delays: dict[int, int] = field(default_factory=dict)   # OpenFlow port → its declared delay (µs)

    @property
    def userspace(self) -> bool:
        return self.datapath_type == USERSPACE_DATAPATH


def check_bridges(policy: Policy, bridges: dict[int, set[int]]) -> None:
    """Raises a PolicyError naming the first switch or port the bridges do not have."""
    for switch in policy.switches:
        if switch.dp_id not in bridges:
            have = ", ".join(f"{dp_id:016x}" for dp_id in sorted(bridges)) or "none"
            raise PolicyError(f"switches.{switch.name}.dp_id: no bridge has datapath_id {switch.dp_id:016x} "
                              f"(the bridges have {have}); fix dp_id, or set the bridge's other-config:datapath-id")
        check_ports(switch, bridges[switch.dp_id])


def check_ports(switch: SwitchPolicy, ofports: set[int]) -> None:
    """Every port number `switch` names is one of its bridge's `ofports`."""
    for where, port_no in _named_ports(switch):
        if port_no not in ofports:
            have = ", ".join(map(str, sorted(ofports))) or "none"
            raise PolicyError(f"{where}: bridge {switch.dp_id:016x} of switch {switch.name} has no OpenFlow port "
                              f"{port_no} (it has {have}); fix the port number")


def _named_ports(switch: SwitchPolicy) -> Iterator[tuple[str, int]]:
    for port in switch.ports:
        yield f"switches.{switch.name}.ports.{port.port_no}", port.port_no
    for rule in switch.flows:
        in_port = dict(rule.match).get("in_port")
        if in_port is not None:
            yield f"{rule.source}.in_port", in_port
        for i, output in enumerate(rule.outputs):
            if output <= MAX_PORT:   # normal, flood, ...: reserved ports every bridge has
                yield f"{rule.flow_source}.actions[{i}].output", output


def bridge_ports(results: list[dict[str, Any]]) -> dict[int, set[int]]:
    """The results of OVSDB_READ (OVSDB's JSON: ["uuid", id] atoms, ["set", [...]] sets) as
    {dp_id: OpenFlow port numbers}. A bridge without a datapath_id yet, and an interface without an
    OpenFlow port (ofport unset, or -1 when it failed), are left out."""
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise ValueError(f"OVSDB refused the read: {errors[0]}")
    bridges, ports, interfaces = (r["rows"] for r in results)
    ofport = {_atoms(i["_uuid"])[0]: i["ofport"] for i in interfaces}
    members = {_atoms(p["_uuid"])[0]: _atoms(p["interfaces"]) for p in ports}
    return {int(bridge["datapath_id"], 16): {ofport[i] for port in _atoms(bridge["ports"])
                                             for i in members.get(port, ()) if _is_port(ofport.get(i))}
            for bridge in bridges if isinstance(bridge["datapath_id"], str)}


def _atoms(value: Any) -> list[Any]:
    """An OVSDB set column's members: ["set", [atoms]], or one atom on its own; a uuid atom is its id."""
    members = value[1] if isinstance(value, list) and value[0] == "set" else [value]
    return [m[1] if isinstance(m, list) and m[0] == "uuid" else m for m in members]


def _is_port(ofport: Any) -> bool:
    return isinstance(ofport, int) and not isinstance(ofport, bool) and ofport > 0
