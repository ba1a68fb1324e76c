"""Which lines of etcd's watch (its JSON gateway's, as etcd 3.4 writes them) wake a member to read the cluster at
once: all but other claims of switches, which would otherwise have every member read again in the middle of a
take-over (controller/adapters/coordination.py)."""
import base64
import json

from controller.adapters.coordination import wakes

CLAIMS = "/ovs-qos/o/switch/"


def line(*events: tuple[str, str]) -> bytes:
    """A watch response with (type, key) events; a PUT's type is left out, as the gateway leaves out defaults."""
    return json.dumps({"result": {"header": {"revision": "9"}, "events": [
        {**({"type": kind} if kind != "PUT" else {}), "kv": {"key": base64.b64encode(key.encode()).decode()}}
        for kind, key in events]}}).encode()


def test_switches_claimed_wake_no_one_but_anything_else_does():
    assert not wakes(line(("PUT", CLAIMS + "0000000000000001"), ("PUT", CLAIMS + "0000000000000002")), CLAIMS)
    assert wakes(line(("DELETE", CLAIMS + "0000000000000001")), CLAIMS)        # a member's keys gone
    assert wakes(line(("PUT", CLAIMS + "0000000000000001"), ("PUT", "/ovs-qos/o/policy")), CLAIMS)
    assert wakes(line(("PUT", "/ovs-qos/o/sync/m2")), CLAIMS)


def test_the_watch_made_and_a_line_not_understood_wake_the_member():
    assert wakes(json.dumps({"result": {"header": {}, "created": True}}).encode(), CLAIMS)
    assert wakes(b"{not json", CLAIMS)
