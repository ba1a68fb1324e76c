"""Active/standby against real OVS, Mininet hosts and iperf3: two controllers of one owner (`standby =
true`), the switches connected to both. The one holding the OVSDB lock is master; SIGKILL it during a
flood and the standby is active within 5 s, keeps every QoS row as it was (none lost, none doubled, the
reservation not rolled back), and answers the next congestion episode itself. SIGSTOP it instead (its
OVSDB session stays open, and a unix socket is never probed) and the standby takes over when its
heartbeat stands still; SIGCONT it and it writes nothing: it stands down."""
import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from controller.adapters.ovsdb import DEFAULT_DB
from tests.integration.conftest import (
    NOTHING_LEFT,
    controller_config,
    leftovers,
    requires_ovs,
    start_controller,
    stop_controller,
)
from tests.integration.test_reliability import DPIDS, bridges, our_flows  # noqa: F401
from tests.integration.test_reliability import policy as reliability_policy
from topo.harness.controller import ControllerClient, ControllerError
from topo.net import traffic
from topo.net.network import network
from topo.studies.base import policy_document
from topo.topos import StudyTopo

pytestmark = requires_ovs
SWITCHES = {"0000000000000001", "0000000000000002"}
PAIR_POLICY = "ovs-qos-controller-policy-test"


@pytest.fixture(autouse=True)
def no_pair_policy():
    """The pair keeps its policy in Open_vSwitch external_ids: gone after each test, as a fresh OVS has none."""
    yield
    subprocess.run(["ovs-vsctl", "remove", "open", ".", "external_ids", PAIR_POLICY], check=True)


def pair_policy() -> dict:
    """What the pair saved in OVSDB (ovs-vsctl prints the value as a JSON string)."""
    return json.loads(json.loads(subprocess.run(["ovs-vsctl", "get", "open", ".", f"external_ids:{PAIR_POLICY}"],
                                                capture_output=True, text=True, check=True).stdout))


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


def test_the_standby_takes_over_a_flood_within_5_s_keeping_every_row_and_answers_the_next_episode(tmp_path, recorded):
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
        with network(StudyTopo(), "user", recorded) as net, ThreadPoolExecutor(2) as pool:
            for switch in ("s1", "s2"):
                subprocess.run(["ovs-vsctl", "set-controller", switch, "tcp:127.0.0.1:6653", "tcp:127.0.0.1:6654"],
                               check=True)
            for client in (active, standby):
                client.wait(lambda s: SWITCHES <= set(s["switches"]), 30, "both switches on both controllers")
            document = policy_document("auto", 5_000_000, 25)
            active.put_policy(document)
            net.popen("h4", ["iperf3", "-s", "-1", "-p", "5300"], tmp_path / "tcp-server.txt")
            time.sleep(0.3)
            net.popen("h1", ["iperf3", "-c", net.host("h4").IP(), "-p", "5300", "-t", "60"], tmp_path / "tcp.txt")
            time.sleep(2)
            floods = [udp(pool, net, tmp_path, "flood", 14)]
            active.wait(lambda s: "program" in actions(active), 10, "the active one programming the reservation")
            rows = our_rows()
            # s1-eth1: a QoS, the default queue and one per class; s2-eth1: a QoS and its default queue
            assert len(rows) == 2 + 1 + len(document["classes"]) + 1, rows
            # auto programs and rolls back by flows alone (the queues stay): the reservation in force is s1's
            # flows that steer into them.
            steering = steering_flows("s1")
            assert steering, our_flows_specs("s1")
            os.kill(first.pid, signal.SIGKILL)
            killed = time.monotonic()
            standby.wait(lambda s: s["role"] == "active", 5, "the standby active")
            took_over = time.monotonic() - killed
            seen = []
            while time.monotonic() - killed < took_over + 3:   # the flood goes on under the new master
                seen.append(steering_flows("s1"))
                time.sleep(0.2)
            assert all(sample == steering for sample in seen), [s for s in seen if s != steering][:1]
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


