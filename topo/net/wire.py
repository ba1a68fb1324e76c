"""The middle of a switch-to-switch link that declares a delay: a namespace whose bridge joins the
link's two halves, with netem on each half's way out.

The switches' ports of such a link keep their root qdisc for the controller's OVS QoS (the link's
queue); netem cannot share it, so the delay sits on a wire of its own between them, one netem per
direction, after the queue as a link's propagation follows its transmission. netem here is a delay
line, not a queue: its limit (wire_limit) is twice what the link holds in flight at its declared
rate. A kernel without netem gets the wire without a delay (the launcher says so once), so the network
is the same either way.
"""
from __future__ import annotations

import math
from typing import Any

from mininet.node import Node

NETEM_LIMIT = 1000           # netem's own default: the limit of a wire whose link declares no rate
FRAME_BITS = 1514 * 8


def wire_limit(bps: int | None, delay_seconds: float) -> int:
    """Packets netem may hold on one direction: twice the link's bandwidth-delay product, at least its
    default. A wire that cannot keep up (an emulator short of CPU) then drops, as a link would not,
    rather than queue for seconds."""
    return max(NETEM_LIMIT, math.ceil(2 * bps * delay_seconds / FRAME_BITS)) if bps else NETEM_LIMIT


class Wire(Node):
    """Mininet node: its two interfaces bridged, each with `netem` on its way out (when given)."""

    def config(self, netem: list[str] | None = None, limit: int = NETEM_LIMIT, **_params: Any) -> dict[str, Any]:
        """No address: a wire forwards frames and is nobody's peer."""
        self.cmd("ip link add name br0 type bridge")
        for intf in self.intfList():
            self.cmd(f"ip link set dev {intf.name} master br0 up")
            if netem:
                self.cmd(f"tc qdisc replace dev {intf.name} root netem {' '.join(netem)} limit {limit}")
        self.cmd("ip link set dev br0 up")
        return {}
