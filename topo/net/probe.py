"""The latency probe: an isochronous flow like a voice call, measured with irtt (isochronous round-trip
tester, Debian's `irtt`), read into round trips and summarised per window (pure but for the command
lines).

A G.711 call sends 20 ms of audio (160 bytes, 172 with its RTP header) every 20 ms: about 70 kbit/s,
marked EF (DSCP 46) where the network honours it. irtt's client sends such packets to its server,
which echoes them; its JSON gives each packet's send time (wall clock, nanoseconds), its round-trip
time, its inter-packet delay variation (IPDV) against the one before, and whether it was lost on the
way out or back. Flent's RRUL test reads latency under load this way: as a distribution, not a mean.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any

PORT = 2112                  # irtt's own
INTERVAL_SECONDS = 0.02
LENGTH_BYTES = 172           # 160 bytes of G.711 and a 12-byte RTP header
DSCP_EF = 46
NS = 1e-9


@dataclass(frozen=True)
class RoundTrip:
    sent: float                 # wall clock, seconds
    rtt: float | None           # seconds; None when the packet or its echo was lost
    ipdv: float | None = None   # seconds, |this RTT - the previous one's|; None without both
    lost_back: bool = False     # the server got the packet and its echo was lost (irtt's "true_down")


def server_args(address: str) -> list[str]:
    return ["irtt", "server", "-b", f"{address}:{PORT}"]


def client_args(server: str, seconds: float, out: str, interval: float = INTERVAL_SECONDS,
                length: int = LENGTH_BYTES, dscp: int = DSCP_EF) -> list[str]:
    """A client that writes its JSON to `out` (a .json file, not gzipped), and a line per packet to its
    stdout (read live: live_rtt)."""
    # irtt's --dscp is the whole TOS byte, ECN bits included (measured: --dscp=46 sent DSCP 11).
    return ["irtt", "client", "-i", f"{round(interval * 1000)}ms", "-d", f"{seconds:g}s", "-l", str(length),
            f"--dscp={dscp << 2}", "-o", out, f"{server}:{PORT}"]


_LINE = re.compile(r"^seq=\d+ rtt=([0-9.]+)(ns|µs|us|ms|s)\b")
_UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def live_rtt(line: str) -> float | None:
    """The RTT (seconds) of one of the client's per-packet lines ("seq=7 rtt=1.2ms rd=... sd=..."), None for
    any other line (a lost packet's, the summary)."""
    found = _LINE.match(line.strip())
    return float(found.group(1)) * _UNITS[found.group(2)] if found else None


def round_trips(doc: dict[str, Any]) -> list[RoundTrip]:
    """Every packet irtt sent, in order."""
    found = []
    for trip in doc.get("round_trips", []):
        sent = trip["timestamps"]["client"]["send"]["wall"] * NS
        lost = trip.get("lost", "false")
        rtt = None if lost != "false" else trip.get("delay", {}).get("rtt")
        ipdv = trip.get("ipdv", {}).get("rtt")
        found.append(RoundTrip(sent, None if rtt is None else rtt * NS, None if ipdv is None else abs(ipdv) * NS,
                               lost == "true_down"))
    return found


def alone(doc: dict[str, Any]) -> dict[str, Any] | None:
    """A probe run on its own (the idle path, before any traffic): the summary of all its round trips; None if
    it sent nothing."""
    trips = round_trips(doc)
    return summary(trips, trips[0].sent, trips[-1].sent) if trips else None


def summary(trips: list[RoundTrip], start: float, end: float) -> dict[str, Any]:
    """The round trips of packets sent in [start, end] (wall clock): RTT median, p95 and max, IPDV p95 (ms),
    the share lost, and how many were lost on the way back; None where there was nothing to measure."""
    inside = [t for t in trips if start <= t.sent <= end]
    rtts = sorted(t.rtt for t in inside if t.rtt is not None)
    ipdvs = sorted(t.ipdv for t in inside if t.ipdv is not None)
    lost = sum(t.rtt is None for t in inside)
    return {"probe_rtt_ms": {"median": _ms(statistics.median(rtts)) if rtts else None,
                             "p95": _ms(percentile(rtts, 95)), "max": _ms(rtts[-1]) if rtts else None,
                             # the box of a box plot: quartiles, and whiskers from p5 to p95
                             "p5": _ms(percentile(rtts, 5)), "p25": _ms(percentile(rtts, 25)),
                             "p75": _ms(percentile(rtts, 75))},
            "probe_ipdv_p95_ms": _ms(percentile(ipdvs, 95)),
            "probe_loss_percent": round(100 * lost / len(inside), 2) if inside else None,
            "probe_packets": len(inside), "probe_lost_back": sum(t.lost_back for t in inside)}


def percentile(ordered: list[float], p: float) -> float | None:
    """The p-th percentile of sorted values (nearest rank); None for none."""
    if not ordered:
        return None
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)
