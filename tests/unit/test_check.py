"""The offline checker (controller/check.py), the normalised policy it prints
(controller/core/normalised.py) and the check against live bridges (controller/core/bridges.py),
all without Open vSwitch: OVSDB's answers are canned."""
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from controller import check
from controller.core.bridges import bridge_ports, check_bridges
from controller.core.normalised import normalised_document, percent
from controller.core.policy import PolicyError, load_document, parse_policy
from tests.unit.test_policy import MALFORMED
from tests.unit.test_rest import bare, make_app, put_json

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python"
SHIPPED = sorted((REPO / "policies").glob("*.yaml"))
STUDY_BRIDGES = {1: {1, 2, 3}, 2: {1, 3, 4}}


def run_checker(*args: str) -> subprocess.CompletedProcess:
    python = PYTHON if PYTHON.exists() else Path(sys.executable)
    return subprocess.run([str(python), "-m", "controller.check", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=30, preexec_fn=_memory_bound)


def _memory_bound() -> None:
    """A checker that reads a file whole dies of MemoryError here instead of exhausting the host's memory."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def write_policy(tmp_path: Path, document, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document))
    return path


def rich_policy_document() -> dict:
    return {"name": "rich", "description": "every kind of match",
            "classes": {"voice": {"queue": 1, "min": 1 / 3, "max": "50%", "dscp": 46},
                        "bulk": {"queue": 2, "min": "12.5%", "priority": 3}},
            "congestion": {"samples": 4, "hold_seconds": 1.5, "clear_loss_ratio": "0.05%"},
            "switches": {"edge": {"dp_id": 0xABCDEF, "flows": [
                {"priority": 40000, "class": "voice", "actions": [{"output": 1}],
                 "match": [{"in_port": 2, "udp_dst": 5060}, {"in_port": 2, "ipv4_src": "10.1.0.0/16"}]},
                {"priority": 30000, "match": {"ipv6_dst": "2001:db8::/48", "tcp_src": 443}, "actions": [{"output": 3}]},
                {"match": {"eth_type": "arp"}, "actions": [{"output": "flood"}]},
                {"match": {"eth_dst": "ff:ff:ff:ff:ff:ff"}, "actions": [{"output": "normal"}, {"output": 2}]}],
                "ports": {1: {"capacity": "100Mbit", "queues": "auto", "discipline": "fq_codel", "qos_type": "linux-htb"}}}}}


# --- the checker as a user runs it --------------------------------------------------------------------

def test_the_checker_prints_each_policy_normalised_and_exits_0():
    done = run_checker("policies/reserve.yaml", "policies/dumbbell.yaml")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("# policies/reserve.yaml\n---\nname: reserve\n")
    assert "\n# policies/dumbbell.yaml\n---\nname: dumbbell\n" in done.stdout
    assert "dp_id: 0x1\n" in done.stdout
    assert "match: {eth_type: 0x0800, in_port: 3, ip_proto: 17}" in done.stdout
    reserve, dumbbell = yaml.safe_load_all(done.stdout)
    assert parse_policy(reserve) == parse_policy(load_document(REPO / "policies" / "reserve.yaml"))
    assert parse_policy(dumbbell) == parse_policy(load_document(REPO / "policies" / "dumbbell.yaml"))


def test_the_checker_stops_at_the_first_bad_file_with_one_line_and_exit_2(tmp_path):
    doc = load_document(REPO / "policies" / "reserve.yaml")
    doc["switches"]["s1"]["flows"][2]["match"]["tcp_dst"] = 80
    bad = write_policy(tmp_path, doc)
    done = run_checker("policies/none.yaml", str(bad), "policies/nonexistent.yaml")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"error: {bad}: switches.s1.flows[2].match.tcp_dst: needs ip_proto tcp, not udp; remove "
                           "ip_proto (tcp_dst implies tcp) or use udp_dst\n")


def test_the_checker_names_a_file_it_cannot_read_once(tmp_path):
    done = run_checker(str(tmp_path / "gone.yaml"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"error: {tmp_path / 'gone.yaml'}: cannot read policy file (No such file or directory); "
                           "check the path\n")


@pytest.mark.parametrize("target", ["/dev/zero", "symlink to /dev/zero", "fifo"])
def test_the_checker_refuses_a_device_or_fifo_in_one_line_and_exits_2(tmp_path, target):
    path = Path(target) if target.startswith("/") else tmp_path / "p.yaml"
    if target == "fifo":
        os.mkfifo(path)
    elif path != Path(target):
        path.symlink_to("/dev/zero")
    done = run_checker(str(path))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"error: {path}: not a regular file (a directory, FIFO or device); give the path of a "
                           "file\n")


def test_the_checker_prints_the_json_the_rest_api_takes(tmp_path):
    done = run_checker("--json", "policies/auto.yaml", "policies/shared.yaml")
    auto, shared = (json.loads(line) for line in done.stdout.splitlines())
    assert auto["switches"]["s1"]["dp_id"] == 1 and auto["switches"]["s1"]["ports"]["1"]["queues"] == "auto"
    holder = bare(tmp_path)
    assert put_json(make_app(holder), auto) == (200, "application/json", {"applied": "auto", "changed": True,
                                                                          "revision": 1, "in_sync": True})
    assert holder.policy == parse_policy(load_document(REPO / "policies" / "auto.yaml"))
    assert parse_policy(shared) == parse_policy(load_document(REPO / "policies" / "shared.yaml"))


@pytest.mark.parametrize("change", [case[1] for case in MALFORMED], ids=[case[0] for case in MALFORMED])
def test_the_checker_refuses_the_bad_policy_corpus_with_the_rest_apis_message(change, tmp_path, capsys):
    doc = load_document(REPO / "policies" / "reserve.yaml")
    change(doc)
    code, _, body = put_json(make_app(bare(tmp_path / "core")), doc)
    assert code == 400
    path = write_policy(tmp_path, doc)
    assert check.main([str(path)]) == 2
    assert capsys.readouterr() == ("", f"error: {path}: {body['error']}\n")


# --- the normalised policy ----------------------------------------------------------------------------

@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_a_normalised_shipped_policy_parses_back_to_itself(path):
    policy = parse_policy(load_document(path))
    assert parse_policy(yaml.safe_load(check.render(str(path), policy, as_json=False))) == policy
    assert parse_policy(json.loads(check.render(str(path), policy, as_json=True))) == policy


def test_a_normalised_policy_spells_out_every_default_prerequisite_and_expanded_match():
    policy = parse_policy(rich_policy_document())
    assert parse_policy(yaml.safe_load(check.render("rich.yaml", policy, as_json=False))) == policy
    document = normalised_document(policy)
    assert document["classes"] == {"voice": {"queue": 1, "min": 1 / 3, "max": "50%", "dscp": 46, "priority": 0},
                                   "bulk": {"queue": 2, "min": "12.5%", "max": "100%", "dscp": 2, "priority": 3}}
    assert document["congestion"] == {"poll_interval": 1.0, "fast_poll_interval": 0.05, "utilisation": "90%", "loss_ratio": "1%", "samples": 4,
                                      "clear_utilisation": "50%", "clear_loss_ratio": "0.05%", "hold_seconds": 1.5,
                                      "shortfall": "10%"}
    edge = document["switches"]["edge"]
    assert edge["dp_id"].hex() == "0xabcdef"
    assert [(f["priority"], f["match"], f["actions"], f.get("class")) for f in edge["flows"]] == [
        (40000, {"eth_type": 0x0800, "in_port": 2, "ip_proto": 17, "udp_dst": 5060}, [{"output": 1}], "voice"),
        (40000, {"eth_type": 0x0800, "in_port": 2, "ipv4_src": "10.1.0.0/16"}, [{"output": 1}], "voice"),
        (30000, {"eth_type": 0x86DD, "ip_proto": 6, "ipv6_dst": "2001:db8::/48", "tcp_src": 443}, [{"output": 3}],
         None),
        (1000, {"eth_type": 0x0806}, [{"output": "flood"}], None),
        (1000, {"eth_dst": "ff:ff:ff:ff:ff:ff"}, [{"output": "normal"}, {"output": 2}], None)]
    assert edge["ports"] == {1: {"capacity": 100_000_000, "queues": "auto", "queue_packets": 1000,
                                 "discipline": "fq_codel", "qos_type": "linux-htb"}}


def test_the_yaml_writes_dp_id_and_eth_type_in_hex():
    text = check.render("rich.yaml", parse_policy(rich_policy_document()), as_json=False)
    assert "dp_id: 0xabcdef\n" in text
    assert "match: {eth_type: 0x86dd, ip_proto: 6, ipv6_dst: '2001:db8::/48', tcp_src: 443}" in text


@pytest.mark.parametrize("share, written", [(0.8, "80%"), (1.0, "100%"), (0.0, "0%"), (0.001, "0.1%"),
                                            (0.125, "12.5%"), (1 / 3, 1 / 3)])
def test_a_share_is_written_as_a_percentage_when_that_is_exact(share, written):
    assert percent(share) == written


# --- against live bridges -----------------------------------------------------------------------------

def test_the_study_policies_fit_the_study_bridges():
    for name in ("none", "reserve", "auto", "shared"):
        check_bridges(parse_policy(load_document(REPO / "policies" / f"{name}.yaml")), STUDY_BRIDGES)


def live_refusal(policy, bridges) -> str:
    with pytest.raises(PolicyError) as err:
        check_bridges(policy, bridges)
    return str(err.value)


def test_a_switch_without_a_bridge_is_named():
    policy = parse_policy(load_document(REPO / "policies" / "reserve.yaml"))
    assert live_refusal(policy, {1: {1, 2, 3}, 3: {1}}) == (
        "switches.s2.dp_id: no bridge has datapath_id 0000000000000002 (the bridges have 0000000000000001, "
        "0000000000000003); fix dp_id, or set the bridge's other-config:datapath-id")
    assert live_refusal(policy, {}).startswith("switches.s1.dp_id: no bridge has datapath_id 0000000000000001 "
                                               "(the bridges have none);")


@pytest.mark.parametrize("bridges, message", [
    ({1: {2, 3}, 2: {1, 3, 4}},
     "switches.s1.ports.1: bridge 0000000000000001 of switch s1 has no OpenFlow port 1 (it has 2, 3); "
     "fix the port number"),
    ({1: {1, 2}, 2: {1, 3, 4}},
     "switches.s1.flows[0].match.in_port: bridge 0000000000000001 of switch s1 has no OpenFlow port 3 (it has 1, 2); "
     "fix the port number"),
    ({1: {1, 2, 3}, 2: {1, 3}},
     "switches.s2.flows[0].actions[0].output: bridge 0000000000000002 of switch s2 has no OpenFlow port 4 "
     "(it has 1, 3); fix the port number"),
])
def test_a_port_the_bridge_lacks_is_named_with_its_switch(bridges, message):
    assert live_refusal(parse_policy(load_document(REPO / "policies" / "reserve.yaml")), bridges) == message


def test_an_in_port_in_a_list_of_matches_is_named_by_its_entry_and_reserved_outputs_need_no_port():
    policy = parse_policy(rich_policy_document())
    check_bridges(policy, {0xABCDEF: {1, 2, 3}})
    assert live_refusal(policy, {0xABCDEF: {1, 3}}) == (
        "switches.edge.flows[0].match[0].in_port: bridge 0000000000abcdef of switch edge has no OpenFlow port 2 "
        "(it has 1, 3); fix the port number")


def ovsdb_answer() -> list[dict]:
    """ovsdb-client transact's answer to the checker's three selects, in OVSDB's JSON."""
    return [{"rows": [{"datapath_id": "0000000000000001", "ports": ["set", [["uuid", "p1"], ["uuid", "p2"],
                                                                             ["uuid", "p3"]]]},
                      {"datapath_id": "00000000000000ff", "ports": ["uuid", "p4"]},
                      {"datapath_id": ["set", []], "ports": ["uuid", "p5"]}]},
            {"rows": [{"_uuid": ["uuid", "p1"], "interfaces": ["uuid", "i1"]},
                      {"_uuid": ["uuid", "p2"], "interfaces": ["set", [["uuid", "i2"], ["uuid", "i3"]]]},
                      {"_uuid": ["uuid", "p3"], "interfaces": ["uuid", "i4"]},
                      {"_uuid": ["uuid", "p4"], "interfaces": ["uuid", "i5"]},
                      {"_uuid": ["uuid", "p5"], "interfaces": ["uuid", "i6"]}]},
            {"rows": [{"_uuid": ["uuid", "i1"], "ofport": 1}, {"_uuid": ["uuid", "i2"], "ofport": 2},
                      {"_uuid": ["uuid", "i3"], "ofport": 7}, {"_uuid": ["uuid", "i4"], "ofport": -1},
                      {"_uuid": ["uuid", "i5"], "ofport": ["set", []]}, {"_uuid": ["uuid", "i6"], "ofport": 1}]}]


def test_ovsdbs_answer_becomes_each_bridges_openflow_ports():
    assert bridge_ports(ovsdb_answer()) == {1: {1, 2, 7}, 0xFF: set()}


def test_an_ovsdb_error_in_the_answer_is_refused():
    answer = ovsdb_answer()
    answer[1] = {"error": "unknown table", "details": "No table named Port."}
    with pytest.raises(ValueError, match="^OVSDB refused the read: unknown table$"):
        bridge_ports(answer)


def test_the_bridges_are_read_with_selects_only(monkeypatch):
    seen = []

    def fake_run(command, **kwargs):
        seen.append(command)
        return subprocess.CompletedProcess(command, 0, json.dumps(ovsdb_answer()), "")

    monkeypatch.setattr(check.subprocess, "run", fake_run)
    assert check.read_bridges("unix:/run/db.sock") == {1: {1, 2, 7}, 0xFF: set()}
    (command,) = seen
    assert command[:3] == ["ovsdb-client", "transact", "unix:/run/db.sock"]
    database, *operations = json.loads(command[3])
    assert database == "Open_vSwitch"
    assert {op["op"] for op in operations} == {"select"}


@pytest.mark.parametrize("failure, reason", [
    (FileNotFoundError(2, "No such file"), "ovsdb-client is not installed (Debian: openvswitch-common)"),
    (subprocess.TimeoutExpired("ovsdb-client", 10), "no answer within 10 s"),
    (subprocess.CalledProcessError(1, "ovsdb-client", "", "ovsdb-client: failed to connect to \"unix:/x\" "
                                                          "(No such file or directory)\n"),
     "ovsdb-client: failed to connect to \"unix:/x\" (No such file or directory)"),
])
def test_ovsdb_that_cannot_be_read_is_one_error_naming_the_remote(monkeypatch, failure, reason):
    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(check.subprocess, "run", fail)
    with pytest.raises(PolicyError) as err:
        check.read_bridges("unix:/x")
    assert str(err.value) == (f"--ovsdb unix:/x: cannot read the bridges ({reason}); check that Open vSwitch runs "
                              "and the remote is right")


def test_the_checker_with_ovsdb_checks_every_file_against_the_bridges(monkeypatch, capsys):
    remotes = []
    bridges = [STUDY_BRIDGES, {1: {1, 2, 3}, 2: {1, 3}}]
    monkeypatch.setattr(check, "read_bridges", lambda remote: remotes.append(remote) or bridges[len(remotes) - 1])
    assert check.main(["policies/shared.yaml", "policies/reserve.yaml", "--ovsdb", "unix:/run/db.sock"]) == 0
    assert capsys.readouterr().out.startswith("# policies/shared.yaml\n---\n")
    assert check.main(["policies/shared.yaml", "policies/reserve.yaml", "--ovsdb", "unix:/run/db.sock"]) == 2
    assert capsys.readouterr() == ("", "error: policies/shared.yaml: switches.s2.flows[3].actions[0].output: bridge "
                                       "0000000000000002 of switch s2 has no OpenFlow port 4 (it has 1, 3); fix the "
                                       "port number\n")
    assert remotes == ["unix:/run/db.sock"] * 2


def test_the_checker_reads_ovsdb_only_after_every_file_is_valid(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(check, "read_bridges", lambda remote: pytest.fail("OVSDB read for an invalid policy"))
    bad = write_policy(tmp_path, {"name": "p"})
    assert check.main([str(bad), "--ovsdb", "unix:/run/db.sock"]) == 2
    assert capsys.readouterr().err == f"error: {bad}: switches: no switch defined; add a network: section for " \
                                      "every switch, or a switch with dp_id and flows\n"



def test_a_base_that_is_not_a_policy_is_refused_without_a_word_of_its_content(tmp_path, capsys):
    secret = tmp_path / "shadow"
    secret.write_text("root:$y$j9T$s3cretHashNobodyMaySee:19000:0:99999:7:::\nbin:*:19000:0:99999:7:::\n")
    policy = tmp_path / "p.yaml"
    policy.write_text(f"base: {secret}\nname: p\n")
    assert check.main([str(policy)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {policy}: policy: a key that is not a field name (is this a policy file?); use only "
                   "name, description, classes, switches, network, congestion\n")
    assert "s3cret" not in err and "root:" not in err
