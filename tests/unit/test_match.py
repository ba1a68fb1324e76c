"""controller/core/policy.py's flow matches: the fields a class can be picked by, OpenFlow 1.3's
prerequisites filled in or refused by name, lists of matches, and three classes on one port."""
import dataclasses

import pytest
from os_ken.ofproto import ofproto_v1_3_parser

from controller.core.flows import desired_flows
from controller.core.plan import TcChanges, htb_classid, tc_changes
from controller.core.policy import PolicyError, parse_policy
from controller.core.queues import NETEM_LIMIT, leaf_chain, leaf_in_force, reserve_qos
from controller.core.switch_state import SwitchState


def policy_with(*flows: dict, classes: dict | None = None):
    return parse_policy({"name": "p", "classes": classes or {},
                         "switches": {"s1": {"dp_id": 1, "flows": list(flows),
                                             "ports": {1: {"capacity": "10Mbit", "queues": "reserve"}}}}})


def match_of(match) -> dict:
    (rule,) = policy_with({"match": match, "actions": [{"output": 1}]}).switch(1).flows
    return dict(rule.match)


def refusal(match) -> str:
    with pytest.raises(PolicyError) as err:
        match_of(match)
    return str(err.value)


AT = "switches.s1.flows[0].match"


# --- fields and the prerequisites filled in ---------------------------------------------------------

@pytest.mark.parametrize("match, expected", [
    ({"ip_dscp": 46}, {"ip_dscp": 46, "eth_type": 0x0800}),
    ({"ip_proto": "udp"}, {"ip_proto": 17, "eth_type": 0x0800}),
    ({"tcp_dst": 5201}, {"tcp_dst": 5201, "ip_proto": 6, "eth_type": 0x0800}),
    ({"udp_src": 53, "udp_dst": 53}, {"udp_src": 53, "udp_dst": 53, "ip_proto": 17, "eth_type": 0x0800}),
    ({"ipv4_src": "10.0.0.1"}, {"ipv4_src": "10.0.0.1", "eth_type": 0x0800}),
    ({"ipv4_dst": "10.0.0.0/24"}, {"ipv4_dst": ("10.0.0.0", "255.255.255.0"), "eth_type": 0x0800}),
    ({"ipv4_dst": "10.0.0.7/32"}, {"ipv4_dst": "10.0.0.7", "eth_type": 0x0800}),
    ({"ipv6_src": "2001:db8::1"}, {"ipv6_src": "2001:db8::1", "eth_type": 0x86DD}),
    ({"ipv6_dst": "2001:DB8::/32"}, {"ipv6_dst": ("2001:db8::", "ffff:ffff::"), "eth_type": 0x86DD}),
    ({"ipv6_src": "2001:db8::/64", "ip_proto": "tcp"},
     {"ipv6_src": ("2001:db8::", "ffff:ffff:ffff:ffff::"), "ip_proto": 6, "eth_type": 0x86DD}),
    ({"ipv6_dst": "2001:db8::2", "udp_dst": 53}, {"ipv6_dst": "2001:db8::2", "udp_dst": 53, "ip_proto": 17,
                                                  "eth_type": 0x86DD}),
    ({"eth_type": "ipv6", "ip_dscp": 10}, {"eth_type": 0x86DD, "ip_dscp": 10}),
    ({"eth_type": "arp"}, {"eth_type": 0x0806}),
    ({"eth_type": "ipv4", "ip_proto": 6}, {"eth_type": 0x0800, "ip_proto": 6}),
    ({"eth_type": "0x86dd"}, {"eth_type": 0x86DD}),
    ({"eth_type": 2048, "tcp_src": 80}, {"eth_type": 0x0800, "tcp_src": 80, "ip_proto": 6}),
    ({"ip_proto": "icmpv6", "ipv6_dst": "ff02::1"}, {"ip_proto": 58, "ipv6_dst": "ff02::1", "eth_type": 0x86DD}),
    ({"in_port": 3, "eth_src": "AA:bb:cc:dd:ee:01"}, {"in_port": 3, "eth_src": "aa:bb:cc:dd:ee:01"}),
])
def test_a_match_gets_its_openflow_prerequisites(match, expected):
    assert match_of(match) == expected


