"""The OpenFlow adapter's reading (controller/adapters/openflow.py) of a switch's errors, by name, and of a flow
monitor's messages: the cookies of ours in its updates, or None (read the whole table) for what it cannot read or for
a monitor that resumes."""
import struct

import pytest
from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser
from os_ken.ofproto.ofproto_common import ONF_EXPERIMENTER_ID
from os_ken.ofproto.ofproto_protocol import ProtocolDesc

from controller.adapters import openflow
from controller.core import actions as act
from controller.core import events as ev
from controller.core.flows import COOKIE

OURS, THEIRS = COOKIE | 7, 0x1234


def update(event: int, cookie: int, length: int = 24) -> bytes:
    return struct.pack("!HHHHHHHBxQ", length, event, 0, 0, 0, 0, 0, 0, cookie) + bytes(length - 24)


def monitor_reply(data: bytes, xid: int = 0, exp_type: int = ofp.ONFMP_FLOW_MONITOR):
    msg = parser.OFPExperimenterStatsReply(None, body=parser.OFPExperimenterMultipart(ONF_EXPERIMENTER_ID, exp_type,
                                                                                       data), flags=0)
    msg.xid = xid
    return msg


def test_the_updates_cookies_of_ours_are_read_and_others_left_out():
    data = update(ofp.ONFFME_ADDED, OURS) + update(ofp.ONFFME_DELETED, THEIRS, 40) + \
        struct.pack("!HHI", 8, ofp.ONFFME_ABBREV, 99) + update(ofp.ONFFME_MODIFIED, OURS + 1, 32)
    assert openflow.reply(3, monitor_reply(data)) == ev.FlowsChanged(3, 0, frozenset({OURS, OURS + 1}))


def test_the_answer_to_our_request_says_the_monitor_is_in_force():
    assert openflow.reply(3, monitor_reply(b"", xid=41)) == ev.FlowsChanged(3, 41, frozenset())


@pytest.mark.parametrize("data", [update(ofp.ONFFME_ADDED, OURS)[:20], update(ofp.ONFFME_ADDED, OURS)[:3],
                                  struct.pack("!HH", 2, ofp.ONFFME_ADDED), update(ofp.ONFFME_ADDED, OURS)[:16] + b"\0" * 4,
                                  struct.pack("!HHI", 8, ofp.ONFFME_ADDED, 0)],
                         ids=["cut short", "header cut", "length below the header", "length past the end",
                              "a full update too short"])
def test_an_update_that_cannot_be_read_asks_for_the_whole_table(data):
    assert openflow.reply(3, monitor_reply(data)) == ev.FlowsChanged(3, 0, None)


def test_another_experimenters_reply_is_no_event():
    assert openflow.reply(3, monitor_reply(update(ofp.ONFFME_ADDED, OURS), exp_type=1)) is None


def test_a_monitor_that_resumes_after_a_pause_asks_for_the_whole_table_and_its_pause_says_nothing():
    resumed = parser.OFPExperimenter(None, ONF_EXPERIMENTER_ID, ofp.ONFT_FLOW_MONITOR_RESUMED, b"")
    paused = parser.OFPExperimenter(None, ONF_EXPERIMENTER_ID, ofp.ONFT_FLOW_MONITOR_PAUSED, b"")
    assert openflow.reply(3, resumed) == ev.FlowsChanged(3, 0, None)
    assert openflow.reply(3, paused) is None


def test_the_extensions_numbers_written_out_are_os_kens_and_the_request_is_what_ovs_reads():
    """Written out so that the adapter runs under Ryu too; the bytes are those `ovs-ofctl ofp-print` reads as
    `ONFST_FLOW_MONITOR request (OF1.3) (xid=0x9): id=9 flags=add,delete,modify` (os-ken's own: OFPBMC_BAD_LEN)."""
    assert (openflow.ONF_EXPERIMENTER, openflow.ONF_FLOW_MONITOR, openflow.ONF_MONITOR_RESUMED) == (
        ONF_EXPERIMENTER_ID, ofp.ONFMP_FLOW_MONITOR, ofp.ONFT_FLOW_MONITOR_RESUMED)
    assert openflow.MONITOR_FLAGS == ofp.ONFFMF_ADD | ofp.ONFFMF_DELETE | ofp.ONFFMF_MODIFY

    class Datapath:
        ofproto, ofproto_parser, id = ofp, parser, 1

    msg = openflow.message(Datapath(), act.StatsRequest(9, act.FLOW_MONITOR))
    msg.serialize()
    assert bytes(msg.buf).hex() == ("0412003000000009ffff0000000000004f4e46000000074e"
                                    "00000009000e0004ffffffffff0000000001000400000000")


def error(body: bytes, xid: int = 7):
    """An error message as os-ken reads it off the wire."""
    return ofproto_parser.msg(ProtocolDesc(ofp.OFP_VERSION), ofp.OFP_VERSION, ofp.OFPT_ERROR, 8 + len(body), xid,
                              struct.pack("!BBHI", ofp.OFP_VERSION, ofp.OFPT_ERROR, 8 + len(body), xid) + body)


def test_an_error_is_named_by_its_type_and_code_and_an_extensions_by_its_vendor_and_type():
    offending = bytes(8)
    assert openflow.reply(3, error(struct.pack("!HH", ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT) + offending)) == \
        ev.ErrorReply(3, 7, "OFPET_BAD_ACTION/OFPBAC_BAD_OUT_PORT")
    # OVS says its own errors (Nicira's, 0x2320) as an experimenter's type, with no code to name
    assert openflow.reply(3, error(struct.pack("!HHI", ofp.OFPET_EXPERIMENTER, 270, 0x2320) + offending)) == \
        ev.ErrorReply(3, 7, "OFPET_EXPERIMENTER/0x2320:270")
