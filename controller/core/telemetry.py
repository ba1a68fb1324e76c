"""What the controller knows now, for its metrics (controller/adapters/metrics.py exports it) and its
status: the core writes it as events arrive; the collector only reads it. Pure data."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.core.stats import MeterCounters, PortCounters, QueueCounters


@dataclass
class Snapshot:
    """What the controller knows now; keys are (dp_id, port_no[, queue_id]), queues per switch."""
    ports: dict[tuple[int, int], PortCounters] = field(default_factory=dict)
    queues: dict[int, dict[tuple[int, int], QueueCounters]] = field(default_factory=dict)   # dp → (port, queue)
    meters: dict[int, dict[tuple[int, str], MeterCounters]] = field(default_factory=dict)   # dp → (meter, class)
    capacity_bps: dict[tuple[int, int], int] = field(default_factory=dict)
    congested: dict[tuple[int, int], bool] = field(default_factory=dict)
    programmed: dict[tuple[int, int], bool] = field(default_factory=dict)
    events: dict[tuple[int, int, str], int] = field(default_factory=dict)
    policy: str | None = None
    role: str = "active"                                                        # or "standby"
    load_error: bool = False
    openflow_errors: dict[tuple[int, str], int] = field(default_factory=dict)   # (dp, "type/code") → count
    drift_repairs: dict[str, int] = field(default_factory=dict)                 # flows, qos, tc → count
    poll_duration: dict[int, float] = field(default_factory=dict)               # dp → seconds, last cycle
    polls: dict[int, int] = field(default_factory=dict)                         # dp → polls answered
    poll_lag: dict[int, float] = field(default_factory=dict)                    # dp → seconds late, last cycle
    in_sync: dict[int, bool] = field(default_factory=dict)                      # dp → all confirmed
    ovsdb_connected: dict[str, bool] = field(default_factory=dict)              # OVSDB remote → connected

    def forget(self, dp_id: int) -> None:
        per_port: tuple[dict[tuple[int, int], Any], ...] = (self.ports, self.capacity_bps, self.congested,
                                                             self.programmed)
        for by_port in per_port:
            for key in [k for k in by_port if k[0] == dp_id]:
                del by_port[key]
        per_switch: tuple[dict[int, Any], ...] = (self.queues, self.meters, self.poll_duration, self.poll_lag,
                                                  self.in_sync, self.polls)
        for by_switch in per_switch:
            by_switch.pop(dp_id, None)
