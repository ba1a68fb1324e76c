"""topo/harness/onsets.py: which frames start a UDP onset."""
import struct

from topo.harness.onsets import MIN_PAYLOAD, is_udp_data


def frame(protocol: int, payload: int, ethertype: bytes = b"\x08\x00") -> bytes:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + 8 + payload, 0, 0, 64, protocol, 0, bytes(4), bytes(4))
    return bytes(12) + ethertype + ip + bytes(8 + min(payload, 16))


def test_udp_data_starts_an_onset():
    assert is_udp_data(frame(17, 1448))
    assert is_udp_data(frame(17, MIN_PAYLOAD))


def test_iperf3s_four_byte_connect_datagram_does_not():
    assert not is_udp_data(frame(17, 4))


def test_tcp_ipv6_and_runts_do_not():
    assert not is_udp_data(frame(6, 1448))
    assert not is_udp_data(frame(17, 1448, ethertype=b"\x86\xdd"))
    assert not is_udp_data(frame(17, 1448)[:30])
