"""The Ethernet frames the controller reads and writes itself: its discovery frames (LLDP), ARP.

A discovery frame is LLDP (IEEE 802.1AB) sent out of a switch port: its chassis and port TLVs name the
datapath and port it left, and an organisation-specific TLV carries when it was sent, a nonce and a tag,
an HMAC of all four under a key only the controller (or its cluster) holds. A host can send LLDP too; one
it made up has no valid tag, and one it captured and sends again has a nonce already used or is too old
(controller/core/topology.py judges both). Pure: bytes in, bytes out.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

ETH_LLDP, ETH_ARP, ETH_IPV4 = 0x88CC, 0x0806, 0x0800
LLDP_DST = bytes.fromhex("0180c200000e")      # nearest bridge: no 802.1D bridge forwards it
BROADCAST = b"\xff" * 6
_OUI = b"\x02QS"                               # a locally administered organisation id: ours
_TLV_END, _TLV_CHASSIS, _TLV_PORT, _TLV_TTL, _TLV_ORG = 0, 1, 2, 3, 127
_LOCAL = 7                                     # chassis and port id subtype: locally assigned
_PROOF = struct.Struct("!3sBQ8s16s")           # OUI, subtype, sent (ms), nonce, tag


def mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def mac_bytes(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def multicast(mac: str) -> bool:
    """A group address (broadcast included): the low bit of the first octet."""
    return bool(int(mac[:2], 16) & 1)


def addresses(data: bytes) -> tuple[str, str, int] | None:
    """(destination, source, EtherType) of an untagged Ethernet frame; None for a runt."""
    if len(data) < 14:
        return None
    return mac_text(data[0:6]), mac_text(data[6:12]), struct.unpack_from("!H", data, 12)[0]


# --- discovery (LLDP) ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    """What a discovery frame says: it left `dp_id` by `port_no` at `sent_ms` (wall clock)."""
    dp_id: int
    port_no: int
    sent_ms: int
    nonce: bytes
    tag: bytes


def _tag(key: bytes, dp_id: int, port_no: int, sent_ms: int, nonce: bytes) -> bytes:
    return hmac.new(key, struct.pack("!QIQ8s", dp_id, port_no, sent_ms, nonce), hashlib.sha256).digest()[:16]


def _tlv(kind: int, value: bytes) -> bytes:
    return struct.pack("!H", kind << 9 | len(value)) + value


def probe_frame(key: bytes, dp_id: int, port_no: int, sent_ms: int, nonce: bytes) -> bytes:
    """The discovery frame to send out of `port_no` of `dp_id`."""
    source = b"\x02" + dp_id.to_bytes(8, "big")[-5:]     # unicast, locally administered: LLDP needs a source
    body = (_tlv(_TLV_CHASSIS, bytes([_LOCAL]) + f"dpid:{dp_id:016x}".encode())
            + _tlv(_TLV_PORT, bytes([_LOCAL]) + str(port_no).encode())
            + _tlv(_TLV_TTL, struct.pack("!H", 120))
            + _tlv(_TLV_ORG, _PROOF.pack(_OUI, 1, sent_ms, nonce, _tag(key, dp_id, port_no, sent_ms, nonce)))
            + _tlv(_TLV_END, b""))
    return LLDP_DST + source + struct.pack("!H", ETH_LLDP) + body


def read_probe(data: bytes) -> Probe | None:
    """The claims of a discovery frame of ours, not yet checked; None for any other frame."""
    found = addresses(data)
    if found is None or found[2] != ETH_LLDP:
        return None
    tlvs: dict[int, bytes] = {}
    at = 14
    while at + 2 <= len(data):
        head = struct.unpack_from("!H", data, at)[0]
        kind, length = head >> 9, head & 0x1FF
        value = data[at + 2:at + 2 + length]
        if len(value) < length:
            return None
        if kind == _TLV_END:
            break
        tlvs.setdefault(kind, value)
        at += 2 + length
    chassis, port, proof = tlvs.get(_TLV_CHASSIS, b""), tlvs.get(_TLV_PORT, b""), tlvs.get(_TLV_ORG, b"")
    if chassis[:1] != bytes([_LOCAL]) or port[:1] != bytes([_LOCAL]) or len(proof) != _PROOF.size:
        return None
    oui, subtype, sent_ms, nonce, tag = _PROOF.unpack(proof)
    try:
        name, port_text = chassis[1:].decode("ascii"), port[1:].decode("ascii")
        if oui != _OUI or subtype != 1 or not name.startswith("dpid:") or not port_text.isdigit():
            return None
        return Probe(int(name[5:], 16), int(port_text), sent_ms, nonce, tag)
    except (UnicodeDecodeError, ValueError):
        return None


def genuine(key: bytes, probe: Probe) -> bool:
    """Whether the frame's tag is one only the key's holder could have made."""
    return hmac.compare_digest(probe.tag, _tag(key, probe.dp_id, probe.port_no, probe.sent_ms, probe.nonce))


# --- ARP (over Ethernet, for IPv4) ------------------------------------------------------------------------

ARP_REQUEST, ARP_REPLY = 1, 2
_ARP = struct.Struct("!HHBBH6s4s6s4s")


@dataclass(frozen=True)
class Arp:
    op: int
    sender_mac: str
    sender_ip: str
    target_mac: str
    target_ip: str


def read_arp(data: bytes) -> Arp | None:
    found = addresses(data)
    if found is None or found[2] != ETH_ARP or len(data) < 14 + _ARP.size:
        return None
    htype, ptype, hlen, plen, op, sha, spa, tha, tpa = _ARP.unpack_from(data, 14)
    if (htype, ptype, hlen, plen) != (1, ETH_IPV4, 6, 4) or op not in (ARP_REQUEST, ARP_REPLY):
        return None
    return Arp(op, mac_text(sha), _ip(spa), mac_text(tha), _ip(tpa))


def arp_reply(request: Arp, mac: str) -> bytes:
    """The answer to `request`, as the host that has its target address (`mac`) would give it."""
    body = _ARP.pack(1, ETH_IPV4, 6, 4, ARP_REPLY, mac_bytes(mac), _ip_bytes(request.target_ip),
                     mac_bytes(request.sender_mac), _ip_bytes(request.sender_ip))
    return mac_bytes(request.sender_mac) + mac_bytes(mac) + struct.pack("!H", ETH_ARP) + body


def _ip(raw: bytes) -> str:
    return ".".join(map(str, raw))


def _ip_bytes(text: str) -> bytes:
    return bytes(int(part) for part in text.split("."))
