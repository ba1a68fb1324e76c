"""A switch joining a running controller under a `network:` policy, against the real ovsdb-server and ovs-vswitchd:
its own bridge is read from OVSDB, and no other switch's (what made a join cost grow with the site,
docs/benchmarks.md)."""
import re
import time
import urllib.request

from tests.integration.conftest import NOTHING_LEFT, leftovers, requires_ovs
from topo.harness.controller import controller
from topo.net.bridges import idle_bridges

pytestmark = requires_ovs
METRICS = "http://127.0.0.1:9101/metrics"
SITE, JOINING = 0x7A0000, 0x7B0000          # datapath ids no other test uses
BRIDGES, PORTS = 4, 3
POLICY = {"name": "join",
          "classes": {"tcp": {"queue": 1, "min": "80%", "max": "100%"},
                      "udp": {"queue": 2, "min": "10%", "max": "100%", "priority": 1}},
          "network": {"classify": [{"match": {"ip_proto": "tcp"}, "class": "tcp"},
                                   {"match": {"ip_proto": "udp"}, "class": "udp"}],
                      "ports": {"capacity": "100Mbit", "queues": "auto"}}}


def bridge_reads() -> dict[int, float]:
    """ovsqos_ovsdb_bridge_reads_total by datapath id (one OVSDB remote)."""
    with urllib.request.urlopen(METRICS, timeout=10) as answer:
        text = answer.read().decode()
    return {int(dp, 16): float(value) for dp, value in
            re.findall(r'^ovsqos_ovsdb_bridge_reads_total\{[^}]*dp_id="([0-9a-f]+)"[^}]*\} (\S+)$', text, re.M)}


def in_sync(status: dict, dp_ids: set[int]) -> bool:
    switches = {int(dp, 16): sw for dp, sw in status["switches"].items()}
    return dp_ids <= switches.keys() and all(switches[dp]["in_sync"] for dp in dp_ids)


def test_a_bridge_joining_is_read_from_ovsdb_and_no_other_bridge_is_read_again(tmp_path):
    with controller(tmp_path / "controller.log") as client, \
            idle_bridges(BRIDGES * PORTS, PORTS, prefix="tjoin", first_dp_id=SITE) as site:
        others = {b.dp_id for b in site}
        client.put_policy(POLICY)
        client.wait(lambda s: in_sync(s, others), 60, "the site's bridges in sync")
        time.sleep(3)                              # polls after the policy's last change in OVSDB
        before = bridge_reads()
        assert before.keys() >= others and all(before[dp] >= 1 for dp in others), before
        with idle_bridges(PORTS, PORTS, prefix="tjoinx", first_dp_id=JOINING) as (joining,):
            client.wait(lambda s: in_sync(s, others | {joining.dp_id}), 60, "the joining bridge in sync")
            time.sleep(3)                          # every switch polled three times since, each seeing OVSDB changed
            after = bridge_reads()
        assert after.get(joining.dp_id, 0) >= 1
        # Its bridge made, its ports numbered and its queues put in OVSDB: no other switch's bridge read again.
        assert {dp: after[dp] for dp in others} == {dp: before[dp] for dp in others}
        client.clear_policy()
    assert leftovers() == NOTHING_LEFT
