"""controller/adapters/rtnl.py's packing, against the bytes `tc` itself sends (tc 6.1: `tc filter add dev D
parent 1: prio 7 protocol ip u32 match ip dsfield 0xb8 0xfc flowid 1:4`, as strace -xx showed its sendmsg)."""
import struct

from controller.adapters.rtnl import (
    TCA_KIND,
    TCA_STATS2,
    _stats,
    attr,
    attrs,
    fifo_limit,
    netem_options,
    tcmsg,
    u32_key_selector,
    u32_keys,
)

# struct tc_u32_sel of that filter: terminal, one key; the key: mask 0x00fc0000, value 0x00b80000 (the DS
# field 0xb8 is the second byte of the IPv4 header's first word), offset 0.
TC_SELECTOR = bytes.fromhex("01000100" "0000" "0000" "0000" "0000" "00000000" "00fc0000" "00b80000" "00000000" "00000000")


def test_the_dscp_selector_is_packed_as_tc_packs_it():
    assert u32_key_selector(0x3F << 18, 46 << 18) == TC_SELECTOR


def test_attributes_are_padded_to_four_bytes_and_read_back_nested_or_not():
    packed = attr(TCA_KIND, b"u32\0") + attr(TCA_KIND, b"htb") + attr(TCA_STATS2 | 0x8000, b"")
    assert len(packed) == 8 + 8 + 4
    assert list(attrs(packed)) == [(TCA_KIND, b"u32\0"), (TCA_KIND, b"htb"), (TCA_STATS2, b"")]
    assert list(attrs(b"\x02\x00\x01\x00")) == []          # a length shorter than its header ends the read


def test_a_classs_statistics_are_its_bytes_packets_drops_and_backlog():
    basic = attr(1, struct.pack("=QI", 5_000_000_000, 7) + b"\0" * 4)       # TCA_STATS_BASIC, padded as sent
    queue = attr(3, struct.pack("=IIIII", 2, 3000, 11, 0, 5))                # qlen, backlog, drops, requeues, overlimits
    assert _stats(basic + queue) == (5_000_000_000, 7, 11, 3000, 2)
    assert _stats(basic) is None


def test_a_tcmsg_names_the_device_handle_parent_and_prio():
    assert tcmsg(3, 0x1020000, 0x10002, 7 << 16) == struct.pack("=BxxxiIII", 0, 3, 0x1020000, 0x10002, 7 << 16)


def test_a_u32_selectors_keys_are_read_back_as_value_mask_and_offset():
    assert u32_keys(TC_SELECTOR) == [(0x00B80000, 0x00FC0000, 0)]
    assert u32_keys(TC_SELECTOR[:16]) == []      # a key the message cut short is not read


def test_a_fifos_limit_is_its_options_first_word():
    assert fifo_limit(struct.pack("=I", 40)) == 40
    assert fifo_limit(b"") is None


def test_netems_delay_and_limit_are_read_its_ticks_back_to_the_microseconds_it_was_given():
    # struct tc_netem_qopt as the kernel dumps it: latency in 64 ns ticks (ns >> 6), the limit, then loss, ...
    for us in (1, 999, 10_000, 2_500, 60_000_000):
        assert netem_options(struct.pack("=IIIIII", us * 1000 >> 6, 29, 0, 0, 0, 0)) == (us, 29)
    assert netem_options(b"") is None