def test_a_match_is_a_sorted_tuple_of_os_ken_ofpmatch_arguments():
    (rule,) = policy_with({"match": {"tcp_dst": 80, "in_port": 3}, "actions": [{"output": 1}]}).switch(1).flows
    assert rule.match == (("eth_type", 0x0800), ("in_port", 3), ("ip_proto", 6), ("tcp_dst", 80))


@pytest.mark.parametrize("match", [
    {"ipv4_src": "10.0.0.0/8", "tcp_dst": 80, "ip_dscp": 46},
    {"ipv6_dst": "2001:db8::/64", "udp_src": 53},
    {"ipv6_src": "::ffff:1.2.3.4", "ip_proto": "icmpv6"},
    {"ipv6_src": "::ffff:0:0/96"},
    {"ipv4_dst": "10.1.2.3", "in_port": 2},
    {"eth_type": "arp", "eth_dst": "ff:ff:ff:ff:ff:ff"},
])
def test_os_ken_reads_a_match_back_from_the_wire_as_the_policy_wrote_it(match):
    """The app compares the switch's flows with the policy's: a difference would reinstall them forever."""
    fields = match_of(match)
    wire = bytearray()
    ofproto_v1_3_parser.OFPMatch(**fields).serialize(wire, 0)
    assert dict(ofproto_v1_3_parser.OFPMatch.parser(bytes(wire), 0).items()) == fields


# --- contradictions and bad values: one line that names the field and the fix ----------------------

