"""controller/adapters/rtnl.py's packing, against the bytes `tc` itself sends (tc 6.1: `tc filter add dev D
parent 1: prio 7 protocol ip u32 match ip dsfield 0xb8 0xfc flowid 1:4`, as strace -xx showed its sendmsg)."""
import errno
import socket
import struct
import threading
import time
from collections.abc import Callable

import pytest

from controller.adapters import rtnl
from controller.adapters.rtnl import (
    TCA_KIND,
    TCA_STATS2,
    Rtnl,
    _stats,
    attr,
    attrs,
    fifo_limit,
    messages,
    netem_options,
    tcmsg,
    u32_key_selector,
    u32_keys,
)
from controller.adapters.tc import Tc

# struct tc_u32_sel of that filter: terminal, one key; the key: mask 0x00fc0000, value 0x00b80000 (the DS
# field 0xb8 is the second byte of the IPv4 header's first word), offset 0.
TC_SELECTOR = bytes.fromhex("01000100" "0000" "0000" "0000" "0000" "00000000" "00fc0000" "00b80000" "00000000" "00000000")


def test_the_dscp_selector_is_packed_as_tc_packs_it():
    assert u32_key_selector(0x3F << 18, 46 << 18) == TC_SELECTOR


def test_attributes_are_padded_to_four_bytes_and_read_back_nested_or_not():
    packed = attr(TCA_KIND, b"u32\0") + attr(TCA_KIND, b"htb") + attr(TCA_STATS2 | 0x8000, b"")
    assert len(packed) == 8 + 8 + 4
    assert list(attrs(packed)) == [(TCA_KIND, b"u32\0"), (TCA_KIND, b"htb"), (TCA_STATS2, b"")]


def test_a_classs_statistics_are_its_bytes_packets_drops_and_backlog():
    basic = attr(1, struct.pack("=QI", 5_000_000_000, 7) + b"\0" * 4)       # TCA_STATS_BASIC, padded as sent
    queue = attr(3, struct.pack("=IIIII", 2, 3000, 11, 0, 5))                # qlen, backlog, drops, requeues, overlimits
    assert _stats(basic + queue) == (5_000_000_000, 7, 11, 3000, 2)
    assert _stats(basic) is None


def test_a_tcmsg_names_the_device_handle_parent_and_prio():
    assert tcmsg(3, 0x1020000, 0x10002, 7 << 16) == struct.pack("=BxxxiIII", 0, 3, 0x1020000, 0x10002, 7 << 16)


def test_a_u32_selectors_keys_are_read_back_as_value_mask_and_offset():
    assert u32_keys(TC_SELECTOR) == [(0x00B80000, 0x00FC0000, 0)]


def test_a_fifos_limit_is_its_options_first_word():
    assert fifo_limit(struct.pack("=I", 40)) == 40
    assert fifo_limit(b"") is None


def test_netems_delay_and_limit_are_read_its_ticks_back_to_the_microseconds_it_was_given():
    # struct tc_netem_qopt as the kernel dumps it: latency in 64 ns ticks (ns >> 6), the limit, then loss, ...
    for us in (1, 999, 10_000, 2_500, 60_000_000):
        assert netem_options(struct.pack("=IIIIII", us * 1000 >> 6, 29, 0, 0, 0, 0)) == (us, 29)
    assert netem_options(b"") is None


# --- the client against a fake kernel: one end of a datagram socket pair, answering each request as told ---
NLMSG_ERROR, NLMSG_DONE, RTM_NEWQDISC, RTM_NEWTCLASS = 2, 3, 36, 40
NLM_F_MULTI, NLM_F_DUMP_INTR = 0x2, 0x10


def message(kind: int, seq: int, body: bytes = b"", flags: int = 0) -> bytes:
    data = struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body
    return data + b"\0" * (-len(data) % 4)


