"""Every key of a cluster read in one etcd transaction, as the core's events.ClusterChanged: the members, the
switches' owners, etcd's revision at the read, the policy (revision, document), the switches each member cannot
reach and what each says its switches hold (refreshed_at: unknown here). The policy's key is read without its
value: the policy is fetched only when its revision moved (a policy of 10,000 ports is a megabyte, and this runs
every second)."""
from __future__ import annotations

import json
import os
from typing import Any

from controller.adapters.etcd import Gateway, b64, kvs, range_end, text
from controller.adapters.recovery import Recovery
from controller.adapters.register import Register
from controller.core import events as ev


def read(gateway: Gateway, prefix: str, register: Register, recovery: Recovery) -> ev.ClusterChanged:
    """The cluster's keys under `prefix`, the base settled first if need be (recovery.py)."""
    answer = _read_all(gateway, prefix, register.key)
    marker = next((text(kv["value"]).split() for kv in kvs(answer, 0) if kv["key"] == recovery.key), None)
    if recovery.unsettled(marker):
        recovery.settle()
        answer = _read_all(gateway, prefix, register.key)
    before, stored, after = kvs(answer, 0), kvs(answer, 1), kvs(answer, 2)
    policy = register.fetch(recovery.base + int(stored[0]["mod_revision"])) if stored else None
    members: list[str] = []
    owners: dict[int, str] = {}
    revisions: dict[int, int] = {}
    unreachable: dict[str, frozenset[int]] = {}
    sync: dict[str, ev.MemberSync] = {}
    probe_key = None
    for kv in [*before, *after]:
        kind, _, name = text(kv["key"])[len(prefix):].partition("/")
        if kind == "member":
            members.append(name)
        elif kind == "switch":
            owners[int(name, 16)] = text(kv["value"])
            revisions[int(name, 16)] = recovery.base + int(kv["mod_revision"])
        elif kind == "unreachable":
            unreachable[name] = frozenset(json.loads(text(kv["value"])))
        elif kind == "probe-key":
            probe_key = bytes.fromhex(text(kv["value"]))
        elif kind == "sync":
            said = json.loads(text(kv["value"]))
            sync[name] = ev.MemberSync(said["revision"], {int(dp, 16): held for dp, held in said["switches"].items()})
    recovery.group = tuple(sorted(members))
    return ev.ClusterChanged(recovery.group, owners, recovery.base + int(answer["header"]["revision"]), policy, None,
                             unreachable, sync, revisions=revisions, probe_key=probe_key)


def _read_all(gateway: Gateway, prefix: str, policy: str) -> dict[str, Any]:
    """Every key in one transaction, the policy's without its value."""
    return gateway.post("/kv/txn", {"success": [
        {"request_range": {"key": b64(prefix), "range_end": b64(policy)}},
        {"request_range": {"key": b64(policy), "keys_only": True}},
        {"request_range": {"key": b64(policy + "\0"), "range_end": b64(range_end(prefix))}}]})


def probe_key(gateway: Gateway, prefix: str) -> bytes:
    """The key the members sign their discovery frames with: made by the first member to ask (kept on no lease:
    it outlives every member), read by the others. A member refuses probes it cannot check, so members with
    keys of their own would each see only the links their own probes crossed."""
    key = prefix + "probe-key"
    answer = gateway.post("/kv/txn", {
        "compare": [{"key": b64(key), "target": "CREATE", "create_revision": "0"}],
        "success": [{"request_put": {"key": b64(key), "value": b64(os.urandom(32).hex())}}],
        "failure": [{"request_range": {"key": b64(key)}}]})
    made = answer.get("succeeded", False)
    if made:
        return probe_key(gateway, prefix)      # read back: what etcd holds is what every member reads
    return bytes.fromhex(text(kvs(answer, 0)[0]["value"]))
