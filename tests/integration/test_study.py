"""The main study end to end: real OVS, the real os-ken app, Mininet hosts, iperf3, Prometheus.

One quick run of none, police, reserve and auto (conftest's quick_study, which test_report.py reads too) feeds
most tests here. Margins are wider than the issue's targets (which the README's recorded run meets) so a
loaded 2-core machine passes, and a step the fidelity monitor marks as decided by the emulator must say why.
"""
import json
import statistics

import pytest

from tests.dashboard_queries import all_dashboard_expressions
from tests.integration.conftest import NOTHING_LEFT, STEERED_WITHIN_S, requires_ovs
from topo.harness.prometheus import api, serving
from topo.net import iperf

pytestmark = requires_ovs


@pytest.fixture(scope="module")
def run(quick_study):
    return quick_study


@pytest.fixture(scope="module")
def recorded(run):
    """The run's TSDB reopened (a copy, on a spare port): its URL."""
    with serving(run[0] / "prometheus") as url:
        yield url


def step(summary, policy, udp):
    return next(s for s in summary["policies"][policy]["steps"] if s["udp_mbps_offered"] == udp)


def run_of(summary, policy):
    (run,) = summary["policies"][policy]["repetitions"]
    return run


def holds_or_says_why(row, ok: bool) -> bool:
    """A measured step the fidelity monitor found faithful meets its bound. An unfaithful step proves
    nothing either way, so the claim that rests on it fails, with the monitor's reason."""
    assert row["faithful"], f"the claim rests on an unfaithful step: {row['fidelity_notes']}"
    return ok


def test_most_steps_are_faithful_and_every_unfaithful_one_says_why(run):
    _, summary, _ = run
    steps = [s for p in summary["policies"].values() for s in p["steps"]]
    assert sum(s["faithful"] for s in steps) >= 0.8 * len(steps), [s["fidelity_notes"] for s in steps]
    for s in steps:
        assert s["faithful"] == (not s["fidelity_notes"]), s
        assert s["probe_faithful"] == (not s["probe_notes"]), s
        assert s["fidelity"][0]["samples"] >= 4, s


def test_a_lone_tcp_flow_fills_the_bottleneck(run):
    _, summary, _ = run
    for policy in ("none", "police", "reserve", "auto"):
        assert step(summary, policy, 0)["tcp_mbps"] >= 0.85 * summary["bottleneck_mbps"], policy


def test_the_single_fifo_starves_tcp_and_the_reservation_protects_it(run):
    _, summary, _ = run
    reservation = summary["policies"]["reserve"]["tcp_reservation_mbps"]
    assert reservation >= 0.6 * summary["bottleneck_mbps"]
    for udp in (10, 12):
        none, reserve = step(summary, "none", udp), step(summary, "reserve", udp)
        assert holds_or_says_why(reserve, reserve["tcp_mbps"] >= 0.9 * reservation), reserve
        assert holds_or_says_why(reserve, reserve["tcp_mbps"] >= 3 * (none["tcp_mbps"] or 0)), (reserve, none)
        assert none["udp_mbps_delivered"] > 0.8 * summary["bottleneck_mbps"], udp


def test_police_protects_tcp_as_reserve_does_but_drops_udp_even_on_an_idle_link(run):
    _, summary, _ = run
    police_mbps = 0.1 * summary["bottleneck_mbps"]            # the udp class's min share: what reserve reserves
    for udp in (10, 12):
        police = step(summary, "police", udp)
        assert holds_or_says_why(police, police["tcp_mbps"] >= 0.9 * (summary["bottleneck_mbps"] - police_mbps)), police
        assert police["udp_mbps_delivered"] <= 1.5 * police_mbps, police
    alone = {name: result["udp_alone"] for name, result in summary["policies"].items()}
    offered = alone["police"]["udp_mbps_offered"]
    assert alone["police"]["udp_mbps_delivered"] <= 1.5 * police_mbps and alone["police"]["udp_lost_percent"] > 50
    for name in ("none", "reserve", "auto"):                  # the idle link is lent, not policed
        assert alone[name]["udp_mbps_delivered"] >= 0.9 * offered, (name, alone[name])
    assert "| 4, alone after TCP |" in (run[0] / "table.md").read_text()


def test_the_meters_counters_reach_prometheus(run, recorded):
    _, summary, _ = run
    police = run_of(summary, "police")
    expr = "max(ovsqos_meter_dropped_packets_total) / max(ovsqos_meter_packets_total)"
    at = police["t0"] + police["steps"][-1]["end_s"]           # after UDP 12 Mbit/s against 0.5
    (result,) = api(recorded, "/api/v1/query", timeout=10, query=expr, time=at)["result"]
    assert float(result["value"][1]) > 0.5                     # most of the flood was dropped by the meter


def test_udp_bytes_land_in_their_own_htb_class(run):
    _, summary, _ = run
    classes = {c["class"]: c for c in run_of(summary, "reserve")["tc_classes"].values()}
    assert classes["udp"]["bytes"] > 500_000 and classes["udp"]["drops"] > 1000
    assert classes["tcp"]["bytes"] > 5 * classes["udp"]["bytes"]
    assert classes["default"]["bytes"] < 0.02 * classes["tcp"]["bytes"]