@pytest.mark.parametrize("match, message", [
    ({"ip_proto": "udp", "tcp_dst": 80},
     f"{AT}.tcp_dst: needs ip_proto tcp, not udp; remove ip_proto (tcp_dst implies tcp) or use udp_dst"),
    ({"udp_src": 53, "ip_proto": 6},
     f"{AT}.udp_src: needs ip_proto udp, not tcp; remove ip_proto (udp_src implies udp) or use tcp_src"),
    ({"tcp_dst": 80, "ip_proto": "icmp"},
     f"{AT}.tcp_dst: needs ip_proto tcp, not icmp; remove ip_proto (tcp_dst implies tcp)"),
    ({"tcp_dst": 80, "ip_proto": 50},
     f"{AT}.tcp_dst: needs ip_proto tcp, not 50; remove ip_proto (tcp_dst implies tcp)"),
    ({"tcp_dst": 80, "udp_dst": 53},
     f"{AT}.udp_dst: cannot match together with tcp_dst, a packet is TCP or UDP; put them in two match "
     "entries (match may be a list)"),
    ({"ipv4_src": "10.0.0.1", "eth_type": "ipv6"},
     f"{AT}.ipv4_src: needs eth_type ipv4, not ipv6; remove eth_type (ipv4_src implies ipv4) or use ipv6_src"),
    ({"ipv6_dst": "2001:db8::1", "eth_type": 0x0800},
     f"{AT}.ipv6_dst: needs eth_type ipv6, not ipv4; remove eth_type (ipv6_dst implies ipv6) or use ipv4_dst"),
    ({"ipv4_src": "10.0.0.1", "ipv6_dst": "2001:db8::1"},
     f"{AT}.ipv6_dst: cannot match together with ipv4_src, a packet is IPv4 or IPv6; put them in two match "
     "entries (match may be a list)"),
    ({"eth_type": "arp", "ip_proto": "tcp"},
     f"{AT}.ip_proto: needs eth_type ipv4 or ipv6, not arp; remove eth_type (ipv4 is filled in) or set it to ipv6"),
    ({"eth_type": 0x88cc, "tcp_dst": 80},
     f"{AT}.tcp_dst: needs eth_type ipv4 or ipv6, not 0x88cc; remove eth_type (ipv4 is filled in) or set it "
     "to ipv6"),
    ({"ip_dscp": 64}, f"{AT}.ip_dscp: 64 is not a whole number from 0 to 63"),
    ({"tcp_dst": 0}, f"{AT}.tcp_dst: 0 is not a whole number from 1 to 65535"),
    ({"udp_dst": 65536}, f"{AT}.udp_dst: 65536 is not a whole number from 1 to 65535"),
    ({"eth_type": "ip"}, f"{AT}.eth_type: 'ip' is not an EtherType; use ipv4, ipv6, arp or a number such as 0x0800"),
    ({"eth_type": "IPv6"}, f"{AT}.eth_type: 'IPv6' is not an EtherType; use ipv4, ipv6, arp or a number such as "
                           "0x0800"),
    ({"eth_type": ["ipv4"]}, f"{AT}.eth_type: ['ipv4'] is not an EtherType; use ipv4, ipv6, arp or a number such as "
                             "0x0800"),
    ({"eth_type": 0x10000}, f"{AT}.eth_type: 65536 is not an EtherType; use ipv4, ipv6, arp or a number such as "
                            "0x0800"),
    ({"ipv4_src": "10.0.0.1/24"},
     f"{AT}.ipv4_src: '10.0.0.1/24' has host bits set after the prefix; write 10.0.0.0/24"),
    ({"ipv4_src": "10.0.0.300"}, f"{AT}.ipv4_src: '10.0.0.300' is not an IPv4 address or prefix; write e.g. "
                                 "10.0.0.1 or 10.0.0.0/24"),
    ({"ipv6_dst": "2001:db8::1/64"}, f"{AT}.ipv6_dst: '2001:db8::1/64' has host bits set after the prefix; write "
                                     "2001:db8::/64"),
    ({"ipv6_dst": "10.0.0.1"}, f"{AT}.ipv6_dst: '10.0.0.1' is not an IPv6 address or prefix; write e.g. "
                               "2001:db8::1 or 2001:db8::/64"),
    ({"ip_proto": "sctp"}, f"{AT}.ip_proto: 'sctp' is not a protocol; use tcp, udp, icmp, icmpv6 or a number 0-255"),
    ({"vlan_vid": 5}, f"{AT}.vlan_vid: unknown match field; use in_port, eth_type, eth_src, eth_dst, ipv4_src, "
                      "ipv4_dst, ipv6_src, ipv6_dst, ip_proto, ip_dscp, tcp_src, tcp_dst, udp_src or udp_dst"),
])
def test_a_bad_match_is_refused_naming_the_field_and_the_fix(match, message):
    assert refusal(match) == message


# --- a list of matches ------------------------------------------------------------------------------

def test_a_list_of_matches_gives_one_rule_each_with_the_same_priority_actions_and_class():
    policy = policy_with({"priority": 40000, "class": "video", "actions": [{"output": 1}],
                          "match": [{"in_port": 3, "udp_dst": 5004}, {"in_port": 3, "ip_dscp": 34}]},
                         {"match": {"in_port": 1}, "actions": [{"output": 3}]},
                         classes={"video": {"queue": 1, "min": "50%"}})
    first, second, third = policy.switch(1).flows
    assert dict(first.match) == {"in_port": 3, "udp_dst": 5004, "ip_proto": 17, "eth_type": 0x0800}
    assert dict(second.match) == {"in_port": 3, "ip_dscp": 34, "eth_type": 0x0800}
    assert {(r.priority, r.outputs, r.traffic_class) for r in (first, second)} == {(40000, (1,), "video")}
    assert (first.source, second.source, third.source) == (
        "switches.s1.flows[0].match[0]", "switches.s1.flows[0].match[1]", "switches.s1.flows[1].match")
    assert third.flow_source == "switches.s1.flows[1]"


