"""The rtnetlink messages of traffic control the controller sends, packed and read with struct.

Applying a policy to 10,000 ports asks the kernel about 100,000 times (each port's classes, a leaf per
class, its DSCP filters): through pyroute2 that took 79.5 s of a 125 s apply, most of it encoding and
decoding messages in Python; a cluster member taking over 1000 ports spent most of its hand-off reading
their leaves and filters through it. These are the same messages `tc` sends (struct tcmsg and its
attributes, linux/rtnetlink.h and linux/pkt_sched.h). One request at a time on one socket: callers hold
their own lock.
"""
from __future__ import annotations

import errno
import itertools
import socket
import struct
from collections.abc import Iterator
from typing import NamedTuple

NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWQDISC, RTM_GETQDISC, RTM_NEWTCLASS, RTM_GETTCLASS = 36, 38, 40, 42
RTM_NEWTFILTER, RTM_DELTFILTER, RTM_GETTFILTER = 44, 45, 46
NLM_F_REQUEST, NLM_F_ACK, NLM_F_ECHO = 0x1, 0x4, 0x8
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
_NETEM = struct.Struct("=II")           # struct tc_netem_qopt begins: latency (in 64 ns ticks), limit


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
    """(type, payload) of each attribute in `data` from `offset`."""
    while offset + _ATTR.size <= len(data):
        length, kind = _ATTR.unpack_from(data, offset)
        if length < _ATTR.size:
            return
        yield kind & NLA_TYPE_MASK, data[offset + _ATTR.size:offset + length]
        offset += (length + 3) & ~3


def messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, sequence, sender's port, body after the header) of each whole message in one netlink datagram."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, seq, port = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            return
        yield kind, seq, port, data[offset + _HEADER.size:offset + length]
        offset += (length + 3) & ~3


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
        self._seq = itertools.count(1)

    @property
    def port(self) -> int:
        """The socket's netlink port, which the kernel's announcements of our changes carry."""
        port: int = self._sock.getsockname()[0]
        return port

    def close(self) -> None:
        self._sock.close()

    def request(self, kind: int, flags: int, payload: bytes) -> list[tuple[int, bytes]]:
        """Send one message; (type, body after the header) of each reply until the kernel's acknowledgement
        or, for a dump, its end. A refusal raises OSError with the kernel's errno."""
        seq = next(self._seq)
        self._sock.send(_HEADER.pack(_HEADER.size + len(payload), kind, flags | NLM_F_REQUEST, seq, 0) + payload)
        replies: list[tuple[int, bytes]] = []
        while True:
            for reply, reply_seq, _, body in messages(self._sock.recv(1 << 16)):
                if reply_seq != seq:
                    continue     # an answer to an earlier request we gave up on
                if reply == NLMSG_ERROR:
                    (code,) = _ERROR.unpack_from(body)
                    if code:
                        raise OSError(-code, f"netlink: {errno.errorcode.get(-code, -code)}: {_describe(kind)}")
                    return replies
                if reply == NLMSG_DONE:
                    return replies
                replies.append((reply, body))

    def classes(self, index: int) -> Iterator[tuple[int, str, tuple[int, int, int, int, int] | None]]:
        """(handle, kind, (bytes, packets, drops, backlog bytes, backlog packets) or None) of each class of
        the device."""
        for reply, body in self.request(RTM_GETTCLASS, NLM_F_DUMP, tcmsg(index)):
            if reply != RTM_NEWTCLASS:
                continue
            _, _, handle, _, _ = _TCMSG.unpack_from(body)
            kind, stats = "", None
            for key, value in attrs(body, _TCMSG.size):
                if key == TCA_KIND:
                    kind = value.rstrip(b"\0").decode()
                elif key == TCA_STATS2:
                    stats = _stats(value)
            yield handle, kind, stats

    def qdisc(self, index: int, parent: int) -> Qdisc | None:
        """The qdisc under `parent`; None where the kernel shows none (the default pfifo HTB puts under a new
        class is hidden). The kernel answers a qdisc GET as an announcement: ECHO sends it to us too."""
        for reply, body in self.request(RTM_GETQDISC, NLM_F_ACK | NLM_F_ECHO, tcmsg(index, 0, parent)):
            if reply != RTM_NEWQDISC:
                continue
            found = dict(attrs(body, _TCMSG.size))
            if TCA_KIND in found:
                stats = found.get(TCA_STATS2)
                return Qdisc(_TCMSG.unpack_from(body)[2], found[TCA_KIND].rstrip(b"\0").decode(),
                             found.get(TCA_OPTIONS, b""), None if stats is None else _stats(stats))
        return None

    def u32_filters(self, index: int, parent: int, prio: int) -> Iterator[tuple[int, list[tuple[int, int, int]]]]:
        """(target class handle, its keys as (value, mask, offset)) of each u32 filter at `prio` under `parent`
        that sends to a class (the hash tables u32 lists beside them do not)."""
        for reply, body in self.request(RTM_GETTFILTER, NLM_F_DUMP, tcmsg(index, 0, parent, prio << 16)):
            found = dict(attrs(body, _TCMSG.size))
            if reply != RTM_NEWTFILTER or found.get(TCA_KIND) != b"u32\0" or TCA_OPTIONS not in found:
                continue
            options = dict(attrs(found[TCA_OPTIONS]))
            if TCA_U32_CLASSID in options and TCA_U32_SEL in options:
                yield struct.unpack_from("=I", options[TCA_U32_CLASSID])[0], u32_keys(options[TCA_U32_SEL])

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
    nkeys = _U32_SEL.unpack_from(selector)[2]
    keys = []
    for k in range(nkeys):
        at = _U32_SEL.size + k * _U32_KEY_SIZE
        if at + _U32_KEY_SIZE > len(selector):
            break
        mask, value = _U32_KEY_MASK.unpack_from(selector, at)
        offset, _ = _U32_KEY_OFF.unpack_from(selector, at + _U32_KEY_MASK.size)
        keys.append((value, mask, offset))
    return keys


def fifo_limit(options: bytes) -> int | None:
    return _FIFO_LIMIT.unpack_from(options)[0] if len(options) >= _FIFO_LIMIT.size else None


def netem_options(options: bytes) -> tuple[int, int] | None:
    """netem's (delay in µs, limit in packets). Its dump gives the delay in 64 ns ticks: rounded, what was
    set in µs comes back."""
    if len(options) < _NETEM.size:
        return None
    ticks, limit = _NETEM.unpack_from(options)
    return round((ticks << 6) / 1000), limit


def _stats(data: bytes) -> tuple[int, int, int, int, int] | None:
    basic = queue = None
    for key, value in attrs(data):
        if key == TCA_STATS_BASIC and len(value) >= _BASIC.size:
            basic = _BASIC.unpack_from(value)
        elif key == TCA_STATS_QUEUE and len(value) >= _QUEUE.size:
            queue = _QUEUE.unpack_from(value)
    if basic is None or queue is None:
        return None
    return basic[0], basic[1], queue[2], queue[1], queue[0]


def _describe(kind: int) -> str:
    return {RTM_NEWQDISC: "qdisc", RTM_GETTCLASS: "class dump", RTM_NEWTFILTER: "filter",
            RTM_DELTFILTER: "filter deletion", RTM_GETQDISC: "qdisc",
            RTM_GETTFILTER: "filter dump"}.get(kind, str(kind))
