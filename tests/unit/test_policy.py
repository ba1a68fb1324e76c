"""controller/core/policy.py: the shipped policies, rates, shares, and one-line errors that name the field."""
import copy
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.core.congestion import CongestionConfig
from controller.core.policy import Police, PolicyError, delay_us, load_document, parse_policy, parse_rate

POLICIES = Path(__file__).resolve().parents[2] / "policies"
SHIPPED = sorted(POLICIES.glob("*.yaml"))


def shipped(name: str) -> dict:
    """A fresh copy of a shipped policy document (its base merged in), to be changed by a test."""
    return load_document(POLICIES / f"{name}.yaml")


# --- the shipped policies ---------------------------------------------------------------------------

STUDY = ("none", "reserve", "auto")


def test_the_studys_three_policies_are_shipped():
    assert set(STUDY) <= {p.stem for p in SHIPPED}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_policy_loads_under_its_file_name(path):
    policy = parse_policy(load_document(path))
    assert policy.name == path.stem
    assert policy.description
    assert policy.switches
    assert len({s.dp_id for s in policy.switches}) == len(policy.switches)


@pytest.mark.parametrize("name", STUDY)
def test_the_study_policies_share_classes_and_topology(name):
    policy = parse_policy(load_document(POLICIES / f"{name}.yaml"))
    assert {c.name for c in policy.classes} == {"voice", "tcp", "udp"}
    assert [s.name for s in policy.switches] == ["s1", "s2"]
    assert [s.dp_id for s in policy.switches] == [1, 2]
    assert [p.capacity_bps for s in policy.switches for p in s.ports] == [5_000_000, 5_000_000]


def test_auto_has_its_congestion_settings():
    policy = parse_policy(load_document(POLICIES / "auto.yaml"))
    assert policy.poll_interval == 1.0
    assert policy.fast_poll_interval == 0.05
    assert policy.congestion == CongestionConfig(utilisation=0.9, loss_ratio=0.01, samples=2,
                                                 clear_utilisation=0.5, clear_loss_ratio=0.001,
                                                 hold_seconds=3.0, shortfall=0.05)
    assert policy.switch(1).port(1).queues == "auto"


def test_reserve_reserves_the_bottleneck_port_of_s1_only():
    policy = parse_policy(load_document(POLICIES / "reserve.yaml"))
    s1 = policy.switch(1)
    assert s1.name == "s1"
    assert s1.port(1).queues == "reserve"
    assert s1.port(1).capacity_bps == 5_000_000
    assert policy.switch(2).port(1).queues == "fifo"
    assert policy.switch(3) is None


def test_none_queues_every_port_fifo_and_uses_default_congestion_settings():
    policy = parse_policy(load_document(POLICIES / "none.yaml"))
    assert {p.queues for s in policy.switches for p in s.ports} == {"fifo"}
    assert policy.congestion == CongestionConfig()
    # What a policy without a congestion: section gets, as numbers: a default moved is a change users see.
    assert CongestionConfig() == CongestionConfig(utilisation=0.9, loss_ratio=0.01, samples=2, clear_utilisation=0.5,
                                                  clear_loss_ratio=0.001, hold_seconds=3.0, shortfall=0.1)
    assert (policy.poll_interval, policy.fast_poll_interval) == (1.0, 0.05)


def test_reserve_classes_and_their_flows():
    policy = parse_policy(load_document(POLICIES / "reserve.yaml"))
    tcp, udp = policy.traffic_class("tcp"), policy.traffic_class("udp")
    assert (tcp.queue, tcp.min_share, tcp.max_share, tcp.dscp) == (1, 0.8, 1.0, 1)
    assert (udp.queue, udp.min_share, udp.max_share, udp.dscp) == (2, 0.1, 1.0, 2)
    udp_flow = policy.switch(1).flows[2]
    assert udp_flow.priority == 40000
    assert dict(udp_flow.match) == {"in_port": 3, "ip_proto": 17, "eth_type": 0x0800}
    assert udp_flow.outputs == (1,)
    assert udp_flow.traffic_class == "udp"
    assert policy.switch(1).flows[0].traffic_class is None


# --- rates and shares -------------------------------------------------------------------------------

@pytest.mark.parametrize("value, bps", [
    ("1bit", 1),
    ("5Mbit", 5_000_000),
    ("500kbit", 500_000),
    (5000000, 5_000_000),
    ("1.5Gbit", 1_500_000_000),
    ("5mbit", 5_000_000),
    (" 64 kbit ", 64_000),
    ("1200", 1200),
])
def test_parse_rate_gives_bits_per_second(value, bps):
    assert parse_rate(value, "capacity") == bps


