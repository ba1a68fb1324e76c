"""The rtnetlink messages of traffic control the controller sends, packed and read with struct.

Applying a policy to 10,000 ports asks the kernel about 100,000 times (each port's classes, a leaf per
class, its DSCP filters): through pyroute2 that took 79.5 s of a 125 s apply, most of it encoding and
decoding messages in Python; a cluster member taking over 1000 ports spent most of its hand-off reading
their leaves and filters through it. These are the same messages `tc` sends (struct tcmsg and its
attributes, linux/rtnetlink.h and linux/pkt_sched.h). One request at a time on one socket: callers hold
their own lock.

Everything that goes wrong is an OSError (the worker records it as the port's error and goes on): the
kernel's refusals with its errno, and NetlinkError for an answer that did not come within TIMEOUT_SECONDS,
came cut short, or does not parse. The kernel answers a request within the send that carries it and a
dump's next part within the read that asks for it, so a wait that long is an answer lost (a receive
buffer overrun under NETLINK_NO_ENOBUFS, or a bug), never a slow kernel.
"""
from __future__ import annotations

import errno
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWQDISC, RTM_GETQDISC, RTM_NEWTCLASS, RTM_GETTCLASS = 36, 38, 40, 42
RTM_NEWTFILTER, RTM_DELTFILTER, RTM_GETTFILTER = 44, 45, 46
NLM_F_REQUEST, NLM_F_ACK, NLM_F_ECHO, NLM_F_DUMP_INTR = 0x1, 0x4, 0x8, 0x10
NLM_F_REPLACE, NLM_F_CREATE, NLM_F_DUMP = 0x100, 0x400, 0x300
TCA_KIND, TCA_OPTIONS, TCA_STATS2 = 1, 2, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3
TCA_U32_CLASSID, TCA_U32_SEL = 1, 5
TC_U32_TERMINAL = 1
NLA_TYPE_MASK = 0x3FFF          # without NLA_F_NESTED and NLA_F_NET_BYTEORDER

_HEADER = struct.Struct("=IHHII")       # struct nlmsghdr: length, type, flags, sequence, port
_TCMSG = struct.Struct("=BxxxiIII")     # struct tcmsg: family, pads, ifindex, handle, parent, info
_ATTR = struct.Struct("=HH")            # struct nlattr: length, type
_ERROR = struct.Struct("=i")            # struct nlmsgerr's error (0: an acknowledgement)
_BASIC = struct.Struct("=QI")           # struct gnet_stats_basic: bytes, packets
_QUEUE = struct.Struct("=IIIII")        # struct gnet_stats_queue: qlen, backlog, drops, requeues, overlimits
_U32_SEL = struct.Struct("=BBBxHHhhI")  # struct tc_u32_sel before its keys: flags, offshift, nkeys, pad, ...
_U32_KEY_MASK = struct.Struct(">II")    # struct tc_u32_key: mask, value (network order), then
_U32_KEY_OFF = struct.Struct("=ii")     # off, offmask
_U32_KEY_SIZE = _U32_KEY_MASK.size + _U32_KEY_OFF.size
_FIFO_LIMIT = struct.Struct("=I")       # struct tc_fifo_qopt: the limit (packets for pfifo)
_CLASSID = struct.Struct("=I")          # TCA_U32_CLASSID: a class handle
_NETEM = struct.Struct("=II")           # struct tc_netem_qopt begins: latency (in 64 ns ticks), limit
TIMEOUT_SECONDS = 5.0   # for a request's whole answer
BUFFER = 1 << 16        # a datagram's most: the kernel makes a dump's no larger than 32 KiB
DUMP_ATTEMPTS = 3       # a dump the kernel says changed while it was read (NLM_F_DUMP_INTR) is read again
SEQUENCES = 2**32       # nlmsghdr's sequence number: 32 bits


class NetlinkError(OSError):
    """An answer lost, cut short, or malformed: said as the kernel's refusals are, so callers handle both alike."""


