"""Linux traffic control over netlink: what OVS's linux-htb (or linux-hfsc) QoS needs beside OVSDB.
Its netlink messages are packed and read by controller/adapters/rtnl.py.

OVS builds the HTB (or HFSC) root 1: and a class 1:<queue+1> per queue on the port's device,
both under a parent class 1:fffe. This module
reads their counters and adds two things OVS does not:
- leaves: the qdisc under each class. OVS leaves the kernel's default pfifo, as long as the
  device's txqueuelen; the policy chooses its length and discipline (controller/core/queues.py), and an
  emulated link's declared delay puts netem there (the queue its own, or below it).
- filters: u32 rules that send a DSCP mark to its class, because the userspace datapath ignores
  set_queue (every packet leaves through one AF_PACKET socket); one per mark for IPv4's DS field
  and one for IPv6's traffic class, at a prio each (the kernel keeps one protocol per prio).
Disciplines other than FIFOs (sfq, codel, fq_codel, red), and netem, go through the `tc` command, which
knows how to encode each; they are only set when a port asks for one.
One lock serialises every netlink call: the socket may not be shared by two green or native threads
at once. Every failure, the kernel's refusals included, is an OSError.
"""
from __future__ import annotations

import _socket
import ctypes
import errno
import os
import socket
import struct
import subprocess
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from controller.adapters.rtnl import (
    RTM_GETTFILTER,
    RTM_NEWQDISC,
    RTM_NEWTCLASS,
    NetlinkError,
    Qdisc,
    Rtnl,
    fifo_limit,
    messages,
    netem_options,
    u32_key_selector,
)
from controller.core.plan import HTB_PARENT
from controller.core.queues import FIFO_KINDS

ROOT = 0x10000                  # 1: (OVS's HTB or HFSC root)
RTMGRP_TC = 0x8                 # linux/rtnetlink.h: the group of qdisc, class and filter announcements
QDISC_KINDS = ("htb", "hfsc")   # OVS's linux-htb and linux-hfsc
GONE = (errno.ENOENT, errno.ENODEV)   # the kernel's answer for a class, qdisc or device that is not there


@dataclass(frozen=True)
class DscpFilter:
    """Where a family's DSCP sits in the first 32-bit word of its header, and our filters' prio for it:
    we replace only our own prios."""
    protocol: int
    prio: int
    shift: int                  # of the six DSCP bits

    @property
    def mask(self) -> int:
        return 0x3F << self.shift


FILTERS = {"ipv4": DscpFilter(0x0800, 7, 18),   # version, IHL, then the DS field
           "ipv6": DscpFilter(0x86DD, 8, 22)}   # version, then the traffic class


def classid(handle: int) -> str:
    return f"{handle >> 16:x}:{handle & 0xFFFF:x}"


def parse_classid(text: str) -> int:
    major, minor = text.split(":")
    return int(major, 16) << 16 | int(minor or "0", 16)


def leaf_handle(cls: str) -> int:
    """A handle per class for the leaf we put under it (1:2 → 102:): its queue, or netem above the queue."""
    return (0x100 + (parse_classid(cls) & 0xFFFF)) << 16


TWIN = 0x8000 << 16   # the other handle of a leaf whose kind changes (Tc._graft)


def below_netem_handle(cls: str) -> int:
    """The handle of the queue we put under netem, under class `cls` (1:2 → 1102:)."""
    return (0x1100 + (parse_classid(cls) & 0xFFFF)) << 16


@dataclass(frozen=True)
class ClassCounters:
    bytes: int
    packets: int
    drops: int
    backlog_bytes: int = 0      # what waits in the class's queue (its leaf) now
    backlog_packets: int = 0


@dataclass(frozen=True)
class Leaf:
    kind: str
    limit: int | None      # packets, for the FIFOs; None where the kind has no packet limit
    packets: int = 0       # sent so far
    drops: int = 0
    backlog_bytes: int = 0
    backlog_packets: int = 0
    delay_us: int = 0      # netem's, on an emulated link; the rest is of the queue (netem's own, or below it)


