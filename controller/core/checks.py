"""A policy put through the REST API, checked against the controller's switches as they are connected now.

Pure: the switches and OVSDB's replica in, a PolicyError naming the field and the fix out.
"""
from __future__ import annotations

from controller.core.bridges import check_ports
from controller.core.errors import PolicyError
from controller.core.flowsync import UNKNOWN_METERS
from controller.core.meters import desired_meters
from controller.core.policy import Policy
from controller.core.switch import Switch
from controller.core.view import OvsdbReplica


def check_policy(policy: Policy, switches: dict[int, Switch], ovsdb: OvsdbReplica) -> None:
    """A policy against this controller and the switches connected to it: its pinned remotes, each switch's
    ports (the one check the offline checker makes too), and the switches' meters."""
    for switch in policy.switches:
        if switch.ovsdb and switch.ovsdb not in ovsdb.names:
            raise PolicyError(f"switches.{switch.name}.ovsdb: {switch.ovsdb} is not one of this controller's "
                              f"OVSDB remotes ({', '.join(ovsdb.names)}); fix it, or add it to the "
                              "controller's ovsdb option")
        sw = switches.get(switch.dp_id)
        if sw is None or sw.bridge is None:
            continue
        # OVSDB as it is now: it may have numbered a port since the switch last read its bridge.
        bridge = ovsdb.bridge(switch.dp_id, switch.ovsdb) or sw.bridge
        check_ports(switch, set(bridge.ports))
        cannot = sw.flows.cannot_police
        if cannot not in (None, UNKNOWN_METERS) and desired_meters(policy, switch):
            policed = next(c.name for c in policy.classes if c.police and any(r.traffic_class == c.name
                                                                              for r in switch.flows))
            raise PolicyError(f"classes.{policed}.police: switch {switch.name} (bridge {sw.bridge.name}) cannot "
                              f"police, {cannot}; remove police, or run the bridge on a datapath with "
                              "meters (datapath_type netdev, or the kernel's on Linux 4.18 or later)")