class Qdisc(NamedTuple):
    handle: int
    kind: str
    options: bytes
    stats: tuple[int, int, int, int, int] | None   # as Rtnl.classes gives them


def attr(kind: int, payload: bytes) -> bytes:
    """One attribute, padded to 4 bytes."""
    data = _ATTR.pack(_ATTR.size + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def attrs(data: bytes, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each attribute in `data` from `offset`; NetlinkError for one that does not fit."""
    while len(data) - offset >= _ATTR.size:   # fewer bytes left are padding
        length, kind = _ATTR.unpack_from(data, offset)
        if length < _ATTR.size or offset + length > len(data):
            raise NetlinkError(f"netlink: an attribute of {length} bytes at byte {offset} of {len(data)}")
        yield kind & NLA_TYPE_MASK, data[offset + _ATTR.size:offset + length]
        offset += (length + 3) & ~3


def messages(data: bytes) -> Iterator[tuple[int, int, int, int, bytes]]:
    """(type, flags, sequence, sender's port, body after the header) of each message in one netlink datagram;
    NetlinkError for one that does not fit."""
    offset = 0
    while offset < len(data):
        length, kind, flags, seq, port = _unpack(_HEADER, data, offset)
        if length < _HEADER.size or offset + length > len(data):
            raise NetlinkError(f"netlink: a message of {length} bytes at byte {offset} of a {len(data)}-byte datagram")
        yield kind, flags, seq, port, data[offset + _HEADER.size:offset + length]
        offset += (length + 3) & ~3


def _unpack(layout: struct.Struct, data: bytes, offset: int = 0) -> tuple[Any, ...]:
    """struct's unpack_from, a NetlinkError where `data` is too short (struct.error is no OSError)."""
    if len(data) - offset < layout.size:
        raise NetlinkError(f"netlink: {len(data) - offset} bytes where {layout.size} were expected")
    return layout.unpack_from(data, offset)


def tcmsg(index: int, handle: int = 0, parent: int = 0, info: int = 0) -> bytes:
    return _TCMSG.pack(socket.AF_UNSPEC, index, handle, parent, info)


def u32_key_selector(mask: int, value: int) -> bytes:
    """struct tc_u32_sel with one struct tc_u32_key, terminal: a packet whose first 32-bit word under
    `mask` is `value` matches (mask, value and the offset masks in network order, as `tc` packs them)."""
    return (struct.pack("=BBBx", TC_U32_TERMINAL, 0, 1) + struct.pack(">H", 0) + struct.pack("=Hhh", 0, 0, 0)
            + struct.pack(">I", 0) + struct.pack(">II", mask, value) + struct.pack("=ii", 0, 0))


class Rtnl:
    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._sock.bind((0, 0))
        self._sock.settimeout(0)   # the answer is there when asked for: only one that is lost is waited for
        self._seq = 0
        self._buffer = bytearray(BUFFER)
        self._view = memoryview(self._buffer)

    @property
    def port(self) -> int:
        """The socket's netlink port, which the kernel's announcements of our changes carry."""
        port: int = self._sock.getsockname()[0]
        return port

    def close(self) -> None:
        self._sock.close()

    def request(self, kind: int, flags: int, payload: bytes) -> list[tuple[int, bytes]]:
        """Send one message; (type, body after the header) of each reply until the kernel's acknowledgement
        or, for a dump, its end. A refusal raises OSError with the kernel's errno; an answer lost, cut short
        or malformed, NetlinkError."""
        for _ in range(DUMP_ATTEMPTS):
            self._seq = self._seq % (SEQUENCES - 1) + 1    # 1, 2, ..., 2**32 - 1, 1: 0 is the kernel's own
            self._sock.send(_HEADER.pack(_HEADER.size + len(payload), kind, flags | NLM_F_REQUEST, self._seq, 0)
                            + payload)
            try:
                replies, interrupted = self._answer(self._seq, kind)
            except NetlinkError:
                self._drain()
                raise
            if not interrupted:
                return replies
        raise NetlinkError(f"netlink: the kernel's {_describe(kind)} changed while it was read, {DUMP_ATTEMPTS} times")

    def _answer(self, seq: int, kind: int) -> tuple[list[tuple[int, bytes]], bool]:
        """The replies to request `seq`, and whether the kernel said its dump changed while it was read."""
        replies: list[tuple[int, bytes]] = []
        interrupted = False
        deadline = time.monotonic() + TIMEOUT_SECONDS    # for the answer: others' late replies do not extend it
        while True:
            size = self._read(deadline, kind)
            if size > len(self._buffer):
                raise NetlinkError(f"netlink: a datagram of {size} bytes cut short to {len(self._buffer)}: "
                                   f"{_describe(kind)}")
            for reply, reply_flags, reply_seq, _, body in messages(bytes(self._view[:size])):
                if reply_seq != seq:
                    continue     # an answer to an earlier request we gave up on
                interrupted |= bool(reply_flags & NLM_F_DUMP_INTR)
                if reply in (NLMSG_ERROR, NLMSG_DONE):   # both begin with an errno: 0, or the request's refusal
                    (code,) = _unpack(_ERROR, body)
                    if code:
                        raise OSError(-code, f"netlink: {errno.errorcode.get(-code, -code)}: {_describe(kind)}")
                    return replies, interrupted
                replies.append((reply, body))

    def _read(self, deadline: float, kind: int) -> int:
        """The next datagram into the buffer; its own size (MSG_TRUNC), which may be more than the buffer's."""
        try:
            return self._sock.recv_into(self._buffer, 0, socket.MSG_TRUNC)
        except BlockingIOError:
            pass
        self._sock.settimeout(max(deadline - time.monotonic(), 0))
        try:
            return self._sock.recv_into(self._buffer, 0, socket.MSG_TRUNC)
        except (TimeoutError, BlockingIOError):   # the latter: no time was left to wait
            raise NetlinkError(f"netlink: no answer within {TIMEOUT_SECONDS:g} s: {_describe(kind)}") from None
        finally:
            self._sock.settimeout(0)

    def _drain(self) -> None:
        """Read what is left of an answer we gave up on: the kernel refuses another dump (EBUSY) until the one
        it is sending is read to its end, and goes on with it at each read."""
        try:
            while self._sock.recv_into(self._buffer):
                pass
        except OSError:   # nothing left (EAGAIN), or an overrun: nothing of it is ours to read
            pass

    def classes(self, index: int) -> Iterator[tuple[int, str, tuple[int, int, int, int, int] | None]]:
        """(handle, kind, (bytes, packets, drops, backlog bytes, backlog packets) or None) of each class of
        the device."""
        for reply, body in self.request(RTM_GETTCLASS, NLM_F_DUMP, tcmsg(index)):
            if reply == RTM_NEWTCLASS:
                handle, found = _tc_message(body)
                stats = found.get(TCA_STATS2)
                yield handle, found.get(TCA_KIND, b"").rstrip(b"\0").decode(), None if stats is None else _stats(stats)

    def qdisc(self, index: int, parent: int) -> Qdisc | None:
        """The qdisc under `parent`; None where the kernel shows none (the default pfifo HTB puts under a new
        class is hidden). The kernel answers a qdisc GET as an announcement: ECHO sends it to us too."""
        for reply, body in self.request(RTM_GETQDISC, NLM_F_ACK | NLM_F_ECHO, tcmsg(index, 0, parent)):
            if reply != RTM_NEWQDISC:
                continue
            handle, found = _tc_message(body)
            if TCA_KIND in found:
                stats = found.get(TCA_STATS2)
                return Qdisc(handle, found[TCA_KIND].rstrip(b"\0").decode(), found.get(TCA_OPTIONS, b""),
                             None if stats is None else _stats(stats))
        return None

    def u32_filters(self, index: int, parent: int, prio: int) -> Iterator[tuple[int, list[tuple[int, int, int]]]]:
        """(target class handle, its keys as (value, mask, offset)) of each u32 filter at `prio` under `parent`
        that sends to a class (the hash tables u32 lists beside them do not)."""
        for reply, body in self.request(RTM_GETTFILTER, NLM_F_DUMP, tcmsg(index, 0, parent, prio << 16)):
            found = _tc_message(body)[1] if reply == RTM_NEWTFILTER else {}
            if found.get(TCA_KIND) != b"u32\0" or TCA_OPTIONS not in found:
                continue
            options = dict(attrs(found[TCA_OPTIONS]))
            if TCA_U32_CLASSID in options and TCA_U32_SEL in options:
                yield _unpack(_CLASSID, options[TCA_U32_CLASSID])[0], u32_keys(options[TCA_U32_SEL])

    def replace_qdisc(self, index: int, handle: int, parent: int, kind: str, options: bytes) -> None:
        self.request(RTM_NEWQDISC, NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
                     tcmsg(index, handle, parent) + attr(TCA_KIND, kind.encode() + b"\0") + attr(TCA_OPTIONS, options))

    def delete_filters(self, index: int, parent: int, prio: int) -> None:
        """Every filter at `prio` under `parent`; none there (or no qdisc to hold one) is no error."""
        try:
            self.request(RTM_DELTFILTER, NLM_F_ACK, tcmsg(index, 0, parent, prio << 16))
        except OSError as err:
            if err.errno not in (errno.ENOENT, errno.EINVAL):
                raise

    def add_u32_filter(self, index: int, parent: int, prio: int, protocol: int, selector: bytes, target: int) -> None:
        options = attr(TCA_U32_CLASSID, struct.pack("=I", target)) + attr(TCA_U32_SEL, selector)
        self.request(RTM_NEWTFILTER, NLM_F_ACK | NLM_F_CREATE,
                     tcmsg(index, 0, parent, prio << 16 | socket.htons(protocol))
                     + attr(TCA_KIND, b"u32\0") + attr(TCA_OPTIONS, options))


def u32_keys(selector: bytes) -> list[tuple[int, int, int]]:
    """(value, mask, offset) of each key of a struct tc_u32_sel."""
    nkeys = _unpack(_U32_SEL, selector)[2]
    keys = []
    for k in range(nkeys):
        at = _U32_SEL.size + k * _U32_KEY_SIZE
        mask, value = _unpack(_U32_KEY_MASK, selector, at)
        offset, _ = _unpack(_U32_KEY_OFF, selector, at + _U32_KEY_MASK.size)
        keys.append((value, mask, offset))
    return keys


def fifo_limit(options: bytes) -> int | None:
    return _unpack(_FIFO_LIMIT, options)[0] if options else None


def netem_options(options: bytes) -> tuple[int, int] | None:
    """netem's (delay in µs, limit in packets). Its dump gives the delay in 64 ns ticks: rounded, what was
    set in µs comes back."""
    if not options:
        return None
    ticks, limit = _unpack(_NETEM, options)
    return round((ticks << 6) / 1000), limit


def _tc_message(body: bytes) -> tuple[int, dict[int, bytes]]:
    """The handle and the attributes of a qdisc, class or filter message."""
    return _unpack(_TCMSG, body)[2], dict(attrs(body, _TCMSG.size))


def _stats(data: bytes) -> tuple[int, int, int, int, int] | None:
    basic = queue = None
    for key, value in attrs(data):
        if key == TCA_STATS_BASIC:
            basic = _unpack(_BASIC, value)
        elif key == TCA_STATS_QUEUE:
            queue = _unpack(_QUEUE, value)
    if basic is None or queue is None:
        return None
    return basic[0], basic[1], queue[2], queue[1], queue[0]


def _describe(kind: int) -> str:
    return {RTM_NEWQDISC: "qdisc", RTM_GETTCLASS: "class dump", RTM_NEWTFILTER: "filter",
            RTM_DELTFILTER: "filter deletion", RTM_GETQDISC: "qdisc",
            RTM_GETTFILTER: "filter dump"}.get(kind, str(kind))
