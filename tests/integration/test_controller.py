"""The controller and launcher facing bad input and Ctrl-C: errors name the field, nothing half-applied,
nothing left behind."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from controller.core.policy import load_document
from tests.integration.conftest import NOTHING_LEFT, leftovers, requires_ovs
from topo.harness.controller import ControllerError, controller

REPO = Path(__file__).resolve().parents[2]
pytestmark = requires_ovs


def test_a_bad_policy_over_rest_is_refused_and_the_good_one_stays(tmp_path):
    good = load_document(REPO / "policies" / "reserve.yaml")
    bad = json.loads(json.dumps(good))
    bad["switches"]["s1"]["flows"][2]["match"]["ip_proto"] = "udpp"
    with controller(tmp_path / "controller.log") as client:
        assert client.put_policy(good)["applied"] == "reserve"
        with pytest.raises(ControllerError, match=r"^switches\.s1\.flows\[2\]\.match\.ip_proto: 'udpp'"):
            client.put_policy(bad)
        assert client.status()["policy"] == "reserve"
    assert leftovers() == NOTHING_LEFT


def test_a_malformed_policy_file_exits_2_with_one_line_and_applies_nothing(tmp_path):
    doc = load_document(REPO / "policies" / "reserve.yaml")
    doc["classes"]["tcp"]["min"] = "180%"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, "topo/run.py", "--policy", str(bad), "--quick", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: classes.tcp.min: '180%' is outside 0%..100%; "
                                                "write a share such as 80%"]
    assert leftovers() == NOTHING_LEFT


def test_ctrl_c_mid_run_cleans_everything(tmp_path):
    proc = subprocess.Popen([sys.executable, "topo/run.py", "--policy", "reserve", "--quick",
                             "--prometheus", "none", "--out", str(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not leftovers()["iperf3"]:   # traffic running: queues, bridges, controller, iperf3 all up
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.5)
    assert leftovers()["qos"]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert leftovers() == NOTHING_LEFT
