"""Reading the kernel's tc announcements: only the header and the device of each message."""
import socket
import struct

import pytest

from controller.adapters.tc import TcEvents, tc_announcements

RTM_NEWQDISC, RTM_NEWTCLASS, RTM_DELTCLASS, RTM_DELTFILTER, RTM_NEWLINK = 36, 40, 41, 45, 16


def message(kind: int, sender: int, ifindex: int, payload: bytes = b"") -> bytes:
    body = struct.pack("=BBHiIII", 0, 0, 0, ifindex, 0x10000, 0xFFFFFFFF, 0) + payload
    length = 16 + len(body)
    return struct.pack("=IHHII", length, kind, 0, 1, sender) + body + b"\0" * (-length % 4)


def test_every_tc_message_of_a_datagram_names_its_device():
    data = message(RTM_NEWQDISC, 0, 7, b"abc") + message(RTM_DELTFILTER, 4242, 9)
    assert tc_announcements(data, ours=frozenset({1})) == {7, 9}


def test_what_our_own_port_asked_for_and_other_messages_are_left_out():
    data = message(RTM_NEWQDISC, 1, 7) + message(RTM_NEWLINK, 0, 8) + message(RTM_DELTFILTER, 0, 9)
    assert tc_announcements(data, ours=frozenset({1})) == {9}


def test_a_class_added_or_changed_is_no_news_and_one_deleted_is():
    """vswitchd sets every class of every port's QoS again at each reconfiguration (any OVSDB transaction on
    the host): as news, each had every port of the site checked."""
    data = message(RTM_NEWTCLASS, 0, 7) + message(RTM_DELTCLASS, 0, 8)
    assert tc_announcements(data, ours=frozenset({1})) == {8}


def test_a_datagram_cut_short_is_refused():
    for data in (message(RTM_NEWQDISC, 0, 7)[:20], struct.pack("=IHHII", 0, RTM_NEWQDISC, 0, 0, 0) * 2):
        with pytest.raises(OSError, match="netlink"):
            tc_announcements(data, ours=frozenset({1}))


def test_a_datagram_that_cannot_be_read_is_every_device_changed_not_none():
    events = TcEvents()
    events.close()
    events._sock, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    events._raw = events._sock
    try:
        kernel.send(message(RTM_NEWQDISC, 0, 7)[:20])   # then one that names device 9
        kernel.send(message(RTM_NEWQDISC, 0, 9))
        assert events.next(frozenset({1})) is None
    finally:
        events.close()
        kernel.close()
