"""The benchmarks' own arithmetic: the pure decision path's synthetic mix, and when a poll count is read."""
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.process import polls_counted

REPO = Path(__file__).resolve().parents[2]


def test_the_decision_benchmarks_mix_programs_and_rolls_back_its_flooded_third():
    done = subprocess.run([sys.executable, "bench/bench_decisions.py", "--ports", "30", "--seconds", "20"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=True)
    figures = dict(line.split(None, 1) for line in done.stdout.splitlines() if line.strip())
    assert figures["decisions"] == "10 program, 10 rollback"
    assert figures["port-samples"].startswith("600 ")
    assert float(figures["cost"].split()[0]) > 0


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
