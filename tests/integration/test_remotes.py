"""Many OVS hosts: a second, independent OVS on this machine (topo/net/ovs_instance.py) that the controller
reaches only over TCP, beside the system's. Its OVSDB down for 10 s stalls nothing of the first; when it is
back its queues follow the policy within 10 s. A remote down when the controller starts (unix, tcp or ssl,
first in the list or not) delays nothing and is managed once it answers. The main study with s2 on it runs
under three controllers in test_study_cluster.py."""
import json
import subprocess
import time
import urllib.request

import pytest

from controller.adapters.ovsdb import DEFAULT_DB
from tests.integration.conftest import (
    NOTHING_LEFT,
    controller_config,
    leftovers,
    requires_ovs,
    start_controller,
    stop_controller,
    userspace_bridge,
)
from tests.integration.test_tls import pki  # noqa: F401
from topo.harness.controller import ControllerClient
from topo.net.ovs_instance import BASE, CONTROLLER_ADDRESS, ovs_instance

pytestmark = requires_ovs
NEAR, FAR = 0xA11, 0xB11
CONTROLLER = f"tcp:{CONTROLLER_ADDRESS}:6653"    # where switches of both OVSes reach it


def policy(name: str, capacity: str) -> dict:
    # FIFO ports: the far bridge is a userspace one on another host, where classes could not be steered.
    flows = [{"priority": 1000, "match": {"in_port": 1}, "actions": [{"output": 2}]}]
    return {"name": name, "switches": {sw: {"dp_id": dp, "flows": flows, "ports": {2: {"capacity": capacity}}}
                                       for sw, dp in (("near", NEAR), ("far", FAR))}}


def rate(vsctl, iface: str) -> str | None:
    """The max-rate of the port's QoS, None without one. Read in one transaction (ovs-vsctl runs its commands
    as one): the controller, putting a policy right, may replace the row between two reads ("no row")."""
    rows, qos = vsctl("--format=json", "--columns=_uuid,other_config", "list", "qos", "--",
                      "get", "port", iface, "qos").strip().rsplit("\n", 1)
    if qos == "[]":
        return None
    return next(dict(config[1])["max-rate"] for (_, uuid), config in json.loads(rows)["data"] if uuid == qos)


def system_vsctl(*args: str) -> str:
    return subprocess.run(["ovs-vsctl", "--timeout=30", *args], check=True, capture_output=True, text=True).stdout


def test_the_second_ovs_down_for_10_s_stalls_nothing_of_the_first_and_is_put_right_when_back(tmp_path):
    links: list[str] = []
    with ovs_instance() as far:
        try:
            userspace_bridge(system_vsctl, "rmnear", NEAR, CONTROLLER, links)
            userspace_bridge(far.vsctl, "rmfar", FAR, CONTROLLER, links, far)
            config = controller_config(tmp_path / "qos.conf", default={"ofp_listen_host": CONTROLLER_ADDRESS},
                                       ovsdb=f"{DEFAULT_DB},{far.remote}")
            proc = start_controller(config, tmp_path / "controller.log")
            client = ControllerClient()
            try:
                status = client.wait(lambda s: {f"{NEAR:016x}", f"{FAR:016x}"} <= set(s["switches"]), 30, "both")
                assert status["switches"][f"{FAR:016x}"]["ovsdb"] == far.remote
                assert status["ovsdb"] == {DEFAULT_DB: {"connected": True}, far.remote: {"connected": True}}
                assert client.put_policy(policy("first", "10Mbit"))["in_sync"]
                assert rate(system_vsctl, "rmnearp2") == rate(far.vsctl, "rmfarp2") == "10000000"

                far.stop_ovsdb()
                stopped = time.monotonic()
                client.wait(lambda s: not s["ovsdb"][far.remote]["connected"], 10, "the far OVSDB seen down")
                answer = client.put_policy(policy("second", "20Mbit"))
                # The near switch is changed at once; the far one is said to wait for its OVSDB.
                assert time.monotonic() - stopped < 8, answer
                assert rate(system_vsctl, "rmnearp2") == "20000000"
                assert not answer["in_sync"] and "not connected" in json.dumps(answer["not_in_sync"][f"{FAR:016x}"])
                assert f"{NEAR:016x}" not in answer["not_in_sync"]

                time.sleep(max(0.0, 10 - (time.monotonic() - stopped)))
                far.start_ovsdb()
                back = time.monotonic()
                deadline = back + 10
                while rate(far.vsctl, "rmfarp2") != "20000000":
                    assert time.monotonic() < deadline, "the far port's queues not put right within 10 s"
                    time.sleep(0.2)
                client.wait(lambda s: all(sw["in_sync"] for sw in s["switches"].values()), deadline - time.monotonic(),
                            "both switches in sync")
                with urllib.request.urlopen("http://127.0.0.1:9101/metrics", timeout=10) as r:
                    metrics = r.read().decode()
                assert f'ovsqos_ovsdb_connected{{remote="{far.remote}"}} 1.0' in metrics
                client.clear_policy()
                assert rate(system_vsctl, "rmnearp2") is None and rate(far.vsctl, "rmfarp2") is None
            finally:
                stop_controller(proc)
        finally:
            subprocess.run(["ovs-vsctl", "--if-exists", "del-br", "rmnear"], capture_output=True)
            for link in links:
                subprocess.run(["ip", "link", "del", link], capture_output=True)
    assert leftovers() == NOTHING_LEFT and not any(BASE.glob("*"))