DEFAULT_LEAF = Leaf("pfifo", None)   # the kernel's own, as long as the device's txqueuelen


def _packet_limit(qdisc: Qdisc) -> int | None:
    """A FIFO's limit, or netem's (its own FIFO); the other kinds have none in packets."""
    if qdisc.kind in FIFO_KINDS:
        return fifo_limit(qdisc.options)
    netem = netem_options(qdisc.options) if qdisc.kind == "netem" else None
    return netem[1] if netem else None


class Tc:
    def __init__(self) -> None:
        self._rtnl = Rtnl()
        self._lock = threading.Lock()   # green under os-ken's monkey patching, native elsewhere

    def close(self) -> None:
        self._rtnl.close()

    @property
    def ports(self) -> frozenset[int]:
        """Our netlink socket's port: the kernel's announcements of what our requests did carry it."""
        return frozenset({self._rtnl.port})

    @contextmanager
    def _raw(self) -> Iterator[Rtnl]:
        with self._lock:
            yield self._rtnl

    @staticmethod
    def ifindex(iface: str) -> int | None:
        """One ioctl (a netlink link lookup by name would dump every link of the host)."""
        try:
            return socket.if_nametoindex(iface)
        except OSError:
            return None

    def classes(self, iface: str) -> dict[str, ClassCounters]:
        """HTB class → its counters; empty when the device is gone or has no HTB."""
        index = self.ifindex(iface)
        if index is None:
            return {}
        with self._raw() as rtnl:
            found = list(rtnl.classes(index))
        return {classid(handle): ClassCounters(*stats) for handle, kind, stats in found
                if kind in QDISC_KINDS and stats is not None}

    def leaves(self, iface: str, classes: Iterable[str] | None = None) -> dict[str, Leaf]:
        """HTB class → the qdisc under it, of `classes` (default: every class on the device). Asked class
        by class: the kernel answers a qdisc dump with every qdisc of the host, whatever device it names.
        The kernel never returns the default pfifo HTB puts under a new class (it is hidden); that one is
        reported as DEFAULT_LEAF."""
        index = self.ifindex(iface)
        if index is None:
            return {}
        found = {}
        for cls in self.classes(iface) if classes is None else classes:
            if cls == HTB_PARENT:    # its children hold the leaves
                continue
            try:
                with self._raw() as rtnl:
                    qdisc = rtnl.qdisc(index, parse_classid(cls))
            except OSError as err:
                if err.errno not in GONE:
                    raise
                continue                 # the class went while we asked
            if qdisc is None:
                found[cls] = DEFAULT_LEAF
                continue
            delay = 0
            if qdisc.kind == "netem":   # an emulated link's delay: the queue is netem's own, or below it
                delay = (netem_options(qdisc.options) or (0, 0))[0]
                try:
                    with self._raw() as rtnl:
                        qdisc = rtnl.qdisc(index, qdisc.handle | 1) or qdisc
                except OSError as err:
                    if err.errno not in GONE:
                        raise           # netem has no qdisc below: the kernel says ENOENT
            _, packets, drops, backlog, qlen = qdisc.stats or (0, 0, 0, 0, 0)
            found[cls] = Leaf(qdisc.kind, _packet_limit(qdisc), packets, drops, backlog, qlen, delay)
        return found

    def filters(self, iface: str) -> set[tuple[str, int, str]]:
        """(family, dscp, class) of our DSCP filters on the device."""
        index = self.ifindex(iface)
        if index is None:
            return set()
        found = set()
        for family, spec in FILTERS.items():
            with self._raw() as rtnl:
                filters = list(rtnl.u32_filters(index, ROOT, spec.prio))
            for target, keys in filters:
                for value, mask, offset in keys:
                    if mask == spec.mask and offset == 0:
                        found.add((family, (value & mask) >> spec.shift, classid(target)))
        return found

    def replace_filters(self, iface: str, marks: tuple[tuple[int, int], ...], clear: bool = True) -> None:
        """Make our filters exactly `marks` ((dscp, queue_id) pairs); an empty tuple removes them. `clear`
        False: the device is known to hold none of ours (u32 would add the new ones beside old ones)."""
        index = self._require(iface)
        with self._raw() as rtnl:
            for spec in FILTERS.values() if clear else ():
                rtnl.delete_filters(index, ROOT, spec.prio)
            for dscp, queue_id in marks:
                for spec in FILTERS.values():   # the DS field (or traffic class) under its mask is the mark
                    rtnl.add_u32_filter(index, ROOT, spec.prio, spec.protocol,
                                        u32_key_selector(spec.mask, dscp << spec.shift), ROOT | (queue_id + 1))

    def replace_leaf(self, iface: str, cls: str, chain: tuple[tuple[str, ...], ...]) -> None:
        """Put `chain` (tc qdisc specs, each a kind then its arguments: controller/core/queues.py, leaf_chain)
        under HTB class `cls`, each below the one before it."""
        parent, handle = cls, leaf_handle(cls)
        for qdisc in chain:
            parent, handle = classid(self._graft(iface, parent, handle, qdisc) | 1), below_netem_handle(cls)

    def _graft(self, iface: str, parent: str, handle: int, spec: tuple[str, ...]) -> int:
        """Put `spec` under `parent`, at `handle` or, where a qdisc of another kind holds that handle, at its
        twin: the kernel changes a qdisc in place only into one of its own kind, and a new handle swaps the
        new qdisc in at once, the old one staying if the new is refused. The handle it went to."""
        try:
            self._put(iface, parent, handle, spec)
            return handle
        except OSError:
            index = self._require(iface)
            with self._raw() as rtnl:
                there = rtnl.qdisc(index, parse_classid(parent))
            if there is None or there.handle != handle or there.kind == spec[0]:
                raise
        self._put(iface, parent, handle ^ TWIN, spec)
        return handle ^ TWIN

    def _put(self, iface: str, parent: str, handle: int, spec: tuple[str, ...]) -> None:
        kind, args = spec[0], spec[1:]
        if kind not in FIFO_KINDS:
            done = subprocess.run(["tc", "qdisc", "replace", "dev", iface, "parent", parent,
                                   "handle", f"{handle >> 16:x}:", *spec], capture_output=True, text=True)
            if done.returncode != 0:
                raise OSError(f"tc refused '{' '.join(spec)}' on {iface} {parent}: {done.stderr.strip()}")
            return
        index, limit = self._require(iface), int(args[args.index("limit") + 1])
        with self._raw() as rtnl:   # struct tc_fifo_qopt: the limit in packets
            rtnl.replace_qdisc(index, handle, parse_classid(parent), kind, struct.pack("=I", limit))

    def _require(self, iface: str) -> int:
        index = self.ifindex(iface)
        if index is None:
            raise OSError(f"no network device {iface}")
        return index


