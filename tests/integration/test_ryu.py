"""`ryu-manager controller/qos_app.py`: the same app under Ryu (csle-ryu-fork, in .venv-ryu: its eventlet
pin clashes with os-ken's), controlling the main study's network. The launcher uses the controller it
finds on 127.0.0.1:6653, as a user who started one by hand would have it do; the study's auto (which
does all that reserve does, after detecting the flood) then holds what it holds under os-ken (test_study.py)."""
import json
import subprocess
import sys

import pytest

from tests.integration.conftest import (
    FLOOD_ONLY,
    NOTHING_LEFT,
    REPO,
    STEERED_WITHIN_S,
    STUDY_TIMEOUT,
    controller_config,
    leftovers,
    requires_ovs,
    stop_controller,
)

RYU = REPO / ".venv-ryu" / "bin" / "ryu-manager"
pytestmark = [requires_ovs, pytest.mark.needs(not RYU.exists(), "needs .venv-ryu (scripts/setup.sh makes it)")]


def start_ryu(config, log):
    import time
    import urllib.request
    out = open(log, "w")
    proc = subprocess.Popen([str(RYU), "--config-file", str(config), "controller/qos_app.py"], stdout=out,
                            stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen("http://127.0.0.1:8080/qos/v1/status", timeout=1)
            return proc
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"ryu-manager did not serve the API: {log.read_text()[-2000:]}")


def step(summary, policy, udp):
    return next(s for s in summary["policies"][policy]["steps"] if s["udp_mbps_offered"] == udp)


@pytest.mark.timeout(STUDY_TIMEOUT)   # a whole study
def test_the_main_studys_auto_under_a_controller_started_by_ryu_manager(tmp_path):
    proc = start_ryu(controller_config(tmp_path / "qos.conf"), tmp_path / "ryu.log")
    try:
        out = tmp_path / "study"
        done = subprocess.run([sys.executable, "topo/run.py", "--policy", "auto", *FLOOD_ONLY,
                               "--prometheus", "none", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        stop_controller(proc)
    log = (tmp_path / "ryu.log").read_text()
    assert "under Ryu;" in log and "Traceback" not in log, log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    # auto does all that reserve does (flows, queues in OVSDB, meters) and detects the flood first.
    reservation = summary["policies"]["auto"]["tcp_reservation_mbps"]
    for udp in (10, 12):
        row = step(summary, "auto", udp)
        assert row["faithful"], row   # an unfaithful step proves nothing either way
        assert row["tcp_mbps"] >= 0.9 * reservation, row
        assert row["probe_loss_percent"] <= 2, row
    (run,) = summary["policies"]["auto"]["repetitions"]
    assert [d["action"] for d in run["decisions"]] == ["program", "rollback"]
    (episode,) = run["episodes"]
    assert 0 < episode["reaction_seconds"] <= STEERED_WITHIN_S and episode["recovery_seconds"] is not None
    classes = {c["class"]: c for c in run["tc_classes"].values()}
    assert classes["udp"]["drops"] > 1000 and classes["tcp"]["bytes"] > 5 * classes["udp"]["bytes"]
    assert leftovers() == NOTHING_LEFT
