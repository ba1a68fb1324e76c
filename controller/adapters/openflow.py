"""OpenFlow 1.3 both ways: the core's messages (controller/core/actions.py) built as os-ken messages,
and the switch's replies read back into the core's events (controller/core/events.py), in the core's
own types, so that desired and actual compare directly."""
from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

from controller.core import actions as act
from controller.core import events as ev
from controller.core.flows import CLASSIFIED, COOKIE, COOKIE_MASK, FlowEntry
from controller.core.flows import is_ours as our_flow
from controller.core.meters import is_ours
from controller.core.plan import ActualFlow
from controller.core.policy import Police
from controller.core.stats import FlowCounters, MeterCounters, PortCounters, QueueCounters

# os-ken's datapaths, protocol modules and messages are untyped.
Datapath = Any
OFProto = Any
OFPMessage = Any
ALL_COOKIE_BITS = 0xFFFF_FFFF_FFFF_FFFF
METER_FLAGS = ("OFPMF_KBPS", "OFPMF_BURST", "OFPMF_STATS")
ROLES = {"master": "OFPCR_ROLE_MASTER", "slave": "OFPCR_ROLE_SLAVE", "equal": "OFPCR_ROLE_EQUAL",
         "nochange": "OFPCR_ROLE_NOCHANGE"}
NO_GENERATION = 0xFFFF_FFFF_FFFF_FFFF   # a role reply's generation id when the bridge never had one
# The flow monitor (ONF's extension 187, which OVS has for OpenFlow 1.3): flows added, deleted (by hand, or with
# their meter) and changed, by any connection but this one; and each update's cookie, 16 bytes in. The request is
# packed here: OVS reads a whole ofp_match after it (os-ken sends its fields alone, which OVS refuses as BAD_LEN).
# The extension's numbers are written out: the adapter runs under os-ken and Ryu alike (controller/compat.py).
ONF_EXPERIMENTER, ONF_FLOW_MONITOR, ONF_MONITOR_RESUMED = 0x4F4E4600, 1870, 1872
MONITOR_FLAGS = 1 << 1 | 1 << 2 | 1 << 3            # added, deleted, modified; not the initial flows, nor our own
_ABBREVIATED = 3                                    # an update of one's own change: no cookie
_MONITOR_REQUEST = struct.Struct("!IHHIB3xHH4x")    # id, flags, match length, out port, table; an empty ofp_match
_EMPTY_MATCH = (1, 4)                               # OXM, of no field
_UPDATE_HEADER, _UPDATE_COOKIE = struct.Struct("!HH"), struct.Struct("!Q")
_UPDATE_FULL_LENGTH, _UPDATE_COOKIE_AT = 24, 16
_CODE_PREFIX = {"OFPET_BAD_REQUEST": "OFPBRC_", "OFPET_BAD_ACTION": "OFPBAC_", "OFPET_BAD_INSTRUCTION": "OFPBIC_",
                "OFPET_BAD_MATCH": "OFPBMC_", "OFPET_FLOW_MOD_FAILED": "OFPFMFC_",
                "OFPET_METER_MOD_FAILED": "OFPMMFC_", "OFPET_ROLE_REQUEST_FAILED": "OFPRRFC_",
                "OFPET_QUEUE_OP_FAILED": "OFPQOFC_", "OFPET_SWITCH_CONFIG_FAILED": "OFPSCFC_"}


# --- the core's messages, built -------------------------------------------------------------------------

def ports(dp: Datapath) -> frozenset[int]:
    """The switch's ports as the framework knows them, without the bridge's own (LOCAL), which never queues."""
    return frozenset(p for p in dp.ports if p != dp.ofproto.OFPP_LOCAL)


def down(dp: Datapath) -> frozenset[int]:
    """Those of them whose link is down, or that are set down."""
    ofp = dp.ofproto
    return frozenset(p for p, desc in dp.ports.items() if p != ofp.OFPP_LOCAL
                     and (desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN))


