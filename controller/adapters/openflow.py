"""OpenFlow 1.3 messages built from the core's flow and meter changes, and the switch's replies read
back into the core's types, in the same form, so that desired and actual compare directly."""
from __future__ import annotations

from typing import Any

from controller.core.flows import CLASSIFIED, COOKIE, COOKIE_MASK, FlowEntry
from controller.core.meters import MeterChanges, is_ours
from controller.core.plan import ActualFlow, FlowChanges
from controller.core.policy import Police

ALL_COOKIE_BITS = 0xFFFF_FFFF_FFFF_FFFF
_CODE_PREFIX = {"OFPET_BAD_REQUEST": "OFPBRC_", "OFPET_BAD_ACTION": "OFPBAC_", "OFPET_BAD_INSTRUCTION": "OFPBIC_",
                "OFPET_BAD_MATCH": "OFPBMC_", "OFPET_FLOW_MOD_FAILED": "OFPFMFC_",
                "OFPET_METER_MOD_FAILED": "OFPMMFC_", "OFPET_ROLE_REQUEST_FAILED": "OFPRRFC_",
                "OFPET_QUEUE_OP_FAILED": "OFPQOFC_", "OFPET_SWITCH_CONFIG_FAILED": "OFPSCFC_"}


def batch(dp, flows: FlowChanges, meters: MeterChanges) -> list:
    """Meters the flows will use, the flow changes, then the meters no flow uses any more."""
    ofp = dp.ofproto
    return [*(_meter_mod(dp, ofp.OFPMC_ADD, m, band) for m, band in meters.add),
            *(_meter_mod(dp, ofp.OFPMC_MODIFY, m, band) for m, band in meters.modify),
            *flow_mods(dp, flows),
            *(_meter_mod(dp, ofp.OFPMC_DELETE, m, None) for m in meters.delete)]


METER_FLAGS = ("OFPMF_KBPS", "OFPMF_BURST", "OFPMF_STATS")


def _meter_mod(dp, command: int, meter: int, band: Police | None):
    ofp, parser = dp.ofproto, dp.ofproto_parser
    bands = [parser.OFPMeterBandDrop(rate=band.rate_kbps, burst_size=band.burst_kbits)] if band else []
    flags = sum(getattr(ofp, f) for f in METER_FLAGS) if band else 0
    return parser.OFPMeterMod(dp, command=command, flags=flags, meter_id=meter, bands=bands)


def actual_meters(ofp, body) -> dict[int, Police | None]:
    """Meter config stats as our meters → their band; None for a meter we would not write so."""
    flags = sum(getattr(ofp, f) for f in METER_FLAGS)
    meters = {}
    for config in body:
        if is_ours(config.meter_id):
            bands = config.bands
            ours = config.flags == flags and len(bands) == 1 and type(bands[0]).__name__ == "OFPMeterBandDrop"
            meters[config.meter_id] = Police(bands[0].rate, bands[0].burst_size) if ours else None
    return meters


def role_request(dp, master: bool, generation: int):
    """Master or slave, with the owner's generation id (kept in OVSDB: controller/adapters/ovsdb.py)."""
    ofp = dp.ofproto
    return dp.ofproto_parser.OFPRoleRequest(dp, ofp.OFPCR_ROLE_MASTER if master else ofp.OFPCR_ROLE_SLAVE, generation)


def meter_config_request(dp):
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPMeterConfigStatsRequest(dp, 0, ofp.OFPM_ALL)


def meter_features_request(dp):
    return dp.ofproto_parser.OFPMeterFeaturesStatsRequest(dp, 0)


def meters_missing(ofp, features) -> str | None:
    """Why a switch cannot police (its meter features), or None when it can."""
    if features is None or features.max_meter == 0:
        return "the switch has no OpenFlow meters"
    if not features.band_types & (1 << ofp.OFPMBT_DROP):
        return "the switch's meters have no drop band"
    if not features.capabilities & ofp.OFPMF_KBPS:
        return "the switch's meters cannot count kbit/s"
    return None


def flow_mods(dp, changes: FlowChanges) -> list:
    """Deletions first (by cookie, exactly), then modifications (actions only, counters kept), then additions."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    msgs = [parser.OFPFlowMod(dp, cookie=cookie, cookie_mask=ALL_COOKIE_BITS, table_id=ofp.OFPTT_ALL,
                              command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)
            for cookie in changes.delete]
    for command, entries in ((ofp.OFPFC_MODIFY_STRICT, changes.modify), (ofp.OFPFC_ADD, changes.add)):
        msgs += [parser.OFPFlowMod(dp, cookie=e.cookie, priority=e.priority, command=command,
                                   match=parser.OFPMatch(**dict(e.match)), instructions=_instructions(dp, e))
                 for e in entries]
    return msgs


def flow_stats_request(dp, classified_only: bool = False):
    """Our flows only (by the cookie's high bits), from every table; or only the classified ones."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    cookie, mask = (COOKIE | CLASSIFIED, COOKIE_MASK | CLASSIFIED) if classified_only else (COOKIE, COOKIE_MASK)
    return parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, cookie, mask, parser.OFPMatch())


def flow_count_request(dp):
    """How many flows of ours the switch holds: one small reply instead of every flow."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPAggregateStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, COOKIE, COOKIE_MASK,
                                           parser.OFPMatch())


def stats_requests(dp, whole_table: bool, meters: bool) -> list:
    """One poll: our flows (class rates, and what the switch holds), meters when `meters`, then queues
    and ports. Unless `whole_table`, only the classified flows and the count of ours (parsing a
    1000-flow table every second was a third of the controller's CPU), and the meters' counters, not
    their configuration."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    flows = [flow_stats_request(dp)] if whole_table else [flow_stats_request(dp, True), flow_count_request(dp)]
    if meters:
        flows.append(meter_config_request(dp) if whole_table else parser.OFPMeterStatsRequest(dp, 0, ofp.OFPM_ALL))
    return [*flows, parser.OFPQueueStatsRequest(dp, 0, ofp.OFPP_ANY, ofp.OFPQ_ALL),
            parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY)]


def actual_flow(stat) -> tuple[int, ActualFlow]:
    """A flow stats entry as (cookie, ActualFlow)."""
    actions: list[tuple[Any, ...]] = []
    for instruction in stat.instructions:
        if type(instruction).__name__ == "OFPInstructionMeter":
            actions.append(("meter", instruction.meter_id))
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
    return stat.cookie, ActualFlow(stat.priority, tuple(sorted(stat.match.items())), tuple(actions))


def describe_error(ofp, err_type: int, code: int) -> str:
    """'OFPET_BAD_MATCH/OFPBMC_BAD_FIELD' for an error message's type and code."""
    type_name = next((n for n in dir(ofp) if n.startswith("OFPET_") and getattr(ofp, n) == err_type), str(err_type))
    prefix = _CODE_PREFIX.get(type_name)
    code_name = next((n for n in dir(ofp) if prefix and n.startswith(prefix) and getattr(ofp, n) == code), str(code))
    return f"{type_name}/{code_name}"


def _instructions(dp, entry: FlowEntry) -> list:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    actions, meters = [], []
    for action in entry.actions:
        if action[0] == "meter":
            meters.append(parser.OFPInstructionMeter(action[1], ofp.OFPIT_METER))
        elif action[0] == "output":
            actions.append(parser.OFPActionOutput(action[1], ofp.OFPCML_NO_BUFFER))
        elif action[0] == "set_queue":
            actions.append(parser.OFPActionSetQueue(action[1]))
        else:
            actions.append(parser.OFPActionSetField(**{action[1]: action[2]}))
    return [*meters, parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
