"""The hosts the controller has heard on edge ports: where each MAC address is, and each IPv4 address's MAC
(from ARP), so that ARP can be answered by the controller and unicast routed to the host's switch.

Only an edge port teaches (controller/core/topology.py): a frame that crossed a link says nothing about
where its sender is. A host that makes up source addresses cannot grow the tables for ever (MAX_HOSTS).
Pure.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from controller.core.topology import End

MAX_HOSTS = 65536


@dataclass
class Hosts:
    at: dict[str, End] = field(default_factory=dict)     # MAC → (switch, port), in the order learned
    macs: dict[str, str] = field(default_factory=dict)   # IPv4 address → MAC
    version: int = 0                                     # bumped by every change of `at`
    _count: dict[End, int] = field(default_factory=dict) # port → how many hosts are on it

    def learn(self, mac: str, end: End) -> bool:
        """Whether that moved or added the host."""
        if self.at.get(mac) == end or mac not in self.at and len(self.at) >= MAX_HOSTS:
            return False
        if mac in self.at:
            self._drop(mac)
        self.at[mac] = end
        self._count[end] = self._count.get(end, 0) + 1
        self.version += 1
        return True

    def on_port(self, end: End) -> bool:
        return end in self._count

    def _drop(self, mac: str) -> None:
        end = self.at.pop(mac)
        self._count[end] -= 1
        if not self._count[end]:
            del self._count[end]

    def learn_ip(self, ip: str, mac: str) -> None:
        if ip != "0.0.0.0" and (ip in self.macs or len(self.macs) < MAX_HOSTS):   # 0.0.0.0: a probe (RFC 5227)
            self.macs[ip] = mac

    def forget(self, ends: set[End]) -> bool:
        """Hosts learned on these ports (they turned out to face a switch, or are gone); whether any was."""
        gone = [mac for mac, end in self.at.items() if end in ends] if ends & self._count.keys() else []
        for mac in gone:
            self._drop(mac)
        self.version += bool(gone)
        return bool(gone)

    def on(self, dp_id: int) -> dict[str, int]:
        """The hosts on a switch: MAC → port."""
        return {mac: port for mac, (dp, port) in self.at.items() if dp == dp_id}
