"""topo/harness/cluster.py and the main study's --controllers, without root: the members' names and ports,
the statuses seen as one, the refusals before anything starts, and a dead run's etcd data removed."""
import pytest

from controller.core.cluster import Ring
from topo.harness import cluster
from topo.harness.controller import ControllerError
from topo.harness.host import RunRecord, remove_leftovers
from topo.studies import STUDIES
from topo.studies.base import UsageError, parser_for
from topo.studies.main.report import owners_line


def plan(*argv: str):
    study = STUDIES["main"]
    return study.plan(parser_for(study, "topo/run.py").parse_args(["--policy", "auto", *argv]))


def test_members_have_their_own_ports_and_the_ring_shares_the_studys_two_switches():
    assert cluster.members(3) == [cluster.Member("c1", 6653, 8080, 9101), cluster.Member("c2", 6654, 8081, 9111),
                                  cluster.Member("c3", 6655, 8082, 9121)]
    for count in range(2, cluster.MAX_MEMBERS + 1):
        ring = Ring([m.name for m in cluster.members(count)])
        assert ring.owner(1) != ring.owner(2), count     # s1 and s2: the names are chosen for it
    ports = cluster.ports(cluster.MAX_MEMBERS)
    assert len(set(ports)) == len(ports) and 9102 not in ports and 9090 not in ports


def test_the_statuses_are_one_each_switch_its_owners_and_every_decision_named():
    def switch(owner, role):
        return {"bridge": "s1", "owner": owner, "role": role, "ports": {}}
    statuses = {"c1": {"role": "member", "policy": "auto", "cluster": {"ring": ["c1", "c2"]},
                       "switches": {"01": switch("c2", "slave"), "02": switch("c1", "master")},
                       "decisions": [{"time": 5.0, "action": "rollback"}]},
                "c2": {"role": "member", "policy": "auto", "cluster": {"ring": ["c1", "c2"]},
                       "switches": {"01": switch("c2", "master"), "02": switch("c1", "slave"),
                                    "03": switch("c2", "slave")},      # not yet confirmed master: absent
                       "decisions": [{"time": 1.0, "action": "program"}]}}
    merged = cluster.merged(statuses)
    assert {dp: sw["member"] for dp, sw in merged["switches"].items()} == {"01": "c2", "02": "c1"}
    assert [(d["member"], d["action"]) for d in merged["decisions"]] == [("c2", "program"), ("c1", "rollback")]
    assert merged["members"] == {"c1": {"role": "member", "ring": ["c1", "c2"]},
                                 "c2": {"role": "member", "ring": ["c1", "c2"]}}
    assert merged["policy"] == "auto"


@pytest.mark.parametrize("value", ["0", "x", "9", "-1", "2.5"])
def test_a_bad_count_is_refused_naming_the_flag(value):
    with pytest.raises(UsageError, match=rf"^--controllers {value}: give a whole number from 1 to 8 "):
        plan("--controllers", value)


def test_one_controller_is_the_default_and_the_exporter_may_not_take_a_members_port():
    assert plan().controllers == 1 and plan("--controllers", "3").controllers == 3
    with pytest.raises(UsageError, match=r"^--metrics-port 9111: a port of the --controllers 2 members"):
        plan("--controllers", "2", "--metrics-port", "9111")


def test_the_host_is_checked_first_etcd_then_every_port(monkeypatch):
    monkeypatch.setattr(cluster.shutil, "which", lambda name: None)
    with pytest.raises(ControllerError, match=r"^--controllers 3: etcd is not installed; run scripts/setup.sh"):
        cluster.check_host(3)
    monkeypatch.setattr(cluster.shutil, "which", lambda name: "/usr/bin/etcd")
    monkeypatch.setattr(cluster, "listening", lambda addr: addr == ("127.0.0.1", 6653))
    with pytest.raises(ControllerError, match=r"^--controllers 3: 127.0.0.1:6653 is in use .* OpenFlow 6653-6655, "
                                              r"REST 8080-8082, metrics 9101-9121 and etcd 23793-23794"):
        cluster.check_host(3)
    monkeypatch.setattr(cluster, "listening", lambda addr: False)
    cluster.check_host(3)


def test_a_dead_runs_directories_are_removed(tmp_path):
    data = tmp_path / "ovsqos-etcd-x"
    (data / "data").mkdir(parents=True)
    RunRecord(tmp_path, tmp_path / "out").directory(data)
    assert remove_leftovers(tmp_path / "run.json") == [f"directory {data}"]
    assert not data.exists()


def test_the_table_says_who_owned_which_switch():
    summary = {"controllers": {**cluster.described(2), "owners": {"none": {"s1": "c2", "s2": "c1"}}}}
    assert owners_line(summary) == "\n2 controllers (c1, c2) shared the switches through etcd; none: s1 owned by " \
                                   "c2, s2 by c1.\n"
    assert owners_line({}) == ""