class TcEvents:
    """The kernel's announcements of qdisc, class and filter changes on any device (RTNLGRP_TC): the
    controller re-checks a port's queues and filters when, and only when, something changed them.
    A plain netlink socket, so it waits cooperatively under eventlet. Only each message's header and
    device are read (struct, not pyroute2): vswitchd announces thousands while it builds 1000 ports'
    queues, and decoding them whole cost a third of the controller's CPU.

    A class added or changed (RTM_NEWTCLASS) is no news: ovs-vswitchd sets every class of every port's QoS
    again at each reconfiguration, which any OVSDB transaction on the host causes (a bridge added, another
    bridge's QoS), so at 10,000 ports each was 40,000 announcements and a check of every port, a joining
    switch's cost growing with the site's. Changing a class leaves its leaf and the filters, all a check
    looks at, in place; a class deleted, a qdisc and a filter are still announced (a child class added by
    hand under a leaf class, which takes its leaf away unannounced, waits for the sweep). The socket's
    filter drops them in the kernel, with what the netlink ports `ours` asked for: never read, they
    neither wake the controller nor overrun the socket's buffer (which would have every port checked)."""

    def __init__(self, ours: frozenset[int] = frozenset()) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        attach_filter(self._sock, announcement_filter(ours))
        self._sock.bind((0, RTMGRP_TC))
        # The same socket, never wrapped by eventlet: on its green socket MSG_DONTWAIT waits for data
        # instead of raising, which would hold what was read until the next announcement.
        self._raw = _socket.socket(fileno=os.dup(self._sock.fileno()))

    def next(self, ours: frozenset[int] = frozenset()) -> set[int] | None:
        """The devices (ifindex) someone changed, waiting for one; None when the kernel had to drop
        announcements (the buffer overran), or sent one we cannot read: then every device may have changed.
        Announcements of what the netlink ports `ours` asked for (our own changes, and our GETs, which the
        kernel announces too) are left out: otherwise every check would announce a change and start the next."""
        changed: set[int] = set()
        while True:   # wait for one, then take whatever is queued with it
            try:
                data = self._raw.recv(1 << 16, socket.MSG_DONTWAIT) if changed else self._sock.recv(1 << 16)
            except BlockingIOError:
                return changed
            except OSError as err:
                if err.errno == errno.ENOBUFS:
                    return None
                raise
            try:
                changed |= tc_announcements(data, ours)
            except NetlinkError:
                return None

    def close(self) -> None:
        self._raw.close()
        self._sock.close()