DOWN = {"unix": "unix:/run/ovs-qos-no-such-ovsdb.sock", "tcp": "tcp:127.0.0.1:1", "ssl": "ssl:127.0.0.1:1"}


@pytest.mark.parametrize("kind", DOWN)
def test_a_remote_down_at_the_start_delays_nothing_and_is_said_to_be_down(tmp_path, kind, pki):  # noqa: F811
    """Listed first, where the owner's lock and generation id live: the hardest place for it to be down."""
    links: list[str] = []
    remote = DOWN[kind]
    ssl = {"ovsdb_private_key": pki.controller.private_key, "ovsdb_certificate": pki.controller.certificate,
           "ovsdb_ca_cert": pki.controller.ca_cert} if kind == "ssl" else {}
    try:
        userspace_bridge(system_vsctl, "rmdown", NEAR, "tcp:127.0.0.1:6653", links)
        started = time.monotonic()
        proc = start_controller(controller_config(tmp_path / "qos.conf", ovsdb=f"{remote},{DEFAULT_DB}", **ssl),
                                tmp_path / "controller.log")
        try:
            assert proc.poll() is None, (tmp_path / "controller.log").read_text()[-2000:]
            client = ControllerClient()
            client.wait(lambda s: f"{NEAR:016x}" in s["switches"], 15, "the system's switch")
            doc = policy("up", "10Mbit")
            del doc["switches"]["far"]
            assert client.put_policy(doc)["in_sync"] and rate(system_vsctl, "rmdownp2") == "10000000"
            assert time.monotonic() - started < 20
            status = client.status()
            assert status["role"] == "active" and status["ovsdb"][DEFAULT_DB] == {"connected": True}
            assert status["ovsdb"][remote]["connected"] is False and status["ovsdb"][remote]["error"]
            client.clear_policy()
        finally:
            stop_controller(proc)
        log = (tmp_path / "controller.log").read_text()
        assert "Traceback" not in log and f"OVSDB {remote}: " in log, log[-3000:]
    finally:
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", "rmdown"], capture_output=True)
        for link in links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
    assert leftovers() == NOTHING_LEFT


def test_a_second_ovs_down_at_the_start_is_managed_once_it_answers(tmp_path):
    links: list[str] = []
    with ovs_instance() as far:
        try:
            userspace_bridge(system_vsctl, "rmnear", NEAR, CONTROLLER, links)
            userspace_bridge(far.vsctl, "rmfar", FAR, CONTROLLER, links, far)
            far.stop_ovsdb()
            config = controller_config(tmp_path / "qos.conf", default={"ofp_listen_host": CONTROLLER_ADDRESS},
                                       ovsdb=f"{DEFAULT_DB},{far.remote}")
            proc = start_controller(config, tmp_path / "controller.log")
            client = ControllerClient()
            try:
                client.wait(lambda s: f"{NEAR:016x}" in s["switches"], 15, "the near switch")
                answer = client.put_policy(policy("first", "10Mbit"))
                assert rate(system_vsctl, "rmnearp2") == "10000000" and not answer["in_sync"]
                assert set(answer["not_in_sync"]) == {f"{FAR:016x}"}
                far.start_ovsdb()
                client.wait(lambda s: f"{FAR:016x}" in s["switches"] and all(sw["in_sync"] for sw in
                                                                            s["switches"].values()),
                            20, "the far switch managed once its OVSDB answers")
                assert rate(far.vsctl, "rmfarp2") == "10000000"
                client.clear_policy()
            finally:
                stop_controller(proc)
            assert "Traceback" not in (tmp_path / "controller.log").read_text()
        finally:
            subprocess.run(["ovs-vsctl", "--if-exists", "del-br", "rmnear"], capture_output=True)
            for link in links:
                subprocess.run(["ip", "link", "del", link], capture_output=True)
    assert leftovers() == NOTHING_LEFT and not any(BASE.glob("*"))
