"""What the controller knows now, for its metrics (controller/adapters/metrics.py exports it) and its
status. Each switch keeps its own figures (SwitchTelemetry, written as its events arrive, gone with it);
a Snapshot joins them with the controller's own at the moment it is asked for. Pure data."""
from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from controller.core.actions import Decided
from controller.core.placement import Move
from controller.core.stats import MeterCounters, PortCounters, QueueCounters

LOG = logging.getLogger("qos")

K = TypeVar("K")


@dataclass
class SwitchTelemetry:
    """One switch's figures, keyed by port (and queue, meter, class) on that switch."""
    ports: dict[int, PortCounters] = field(default_factory=dict)
    queues: dict[tuple[int, int], QueueCounters] = field(default_factory=dict)     # (port, queue)
    meters: dict[tuple[int, str], MeterCounters] = field(default_factory=dict)     # (meter, class)
    capacity_bps: dict[int, int] = field(default_factory=dict)
    congested: dict[int, bool] = field(default_factory=dict)
    programmed: dict[int, bool] = field(default_factory=dict)
    events: dict[tuple[int, str], int] = field(default_factory=dict)               # (port, program|rollback)
    openflow_errors: dict[str, int] = field(default_factory=dict)                  # "type/code" → count
    drift_repairs: dict[str, int] = field(default_factory=dict)                    # flows, meters, qos, tc
    poll_duration: float | None = None                                             # seconds, last poll
    poll_lag: float | None = None                                                  # seconds late, last poll
    polls: int = 0                                                                 # polls answered in full

    @staticmethod
    def count(counter: dict[K, int], key: K) -> None:
        counter[key] = counter.get(key, 0) + 1

    def now(self) -> SwitchTelemetry:
        """Its figures as they are now: a render of the metrics reads them over many turns of the event loop."""
        figures = {f.name: getattr(self, f.name) for f in fields(self)}
        copies: dict[str, Any] = {name: dict(value) for name, value in figures.items() if isinstance(value, dict)}
        return replace(self, **copies)


@dataclass
class Snapshot:
    """The controller's own figures, and each switch's (those whose bridge is known) by datapath id."""
    policy: str | None = None
    role: str = "active"                                                        # or "standby"
    load_error: bool = False
    ovsdb_connected: dict[str, bool] = field(default_factory=dict)              # OVSDB remote → connected
    switches: dict[int, SwitchTelemetry] = field(default_factory=dict)
    in_sync: dict[int, bool] = field(default_factory=dict)                      # dp → all confirmed
    fabric: FabricFigures | None = None                                         # under a policy's network:


    def drift_repairs(self) -> dict[str, int]:
        """Repairs by kind, every switch's together."""
        total: dict[str, int] = {}
        for sw in self.switches.values():
            for kind, count in sw.drift_repairs.items():
                total[kind] = total.get(kind, 0) + count
        return total



@dataclass
class FabricFigures:
    """The controller's own forwarding (controller/core/fabric.py): what it found and what it did."""
    links: int                       # links between its switches, each counted once
    hosts: int
    moves: int                       # traffic moved by adaptive paths (and moved back)
    packet_ins: dict[str, int]       # the packets its switches sent it, by kind
    refused: dict[str, int]          # discovery frames refused, by reason


class Decisions:
    """The last decisions (a port's queues programmed or rolled back, traffic moved), for the status."""

    def __init__(self, wall: Callable[[], float]):
        self.wall = wall
        self.last: collections.deque[dict[str, Any]] = collections.deque(maxlen=1000)

    def decided(self, action: Decided) -> None:
        decision = action.decision
        self.last.append({"time": self.wall(), "dp_id": f"{action.dp_id:016x}", "port": action.port_no,
                          "action": decision.action, "reason": decision.reason,
                          "utilisation": decision.utilisation, "loss_ratio": decision.loss_ratio})

    def moved(self, moves: Iterable[Move]) -> bool:
        """Traffic moved by adaptive paths (controller/core/placement.py), logged; whether there was any."""
        any_moved = False
        for move in moves:
            LOG.info("switch %016x: traffic to %s moved from port %s to %s (%s)", move.dp_id, move.mac, move.before,
                     move.after, move.why)
            self.last.append({"time": self.wall(), "dp_id": f"{move.dp_id:016x}", "port": move.before,
                              "action": "move", "to_port": move.after, "host": move.mac, "bit_rate": round(move.bps),
                              "reason": move.why})
            any_moved = True
        return any_moved
