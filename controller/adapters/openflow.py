"""OpenFlow 1.3 messages built from the core's flow entries, and the switch's replies read back into
the core's types, in the same form, so that desired and actual compare directly."""
from __future__ import annotations

from typing import Any

from controller.core.flows import CLASSIFIED, COOKIE, COOKIE_MASK, FlowEntry
from controller.core.plan import ActualFlow, FlowChanges

ALL_COOKIE_BITS = 0xFFFF_FFFF_FFFF_FFFF
_CODE_PREFIX = {"OFPET_BAD_REQUEST": "OFPBRC_", "OFPET_BAD_ACTION": "OFPBAC_", "OFPET_BAD_INSTRUCTION": "OFPBIC_",
                "OFPET_BAD_MATCH": "OFPBMC_", "OFPET_FLOW_MOD_FAILED": "OFPFMFC_",
                "OFPET_METER_MOD_FAILED": "OFPMMFC_", "OFPET_ROLE_REQUEST_FAILED": "OFPRRFC_",
                "OFPET_QUEUE_OP_FAILED": "OFPQOFC_", "OFPET_SWITCH_CONFIG_FAILED": "OFPSCFC_"}


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


def stats_requests(dp, whole_table: bool) -> list:
    """One poll: our flows (class rates, and what the switch holds), then queues and ports. Unless
    `whole_table`, only the classified flows and the count of ours: parsing a 1000-flow table
    every second was a third of the controller's CPU."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    flows = [flow_stats_request(dp)] if whole_table else [flow_stats_request(dp, True), flow_count_request(dp)]
    return [*flows, parser.OFPQueueStatsRequest(dp, 0, ofp.OFPP_ANY, ofp.OFPQ_ALL),
            parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY)]


def actual_flow(stat) -> tuple[int, ActualFlow]:
    """A flow stats entry as (cookie, ActualFlow)."""
    actions: list[tuple[Any, ...]] = []
    for instruction in stat.instructions:
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
    actions = []
    for action in entry.actions:
        if action[0] == "output":
            actions.append(parser.OFPActionOutput(action[1], ofp.OFPCML_NO_BUFFER))
        elif action[0] == "set_queue":
            actions.append(parser.OFPActionSetQueue(action[1]))
        else:
            actions.append(parser.OFPActionSetField(**{action[1]: action[2]}))
    return [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
