"""topo/studies/main/scenario.py: the study's parameters, their overrides and errors that name the field."""
import re

import pytest

from tests.unit.test_policy import not_a_file, unblocked
from topo.studies import STUDIES
from topo.studies.base import UsageError, check_out, parser_for
from topo.studies.main.scenario import Scenario, ScenarioError, load_scenario, parse_scenario


def test_defaults_are_the_studys():
    scenario = parse_scenario({})
    assert scenario == Scenario()
    assert scenario.bottleneck_bps == 5_000_000
    assert scenario.udp_steps_mbps == (0, 2, 4, 6, 8, 10, 12)
    assert scenario.step_seconds == 10.0
    assert scenario.settle_seconds == 1.0
    assert scenario.delay == "5ms"
    assert scenario.queue_packets == 25
    assert scenario.tcp_congestion_control is None


def test_tcp_runs_through_every_step_and_the_cooldown():
    assert Scenario().tcp_seconds == 7 * 10.0 + 8.0
    assert parse_scenario({"udp_steps_mbps": [0, 5], "step_seconds": 4, "cooldown_seconds": 2}).tcp_seconds == 10.0


def test_quick_holds_each_step_3_seconds_and_keeps_the_rest():
    base = parse_scenario({"bottleneck": "10Mbit", "udp_steps_mbps": [0, 3, 9]})
    quick = base.quick()
    assert quick.step_seconds == 3.0
    assert quick.cooldown_seconds == 6.0
    assert (quick.bottleneck_bps, quick.udp_steps_mbps, quick.settle_seconds) == (10_000_000, (0.0, 3.0, 9.0), 1.0)
    assert quick.tcp_seconds == 15.0
    assert base.step_seconds == 10.0       # quick() is a copy


def test_quick_never_makes_a_scenario_that_measures_nothing():
    # A settle that still fits the quick step is kept; one that does not is refused by name, not run.
    assert parse_scenario({"settle_seconds": 2.5}).quick().settle_seconds == 2.5
    with pytest.raises(ScenarioError, match="^settle_seconds: must be shorter than step_seconds"):
        parse_scenario({"settle_seconds": 4}).quick()


def test_overrides():
    scenario = parse_scenario({"bottleneck": "2.5Mbit", "delay": "none", "udp_steps_mbps": [1, 2.5],
                               "step_seconds": 5, "settle_seconds": 0.5, "cooldown_seconds": 0,
                               "tcp_congestion_control": "bbr", "queue_packets": 100})
    assert scenario == Scenario(bottleneck_bps=2_500_000, delay=None, udp_steps_mbps=(1.0, 2.5), step_seconds=5.0,
                                settle_seconds=0.5, cooldown_seconds=0.0, tcp_congestion_control="bbr",
                                queue_packets=100)


def test_load_scenario_lets_command_line_overrides_win_over_the_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("bottleneck: 10Mbit\nstep_seconds: 6\ndelay: 20ms\n")
    scenario = load_scenario(path, {"bottleneck": "1Mbit", "delay": None})
    assert scenario.bottleneck_bps == 1_000_000       # override
    assert scenario.step_seconds == 6.0                # file
    assert scenario.delay == "20ms"                    # None: not given on the command line


def test_load_scenario_without_a_file_uses_the_overrides():
    assert load_scenario(None, {"udp_steps_mbps": [0, 1]}).udp_steps_mbps == (0.0, 1.0)


def test_load_scenario_names_a_missing_file(tmp_path):
    path = tmp_path / "missing.yaml"
    with pytest.raises(ScenarioError, match="^" + re.escape(f"{path}: cannot read scenario")):
        load_scenario(path, {})


def test_load_scenario_refuses_a_file_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ScenarioError, match="a scenario is a mapping"):
        load_scenario(path, {})


@pytest.mark.parametrize("doc, field", [
    ({"bottleneck_mbps": 5}, "bottleneck_mbps"),
    ({"bottleneck_bps": 5_000_000}, "bottleneck_bps"),    # the file says bottleneck, with a unit
    ({"bottleneck": "fast"}, "bottleneck"),
    ({"bottleneck": 0}, "bottleneck"),
    ({"step_seconds": -1}, "step_seconds"),
    ({"step_seconds": "10"}, "step_seconds"),
    ({"cooldown_seconds": True}, "cooldown_seconds"),
    ({"step_seconds": 2, "settle_seconds": 2}, "settle_seconds"),
    ({"settle_seconds": 12}, "settle_seconds"),
    ({"udp_steps_mbps": 4}, "udp_steps_mbps"),
    ({"udp_steps_mbps": []}, "udp_steps_mbps"),
    ({"udp_steps_mbps": [0, -2]}, "udp_steps_mbps"),
    ({"queue_packets": 0}, "queue_packets"),
    ({"idle_ports": -1}, "idle_ports"),
    ({"idle_ports": 20_000}, "idle_ports"),
], ids=["unknown-key", "bps-key", "bottleneck-fast", "bottleneck-zero", "negative-step", "step-as-text",
        "cooldown-bool", "settle-equals-step", "settle-above-step", "steps-not-a-list", "steps-empty",
        "negative-udp-step", "queue-zero", "idle-negative", "idle-too-many"])