def tc_class(seq: int, handle: int, flags: int = NLM_F_MULTI) -> bytes:
    stats = attr(1, struct.pack("=QI", 100 * handle, handle) + b"\0" * 4) + attr(3, struct.pack("=IIIII", 0, 0, 0, 0, 0))
    return message(RTM_NEWTCLASS, seq, tcmsg(1, handle) + attr(TCA_KIND, b"htb\0") + attr(TCA_STATS2, stats), flags)


def done(seq: int, code: int = 0, flags: int = NLM_F_MULTI) -> bytes:
    return message(NLMSG_DONE, seq, struct.pack("=i", code), flags)


def ack(seq: int, code: int = 0) -> bytes:
    """struct nlmsgerr: the errno (0: done), then the request's header."""
    return message(NLMSG_ERROR, seq, struct.pack("=i", code) + b"\0" * 16)


class Kernel:
    """Stands in for the kernel behind an Rtnl: `answer(seq, n)` gives the datagrams that answer its n-th request."""

    def __init__(self, answer: Callable[[int, int], list[bytes]]) -> None:
        self.rtnl = Rtnl()
        self.rtnl._sock.close()
        self.rtnl._sock, self._sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.rtnl._sock.setblocking(False)   # as the Rtnl keeps its own
        self.seqs: list[int] = []
        threading.Thread(target=self._serve, args=(answer,), daemon=True).start()

    def _serve(self, answer: Callable[[int, int], list[bytes]]) -> None:
        try:
            while data := self._sock.recv(1 << 16):
                seq = struct.unpack_from("=IHHII", data)[3]
                self.seqs.append(seq)
                for datagram in answer(seq, len(self.seqs)):
                    self._sock.send(datagram)
        except OSError:    # closed at the test's end
            pass

    def close(self) -> None:
        self.rtnl.close()
        self._sock.shutdown(socket.SHUT_RDWR)    # ends the thread's read
        self._sock.close()


@pytest.fixture
def kernel():
    made: list[Kernel] = []
    yield lambda answer: made.append(Kernel(answer)) or made[-1]
    for k in made:
        k.close()


def classes(k: Kernel) -> list[int]:
    return [handle for handle, _, _ in k.rtnl.classes(1)]


def test_an_answer_that_never_comes_is_an_oserror_after_the_timeout_and_the_next_request_is_answered(kernel,
                                                                                                     monkeypatch):
    monkeypatch.setattr(rtnl, "TIMEOUT_SECONDS", 0.3)
    k = kernel(lambda seq, n: [] if n == 1 else [tc_class(seq, 0x10001), done(seq)])
    started = time.monotonic()
    with pytest.raises(OSError, match="no answer within 0.3 s: class dump"):
        classes(k)
    assert 0.3 <= time.monotonic() - started < 2
    assert classes(k) == [0x10001]


