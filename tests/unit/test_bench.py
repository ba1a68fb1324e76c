"""The benchmarks' own arithmetic: the pure decision path's synthetic mix, when a poll count is read, and how
bench/reaction.py times an onset."""
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.process import polls_counted
from bench.scale import _said, _slices
from topo.net.iperf import Interval

REPO = Path(__file__).resolve().parents[2]


def test_the_decision_benchmarks_mix_programs_and_rolls_back_its_flooded_third():
    done = subprocess.run([sys.executable, "-m", "bench.bench_decisions", "--ports", "30", "--seconds", "20"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=True)
    figures = dict(line.split(None, 1) for line in done.stdout.splitlines() if line.strip())
    assert figures["decisions"] == "10 program, 10 rollback"
    assert figures["port-samples"].startswith("600 ")
    assert float(figures["cost"].split()[0]) > 0


def test_the_paths_benchmark_builds_the_whole_fat_tree_and_cuts_one_of_its_links():
    done = subprocess.run([sys.executable, "-m", "bench.bench_paths", "--k", "4"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("k=4")]
    assert line.startswith("k=4: 20 switches, 16 hosts, 32 links (ecmp)") and "largest table" in line


def test_polls_are_counted_as_the_request_goes_out_not_when_a_slow_exposition_answers():
    started: list[float] = []

    class SlowExposition(BaseHTTPRequestHandler):
        def do_GET(self):   # noqa: N802 - http.server's name
            started.append(time.monotonic())
            time.sleep(0.5)   # formatting thousands of ports' samples
            body = (b'# TYPE ovsqos_polls_total counter\novsqos_polls_total{dp_id="0000000000000001"} 7.0\n'
                    b'ovsqos_polls_total{dp_id="0000000000000002"} 5.0\novsqos_poll_lag_seconds{dp_id="1"} 9.0\n')
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowExposition)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        total, at = polls_counted(f"http://127.0.0.1:{server.server_address[1]}/metrics")
        answered = time.monotonic()
    finally:
        server.shutdown()
    assert total == 12.0
    assert at <= started[0] and answered - at >= 0.5


def test_an_onset_is_timed_to_the_first_bytes_in_a_reservation_class_its_decision_and_tcp_back_at_the_bar():
    from bench.reaction import measure
    onset, tcp_start = 100.0, 90.0
    # The bottleneck's classes every 5 ms: the default class always busy, the reservation's (1:3) from 100.12.
    samples = [(t, {"1:1": int(t * 1e6), "1:3": 0 if t < 100.12 else int(t * 1e6), "1:fffe": int(t * 3e6)})
               for t in (99.0 + k * 0.005 for k in range(400))]
    decisions = [{"time": 99.0, "action": "program"}, {"time": 100.09, "action": "program"}]
    # TCP at 4.5 Mbit/s in 0.1 s intervals, under 3.2 (80 % of 4) from the onset until 10.3 s after its start.
    received = [Interval(t, t + 0.1, 1e6 if 10.0 <= t < 10.3 else 4.5e6) for t in (k / 10 for k in range(150))]
    assert measure(8e6, onset, samples, decisions, received, tcp_start) == {
        "udp_mbps": 8.0, "onset": 100.0, "reaction_seconds": 0.12, "decision_seconds": 0.09, "recovery_seconds": 0.4}
    never = [(t, {**c, "1:3": 0}) for t, c in samples]
    assert measure(8e6, onset, never, [], received, tcp_start)["reaction_seconds"] is None


def test_a_figures_spread_says_how_many_onsets_were_not_measured():
    from bench.reaction import _spread
    assert _spread([0.3, None, 0.1, 0.2]) == "median 0.200  p95 0.300  max 0.300, 1 not measured"
    assert _spread([None]) == "none measured"


def test_the_bottleneck_bench_times_each_port_from_its_own_flood_and_counts_false_programs():
    from bench.bottlenecks import reactions
    steps = [{"flows": {}}, {"flows": {"second": {"started_s": 8.12}}}, {"flows": {"first": {"started_s": 16.05}}}]
    summary = {"steps": steps, "decisions": [
        {"dp_id": "0000000000000002", "port": 2, "action": "program", "at_s": 8.31},
        {"dp_id": "0000000000000002", "port": 1, "action": "program", "at_s": 9.0},     # not a bottleneck: false
        {"dp_id": "0000000000000001", "port": 1, "action": "program", "at_s": 15.0},    # before its flood: false
        {"dp_id": "0000000000000001", "port": 1, "action": "rollback", "at_s": 15.5},
        {"dp_id": "0000000000000001", "port": 1, "action": "program", "at_s": 16.2}]}
    found, wrong = reactions(summary)
    assert found == {"s2-s3 (4 Mbit/s)": 0.19, "s1-s2 (5 Mbit/s)": 0.15} and wrong == 2


def test_a_joining_switch_is_timed_from_its_connection_to_its_sync_in_the_log_written_since_the_join(tmp_path):
    log = tmp_path / "controller.log"
    log.write_text("2026-11-28 21:00:00.000 INFO qos: switch 0000000000100000 in sync\n")   # an earlier run's
    start = log.stat().st_size
    with log.open("a") as f:
        f.write("2026-11-28 21:00:01.250 INFO qos: switch 0000000000100000 (scalejoin0, datapath netdev, OVSDB "
                "unix:/var/run/openvswitch/db.sock) connected\n"
                "2026-11-28 21:00:01.300 INFO qos: switch 0000000000100001 in sync\n"
                "2026-11-28 21:00:02.750 INFO qos: switch 0000000000100000 in sync\n")
    said = _said(log, start, 0x100000)
    assert (said["in sync"] - said["connected"]).total_seconds() == 1.5


def test_the_steady_windows_slices_cover_it_and_read_this_process():
    start = time.monotonic()
    shares = _slices(os.getpid(), start + 0.25, seconds=0.1)
    assert len(shares) == 3 and time.monotonic() - start >= 0.25
    assert all(0 <= share < 1 for share in shares)   # asleep: far from a core
