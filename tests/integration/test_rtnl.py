"""controller/adapters/rtnl.py against the real kernel: a veth device in a network namespace the test makes
and removes (a veth: kernels without the dummy driver have it), its HTB classes, a leaf and a u32 filter set by `tc` itself, read back through the client; and
what the kernel can be made to do to an answer: cut it short, drop it."""
import ctypes
import errno
import json
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import pytest

from controller.adapters import rtnl
from controller.adapters.rtnl import Rtnl, fifo_limit
from controller.adapters.tc import TcEvents
from tests.integration.conftest import requires_root

pytestmark = requires_root
CLASSES = 40          # their dump takes several datagrams
CLONE_NEWNET = 0x40000000
SOL_NETLINK, NETLINK_NO_ENOBUFS = 270, 5
T = TypeVar("T")


@pytest.fixture
def namespace():
    """(its name, the device's ifindex there): HTB with CLASSES classes 1:1..., pfifo limit 33 under 1:2,
    DSCP 46 sent to 1:3 by a u32 filter at prio 7."""
    name = f"rtnl{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        batch = ["link add d0 type veth peer name d1", "link set d0 up"]
        subprocess.run(["ip", "-n", name, "-batch", "-"], input="\n".join(batch), text=True, check=True)
        tc = ["qdisc add dev d0 root handle 1: htb",
              *(f"class add dev d0 parent 1: classid 1:{k:x} htb rate {k}00kbit" for k in range(1, CLASSES + 1)),
              "qdisc add dev d0 parent 1:2 handle 102: pfifo limit 33",
              "filter add dev d0 parent 1: prio 7 protocol ip u32 match ip dsfield 0xb8 0xfc flowid 1:3"]
        subprocess.run(["tc", "-n", name, "-batch", "-"], input="\n".join(tc), text=True, check=True)
        link = json.loads(subprocess.run(["ip", "-n", name, "-j", "link", "show", "d0"], capture_output=True,
                                         text=True, check=True).stdout)
        yield name, link[0]["ifindex"]
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def client(name: str) -> Rtnl:
    """An Rtnl whose socket is in namespace `name`."""
    return made_in(name, Rtnl)


def made_in(name: str, make: Callable[[], T]) -> T:
    """What `make` makes in namespace `name`: made by a thread that entered it (a network namespace is a
    thread's own; a socket keeps the one it was made in)."""
    made: list[T] = []

    def enter():
        with open(f"/run/netns/{name}") as ns:
            if ctypes.CDLL(None, use_errno=True).setns(ns.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {name}")
        made.append(make())

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    return made[0]


def test_the_kernel_queues_no_class_change_and_none_of_our_own_for_the_announcements_socket(namespace):
    """vswitchd sets every class of every port's QoS again at each reconfiguration: a socket that took those
    in was woken 40,000 times at 10,000 ports, and overran."""
    name, index = namespace
    ours = client(name)
    events = made_in(name, lambda: TcEvents(frozenset({ours.port})))
    try:
        subprocess.run(["tc", "-n", name, "class", "change", "dev", "d0", "classid", "1:5", "htb", "rate", "999kbit"],
                       check=True)
        ours.replace_qdisc(index, 0x1040000, 0x10004, "pfifo", struct.pack("=I", 7))
        subprocess.run(["tc", "-n", name, "qdisc", "replace", "dev", "d0", "parent", "1:6", "handle", "106:", "pfifo",
                        "limit", "3"], check=True)
        time.sleep(0.2)
        queued = []
        while True:
            try:
                data = events._raw.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            queued += [(kind, sender) for kind, _, _, sender, _ in rtnl.messages(data)]
        assert [kind for kind, _ in queued] == [rtnl.RTM_NEWQDISC]   # tc's pfifo under 1:6 alone
        assert queued[0][1] != ours.port
    finally:
        events.close()
        ours.close()


def test_what_tc_set_is_read_back_and_a_refusal_is_the_kernels_errno(namespace):
    name, index = namespace
    nl = client(name)
    try:
        classes = {handle: (kind, stats) for handle, kind, stats in nl.classes(index)}
        assert set(classes) == {0x10000 | k for k in range(1, CLASSES + 1)}
        assert all(kind == "htb" and stats is not None for kind, stats in classes.values())
        leaf = nl.qdisc(index, 0x10002)
        assert leaf is not None and (leaf.handle, leaf.kind, fifo_limit(leaf.options)) == (0x1020000, "pfifo", 33)
        assert nl.qdisc(index, 0x10001) is None                      # HTB's own default leaf is hidden
        assert list(nl.u32_filters(index, 0x10000, 7)) == [(0x10003, [(0x00B80000, 0x00FC0000, 0)])]
        with pytest.raises(OSError) as refused:
            nl.qdisc(index, 0x10000 | (CLASSES + 1))                 # no such class
        assert refused.value.errno == errno.ENOENT
    finally:
        nl.close()


def test_sequence_numbers_wrap_within_32_bits_and_the_kernel_answers_each(namespace):
    name, index = namespace
    nl = client(name)
    try:
        nl._seq = 2**32 - 2               # months of requests at 10,000 ports
        for _ in range(3):
            assert nl.qdisc(index, 0x10002) is not None
    finally:
        nl.close()


def test_a_dump_cut_short_is_an_oserror_and_the_rest_of_it_does_not_refuse_the_next_dump(namespace, monkeypatch):
    name, index = namespace
    monkeypatch.setattr(rtnl, "BUFFER", 128)      # less than one class's message
    nl = client(name)
    try:
        with pytest.raises(OSError, match="cut short to 128"):
            list(nl.classes(index))
        # The kernel goes on with the dump at each read, and refuses another (EBUSY) until it has ended: unless
        # what is left of it is read first, the next dump is refused, or its answer comes after that rest.
        assert list(nl.classes(1)) == []             # lo: no classes, an answer that fits
    finally:
        nl.close()


def test_an_acknowledgement_the_kernel_drops_is_an_oserror_after_the_timeout(namespace, monkeypatch):
    name, index = namespace
    monkeypatch.setattr(rtnl, "TIMEOUT_SECONDS", 0.5)
    nl = client(name)
    try:
        # The smallest receive buffer, filled by a dump we do not read: the kernel drops what it sends us next,
        # and under NETLINK_NO_ENOBUFS it says nothing of it.
        nl._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 0)
        nl._sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        nl._sock.send(rtnl._HEADER.pack(16 + 20, rtnl.RTM_GETTCLASS, rtnl.NLM_F_REQUEST | rtnl.NLM_F_DUMP, 7, 0)
                      + rtnl.tcmsg(index))
        started = time.monotonic()
        with pytest.raises(OSError, match="no answer within 0.5 s: qdisc"):
            nl.qdisc(index, 0x10002)
        assert time.monotonic() - started < 3
        assert nl.qdisc(index, 0x10002) is not None    # the socket answers again
    finally:
        nl.close()