def test_a_stream_of_other_requests_answers_does_not_stretch_the_timeout(kernel, monkeypatch):
    monkeypatch.setattr(rtnl, "TIMEOUT_SECONDS", 0.3)
    # An answer to an earlier request every 0.1 s, never ours: the wait is for the request, not for each read.
    k = kernel(lambda seq, n: [])
    stop = threading.Event()
    def late():
        while not stop.wait(0.1):
            k._sock.send(done(12345))
    threading.Thread(target=late, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(OSError, match="no answer"):
            classes(k)
    finally:
        stop.set()
    assert time.monotonic() - started < 1


def test_sequence_numbers_wrap_within_32_bits(kernel):
    k = kernel(lambda seq, n: [done(seq)])
    k.rtnl._seq = 2**32 - 2          # months of requests at 10,000 ports
    for _ in range(3):
        assert classes(k) == []
    assert k.seqs == [2**32 - 1, 1, 2]


def test_a_datagram_longer_than_the_buffer_is_an_oserror_and_what_is_left_of_its_answer_is_not_read_as_the_next(
        kernel, monkeypatch):
    monkeypatch.setattr(rtnl, "BUFFER", 256)
    # The first dump's first datagram is cut short; two more of its datagrams follow it.
    k = kernel(lambda seq, n: [tc_class(seq, 0x10001) * 3, tc_class(seq, 0x10002), done(seq)] if n == 1 else
               [tc_class(seq, 0x10003), done(seq)])
    with pytest.raises(OSError, match="cut short"):
        classes(k)
    assert classes(k) == [0x10003]


def test_an_interrupted_dump_is_read_again_and_one_interrupted_every_time_is_an_oserror(kernel):
    k = kernel(lambda seq, n: [tc_class(seq, 0x10001, NLM_F_MULTI | NLM_F_DUMP_INTR), done(seq)] if n == 1 else
               [tc_class(seq, 0x10002), done(seq)])
    assert classes(k) == [0x10002] and len(k.seqs) == 2
    k = kernel(lambda seq, n: [tc_class(seq, 0x10001), done(seq, flags=NLM_F_MULTI | NLM_F_DUMP_INTR)])
    with pytest.raises(OSError, match="changed while it was read"):
        classes(k)
    assert len(k.seqs) == rtnl.DUMP_ATTEMPTS


def test_a_dump_that_ends_in_an_error_is_that_error(kernel):
    k = kernel(lambda seq, n: [tc_class(seq, 0x10001), done(seq, -errno.EMSGSIZE)])
    with pytest.raises(OSError) as raised:
        classes(k)
    assert raised.value.errno == errno.EMSGSIZE


@pytest.mark.parametrize("answer", [
    lambda seq: message(RTM_NEWTCLASS, seq, tcmsg(1)[:12], NLM_F_MULTI),                       # a body cut short
    lambda seq: message(RTM_NEWTCLASS, seq, tcmsg(1) + struct.pack("=HH", 40, TCA_KIND) + b"htb\0", NLM_F_MULTI),
    lambda seq: message(RTM_NEWTCLASS, seq, tcmsg(1) + struct.pack("=HH", 2, TCA_KIND), NLM_F_MULTI),
    lambda seq: tc_class(seq, 1)[:-8],                                                        # past the datagram
    lambda seq: message(NLMSG_ERROR, seq, b"\0\0"),                                            # an error cut short
])
def test_a_malformed_answer_is_an_oserror_never_dropped_nor_another_exception(kernel, answer):
    k = kernel(lambda seq, n: [answer(seq), done(seq)])
    with pytest.raises(OSError, match="netlink"):
        classes(k)


def test_malformed_messages_and_attributes_are_refused():
    with pytest.raises(OSError):
        list(attrs(b"\x02\x00\x01\x00"))                   # a length shorter than its header
    with pytest.raises(OSError):
        list(attrs(attr(TCA_KIND, b"htb\0")[:6]))           # a length past the data
    assert list(attrs(attr(TCA_KIND, b"htb\0") + b"\0\0")) == [(TCA_KIND, b"htb\0")]   # padding is no attribute
    with pytest.raises(OSError):
        list(messages(message(RTM_NEWTCLASS, 1, b"abcd")[:18]))
    with pytest.raises(OSError):
        u32_keys(TC_SELECTOR[:16])                         # a key the message cut short


def test_a_leaf_that_cannot_be_read_is_an_error_and_only_a_class_that_is_gone_is_left_out(kernel):
    k = kernel(lambda seq, n: [ack(seq, -errno.ENOENT)] if n == 1 else [message(RTM_NEWQDISC, seq, tcmsg(1)[:12]), ack(seq)])
    tc = Tc()
    tc._rtnl.close()
    tc._rtnl = k.rtnl
    assert tc.leaves("lo", ["1:1"]) == {}              # the kernel: no such class (any more)
    with pytest.raises(OSError, match="netlink"):
        tc.leaves("lo", ["1:2"])                       # an answer that does not parse
