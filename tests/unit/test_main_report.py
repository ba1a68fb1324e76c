"""topo/studies/main/report.py: one run's steps, repeats combined, the table and the figure."""
import json

import pytest

from controller.adapters.tc import ClassCounters, Leaf
from controller.core.policy import load_document, parse_policy
from topo.harness.fidelity import Sample
from topo.harness.report import write_json
from topo.net.traffic import Flow, Pause, Ran
from topo.studies.main.report import UNFAITHFUL, aggregate, faults_line, figure, latency_figure, summarise_run, table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RESERVE = parse_policy(load_document("policies/reserve.yaml"))
T0 = 1000.0


def intervals(rates, seconds=0.25, streams=1):
    out, t = [], 0.0
    for bps in rates:
        share = {"start": t, "end": t + seconds, "bits_per_second": bps / streams}
        out.append({"streams": [share] * streams, "sum": {**share, "bits_per_second": bps, "retransmits": 0}})
        t += seconds
    return out


def tcp_ran(rates, streams=1):
    doc = {"intervals": intervals(rates, 0.5), "server_output_json": {"intervals": intervals(rates, streams=streams)}}
    return Ran(Flow("tcp", "h1", "h4", 10, parallel=streams), T0, T0 + len(rates) * 0.25, doc)


def samples(until, tcp_drops=0):
    """The bottleneck sampled every 0.25 s, full (5 Mbit/s), TCP's class dropping `tcp_drops` in all."""
    out, n = [], int(until / 0.25) + 1
    for k in range(n):
        sent = int(5e6 / 8 * 0.25 * k)
        classes = {"1:2": ClassCounters(sent, k * 100, tcp_drops * k // (n - 1)), "1:fffe": ClassCounters(sent, k, 0)}
        out.append(Sample(T0 + 0.25 * k, classes, k * 1000, None))
    return out


def run_of(tcp_rates, drops=0):
    tcp = tcp_ran(tcp_rates)
    steps = [Ran(Pause(2, label="UDP 0"), T0, T0 + 2.0)]
    return summarise_run(5_000_000, 1.0, (0,), RESERVE, tcp, steps, samples(len(tcp_rates) * 0.25, drops),
                         {"1:2": ClassCounters(100, 2, 0)}, {"1:2": Leaf("pfifo_head_drop", 25)}, [])


def test_a_run_measures_each_step_after_its_settling_second_and_is_faithful_when_nothing_fired():
    run = run_of([4.0e6] * 4 + [4.8e6] * 8)     # 3 s of TCP; the step is [0, 2], measured over [1, 2]
    (step,) = run["steps"]
    assert step["tcp_mbps"] == 4.8 and step["udp_mbps_delivered"] == 0.0
    assert step["faithful"] is True and step["fidelity_notes"] == []
    assert step["fidelity"]["bottleneck_utilisation"] == pytest.approx(1.0, abs=0.01)
    assert run["tc_classes"]["1:2"] == {"class": "tcp", "bytes": 100, "packets": 2, "drops": 0,
                                        "queue": "pfifo_head_drop", "limit_packets": 25}


def test_a_stall_the_queue_does_not_explain_makes_the_step_unfaithful():
    run = run_of([4.8e6] * 4 + [0.0] * 8)       # TCP gets nothing for 2 s while its class drops nothing
    (step,) = run["steps"]
    assert step["faithful"] is False
    assert any("stalled" in note for note in step["fidelity_notes"])


def test_parallel_flows_report_each_flows_rate_and_their_jain_index():
    tcp = tcp_ran([4.8e6] * 12, streams=2)
    run = summarise_run(5_000_000, 1.0, (0,), RESERVE, tcp, [Ran(Pause(2), T0, T0 + 2.0)], samples(3.0), {}, {}, [])
    (step,) = run["steps"]
    assert step["tcp_flows_mbps"] == [2.4, 2.4] and step["tcp_jain_index"] == 1.0


def step(tcp, udp=0.0, faithful=True, notes=()):
    return {"udp_mbps_offered": 10, "tcp_mbps": tcp, "udp_mbps_delivered": udp, "tcp_retransmits": 0,
            "faithful": faithful, "fidelity_notes": list(notes), "fidelity": {"samples": 36}}


def test_repeats_give_the_median_the_range_and_every_run_of_each_step():
    runs = [{"steps": [step(4.3)]}, {"steps": [step(4.1, notes=["x"], faithful=False)]}, {"steps": [step(4.2)]}]
    (combined,) = aggregate(runs)["steps"]
    assert (combined["tcp_mbps"], combined["tcp_mbps_min"], combined["tcp_mbps_max"]) == (4.2, 4.1, 4.3)
    assert combined["runs"] == [4.3, 4.1, 4.2]
    assert combined["faithful"] is False and combined["fidelity_notes"] == ["run 2: x"]
    assert combined["fidelity"] == [{"samples": 36}] * 3
    assert aggregate(runs)["repetitions"] == runs


def summary(repeats=1, faithful=True):
    runs = [{"steps": [step(4.8, 0.0), step(4.2 + 0.1 * k, 0.5, faithful, [] if faithful else ["stalled"])]}
            for k in range(repeats)]
    for run in runs:
        run["steps"][0]["udp_mbps_offered"] = 0
    return {"bottleneck_mbps": 5, "scenario": {"repeat": repeats},
            "policies": {"reserve": {**aggregate(runs), "tcp_reservation_mbps": 4.0}}}


def test_table_of_one_run_has_plain_numbers():
    assert table(summary()).splitlines() == [
        "| UDP offered (Mbit/s) | reserve: TCP | reserve: UDP delivered |",
        "|---:|---:|---:|",
        "| 0 | 4.80 | 0.00 |",
        "| 10 | 4.20 | 0.50 |",
    ]


def test_table_of_repeats_shows_the_median_and_its_range_and_marks_unfaithful_steps():
    lines = table(summary(repeats=3, faithful=False)).splitlines()
    assert lines[3] == f"| 10 | 4.30 (4.20–4.40) {UNFAITHFUL} | 0.50 |"
    assert lines[5].startswith(f"{UNFAITHFUL} not faithful")
    assert lines[6] == "- reserve at UDP 10 Mbit/s: run 1: stalled"


@pytest.mark.parametrize("repeats, faithful", [(1, True), (3, False)])
def test_figure_writes_a_png(tmp_path, repeats, faithful):
    path = tmp_path / "throughput.png"
    figure(summary(repeats, faithful), path)
    assert path.read_bytes().startswith(PNG_MAGIC) and path.stat().st_size > 5000


def test_write_json_round_trips_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, summary())
    assert json.loads(path.read_text()) == summary()
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def udp_ran(rate_bps, seconds=4, offered=4.0):
    """UDP alone, starting at T0 + 20: what the receiver got, and the loss iperf3 counted."""
    server = {"intervals": intervals([rate_bps] * (seconds * 4))}
    doc = {"server_output_json": server, "end": {"sum_sent": {"seconds": seconds},
                                                  "sum": {"lost_percent": 100 * (1 - rate_bps / (offered * 1e6))}}}
    return Ran(Flow("udp_alone", "h1", "h4", seconds, udp_mbps=offered), T0 + 20, T0 + 20 + seconds, doc)


def test_udp_alone_is_measured_after_its_settling_second_with_its_loss():
    tcp = tcp_ran([4.8e6] * 12)
    run = summarise_run(5_000_000, 1.0, (0,), RESERVE, tcp, [Ran(Pause(2), T0, T0 + 2.0)], samples(3.0), {}, {}, [],
                        udp_ran(0.5e6))
    assert run["udp_alone"] == {"udp_mbps_offered": 4.0, "udp_mbps_delivered": 0.5, "udp_lost_percent": 87.5,
                                "start_s": 20.0, "end_s": 24.0}
    combined = aggregate([run, {**run, "udp_alone": {**run["udp_alone"], "udp_mbps_delivered": 0.7}}])
    assert combined["udp_alone"]["udp_mbps_delivered_min"] == 0.5 and combined["udp_alone"]["udp_mbps_delivered_max"] == 0.7


def with_alone(doc, delivered, lost):
    for result in doc["policies"].values():
        result["udp_alone"] = {"udp_mbps_offered": 4.0, "udp_mbps_delivered": delivered, "udp_lost_percent": lost}
    return doc


def test_the_table_ends_with_what_each_policy_delivered_of_udp_alone():
    lines = table(with_alone(summary(), 0.5, 87.5)).splitlines()
    assert lines[-1] == "| 4, alone after TCP | – | 0.50 (88 % lost) |"


def test_the_figure_has_a_panel_for_udp_alone(tmp_path):
    plain, beside = tmp_path / "plain.png", tmp_path / "beside.png"
    figure(summary(), plain)
    figure(with_alone(summary(), 4.0, 0.0), beside)
    assert beside.read_bytes().startswith(PNG_MAGIC) and beside.stat().st_size > plain.stat().st_size


# --- the latency probe ------------------------------------------------------------------------------

def irtt_doc(rtts_ms, start=T0, interval=0.02, lost="true_up"):
    """irtt's JSON for packets sent every `interval` from `start`; None for a lost one, lost as `lost` says."""
    trips = []
    for k, rtt in enumerate(rtts_ms):
        sent = {"client": {"send": {"wall": int((start + k * interval) * 1e9)}}}
        trips.append({"seqno": k, "lost": lost if rtt is None else "false", "timestamps": sent,
                      **({} if rtt is None else {"delay": {"rtt": int(rtt * 1e6)}})})
    return {"round_trips": trips}


def probed_run(rtts_ms, tcp_drops=0, classes_drops=0, lost="true_up"):
    """A 3 s run whose step is [0, 2] (measured over [1, 2]), the probe throughout and unloaded before."""
    tcp = tcp_ran([4.8e6] * 12)
    probe_ran = Ran(Flow("probe", "h2", "h3", 3), T0, T0 + 3, irtt_doc(rtts_ms, T0 + 0.01, lost=lost))   # off the edges
    unloaded = Ran(Flow("probe_unloaded", "h2", "h3", 1), T0 - 2, T0 - 1, irtt_doc([0.4] * 50, T0 - 2))
    bottleneck = samples(3.0, tcp_drops)
    if classes_drops:
        bottleneck = [Sample(s.t, {**s.classes, "1:1": ClassCounters(k, k, classes_drops * k)}, 0, None)
                      for k, s in enumerate(bottleneck)]
    return summarise_run(5_000_000, 1.0, (0,), RESERVE, tcp, [Ran(Pause(2), T0, T0 + 2.0)], bottleneck, {}, {}, [],
                         None, probe_ran, unloaded)


def test_a_steps_latency_is_the_probes_packets_sent_inside_its_window():
    # 50 packets in the settling second at 1 ms, then 50 at 30 ms of which the tenth is lost
    rtts = [1.0] * 50 + [30.0] * 9 + [None] + [30.0] * 40 + [5.0] * 50
    run = probed_run(rtts)
    (step,) = run["steps"]
    assert step["probe_rtt_ms"]["median"] == 30.0 and step["probe_rtt_ms"]["p95"] == 30.0
    assert step["probe_packets"] == 50 and step["probe_loss_percent"] == 2.0
    assert run["probe_unloaded"]["probe_rtt_ms"]["median"] == 0.4
    # the packet was lost where no queue dropped: the emulator, not the policy, decided the probe's loss,
    # and TCP's figures, judged by TCP's own counters, stand
    assert step["probe_faithful"] is False and "lost outside the queues" in step["probe_notes"][-1]
    assert step["faithful"] is True and not step["fidelity_notes"]


def test_a_probe_packet_the_queue_dropped_leaves_the_probe_faithful():
    rtts = [1.0] * 50 + [30.0] * 9 + [None] + [30.0] * 40 + [5.0] * 50
    (step,) = probed_run(rtts, classes_drops=1)["steps"]
    assert step["probe_faithful"] is True, step["probe_notes"]


def test_an_echo_lost_on_the_way_back_is_the_emulators_even_when_the_queue_dropped():
    rtts = [1.0] * 50 + [30.0] * 9 + [None] + [30.0] * 40 + [5.0] * 50
    (step,) = probed_run(rtts, classes_drops=1, lost="true_down")["steps"]
    assert step["probe_faithful"] is False and step["probe_notes"] == \
        ["probe: 1 echoes lost on the way back, where no queue of the step is"]
    lines = table({"bottleneck_mbps": 5, "scenario": {"repeat": 1},
                   "policies": {"reserve": aggregate([probed_run(rtts, classes_drops=1, lost="true_down")])}})
    assert "| 0 | 30.0 / 30.0 | 2 % †" in lines and "- reserve at UDP 0 Mbit/s: probe: 1 echoes lost" in lines


def latency_summary():
    runs = []
    for extra in (0.0, 10.0, 20.0):
        run = probed_run([1.0] * 50 + [20.0 + extra] * 50 + [5.0] * 50)
        runs.append(run)
    combined = aggregate(runs)
    return {"bottleneck_mbps": 5, "scenario": {"repeat": 3}, "policies": {"reserve": combined}}


def test_repeats_give_the_median_of_each_percentile_and_of_the_unloaded_rtt():
    policy = latency_summary()["policies"]["reserve"]
    (step,) = policy["steps"]
    assert step["probe_rtt_ms"]["median"] == 30.0
    assert (step["probe_rtt_p95_ms_min"], step["probe_rtt_p95_ms_max"]) == (20.0, 40.0)
    assert policy["probe_unloaded_rtt_ms"] == 0.4


def test_the_table_has_a_latency_section_starting_with_the_unloaded_rtt():
    lines = table(latency_summary()).splitlines()
    start = lines.index("| UDP offered (Mbit/s) | reserve: RTT (ms) | reserve: lost |")
    assert lines[start + 2:] == ["| unloaded | 0.4 | – |", "| 0 | 30.0 / 30.0 | 0 % |"]


def test_no_probe_no_latency_section_nor_figure(tmp_path):
    assert "RTT" not in table(summary())
    assert latency_figure(summary(), tmp_path / "latency.png") is False
    assert not (tmp_path / "latency.png").exists()


def test_the_latency_figure_is_a_png(tmp_path):
    path = tmp_path / "latency.png"
    assert latency_figure(latency_summary(), path) is True
    assert path.read_bytes().startswith(PNG_MAGIC) and path.stat().st_size > 5000


def test_a_fault_is_said_under_the_tables_with_who_mastered_the_switch_and_when():
    fault = {"member": "c2", "dp_id": "0000000000000001", "killed_s": 7.04, "mastered_by": "c1",
             "remaster_seconds": 0.183}
    summary = {"policies": {"none": {"repetitions": [{}]},
                            "auto": {"repetitions": [{"fault": fault}, {"fault": {**fault, "mastered_by": None}}]}}}
    assert faults_line(summary) == (
        "\nFault:\n\n- auto: c2, the owner of switch 0000000000000001, killed (kill -9) 7.0 s into TCP; mastered by "
        "c1 0.18 s later\n- auto: c2, the owner of switch 0000000000000001, killed (kill -9) 7.0 s into TCP; not "
        "mastered again within 30 s\n")
    assert faults_line({"policies": {"none": {"repetitions": [{}]}}}) == ""
