"""Your experiment's table and figures (topo/studies/experiment/reporting.py) from a summary: every bottleneck, that is
every queued port that carried traffic, gets its column of class rates and drops, and a panel of its own."""
from topo.studies.experiment.reporting import BOTTLENECK_FIGURE, MAX_FLOW_COLUMNS, figure, loaded_ports, table


def port(utilisation, **classes):
    return {"utilisation": utilisation, "cpu_pressure": 0.01,
            "classes": {name: {"mbps": mbps, "drops": drops} for name, (mbps, drops) in classes.items()}}


def step(k, ports, mbps):
    return {"step": k, "window_s": [k * 10 + 1, k * 10 + 10], "flows": {"bulk": {"mbps": mbps}}, "ports": ports,
            "aggregate_mbps": mbps, "jain_tcp": None, "starved": False}


def trial(flows, steps, **more):
    return {"flows": flows, "steps": steps, "decisions": [], "events": [], "nonblocking": False, "fidelity": None, **more}


FLOWS = [{"name": "bulk"}]
SUMMARY = {
    "scenario": {"topo": "t.py:line", "steps": 2, "step_seconds": 10},
    "trials": {
        "none": trial(FLOWS, [step(0, {}, 3.7), step(1, {}, 0.1)]),
        "auto": trial(FLOWS, [step(0, {"0000000000000002:2": port(0.93, default=(3.7, 0)),
                                       "0000000000000003:1": port(0.01, default=(0.04, 0))}, 3.7),
                              step(1, {"0000000000000002:2": port(0.95, tcp=(3.3, 0), udp=(0.4, 1200), voice=(0.0, 0)),
                                       "0000000000000003:1": port(0.01, default=(0.04, 0))}, 3.3)])},
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
    res = trial(FLOWS, [{**step(0, {}, 3.7), **probed}, {**step(1, {}, 3.1), **probed}, {**step(2, {}, 4.6), **probed}],
                probe_unloaded=rtt)
    text = table({**SUMMARY, "trials": {"auto": res}})
    assert "| after | 4.60 |" in text and "(after: from the last step to the last flow's end)" in text
    assert "| alone | 0.4 / 0.6, 0 % |" in text and "| after | 9.0 / 12.0, 1.5 % |" in text
    assert "after" not in table(SUMMARY)     # no flow ran past the steps


def test_trials_of_different_flows_get_their_own_columns_and_an_unfaithful_one_its_note():
    stalled = {"port": "0000000000000002:2", "faithful": False, "fidelity": {},
               "fidelity_notes": ["TCP stalled for 1.50 s while its queue dropped nothing"]}
    fine = {**stalled, "faithful": True, "fidelity_notes": []}
    pair = [{"name": "h1-h4_cubic"}, {"name": "h2-h3_reno"}]
    two = trial(pair, [{**step(0, {}, 0), "flows": {"h1-h4_cubic": {"mbps": 2.1}, "h2-h3_reno": {"mbps": 2.6}}}],
                fidelity=stalled)
    one = trial(FLOWS, [step(0, {}, 4.7)], fidelity=fine)
    text = table({"scenario": {"topo": "t.py:line", "steps": 1, "step_seconds": 10},
                  "trials": {"cubic-vs-reno": two, "alone": one}})
    assert "| step | cubic-vs-reno: h1-h4_cubic | cubic-vs-reno: h2-h3_reno | alone: bulk |" in text
    assert "| 0 | 2.10 | 2.60 | 4.70 |" in text
    assert "- cubic-vs-reno: TCP stalled for 1.50 s" in text and "- alone" not in text
    assert "not faithful" not in table({"scenario": {"topo": "t.py:line", "steps": 1, "step_seconds": 10},
                                        "trials": {"alone": one}})


def test_a_failed_flow_is_marked_where_it_stopped_with_its_reason_under_the_table_and_the_run_goes_on():
    why = "its connect datagram was lost 3 times (its path's queue full): it never started"
    udp = [{"name": "bulk"}, {"name": "flood"}]
    steps = [{**step(0, {}, 3.7), "flows": {"bulk": {"mbps": 3.7}, "flood": {"mbps": None}}},
             {**step(1, {}, 3.3), "flows": {"bulk": {"mbps": 3.3}, "flood": {"mbps": 0.0, "failed": why}}}]
    text = table({**SUMMARY, "trials": {"reserve": trial(udp, steps)}})
    assert "| 1 | 3.30 | 0.00 ✗ |" in text and "| 0 | 3.70 | – |" in text
    assert f"- reserve: flood (step 1): {why}" in text
    assert "✗" not in table(SUMMARY)


def test_a_link_event_marks_its_step_in_the_table_and_the_figure(tmp_path):
    cut = [{"at_step": 1, "link": ["s1", "s2"], "state": "down", "at_s": 10.02}]
    summary = {**SUMMARY, "trials": {**SUMMARY["trials"], "none": {**SUMMARY["trials"]["none"], "events": cut}}}
    text = table(summary)
    assert "| 1 (s1-s2 down) | 0.10 | 3.30 |" in text and "| 0 | 3.70 | 3.70 |" in text
    figure(summary, tmp_path / "throughput.png")
    assert (tmp_path / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_trial_is_held_to_the_nonblocking_one_and_too_many_flows_leave_only_the_aggregates(tmp_path):
    many = [{"name": f"stride1_h{i}-h{i + 1}"} for i in range(1, 9)]

    def run(totals, nonblocking=False):
        return trial(many, [{**step(k, {}, None), "flows": {f["name"]: {"mbps": total / 8} for f in many},
                             "aggregate_mbps": total} for k, total in enumerate(totals)], nonblocking=nonblocking)
    summary = {**SUMMARY, "trials": {"none": run([4.0, 2.0]), "ecmp": run([6.0, 6.0]),
                                     "nonblocking": run([8.0, 8.0], nonblocking=True)}}
    summary["trials"]["ecmp"]["steps"][1]["starved"] = True
    assert len(many) * 3 > MAX_FLOW_COLUMNS
    text = table(summary)
    assert "Goodput per flow" not in text and "stride1_h1-h2" not in text
    assert "| step | none | ecmp | nonblocking |" in text
    assert "| 0 | 4.00 (0.50) | 6.00 (0.75) | 8.00 |" in text and "| 1 | 2.00 (0.25) | 6.00 (0.75) † | 8.00 |" in text
    assert "| mean | 3.00 (0.38) | 6.00 (0.75) | 8.00 |" in text
    figure(summary, tmp_path / "throughput.png")
    assert (tmp_path / "throughput.png").stat().st_size > 0
    # With few flows, the per-flow table stays, and the aggregates come only beside a non-blocking trial.
    assert "Aggregate goodput" not in table(SUMMARY)
    few = {**SUMMARY, "trials": {**SUMMARY["trials"], "ideal": trial(FLOWS, [step(0, {}, 4.0), step(1, {}, 4.0)],
                                                                      nonblocking=True)}}
    assert "Goodput per flow" in table(few) and "| 1 | 0.10 (0.03) | 3.30 (0.82) | 4.00 |" in table(few)


def test_a_nonblocking_trials_ports_are_its_one_switchs_and_stay_out_of_the_bottleneck_table():
    ideal = trial(FLOWS, [step(0, {"0000000000000002:2": port(0.99, default=(9.9, 0))}, 9.9),
                          step(1, {"0000000000000002:2": port(0.99, default=(9.9, 0))}, 9.9)], nonblocking=True)
    text = table({**SUMMARY, "trials": {**SUMMARY["trials"], "ideal": ideal}})
    assert "| step | port | none | auto |" in text and "| 1 | 0000000000000002:2 | – | 95%: tcp 3.30 (0), udp 0.40 (1200) |" in text
    assert loaded_ports({**SUMMARY, "trials": {"ideal": ideal}}) == []


def test_a_move_of_adaptive_paths_is_listed_with_its_host_and_ports():
    move = {"dp_id": "0000000000000011", "port": 1, "action": "move", "to_port": 2, "host": "00:00:00:00:00:05",
            "bit_rate": 4_500_000, "reason": "link 1:2 at 97%: elephants collide", "at_s": 3.21}
    moved = {**SUMMARY, "trials": {"auto": {**SUMMARY["trials"]["auto"], "decisions": [move]}}}
    assert ("- auto: switch 0000000000000011 traffic to 00:00:00:00:00:05 moved from port 1 to 2 at 3.21 s (link 1:2 "
            "at 97%: elephants collide)") in table(moved)
