"""The launcher as a user meets it: repeats and parallel flows, one study per host, a killed run
cleaned up by the next one, and an interrupted run that keeps what finished."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.integration.conftest import NOTHING_LEFT, leftovers, requires_ovs

REPO = Path(__file__).resolve().parents[2]
# No TCP-alone cooldown: only auto's roll-back shows there, and these runs are not auto's.
SHORT = ["--quick", "--udp-steps", "0,10", "--lone-udp", "0", "--cooldown-seconds", "0", "--prometheus", "none"]
pytestmark = requires_ovs
NOBODY = 65534


def launch(*args: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "topo/run.py", *args, "--out", str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_until(condition, what: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"launcher exited before {what}: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.3)


@pytest.mark.timeout(600)   # three repetitions of a study (its run's own limit is 400 s)
def test_repeats_report_the_median_and_range_and_parallel_flows_their_fairness(tmp_path):
    done = subprocess.run([sys.executable, "topo/run.py", "--policy", "reserve", *SHORT, "--udp-steps", "10",
                           "--repeat", "3", "--tcp-flows", "2", "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    reserve = summary["policies"]["reserve"]
    assert len(reserve["repetitions"]) == 3
    assert sorted(p.name for p in (tmp_path / "raw" / "reserve").iterdir()) == ["1", "2", "3"]
    for step in reserve["steps"]:
        assert len(step["runs"]) == 3
        assert step["tcp_mbps_min"] <= step["tcp_mbps"] <= step["tcp_mbps_max"]
        assert sorted(step["runs"])[1] == step["tcp_mbps"]
        # two cubic flows in the one TCP class share it about equally (0.5 would be one taking everything)
        assert len(step["tcp_flows_mbps"]) == 2 and 0.8 <= step["tcp_jain_index"] <= 1
        # the two flows share what TCP gets: their rates add up to the aggregate
        assert sum(step["tcp_flows_mbps"]) == pytest.approx(step["tcp_mbps"], rel=0.15)
    for k, run in enumerate(reserve["repetitions"], start=1):
        tcp = json.loads((tmp_path / "raw" / "reserve" / str(k) / "tcp.json").read_text())
        assert tcp["start"]["test_start"]["num_streams"] == 2
        assert [s["udp_mbps_offered"] for s in run["steps"]] == [10]
    assert "(" in (tmp_path / "table.md").read_text()          # median (min–max)
    assert leftovers() == NOTHING_LEFT


def test_a_second_launcher_is_refused_while_one_runs(tmp_path):
    first = launch("--policy", "reserve", *SHORT, out=tmp_path / "first")
    try:
        wait_until(lambda: leftovers()["bridges"], "a network", first)
        second = subprocess.run([sys.executable, "topo/run.py", "--policy", "none", *SHORT, "--out",
                                 str(tmp_path / "second")], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert second.stderr.strip().startswith("error: another study is running here (pid ")
        assert str(tmp_path / "first") in second.stderr
        assert not (tmp_path / "second").exists()
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    assert first.returncode == 130
    assert leftovers() == NOTHING_LEFT


def test_the_next_run_removes_what_a_killed_launcher_left(tmp_path):
    killed = launch("--policy", "reserve", "--quick", out=tmp_path / "killed")
    wait_until(lambda: leftovers()["iperf3"], "traffic", killed)
    os.kill(killed.pid, signal.SIGKILL)        # no clean-up of its own at all
    killed.communicate(timeout=10)
    left = leftovers()
    assert left["iperf3"] and left["controller"] and left["bridges"] and left["qos"]
    after = subprocess.run([sys.executable, "topo/run.py", "--policy", "none", *SHORT, "--udp-steps", "10",
                            "--out", str(tmp_path / "next")], cwd=REPO, capture_output=True, text=True, timeout=200)
    assert after.returncode == 0, after.stderr[-2000:]
    removed = next(line for line in after.stderr.splitlines() if "killed run left behind" in line)
    assert "controller (pid" in removed and "iperf3 (pid" in removed and "bridge s1" in removed
    assert "prometheus (pid" in removed       # its data would otherwise land in the killed run's folder
    assert leftovers() == NOTHING_LEFT


def test_clean_removes_what_a_killed_launcher_left_its_queues_rows_included(tmp_path):
    killed = launch("--policy", "reserve", "--quick", out=tmp_path / "killed")
    wait_until(lambda: leftovers()["iperf3"] and leftovers()["qos"], "traffic through reserve's queues", killed)
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate(timeout=10)
    done = subprocess.run([sys.executable, "topo/run.py", "clean"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "QoS/Queue rows of owner study" in done.stdout and "controller (pid" in done.stdout
    assert leftovers() == NOTHING_LEFT


def test_an_interrupted_run_keeps_the_summary_of_every_policy_that_finished(tmp_path):
    proc = launch("--policy", "none", "reserve", *SHORT, out=tmp_path)
    wait_until(lambda: (tmp_path / "raw" / "reserve").exists() and leftovers()["iperf3"], "the second policy", proc,
               timeout=120)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "summary.json keeps the 1 finished" in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["complete"], summary["interrupted"]) == (False, True)
    assert list(summary["policies"]) == ["none"] and len(summary["policies"]["none"]["steps"]) == 2
    assert leftovers() == NOTHING_LEFT


def test_a_bad_flag_exits_2_in_one_line_and_starts_nothing(tmp_path):
    namespaces = subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    done = subprocess.run([sys.executable, "topo/run.py", "--delay", "5parsecs", *SHORT, "--out", str(tmp_path / "r")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == \
        (2, "", "error: --delay: '5parsecs' is not a delay; write e.g. 5ms, 500us or 0.1s, or none\n")
    assert leftovers() == NOTHING_LEFT and not (tmp_path / "r").exists()
    assert subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout == namespaces


@pytest.mark.parametrize("flags", [["--topo", "{unreadable}:line", "--traffic", "{readable}"],
                                   ["--topo", "topo/topos.py:parkinglot", "--traffic", "{unreadable}"],
                                   ["--experiment", "{unreadable}"]])
def test_an_input_file_its_user_may_not_read_is_one_line_and_exit_2(flags):
    """Run as an unprivileged user (root reads every file): permissions are the reason given, and nothing starts."""
    with tempfile.TemporaryDirectory() as tmp:       # pytest's own is root's alone
        folder = Path(tmp)
        folder.chmod(0o755)
        readable, unreadable, mpl = folder / "t.yaml", folder / "secret.yaml", folder / "mpl"
        readable.write_text("flows: [{name: a, from: h1, to: h2}]\n")
        unreadable.write_text("flows: [{name: a, from: h1, to: h2}]\n")
        unreadable.chmod(0)
        mpl.mkdir()
        os.chown(mpl, NOBODY, NOBODY)
        args = [f.format(readable=readable, unreadable=unreadable) for f in flags]
        done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable,
                               "topo/run.py", *args], cwd=REPO, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "MPLCONFIGDIR": str(mpl)})
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: ") and "Permission denied" in done.stderr and str(unreadable) in \
        done.stderr, done.stderr