@pytest.mark.parametrize("value", ["fast", -1, True, "5Mbps", "", 0, "0kbit"])
def test_parse_rate_rejects_what_is_not_a_positive_rate(value):
    with pytest.raises(PolicyError) as err:
        parse_rate(value, "switches.s1.ports.1.capacity")
    message = str(err.value)
    assert message.startswith("switches.s1.ports.1.capacity: ")
    assert "5Mbit" in message


@pytest.mark.parametrize("value", [0.5, "0.5bit"])
def test_parse_rate_rejects_a_rate_that_truncates_to_zero(value):
    with pytest.raises(PolicyError, match=r"^capacity: "):
        parse_rate(value, "capacity")


@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_parse_rate_rejects_non_finite_numbers_naming_the_field(value):
    with pytest.raises(PolicyError, match=r"^capacity: "):
        parse_rate(value, "capacity")


def with_tcp_min(value) -> dict:
    doc = shipped("reserve")
    doc["classes"]["tcp"]["min"] = value
    return doc


@pytest.mark.parametrize("value", ["80%", 0.8, "0.8", " 80% "])
def test_a_share_is_a_percentage_or_a_fraction(value):
    assert parse_policy(with_tcp_min(value)).traffic_class("tcp").min_share == pytest.approx(0.8)


@pytest.mark.parametrize("value", ["120%", -0.1, "most", 1.5])
def test_a_share_outside_0_to_100_percent_names_the_field(value):
    with pytest.raises(PolicyError, match=r"^classes\.tcp\.min: "):
        parse_policy(with_tcp_min(value))


def test_min_shares_adding_up_to_exactly_100_percent_are_accepted():
    doc = shipped("reserve")
    doc["classes"] = {"a": {"queue": 1, "min": "33%"}, "b": {"queue": 2, "min": "56%"},
                      "c": {"queue": 3, "min": "11%"}}
    for flow in doc["switches"]["s1"]["flows"]:
        flow.pop("class", None)
    del doc["network"]
    policy = parse_policy(doc)
    assert [c.min_share for c in policy.classes] == pytest.approx([0.33, 0.56, 0.11])


# --- malformed documents ----------------------------------------------------------------------------

def s1_flow(doc: dict, index: int) -> dict:
    return doc["switches"]["s1"]["flows"][index]


def _set(mapping: dict, key, value) -> None:
    mapping[key] = value


