"""Schemathesis hooks for tests/integration/test_api.py, loaded into its `schemathesis run` through
SCHEMATHESIS_HOOKS: a check that a refused change changes nothing.

The state is the policy the API gives back, and in OVSDB every QoS, Queue and Port row's QoS columns
and the test bridges' flows (API_CHECK_BRIDGES). It is read when this module is loaded (before the
first request) and again after every accepted PUT or DELETE; after a refused one (4xx) it must be what
it was, unless the last accepted change was answered not in sync (its retries go on meanwhile).
Requests go one at a time (--workers 1), so nothing else changes it in between. Every change is noted,
one JSON line each, in API_CHECK_LOG for the test to count."""
import json
import os
import socket
import subprocess
import time
import urllib.request

import schemathesis

API = "http://127.0.0.1:8080/qos/v1"
BRIDGES = os.environ.get("API_CHECK_BRIDGES", "").split()
LOG = os.environ.get("API_CHECK_LOG", os.devnull)


DB = "/var/run/openvswitch/db.sock"
# The rows a policy change writes, and their columns that say what is in force (not statistics).
TABLES = {"QoS": ["_uuid", "type", "other_config", "external_ids", "queues"],
          "Queue": ["_uuid", "other_config", "external_ids"], "Port": ["name", "qos"]}


def _ovsdb() -> dict:
    """TABLES' rows, in one OVSDB transaction over its socket: a few ms, where an ovs-vsctl per table costs
    tens (the coverage phase alone sends some 700 requests)."""
    request = {"method": "transact", "id": 0, "params": [
        "Open_vSwitch", *({"op": "select", "table": t, "where": [], "columns": c} for t, c in TABLES.items())]}
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(DB)
        sock.sendall(json.dumps(request).encode())
        data = b""
        for _ in range(10_000):
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("OVSDB closed the connection")
            data += chunk
            try:
                reply = json.loads(data)
                break
            except ValueError:   # not all there yet
                continue
    assert reply["error"] is None, reply
    return {t: sorted(map(json.dumps, r["rows"])) for t, r in zip(TABLES, reply["result"])}


def state() -> dict:
    # The flow dumps run while the rest is read: the check runs some 900 times, its cost is the test's.
    dumps = {bridge: subprocess.Popen(["ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", bridge],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for bridge in BRIDGES}
    with urllib.request.urlopen(f"{API}/policy", timeout=35) as resp:
        policy = json.load(resp)
    ovsdb = _ovsdb()
    flows = {}
    for bridge, dump in dumps.items():
        out, err = dump.communicate(timeout=10)
        assert dump.returncode == 0, f"ovs-ofctl dump-flows {bridge}: {err}"
        flows[bridge] = sorted(out.splitlines())
    return {"policy": policy, "ovsdb": ovsdb, "flows": flows}


_last = state()
# Whether the last accepted change was answered not in sync: its ports are then tried again each poll
# (a policy's network: section reaches the test bridges, and a fuzzed one may ask for what this kernel
# refuses, e.g. a RED queue at 34 Gbit/s), and what those retries write is not the next request's doing.
_settling = [False]


def _still_settling(response, refused: bool, settling: bool) -> bool:
    if refused:
        return settling
    try:
        body = response.json()
    except ValueError:
        return settling
    return isinstance(body, dict) and body.get("in_sync") is False


@schemathesis.check
def refused_change_changes_nothing(ctx, response, case):
    global _last
    if case.method.upper() == "GET":
        return None
    started = time.monotonic()
    now = state()
    refused = 400 <= response.status_code < 500
    with open(LOG, "a") as log:
        log.write(json.dumps({"method": case.method.upper(), "status": response.status_code,
                              "changed": now != _last,
                              "seconds": round(time.monotonic() - started, 4),
                              "answered_in": round(response.elapsed, 4)}) + "\n")
    before, _last = _last, now   # a change is reported once, by the request that made it
    settling, _settling[0] = _settling[0], _still_settling(response, refused, _settling[0])
    if refused and now != before and not settling:
        changed = sorted(key for key in now if now[key] != before[key])
        raise AssertionError(f"{case.method} answered {response.status_code} and yet changed {', '.join(changed)}:\n"
                             f"before: {json.dumps(before)[:1500]}\nafter: {json.dumps(now)[:1500]}")
    return None