def message(dp: Datapath, m: act.Message) -> OFPMessage:
    """The os-ken message for one of the core's, with the core's xid."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    if isinstance(m, act.AddFlow | act.ModifyFlow):
        e = m.entry
        # Flagged so that the switch says when it is deleted (by hand, by another tool): repaired without a read.
        msg = parser.OFPFlowMod(dp, cookie=e.cookie, priority=e.priority, table_id=e.table,
                                flags=ofp.OFPFF_SEND_FLOW_REM,
                                command=ofp.OFPFC_ADD if isinstance(m, act.AddFlow) else ofp.OFPFC_MODIFY_STRICT,
                                match=parser.OFPMatch(**dict(e.match)), instructions=_instructions(dp, e))
    elif isinstance(m, act.DeleteFlow):
        msg = parser.OFPFlowMod(dp, cookie=m.cookie, cookie_mask=ALL_COOKIE_BITS, table_id=ofp.OFPTT_ALL,
                                command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)
    elif isinstance(m, act.MeterMod):
        command = {"add": ofp.OFPMC_ADD, "modify": ofp.OFPMC_MODIFY, "delete": ofp.OFPMC_DELETE}[m.command]
        bands = [parser.OFPMeterBandDrop(rate=m.band.rate_kbps, burst_size=m.band.burst_kbits)] if m.band else []
        flags = sum(getattr(ofp, f) for f in METER_FLAGS) if m.band else 0
        msg = parser.OFPMeterMod(dp, command=command, flags=flags, meter_id=m.meter, bands=bands)
    elif isinstance(m, act.Barrier):
        msg = parser.OFPBarrierRequest(dp)
    elif isinstance(m, act.StatsRequest):
        msg = _stats_request(dp, m)
    elif isinstance(m, act.RoleRequest):
        msg = parser.OFPRoleRequest(dp, getattr(ofp, ROLES[m.role]), m.generation)
    elif isinstance(m, act.Echo):
        msg = parser.OFPEchoRequest(dp)
    elif isinstance(m, act.HearAsSlave):
        # [as master or equal, as slave]: OpenFlow 1.3's defaults, but packet-ins of either reason as a slave.
        packet_ins = 1 << ofp.OFPR_NO_MATCH | 1 << ofp.OFPR_ACTION
        msg = parser.OFPSetAsync(dp, [packet_ins | 1 << ofp.OFPR_INVALID_TTL, packet_ins],
                                 [0b111, 0b111], [0b1111, 0])
    elif isinstance(m, act.PacketOut):
        msg = parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                                  actions=[parser.OFPActionOutput(port) for port in m.outputs], data=m.data)
    else:
        raise TypeError(f"not an OpenFlow message of the core: {m!r}")
    msg.xid = m.xid
    return msg


def _stats_request(dp: Datapath, m: act.StatsRequest) -> OFPMessage:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    port = ofp.OFPP_ANY if m.port is None else m.port
    if m.kind in (act.FLOWS, act.CLASSIFIED_FLOWS):
        # Our flows only (by the cookie's high bits), from every table; or only the classified ones.
        cookie, mask = (COOKIE, COOKIE_MASK) if m.kind == act.FLOWS else (COOKIE | CLASSIFIED, COOKIE_MASK | CLASSIFIED)
        return parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, port, ofp.OFPG_ANY, cookie, mask, parser.OFPMatch())
    if m.kind == act.METER_CONFIG:
        return parser.OFPMeterConfigStatsRequest(dp, 0, ofp.OFPM_ALL)
    if m.kind == act.METER_STATS:
        return parser.OFPMeterStatsRequest(dp, 0, ofp.OFPM_ALL)
    if m.kind == act.METER_FEATURES:
        return parser.OFPMeterFeaturesStatsRequest(dp, 0)
    if m.kind == act.QUEUES:
        return parser.OFPQueueStatsRequest(dp, 0, port, ofp.OFPQ_ALL)
    if m.kind == act.PORTS:
        return parser.OFPPortStatsRequest(dp, 0, port)
    if m.kind == act.FLOW_MONITOR:
        return parser.ONFFlowMonitorStatsRequest(dp, 0, [_MonitorRequest(m.xid, ofp.OFPP_ANY, ofp.OFPTT_ALL)])
    raise ValueError(f"no such statistics: {m.kind}")


def _instructions(dp: Datapath, entry: FlowEntry) -> list[OFPMessage]:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    actions: list[OFPMessage] = []
    meters: list[OFPMessage] = []
    then: list[OFPMessage] = []
    for action in entry.actions:
        if action[0] == "meter":
            meters.append(parser.OFPInstructionMeter(action[1], ofp.OFPIT_METER))
        elif action[0] == "write_metadata":
            then.append(parser.OFPInstructionWriteMetadata(action[1], action[2]))
        elif action[0] == "goto":
            then.append(parser.OFPInstructionGotoTable(action[1]))
        elif action[0] == "output":
            actions.append(parser.OFPActionOutput(action[1], ofp.OFPCML_NO_BUFFER))
        elif action[0] == "set_queue":
            actions.append(parser.OFPActionSetQueue(action[1]))
        else:
            actions.append(parser.OFPActionSetField(**{action[1]: action[2]}))
    applied = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)] if actions else []
    return [*meters, *applied, *then]


# --- the switch's replies, read ------------------------------------------------------------------------

def reply(conn: int, msg: OFPMessage) -> ev.Event | None:
    """The core's event for a whole reply (multipart parts joined by the caller, msg.body whole)."""
    reader = _READERS.get(type(msg).__name__)
    return reader(conn, msg) if reader else None


