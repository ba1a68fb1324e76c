"""Congestion episodes of an `auto` run, measured from the recorded data (pure).

An episode begins at the UDP onset, the first burst of UDP data to reach the switch after the previous
roll-back (topo/harness/onsets.py), and holds one program decision. Its reaction is measured on the
switch too, not from the controller's log: from the onset to the first moment bytes land in a class
other than the default one (the bottleneck's class byte counters, sampled every hundredth of a
second), i.e. when steering into the reservation took effect. `decision_seconds` is the same from
the controller's log, for comparison. Recovery = onset → the end of the first TCP receiver interval
(0.1 s long), after the onset pushed TCP below `recovered_share` of its reservation (a dip that
starts before the steering took effect), whose mean is back at or above it; 0 when TCP never fell. The end of an
interval is an upper bound, never flattering by a partial one. A dip later in the episode, such as
the one a roll-back causes, is not the onset's. Times are seconds from the TCP flow's start.
"""
from __future__ import annotations

from typing import Any

from controller.core.plan import HTB_PARENT, htb_classid


def episodes(udp_onsets: list[float], decisions: list[dict], tcp_series: list[dict], reservation_mbps: float,
             arrivals: list[tuple[float, dict[str, int]]], recovered_share: float = 0.8) -> list[dict[str, Any]]:
    """`udp_onsets`: when each burst of UDP data reached the switch; `arrivals`: (time, HTB class → bytes
    sent so far) of the bottleneck; both in seconds from TCP's start."""
    bar = recovered_share * reservation_mbps
    found: list[dict[str, Any]] = []
    since = float("-inf")
    for decision in decisions:
        if decision["action"] == "rollback":
            if found and found[-1]["rolled_back_s"] is None:
                found[-1]["rolled_back_s"] = decision["t"]
            since = decision["t"]
            continue
        onset = next((t for t in udp_onsets if since <= t), None)
        steered = steered_at(arrivals, onset) if onset is not None else None
        episode = {"onset_s": onset, "steered_s": steered, "programmed_s": decision["t"], "rolled_back_s": None,
                   "reaction_seconds": None, "decision_seconds": None, "recovery_seconds": None}
        if onset is not None and onset <= decision["t"]:
            episode["decision_seconds"] = round(decision["t"] - onset, 3)
            if steered is not None:
                episode["reaction_seconds"] = round(steered - onset, 3)
        found.append(episode)
    for episode in found:
        if episode["decision_seconds"] is not None:
            until = episode["rolled_back_s"] if episode["rolled_back_s"] is not None else float("inf")
            steered = episode["steered_s"] if episode["steered_s"] is not None else episode["programmed_s"]
            episode["recovery_seconds"] = recovery(tcp_series, episode["onset_s"], steered, until, bar)
    return found


def steered_at(arrivals: list[tuple[float, dict[str, int]]], onset: float) -> float | None:
    """The first sample after `onset` at which a class other than the default one has received bytes since
    the sample before it: steering into the reservation took effect (the time of that sample)."""
    before: dict[str, int] | None = None
    for t, counts in arrivals:
        if t >= onset and before is not None and any(
                n > before.get(cls, n) for cls, n in counts.items() if cls not in (htb_classid(0), HTB_PARENT)):
            return round(t, 3)
        before = counts
    return None


def recovery(series: list[dict], onset: float, programmed: float, until: float, bar: float) -> float | None:
    """Seconds from `onset` to the end of the first interval back at `bar` after a dip that began by
    `programmed` (0 without one; None if TCP was not back before `until`)."""
    after = [i for i in series if i["t"] + i["seconds"] > onset and i["t"] < until]
    dip = next((k for k, i in enumerate(after) if i["t"] <= programmed and (i["tcp_mbps"] or 0) < bar), None)
    if dip is None:
        return 0.0
    back = next((i for i in after[dip:] if (i["tcp_mbps"] or 0) >= bar), None)
    return None if back is None else round(back["t"] + back["seconds"] - onset, 3)
