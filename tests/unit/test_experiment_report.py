"""Your experiment's table and figures (topo/studies/experiment.py) from a summary: every bottleneck, that is
every queued port that carried traffic, gets its column of class rates and drops, and a panel of its own."""
from topo.studies.experiment import BOTTLENECK_FIGURE, figure, loaded_ports, table


def port(utilisation, **classes):
    return {"utilisation": utilisation, "cpu_pressure": 0.01,
            "classes": {name: {"mbps": mbps, "drops": drops} for name, (mbps, drops) in classes.items()}}


def step(k, ports, mbps):
    return {"step": k, "window_s": [k * 10 + 1, k * 10 + 10], "flows": {"bulk": {"mbps": mbps}}, "ports": ports,
            "jain_tcp": None, "starved": False}


FLOWS = [{"name": "bulk"}]
SUMMARY = {
    "scenario": {"topo": "t.py:line", "steps": 2, "step_seconds": 10},
    "trials": {
        "none": {"flows": FLOWS, "steps": [step(0, {}, 3.7), step(1, {}, 0.1)], "decisions": []},
        "auto": {"flows": FLOWS,
                 "steps": [step(0, {"0000000000000002:2": port(0.93, default=(3.7, 0)),
                                    "0000000000000003:1": port(0.01, default=(0.04, 0))}, 3.7),
                           step(1, {"0000000000000002:2": port(0.95, tcp=(3.3, 0), udp=(0.4, 1200), voice=(0.0, 0)),
                                    "0000000000000003:1": port(0.01, default=(0.04, 0))}, 3.3)],
                 "decisions": []}},
}


def test_only_the_ports_that_carried_traffic_are_bottlenecks():
    assert loaded_ports(SUMMARY) == ["0000000000000002:2"]


def test_the_table_gives_each_bottleneck_its_use_and_each_class_its_rate_and_drops():
    text = table(SUMMARY)
    assert "| step | port | none | auto |" in text
    assert "| 1 | 0000000000000002:2 | – | 95%: tcp 3.30 (0), udp 0.40 (1200) |" in text   # voice carried nothing
    assert "0000000000000003:1" not in text


def test_each_bottleneck_gets_a_panel_beside_the_flows_figure(tmp_path):
    figure(SUMMARY, tmp_path / "throughput.png")
    assert (tmp_path / BOTTLENECK_FIGURE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    idle = {**SUMMARY, "trials": {"none": SUMMARY["trials"]["none"]}}
    (tmp_path / "idle").mkdir()
    figure(idle, tmp_path / "idle" / "throughput.png")
    assert not (tmp_path / "idle" / BOTTLENECK_FIGURE).exists()               # nothing queued: no such figure


def test_a_flow_past_the_steps_gets_an_after_row_and_the_idle_path_its_rtt():
    rtt = {"probe_rtt_ms": {"median": 0.4, "p95": 0.6}, "probe_loss_percent": 0}
    probed = {"probe": {"probe_rtt_ms": {"median": 9.0, "p95": 12.0}, "probe_loss_percent": 1.5}}
    res = {"flows": FLOWS, "steps": [{**step(0, {}, 3.7), **probed}, {**step(1, {}, 3.1), **probed}, {**step(2, {}, 4.6), **probed}],
           "decisions": [], "probe_unloaded": rtt}
    text = table({**SUMMARY, "trials": {"auto": res}})
    assert "| after | 4.60 |" in text and "(after: from the last step to the last flow's end)" in text
    assert "| alone | 0.4 / 0.6, 0 % |" in text and "| after | 9.0 / 12.0, 1.5 % |" in text
    assert "after" not in table(SUMMARY)     # no flow ran past the steps


def test_trials_of_different_flows_get_their_own_columns_and_an_unfaithful_one_its_note():
    stalled = {"port": "0000000000000002:2", "faithful": False, "fidelity": {},
               "fidelity_notes": ["TCP stalled for 1.50 s while its queue dropped nothing"]}
    fine = {**stalled, "faithful": True, "fidelity_notes": []}
    pair = [{"name": "h1-h4_cubic"}, {"name": "h2-h3_reno"}]
    two = {"flows": pair, "steps": [{**step(0, {}, 0), "flows": {"h1-h4_cubic": {"mbps": 2.1},
                                                                 "h2-h3_reno": {"mbps": 2.6}}}],
           "decisions": [], "fidelity": stalled}
    one = {"flows": FLOWS, "steps": [step(0, {}, 4.7)], "decisions": [], "fidelity": fine}
    text = table({"scenario": {"topo": "t.py:line", "steps": 1, "step_seconds": 10},
                  "trials": {"cubic-vs-reno": two, "alone": one}})
    assert "| step | cubic-vs-reno: h1-h4_cubic | cubic-vs-reno: h2-h3_reno | alone: bulk |" in text
    assert "| 0 | 2.10 | 2.60 | 4.70 |" in text
    assert "- cubic-vs-reno: TCP stalled for 1.50 s" in text and "- alone" not in text
    assert "not faithful" not in table({"scenario": {"topo": "t.py:line", "steps": 1, "step_seconds": 10},
                                        "trials": {"alone": one}})
