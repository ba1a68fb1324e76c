"""An experiment file (topo/net/experimentfile.py): a network and its trials, checked before anything
starts, every refusal one line naming the file, the field and the fix; and cc, fairness and aqm, which
are such experiments written by their command lines."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from topo.harness.capabilities import STUDY_TCP
from topo.net import experimentfile, trafficfile
from topo.net.experimentfile import ExperimentFileError
from topo.net.traffic import Ping
from topo.studies import STUDIES
from topo.studies.base import UsageError, parser_for
from topo.studies.experiment.planning import of_command_line, queue_rule

ROOT = Path(__file__).resolve().parents[2]
FLOW = "{step_seconds: 10, flows: [{name: bulk, from: h1, to: h4}]}"


def parsed(text: str) -> experimentfile.Experiment:
    return experimentfile.parse(yaml.safe_load(textwrap.dedent(text)), "e.yaml", Path("/x"))


def test_without_trials_each_policy_is_a_trial_on_the_same_traffic():
    e = parsed(f"topo: ../topos.py:qosstudy\ntopo_params: {{bw: 5}}\npolicy: [none, auto]\ntraffic: {FLOW}")
    assert e.topo == "/topos.py:qosstudy" and e.params == {"bw": 5}
    assert [(t.name, t.policy) for t in e.trials] == [("none", "none"), ("auto", "auto")]
    assert e.trials[0].traffic is e.trials[1].traffic and e.trials[0].traffic.hosts() == {"h1", "h4"}


def test_a_trial_takes_what_it_does_not_say_from_the_top_and_its_ports_over_the_files():
    e = parsed(f"""
        topo: t.py:line
        policy: mine.yaml
        ports: {{queue_packets: 100}}
        traffic: {FLOW}
        trials:
          - {{name: fifo}}
          - {{name: codel, policy: auto, ports: {{discipline: codel, queue_packets: 50}},
              traffic: {{step_seconds: 10, flows: [{{name: x, from: h2, to: h3, cc: reno}}]}}}}
        """)
    fifo, codel = e.trials
    assert (fifo.policy, fifo.ports, fifo.traffic.flows[0].name) == ("/x/mine.yaml", {"queue_packets": 100}, "bulk")
    assert (codel.policy, codel.ports) == ("auto", {"queue_packets": 50, "discipline": "codel"})
    assert codel.traffic.flows[0].cc == "reno"


def test_a_traffic_file_is_read_relative_to_the_experiment_file(tmp_path):
    (tmp_path / "t.yaml").write_text(FLOW)
    (tmp_path / "e.yaml").write_text("topo: x.py:y\ntraffic: t.yaml\n")
    (trial,) = experimentfile.load(tmp_path / "e.yaml").trials
    assert (trial.name, trial.traffic.flows[0].name) == ("none", "bulk")


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "e.yaml: expected a mapping of keys to values, got list"),
    (f"topo: x.py:y\ncolour: red\ntraffic: {FLOW}", "e.yaml.colour: unknown key; use one of topo, topo_params"),
    (f"topo: x.py\ntraffic: {FLOW}", "e.yaml: topo: 'x.py' is not FILE:NAME; e.g. topo: ../topos.py:parkinglot"),
    ("topo: x.py:y", "e.yaml: traffic: missing; give a traffic file's path or the traffic itself"),
    (f"topo: x.py:y\npolicy: 5\ntraffic: {FLOW}", "e.yaml: policy: 5 is not a policy; name one"),
    (f"topo: x.py:y\npolicy: [none, 5]\ntraffic: {FLOW}", "e.yaml: policy[1]: 5 is not a policy"),
    (f"topo: x.py:y\npolicy: [none, auto]\ntrials: [{{name: a}}]\ntraffic: {FLOW}",
     "e.yaml: policy: a list makes one trial per policy; with trials, give each trial its policy"),
    (f"topo: x.py:y\ntrials: []\ntraffic: {FLOW}", "e.yaml: trials: not a list of trials"),
    (f"topo: x.py:y\ntrials: [{{name: 'a b'}}]\ntraffic: {FLOW}", "e.yaml: trials[0].name: 'a b' is not a name"),
    (f"topo: x.py:y\ntrials: [{{name: a, speed: 3}}]\ntraffic: {FLOW}", "e.yaml: trials[0].speed: unknown key"),
    (f"topo: x.py:y\ntrials: [{{name: a}}, {{name: a}}]\ntraffic: {FLOW}", "e.yaml: two trials are named a"),
    (f"topo: x.py:y\ntrials: [{{name: a, ports: 3}}]\ntraffic: {FLOW}",
     "e.yaml: trials[0] (a).ports: expected a mapping"),
    ("topo: x.py:y\ntrials: [{name: a}]\ntraffic: {flows: [{name: b, from: h1, to: h1}]}",
     "e.yaml: trials[0] (a).traffic: flows[0] (b).to: the same host as from"),
    (f"topo: x.py:y\ntrials: [{{name: a}}, {{name: b, traffic: {{step_seconds: 5, flows: [{{name: c, from: h1, "
     f"to: h2}}]}}}}]\ntraffic: {FLOW}",
     "e.yaml: trial b has 1 steps of 5 s over 5 s, trial a 1 of 10 s over 10 s; the results compare trials step by "
     "step, so give them the same steps"),
    (f"topo: x.py:y\ntrials: [{{name: a}}, {{name: b, traffic: {{step_seconds: 10, flows: [{{name: c, from: h1, "
     f"to: h2, duration: 14}}]}}}}]\ntraffic: {FLOW}",
     "e.yaml: trial b has 1 steps of 10 s over 14 s, trial a 1 of 10 s over 10 s"),
])
def test_a_bad_experiment_file_is_refused_naming_the_field_and_the_fix(text, message):
    with pytest.raises(ExperimentFileError) as err:
        parsed(text)
    assert str(err.value).startswith(message), str(err.value)


def test_a_missing_experiment_file_or_one_not_yaml_is_said(tmp_path):
    with pytest.raises(ExperimentFileError, match="cannot read it"):
        experimentfile.load(tmp_path / "nope.yaml")
    (tmp_path / "e.yaml").write_text("topo: [\n")
    with pytest.raises(ExperimentFileError, match=r"e.yaml: not valid YAML \(.* at line \d, column \d+\); fix the syntax"):
        experimentfile.load(tmp_path / "e.yaml")


def test_quick_rescales_every_flow_of_a_trial():
    e = parsed("topo: x.py:y\ntraffic: {step_seconds: 10, steps: 3, flows: [{name: a, from: h1, to: h2, start: 10, "
               "duration: 10}]}")
    (quick,) = [experimentfile.rescaled(t, 4) for t in e.trials]
    assert (quick.traffic.step_seconds, quick.traffic.flows[0].start, quick.traffic.flows[0].end) == (4, 4, 8)


def test_a_ping_runs_beside_the_flows_for_the_whole_experiment():
    t = trafficfile.parse({"step_seconds": 10, "steps": 2, "flows": [{"name": "a", "from": "h1", "to": "h2"}],
                           "ping": {"from": "h3", "to": "h2", "interval": 0.5}})
    assert t.hosts() == {"h1", "h2", "h3"}
    assert trafficfile.lanes(t)[-1] == [Ping("ping", "h3", "h2", 20, 0.5, "ping")]


def plan_of(study: str, *argv: str):
    return STUDIES[study].plan(parser_for(STUDIES[study], study).parse_args(list(argv)))


def test_cc_is_an_experiment_of_one_trial_per_algorithm_on_the_study_topology():
    plan = plan_of("cc", "--algorithms", "reno", "bbr", "--seconds", "8", "--queue-packets", "40")
    assert [t.name for t in plan.experiment.trials] == ["reno", "bbr"]
    assert plan.experiment.topo.endswith("topo/topos.py:qosstudy") and plan.experiment.params == {"bw": 5.0}
    assert [link.bps for link in plan.loaded.links] == [5_000_000]
    reno = plan.experiment.trials[0]
    assert (reno.traffic.seconds, reno.traffic.flows[0].cc, reno.policy) == (8, "reno", "none")
    assert plan.documents["reno"]["network"]["ports"] == {"queues": "fifo", "queue_packets": 40}
    assert experimentfile.parse(plan.document, "again", Path("/")) == plan.experiment   # a file it can write


def test_fairness_and_aqm_are_experiments_too():
    fairness = plan_of("fairness", "--pairs", "cubic:reno", "--quick")
    assert [t.name for t in fairness.experiment.trials] == ["cubic-vs-reno", "cubic-vs-UDP"]
    udp = fairness.experiment.trials[1].traffic.flows[1]
    assert (udp.protocol, udp.mbps, udp.src) == ("udp", (10.0,), "h2")
    aqm = plan_of("aqm", "--disciplines", "fifo", "codel", "--quick")
    assert aqm.experiment.topo.endswith(":dumbbell") and aqm.experiment.params == {"bw": 10.0, "n": 5}
    assert aqm.documents["codel"]["network"]["ports"]["discipline"] == "codel"
    rule = queue_rule(aqm.documents["codel"])     # as the parser reads it, with the policy's other fields
    assert (rule.queues, rule.queue_packets, rule.discipline) == ("fifo", 100, "codel")
    traffic = aqm.experiment.trials[0].traffic
    assert (len(traffic.flows), traffic.probe, traffic.ping) == (5, ("snd1", "rcv1"), ("snd1", "rcv1", 0.2))


@pytest.mark.parametrize("argv, message", [
    (["cc", "--algorithms", "reno", "a b"], "--algorithms: 'a b' is not a congestion control's name; e.g. cubic"),
    (["fairness", "--pairs", "cubic:Reno!"], "--pairs: 'Reno!' is not a congestion control's name"),
    (["fairness", "--tcp-vs-udp", "x y"], "--tcp-vs-udp: 'x y' is not a congestion control's name"),
    (["aqm", "--cc", ""], "--cc: '' is not a congestion control's name"),
])
def test_a_study_refuses_an_algorithm_that_is_not_a_name(argv, message):
    with pytest.raises(UsageError) as err:
        plan_of(*argv)
    assert str(err.value).startswith(message)


def run_launcher(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "topo" / "run.py"), *args], capture_output=True, text=True,
                          timeout=60)


def test_the_launcher_refuses_a_bad_experiment_with_one_line_and_exit_2(tmp_path):
    topo = tmp_path / "line.py"
    topo.write_text("from mininet.topo import Topo\nclass Line(Topo):\n    def build(self):\n"
                    "        s = self.addSwitch('s1')\n        self.addLink(self.addHost('h1'), s)\n"
                    "        self.addLink(self.addHost('h2'), s)\ntopos = {'line': Line}\n")
    experiment = tmp_path / "e.yaml"
    experiment.write_text("topo: line.py:line\ntrials: [{name: a, ports: {discipline: tulip}}]\n"
                          "traffic: {flows: [{name: b, from: h1, to: h2}]}\n")
    run = run_launcher("--experiment", str(experiment))
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.startswith("error: trial a: network.ports.discipline: 'tulip' is not") and \
        run.stderr.count("\n") == 1, run.stderr
    experiment.write_text("topo: line.py:line\ntraffic: {flows: [{name: b, from: h1, to: h3}]}\n")
    run = run_launcher("--experiment", str(experiment))
    assert run.stderr == f"error: {experiment}: host h3 is not in {tmp_path}/line.py:line (it has h1, h2); fix from/to\n"
    run = run_launcher("--experiment", str(experiment), "--policy", "auto")
    assert run.stderr == f"error: --policy: the experiment file {experiment} says it; leave --policy out\n"
    run = run_launcher("--topo", f"{topo}:line")
    assert run.returncode == 2 and run.stderr == "error: give --experiment FILE, or --topo FILE:NAME and --traffic " \
                                                 "FILE (docs/experiments.md)\n"


@pytest.mark.parametrize("study, argv", [
    ("cc", ["--algorithms", *STUDY_TCP]),
    ("fairness", []), ("aqm", []),
])
def test_the_shipped_study_experiments_are_what_the_commands_write(study, argv):
    shipped = experimentfile.load(ROOT / "topo" / "examples" / f"{study}.yaml")
    assert shipped == plan_of(study, *argv).experiment


def test_the_shipped_parking_lot_experiment_is_its_command_line_in_a_file():
    shipped = experimentfile.load(ROOT / "topo" / "examples" / "parkinglot-experiment.yaml")
    args = parser_for(STUDIES["experiment"], "run.py").parse_args(
        ["--topo", f"{ROOT}/topo/topos.py:parkinglot", "--topo-param", "last_bw=4", "--traffic",
         str(ROOT / "topo" / "examples" / "parkinglot.yaml"), "--policy", "none", "reserve", "auto"])
    assert shipped == of_command_line(args)


def test_a_trial_whose_discipline_or_congestion_control_the_kernel_lacks_is_named_before_anything_starts():
    from controller.core.policy import PortRule
    from topo.harness.capabilities import Capability
    from topo.studies.experiment.planning import lacking, tc_kind
    caps = {f"qdisc:{k}": Capability(f"qdisc:{k}", k != "sfq", "kernel lacks sch_sfq" if k == "sfq" else "ok", "tc",
                                     False) for k in ("pfifo", "pfifo_head_drop", "sfq", "codel")}
    caps |= {f"tcp:{a}": Capability(f"tcp:{a}", True, "in tcp_available_congestion_control", "grep", False)
             for a in ("reno", "cubic")}
    e = parsed("topo: x.py:y\nports: {queue_packets: 50}\ntraffic: {flows: [{name: a, from: h1, to: h2, cc: reno}]}\n"
               "trials: [{name: fifo}, {name: sfq, ports: {discipline: sfq}}, {name: codel, ports: {discipline: codel}},"
               " {name: v, traffic: {flows: [{name: b, from: h1, to: h2, cc: nosuch}]}}]")
    rules = {t.name: PortRule("fifo", **t.ports) for t in e.trials}
    why = {t.name: lacking(t, rules[t.name], caps, "user") for t in e.trials}
    assert why == {"fifo": None, "sfq": "ports.discipline sfq: kernel lacks sch_sfq", "codel": None,
                   "v": "cc nosuch: not probed: tcp nosuch is unknown to this host"}
    assert (tc_kind("fifo", "user"), tc_kind("fifo", "kernel"), tc_kind("red", "user")) == \
        ("pfifo_head_drop", "pfifo", "red")
