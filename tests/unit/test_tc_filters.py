"""controller/tc_filters.py: the u32 DSCP filters and the HTB class counters, from tc's text."""
import pytest

from controller.tc_filters import (FILTER_PRIO, filter_args, htb_classid, parse_classes, parse_filters,
                                   parse_leaf_limits)

# `tc filter show dev s1-eth1 parent 1: prio 7` after our filters for dscp 1 → queue 1, dscp 2 → queue 2
FILTERS = """\
filter protocol ip pref 7 u32 chain 0 
filter protocol ip pref 7 u32 chain 0 fh 800: ht divisor 1 
filter protocol ip pref 7 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 flowid 1:2 not_in_hw 
  match 00040000/00fc0000 at 0
filter protocol ip pref 7 u32 chain 0 fh 800::801 order 2049 key ht 800 bkt 0 flowid 1:3 not_in_hw 
  match 00080000/00fc0000 at 0
"""

# `tc -s class show dev s1-eth1` with OVS's linux-htb QoS (real output)
CLASSES = """\
class htb 1:1 parent 1:fffe prio 0 rate 12Kbit ceil 5Mbit burst 1563b cburst 1563b 
 Sent 3368702 bytes 2292 pkt (dropped 331, overlimits 2272 requeues 0) 
 backlog 0b 0p requeues 0
 lended: 23 borrowed: 2269 giants: 0
 tokens: -715675 ctokens: 4695

class htb 1:fffe root rate 5Mbit ceil 5Mbit burst 1500b cburst 1500b 
 Sent 3368702 bytes 2292 pkt (dropped 0, overlimits 2269 requeues 0) 
 backlog 0b 0p requeues 0
"""


@pytest.mark.parametrize("queue_id, classid", [(0, "1:1"), (1, "1:2"), (2, "1:3"), (9, "1:a"), (15, "1:10")])
def test_htb_classid_is_the_queue_plus_one_in_hex(queue_id, classid):
    assert htb_classid(queue_id) == classid


def test_filter_args_for_dscp_1_queue_1():
    assert filter_args("s1-eth1", 1, 1) == [
        "tc", "filter", "add", "dev", "s1-eth1", "parent", "1:", "protocol", "ip", "prio", "7",
        "u32", "match", "ip", "dsfield", "0x4", "0xfc", "flowid", "1:2"]
    assert FILTER_PRIO == "7"


def test_filter_args_for_expedited_forwarding():
    args = filter_args("eth0", 46, 2)
    assert args[args.index("dsfield") + 1:] == ["0xb8", "0xfc", "flowid", "1:3"]


def test_parse_filters_reads_our_dscp_filters():
    assert parse_filters(FILTERS) == {(1, "1:2"), (2, "1:3")}


def test_parse_filters_of_no_filters_is_empty():
    assert parse_filters("") == set()


def test_parse_filters_ignores_matches_that_are_not_on_the_dscp_bits():
    other = """\
filter protocol ip pref 7 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 flowid 1:2 not_in_hw 
  match 00b80000/00ff0000 at 0
filter protocol ip pref 7 u32 chain 0 fh 800::801 order 2049 key ht 800 bkt 0 flowid 1:3 not_in_hw 
  match 00110000/00ff0000 at 8
"""
    assert parse_filters(other) == set()


@pytest.mark.parametrize("dscp, queue_id", [(1, 1), (2, 2), (10, 5), (46, 9), (63, 0xfffe)])
def test_what_filter_args_writes_parse_filters_reads_back(dscp, queue_id):
    args = filter_args("eth0", dscp, queue_id)
    value, mask, flowid = int(args[15], 16), int(args[16], 16), args[18]
    listing = (f"filter protocol ip pref 7 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 flowid {flowid} "
               f"not_in_hw \n  match {value << 16:08x}/{mask << 16:08x} at 0\n")
    assert parse_filters(listing) == {(dscp, htb_classid(queue_id))}


def test_parse_classes_reads_bytes_packets_and_drops_per_class():
    assert parse_classes(CLASSES) == {"1:1": (3368702, 2292, 331), "1:fffe": (3368702, 2292, 0)}


def test_parse_classes_of_no_classes_is_empty():
    assert parse_classes("") == {}


def test_leaf_limits_of_htb_classes():
    text = ("qdisc htb 1: root refcnt 2 r2q 10 default 0x1 direct_packets_stat 0 direct_qlen 25\n"
            "qdisc pfifo 8005: parent 1:1 limit 25p\n"
            "qdisc pfifo 8006: parent 1:2 limit 1000p\n")
    assert parse_leaf_limits(text) == {"1:1": 25, "1:2": 1000}
