"""The main study's numbers (pure): one run's steps, repeats combined, the table and the figure.

A step's TCP and UDP rates are what the receivers got, averaged over the step with its first
(settling) second left out. With --repeat N each step reports the median of the N runs, with the
minimum, the maximum and the per-run values beside it; a step is faithful only if it was in every
run, and its notes say which run the emulator failed in. The latency probe's packets sent in the same
window give the step's RTT distribution, jitter and loss; TCP's own RTT is the median of its sender's
smoothed RTT over the window.
"""
from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Any

from controller.adapters.tc import ClassCounters, Leaf
from controller.core.plan import htb_classid
from controller.core.policy import Policy
from topo.harness import fidelity
from topo.harness.report import jain_index, plt
from topo.net import iperf, probe
from topo.net.traffic import Ran

UNFAITHFUL = "†"


def tcp_class(policy: Policy) -> str | None:
    """The HTB class TCP is steered to while a port reserves, if the policy has a tcp class."""
    return class_of(policy, "tcp")


def class_of(policy: Policy, name: str) -> str | None:
    found = next((c for c in policy.classes if c.name == name), None)
    return htb_classid(found.queue) if found else None


def reservation_mbps(policy: Policy, capacity_bps: int) -> float | None:
    """The TCP class's reserved rate, for policies that can reserve."""
    tcp = next((c for c in policy.classes if c.name == "tcp"), None)
    reserves = any(p.queues != "fifo" for s in policy.switches for p in s.ports)
    return round(tcp.min_share * capacity_bps / 1e6, 3) if tcp and reserves else None


def step_window(ran: Ran) -> tuple[float, float]:
    """When a step's UDP test really ran: it ended as the client exited (the closing exchange takes
    milliseconds), and its data went out for the seconds iperf3 reports; a pause, or a test that
    failed, is its own span."""
    if ran.doc is None or ran.error:
        return ran.started, ran.ended
    return max(ran.started, ran.ended - ran.doc["end"]["sum_sent"]["seconds"]), ran.ended


def summarise_run(capacity_bps: int, settle: float, steps_mbps: tuple[float, ...], policy: Policy,
                  tcp: Ran, steps: list[Ran], samples: list[fidelity.Sample], classes: dict[str, ClassCounters],
                  leaves: dict[str, Leaf], decisions: list[dict], alone: Ran | None = None,
                  probed: Ran | None = None, unloaded: Ran | None = None) -> dict[str, Any]:
    """One run of one policy: its steps (with their fidelity and latency), the cooldown, UDP alone after
    TCP, the TCP series, the probe's unloaded RTT, the bottleneck's HTB classes at the end and the
    controller's decisions. Times are from TCP's start."""
    t0 = tcp.started
    doc = tcp.require()
    received, sent = iperf.received(doc), iperf.sent(doc)
    streams = iperf.received_streams(doc)
    trips = probe.round_trips(probed.doc) if probed is not None and probed.doc else None
    voice = class_of(policy, "voice")
    rows = []
    for rate, ran in zip(steps_mbps, steps):
        start, end = step_window(ran)
        window = (start + settle, end)
        udp_sum = (ran.doc or {}).get("end", {}).get("sum", {})
        retransmits = iperf.window_retransmits(sent, t0, *window)
        delivered = None if ran.error else iperf.window_mean_bps(iperf.received(ran.doc), start, *window) \
            if ran.doc else 0.0
        row = {"udp_mbps_offered": rate, "udp_mbps_delivered": _mbps(delivered),
               "udp_lost_percent": udp_sum.get("lost_percent"),
               "tcp_mbps": _mbps(iperf.window_mean_bps(received, t0, *window)),
               "tcp_retransmits": retransmits,
               "start_s": round(start - t0, 3), "end_s": round(end - t0, 3),
               **({"udp_connect_restarts": ran.connect_restarts} if ran.connect_restarts else {})}
        if len(streams) > 1:
            flows = [_mbps(iperf.window_mean_bps(s, t0, *window)) or 0.0 for s in streams]
            row.update(tcp_flows_mbps=flows, tcp_jain_index=round(jain_index(flows), 3) if any(flows) else None)
        row.update(fidelity.assess(samples, *window, capacity_bps, tcp_class(policy), retransmits,
                                   [fidelity.Received(received, t0)]))
        if ran.error:
            row.update(faithful=False, fidelity_notes=[*row["fidelity_notes"], f"the UDP test failed: {ran.error}"])
        if trips is not None:
            row.update(probe.summary(trips, *window), tcp_rtt_ms=_tcp_rtt_ms(doc, t0, *window))
            notes = fidelity.probe_lost_outside(samples, *window, row, voice)
            row.update(probe_faithful=not notes, probe_notes=notes)
        rows.append(row)
    last_end = step_window(steps[-1])[1]
    cooldown = (last_end + settle, tcp.ended)
    names = {htb_classid(0): "default", **{htb_classid(c.queue): c.name for c in policy.classes}}
    return {
        "steps": rows,
        **({"udp_alone": _alone(alone, settle, t0)} if alone else {}),
        "cooldown": {"tcp_mbps": _mbps(iperf.window_mean_bps(received, t0, *cooldown)),
                     "start_s": round(last_end - t0, 3), "end_s": round(tcp.ended - t0, 3)},
        "tcp_series": [{"t": round(i.start, 3), "seconds": round(i.end - i.start, 3), "tcp_mbps": _mbps(i.bps)}
                       for i in received],
        "tc_classes": {cid: {"class": names.get(cid, "parent"), "bytes": c.bytes, "packets": c.packets,
                             "drops": c.drops, "queue": leaves[cid].kind if cid in leaves else None,
                             "limit_packets": leaves[cid].limit if cid in leaves else None}
                       for cid, c in sorted(classes.items())},
        "decisions": [{**d, "t": round(d["time"] - t0, 3)} for d in decisions],
        **({"probe_unloaded": _unloaded(unloaded)} if unloaded is not None else {}),
        **({"probe_error": probed.error} if probed is not None and probed.error else {}),
        "t0": t0,
    }


