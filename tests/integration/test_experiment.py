"""A user's own network and traffic, as a user runs them: a Mininet custom file and a traffic file
written in a temporary folder (not shipped), `topo/run.py --topo FILE:NAME --traffic FILE` under
`auto`, on real Mininet hosts, OVS and the real controller. The controller learns the hosts (no flow
table, no dp_id, no port written by anyone), and answers a call losing behind an upload at the one
bottleneck the topology declared, then holds through a flood; what the user sees: goodput per flow, the
call's round trips, bytes in the HTB classes, the decision in the results."""
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jsonschema
import pytest

from tests.integration.conftest import NOTHING_LEFT, leftovers, requires_ovs

REPO = Path(__file__).resolve().parents[2]
pytestmark = requires_ovs

TOPO = """
from mininet.topo import Topo

class Vee(Topo):
    "Two senders on a and b, a receiver behind c; only the c link is slow."
    def build(self, bw=4):
        a, b, c = self.addSwitch("a1"), self.addSwitch("b2"), self.addSwitch("c3")
        self.addLink(a, b)                      # fast: no bw, so not queued
        self.addLink(b, c, bw=bw, delay="5ms")  # delayed where the kernel has netem
        self.addLink(self.addHost("web"), a)
        self.addLink(self.addHost("cam"), b)
        self.addLink(self.addHost("sink"), c)

topos = {"vee": Vee}
"""
TRAFFIC = """
step_seconds: 6
flows:
  - {name: upload, from: web, to: sink, protocol: tcp, streams: 8, duration: 16}
  - {name: video, from: cam, to: sink, protocol: udp, steps: [0, 12]}
probe: {from: cam, to: sink}
"""