def test_errors_name_the_field(doc, field):
    with pytest.raises(ScenarioError) as err:
        parse_scenario(doc)
    message = str(err.value)
    assert message.startswith(field + ": "), message
    assert "\n" not in message


def test_an_unknown_key_lists_the_known_ones():
    with pytest.raises(ScenarioError) as err:
        parse_scenario({"steps": [1]})
    assert "udp_steps_mbps" in str(err.value) and "bottleneck," in str(err.value)


def test_idle_ports_become_auto_ports_beside_the_studys_own():
    from controller.core.policy import load_document, parse_policy
    from topo.net.bridges import IdleBridge
    from topo.studies.main import with_idle_ports
    study = load_document("policies/auto.yaml")
    assert with_idle_ports(study, []) is study
    doc = with_idle_ports(study, [IdleBridge("idle0", 0x1000, (1, 2)), IdleBridge("idle1", 0x1001, (1,))])
    policy = parse_policy(doc)
    idle = [sw for sw in policy.switches if sw.dp_id >= 0x1000]
    assert [(sw.dp_id, [(p.port_no, p.queues, p.capacity_bps) for p in sw.ports]) for sw in idle] == \
        [(0x1000, [(1, "auto", 100_000_000), (2, "auto", 100_000_000)]), (0x1001, [(1, "auto", 100_000_000)])]
    assert parse_policy(study).switches == tuple(sw for sw in policy.switches if sw.dp_id < 0x1000)


def test_udp_alone_runs_after_tcp_in_a_lane_of_its_own():
    from topo.net.trafficfile import lanes
    from topo.studies.main import study_traffic
    from topo.studies.main.scenario import LONE_UDP, TCP_GONE_SECONDS
    scenario = parse_scenario({"udp_steps_mbps": [0, 4], "step_seconds": 5, "cooldown_seconds": 2})
    assert scenario.lone_udp == 4.0                              # 80 % of the 5 Mbit/s bottleneck
    tcp_lane, steps, (wait, alone) = lanes(study_traffic(scenario, probe=False))
    assert tcp_lane[0].seconds == 5 + 5 + 2 + 2                 # the steps, the cooldown, a slack second per step
    assert wait.seconds == tcp_lane[0].seconds + TCP_GONE_SECONDS
    assert (alone.name, alone.udp_mbps, alone.seconds) == (f"{LONE_UDP}_2", 4.0, 5)
    assert len(lanes(study_traffic(parse_scenario({"lone_udp_mbps": 0}), probe=False))) == 2


def test_a_trial_is_planned_as_long_as_it_runs_so_the_progress_bar_never_steps_back():
    import io

    from topo.harness.progress import ProgressBar
    from topo.net.traffic import planned_seconds
    from topo.net.trafficfile import UNLOADED_SECONDS, lanes
    from topo.studies.main import study_traffic
    from topo.studies.main.scenario import TCP_GONE_SECONDS
    scenario = parse_scenario({"udp_steps_mbps": [0, 4], "step_seconds": 5, "cooldown_seconds": 2})
    tcp_lane, *_ = lanes(study_traffic(scenario, probe=True))
    # UDP alone waits out TCP (its 12 s and a slack second per step), then runs its 5 s
    assert planned_seconds(lanes(study_traffic(scenario, probe=True))) == \
        tcp_lane[0].seconds + TCP_GONE_SECONDS + 5 == 21
    assert UNLOADED_SECONDS > 0
    out = io.StringIO()
    bar = ProgressBar(total=20, stream=out)
    bar.start_part("none", 0)
    bar.tick("UDP 4 Mbit/s alone", 12)         # the first part ran past its planned 10 s
    bar.start_part("reserve", 10)
    bar.tick("UDP 0 Mbit/s", 0.5)
    assert [line.split("]")[1].split()[0] for line in out.getvalue().splitlines()] == ["60%", "60%"]


