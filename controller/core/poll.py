"""One statistics poll of one switch, gathered whole before anything is decided from it.

A poll asks for the classified flows' and the counting meters' counters (the class rates), the
queues' counters (their drops) and the ports' counters, and more now and then; a fast poll, of the
ports near their capacity only, asks for theirs and the meters' (controller/core/switch.py). The replies come in any
order; only once all of them are in are the ports' rates fed to the congestion detector, each with its
queues' drops and its classes' rates of the same poll. A poll whose replies are not all in when the
next is due is abandoned (the next one starts afresh), and a reply to an abandoned poll is ignored.

Pure: times are the injected `now` of each reply.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from controller.core.stats import FlowCounters, MeterCounters, PortCounters, QueueCounters


@dataclass
class PollRound:
    due: float                          # when it was meant to start
    sent: float                         # when it was sent
    waiting: set[int]                   # xids not answered yet
    fast: bool = False                  # only the ports near their capacity
    flows: dict[int, FlowCounters] | None = None                   # cookie → counters
    meters: dict[int, MeterCounters] | None = None                 # meter → counters
    queues: dict[tuple[int, int], QueueCounters] | None = None     # (port, queue) → counters
    ports: dict[int, PortCounters] | None = None
    at: dict[str, float] = field(default_factory=dict)             # what → when its reply came
    if_received: tuple[str, ...] = ()   # asked for once the ports' reply says they received anything
    if_sent: tuple[str, ...] = ()       # ... or sent anything
    moved: set[int] | None = None       # the ports whose counters moved since they were last read (a slow poll's)

    def answered(self, xid: int) -> bool:
        """Whether `xid` belongs to this poll; it is then no longer awaited."""
        if xid not in self.waiting:
            return False
        self.waiting.discard(xid)
        return True

    @property
    def complete(self) -> bool:
        return not self.waiting