def _unloaded(ran: Ran) -> dict[str, Any]:
    """The probe alone on the path, before any traffic."""
    if not ran.doc:
        return {"error": ran.error}
    return probe.alone(ran.doc) or {"error": "no packet sent"}


def _tcp_rtt_ms(doc: dict[str, Any], t0: float, start: float, end: float) -> float | None:
    """The median of the TCP sender's smoothed RTT over the intervals that overlap [start, end]."""
    rtts = [stream["rtt"] / 1000 for interval in doc.get("intervals", []) for stream in interval["streams"]
            if "rtt" in stream and t0 + interval["sum"]["end"] > start and t0 + interval["sum"]["start"] < end]
    return round(median(rtts), 2) if rtts else None


def _alone(ran: Ran, settle: float, t0: float) -> dict[str, Any]:
    """UDP alone on the link: what it offered, what arrived (its first second left out) and what was lost."""
    start, end = step_window(ran)
    delivered = None if ran.error or not ran.doc else \
        iperf.window_mean_bps(iperf.received(ran.doc), start, start + settle, end)
    return {"udp_mbps_offered": ran.flow.udp_mbps, "udp_mbps_delivered": _mbps(delivered),
            "udp_lost_percent": None if ran.error else
            (ran.doc or {}).get("end", {}).get("sum", {}).get("lost_percent"),
            "start_s": round(start - t0, 3), "end_s": round(end - t0, 3), **({"error": ran.error} if ran.error else {})}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeats of one policy combined step by step; the runs themselves are kept under "repetitions"."""
    steps = []
    for k, first in enumerate(runs[0]["steps"]):
        per = [run["steps"][k] for run in runs]
        tcp = [s["tcp_mbps"] for s in per]
        row = {"udp_mbps_offered": first["udp_mbps_offered"],
               **_spread("tcp_mbps", tcp), "runs": tcp,
               **_spread("udp_mbps_delivered", [s["udp_mbps_delivered"] for s in per]),
               "tcp_retransmits": _median([s["tcp_retransmits"] for s in per]),
               "faithful": all(s["faithful"] for s in per), "fidelity": [s["fidelity"] for s in per],
               "fidelity_notes": _notes_of_runs(per, "fidelity_notes")}
        if "tcp_flows_mbps" in first:
            row["tcp_flows_mbps"] = [_median(list(rates)) for rates in zip(*(s["tcp_flows_mbps"] for s in per))]
            row["tcp_jain_index"] = _median([s["tcp_jain_index"] for s in per])
        if "probe_rtt_ms" in first:
            row["probe_rtt_ms"] = {q: _median([s["probe_rtt_ms"][q] for s in per]) for q in first["probe_rtt_ms"]}
            row.update(_spread("probe_rtt_p95_ms", [s["probe_rtt_ms"]["p95"] for s in per]))
            row.update({key: _median([s[key] for s in per])
                        for key in ("probe_ipdv_p95_ms", "probe_loss_percent", "tcp_rtt_ms")})
            row.update(probe_faithful=all(s["probe_faithful"] for s in per),
                       probe_notes=_notes_of_runs(per, "probe_notes"))
        steps.append(row)
    episodes = [e for run in runs for e in run.get("episodes", [])]
    alone = [run["udp_alone"] for run in runs if "udp_alone" in run]
    if alone:
        alone_row = {"udp_mbps_offered": alone[0]["udp_mbps_offered"],
                     **_spread("udp_mbps_delivered", [a["udp_mbps_delivered"] for a in alone]),
                     "udp_lost_percent": _median([a["udp_lost_percent"] for a in alone])}
    unloaded = [run["probe_unloaded"]["probe_rtt_ms"]["median"] for run in runs
                if "probe_rtt_ms" in run.get("probe_unloaded", {})]
    return {"steps": steps, **({"udp_alone": alone_row} if alone else {}), "repetitions": runs,
            **({"probe_unloaded_rtt_ms": _median(unloaded)} if unloaded else {}),
            "reaction_seconds": [e["reaction_seconds"] for e in episodes],
            "recovery_seconds": [e["recovery_seconds"] for e in episodes]}


def owners_text(owners: dict[str, str]) -> str:
    """{"s1": "c2", "s2": "c3"} → "s1 owned by c2, s2 by c3"."""
    return ", ".join(f"{bridge} {'owned ' if k == 0 else ''}by {member}"
                     for k, (bridge, member) in enumerate(sorted(owners.items())))


def owners_line(summary: dict[str, Any]) -> str:
    """Under the tables of a cluster's run: its members, and which owned each switch in each run."""
    if "controllers" not in summary:
        return ""
    cluster = summary["controllers"]
    runs = "; ".join(f"{label}: {owners_text(owners)}" for label, owners in cluster["owners"].items())
    return f"\n{cluster['count']} controllers ({', '.join(cluster['members'])}) shared the switches through " \
           f"etcd; {runs}.\n"


