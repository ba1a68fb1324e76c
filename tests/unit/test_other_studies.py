"""The pure parts of the cc, fairness and aqm studies, on input shaped like the real tools' output and
like the experiment's results they read (topo/studies/experiment/)."""
from pathlib import Path

import pytest

from controller.core.policy import SPECIAL_OUTPUTS, load_document, parse_policy
from topo.harness import capabilities as cap
from topo.harness.capabilities import choose_tcp
from topo.harness.report import Panel, bar_figure, group_reasons, jain_index, markdown_table
from topo.net import ping
from topo.net.iperf import sender_metrics
from topo.net.netem import delay_seconds
from topo.studies import STUDIES
from topo.studies.aqm import discipline_result
from topo.studies.aqm import table as aqm_table
from topo.studies.base import UsageError, parser_for, settings
from topo.studies.cc import table as cc_table
from topo.studies.fairness import case_result, parse_pairs
from topo.studies.fairness import table as fairness_table
from topo.topos import DumbbellTopo, StudyTopo

REPO = Path(__file__).resolve().parents[2]
MSS = 1448

# `ping -D -i 0.2 ...` (iputils 20221126).
PING_TEXT = """PING 10.0.0.1 (10.0.0.1) 56(84) bytes of data.
[100.500000] 64 bytes from 10.0.0.1: icmp_seq=1 ttl=64 time=0.058 ms
[101.500000] 64 bytes from 10.0.0.1: icmp_seq=2 ttl=64 time=60.5 ms
[102.500000] 64 bytes from 10.0.0.1: icmp_seq=3 ttl=64 time=80.5 ms

--- 10.0.0.1 ping statistics ---
4 packets transmitted, 3 received, 25% packet loss, time 406ms
rtt min/avg/max/mdev = 0.058/47.019/80.500/34.000 ms
"""


def iperf_tcp(cwnds, rttvars, received_bps, retransmits=3, cc="cubic", server_bps=None, sent_bytes=1448000):
    """A client JSON of iperf3 3.12 (-J --get-server-output, -i 0.5) for one TCP stream."""
    intervals = []
    for k, (cwnd, rttvar) in enumerate(zip(cwnds, rttvars)):
        stream = {"socket": 5, "start": k * 0.5, "end": (k + 1) * 0.5, "seconds": 0.5, "bytes": 300000,
                  "bits_per_second": 4.8e6, "retransmits": 1, "snd_cwnd": cwnd, "snd_wnd": 600000,
                  "rtt": 50000, "rttvar": rttvar, "pmtu": 1500, "omitted": False, "sender": True}
        intervals.append({"streams": [stream], "sum": {k2: v for k2, v in stream.items()
                                                       if k2 not in ("snd_cwnd", "snd_wnd", "rtt", "rttvar", "pmtu")}})
    seconds = len(cwnds) / 2
    server_bps = server_bps or [received_bps] * int(seconds)
    return {
        "start": {"version": "iperf 3.12", "tcp_mss_default": MSS, "test_start": {"protocol": "TCP", "num_streams": 1}},
        "intervals": intervals,
        "end": {"streams": [{"sender": {"socket": 5, "start": 0, "end": seconds, "seconds": seconds,
                                        "bytes": sent_bytes, "bits_per_second": 5.2e6, "retransmits": retransmits,
                                        "max_snd_cwnd": max(cwnds), "max_snd_wnd": 600000, "max_rtt": 57897,
                                        "min_rtt": 44681, "mean_rtt": 52163, "sender": True}}],
                "sum_sent": {"start": 0, "end": seconds, "seconds": seconds, "bytes": sent_bytes,
                             "bits_per_second": 5.2e6, "retransmits": retransmits, "sender": True},
                "sum_received": {"bytes": 1_000_000, "bits_per_second": received_bps, "sender": True},
                "sender_tcp_congestion": cc, "receiver_tcp_congestion": cc},
        "server_output_json": {
            "intervals": [{"sum": {"start": k, "end": k + 1, "seconds": 1, "bytes": 1, "bits_per_second": bps}}
                          for k, bps in enumerate(server_bps)],
            "end": {"sum_received": {"start": 0, "end": seconds, "bits_per_second": received_bps}}},
    }


def iperf_udp(server_bps, lost_percent=48.0):
    return {"start": {"version": "iperf 3.12", "test_start": {"protocol": "UDP"}}, "intervals": [],
            "end": {"sum": {"lost_percent": lost_percent}},
            "server_output_json": {"intervals": [{"sum": {"start": k, "end": k + 1, "bits_per_second": bps}}
                                                 for k, bps in enumerate(server_bps)]}}