def test_every_class_queue_is_a_head_drop_fifo_of_the_scenarios_length(run):
    # The userspace datapath loses other classes' packets on a tail drop (controller/core/queues.py).
    _, summary, _ = run
    for policy in summary["policies"]:
        queues = {(c["queue"], c["limit_packets"]) for c in run_of(summary, policy)["tc_classes"].values()
                  if c["class"] != "parent"}
        assert queues == {("pfifo_head_drop", summary["scenario"]["queue_packets"])}, policy


def test_auto_programs_once_per_episode_and_recovers(run):
    _, summary, _ = run
    auto = run_of(summary, "auto")
    assert [d["action"] for d in auto["decisions"]] == ["program", "rollback"]
    (episode,) = auto["episodes"]
    assert summary["policies"]["auto"]["reaction_seconds"] == [episode["reaction_seconds"]]
    # Flood onset to UDP landing in its own class on the switch.
    assert 0 < episode["reaction_seconds"] <= STEERED_WITHIN_S
    assert episode["recovery_seconds"] is not None and episode["recovery_seconds"] <= 5
    for udp in (10, 12):
        auto = step(summary, "auto", udp)
        assert holds_or_says_why(auto, auto["tcp_mbps"] >= 0.8 * step(summary, "reserve", udp)["tcp_mbps"]), auto


def test_the_voice_probe_waits_behind_the_flood_in_the_fifo_but_not_in_its_reserved_class(run):
    out, summary, _ = run
    for policy in ("none", "police", "reserve", "auto"):
        unloaded = summary["policies"][policy]["probe_unloaded_rtt_ms"]
        assert 0 < unloaded < 20, (policy, unloaded)
    for udp in (10, 12):
        none, reserve, auto = (step(summary, p, udp) for p in ("none", "reserve", "auto"))
        # A full 25-packet FIFO at 5 Mbit/s holds tens of ms; the voice class is served first.
        assert none["probe_rtt_ms"]["median"] > 10, none
        for held in (reserve, auto):
            assert held["probe_rtt_ms"]["p95"] < none["probe_rtt_ms"]["median"] / 3, (held, none)
            assert held["probe_loss_percent"] <= 2 < none["probe_loss_percent"], (held, none)
        for policy in ("none", "reserve", "auto"):     # a packet every 20 ms over the measured window
            row = next(r for r in run_of(summary, policy)["steps"] if r["udp_mbps_offered"] == udp)
            assert row["probe_packets"] >= 0.8 * (row["end_s"] - row["start_s"] - 1) / 0.02, row
            assert row["tcp_rtt_ms"] > 0
    table = (out / "table.md").read_text()
    assert "| unloaded |" in table and (out / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "raw" / "reserve" / "1" / "probe.json").stat().st_size > 10_000


def test_results_hold_raw_json_summary_table_and_figure(run):
    out, summary, _ = run
    for policy in ("none", "reserve", "auto"):
        raw = out / "raw" / policy / "1"
        tcp = raw / "tcp.json"
        # Past a pipe's 64 KiB: the iperf3 client of the default run once blocked writing this to a pipe.
        assert tcp.stat().st_size > 64 * 1024
        intervals = json.loads(tcp.read_text())["server_output_json"]["intervals"]
        # The receiver's timer is late now and then on a loaded host (0.11 s, then 0.09 s): its period is the
        # median, and no interval is a whole poll long.
        seconds = [i["sum"]["seconds"] for i in intervals[:-1]]
        assert round(statistics.median(seconds), 2) == iperf.RECEIVER_SECONDS and max(seconds) < 0.5, seconds
        assert json.loads((raw / "udp_3.json").read_text())["end"]["sum"]["packets"] > 0   # step 3: 12 Mbit/s
    env = summary["environment"]
    assert {"kernel", "ovs_version", "datapath", "missing"} <= set(env)
    if not env["netem"]:
        assert "netem" in env["missing"] and summary["environment"]["delay_applied"] is None
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 12 |" in (out / "table.md").read_text()
    assert summary["complete"] is True


def test_nothing_is_left_behind(run):
    *_, left = run
    assert left == NOTHING_LEFT


def test_prometheus_holds_every_policy_and_answers_every_dashboard_query(run, recorded):
    _, summary, _ = run
    for policy, points in summary["prometheus"]["queries"].items():
        assert points["points"] >= 10, policy
    # Every dashboard expression, inside the run: mid-run, UDP flooding, auto's queues programmed; the
    # meter's panel while police polices.
    at = {panel: run_of(summary, "police")["t0"] + 15 for panel in ("Meter rate and drops",)}
    empty = []
    for dashboard, panel, expr in all_dashboard_expressions({"__rate_interval": "5s", "__range": "10m"}):
        when = at.get(panel, run_of(summary, "auto")["t0"] + 15)
        if not api(recorded, "/api/v1/query", timeout=10, query=expr, time=when)["result"]:
            empty.append(f"{dashboard}/{panel}: {expr}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