def _flows(conn: int, msg: OFPMessage) -> ev.FlowStatsReply:
    flows: dict[int, ActualFlow] = {}
    counters: dict[int, FlowCounters] = {}
    for stat in msg.body:
        cookie, flow = actual_flow(stat)
        flows[cookie], counters[cookie] = flow, FlowCounters(stat.byte_count, stat.packet_count)
    return ev.FlowStatsReply(conn, msg.xid, flows, counters)


def actual_flow(stat: Any) -> tuple[int, ActualFlow]:
    """A flow stats entry as (cookie, ActualFlow)."""
    actions: list[tuple[Any, ...]] = []
    for instruction in stat.instructions:
        kind = type(instruction).__name__
        if kind == "OFPInstructionMeter":
            actions.append(("meter", instruction.meter_id))
        elif kind == "OFPInstructionWriteMetadata":
            actions.append(("write_metadata", instruction.metadata, instruction.metadata_mask))
        elif kind == "OFPInstructionGotoTable":
            actions.append(("goto", instruction.table_id))
        for action in getattr(instruction, "actions", ()):
            name = type(action).__name__
            if name == "OFPActionOutput":
                actions.append(("output", action.port))
            elif name == "OFPActionSetQueue":
                actions.append(("set_queue", action.queue_id))
            elif name == "OFPActionSetField":
                actions.append(("set_field", action.key, action.value))
            else:
                actions.append((name,))     # not one we write: never equal to what we want
    return stat.cookie, ActualFlow(stat.priority, tuple(sorted(stat.match.items())), tuple(actions), stat.table_id)


def _meter_config(conn: int, msg: OFPMessage) -> ev.MeterConfigReply:
    """Our meters → their band; None for a meter we would not write so."""
    ofp = msg.datapath.ofproto
    flags = sum(getattr(ofp, f) for f in METER_FLAGS)
    meters: dict[int, Police | None] = {}
    for config in msg.body:
        if is_ours(config.meter_id):
            bands = config.bands
            ours = config.flags == flags and len(bands) == 1 and type(bands[0]).__name__ == "OFPMeterBandDrop"
            meters[config.meter_id] = Police(bands[0].rate, bands[0].burst_size) if ours else None
    return ev.MeterConfigReply(conn, msg.xid, meters)


def _meter_stats(conn: int, msg: OFPMessage) -> ev.MeterStatsReply:
    return ev.MeterStatsReply(conn, msg.xid, {
        stat.meter_id: MeterCounters(stat.packet_in_count, stat.byte_in_count,
                                     sum(band.packet_band_count for band in stat.band_stats))
        for stat in msg.body if is_ours(stat.meter_id)})


def meters_missing(ofp: OFProto, features: Any) -> str | None:
    """Why a switch cannot police (its meter features), or None when it can."""
    if features is None or features.max_meter == 0:
        return "the switch has no OpenFlow meters"
    if not features.band_types & (1 << ofp.OFPMBT_DROP):
        return "the switch's meters have no drop band"
    if not features.capabilities & ofp.OFPMF_KBPS:
        return "the switch's meters cannot count kbit/s"
    return None


def _meter_features(conn: int, msg: OFPMessage) -> ev.MeterFeaturesReply:
    return ev.MeterFeaturesReply(conn, msg.xid, meters_missing(msg.datapath.ofproto, msg.body[0] if msg.body else None))


def _queues(conn: int, msg: OFPMessage) -> ev.QueueStatsReply:
    return ev.QueueStatsReply(conn, msg.xid, {(s.port_no, s.queue_id): QueueCounters(s.tx_bytes, s.tx_packets,
                                                                                      s.tx_errors) for s in msg.body})


def _ports(conn: int, msg: OFPMessage) -> ev.PortStatsReply:
    return ev.PortStatsReply(conn, msg.xid, {
        s.port_no: PortCounters(s.rx_bytes, s.tx_bytes, s.rx_packets, s.tx_packets, s.rx_dropped, s.tx_dropped,
                                s.rx_errors, s.tx_errors) for s in msg.body})