def faults_line(summary: dict[str, Any]) -> str:
    """Under a --fault run's tables: whom it killed, when, and how soon another member mastered the switch."""
    said = []
    for name, result in summary["policies"].items():
        for run in result["repetitions"]:
            if (fault := run.get("fault")) is not None:
                after = f"mastered by {fault['mastered_by']} {fault['remaster_seconds']:.2f} s later" \
                    if fault["mastered_by"] else "not mastered again within 30 s"
                said.append(f"- {name}: {fault['member']}, the owner of switch {fault['dp_id']}, killed (kill -9) "
                            f"{fault['killed_s']:.1f} s into TCP; {after}")
    return "\nFault:\n\n" + "\n".join(said) + "\n" if said else ""


def table(summary: dict[str, Any]) -> str:
    """TCP throughput (and UDP delivered) per offered UDP rate, one column pair per policy; with
    repeats the median and its range; † marks a step the emulator, not the policy, decided."""
    policies = summary["policies"]
    names = list(policies)
    head = "| UDP offered (Mbit/s) | " + " | ".join(f"{n}: TCP | {n}: UDP delivered" for n in names) + " |"
    lines = [head, "|---:|" + "---:|---:|" * len(names)]
    notes = []
    for i, first in enumerate(policies[names[0]]["steps"]):
        cells = []
        for n in names:
            step = policies[n]["steps"][i]
            mark = "" if step["faithful"] else f" {UNFAITHFUL}"
            cells += [_ranged(step, "tcp_mbps") + mark, _ranged(step, "udp_mbps_delivered")]
            notes += [f"{n} at UDP {step['udp_mbps_offered']:g} Mbit/s: {note}" for note in step["fidelity_notes"]]
        lines.append(f"| {first['udp_mbps_offered']:g} | " + " | ".join(cells) + " |")
    if all("udp_alone" in policies[n] for n in names):
        cells = []
        for n in names:
            alone = policies[n]["udp_alone"]
            lost = alone["udp_lost_percent"]
            cells += ["–", _ranged(alone, "udp_mbps_delivered") + ("" if lost is None else f" ({lost:.0f} % lost)")]
        offered = policies[names[0]]["udp_alone"]["udp_mbps_offered"]
        lines.append(f"| {offered:g}, alone after TCP | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n" + _unfaithful(notes, "decided")
    latency = latency_table(summary)
    return text + ("\n" + latency if latency else "")


def latency_table(summary: dict[str, Any]) -> str:
    """The probe's RTT per offered UDP rate, one column pair per policy: median / p95 (ms), and its loss;
    the first row is the probe alone, before any traffic. Empty when no run had a probe."""
    policies = {n: p for n, p in summary["policies"].items() if "probe_rtt_ms" in p["steps"][0]}
    if not policies:
        return ""
    names = list(policies)
    lines = ["Latency probe (a voice call's packets h2 -> h3 every 20 ms, EF) round-trip time, median / p95:", "",
             "| UDP offered (Mbit/s) | " + " | ".join(f"{n}: RTT (ms) | {n}: lost" for n in names) + " |",
             "|---:|" + "---:|---:|" * len(names)]
    unloaded = [_ms(policies[n].get("probe_unloaded_rtt_ms")) for n in names]
    lines.append("| unloaded | " + " | ".join(f"{u} | –" for u in unloaded) + " |")
    notes = []
    for i, first in enumerate(policies[names[0]]["steps"]):
        cells = []
        for n in names:
            step = policies[n]["steps"][i]
            rtt, lost = step["probe_rtt_ms"], step["probe_loss_percent"]
            mark = "" if step["probe_faithful"] else f" {UNFAITHFUL}"
            cells += [f"{_ms(rtt['median'])} / {_ms(rtt['p95'])}", ("–" if lost is None else f"{lost:g} %") + mark]
            notes += [f"{n} at UDP {step['udp_mbps_offered']:g} Mbit/s: {note}" for note in step["probe_notes"]]
        lines.append(f"| {first['udp_mbps_offered']:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" + _unfaithful(notes, "lost them")


def _notes_of_runs(per: list[dict[str, Any]], key: str) -> list[str]:
    """The notes under `key` of one step's repeats, each named by its run when there are several."""
    return [note if len(per) == 1 else f"run {i + 1}: {note}" for i, s in enumerate(per) for note in s[key]]


def _unfaithful(notes: list[str], what: str) -> str:
    """The notes under a table, one line each; nothing when there are none."""
    return f"\n{UNFAITHFUL} not faithful (the emulator, not the policy, {what}):\n" + \
        "".join(f"- {note}\n" for note in notes) if notes else ""


def latency_figure(summary: dict[str, Any], path: Path) -> bool:
    """The probe's RTT per offered UDP rate as box plots, a box per policy at each step (whiskers p5 to
    p95, log scale), and each policy's unloaded median as a dotted line. False when no run had a probe."""
    policies = {n: p for n, p in summary["policies"].items() if "probe_rtt_ms" in p["steps"][0]}
    if not policies:
        return False
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=120)
    width = 0.8 / len(policies)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    steps = [s["udp_mbps_offered"] for s in next(iter(policies.values()))["steps"]]
    for k, (name, result) in enumerate(policies.items()):
        colour = cycle[k % len(cycle)]
        boxes = [{"med": r["median"], "q1": r["p25"], "q3": r["p75"], "whislo": r["p5"], "whishi": r["p95"],
                  "fliers": []} for r in (s["probe_rtt_ms"] for s in result["steps"])]
        placed = [(i + (k - (len(policies) - 1) / 2) * width, b) for i, b in enumerate(boxes) if b["med"] is not None]
        if placed:
            ax.bxp([b for _, b in placed], positions=[x for x, _ in placed], widths=width * 0.9, patch_artist=True,
                   boxprops={"facecolor": colour, "alpha": 0.6}, medianprops={"color": "black"}, manage_ticks=False)
        ax.plot([], [], color=colour, linewidth=8, alpha=0.6, label=name)
        if result.get("probe_unloaded_rtt_ms"):
            ax.axhline(result["probe_unloaded_rtt_ms"], color=colour, linestyle=":", linewidth=1)
    ax.plot([], [], color="grey", linestyle=":", label="unloaded median")
    ax.set_xticks(range(len(steps)), [f"{s:g}" for s in steps])
    ax.set_yscale("log")
    ax.set_xlabel("offered UDP rate (Mbit/s)")
    ax.set_ylabel("probe RTT (ms)")
    ax.set_title(f"Latency under load: a voice call's RTT through the {summary['bottleneck_mbps']:g} Mbit/s "
                 "bottleneck (box p25–p75, whiskers p5–p95)", fontsize=10)
    ax.grid(alpha=0.3, axis="y", which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def figure(summary: dict[str, Any], path: Path) -> None:
    """The study's Figure 2: TCP throughput against offered UDP rate, one line per policy; with
    repeats a band from the minimum to the maximum; unfaithful steps as hollow markers. Beside it,
    when the run had one, what each policy delivered of UDP alone on the link."""
    alone = {name: r["udp_alone"] for name, r in summary["policies"].items() if "udp_alone" in r}
    if alone:
        fig, (ax, side) = plt.subplots(1, 2, figsize=(9.5, 4.2), dpi=120, gridspec_kw={"width_ratios": [3, 1.2]})
    else:
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    colours = {}
    hollow_labelled = False
    for name, result in summary["policies"].items():
        steps = result["steps"]
        xs = [s["udp_mbps_offered"] for s in steps]
        line, = ax.plot(xs, [s["tcp_mbps"] or 0 for s in steps], marker="o", label=name)
        colours[name] = line.get_color()
        if len(result.get("repetitions", ())) > 1:
            ax.fill_between(xs, [s["tcp_mbps_min"] or 0 for s in steps], [s["tcp_mbps_max"] or 0 for s in steps],
                            color=line.get_color(), alpha=0.2, linewidth=0)
        bad = [s for s in steps if not s["faithful"]]
        if bad:
            ax.plot([s["udp_mbps_offered"] for s in bad], [s["tcp_mbps"] or 0 for s in bad], linestyle="none",
                    marker="o", markersize=11, markerfacecolor="none", markeredgecolor="black",
                    label=None if hollow_labelled else f"{UNFAITHFUL} not faithful (emulator)")
            hollow_labelled = True
    ax.axhline(summary["bottleneck_mbps"], color="grey", linestyle=":", label="bottleneck")
    reservations = {r.get("tcp_reservation_mbps") for r in summary["policies"].values()} - {None}
    for mbps in reservations:
        ax.axhline(mbps, color="grey", linestyle="--", label=f"TCP reservation ({mbps:g} Mbit/s)")
    ax.set_xlabel("offered UDP rate (Mbit/s)")
    ax.set_ylabel("TCP throughput (Mbit/s)")
    ax.set_ylim(bottom=0, top=summary["bottleneck_mbps"] * 1.15)
    repeats = summary.get("scenario", {}).get("repeat", 1)
    ax.set_title(f"TCP under a UDP flood, {summary['bottleneck_mbps']:g} Mbit/s bottleneck"
                 + (f" (median of {repeats} runs, band: min–max)" if repeats > 1 else ""), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if alone:
        _alone_bars(side, alone, colours, summary["bottleneck_mbps"])
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _alone_bars(ax, alone: dict[str, dict], colours: dict[str, str], bottleneck_mbps: float) -> None:
    names = list(alone)
    delivered = [alone[n]["udp_mbps_delivered"] or 0 for n in names]
    ax.bar(names, delivered, color=[colours[n] for n in names])
    for k, value in enumerate(delivered):
        ax.text(k, value, f"{value:.2f}", ha="center", va="bottom", fontsize=8)
    offered = alone[names[0]]["udp_mbps_offered"]
    ax.axhline(offered, color="grey", linestyle="--", label="offered")
    ax.set_ylim(bottom=0, top=bottleneck_mbps * 1.15)
    ax.set_ylabel("UDP delivered (Mbit/s)")
    ax.set_title(f"UDP {offered:g} Mbit/s alone (TCP ended)", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)


def _spread(key: str, values: list[float | None]) -> dict[str, float | None]:
    known = [v for v in values if v is not None]
    return {key: _median(known), f"{key}_min": min(known, default=None), f"{key}_max": max(known, default=None)}


def _median(values: list) -> Any:
    known = [v for v in values if v is not None]
    return round(median(known), 3) if known else None


def _ranged(step: dict, key: str) -> str:
    value, low, high = step.get(key), step.get(f"{key}_min"), step.get(f"{key}_max")
    if value is None:
        return "–"
    if low is None or high is None or low == high:
        return f"{value:.2f}"
    return f"{value:.2f} ({low:.2f}–{high:.2f})"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _mbps(bps: float | None) -> float | None:
    return None if bps is None else round(bps / 1e6, 3)
