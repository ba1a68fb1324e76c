"""What a user brings to `topo/run.py --topo FILE:NAME --traffic FILE`: a Mininet custom file and a
traffic file, each checked before anything starts, every refusal one line naming the file, the field
and the fix (topo/net/custom.py, topo/net/trafficfile.py); and the lanes a traffic file becomes."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from topo.net import custom, experimentfile, trafficfile
from topo.net.traffic import Flow, Pause, Probe

ROOT = Path(__file__).resolve().parents[2]
ISSUE_EXAMPLE = """
step_seconds: 10
flows:
  - {name: bulk, from: h1, to: h5, protocol: tcp, cc: cubic}
  - {name: flood, from: h3, to: h6, protocol: udp, steps: [0, 4, 8, 12]}
  - {name: cross, from: h2, to: h4, protocol: udp, rate: 12Mbit, start_step: 2}
probe: {from: h2, to: h6}
"""


def parsed(text: str):
    import yaml
    return trafficfile.parse(yaml.safe_load(text), "t.yaml")


def test_the_example_runs_as_written_a_flow_without_steps_for_the_whole_experiment():
    t = parsed(ISSUE_EXAMPLE)
    assert (t.step_seconds, t.steps, t.seconds, t.probe) == (10, 4, 40, ("h2", "h6"))
    bulk, flood, cross = t.flows
    assert (bulk.start, bulk.end, bulk.cc) == (0, 40, "cubic")
    assert flood.mbps == (0, 4, 8, 12) and (cross.start, cross.mbps) == (20, (12.0,) * 4)
    bulk_lane, flood_lane, cross_lane, probe_lane = trafficfile.lanes(t)
    assert bulk_lane == [Flow("bulk", "h1", "h5", 40, congestion_control="cubic", label="bulk")]
    assert [type(i) for i in flood_lane] == [Pause, Flow, Flow, Flow]
    assert [i.udp_mbps for i in flood_lane[1:]] == [4, 8, 12] and [i.name for i in flood_lane[1:]] == \
        ["flood_1", "flood_2", "flood_3"]
    assert cross_lane[0] == Pause(20, "cross waits") and [i.seconds for i in cross_lane[1:]] == [10, 10]
    assert probe_lane == [Probe("probe", "h2", "h6", 40, "probe")]


def test_steps_may_be_counted_without_a_steps_list():
    t = parsed("step_seconds: 5\nsteps: 3\nflows: [{name: a, from: h1, to: h2, protocol: udp, rate: 1Mbit, "
               "start_step: 2}]")
    assert (t.steps, t.seconds, t.flows[0].start) == (3, 15, 10)
    with pytest.raises(trafficfile.TrafficFileError, match=r"flows\[0\] \(a\).start_step: 3 is not a whole number "
                                                          "from 0 to 2"):
        parsed("steps: 3\nflows: [{name: a, from: h1, to: h2, start_step: 3}]")


def test_a_flow_with_a_dscp_carries_it_as_its_tos_byte():
    t = parsed("flows: [{name: v, from: h1, to: h2, protocol: udp, rate: 80kbit, dscp: 46, duration: 4}]")
    ((flow, rest),) = trafficfile.lanes(t)     # 4 s of the experiment's 10, then the lane rests
    assert (flow.tos, flow.udp_mbps, flow.seconds) == (46 << 2, 0.08, 4)
    assert rest == Pause(6, "v done")


def test_flows_may_run_past_the_steps_which_adds_a_period_after_them():
    t = parsed("step_seconds: 5\nflows:\n"
               "  - {name: tcp, from: h1, to: h4, protocol: tcp, duration: 14}\n"
               "  - {name: udp, from: h1, to: h4, protocol: udp, steps: [0, 12]}\n"
               "  - {name: alone, from: h1, to: h4, protocol: udp, rate: 4Mbit, start: 16, duration: 5}\n"
               "probe: {from: h2, to: h3}")
    assert (t.grid_seconds, t.seconds, t.periods()) == (10, 21, [(0, 5), (5, 10), (10, 21)])
    tcp, udp, alone, probe = trafficfile.lanes(t)
    assert tcp == [Flow("tcp", "h1", "h4", 14, label="tcp")]
    assert udp == [Pause(5, "udp 0 Mbit/s"), Flow("udp_1", "h1", "h4", 5, udp_mbps=12, label="udp 12 Mbit/s"),
                   Pause(11, "udp done")]
    assert alone == [Pause(16, "alone waits"), Flow("alone_2", "h1", "h4", 5, udp_mbps=4, label="alone 4 Mbit/s")]
    assert probe == [Probe("probe", "h2", "h3", 21, "probe")]
    assert trafficfile.unloaded(t) == [[Probe("probe_unloaded", "h2", "h3", trafficfile.UNLOADED_SECONDS,
                                              "unloaded RTT")]]
    assert trafficfile.unloaded(parsed("flows: [{name: a, from: h1, to: h2}]")) == []


def test_the_main_studys_traffic_is_the_shipped_traffic_file():
    from topo.studies.main.scenario import Scenario
    shipped = trafficfile.load(ROOT / "topo" / "examples" / "study.yaml")
    assert shipped == trafficfile.parse(Scenario().traffic(), "study")
    assert (shipped.seconds, [f.name for f in shipped.flows]) == (97, ["tcp", "udp", "udp_alone"])
    # ... and it runs on the study's own network, its bottleneck declared by bw= as any topology's
    loaded = custom.load(f"{ROOT / 'topo' / 'topos.py'}:qosstudy", {"bw": 5})
    assert [(link.ends, link.bps) for link in loaded.links] == [((("s1", 1), ("s2", 1)), 5_000_000)] \
        and shipped.hosts() <= set(loaded.topo.hosts())
    assert custom.load(f"{ROOT / 'topo' / 'topos.py'}:qosstudy", {}).links == []


@pytest.mark.parametrize("text, message", [
    ("flows: [{name: a, from: h1, to: h2, protocol: udp, rate: 12}]",
     "t.yaml: flows[0] (a).rate: 12 has no unit; write e.g. 12Mbit"),
    ("flows: [{name: a, from: h1, to: h2, protocol: udp, steps: [1, 2]}, "
     "{name: b, from: h1, to: h2, protocol: udp, steps: [1, 2, 3]}]",
     "t.yaml: flows[0] (a).steps: 2 steps where the experiment has 3; give every steps list 3 rates"),
    ("flows: [{name: a, from: h1, to: h2, protocol: tcp, rate: 1Mbit}]",
     "t.yaml: flows[0] (a).rate: a TCP flow takes what the network gives it"),
    ("flows: [{name: a, from: h1, to: h2, protocol: udp}]", "t.yaml: flows[0] (a): a UDP flow needs rate"),
    ("flows: [{name: a, from: h1, to: h1}]", "t.yaml: flows[0] (a).to: the same host as from"),
    ("flows: [{name: a, from: h1, to: h2, start: 1, start_step: 0}]", "t.yaml: flows[0] (a).start: give start or"),
    ("flows: [{name: a, from: h1, to: h2, colour: red}]", "t.yaml: flows[0].colour: unknown key"),
    ("flows: [{name: a, from: h1, to: h2}, {name: a, from: h2, to: h1}]", "t.yaml: flows: two flows are named a"),
    ("flows: []", "t.yaml: flows: missing or empty"),
    ("step_seconds: 1\nflows: [{name: a, from: h1, to: h2}]", "t.yaml: step_seconds: 1 is not a whole number"),
    ("flows: [{name: a, from: h1, to: h2, protocol: sctp}]", "t.yaml: flows[0] (a).protocol: 'sctp' is not tcp or udp"),
    ("flows: [{name: a, from: h1, to: h2, protocol: udp, steps: [1, '5 furlongs']}]",
     "t.yaml: flows[0] (a).steps[1]: '5 furlongs' is not a rate"),
    ("flows: [{name: a, from: h1, to: h2, protocol: udp, steps: [1, 2], duration: 30}]",
     "t.yaml: flows[0] (a).duration: a flow with steps ends with the last step, at 20 s"),
    ("flows: [{name: a, from: h1, to: h2, start: 9}]",
     "t.yaml: flows[0] (a).start: 9 s leaves the flow under 2 s before the last step ends at 10 s; start it "
     "earlier or give it a duration"),
    ("flows: [{name: a, from: h1, to: h2}]\nping: {from: h1, to: h2, interval: 0}",
     "t.yaml: ping.interval: 0 is not seconds from 0.01 to 10; e.g. 0.2"),
    ("flows: [{name: a, from: h1, to: h2}]\nping: {from: h1, too: h2}", "t.yaml: ping.too: unknown key"),
    ("step_seconds: 2.5\nflows: [{name: a, from: h1, to: h2}]", "t.yaml: step_seconds: 2.5 is not a whole number from 2"),
    ("1: x\nflows: [{name: a, from: h1, to: h2}]", "t.yaml: a key that is not a field name (is this a traffic file?)"),
    ("flows: [{name: a, from: h1, to: h2}]\nprobe: [h1, h2]", "t.yaml: probe: expected a mapping of keys to values, got list"),
])
def test_a_bad_traffic_file_is_refused_naming_the_field_and_the_fix(text, message):
    with pytest.raises(trafficfile.TrafficFileError) as err:
        parsed(text)
    assert str(err.value).startswith(message)


def test_a_traffic_file_that_is_not_yaml_names_its_line(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("flows: [\n  {name: a\n")
    with pytest.raises(trafficfile.TrafficFileError, match=r"t.yaml: not valid YAML \(.* at line \d, column \d+\); "
                                                            "fix the syntax"):
        trafficfile.load(path)


UNREADABLE = {
    "not UTF-8": (lambda p: p.write_bytes("flows: [{name: caf\u00e9, from: h1, to: h2}]\n".encode("latin-1")),
                  "not UTF-8 text; save the {what} as UTF-8"),
    "binary": (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), "not UTF-8 text; save the {what} as UTF-8"),
    "NUL bytes": (lambda p: p.write_bytes(b"flows: \x00\x01"), "not valid YAML (special characters are not allowed"),
    "a directory": (lambda p: p.mkdir(), "not a regular file (a directory, FIFO or device); give the path of a file"),
    "a FIFO": (lambda p: os.mkfifo(p), "not a regular file (a directory, FIFO or device); give the path of a file"),
    "missing": (lambda p: None, "cannot read it (No such file or directory); check the path and its permissions"),
    "a repeated key": (lambda p: p.write_text("step_seconds: 5\nstep_seconds: 6\n"),
                       "line 2: key 'step_seconds' appears twice in one mapping; keep one"),
}


@pytest.mark.parametrize("kind", UNREADABLE)
@pytest.mark.parametrize("load, error, what", [(trafficfile.load, trafficfile.TrafficFileError, "traffic file"),
                                                (experimentfile.load, experimentfile.ExperimentFileError,
                                                 "experiment file")])
def test_an_input_file_that_cannot_be_read_is_one_line_naming_it_and_the_fix(tmp_path, kind, load, error, what):
    path = tmp_path / "input.yaml"
    make, message = UNREADABLE[kind]
    make(path)
    with pytest.raises(error) as err:
        load(path)
    assert str(err.value) == f"{path}: {message.format(what=what)}" or \
        str(err.value).startswith(f"{path}: {message.format(what=what)}"), str(err.value)
    assert "\n" not in str(err.value)


def test_the_launcher_refuses_a_traffic_file_that_is_not_utf8_in_one_line_with_exit_2(topo_file, tmp_path):
    traffic = tmp_path / "t.yaml"
    traffic.write_bytes("flows: [{name: a, from: h1, to: h2, cc: r\u00e9no}]\n".encode("latin-1"))
    run = subprocess.run([sys.executable, str(ROOT / "topo" / "run.py"), "--topo", f"{topo_file}:line",
                          "--traffic", str(traffic)], capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout, run.stderr) == \
        (2, "", f"error: {traffic}: not UTF-8 text; save the traffic file as UTF-8\n")


TOPO = """
from mininet.topo import Topo