class _MonitorRequest:
    """Every flow of every table (the id: the request's xid, unique on the connection)."""

    def __init__(self, monitor_id: int, out_port: int, table_id: int):
        self.args = (monitor_id, MONITOR_FLAGS, _EMPTY_MATCH[1], out_port, table_id, *_EMPTY_MATCH)

    def serialize(self) -> bytes:
        return _MONITOR_REQUEST.pack(*self.args)


def _monitored(conn: int, msg: OFPMessage) -> ev.FlowsChanged | None:
    body = msg.body
    if (body.experimenter, body.exp_type) != (ONF_EXPERIMENTER, ONF_FLOW_MONITOR):
        return None
    try:
        cookies: frozenset[int] | None = frozenset(c for c in _updated(bytes(body.data)) if our_flow(c))
    except ValueError:
        cookies = None   # not as the extension says: read the table
    return ev.FlowsChanged(conn, msg.xid, cookies)


def _updated(data: bytes) -> Iterator[int]:
    """The cookies of a flow monitor's updates (an abbreviated one, of our own change, has none)."""
    offset = 0
    while offset < len(data):
        if offset + _UPDATE_HEADER.size > len(data):
            raise ValueError("a flow update cut short")
        length, event = _UPDATE_HEADER.unpack_from(data, offset)
        if length < _UPDATE_HEADER.size or offset + length > len(data):
            raise ValueError(f"a flow update of length {length}")
        if event != _ABBREVIATED:
            if length < _UPDATE_FULL_LENGTH:
                raise ValueError(f"a full flow update of length {length}")
            yield _UPDATE_COOKIE.unpack_from(data, offset + _UPDATE_COOKIE_AT)[0]
        offset += length


def _resumed(conn: int, msg: OFPMessage) -> ev.FlowsChanged | None:
    """A monitor that fell behind pauses, then resumes: what changed meanwhile is read whole."""
    if (msg.experimenter, msg.exp_type) != (ONF_EXPERIMENTER, ONF_MONITOR_RESUMED):
        return None
    return ev.FlowsChanged(conn, 0, None)


def _role(conn: int, msg: OFPMessage) -> ev.RoleReply:
    ofp = msg.datapath.ofproto
    role = next((name for name, const in ROLES.items() if getattr(ofp, const) == msg.role), str(msg.role))
    return ev.RoleReply(conn, msg.xid, role, None if msg.generation_id == NO_GENERATION else msg.generation_id)


def _error(conn: int, msg: OFPMessage) -> ev.ErrorReply:
    ofp = msg.datapath.ofproto
    if msg.type == ofp.OFPET_EXPERIMENTER:   # an extension's error (OVS's own): no code, its vendor's type
        return ev.ErrorReply(conn, msg.xid, f"OFPET_EXPERIMENTER/{msg.experimenter:#x}:{msg.exp_type}")
    return ev.ErrorReply(conn, msg.xid, describe_error(ofp, msg.type, msg.code))


def describe_error(ofp: OFProto, err_type: int, code: int) -> str:
    """'OFPET_BAD_MATCH/OFPBMC_BAD_FIELD' for an error message's type and code."""
    type_name = next((n for n in dir(ofp) if n.startswith("OFPET_") and getattr(ofp, n) == err_type), str(err_type))
    prefix = _CODE_PREFIX.get(type_name)
    code_name = next((n for n in dir(ofp) if prefix and n.startswith(prefix) and getattr(ofp, n) == code), str(code))
    return f"{type_name}/{code_name}"


_READERS: dict[str, Callable[[int, OFPMessage], ev.Event | None]] = {
    "OFPFlowStatsReply": _flows,
    "OFPFlowRemoved": lambda conn, msg: ev.FlowRemoved(conn, msg.cookie) if our_flow(msg.cookie) else None,
    "OFPMeterConfigStatsReply": _meter_config,
    "OFPMeterStatsReply": _meter_stats,
    "OFPMeterFeaturesStatsReply": _meter_features,
    "OFPQueueStatsReply": _queues,
    "OFPPortStatsReply": _ports,
    "OFPExperimenterStatsReply": _monitored,
    "OFPExperimenter": _resumed,
    "OFPBarrierReply": lambda conn, msg: ev.BarrierReply(conn, msg.xid),
    "OFPErrorMsg": _error,
    "OFPRoleReply": _role,
    "OFPEchoReply": lambda conn, msg: ev.EchoReply(conn, msg.xid),
    "OFPPacketIn": lambda conn, msg: ev.PacketIn(conn, msg.match["in_port"], bytes(msg.data), msg.table_id),
}
MULTIPART = ("OFPFlowStatsReply", "OFPMeterConfigStatsReply", "OFPMeterStatsReply", "OFPQueueStatsReply",
             "OFPPortStatsReply")
