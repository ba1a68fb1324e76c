"""Congestion episodes of an `auto` run, measured from the recorded data (pure).

An episode begins at the UDP onset (the first UDP step to start after the previous roll-back)
and holds one program decision. reaction = program − onset; recovery = onset → the end of
the first TCP interval, after the onset pushed TCP below `recovered_share` of its reservation
(a dip that starts before the queues are programmed), whose mean is back at or above it; 0 when
TCP never fell. The end of an interval is an upper bound, never flattering by a partial one.
A dip later in the episode, such as the one a roll-back causes, is not the onset's.
Times are seconds from the TCP flow's start.
"""
from __future__ import annotations

from typing import Any


def episodes(steps: list[dict], decisions: list[dict], tcp_series: list[dict], reservation_mbps: float,
             recovered_share: float = 0.8) -> list[dict[str, Any]]:
    bar = recovered_share * reservation_mbps
    found, since = [], float("-inf")
    for decision in decisions:
        if decision["action"] == "rollback":
            if found and found[-1]["rolled_back_s"] is None:
                found[-1]["rolled_back_s"] = decision["t"]
            since = decision["t"]
            continue
        onset = next((s["start_s"] for s in steps if s["udp_mbps_offered"] > 0 and since <= s["start_s"]), None)
        episode = {"onset_s": onset, "programmed_s": decision["t"], "rolled_back_s": None,
                   "reaction_seconds": None, "recovery_seconds": None}
        if onset is not None and onset <= decision["t"]:
            episode["reaction_seconds"] = round(decision["t"] - onset, 3)
        found.append(episode)
    for episode in found:
        if episode["reaction_seconds"] is not None:
            until = episode["rolled_back_s"] if episode["rolled_back_s"] is not None else float("inf")
            episode["recovery_seconds"] = _recovery(tcp_series, episode["onset_s"], episode["programmed_s"],
                                                    until, bar)
    return found


def _recovery(series: list[dict], onset: float, programmed: float, until: float, bar: float) -> float | None:
    after = [i for i in series if i["t"] + i["seconds"] > onset and i["t"] < until]
    dip = next((k for k, i in enumerate(after) if i["t"] <= programmed and (i["tcp_mbps"] or 0) < bar), None)
    if dip is None:
        return 0.0
    back = next((i for i in after[dip:] if (i["tcp_mbps"] or 0) >= bar), None)
    return None if back is None else round(back["t"] + back["seconds"] - onset, 3)