class Line(Topo):
    def build(self, n=2, bw=5, loop=False, delay="5ms", loss=None):
        s = [self.addSwitch(f"s{i + 1}") for i in range(n)]
        for a, b in zip(s, s[1:]):
            self.addLink(a, b, bw=bw or None, delay=delay, loss=loss)
        if loop:
            self.addLink(s[-1], s[0])
        for i, sw in enumerate(s):
            self.addLink(self.addHost(f"h{i + 1}"), sw)

class Twins(Topo):
    def build(self):
        self.addLink(self.addSwitch("core1"), self.addSwitch("edge1"))


class Nameless(Topo):
    def build(self):
        self.addLink(self.addSwitch("core"), self.addSwitch("edge", dpid="a"))

topos = {"line": Line, "made": lambda: Line(n=3), "twins": Twins, "nameless": Nameless}
"""


@pytest.fixture
def topo_file(tmp_path) -> Path:
    path = tmp_path / "mine.py"
    path.write_text(textwrap.dedent(TOPO))
    return path


def test_a_custom_file_loads_as_mn_loads_it_its_links_declared_and_plain(topo_file):
    loaded = custom.load(f"{topo_file}:line", custom.parse_params(["n=3", "bw=2.5"]))
    assert sorted(loaded.topo.switches()) == ["s1", "s2", "s3"]
    assert [(link.ends, link.bps) for link in loaded.links] == [((("s1", 1), ("s2", 1)), 2_500_000),
                                                                ((("s2", 2), ("s3", 1)), 2_500_000)]
    assert loaded.delays == ["s1-s2 5ms", "s2-s3 5ms"]
    assert all("bw" not in info and "delay" not in info for *_, info in loaded.topo.links(withInfo=True))
    assert len(custom.load(f"{topo_file}:made", {}).topo.switches()) == 3     # a callable, as mn takes
    # The delay on a path is its links': h1 → h3 crosses s1-s2 and s2-s3, h2 → h3 only s2-s3.
    assert [custom.one_way_seconds(loaded, *ends) for ends in (("h1", "h3"), ("h2", "h3"), ("h2", "h2"))] == \
        [0.010, 0.005, 0.0]
    assert custom.load(f"{topo_file}:line", custom.parse_params(["delay=0"])).delays == []   # 0 is none, as mn has it


@pytest.mark.parametrize("spec, params, message", [
    ("{f}", [], "--topo '{f}': write FILE:NAME"),
    ("{f}:ring", [], "--topo {f}:ring: no topology 'ring'; the file has line, made, twins, nameless"),
    ("{f}:line", ["colour=1"], "--topo {f}:line: building it failed (TypeError"),
    ("{f}:line", ["bw=fast"], "--topo {f}:line: link s1-s2 bw='fast'; give a rate in Mbit/s"),
    ("/nonexistent/x.py:line", [], "--topo /nonexistent/x.py:line: no file /nonexistent/x.py"),
    ("{f}:line", ["delay=5"], "--topo {f}:line: link s1-s2 delay=5; write it with its unit, e.g. delay='10ms'"),
    ("{f}:line", ["delay=5 ms"], "--topo {f}:line: link s1-s2 delay='5 ms'; write it with its unit"),
    ("{f}:line", ["bw=0"], "--topo {f}:line: link s1-s2 delay='5ms' without bw=; its delay goes above the queues"),
    ("{f}:twins", [], "--topo {f}:twins: switches core1 and edge1 both get datapath id 1 (Mininet takes it from "
                      "the first number in the name); rename one, or give addSwitch a dpid="),
    ("{f}:nameless", [], "--topo {f}:nameless: switch core has no datapath id (dpid=None, and no number in its name)"),
    ("{f}:line", ["loss=1"], "--topo {f}:line: link s1-s2 loss=1; a switch-to-switch link takes bw= and delay= "
                             "only (its ports' qdiscs are the controller's): put loss= on a host's link"),
])
def test_a_bad_topology_is_refused_naming_the_file_and_the_fix(topo_file, spec, params, message):
    with pytest.raises(custom.TopologyError) as err:
        custom.load(spec.format(f=topo_file), custom.parse_params(params))
    assert str(err.value).startswith(message.format(f=topo_file))


def test_a_file_that_does_not_load_is_one_line(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import nosuchmodule\n")
    with pytest.raises(custom.TopologyError, match=r"the file does not load \(ModuleNotFoundError"):
        custom.load(f"{path}:x", {})
    with pytest.raises(custom.TopologyError, match="write NAME=VALUE"):
        custom.parse_params(["n"])


def test_the_launcher_refuses_bad_input_with_one_line_and_exit_2_before_anything_starts(topo_file, tmp_path):
    traffic = tmp_path / "t.yaml"
    traffic.write_text("flows: [{name: a, from: h1, to: h9}]\n")
    run = subprocess.run([sys.executable, str(ROOT / "topo" / "run.py"), "--topo", f"{topo_file}:line",
                          "--traffic", str(traffic), "--policy", "auto"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == f"error: {traffic}: host h9 is not in {topo_file}:line (it has h1, h2); fix from/to\n"


def test_the_shipped_parking_lot_is_a_mininet_custom_topology():
    loaded = custom.load(f"{ROOT / 'topo' / 'topos.py'}:parkinglot", {"last_bw": 4})
    assert [link.bps for link in loaded.links] == [5_000_000, 4_000_000]
    assert sorted(loaded.topo.hosts()) == [f"h{i}" for i in range(1, 7)]
    example = trafficfile.load(ROOT / "topo" / "examples" / "parkinglot.yaml")
    assert example.hosts() <= set(loaded.topo.hosts())


def test_the_summary_schema_is_a_schema_and_refuses_a_summary_missing_its_steps():
    import json

    import jsonschema
    schema = json.loads((ROOT / "docs" / "schema" / "experiment-summary.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    broken = {"scenario": {"topo": "f.py:x", "topo_params": {}, "step_seconds": 10, "steps": 1, "seconds": 10,
                           "settle_seconds": 1, "links": []}, "environment": {}, "complete": True,
              "trials": {"auto": {"policy": "auto", "nonblocking": False, "flows": [], "t0": 1.8e9, "seconds": 10,
                                  "events": [], "tcp": {}, "leaves": {}, "decisions": [], "fidelity": None}}}
    with pytest.raises(jsonschema.ValidationError, match="'steps' is a required property"):
        jsonschema.validate(broken, schema)
    broken["trials"]["auto"]["steps"] = []
    jsonschema.validate(broken, schema)


def test_the_launchers_help_shows_every_command_and_the_experiments_flags_beside_the_main_studys():
    done = subprocess.run([sys.executable, str(ROOT / "topo" / "run.py"), "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    for command in ("doctor", "clean", "report RESULTS_DIR", "vm --", "cc | fairness | aqm"):
        assert f"topo/run.py {command}" in done.stdout, command
    own = done.stdout[done.stdout.index("Your own experiment"):]
    for flag in ("--topo FILE:NAME", "--topo-param", "--traffic FILE", "--experiment FILE", "--policy NAME",
                 "--prometheus"):
        assert flag in own, flag
    assert "--udp-steps" in done.stdout[:done.stdout.index("Your own experiment")]
