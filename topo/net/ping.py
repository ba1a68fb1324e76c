"""`ping -D` beside the flows: its output read into round trips (pure).

ping's RTT is what a packet waits in every queue on the path and back; a traffic file asks for it with
`ping: {from, to, interval}` (topo/net/trafficfile.py), as the queue-discipline study does.
"""
from __future__ import annotations

import re
from statistics import mean
from typing import Any

_REPLY = re.compile(r"^\[(\d+\.\d+)\].* time=([\d.]+) ms")
_TOTALS = re.compile(r"(\d+) packets transmitted, (\d+) received")


def parse(text: str) -> tuple[list[tuple[float, float]], int, int]:
    """(reply time, RTT ms) of each reply of `ping -D`, and the packets transmitted and received."""
    replies = [(float(m.group(1)), float(m.group(2))) for m in map(_REPLY.match, text.splitlines()) if m]
    totals = _TOTALS.search(text)
    return replies, int(totals.group(1)) if totals else 0, int(totals.group(2)) if totals else 0


def summary(text: str, start: float, end: float) -> dict[str, Any]:
    """The RTTs of the replies in [start, end] (wall clock): min, mean and max (ms), and how many; with
    what the whole ping transmitted and got back."""
    replies, transmitted, received = parse(text)
    rtts = [rtt for t, rtt in replies if start <= t <= end]
    return {"min": min(rtts, default=None), "mean": round(mean(rtts), 3) if rtts else None,
            "max": max(rtts, default=None), "replies": len(rtts), "ping_transmitted": transmitted,
            "ping_received": received}
