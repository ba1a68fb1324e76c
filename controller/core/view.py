"""What a switch may know of the world beyond its connection (controller/core/switch.py): the policy in
force, whether its controller is the active one and the generation id it claims with, and OVSDB as the
adapters' replica holds it. Handed in with every event, never kept: a switch holds no pointer back.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from controller.core.bridges import BridgeInfo
from controller.core.fabric import FabricRules
from controller.core.policy import Policy
from controller.core.queues import OvsdbQos


class Role(enum.StrEnum):
    """This controller's, among the controllers of its owner."""
    ACTIVE = "active"            # holds the owner's OVSDB lock (or has no standby): OpenFlow master
    STANDBY = "standby"          # slave to every switch; changes nothing


class Mode(enum.StrEnum):
    """What the controller does with the switches' flows and queues."""
    UNSET = "unset"              # no policy yet: hands off, whatever the switches hold
    CLEARED = "cleared"          # no policy: nothing of ours on any switch
    IN_FORCE = "in_force"        # the policy's flows and queues


class SwitchRole(enum.StrEnum):
    """What the switch said of our connection."""
    UNKNOWN = "unknown"
    MASTER = "master"
    SLAVE = "slave"
    EQUAL = "equal"
    REFUSED = "refused"          # it refused our claim: another controller claimed with a newer id


class OvsdbReplica(Protocol):
    """The OVSDB remotes as their in-memory replicas hold them: reads only, no I/O."""
    names: tuple[str, ...]

    @property
    def generation(self) -> tuple[int, ...]: ...

    def bridge(self, dp_id: int, pinned: str | None = None) -> BridgeInfo | None: ...

    def port_qos(self, remote: str, iface: str) -> OvsdbQos | str | None: ...


@dataclass(frozen=True)
class SwitchView:
    policy: Policy | None
    mode: Mode
    active: bool                 # this controller is the active one: it polls and claims master
    confirmed: bool              # ... and OVSDB has confirmed it lately: it may write
    generation: int              # ours as master; 0 until one is claimed
    ovsdb: OvsdbReplica
    epoch: int = 0               # the condition of our OVSDB writes for it (a cluster's; 0: OVSDB's lock fences)
    fabric: FabricRules | None = None   # under a policy's network: what the fabric says of the switch
    reachable: bool = True       # its OVSDB answers us: a silence of the switch is its vswitchd's, not the path's

    @property
    def interval(self) -> float:
        return self.policy.poll_interval if self.policy else 1.0

    @property
    def fast_interval(self) -> float:
        return self.policy.fast_poll_interval if self.policy else 0.0