def test_the_launcher_holds_a_policed_class_to_its_min_share_of_the_bottleneck_or_the_given_rate():
    from controller.core.policy import Police, parse_policy
    from topo.studies.base import policy_document
    doc = policy_document("police", 10_000_000, 25)
    assert parse_policy(doc).traffic_class("udp").police == Police(1000, 100)   # 10 % of 10 Mbit/s
    doc = policy_document("police", 10_000_000, 25, police_bps=2_000_000)
    assert parse_policy(doc).traffic_class("udp").police == Police(2000, 200)


def test_the_launcher_does_not_load_eventlet_which_warns_on_its_stderr():
    import subprocess
    import sys
    code = ("import sys; import topo.studies, topo.studies.main, topo.harness.launch, topo.harness.dashboard_report; "
            "print(sorted(m for m in ('eventlet', 'ovs', 'os_ken') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=".")
    assert (done.stdout, done.stderr) == ("[]\n", "")


@pytest.mark.parametrize("kind, words", [("fifo", "not a regular file"), ("directory", "not a regular file"),
                                         ("too large", "more than the 1048576 bytes")])
def test_a_scenario_file_that_is_not_a_regular_file_within_1_mib_is_refused_in_one_line(tmp_path, kind, words):
    path = not_a_file(tmp_path, kind)
    err = unblocked(lambda: load_scenario(path, {}))
    assert isinstance(err, ScenarioError)
    assert str(err).startswith(f"{path}: {words}") and "\n" not in str(err)


@pytest.mark.parametrize("argv, message", [
    (["--delay", "5parsecs"], "--delay: '5parsecs' is not a delay; write e.g. 5ms, 500us or 0.1s, or none"),
    (["--metrics-port", "0"], "--metrics-port: 0 is not a TCP port; give one from 1 to 65535"),
    (["--udp-steps", ""], "--udp-steps: '' is not a comma-separated list of numbers"),
    (["--cooldown-seconds", "2.5"], "--cooldown-seconds: 2.5 is not a whole number of seconds >= 0"),
    (["--step-seconds", "1"], "--step-seconds: 1.0 is not a whole number of seconds >= 2"),
    (["--out", "{file}/run"], "--out {file}/run: {file} is not a folder; choose a folder's path"),
    # /proc says root may write to it, but no folder can be made there: once a traceback at mkdir.
    (["--out", "/proc/x/y"], "--out /proc/x/y: no folder can be made in /proc (read-only, not yours, or not a real "
                             "folder); choose another folder"),
])
def test_a_bad_launcher_flag_is_one_line_naming_it_before_anything_starts(tmp_path, argv, message):
    file = tmp_path / "file"
    file.write_text("")
    args = parser_for(STUDIES["main"], "topo/run.py").parse_args([a.format(file=file) for a in argv])
    with pytest.raises(UsageError) as err:
        check_out(args.out)
        STUDIES["main"].plan(args)
    assert str(err.value) == message.format(file=file)


def test_the_step_and_cooldown_flags_override_quick_and_tcp_runs_through_them():
    args = parser_for(STUDIES["main"], "topo/run.py").parse_args(
        ["--quick", "--udp-steps", "0,10", "--cooldown-seconds", "0"])
    scenario = STUDIES["main"].plan(args).scenario
    assert (scenario.step_seconds, scenario.cooldown_seconds, scenario.tcp_seconds) == (3.0, 0.0, 6.0)


def test_a_scenario_file_delay_is_checked_too():
    with pytest.raises(ScenarioError, match=r"^delay: '5 ms' is not a delay"):
        parse_scenario({"delay": "5 ms"})
    assert parse_scenario({"delay": "0.5ms"}).delay == "0.5ms" and parse_scenario({"delay": "none"}).delay is None


def test_the_flags_shape_the_studys_traffic_file_which_is_checked_as_any_other():
    from topo.net.trafficfile import parse
    scenario = parse_scenario({"udp_steps_mbps": [0, 2.5], "step_seconds": 4, "cooldown_seconds": 0,
                               "tcp_congestion_control": "bbr", "tcp_flows": 2, "lone_udp_mbps": 0})
    doc = scenario.traffic(probe=False)
    assert doc["flows"][0] == {"name": "tcp", "from": "h1", "to": "h4", "protocol": "tcp", "duration": 8 + 2,
                               "cc": "bbr", "streams": 2}
    assert doc["flows"][1]["steps"] == [0, 2.5] and len(doc["flows"]) == 2 and "probe" not in doc
    tcp, udp = parse(doc).flows
    assert (tcp.cc, tcp.streams, tcp.end, udp.mbps, udp.end) == ("bbr", 2, 10, (0.0, 2.5), 8)
