"""tc u32 filters that carry the queue choice on OVS's userspace datapath.

The userspace datapath ignores set_queue: every packet enters the port's HTB
root and lands in the default class. Our flows mark steered packets with a
DSCP per traffic class; these filters send each mark to its class 1:(queue+1).
OVS rebuilds the qdisc whenever the QoS row changes, which drops the filters,
so the controller re-checks them after each change and on every poll.
"""
from __future__ import annotations

import re
import subprocess

FILTER_PRIO = "7"      # our filters live at this prio so we replace only our own
_FLOWID = re.compile(r"flowid (1:[0-9a-f]+)")
_MATCH = re.compile(r"match ([0-9a-f]{8})/([0-9a-f]{8}) at 0")
_CLASS = re.compile(r"^class htb (1:[0-9a-f]+) ")
_LEAF = re.compile(r"qdisc p?b?fifo \S+ parent (1:[0-9a-f]+) limit (\d+)p")
_SENT = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+),")


def htb_classid(queue_id: int) -> str:
    return f"1:{queue_id + 1:x}"


def filter_args(iface: str, dscp: int, queue_id: int) -> list[str]:
    return ["tc", "filter", "add", "dev", iface, "parent", "1:", "protocol", "ip", "prio", FILTER_PRIO,
            "u32", "match", "ip", "dsfield", hex(dscp << 2), "0xfc", "flowid", htb_classid(queue_id)]


def parse_filters(text: str) -> set[tuple[int, str]]:
    """(dscp, classid) pairs of the u32 DSCP filters in `tc filter show` output."""
    found, flowid = set(), None
    for line in text.splitlines():
        if m := _FLOWID.search(line):
            flowid = m.group(1)
        if (m := _MATCH.search(line)) and flowid and m.group(2) == "00fc0000":
            found.add((int(m.group(1), 16) >> 18, flowid))
    return found


def parse_classes(text: str) -> dict[str, tuple[int, int, int]]:
    """classid → (bytes, packets, drops) from `tc -s class show` output."""
    classes, current = {}, None
    for line in text.splitlines():
        if m := _CLASS.match(line):
            current = m.group(1)
        elif current and (m := _SENT.search(line)):
            classes[current] = tuple(int(g) for g in m.groups())
            current = None
    return classes


def parse_leaf_limits(text: str) -> dict[str, int]:
    """classid → packet limit of its FIFO leaf, from `tc qdisc show` output."""
    return {m.group(1): int(m.group(2)) for m in _LEAF.finditer(text)}


def htb_classes(iface: str) -> dict[str, tuple[int, int, int]]:
    return parse_classes(_tc("-s", "class", "show", "dev", iface))


def leaf_limits(iface: str) -> dict[str, int]:
    # HTB's default leaves are hidden from a plain `tc qdisc show`.
    return parse_leaf_limits(_tc("qdisc", "show", "dev", iface, "invisible"))


def ensure_filters(iface: str, marks: tuple[tuple[int, int], ...]) -> str:
    """Make our filters on `iface` be exactly `marks`.

    Returns "ok" (already so), "written", or "waiting" when the HTB classes they
    point at are not there yet (OVS builds them asynchronously): try again later.
    """
    wanted = {(dscp, htb_classid(q)) for dscp, q in marks}
    present = parse_filters(_tc("filter", "show", "dev", iface, "parent", "1:", "prio", FILTER_PRIO))
    if present == wanted:
        return "ok"
    if not {cid for _, cid in wanted} <= set(htb_classes(iface)):
        return "waiting"
    if present:
        _tc("filter", "del", "dev", iface, "parent", "1:", "prio", FILTER_PRIO)
    for dscp, q in marks:
        subprocess.run(filter_args(iface, dscp, q), check=True, capture_output=True, text=True)
    return "written"


def _tc(*args: str) -> str:
    done = subprocess.run(["tc", *args], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else ""