# --- Jain's index ---------------------------------------------------------------------------

@pytest.mark.parametrize("xs, expected", [
    ([2.5, 2.5], 1.0), ([4.8, 0.0], 0.5), ([1, 1, 1, 1, 1], 1.0), ([5, 0, 0, 0, 0], 0.2), ([3.0], 1.0),
    ((8.32, 1.61), 0.6866),   # the study's cubic pair: 69 %
    ((9.14, 0.154), 0.5168),  # the study's reno pair: 51 %
])
def test_jain_index(xs, expected):
    assert jain_index(xs) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("xs", [[], [0.0, 0.0], [1.0, -1.0]])
def test_jain_index_is_undefined(xs):
    with pytest.raises(ValueError):
        jain_index(xs)


# --- cc -------------------------------------------------------------------------------------

def test_sender_metrics_from_iperf3_json():
    doc = iperf_tcp(cwnds=[26064, 33304, 34752, 27512], rttvars=[2000, 4000, 3000, 5000], received_bps=4784234.6)
    doc["intervals"][0]["streams"][0]["omitted"] = True      # omitted seconds never count
    m = sender_metrics(doc)
    assert m["throughput_mbps"] == 4.784
    assert (m["rtt_mean_ms"], m["rtt_min_ms"], m["rtt_max_ms"]) == (52.163, 44.681, 57.897)
    assert m["rttvar_mean_ms"] == 4.0
    assert m["cwnd_mean_packets"] == round((33304 + 34752 + 27512) / 3 / MSS, 1) == 22.0
    assert m["cwnd_max_packets"] == 24.0
    assert m["retransmits"] == 3 and m["mss_bytes"] == MSS and m["congestion_control"] == "cubic"
    assert m["packets_sent"] == 1000


def test_sender_metrics_cover_every_stream_of_a_test():
    doc = iperf_tcp(cwnds=[MSS * 10, MSS * 20], rttvars=[2000, 4000], received_bps=4e6)
    for interval in doc["intervals"]:   # a second stream, with twice the first's window
        interval["streams"].append({**interval["streams"][0], "snd_cwnd": interval["streams"][0]["snd_cwnd"] * 2})
    doc["end"]["streams"].append({"sender": {**doc["end"]["streams"][0]["sender"], "max_snd_cwnd": MSS * 40,
                                             "min_rtt": 30000, "mean_rtt": 60163}})
    m = sender_metrics(doc)
    assert (m["cwnd_mean_packets"], m["cwnd_max_packets"]) == (22.5, 40.0)
    assert (m["rtt_min_ms"], m["rtt_mean_ms"]) == (30.0, 56.163)


def caps_with(available: dict[str, bool]) -> dict[str, cap.Capability]:
    return {f"tcp:{a}": cap.Capability(f"tcp:{a}", ok, "in tcp_available_congestion_control" if ok else
                                       f"not in tcp_available_congestion_control; no tcp_{a}.ko*", "grep", False)
            for a, ok in available.items()}


def test_choose_tcp_runs_what_the_kernel_offers_in_the_study_order_and_skips_the_rest():
    caps = caps_with({a: a in ("reno", "cubic", "bbr") for a in cap.STUDY_TCP})
    run, skipped = choose_tcp(None, ["reno", "bbr", "cubic"], caps)
    assert run == ["reno", "cubic", "bbr"]
    assert set(skipped) == set(cap.STUDY_TCP) - {"reno", "cubic", "bbr"}
    assert skipped["vegas"].startswith("not in tcp_available_congestion_control")


def test_choose_tcp_loads_study_modules_and_reports_unknown_names():
    caps = caps_with({"reno": True, "cubic": True, "vegas": True, "bic": False})   # vegas: a loadable module
    run, skipped = choose_tcp(["vegas", "cubic", "bic", "nosuch"], ["reno", "cubic"], caps)
    assert run == ["vegas", "cubic"]
    assert set(skipped) == {"bic", "nosuch"} and "unknown" in skipped["nosuch"]


FAITHFUL = {"faithful": True, "fidelity_notes": []}