_TCMSG_INDEX = struct.Struct("=xxxxi")  # struct tcmsg: family, two pads, then the device's ifindex
TC_MESSAGES = range(RTM_NEWQDISC, RTM_GETTFILTER + 1)


def tc_announcements(data: bytes, ours: frozenset[int]) -> set[int]:
    """The devices of the qdisc/class/filter messages in one netlink datagram not sent for the ports `ours`,
    a class added or changed left out (TcEvents says why)."""
    return {_TCMSG_INDEX.unpack_from(body)[0] for kind, _, _, sender, body in messages(data)
            if kind in TC_MESSAGES and kind != RTM_NEWTCLASS and sender not in ours
            and len(body) >= _TCMSG_INDEX.size}


SO_ATTACH_FILTER = 26   # asm-generic/socket.h
_BPF_LD_H_ABS, _BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_RET_K = 0x28, 0x20, 0x15, 0x06   # linux/filter.h's classic BPF
_NLMSG_TYPE, _NLMSG_PID = 4, 12   # struct nlmsghdr's fields' offsets


def announcement_filter(ours: frozenset[int]) -> bytes:
    """The instructions (struct sock_filter) of a classic BPF program that drops a netlink datagram whose
    (first) message is a class added or changed, or was sent for one of the netlink ports `ours`: the kernel
    sends each announcement in a datagram of its own. BPF loads in network order, netlink's header is in the
    host's: the constants are swapped to match."""
    def swapped(fmt: str, value: int) -> int:
        return int.from_bytes(struct.pack("=" + fmt, value), "big")

    drop = 3 + 2 * len(ours)   # the last instruction; a jump counts from the one after it
    program = [(_BPF_LD_H_ABS, 0, 0, _NLMSG_TYPE), (_BPF_JEQ_K, drop - 2, 0, swapped("H", RTM_NEWTCLASS))]
    for k, port in enumerate(sorted(ours)):
        program += [(_BPF_LD_W_ABS, 0, 0, _NLMSG_PID), (_BPF_JEQ_K, drop - (4 + 2 * k), 0, swapped("I", port))]
    program += [(_BPF_RET_K, 0, 0, 0xFFFFFFFF), (_BPF_RET_K, 0, 0, 0)]   # all of it kept; dropped
    return b"".join(struct.pack("=HBBI", *op) for op in program)


def attach_filter(sock: socket.socket, code: bytes) -> None:
    """SO_ATTACH_FILTER with struct sock_fprog: the count of instructions and where they are (the kernel
    copies them)."""
    program = ctypes.create_string_buffer(code, len(code))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, struct.pack("@HP", len(code) // 8, ctypes.addressof(program)))