MALFORMED = [
    # (id, change to the shipped reserve document, path the message starts with, words it contains)
    ("unknown top-level key", lambda d: _set(d, "colour", "blue"), "policy.colour", "unknown key"),
    ("missing name", lambda d: d.pop("name"), "name", "missing or empty; give it a name"),
    ("name with an unpaired surrogate", lambda d: _set(d, "name", "\ud800"), "name", "1-64 printable characters"),
    ("name with a NUL", lambda d: _set(d, "name", "res\x00erve"), "name", "1-64 printable characters"),
    ("class name with a NUL", lambda d: _set(d, "classes", {"tc\x00p" if k == "tcp" else k: v
                                                             for k, v in d["classes"].items()}),
     "classes.'tc\\x00p'", "1-64 printable characters"),
    ("switch name of 65 characters", lambda d: _set(d, "switches", {"s" * 65: d["switches"]["s1"]}),
     "switches.'" + "s" * 36 + "...", "1-64 printable characters"),
    ("description with a control character", lambda d: _set(d, "description", "a\x1bb"), "description",
     "not plain text"),
    ("capacity of 401 digits", lambda d: _set(d["switches"]["s1"]["ports"][1], "capacity", 10**400),
     "switches.s1.ports.1.capacity", "is above 34359738360 bit/s"),
    ("police rate of 401 digits", lambda d: _set(d["classes"]["udp"], "police", {"rate": "1" * 401}),
     "classes.udp.police.rate", "is above 34359738360 bit/s"),
    ("class as a list", lambda d: _set(s1_flow(d, 2), "class", []), "switches.s1.flows[2].class",
     "[] is not a class name"),
    ("class as a mapping", lambda d: _set(s1_flow(d, 2), "class", {}), "switches.s1.flows[2].class",
     "{} is not a class name"),
    ("empty switches", lambda d: _set(d, "switches", {}) or d.pop("network"), "switches", "no switch defined"),
    ("bad dp_id", lambda d: _set(d["switches"]["s1"], "dp_id", "one"), "switches.s1.dp_id",
     "not a whole number"),
    ("duplicate dp_id", lambda d: _set(d["switches"]["s2"], "dp_id", 1), "switches", "share a dp_id"),
    ("unknown match field", lambda d: _set(s1_flow(d, 0)["match"], "vlan_vid", 5),
     "switches.s1.flows[0].match.vlan_vid", "unknown match field"),
    ("ip_proto udpp", lambda d: _set(s1_flow(d, 2)["match"], "ip_proto", "udpp"),
     "switches.s1.flows[2].match.ip_proto", "not a protocol"),
    ("tcp_dst under ip_proto udp", lambda d: _set(s1_flow(d, 2)["match"], "tcp_dst", 80),
     "switches.s1.flows[2].match.tcp_dst", "needs ip_proto tcp, not udp"),
    ("class not defined", lambda d: _set(s1_flow(d, 2), "class", "video"), "switches.s1.flows[2].class",
     "'video' is not defined under classes"),
    ("classified flow with two outputs", lambda d: _set(s1_flow(d, 2), "actions", [{"output": 1}, {"output": 2}]),
     "switches.s1.flows[2].class", "exactly one output"),
    ("classified flow without an IP match", lambda d: _set(s1_flow(d, 0), "class", "tcp"),
     "switches.s1.flows[0].class", "IP packets only"),
    ("qos_type cbq", lambda d: _set(d["switches"]["s1"]["ports"][1], "qos_type", "linux-cbq"),
     "switches.s1.ports.1.qos_type", "'linux-cbq' is not one of linux-htb, linux-hfsc"),
    ("min above max", lambda d: _set(d["classes"]["udp"], "max", "5%"), "classes.udp.max",
     "below classes.udp.min"),
    ("mins over 100%", lambda d: _set(d["classes"]["udp"], "min", "30%"), "classes",
     "add up to more than 100%"),
    ("duplicate queue id", lambda d: _set(d["classes"]["udp"], "queue", 1), "classes", "share a queue"),
    ("port without capacity", lambda d: _set(d["switches"]["s1"]["ports"], 1, {"queues": "reserve"}),
     "switches.s1.ports.1.capacity", "missing"),
    ("queues fast", lambda d: _set(d["switches"]["s1"]["ports"][1], "queues", "fast"),
     "switches.s1.ports.1.queues", "'fast' is not one of fifo, reserve, auto"),
    ("clear_utilisation above utilisation",
     lambda d: _set(d, "congestion", {"utilisation": "50%", "clear_utilisation": "60%"}),
     "congestion.clear_utilisation", "above congestion.utilisation"),
    ("actions not a list", lambda d: _set(s1_flow(d, 0), "actions", {"output": 1}),
     "switches.s1.flows[0].actions", "expected a list, got dict"),
    ("output nowhere", lambda d: _set(s1_flow(d, 0), "actions", [{"output": "nowhere"}]),
     "switches.s1.flows[0].actions[0].output", "'nowhere' is not a port; use a number from 1 to 65279 or one of normal"),
    ("unknown class key", lambda d: _set(d["classes"]["tcp"], "burst", 10), "classes.tcp.burst", "unknown key"),
    ("police without rate", lambda d: _set(d["classes"]["udp"], "police", {"burst": "10kbit"}),
     "classes.udp.police.rate", "missing"),
    ("police below 1kbit", lambda d: _set(d["classes"]["udp"], "police", {"rate": "500bit"}),
     "classes.udp.police.rate", "below 1kbit"),
    ("police burst below 1kbit", lambda d: _set(d["classes"]["udp"], "police", {"rate": "1Mbit", "burst": 100}),
     "classes.udp.police.burst", "below 1kbit"),
    ("police unknown key", lambda d: _set(d["classes"]["udp"], "police", {"rate": "1Mbit", "colour": "red"}),
     "classes.udp.police.colour", "unknown key"),
    ("police not a mapping", lambda d: _set(d["classes"]["udp"], "police", "1Mbit"),
     "classes.udp.police", "expected a mapping"),
    ("switches not a mapping", lambda d: _set(d, "switches", ["s1", "s2"]), "switches",
     "expected a mapping of keys to values, got list"),
    ("switch not a mapping", lambda d: _set(d["switches"], "s1", [1]), "switches.s1",
     "expected a mapping of keys to values, got list"),
    ("unknown switch key", lambda d: _set(d["switches"]["s1"], "colour", "red"), "switches.s1.colour", "unknown key"),
    ("ovsdb not a remote", lambda d: _set(d["switches"]["s1"], "ovsdb", "http://db"), "switches.s1.ovsdb",
     "'http://db' is not an OVSDB remote"),
    ("port not a mapping", lambda d: _set(d["switches"]["s1"]["ports"], 1, "5Mbit"), "switches.s1.ports.1",
     "expected a mapping of keys to values, got str"),
    ("unknown port key", lambda d: _set(d["switches"]["s1"]["ports"][1], "colour", "red"), "switches.s1.ports.1.colour",
     "unknown key"),
    ("unknown flow key", lambda d: _set(s1_flow(d, 0), "colour", "red"), "switches.s1.flows[0].colour", "unknown key"),
    ("flow not a mapping", lambda d: _set(d["switches"]["s1"]["flows"], 0, "output:1"),   # YAML's `- output:1`
     "switches.s1.flows[0]", "expected a mapping of keys to values, got str"),
    ("eth_dst not a MAC", lambda d: _set(s1_flow(d, 5)["match"], "eth_dst", "00:00:00:00:02"),
     "switches.s1.flows[5].match.eth_dst", "'00:00:00:00:02' is not a MAC address"),
    ("action not a mapping", lambda d: _set(s1_flow(d, 0), "actions", [1]), "switches.s1.flows[0].actions[0]",
     "expected a mapping of keys to values, got int"),
    ("action unknown", lambda d: _set(s1_flow(d, 0), "actions", [{"output": 1, "drop": True}]),
     "switches.s1.flows[0].actions[0].drop", "unknown key"),
    ("action without output", lambda d: _set(s1_flow(d, 0), "actions", [{}]), "switches.s1.flows[0].actions[0]",
     "missing output; write {output: 1}"),
    ("discipline tulip", lambda d: _set(d["switches"]["s1"]["ports"][1], "discipline", "tulip"),
     "switches.s1.ports.1.discipline", "'tulip' is not one of fifo, sfq, codel, fq_codel, red"),
]


