"""iperf3 command lines and the analysis of their JSON output (pure).

Throughput is what the receiver got: the server's intervals, which the client brings back with
--get-server-output. The server reports every 0.1 s, so a recovery is timed to a tenth of a second.
Interval times are relative to the test's start, which the traffic runner dates (topo/net/traffic.py),
and windows are matched to intervals by overlap, so a late start never drops a second.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

BASE_PORT = 5201
REPORT_SECONDS = 0.5         # the sender's interval (cwnd, RTT and retransmits are sampled there)
RECEIVER_SECONDS = 0.1       # the receiver's interval (throughput; a recovery is timed on it)


@dataclass(frozen=True)
class Interval:
    start: float
    end: float
    bps: float
    retransmits: int = 0


def server_args(port: int) -> list[str]:
    """A server for one test (-1): it exits once it has written that test's JSON."""
    return ["iperf3", "-s", "-1", "-J", "-i", str(RECEIVER_SECONDS), "-p", str(port)]


def client_args(server_ip: str, port: int, seconds: float, udp_mbps: float | None = None,
                congestion_control: str | None = None, parallel: int = 1, tos: int | None = None) -> list[str]:
    if seconds != int(seconds):
        raise ValueError(f"iperf3 runs whole seconds (-t is read with atoi); got {seconds}")
    args = ["iperf3", "-c", server_ip, "-p", str(port), "-t", str(int(seconds)), "-i", str(REPORT_SECONDS), "-J",
            "--get-server-output"]
    if udp_mbps is not None:
        args += ["-u", "-b", f"{udp_mbps:g}M"]
    if congestion_control:
        args += ["-C", congestion_control]
    if parallel > 1:
        args += ["-P", str(parallel)]
    if tos is not None:
        args += ["-S", str(tos)]
    return args


def received(doc: dict[str, Any]) -> list[Interval]:
    """Intervals as the receiver (server) saw them, all streams together."""
    server = doc.get("server_output_json") or {}
    return [Interval(i["sum"]["start"], i["sum"]["end"], i["sum"]["bits_per_second"])
            for i in server.get("intervals", [])]


def received_streams(doc: dict[str, Any]) -> list[list[Interval]]:
    """The receiver's intervals of each stream (of a -P test), in the order iperf3 lists them."""
    server = doc.get("server_output_json") or {}
    streams: list[list[Interval]] = []
    for interval in server.get("intervals", []):
        for k, stream in enumerate(interval["streams"]):
            if k == len(streams):
                streams.append([])
            streams[k].append(Interval(stream["start"], stream["end"], stream["bits_per_second"]))
    return streams


def sent(doc: dict[str, Any]) -> list[Interval]:
    """Intervals as the sender saw them (TCP retransmits live here)."""
    return [Interval(i["sum"]["start"], i["sum"]["end"], i["sum"]["bits_per_second"],
                     i["sum"].get("retransmits", 0))
            for i in doc.get("intervals", [])]


class SenderNumbers(TypedDict):
    """A TCP test's whole-run numbers, as its sender saw them (sender_metrics)."""
    throughput_mbps: float
    rtt_mean_ms: float
    rtt_min_ms: float
    rtt_max_ms: float
    rttvar_mean_ms: float
    cwnd_mean_packets: float
    cwnd_max_packets: float
    retransmits: int
    packets_sent: int
    mss_bytes: int
    congestion_control: str | None


def sender_metrics(doc: dict[str, Any]) -> SenderNumbers:
    """A TCP test's whole-run numbers from its client JSON (with --get-server-output), over all its streams.

    cwnd is iperf3's snd_cwnd (bytes) over the MSS; RTT figures are the kernel's smoothed RTT as iperf3
    sampled it; "RTT var" is the mean of the per-interval rttvar (the kernel's mean deviation of RTT).
    """
    mss = doc["start"]["tcp_mss_default"]
    streams = [s for i in doc["intervals"] for s in i["streams"] if not s.get("omitted")]
    senders = [s["sender"] for s in doc["end"]["streams"]]
    return {
        "throughput_mbps": round(doc["server_output_json"]["end"]["sum_received"]["bits_per_second"] / 1e6, 3),
        "rtt_mean_ms": sum(s["mean_rtt"] for s in senders) / len(senders) / 1000,
        "rtt_min_ms": min(s["min_rtt"] for s in senders) / 1000,
        "rtt_max_ms": max(s["max_rtt"] for s in senders) / 1000,
        "rttvar_mean_ms": round(sum(s["rttvar"] for s in streams) / len(streams) / 1000, 3),
        "cwnd_mean_packets": round(sum(s["snd_cwnd"] for s in streams) / len(streams) / mss, 1),
        "cwnd_max_packets": round(max(s["max_snd_cwnd"] for s in senders) / mss, 1),
        "retransmits": doc["end"]["sum_sent"]["retransmits"],
        "packets_sent": round(doc["end"]["sum_sent"]["bytes"] / mss),
        "mss_bytes": mss,
        "congestion_control": doc["end"].get("sender_tcp_congestion"),
    }


def error(doc: dict[str, Any]) -> str | None:
    return doc.get("error")


def window_mean_bps(intervals: list[Interval], offset: float, start: float, end: float) -> float | None:
    """Mean rate over [start, end] (launcher time), intervals shifted by `offset` and weighted by overlap."""
    weights = [(_overlap(i, offset, start, end), i.bps) for i in intervals]
    total = sum(w for w, _ in weights)
    return sum(w * bps for w, bps in weights) / total if total > 0 else None


def window_delivered_bps(intervals: list[Interval], offset: float, start: float, end: float) -> float:
    """What was delivered over [start, end] (launcher time) per second of it: time no interval covers (a
    test that had not started, or had died) counts as nothing."""
    return sum(_overlap(i, offset, start, end) * i.bps for i in intervals) / (end - start)


def window_retransmits(intervals: list[Interval], offset: float, start: float, end: float) -> int:
    return round(sum(i.retransmits * _overlap(i, offset, start, end) / (i.end - i.start)
                     for i in intervals if i.end > i.start))


def longest_gap(intervals: list[Interval], offset: float, start: float, end: float) -> float:
    """The longest part of [start, end] (launcher time) that no interval covers."""
    covered = sorted((max(i.start + offset, start), min(i.end + offset, end)) for i in intervals
                     if i.end + offset > start and i.start + offset < end)
    gap, reached = 0.0, start
    for lo, hi in covered:
        gap = max(gap, lo - reached)
        reached = max(reached, hi)
    return max(gap, end - reached)


def _overlap(i: Interval, offset: float, start: float, end: float) -> float:
    return max(0.0, min(i.end + offset, end) - max(i.start + offset, start))