def test_each_rule_of_a_list_gets_its_own_cookie_and_steers_into_the_class():
    policy = policy_with({"class": "video", "actions": [{"output": 1}],
                          "match": [{"udp_dst": 5004}, {"ip_dscp": 34}]}, classes={"video": {"queue": 1}})
    entries = desired_flows(policy, policy.switch(1), frozenset({1}), mark_dscp=True)
    assert len({e.cookie for e in entries}) == 2
    assert {e.actions for e in entries} == {(("set_field", "ip_dscp", 1), ("set_queue", 1), ("output", 1))}


def test_an_error_in_a_list_of_matches_names_the_entry():
    with pytest.raises(PolicyError, match=r"^switches\.s1\.flows\[0\]\.match\[1\]\.tcp_dst: needs ip_proto tcp, "):
        match_of([{"in_port": 1}, {"tcp_dst": 80, "ip_proto": "udp"}])


def test_an_empty_list_of_matches_is_refused():
    assert refusal([]) == (f"{AT}: an empty list matches nothing; give one mapping per match, or leave match out "
                           "to match everything")


def test_a_match_that_is_neither_a_mapping_nor_a_list_is_refused():
    assert refusal("in_port=1") == f"{AT}: expected a mapping of keys to values, got str"


def test_the_same_priority_and_match_twice_is_refused_naming_both():
    with pytest.raises(PolicyError) as err:
        policy_with({"match": {"in_port": 1}, "actions": [{"output": 2}]},
                    {"match": [{"in_port": 2}, {"in_port": 1}], "actions": [{"output": 3}]})
    assert str(err.value) == ("switches.s1.flows[1].match[1]: the same priority and match as "
                              "switches.s1.flows[0].match; a switch keeps only one of them, so remove one or change "
                              "its priority")


def test_matches_that_normalise_alike_are_the_same_match():
    with pytest.raises(PolicyError, match=r"^switches\.s1\.flows\[0\]\.match\[1\]: the same priority and match as "
                                          r"switches\.s1\.flows\[0\]\.match\[0\];"):
        match_of([{"ip_proto": "tcp"}, {"ip_proto": 6, "eth_type": "ipv4"}])


def test_a_classified_ipv6_match_is_steered_by_the_same_mark_as_ipv4():
    policy = policy_with({"class": "c", "actions": [{"output": 1}], "match": [{"udp_dst": 53}, {"ipv6_dst": "2001:db8::1"}]},
                         classes={"c": {"queue": 1, "dscp": 10}})
    state = SwitchState(policy, policy.switch(1), userspace=True)
    v4, v6 = state.flows(frozenset({1}))
    assert dict(v6.match)["eth_type"] == 0x86DD
    assert v4.actions == v6.actions == (("set_field", "ip_dscp", 10), ("set_queue", 1), ("output", 1))
    spec = state.qos({1})[1]
    changes = tc_changes(spec, True, {"1:1", "1:2"}, {c: ("pfifo_head_drop", 1000) for c in ("1:1", "1:2")},
                         {("ipv4", 10, "1:2")})
    assert changes.filters == ((10, 1),)      # the IPv6 filter is missing: both are put back


def test_a_classified_match_that_is_not_ip_is_refused_naming_the_entry():
    with pytest.raises(PolicyError) as err:
        policy_with({"class": "c", "actions": [{"output": 1}], "match": [{"udp_dst": 53}, {"eth_type": "arp"}]},
                    classes={"c": {"queue": 1}})
    assert str(err.value) == ("switches.s1.flows[0].class: classes steer IP packets only; add ip_proto, an address, "
                              "or eth_type: ipv4 or ipv6 to match[1]")


# --- more than two classes on one port --------------------------------------------------------------