def test_cc_table_has_a_row_per_algorithm_and_the_published_numbers():
    row = {"cwnd_mean_packets": 22.0, "cwnd_max_packets": 24.0, "rtt_mean_ms": 52.163, "rttvar_mean_ms": 4.0,
           "throughput_mbps": 4.784, "retransmits": 3, **FAITHFUL}
    stalled = {**row, "faithful": False, "fidelity_notes": ["TCP stalled for 1.50 s while its queue dropped nothing"]}
    text = cc_table({"scenario": {"bottleneck": 5_000_000, "queue_packets": 25, "seconds": 8, "delay": "150ms",
                                  "loss_percent": 1.0},
                     "algorithms": {"reno": row, "bbr": stalled}, "skipped": {"vegas": "absent"}})
    assert "| reno | 22.00 | 24.00 | 52.16 | 4.00 | 4.78 | 3 | yes |" in text
    assert "| bbr | 22.00 | 24.00 | 52.16 | 4.00 | 4.78 | 3 | no † |" in text
    assert "- bbr: TCP stalled for 1.50 s" in text and "skipped: vegas" in text
    assert "25 packets, 150ms one way, 1 % loss each way" in text
    assert "| cubic | 1276.5 | 391.9 | 156.1 | 919 |" in text
    assert "fallback" not in text


def test_cc_table_says_which_algorithm_ran_in_the_kernels_fallback():
    row = {"cwnd_mean_packets": 22.0, "cwnd_max_packets": 24.0, "rtt_mean_ms": 52.163, "rttvar_mean_ms": 4.0,
           "throughput_mbps": 4.784, "retransmits": 3, **FAITHFUL}
    text = cc_table({"scenario": {"bottleneck": 5_000_000, "queue_packets": 25, "seconds": 8},
                     "algorithms": {"reno": {**row, "congestion_control": "reno"},
                                    "dctcp": {**row, "congestion_control": "dctcp-reno"}}, "skipped": {}})
    assert "In the kernel's fallback: dctcp ran as dctcp-reno (DCTCP needs ECN marks" in text


# --- fairness -------------------------------------------------------------------------------

def test_parse_pairs():
    assert parse_pairs(["cubic:reno", "bbr:bbr"]) == [("cubic", "reno"), ("bbr", "bbr")]
    for bad in ("cubic", "cubic:", ":reno", "a:b:c"):
        with pytest.raises(UsageError):
            parse_pairs([bad])


PORT = "0000000000000001:1"
FIDELITY = {"port": PORT, "faithful": True, "fidelity_notes": [], "fidelity": {"samples": 30}}


def trial(flows, step_flows, tcp, ports=None, leaves=None, **step):
    """A trial's result as the experiment writes it, of one step."""
    return {"policy": "none", "flows": flows, "tcp": tcp, "leaves": leaves or {}, "fidelity": FIDELITY,
            "steps": [{"step": 0, "window_s": [1.0, 10.0], "flows": step_flows, "ports": ports or {}, **step}]}


def tcp_flow(name, src, dst, cc):
    return {"name": name, "from": src, "to": dst, "protocol": "tcp", "cc": cc}


def test_case_result_gives_each_flow_and_the_index():
    flows = [tcp_flow("h1-h4_cubic", "h1", "h4", "cubic"),
             {"name": "h2-h3_udp", "from": "h2", "to": "h3", "protocol": "udp", "cc": None, "offered_mbps": [10.0]}]
    res = trial(flows, {"h1-h4_cubic": {"mbps": 0.6, "retransmits": 5},
                        "h2-h3_udp": {"mbps": 4.4, "offered_mbps": 10.0, "lost_percent": 48.0}},
                {"h1-h4_cubic": {"retransmits": 7}})
    case = case_result("cubic-vs-UDP", res)
    assert case["name"] == "cubic vs UDP"
    assert case["flows"][0] == {"flow": "h1 -> h4", "mbps": 0.6, "protocol": "tcp", "congestion_control": "cubic",
                                "retransmits": 7}
    assert case["flows"][1] == {"flow": "h2 -> h3", "mbps": 4.4, "protocol": "udp", "offered_mbps": 10.0,
                                "lost_percent": 48.0}
    assert case["jain_index"] == round(jain_index([0.6, 4.4]), 3) == 0.634
    assert case["window_s"] == [1.0, 10.0] and case["faithful"] is True


def test_case_result_of_two_silent_flows_has_no_index():
    flows = [tcp_flow("a", "h1", "h4", "reno"), tcp_flow("b", "h2", "h3", "reno")]
    res = trial(flows, {"a": {"mbps": 0.0}, "b": {"mbps": None}}, {"a": {"retransmits": 0}, "b": {"retransmits": 0}})
    assert case_result("reno-vs-reno", res)["jain_index"] is None


