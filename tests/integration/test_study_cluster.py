"""The main study under three active controllers sharing s1 and s2 through a private etcd (--controllers 3),
with s2 on a second OVS reached over TCP (--ovs-instances 2), as a site spreads them: s1 and s2 owned by
different members, said on stderr and in summary.json; auto programs and rolls back on the member that
owns the bottleneck's switch, and holds TCP at its reservation; s2's bridge and queues came through the
second OVS's own OVSDB; the run's Prometheus recorded every member; nothing left behind, etcd, its data
and the second OVS included. A bad --controllers, or one against a controller already on 6653, is one
line and starts nothing."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import (
    FLOOD_ONLY,
    NOTHING_LEFT,
    REPO,
    controller_config,
    leftovers,
    requires_ovs,
    start_controller,
    stop_controller,
)
from topo.harness.prometheus import api, serving
from topo.net.ovs_instance import BASE

pytestmark = requires_ovs
S1 = "0000000000000001"


def etcds() -> str:
    return subprocess.run(["pgrep", "-f", "etcd --name ovsqos"], capture_output=True, text=True).stdout


def etcd_data() -> set[Path]:
    return set(Path("/tmp").glob("ovsqos-etcd-*"))


def study(*args: str, out: Path, timeout: float = 200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "topo/run.py", *args, "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_three_controllers_share_the_switches_and_auto_programs_and_rolls_back_on_the_bottlenecks_owner(tmp_path):
    before, data = etcds(), etcd_data()
    out = tmp_path / "study"
    done = study("--policy", "auto", *FLOOD_ONLY, "--controllers", "3", "--ovs-instances", "2", out=out)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ovs_instances"] == 2
    cluster = summary["controllers"]
    assert list(cluster["members"]) == ["c1", "c2", "c3"]
    assert [m["openflow"] for m in cluster["members"].values()] == [6653, 6654, 6655]
    owners = cluster["owners"]["auto"]
    assert set(owners) == {"s1", "s2"} and owners["s1"] != owners["s2"], owners
    said = f"auto: s1 owned by {owners['s1']}, s2 by {owners['s2']}"
    assert f"note: {said}\n" in done.stderr and said in (out / "table.md").read_text()

    auto = summary["policies"]["auto"]
    (run,) = auto["repetitions"]
    assert [d["action"] for d in run["decisions"]] == ["program", "rollback"]
    assert {(d["member"], d["dp_id"]) for d in run["decisions"]} == {(owners["s1"], S1)}   # the bottleneck's owner
    floods = [step for step in auto["steps"] if step["udp_mbps_offered"] in (10, 12)]
    assert len(floods) == 2, auto["steps"]
    for step in floods:   # an unfaithful step (the datapath starved) proves nothing: the claim fails, saying why
        assert step["faithful"], f"the claim rests on an unfaithful step: {step['fidelity_notes']}"
        assert step["tcp_mbps"] >= 0.9 * auto["tcp_reservation_mbps"], step
    for member in cluster["members"]:
        assert "Traceback" not in (out / f"controller-{member}.log").read_text()
    s2 = (out / f"controller-{owners['s2']}.log").read_text()
    assert "switch 0000000000000002 (s2, datapath netdev, OVSDB tcp:127.0.0.2:6640) connected" in s2
    assert "switch 0000000000000001 (s1, datapath netdev, OVSDB unix:/var/run/openvswitch/db.sock) connected" in \
        (out / f"controller-{owners['s1']}.log").read_text()
    assert leftovers() == NOTHING_LEFT and not any(BASE.glob("*"))
    assert etcds() == before and etcd_data() == data
    # The run's Prometheus scraped every member, as Grafana would show them.
    with serving(out / "prometheus") as url:
        instances = api(url, "/api/v1/label/instance/values", **{"match[]": "ovsqos_controller_role"})
    assert sorted(instances) == ["127.0.0.1:9101", "127.0.0.1:9111", "127.0.0.1:9121"], instances


@pytest.mark.parametrize("count", ["0", "x"])
def test_a_bad_controllers_flag_exits_2_in_one_line_and_starts_nothing(tmp_path, count):
    done = study("--policy", "auto", *FLOOD_ONLY, "--controllers", count, out=tmp_path / "r", timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == \
        (2, "", f"error: --controllers {count}: give a whole number from 1 to 8 (1, the default: one controller and "
                "no etcd)\n")
    assert not (tmp_path / "r").exists() and leftovers() == NOTHING_LEFT


def test_controllers_beside_a_running_controller_exit_1_in_one_line_and_start_nothing(tmp_path):
    before = etcds()
    proc = start_controller(controller_config(tmp_path / "qos.conf"), tmp_path / "controller.log")
    try:
        done = study("--policy", "auto", *FLOOD_ONLY, "--prometheus", "none", "--controllers", "3",
                     out=tmp_path / "r", timeout=120)
        assert etcds() == before
    finally:
        stop_controller(proc)
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert done.stderr.startswith("error: --controllers 3: 127.0.0.1:6653 is in use") and \
        done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "r").exists() and leftovers() == NOTHING_LEFT   # its results folder, empty, removed


def test_the_study_survives_the_death_of_the_bottlenecks_owner_and_says_what_tcp_got_through_it(tmp_path):
    out = tmp_path / "study"
    done = study("--policy", "auto", *FLOOD_ONLY, "--prometheus", "none", "--controllers", "2", "--fault", "7",
                 out=out)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    auto = summary["policies"]["auto"]
    (run,) = auto["repetitions"]
    fault, owners = run["fault"], summary["controllers"]["owners"]["auto"]
    assert fault["member"] == owners["s1"] and fault["dp_id"] == S1 and 6.5 <= fault["killed_s"] <= 8.5, fault
    # Mastered again as its socket closed, not when its lease ran out.
    assert fault["mastered_by"] not in (None, fault["member"]) and fault["remaster_seconds"] < 4, fault
    for step in [s for s in auto["steps"] if s["udp_mbps_offered"] in (10, 12)]:   # the flood the kill fell in
        assert step["faithful"], f"the claim rests on an unfaithful step: {step['fidelity_notes']}"
        assert step["tcp_mbps"] >= 0.9 * auto["tcp_reservation_mbps"], step
    assert f"- auto: {fault['member']}, the owner of switch {S1}, killed (kill -9)" in (out / "table.md").read_text()
    log = (out / f"controller-{fault['member']}.log").read_text()
    assert log.count("under os-ken; REST on") == 2       # started again once the traffic was over
    assert leftovers() == NOTHING_LEFT


def test_a_fault_without_a_cluster_is_refused_in_one_line(tmp_path):
    done = study("--policy", "auto", *FLOOD_ONLY, "--fault", "7", out=tmp_path / "r", timeout=60)
    assert (done.returncode, done.stderr) == \
        (2, "error: --fault: it kills a member of a cluster; give --controllers 2 or more with it\n")
    assert not (tmp_path / "r").exists()