@pytest.mark.timeout(300)
def test_a_users_topology_and_traffic_run_under_auto_which_answers_the_flood_where_it_queues(tmp_path):
    (tmp_path / "mine.py").write_text(textwrap.dedent(TOPO))
    (tmp_path / "traffic.yaml").write_text(TRAFFIC)
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, "topo/run.py", "--topo", f"{tmp_path / 'mine.py'}:vee", "--topo-param",
                           "bw=4", "--traffic", str(tmp_path / "traffic.yaml"), "--policy", "auto", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    jsonschema.validate(summary, json.loads((REPO / "docs" / "schema" / "experiment-summary.json").read_text()))
    env = summary["environment"]
    delayed = env["netem"] and "system" in env["datapath_types"]
    assert summary["scenario"]["links"] == [{"ends": ["b2:2", "c3:1"], "bps": 4_000_000,
                                             "delay": "5ms" if delayed else None}]
    assert delayed or "link delay not applied (this kernel lacks netem): b2-c3 5ms" in done.stdout + done.stderr
    auto = summary["trials"]["auto"]
    calm, flood, after = auto["steps"]
    # Alone, TCP fills the 4 Mbit/s link; against 12 Mbit/s of UDP it keeps most of its 80 % (3.2 Mbit/s);
    # past the steps (its duration carries it 4 s on) it is alone again.
    assert calm["flows"]["upload"]["mbps"] > 3.0 and after["flows"]["upload"]["mbps"] > 3.0, after
    assert after["window_s"] == [13, 16] and after["flows"]["video"]["mbps"] is None
    assert flood["flows"]["upload"]["mbps"] > 0.8 * 3.2, flood
    assert flood["flows"]["video"]["lost_percent"] > 50
    # The bytes went where the policy put them: TCP in its class on the slow port, UDP held in its own.
    port = flood["ports"]["0000000000000002:2"]["classes"]
    assert port["tcp"]["mbps"] > 2.5 and port["udp"]["mbps"] < 1.5 and port["udp"]["drops"] > 0
    # Auto answered at b2's port 2 (the declared link) before the flood: the call (cam -> sink) lost packets
    # behind the eight-stream upload there, and it held its reservation through the flood, which then
    # delayed the call by nothing; the fast link was never queued.
    (decision,) = [d for d in summary["trials"]["auto"]["decisions"] if d["action"] == "program"]
    assert (decision["dp_id"], decision["port"], decision["action"]) == ("0000000000000002", 2, "program")
    assert decision["at_s"] < 6 and "class voice shares a port that lost" in decision["reason"], decision
    assert "0000000000000001:1" not in flood["ports"]
    assert flood["probe"]["probe_rtt_ms"]["median"] < 5 and flood["probe"]["probe_loss_percent"] == 0
    assert summary["trials"]["auto"]["probe_unloaded"]["probe_rtt_ms"]["median"] < 5   # alone, before the flows
    assert "upload" in (out / "table.md").read_text() and (out / "throughput.png").stat().st_size > 0
    # The TCP flow's sender over the run, and the fidelity monitor's verdict at the busiest port.
    assert auto["tcp"]["upload"]["rtt_mean_ms"] > 0 and auto["tcp"]["upload"]["packets_sent"] > 1000
    assert auto["fidelity"]["port"] == "0000000000000002:2" and auto["fidelity"]["fidelity"]["samples"] > 20
    # The one bottleneck has its column of class rates and its panel; the fast link's ports have neither.
    assert "| 1 | 0000000000000002:2 | " in (out / "table.md").read_text()
    assert "| after | 0000000000000002:2 | " in (out / "table.md").read_text()
    assert "0000000000000003:1" not in (out / "table.md").read_text()
    assert (out / "bottlenecks.png").stat().st_size > 0
    # Prometheus recorded the controller throughout, for both ends of the slow link: b2's sending rate near
    # the link's 4 Mbit/s (TCP filled it, then the flood), c3's back towards b2 only TCP's acknowledgements.
    queries = summary["prometheus"]["queries"]
    assert set(queries) == {"auto 0000000000000002:2", "auto 0000000000000003:1"}
    sending, acks = queries["auto 0000000000000002:2"], queries["auto 0000000000000003:1"]
    # 10 of 13: the port's counters begin with the network; 7 when Prometheus began scraping 5 s after it started
    assert '"0000000000000002",port="2"' in sending["expr"] and sending["points"] >= 9, sending
    assert 2.5 < sending["mean_mbps"] < 4.5 and acks["mean_mbps"] < 0.5, queries
    # ... and its dashboards are drawn from that data without Grafana.
    drawn = subprocess.run([sys.executable, "topo/run.py", "report", str(out)], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    assert (out / "report.html").stat().st_size > 0 and any((out / "report").glob("*.png"))
    assert leftovers() == NOTHING_LEFT


@pytest.mark.timeout(200)
def test_ctrl_c_during_the_second_trial_of_an_experiment_file_keeps_the_first_and_leaves_nothing_behind(tmp_path):
    (tmp_path / "mine.py").write_text(textwrap.dedent(TOPO))
    # One step of one flow: the first trial done quickly, the second's traffic long enough to be caught flowing.
    (tmp_path / "traffic.yaml").write_text("step_seconds: 6\nflows: [{name: upload, from: web, to: sink}]\n")
    (tmp_path / "experiment.yaml").write_text("topo: mine.py:vee\npolicy: [none, auto]\ntraffic: traffic.yaml\n")
    out = tmp_path / "results"
    assert leftovers() == NOTHING_LEFT
    proc = subprocess.Popen([sys.executable, "topo/run.py", "--experiment", str(tmp_path / "experiment.yaml"),
                             "--prometheus", "none", "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 150
    # auto's traffic flowing, through the queues of its network
    while not ((out / "raw" / "auto").exists() and leftovers()["iperf3"] and leftovers()["qos"]):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "no traffic under auto within 150 s"
        time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "summary.json keeps the 1 finished" in err
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["complete"], summary["interrupted"], list(summary["trials"])) == (False, True, ["none"])
    assert summary["trials"]["none"]["policy"] == "none" and summary["trials"]["none"]["steps"]
    assert leftovers() == NOTHING_LEFT


def test_a_trial_this_kernel_cannot_run_is_refused_in_one_line_before_any_network_starts(tmp_path):
    """Where the kernel lacks a trial's queue discipline (here, sfq: docs/other-studies.md), the run says which
    and why, and leaves nothing: no bridge, no process, not even its results folder."""
    from topo.harness.capabilities import qdisc_available
    discipline = next((d for d in ("sfq", "codel", "fq_codel", "red") if not qdisc_available(d)), None)
    if discipline is None:
        pytest.skip("this kernel has every discipline the controller offers")
    (tmp_path / "mine.py").write_text(textwrap.dedent(TOPO))
    (tmp_path / "e.yaml").write_text(f"topo: mine.py:vee\ntraffic: {{flows: [{{name: a, from: web, to: sink}}]}}\n"
                                     f"trials: [{{name: fifo}}, {{name: aqm, ports: {{discipline: {discipline}}}}}]\n")
    out = tmp_path / "results"
    assert leftovers() == NOTHING_LEFT
    done = subprocess.run([sys.executable, "topo/run.py", "--experiment", str(tmp_path / "e.yaml"), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith(f"error: trial aqm: ports.discipline {discipline}: ") and \
        done.stderr.count("\n") == 1, done.stderr
    assert not out.exists() and leftovers() == NOTHING_LEFT


LINE = """
from mininet.topo import Topo

class Line(Topo):
    "h1, h2 on s1; h3 on s2; s1-s2 at 5 Mbit/s, each host's link at 10"
    def build(self):
        s1, s2 = self.addSwitch("s1"), self.addSwitch("s2")
        self.addLink(s1, s2, bw=5)
        for name, switch in (("h1", s1), ("h2", s1), ("h3", s2)):
            self.addLink(self.addHost(name), switch, bw=10)

topos = {"line": Line}
"""
# s1-s2 down for step 1: bulk's goodput falls to 0 there and is back by step 3 (TCP tries again, backing off);
# stranded starts while the link is down: its test never begins (nothing answers its connection), and it is
# given up when its time is over. On the non-blocking switch nothing is cut (it has no s1-s2), and only the
# hosts' own links limit them.
CUT = """
step_seconds: 3
steps: 4
flows:
  - {name: bulk, from: h1, to: h3, protocol: tcp}
  - {name: stranded, from: h2, to: h3, protocol: udp, rate: 1Mbit, start_step: 1, duration: 3}
events: [{at_step: 1, link: [s1, s2], state: down}, {at_step: 2, link: [s1, s2], state: up}]
"""
EXPERIMENT = """
topo: line.py:line
traffic: cut.yaml
trials: [{name: none}, {name: ideal, nonblocking: true}, {name: reserve, policy: reserve}]
"""


@pytest.mark.timeout(240)
def test_a_link_cut_a_flow_that_cannot_start_and_the_nonblocking_optimum_are_results_and_a_later_failure_keeps_them(
        tmp_path):
    from tests.integration.conftest import controller_config, start_controller, stop_controller
    (tmp_path / "line.py").write_text(textwrap.dedent(LINE))
    (tmp_path / "cut.yaml").write_text(CUT)
    (tmp_path / "e.yaml").write_text(EXPERIMENT)
    out = tmp_path / "results"
    assert leftovers() == NOTHING_LEFT
    # The run uses the controller it finds; once two trials are done, that controller dies.
    controller = start_controller(controller_config(tmp_path / "qos.conf"), tmp_path / "controller.log")
    try:
        run = subprocess.Popen([sys.executable, "topo/run.py", "--experiment", str(tmp_path / "e.yaml"),
                                "--prometheus", "none", "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 180
        while not ((out / "summary.json").exists() and
                   len(json.loads((out / "summary.json").read_text())["trials"]) == 2):
            assert run.poll() is None, run.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "two trials did not finish within 180 s"
            time.sleep(0.2)
        controller.kill()
        _, err = run.communicate(timeout=60)
    finally:
        stop_controller(controller)
    last = err.splitlines()[-1]          # after the progress bar's lines
    assert run.returncode == 1 and last.startswith("error: controller REST API") and \
        last.endswith(f"; the 2 finished trial(s) have their results in {out}"), err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    jsonschema.validate(summary, json.loads((REPO / "docs" / "schema" / "experiment-summary.json").read_text()))
    assert (summary["complete"], list(summary["trials"])) == (False, ["none", "ideal"]) and summary["error"]
    none, ideal = summary["trials"]["none"], summary["trials"]["ideal"]
    bulk = [s["flows"]["bulk"]["mbps"] for s in none["steps"]]
    assert bulk[0] > 4.0 and bulk[1] < 0.05 and bulk[3] > 0.6 * bulk[0], bulk        # 5 Mbit/s, cut, back
    down, up = none["events"]
    assert (down["at_step"], down["state"], up["at_step"], up["state"]) == (1, "down", 2, "up")
    assert 2.9 < down["at_s"] < 3.5 and 5.9 < up["at_s"] < 6.5, none["events"]
    stranded = none["steps"][1]["flows"]["stranded"]
    assert stranded["mbps"] == 0 and "it did not start within its 3 s" in stranded["failed"], stranded
    assert none["steps"][0]["flows"]["stranded"] == {"mbps": None}       # not planned then
    # On one switch the hosts' 10 Mbit/s links are the only limit (shaped by the hosts' ends, and by the
    # switch's port to h3 under the policy); the cut is not there, and stranded runs. At step 1 bulk and
    # stranded share h3's link, so what the two get together is what the link gives.
    assert ideal["nonblocking"] and ideal["events"] == [] and len(ideal["steps"][0]["ports"]) == 3
    assert all(8.5 < s["aggregate_mbps"] < 10.2 for s in ideal["steps"]), ideal["steps"]
    assert ideal["steps"][1]["flows"]["stranded"]["mbps"] > 0.9
    table = (out / "table.md").read_text()
    assert "| 1 (s1-s2 down) |" in table and "| 2 (s1-s2 up) |" in table
    assert "✗" in table and "- none: stranded (step 1): it did not start" in table
    ratio = none["steps"][0]["aggregate_mbps"] / ideal["steps"][0]["aggregate_mbps"]
    assert f"| 0 | {none['steps'][0]['aggregate_mbps']:.2f} ({ratio:.2f}) | " in table and 0.4 < ratio < 0.6
    assert (out / "throughput.png").stat().st_size > 0
    assert leftovers() == NOTHING_LEFT
