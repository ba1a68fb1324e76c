"""When a UDP flood reaches the switch: the onset an `auto` reaction is measured from.

The iperf3 client's own times cannot give it: its JSON stamps whole seconds, and the moment it exits
comes after a closing exchange that crosses the congested bottleneck (tens of milliseconds behind a
full queue), so a start derived from it is late by as much, and a fast reaction would look faster or
even negative. Instead a packet socket on the switch port the flood enters by keeps the kernel's
receive time of every UDP datagram carrying data; the first one after a quiet GAP_SECONDS starts a
burst. Steering is read on the same switch (fidelity.Monitor's class counters), on the same clock.
"""
from __future__ import annotations

import ctypes
import socket
import struct
import threading
from dataclasses import dataclass, field

ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26
SO_TIMESTAMPNS = 35          # its control message type is the same number
PACKET_OUTGOING = 4          # sll_pkttype of what the switch sends on the port, not what it receives
GAP_SECONDS = 0.5
MIN_PAYLOAD = 64             # iperf3's connect datagram and its reply carry 4 bytes; its data 1 KB or more
SNAP = 64                    # the headers are all that is read
UDP_HEADER = 8

# Classic BPF: accept the first SNAP bytes of an IPv4 UDP frame, drop everything else in the kernel,
# so that the TCP flow beside the flood costs this thread nothing.
_FILTER = [
    (0x28, 0, 0, 12),            # ldh [12]          ethertype
    (0x15, 0, 3, 0x0800),        # jeq IPv4, else drop
    (0x30, 0, 0, 23),            # ldb [23]          IP protocol
    (0x15, 0, 1, 17),            # jeq UDP, else drop
    (0x06, 0, 0, SNAP),          # ret SNAP
    (0x06, 0, 0, 0),             # ret 0             drop
]


def is_udp_data(frame: bytes) -> bool:
    """An Ethernet/IPv4/UDP frame (its first bytes) whose datagram carries MIN_PAYLOAD bytes or more,
    by the IP total length."""
    if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
        return False
    total = struct.unpack_from("!H", frame, 16)[0]
    return total - (frame[14] & 0x0F) * 4 - UDP_HEADER >= MIN_PAYLOAD


@dataclass
class UdpOnsets:
    """While in a `with` block, the kernel times of the UDP data datagrams `iface` receives, kept as the
    starts of their bursts (`starts`, wall clock)."""
    iface: str
    starts: list[float] = field(default_factory=list)

    def __enter__(self) -> UdpOnsets:
        # Protocol 0 receives nothing until bound: no frame of another port or outside the filter is queued.
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        # struct sock_fprog: the number of instructions and their address, which must stay valid
        # while setsockopt copies them.
        program = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in _FILTER))
        fprog = struct.pack("HL", len(_FILTER), ctypes.addressof(program))
        self._sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._sock.bind((self.iface, ETH_P_ALL))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._last = float("-inf")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                frame, ancillary, _flags, address = self._sock.recvmsg(SNAP, socket.CMSG_SPACE(16))
            except TimeoutError:
                continue
            if address[2] == PACKET_OUTGOING or not is_udp_data(frame):
                continue
            stamp = next((struct.unpack("qq", data[:16]) for level, kind, data in ancillary
                          if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS), None)
            if stamp is None:
                continue
            t = stamp[0] + stamp[1] / 1e9
            if t - self._last >= GAP_SECONDS:
                self.starts.append(t)
            self._last = t
