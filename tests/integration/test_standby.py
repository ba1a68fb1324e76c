"""Active/standby against real OVS, Mininet hosts and iperf3: two controllers of one owner (`standby =
true`), the switches connected to both. The one holding the OVSDB lock is master; SIGKILL it during a
flood and the standby is active within 5 s, keeps every QoS row as it was (none lost, none doubled, the
reservation not rolled back), and answers the next congestion episode itself."""
import os
import signal
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor

from tests.integration.conftest import (NOTHING_LEFT, controller_config, leftovers, requires_ovs, start_controller,
                                        stop_controller)
from topo.harness.controller import ControllerClient, ControllerError
from topo.net import traffic
from topo.net.network import network
from topo.studies.base import policy_document
from topo.topos import StudyTopo

pytestmark = requires_ovs
SWITCHES = {"0000000000000001", "0000000000000002"}


def our_rows() -> dict[str, str]:
    """QoS and Queue rows of the owner, uuid → table."""
    rows = {}
    for table in ("qos", "queue"):
        out = subprocess.run(["ovs-vsctl", "--bare", "--columns=_uuid", "find", table,
                              "external_ids:ovs-qos-controller=test"], capture_output=True, text=True).stdout
        rows.update({uuid: table for uuid in out.split()})
    return rows


def actions(client: ControllerClient) -> list[str]:
    return [d["action"] for d in client.status()["decisions"]]


def udp(pool: ThreadPoolExecutor, net, tmp_path, name: str, seconds: int) -> Future:
    """UDP at 8 Mbit/s h1 → h4 in the background, through the traffic runner: the FIFO that TCP fills may
    drop iperf3's one connect datagram, and the runner starts the test again."""
    flood = traffic.Flow(name, "h1", "h4", seconds, udp_mbps=8)
    return pool.submit(traffic.run, net, [[flood]], tmp_path / name, traffic.connect_seconds(5_000_000, 25))


def test_the_standby_takes_over_a_flood_within_5_s_keeping_every_row_and_answers_the_next_episode(tmp_path):
    shared = {"state_file": tmp_path / "state.json", "standby": "true"}
    first = start_controller(controller_config(tmp_path / "a.conf", **shared), tmp_path / "a.log")
    second = start_controller(controller_config(tmp_path / "b.conf", ofp_port=6654, api_port=8081, metrics_port=9111,
                                                **shared), tmp_path / "b.log")
    active, standby = ControllerClient(), ControllerClient("http://127.0.0.1:8081/qos/v1")
    try:
        deadline = time.monotonic() + 30
        while True:                              # start_controller waited for the first one's API, on 8080
            try:
                assert standby.status()["role"] == "standby"
                break
            except ControllerError:
                assert second.poll() is None and time.monotonic() < deadline, (tmp_path / "b.log").read_text()[-2000:]
                time.sleep(0.2)
        assert active.status()["role"] == "active"
        with network(StudyTopo(), "user") as net, ThreadPoolExecutor(2) as pool:
            for switch in ("s1", "s2"):
                subprocess.run(["ovs-vsctl", "set-controller", switch, "tcp:127.0.0.1:6653", "tcp:127.0.0.1:6654"],
                               check=True)
            for client in (active, standby):
                client.wait(lambda s: SWITCHES <= set(s["switches"]), 30, "both switches on both controllers")
            active.put_policy(policy_document("auto", 5_000_000, 25))
            net.popen("h4", ["iperf3", "-s", "-1", "-p", "5300"], tmp_path / "tcp-server.txt")
            time.sleep(0.3)
            net.popen("h1", ["iperf3", "-c", net.host("h4").IP(), "-p", "5300", "-t", "60"], tmp_path / "tcp.txt")
            time.sleep(2)
            floods = [udp(pool, net, tmp_path, "flood", 14)]
            active.wait(lambda s: "program" in actions(active), 10, "the active one programming the reservation")
            rows = our_rows()
            assert len(rows) == 6, rows          # s1-eth1: a QoS and 3 queues (default, tcp, udp); s2-eth1: 1 and 1
            os.kill(first.pid, signal.SIGKILL)
            killed = time.monotonic()
            standby.wait(lambda s: s["role"] == "active", 5, "the standby active")
            took_over = time.monotonic() - killed
            time.sleep(3)                        # the flood goes on under the new master
            assert our_rows() == rows            # the same rows: none lost, none doubled, none rebuilt
            assert actions(standby) == []        # adopted, not rolled back and programmed again
            standby.wait(lambda s: actions(standby) == ["rollback"], 30, "its rollback once the flood ended")
            floods.append(udp(pool, net, tmp_path, "again", 8))
            standby.wait(lambda s: actions(standby) == ["rollback", "program"], 15, "the next episode answered")
            for flood in floods:                 # before the flows go: the tests' closing exchanges need them
                flood.result(60)[0].require()
            standby.clear_policy()
    finally:
        stop_controller(second, clear=False)     # stop_controller clears through 8080, the first one's port
        stop_controller(first, clear=False)
    assert took_over <= 5, took_over
    assert "taking over" in (tmp_path / "b.log").read_text()
    assert leftovers() == NOTHING_LEFT
