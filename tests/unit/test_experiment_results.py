"""A trial's run reduced to its results (topo/studies/experiment/reducing.py), from what the runner records:
a flow whose test did not start, or died, is a result (what it delivered, 0 where it never ran, and why,
from the step it stopped in), every step has the flows' aggregate, each link event when it was done; and
the summary that holds it is what docs/schema/experiment-summary.json says."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from controller.adapters.tc import ClassCounters
from controller.core.policy import for_any_network, load_document, parse_policy
from topo.harness.fidelity import Monitor, Sample
from topo.net import experimentfile, trafficfile
from topo.net.traffic import Flow, LinkState, Pause, Ran
from topo.studies.experiment import reducing

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000.0
LOST = "its connect datagram was lost 3 times (its path's queue full): it never started"
TRAFFIC = """
step_seconds: 10
flows:
  - {name: bulk, from: h1, to: h4, protocol: tcp}
  - {name: flood, from: h2, to: h4, protocol: udp, steps: [0, 4, 4]}
  - {name: late, from: h3, to: h4, protocol: tcp, start_step: 1}
  - {name: brief, from: h2, to: h1, protocol: tcp, duration: 5}
events: [{at_step: 1, link: [s1, s2], state: down}, {at_step: 2, link: [s1, s2], state: up}]
"""


def intervals(mbps_of, start: float, end: float) -> list[dict]:
    """Receiver intervals of 0.1 s from start to end (test time), at mbps_of(t)."""
    n = round((end - start) / 0.1)
    return [{"sum": {"start": start + k * 0.1, "end": start + (k + 1) * 0.1, "bits_per_second": mbps_of(start + k * 0.1) * 1e6},
             "streams": []} for k in range(n)]


def tcp_doc(mbps_of, seconds: float) -> dict:
    """An iperf3 client's JSON (with --get-server-output), as much of it as the reduction reads."""
    stream = {"snd_cwnd": 30_000, "rttvar": 1000, "omitted": False}
    return {"start": {"tcp_mss_default": 1448},
            "intervals": [{"sum": {"start": k * 0.5, "end": (k + 1) * 0.5, "bits_per_second": 1e6, "retransmits": 0},
                           "streams": [stream]} for k in range(int(seconds * 2))],
            "end": {"streams": [{"sender": {"mean_rtt": 20_000, "min_rtt": 1000, "max_rtt": 40_000,
                                            "max_snd_cwnd": 60_000}}],
                    "sum_sent": {"retransmits": 3, "bytes": 1_000_000}, "sender_tcp_congestion": "cubic"},
            "server_output_json": {"intervals": intervals(mbps_of, 0, seconds),
                                   "end": {"sum_received": {"bits_per_second": 3e6}}}}


def ran(item, started: float, ended: float, doc=None, error=None) -> Ran:
    return Ran(item, T0 + started, T0 + ended, doc, error=error, launched=T0 + started)


def test_a_failed_flow_is_a_result_and_the_trial_validates_against_the_schema():
    spec = trafficfile.parse(yaml.safe_load(TRAFFIC), "t.yaml")
    trial = experimentfile.TrialSpec("reserve", "reserve", {}, spec)
    # bulk ran 30 s at 4 Mbit/s but for the link's down step (0 there); flood's step 1 test never started, its
    # step 2 test delivered 4 Mbit/s; late died 4 s into its second step.
    bulk = ran(Flow("bulk", "h1", "h4", 30), 0, 30, tcp_doc(lambda t: 0.0 if 10 <= t < 20 else 4.0, 30))
    flood_1 = ran(Flow("flood_1", "h2", "h4", 10, udp_mbps=4), 10, 13, None, LOST)
    flood_2 = ran(Flow("flood_2", "h2", "h4", 10, udp_mbps=4), 20, 30,
                  {"server_output_json": {"intervals": intervals(lambda t: 4.0, 0, 10)},
                   "end": {"sum": {"lost_percent": 0.5}}})
    late_doc = {"server_output_json": {"intervals": intervals(lambda t: 2.0, 0, 14)}, "intervals": []}
    late = ran(Flow("late", "h3", "h4", 20), 10, 24, late_doc, "iperf3 failed (late.json): control socket has closed "
                                                               "unexpectedly")
    brief = ran(Flow("brief", "h2", "h1", 5), 0, 5, tcp_doc(lambda t: 1.0, 5))
    events = [ran(Pause(10), 0, 10), ran(LinkState("s1", "s2", False), 10.02, 10.02),
              ran(Pause(10), 10.02, 20), ran(LinkState("s1", "s2", True), 20.01, 20.01)]
    monitor = Monitor("s1-eth1")
    monitor.samples = [Sample(T0 + k * 0.25, {"1:1": ClassCounters(k * 125_000, k * 100, 0)}, None, None)
                       for k in range(121)]
    watched = reducing.Watched([reducing.QueuedPort("0000000000000001", 1, "s1-eth1", 5_000_000)],
                               {"s1-eth1": monitor})
    policy = parse_policy(for_any_network(load_document(ROOT / "policies" / "reserve.yaml")))
    result = reducing.result(trial, [bulk, flood_1, flood_2, late, brief, *events], watched, {"decisions": []}, policy,
                             None, 0.0, 25, None)
    step0, step1, step2 = result["steps"]
    assert step0["flows"]["bulk"]["mbps"] == 4.0 and step1["flows"]["bulk"]["mbps"] == 0.0
    assert step1["flows"]["flood"] == {"mbps": 0.0, "failed": LOST, "offered_mbps": 4, "lost_percent": None}
    assert step2["flows"]["flood"]["mbps"] == 4.0 and "failed" not in step2["flows"]["flood"]
    assert step0["flows"]["late"] == {"mbps": None}                        # not planned then
    assert step1["flows"]["late"]["mbps"] == 2.0 and "failed" not in step1["flows"]["late"]
    # late delivered 2 Mbit/s for 4 s of step 2's 9-s window, then nothing: 0.89, with its reason
    assert step2["flows"]["late"]["mbps"] == round(2.0 * 3 / 9, 3) and "control socket" in step2["flows"]["late"]["failed"]
    assert [s["aggregate_mbps"] for s in result["steps"]] == [5.0, 2.0, round(4.0 + 4.0 + 2 / 3, 3)]
    assert result["events"] == [{"at_step": 1, "link": ["s1", "s2"], "state": "down", "at_s": 10.02},
                                {"at_step": 2, "link": ["s1", "s2"], "state": "up", "at_s": 20.01}]
    assert set(result["tcp"]) == {"bulk", "brief"}                           # a failed test has no sender numbers
    # The verdict stops at the first link event, and judges the TCP flows that run through it: bulk, not brief
    # (silent after its end at 5 s), whose receiver would otherwise have "reported nothing" for 5 s.
    verdict = result["fidelity"]["fidelity"]
    assert verdict["receiver_gap_seconds"] < 0.5 and verdict["samples"] == 37, verdict
    assert result["steps"][0]["ports"]["0000000000000001:1"]["utilisation"] == 0.8
    summary = {"scenario": {"topo": "f.py:x", "topo_params": {}, "step_seconds": 10, "steps": 3, "seconds": 30,
                            "settle_seconds": 1.0, "links": []}, "environment": {}, "complete": True,
               "trials": {"reserve": result}}
    jsonschema.validate(json.loads(json.dumps(summary)),
                        json.loads((ROOT / "docs" / "schema" / "experiment-summary.json").read_text()))