@pytest.fixture(params=["unix", "tcp"])
def remote(request):
    """The OVSDB both controllers use: the system's socket, or the same database over TCP (whose server
    probes its clients, unlike a unix socket's)."""
    if request.param == "unix":
        yield DEFAULT_DB
        return
    subprocess.run(["ovs-appctl", "-t", "ovsdb-server", "ovsdb-server/add-remote", "ptcp:6642:127.0.0.1"], check=True)
    try:
        yield "tcp:127.0.0.1:6642"
    finally:
        subprocess.run(["ovs-appctl", "-t", "ovsdb-server", "ovsdb-server/remove-remote", "ptcp:6642:127.0.0.1"])


def fifo_policy(name: str, capacity: str, classified: bool) -> dict:
    doc = reliability_policy(name, queues="fifo")
    for switch in doc["switches"].values():
        switch["ports"][2]["capacity"] = capacity
        switch["flows"] = switch["flows"] if classified else switch["flows"][:2]
    return doc


def test_a_hung_active_is_replaced_and_writes_nothing_when_it_resumes(tmp_path, bridges, remote):  # noqa: F811
    shared = {"state_file": tmp_path / "state.json", "standby": "true", "ovsdb": remote}
    first = start_controller(controller_config(tmp_path / "a.conf", **shared), tmp_path / "a.log")
    second = start_controller(controller_config(tmp_path / "b.conf", ofp_port=6654, api_port=8081, metrics_port=9111,
                                                **shared), tmp_path / "b.log")
    old, new = ControllerClient(), ControllerClient("http://127.0.0.1:8081/qos/v1")
    stopped = False
    try:
        for bridge in bridges:
            subprocess.run(["ovs-vsctl", "set-controller", bridge, "tcp:127.0.0.1:6653", "tcp:127.0.0.1:6654"],
                           check=True)
        dpids = {f"{d:016x}" for d in DPIDS}
        answering(new, second, tmp_path / "b.log")
        new.wait(lambda s: s["role"] == "standby" and dpids <= set(s["switches"]), 30, "the standby with both")
        old.wait(lambda s: s["role"] == "active" and dpids <= set(s["switches"]), 30, "the active with both")
        assert old.put_policy(fifo_policy("first", "10Mbit", classified=True))["in_sync"]
        os.kill(first.pid, signal.SIGSTOP)
        stopped, hung = True, time.monotonic()
        new.wait(lambda s: s["role"] == "active", 20, "the standby taking over from the hung one")
        took_over = time.monotonic() - hung
        answer = new.put_policy(fifo_policy("second", "20Mbit", classified=False))
        assert answer["in_sync"], answer
        expected = {bridge: (rate(bridge), sorted(our_flows_specs(bridge))) for bridge in bridges}
        assert all(r == "20000000" and len(f) == 2 for r, f in expected.values()), expected
        before = len((tmp_path / "a.log").read_text())   # all it wrote before it hung
        saved = pair_policy()                            # the new active's, where the pair keeps it
        os.kill(first.pid, signal.SIGCONT)
        stopped = False
        resumed = time.monotonic()
        # Its first answers, before it has heard anything: its lease ran out while it was stopped.
        assert old.status()["role"] != "active"
        with pytest.raises(ControllerError, match="has not confirmed|standby"):
            old.put_policy(fifo_policy("third", "30Mbit", classified=False))
        seen = []
        while time.monotonic() - resumed < 6:    # what the switches and OVSDB hold, while the old one wakes
            seen.append({bridge: (rate(bridge), sorted(our_flows_specs(bridge))) for bridge in bridges})
            time.sleep(0.2)
        assert all(sample == expected for sample in seen), [s for s in seen if s != expected][:1]
        assert old.status()["role"] == "standby" and new.status()["role"] == "active"
        assert pair_policy() == saved and saved["policy"]["name"] == "second"
        after = (tmp_path / "a.log").read_text()[before:]
        assert "standing by" in after and not re.search(r"queues .* bit/s|queues removed", after), after[-3000:]
        new.clear_policy()
    finally:
        if stopped:
            os.kill(first.pid, signal.SIGCONT)
        stop_controller(second, clear=False)
        stop_controller(first, clear=False)
    assert took_over <= 15, took_over
    assert leftovers()["qos"] == ""