def test_fairness_table():
    case = {"name": "cubic vs reno", "jain_index": 0.9, **FAITHFUL, "flows": [
        {"protocol": "tcp", "congestion_control": "cubic", "mbps": 2.9},
        {"protocol": "tcp", "congestion_control": "reno", "mbps": 1.8}]}
    udp = {"name": "cubic vs UDP", "jain_index": 0.5, **FAITHFUL, "flows": [
        {"protocol": "tcp", "congestion_control": "cubic", "mbps": 0.0},
        {"protocol": "udp", "offered_mbps": 10.0, "mbps": 4.8}]}
    text = fairness_table({"scenario": {"bottleneck": 5_000_000, "queue_packets": 25, "seconds": 10},
                           "cases": [case, udp], "skipped": {}})
    assert "| cubic vs reno | cubic | 2.90 | reno | 1.80 | 0.900 | yes |" in text
    assert "| cubic vs UDP | cubic | 0.00 | UDP at 10 Mbit/s | 4.80 | 0.500 | yes |" in text
    assert "not faithful" not in text
    assert "| reno vs reno | 9.14 | 0.154 | 0.517 |" in text


# --- aqm ------------------------------------------------------------------------------------

def test_parse_ping():
    replies, transmitted, received = ping.parse(PING_TEXT)
    assert replies == [(100.5, 0.058), (101.5, 60.5), (102.5, 80.5)]
    assert (transmitted, received) == (4, 3)
    assert ping.parse("") == ([], 0, 0)
    assert ping.summary(PING_TEXT, 101.0, 104.0) == {"min": 60.5, "mean": 70.5, "max": 80.5, "replies": 2,
                                                     "ping_transmitted": 4, "ping_received": 3}
    assert ping.summary("", 0, 1)["mean"] is None


def aqm_trial(leaf_drops, probe=None):
    flows = [tcp_flow(f"snd{i}-rcv{i}", f"snd{i}", f"rcv{i}", "cubic") for i in range(1, 6)]
    sender = {"retransmits": 10, "packets_sent": 1000, "congestion_control": "cubic"}
    ports = {PORT: {"utilisation": 1.0, "cpu_pressure": 0.0, "classes": {"default": {
        "mbps": 10.0, "drops": 12, "backlog_packets": {"mean": 20.0, "max": 30, "samples": 35}}}},
             "0000000000000002:1": {"utilisation": 0.05, "cpu_pressure": 0.0, "classes": {}}}
    delay = {"min": 60.5, "mean": 70.5, "max": 80.5, "replies": 2, "ping_transmitted": 4, "ping_received": 3}
    return trial(flows, {f["name"]: {"mbps": 2.0} for f in flows}, {f["name"]: sender for f in flows}, ports,
                 {PORT: {"default": {"kinds": ["pfifo"], "drops": leaf_drops}}}, ping_rtt_ms=delay,
                 **({"probe": probe} if probe else {}))


def test_discipline_result():
    r = discipline_result(aqm_trial(leaf_drops=3))
    assert r["throughput_mbps"] == 10.0 and r["utilisation"] == 1.0 and r["jain_index"] == 1.0
    assert r["flows_mbps"] == [2.0] * 5
    assert (r["retransmits"], r["packets_sent"], r["loss_rate"]) == (50, 5000, 0.01)
    assert r["queue_drops"] == 12                                   # the class saw more than the queue itself
    assert discipline_result(aqm_trial(leaf_drops=40))["queue_drops"] == 40     # an AQM's dequeue drops
    assert r["delay_ms"]["mean"] == 70.5
    assert r["backlog"] == {"mean_packets": 20.0, "max_packets": 30, "samples": 35}
    assert r["leaf_kinds_seen"] == ["pfifo"] and r["congestion_control"] == ["cubic"]
    assert r["faithful"] is True and "probe_rtt_ms" not in r        # a run without the probe


def test_discipline_result_carries_the_probe():
    probe = {"probe_rtt_ms": {"median": 40.0, "p95": 40.0}, "probe_loss_percent": 0.0, "probe_packets": 150}
    r = discipline_result(aqm_trial(0, probe))
    assert (r["probe_rtt_ms"]["median"], r["probe_packets"]) == (40.0, 150)


