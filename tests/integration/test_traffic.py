"""The traffic runner against real iperf3 in Mininet hosts: a UDP test whose connect datagram is lost
(iperf3 sends it once and would wait 30 s, then fail) is started again and measures what it should, and a
TCP test whose client's first SYN is lost (sent again a second later) is dated from its real start; one
whose every connect datagram is lost is given up after the runner's attempts, its reason recorded, and
the rest of the traffic runs on as planned."""
import re
import subprocess
import threading
import time

from controller.core.policy import parse_policy
from tests.integration.conftest import NOTHING_LEFT, leftovers, requires_ovs
from topo.harness.controller import controller
from topo.net import iperf, traffic
from topo.net.network import network
from topo.studies.base import policy_document, queues_in_force
from topo.topos import StudyTopo

pytestmark = requires_ovs
CONNECT_DATAGRAM = "match ip protocol 17 0xff match u16 32 0xffff at 2"   # UDP, IP length 20 + 8 + 4 bytes
SYN = "match ip protocol 6 0xff match u8 0x02 0x12 at 33"                   # TCP flags SYN without ACK


def tc(pid: int, *args: str) -> str:
    return subprocess.run(["mnexec", "-a", str(pid), "tc", *args], capture_output=True, text=True, check=True).stdout


def drop_first(pid: int, dev: str, match: str, stop: threading.Event) -> list[int]:
    """On `dev`'s way out, packets that `match` go to a class whose queue holds nothing; once one was
    dropped, the filter goes. Returns [drops seen] when `stop` is set."""
    tc(pid, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
    for minor in (1, 2):
        tc(pid, "class", "add", "dev", dev, "parent", "1:", "classid", f"1:{minor}", "htb", "rate", "1gbit")
    tc(pid, "qdisc", "add", "dev", dev, "parent", "1:2", "handle", "20:", "pfifo", "limit", "0")
    tc(pid, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
       *match.split(), "flowid", "1:2")
    dropped = [0]

    def watch():
        while not stop.is_set():
            dropped[0] = int(re.search(r"qdisc pfifo 20: .*?dropped (\d+)", tc(pid, "-s", "qdisc", "show", "dev", dev),
                                       re.S).group(1))
            if dropped[0]:
                tc(pid, "filter", "del", "dev", dev, "parent", "1:", "prio", "1")
                return
            time.sleep(0.02)
    threading.Thread(target=watch, daemon=True).start()
    return dropped


def drop(pid: int, dev: str, match: str) -> None:
    """On `dev`'s way out, every packet that `match`es goes to a class whose queue holds nothing."""
    tc(pid, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
    for minor in (1, 2):
        tc(pid, "class", "add", "dev", dev, "parent", "1:", "classid", f"1:{minor}", "htb", "rate", "1gbit")
    tc(pid, "qdisc", "add", "dev", dev, "parent", "1:2", "handle", "20:", "pfifo", "limit", "0")
    tc(pid, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", *match.split(),
       "flowid", "1:2")


def test_a_udp_test_that_never_connects_is_given_up_with_its_reason_and_the_rest_runs_as_planned(tmp_path, recorded):
    doc = policy_document("shared", 5_000_000, 25)
    with controller(tmp_path / "controller.log", recorded) as client:
        client.clear_policy()
        with network(StudyTopo(), "user", recorded) as net:
            client.wait(lambda s: {"0000000000000001", "0000000000000002"} <= set(s["switches"]), 30, "switches")
            client.put_policy(doc)
            client.wait(lambda s: queues_in_force(s, parse_policy(doc)), 20, "the shared queue")
            drop(net.host("h1").pid, "h1-eth0", CONNECT_DATAGRAM)
            blocked = traffic.Flow("blocked", "h1", "h4", 6, udp_mbps=1)
            after = traffic.Flow("after", "h1", "h4", 3)          # TCP: its handshake passes the filter
            spared = traffic.Flow("spared", "h2", "h3", 9, udp_mbps=1)
            started = time.time()
            ran = traffic.run(net, [[blocked, after], [spared]], tmp_path / "raw", 1.0)
            client.clear_policy()
    runs = {r.item.name: r for r in ran}
    assert runs["blocked"].connect_restarts == traffic.CONNECT_ATTEMPTS - 1
    assert runs["blocked"].error == f"its connect datagram was lost {traffic.CONNECT_ATTEMPTS} times (its path's " \
                                    "queue full, or a link down): it never started"
    # Given up after its third wait (about a second each), well within its 6 s; what follows it in its lane
    # starts when planned, at 6 s, and runs.
    assert runs["blocked"].ended - started < 5.5, runs["blocked"]
    assert 5.9 < runs["after"].launched - started < 6.6 and runs["after"].error is None, runs["after"]
    assert runs["spared"].error is None and runs["spared"].connect_restarts == 0
    received = runs["spared"].doc["server_output_json"]["end"]["sum_received"]["bytes"]
    assert received > 0.8 * 1e6 / 8 * 9, received
    assert leftovers() == NOTHING_LEFT


def test_a_udp_test_whose_connect_datagram_is_lost_starts_again_and_a_tcp_test_whose_syn_is_lost_is_dated(tmp_path, recorded):
    doc = policy_document("shared", 5_000_000, 25)
    stop = threading.Event()
    with controller(tmp_path / "controller.log", recorded) as client:
        client.clear_policy()
        with network(StudyTopo(), "user", recorded) as net:
            client.wait(lambda s: {"0000000000000001", "0000000000000002"} <= set(s["switches"]), 30, "switches")
            client.put_policy(doc)
            client.wait(lambda s: queues_in_force(s, parse_policy(doc)), 20, "the shared queue")
            dropped = drop_first(net.host("h1").pid, "h1-eth0", CONNECT_DATAGRAM, stop)
            syn_dropped = drop_first(net.host("h4").pid, "h4-eth0", SYN, stop)
            lost = traffic.Flow("lost", "h1", "h4", 3, udp_mbps=2)
            spared = traffic.Flow("spared", "h2", "h3", 3, udp_mbps=1)
            late = traffic.Flow("late", "h4", "h1", 3)
            started = time.monotonic()
            # A connect wait of 2 s, not the runner's least (1 s): one CI run's restarted client waited over
            # a second for its (undropped) reply and was started a third time.
            late_ran, lost_ran, spared_ran = sorted(traffic.run(net, [[lost], [spared], [late]], tmp_path / "raw",
                                                                2.0), key=lambda r: r.item.name)
            took = time.monotonic() - started
            stop.set()
            client.clear_policy()
    assert dropped == [1] and syn_dropped == [1]  # exactly the first connect datagram and SYN, nothing else
    assert lost_ran.connect_restarts == 1 and spared_ran.connect_restarts == 0
    assert lost_ran.error is None and spared_ran.error is None and late_ran.error is None
    # The SYN is sent again after a second: the test starts then, and its three seconds end as the client exits.
    assert late_ran.started - late_ran.launched >= 0.9, late_ran
    assert 0 <= late_ran.ended - (late_ran.started + 3) < 0.5, late_ran
    assert spared_ran.started - spared_ran.launched < 0.5, spared_ran
    assert took < 15, took                      # not iperf3's own 30 s wait
    for ran, offered in ((lost_ran, 2e6), (spared_ran, 1e6)):
        received = ran.doc["server_output_json"]["end"]["sum_received"]["bytes"]
        assert received > 0.8 * offered / 8 * 3, (ran.item.name, received)
    assert (tmp_path / "raw" / f"lost.server.{iperf.BASE_PORT + 3}.json").exists()   # the restart's own server
    assert leftovers() == NOTHING_LEFT