def answering(client: ControllerClient, proc, log) -> None:
    """Wait for a controller's API (start_controller waited for the one on 8080 only)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            client.status()
            return
        except ControllerError:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)


def rate(bridge: str) -> str:
    qos = subprocess.run(["ovs-vsctl", "get", "port", f"{bridge}p2", "qos"], capture_output=True,
                         text=True).stdout.strip()
    return "" if qos == "[]" else subprocess.run(["ovs-vsctl", "get", "qos", qos, "other_config:max-rate"],
                                                 capture_output=True, text=True).stdout.strip().strip('"')


def steering_flows(bridge: str) -> list[str]:
    """Our flows on `bridge` that steer into a class queue (set_queue), without their counters."""
    return sorted(f for f in our_flows_specs(bridge) if "set_queue" in f)


def our_flows_specs(bridge: str) -> list[str]:
    return [re.sub(r"duration=[^,]*, |n_packets=\d+, |n_bytes=\d+, |idle_age=\d+, ", "", f).strip()
            for f in our_flows(bridge)]


def test_a_standby_whose_tcp_path_to_ovsdb_stalls_ten_seconds_steals_nothing_at_the_heal(tmp_path, bridges):  # noqa: F811
    """The active one beats on; the standby's path to the same OVSDB drops everything for 10 s (nothing closed),
    then heals: its replica stood still, not the heartbeat. It stays the standby and the active one stays."""
    from tests.integration.proxy import Proxy
    subprocess.run(["ovs-appctl", "-t", "ovsdb-server", "ovsdb-server/add-remote", "ptcp:6642:127.0.0.1"], check=True)
    proxy = Proxy(6652, ("127.0.0.1", 6642))
    common = {"state_file": tmp_path / "state.json", "standby": "true"}
    first = start_controller(controller_config(tmp_path / "a.conf", ovsdb="tcp:127.0.0.1:6642", **common),
                             tmp_path / "a.log")
    second = start_controller(controller_config(tmp_path / "b.conf", ofp_port=6654, api_port=8081, metrics_port=9111,
                                                ovsdb="tcp:127.0.0.1:6652", **common), tmp_path / "b.log")
    active, standby = ControllerClient(), ControllerClient("http://127.0.0.1:8081/qos/v1")
    try:
        for bridge in bridges:
            subprocess.run(["ovs-vsctl", "set-controller", bridge, "tcp:127.0.0.1:6653", "tcp:127.0.0.1:6654"],
                           check=True)
        dpids = {f"{d:016x}" for d in DPIDS}
        answering(standby, second, tmp_path / "b.log")
        standby.wait(lambda s: s["role"] == "standby" and dpids <= set(s["switches"]), 30, "the standby with both")
        active.wait(lambda s: s["role"] == "active" and dpids <= set(s["switches"]), 30, "the active with both")
        proxy.open.clear()
        stalled = time.monotonic()
        while time.monotonic() - stalled < 10:
            assert active.status()["role"] == "active"
            time.sleep(0.5)
        proxy.open.set()
        healed = time.monotonic()
        while time.monotonic() - healed < 6:
            assert active.status()["role"] == "active" and standby.status()["role"] == "standby"
            time.sleep(0.5)
        assert "taking its lock" not in (tmp_path / "b.log").read_text()
    finally:
        proxy.close()
        stop_controller(second, clear=False)
        stop_controller(first, clear=False)
        subprocess.run(["ovs-appctl", "-t", "ovsdb-server", "ovsdb-server/remove-remote", "ptcp:6642:127.0.0.1"])
    assert leftovers()["qos"] == ""