@pytest.mark.parametrize("change, path, words", [case[1:] for case in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_a_malformed_policy_names_the_bad_field_in_one_line(change, path, words):
    doc = shipped("reserve")
    parse_policy(copy.deepcopy(doc))   # the document was valid before the change
    change(doc)
    with pytest.raises(PolicyError) as err:
        parse_policy(doc)
    message = str(err.value)
    assert message.startswith(path + ": "), message
    assert words in message
    assert "\n" not in message


def test_a_document_that_is_not_a_mapping_is_refused():
    with pytest.raises(PolicyError, match=r"^policy: expected a mapping of keys to values, got list$"):
        parse_policy(["name", "switches"])


def test_ip_proto_given_as_a_list_is_a_policy_error():
    doc = shipped("reserve")
    s1_flow(doc, 2)["match"]["ip_proto"] = ["tcp", "udp"]
    with pytest.raises(PolicyError, match=r"^switches\.s1\.flows\[2\]\.match\.ip_proto: "):
        parse_policy(doc)


def test_an_infinite_priority_is_a_policy_error():
    doc = shipped("reserve")
    s1_flow(doc, 0)["priority"] = float("inf")   # YAML: priority: .inf
    with pytest.raises(PolicyError, match=r"^switches\.s1\.flows\[0\]\.priority: "):
        parse_policy(doc)


def test_police_holds_a_class_to_a_rate_with_a_burst_of_100_ms_unless_given():
    policy = parse_policy(load_document(POLICIES / "police.yaml"))
    assert policy.traffic_class("udp").police == Police(rate_kbps=500, burst_kbits=50)
    assert policy.traffic_class("tcp").police is None
    assert {p.queues for s in policy.switches for p in s.ports} == {"fifo"}
    doc = shipped("reserve")
    doc["classes"]["udp"]["police"] = {"rate": "2Mbit"}
    assert parse_policy(doc).traffic_class("udp").police == Police(2000, 200)


def test_a_policy_over_a_policing_base_may_drop_police_with_null(tmp_path):
    (tmp_path / "mine.yaml").write_text(f"base: {POLICIES / 'police.yaml'}\nname: mine\n"
                                        "classes:\n  udp: {police: null}\n")
    assert parse_policy(load_document(tmp_path / "mine.yaml")).traffic_class("udp").police is None


def test_the_same_port_twice_is_refused():
    doc = shipped("reserve")
    doc["switches"]["s1"]["ports"]["1"] = {"capacity": "1Mbit", "queues": "fifo"}
    with pytest.raises(PolicyError, match=r"^switches\.s1\.ports"):
        parse_policy(doc)


# --- loading files ----------------------------------------------------------------------------------

def test_loading_a_missing_file_names_its_path(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(PolicyError) as err:
        parse_policy(load_document(path))
    message = str(err.value)
    assert message.startswith(f"{path}: cannot read policy file")
    assert "No such file or directory" in message
    assert "\n" not in message


def test_loading_invalid_yaml_names_its_path_in_one_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nswitches: {s1: [dp_id: 1\n")
    with pytest.raises(PolicyError) as err:
        parse_policy(load_document(path))
    message = str(err.value)
    assert message.startswith(f"{path}: not valid YAML (")
    assert message.endswith("fix the syntax")
    assert "\n" not in message


def test_loading_a_file_that_parses_but_is_wrong_reports_the_field(tmp_path):
    path = tmp_path / "p.yaml"
    document = shipped("reserve")
    del document["network"]       # its ports' queues are read first
    path.write_text(yaml.safe_dump(document).replace("queues: reserve", "queues: fast"))
    with pytest.raises(PolicyError, match=r"^switches\.s1\.ports\.1\.queues: 'fast'"):
        parse_policy(load_document(path))


def test_loading_a_binary_file_names_its_path(tmp_path):
    path = tmp_path / "policy.yaml.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe")
    with pytest.raises(PolicyError, match="^" + re.escape(f"{path}: ")):
        parse_policy(load_document(path))


def unblocked(read: Callable[[], Any]) -> Any:
    """`read()`'s result or error, failing (instead of hanging the suite) if it blocks, as reading a FIFO
    without a writer does."""
    outcome: list[Any] = []

    def attempt() -> None:
        try:
            outcome.append(read())
        except Exception as err:   # noqa: BLE001 - handed to the test, which asserts what it is
            outcome.append(err)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(30)
    assert outcome, "still reading: it blocks on a file that is not a regular one"
    return outcome[0]


def not_a_file(tmp_path: Path, kind: str) -> Path:
    """A FIFO, a directory or a file one byte over the limit, each where a policy or state file is expected."""
    path = tmp_path / "p.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"#" * (1024 * 1024 + 1))
    return path


@pytest.mark.parametrize("kind, words", [("fifo", "not a regular file"), ("directory", "not a regular file"),
                                         ("too large", "more than the 1048576 bytes")])
def test_a_policy_file_that_is_not_a_regular_file_within_1_mib_is_refused_in_one_line(tmp_path, kind, words):
    path = not_a_file(tmp_path, kind)
    err = unblocked(lambda: load_document(path))
    assert isinstance(err, PolicyError)
    assert str(err).startswith(f"{path}: {words}") and "\n" not in str(err)


def test_a_key_that_is_a_list_or_a_mapping_is_one_line_naming_it(tmp_path):
    path = tmp_path / "k.yaml"
    path.write_text("name: p\n? [a, b]\n: c\n")
    with pytest.raises(PolicyError) as err:
        load_document(path)
    assert str(err.value) == f"{path}: line 2: key ['a', 'b'] is a list or mapping; a key is a name or a number"


def test_class_priority_is_validated_and_voice_is_served_first_and_tcp_borrows_before_udp_in_the_shipped_policies():
    reserve = parse_policy(load_document(POLICIES / "reserve.yaml"))
    assert {c.name: c.priority for c in reserve.classes} == {"voice": 0, "tcp": 1, "udp": 2}
    doc = {"name": "p", "classes": {"tcp": {"queue": 1, "priority": 9}}, "switches": {"s1": {"dp_id": 1}}}
    with pytest.raises(PolicyError, match=r"^classes\.tcp\.priority: 9 is not a whole number from 0 to 7$"):
        parse_policy(doc)


@pytest.mark.parametrize("value, us", [("10ms", 10_000), ("500us", 500), ("0.1s", 100_000), ("2.5ms", 2_500), ("0ms", 0),
                                       ("60s", 60_000_000)])
def test_a_delay_is_read_in_microseconds(value, us):
    assert delay_us(value, "delay") == us


@pytest.mark.parametrize("value, message", [("10", "'10' is not a delay; write e.g. 10ms"),
                                            ("10 ms", "'10 ms' is not a delay"),
                                            ("61s", "'61s' is longer than a minute"),
                                            ("60000001us", "'60000001us' is longer than a minute")])
def test_a_delay_without_its_unit_or_beyond_a_minute_is_refused(value, message):
    with pytest.raises(PolicyError, match=f"^external_ids:ovs-qos-delay: {message}"):
        delay_us(value, "external_ids:ovs-qos-delay")


def _move_port(doc: dict, value) -> None:
    ports = doc["switches"]["s1"]["ports"]
    ports[value] = ports.pop(1)


WHOLE = [
    # (id, where the number goes in the shipped reserve document, the field the message names, a whole value there)
    ("class queue", lambda d, v: _set(d["classes"]["udp"], "queue", v), "classes.udp.queue", 2.0),
    ("class priority", lambda d, v: _set(d["classes"]["udp"], "priority", v), "classes.udp.priority", 2.0),
    ("flow priority", lambda d, v: _set(s1_flow(d, 0), "priority", v), "switches.s1.flows[0].priority", 1234.0),
    ("dp_id", lambda d, v: _set(d["switches"]["s1"], "dp_id", v), "switches.s1.dp_id", 3.0),
    ("port", _move_port, "switches.s1.ports", 2.0),
    ("in_port", lambda d, v: _set(s1_flow(d, 0)["match"], "in_port", v), "switches.s1.flows[0].match.in_port", 4.0),
    ("output", lambda d, v: _set(s1_flow(d, 0), "actions", [{"output": v}]), "switches.s1.flows[0].actions[0].output",
     2.0),
]


@pytest.mark.parametrize("change, path, whole", [case[1:] for case in WHOLE], ids=[c[0] for c in WHOLE])
def test_a_fraction_where_a_whole_number_is_meant_is_refused_and_a_whole_one_written_as_a_float_taken(change, path,
                                                                                                      whole):
    doc = shipped("reserve")
    change(doc, 1.5)
    with pytest.raises(PolicyError) as err:
        parse_policy(doc)
    assert str(err.value).startswith(path) and "1.5 is not a whole number" in str(err.value), str(err.value)
    doc = shipped("reserve")
    change(doc, whole)                              # 2.0 is the whole number 2 (YAML and JSON may write it so)
    parse_policy(doc)


@pytest.mark.parametrize("capacity, accepted", [("1kbit", True), ("999bit", False)])
def test_a_port_of_1kbit_is_the_slowest_taken(capacity, accepted):
    doc = shipped("reserve")
    doc["switches"]["s1"]["ports"][1]["capacity"] = capacity
    if accepted:
        assert parse_policy(doc).switch(1).port(1).capacity_bps == 1000
    else:
        with pytest.raises(PolicyError, match=r"^switches\.s1\.ports\.1\.capacity: '999bit' is 999 bit/s, below the 1kbit"):
            parse_policy(doc)


def test_a_network_class_rule_is_at_priority_40000_unless_given_and_knows_its_keys():
    rule = {"match": {"ip_proto": "tcp"}, "class": "tcp"}
    document = {"name": "p", "classes": {"tcp": {"queue": 1, "min": "50%"}}, "network": {"classify": [rule]}}
    assert [r.priority for r in parse_policy(document).network.classify] == [40000]
    document["network"]["classify"] = [rule, dict(rule, priority=40000)]
    with pytest.raises(PolicyError, match=r"^network\.classify\[1\]\.match: the same priority and match as "
                                          r"network\.classify\[0\]\.match"):
        parse_policy(document)
    document["network"]["classify"] = [dict(rule, colour="red")]
    with pytest.raises(PolicyError, match=r"^network\.classify\[0\]\.colour: unknown key"):
        parse_policy(document)
    document["network"] = {"ports": {"queues": "fifo", "colour": "red"}}
    with pytest.raises(PolicyError, match=r"^network\.ports\.colour: unknown key"):
        parse_policy(document)


def test_the_fastest_rate_is_the_one_linux_htb_takes_and_not_a_bit_more():
    """OVS hands the kernel each rate as 32-bit bytes per second."""
    assert parse_rate(str((2**32 - 1) * 8), "rate") == 34_359_738_360
    with pytest.raises(PolicyError, match="is above 34359738360 bit/s"):
        parse_rate(str((2**32 - 1) * 8 + 1), "rate")


def test_a_class_named_by_a_number_is_taken_and_one_named_yes_or_no_is_refused():
    """YAML reads `7:` as a number (a fine name) and `yes:` as true (a slip, not a name)."""
    doc = {"name": "p", "classes": {7: {"queue": 1}}, "network": {"ports": {"queues": "fifo"}}}
    assert [c.name for c in parse_policy(doc).classes] == ["7"]
    doc["classes"] = {True: {"queue": 1}}
    with pytest.raises(PolicyError, match=r"^classes\.True: "):
        parse_policy(doc)


@pytest.mark.parametrize("queue, accepted", [(0xfffe, True), (0xffff, False)])
def test_a_class_queue_is_at_most_65534(queue, accepted):
    """Queue N is HTB class 1:(N+1), and a class id is 16 bits."""
    doc = shipped("reserve")
    doc["classes"]["udp"].update(queue=queue, dscp=2)
    if accepted:
        assert parse_policy(doc).traffic_class("udp").queue == queue
    else:
        with pytest.raises(PolicyError, match=r"^classes\.udp\.queue: 65535 is not a whole number from 1 to 65534"):
            parse_policy(doc)


def test_a_class_given_its_queue_alone_reserves_nothing_may_take_all_and_is_marked_with_its_queue():
    doc = {"name": "p", "classes": {"bulk": {"queue": 5}}, "network": {"ports": {"queues": "fifo"}}}
    bulk = parse_policy(doc).traffic_class("bulk")
    assert (bulk.min_share, bulk.max_share, bulk.dscp, bulk.priority, bulk.police) == (0.0, 1.0, 5, 0, None)


def test_a_class_whose_max_is_its_min_is_taken():
    doc = shipped("reserve")
    doc["classes"]["udp"].update(min="10%", max="10%")
    assert parse_policy(doc).traffic_class("udp").max_share == pytest.approx(0.1)


def test_the_smallest_police_and_the_highest_dscp_are_taken():
    """A meter counts in kbit: 1kbit of rate and of burst is its smallest step. DSCP is six bits."""
    doc = shipped("reserve")
    doc["classes"]["udp"].update(police={"rate": "1kbit", "burst": "1kbit"}, dscp=63)
    udp = parse_policy(doc).traffic_class("udp")
    assert (udp.police, udp.dscp) == (Police(1, 1), 63)
    doc["classes"]["udp"]["police"] = {"rate": "10kbit"}      # the burst: 100 ms at the rate, 1kbit
    assert parse_policy(doc).traffic_class("udp").police == Police(10, 1)
    doc["classes"]["udp"]["police"] = {"rate": "1Gbit", "burst": "1Mbit"}
    assert parse_policy(doc).traffic_class("udp").police == Police(1_000_000, 1000)
    doc["classes"]["udp"].update(police=None, dscp=64)
    with pytest.raises(PolicyError, match=r"^classes\.udp\.dscp: 64 is not a whole number from 1 to 63"):
        parse_policy(doc)


@pytest.mark.parametrize("congestion, message", [
    ({"poll_interval": 0.05, "fast_poll_interval": 0.05}, None),
    ({"poll_interval": 60, "fast_poll_interval": 0}, None),
    ({"poll_interval": 1, "fast_poll_interval": 0.01}, None),
    ({"fast_poll_interval": 0.009}, "congestion.fast_poll_interval: 0.009 is not from 0.01 s to the poll_interval"),
    ({"poll_interval": 0.04}, "congestion.poll_interval: 0.04 is not a number from 0.05 to 60"),
    ({"poll_interval": 61}, "congestion.poll_interval: 61 is not a number from 0.05 to 60"),
    ({"fast_poll_interval": 61}, "congestion.fast_poll_interval: 61 is not a number from 0 to 60"),
    ({"hold": 3}, "congestion.hold: unknown key"),
    ({"samples": 1}, None), ({"samples": 1000}, None),
    ({"samples": 0}, "congestion.samples: 0 is not a whole number from 1 to 1000"),
    ({"samples": 1001}, "congestion.samples: 1001 is not a whole number from 1 to 1000"),
    ({"hold_seconds": 3600}, None),
    ({"utilisation": "90%", "clear_utilisation": "90%"}, None),
    ({"hold_seconds": 3601}, "congestion.hold_seconds: 3601 is not a number from 0 to 3600"),
])
def test_the_poll_intervals_bounds_and_the_congestion_keys(congestion, message):
    doc = shipped("reserve")
    doc["congestion"] = congestion
    if message is None:
        assert parse_policy(doc).poll_interval == congestion.get("poll_interval", 1.0)
    else:
        with pytest.raises(PolicyError) as err:
            parse_policy(doc)
        assert str(err.value).startswith(message), str(err.value)


def _port_numbered(doc: dict, value) -> None:
    ports = doc["switches"]["s1"]["ports"]
    ports[value] = ports.pop(1)


def _in_s1_match(field: str):
    return lambda d, v: _set(s1_flow(d, 0)["match"], field, v)


BOUNDS = [
    # (id, where the number goes in the shipped reserve document, lowest, highest, the field the message names)
    ("dp_id", lambda d, v: _set(d["switches"]["s1"], "dp_id", v), 1, 2**64 - 1, "switches.s1.dp_id"),
    ("port", _port_numbered, 1, 0xFEFF, "switches.s1.ports"),
    ("queue_packets", lambda d, v: _set(d["switches"]["s1"]["ports"][1], "queue_packets", v), 1, 100_000,
     "switches.s1.ports.1.queue_packets"),
    ("flow priority", lambda d, v: _set(s1_flow(d, 0), "priority", v), 0, 65535, "switches.s1.flows[0].priority"),
    ("class priority", lambda d, v: _set(d["classes"]["udp"], "priority", v), 0, 7, "classes.udp.priority"),
    ("in_port", lambda d, v: _set(s1_flow(d, 6)["match"], "in_port", v), 1, 0xFEFF,
     "switches.s1.flows[6].match.in_port"),
    ("ip_proto", _in_s1_match("ip_proto"), 0, 255, "switches.s1.flows[0].match.ip_proto"),
    ("udp_dst", lambda d, v: s1_flow(d, 0)["match"].update(ip_proto="udp", udp_dst=v), 1, 65535,
     "switches.s1.flows[0].match.udp_dst"),
    ("ip_dscp", _in_s1_match("ip_dscp"), 0, 63, "switches.s1.flows[0].match.ip_dscp"),
    ("eth_type", _in_s1_match("eth_type"), 0, 0xFFFF, "switches.s1.flows[0].match.eth_type"),
    ("output", lambda d, v: _set(s1_flow(d, 0), "actions", [{"output": v}]), 1, 0xFEFF,
     "switches.s1.flows[0].actions[0].output"),
]


@pytest.mark.parametrize("change, low, high, path", [case[1:] for case in BOUNDS], ids=[c[0] for c in BOUNDS])
def test_each_whole_number_is_taken_at_its_bounds_and_refused_past_them(change, low, high, path):
    for value, taken in ((low, True), (high, True), (low - 1, False), (high + 1, False)):
        doc = shipped("reserve")
        change(doc, value)
        if taken:
            parse_policy(doc)
        else:
            with pytest.raises(PolicyError) as err:
                parse_policy(doc)
            assert str(err.value).startswith(path), (value, str(err.value))


@pytest.mark.parametrize("output, taken", [(0xFEFF, True), ("normal", False)])
def test_a_classified_flow_outputs_to_one_numbered_port(output, taken):
    doc = shipped("reserve")
    s1_flow(doc, 2)["actions"] = [{"output": output}]
    if taken:
        assert parse_policy(doc).switch(1).flows[2].outputs == (0xFEFF,)
    else:
        with pytest.raises(PolicyError, match=r"^switches\.s1\.flows\[2\]\.class: a classified flow needs exactly one "
                                              r"output to a numbered port"):
            parse_policy(doc)


def test_a_name_of_64_characters_and_a_description_of_4096_are_the_longest_taken():
    doc = shipped("reserve")
    doc.update(name="n" * 64, description="d" * 4096)
    assert parse_policy(doc).name == "n" * 64
    for key, length in (("name", 65), ("description", 4097)):
        doc = shipped("reserve")
        doc[key] = "x" * length
        with pytest.raises(PolicyError, match=f"^{key}: "):
            parse_policy(doc)


@pytest.mark.parametrize("value, message", [
    (True, "classes.udp.queue: expected a whole number from 1 to 65534"),    # True == 1 to Python, not to a user
    (None, "classes.udp.queue: expected a whole number from 1 to 65534"),
    ("q" * 38, f"classes.udp.queue: '{'q' * 38}' is not a whole number"),   # a repr of 40 characters is shown whole
    ("q" * 39, f"classes.udp.queue: '{'q' * 36}... is not a whole number"),  # a longer one is cut
])
def test_a_queue_that_is_not_a_number_is_named_and_shown_within_40_characters(value, message):
    doc = shipped("reserve")
    doc["classes"]["udp"]["queue"] = value
    with pytest.raises(PolicyError) as err:
        parse_policy(doc)
    assert str(err.value).startswith(message), str(err.value)