def test_aqm_table_lists_unavailable_disciplines():
    row = {"throughput_mbps": 9.6, "utilisation": 0.96, "loss_rate": 0.0123, "queue_drops": 40, "jain_index": 0.97,
           "delay_ms": {"min": 50.0, "mean": 110.25, "max": 125.0},
           "backlog": {"mean_packets": 80.0, "max_packets": 100}, **FAITHFUL}
    text = aqm_table({"scenario": {"bottleneck": 10_000_000, "queue_packets": 100, "seconds": 10,
                                   "congestion_control": "cubic"},
                      "disciplines": {"fifo": row}, "unavailable": {"sfq": "kernel lacks sch_sfq"}})
    assert "| fifo | 9.60 | 96.00 | 1.23 | 40 | 50.0/110.2/125.0 | – | 80.0/100.0 | 0.97 | yes |" in text
    assert "not run: sfq (kernel lacks sch_<name>)" in text
    assert "| RED | 5.53 |" in text
    probed = {**row, "probe_rtt_ms": {"median": 61.04, "p95": 98.5}, "probe_loss_percent": 1.5}
    text = aqm_table({"scenario": {"bottleneck": 10_000_000, "queue_packets": 100, "seconds": 10,
                                   "congestion_control": "cubic"}, "disciplines": {"fifo": probed}, "unavailable": {}})
    assert "| 50.0/110.2/125.0 | 61.0/98.5, 1.5 % | 80.0/100.0 |" in text


# --- shared pieces --------------------------------------------------------------------------

def test_markdown_table():
    assert markdown_table(["a", "b"], [[1.234, None], ["x", 3]]) == "| a | b |\n|---|---|\n| 1.23 | – |\n| x | 3 |\n"


def test_settings_defaults_quick_and_errors():
    p = parser_for(STUDIES["cc"], "topo/run.py cc")
    assert settings(p.parse_args([])).seconds == 30
    quick = settings(p.parse_args(["--quick", "--bottleneck", "10Mbit"]))
    assert (quick.seconds, quick.bottleneck_bps, quick.queue_packets) == (8, 10_000_000, 25)
    assert settings(p.parse_args(["--quick", "--seconds", "4"])).seconds == 4
    for bad in (["--seconds", "2"], ["--seconds", "4.5"], ["--bottleneck", "fast"], ["--queue-packets", "0"]):
        with pytest.raises(UsageError):
            settings(p.parse_args(bad))


def test_bar_figure_writes_a_png(tmp_path):
    path = tmp_path / "f.png"
    bar_figure(path, "t", ["a", "b"], [Panel("y", {"one": [1.0, None], "two": [2.0, 3.0]}, line=(2.5, "cap"),
                                             annotations=["J = 1", "J = 0.5"])])
    assert path.read_bytes().startswith(b"\x89PNG")


# --- the policies forward every host of their topology --------------------------------------

@pytest.mark.parametrize("name, topo", [("shared", StudyTopo()), ("dumbbell", DumbbellTopo(n=5))])
def test_policy_forwards_each_host_mac_towards_its_port(name, topo):
    policy = parse_policy(load_document(REPO / "policies" / f"{name}.yaml"))
    # Mininet's autoSetMacs numbers hosts in topo.hosts() order: MAC 00:00:00:00:00:<k>.
    macs = {host: f"00:00:00:00:00:{k:02x}" for k, host in enumerate(topo.hosts(), start=1)}
    for switch in policy.switches:
        outputs = {dict(f.match)["eth_dst"]: f.outputs for f in switch.flows}
        assert outputs.pop("ff:ff:ff:ff:ff:ff") == (SPECIAL_OUTPUTS["flood"],)
        expected = {}
        for host, mac in macs.items():
            port = topo.port(switch.name, host)[0] if host in topo.g[switch.name] else 1
            expected[mac] = (port,)
        assert outputs == expected
        assert [(p.port_no, p.queues) for p in switch.ports] == [(1, "fifo")]


def test_group_reasons_says_a_shared_reason_once():
    reasons = {"sfq": "kernel lacks sch_sfq: 'Error: Specified qdisc kind is unknown.'",
               "red": "kernel lacks sch_red: 'Error: Specified qdisc kind is unknown.'", "x": "tc refused it"}
    assert group_reasons(reasons) == {"kernel lacks sch_<name>: 'Error: Specified qdisc kind is unknown.'":
                                      ["sfq", "red"], "tc refused it": ["x"]}


def test_a_cc_delay_is_read_in_seconds():
    assert [delay_seconds(d) for d in (None, "15ms", "150ms", "500us", "1.5s")] == [0.0, 0.015, 0.15, 0.0005, 1.5]