def test_three_classes_get_three_queues_htb_classes_marks_and_steering_flows():
    classes = {"voice": {"queue": 1, "min": "10%", "max": "20%", "dscp": 46, "priority": 0},
               "video": {"queue": 2, "min": "40%", "priority": 1},
               "bulk": {"queue": 15, "min": "20%", "dscp": 10, "priority": 2}}
    policy = policy_with(
        {"priority": 40000, "class": "voice", "match": {"in_port": 3, "udp_dst": 5060}, "actions": [{"output": 1}]},
        {"priority": 40000, "class": "video", "match": [{"in_port": 3, "udp_dst": 5004}, {"in_port": 3, "ip_dscp": 34}],
         "actions": [{"output": 1}]},
        {"priority": 30000, "class": "bulk", "match": {"in_port": 3, "ipv4_dst": "10.0.0.0/24"},
         "actions": [{"output": 1}]},
        {"priority": 1000, "match": {"in_port": 3}, "actions": [{"output": 1}]},
        classes=classes)
    port = policy.switch(1).port(1)
    spec = reserve_qos(policy, port, userspace=True)
    assert [(q.queue_id, q.traffic_class, q.min_bps, q.max_bps, q.priority) for q in spec.queues] == [
        (0, "default", 3_000_000, 10_000_000, 0),
        (1, "voice", 1_000_000, 2_000_000, 0),
        (2, "video", 4_000_000, 10_000_000, 1),
        (15, "bulk", 2_000_000, 10_000_000, 2)]
    assert spec.marks == ((46, 1), (2, 2), (10, 15))
    assert [htb_classid(q.queue_id) for q in spec.queues] == ["1:1", "1:2", "1:3", "1:10"]
    steering = [e.actions[:-1] for e in desired_flows(policy, policy.switch(1), frozenset({1}), mark_dscp=True)]
    assert steering == [(("set_field", "ip_dscp", 46), ("set_queue", 1)),
                        (("set_field", "ip_dscp", 2), ("set_queue", 2)),
                        (("set_field", "ip_dscp", 2), ("set_queue", 2)),
                        (("set_field", "ip_dscp", 10), ("set_queue", 15)),
                        ()]


def test_a_delayed_links_fifo_is_netems_own_holding_what_is_in_flight_and_another_discipline_goes_below():
    policy = policy_with({"actions": [{"output": 1}]}, classes={"c": {"queue": 1}})
    spec = SwitchState(policy, policy.switch(1), userspace=False, delays={1: 10_000}).qos({1})[1]
    # 25 packets of queue, and 10 ms at 10 Mbit/s in flight: 8.3 full frames, so 9.
    queue = dataclasses.replace(spec, leaf=("pfifo", "limit", "25"))
    assert leaf_chain(queue) == (("netem", "delay", "10000us", "limit", "34"),)
    assert leaf_in_force(queue) == ("netem", 34, 10_000)
    fair = dataclasses.replace(spec, leaf=("sfq", "limit", "25", "perturb", "10"))
    assert leaf_chain(fair) == (("netem", "delay", "10000us", "limit", str(NETEM_LIMIT)), fair.leaf)
    assert leaf_in_force(fair) == ("sfq", None, 10_000)
    undelayed = dataclasses.replace(queue, delay_us=0)
    assert leaf_chain(undelayed) == (undelayed.leaf,) and leaf_in_force(undelayed) == ("pfifo", 25, 0)


def test_a_class_whose_leaf_is_not_the_delayed_links_is_put_right():
    policy = policy_with({"actions": [{"output": 1}]}, classes={"c": {"queue": 1}})
    spec = SwitchState(policy, policy.switch(1), userspace=True, delays={1: 10_000}).qos({1})[1]
    right = {"1:1": leaf_in_force(spec), "1:2": leaf_in_force(spec)}
    assert tc_changes(spec, False, set(right), right, set()) == TcChanges(False)
    # The queue alone (a delay declared since), or netem of another delay: put again.
    alone = ("pfifo_head_drop", int(spec.leaf[2]), 0)
    assert tc_changes(spec, False, set(right), {**right, "1:1": alone}, set()).leaves == ("1:1",)
    other = (*leaf_in_force(spec)[:2], 5_000)
    assert tc_changes(spec, False, set(right), {**right, "1:2": other}, set()).leaves == ("1:2",)
    undelayed = SwitchState(policy, policy.switch(1), userspace=True).qos({1})[1]
    assert tc_changes(undelayed, False, set(right), right, set()).leaves == ("1:1", "1:2")   # a delay taken off
