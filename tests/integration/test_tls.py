"""OpenFlow over TLS and OVSDB over SSL, with throw-away certificates from ovs-pki: a switch of a second,
independent OVS (topo/net/ovs_instance.py, as another host would be) reaches the controller only over
TLS, and the controller programs that OVS's queues only over SSL."""
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller.core.flows import COOKIE
from tests.integration.conftest import (
    NOTHING_LEFT,
    controller_config,
    leftovers,
    requires_ovs,
    start_controller,
    stop_controller,
    userspace_bridge,
)
from topo.harness.controller import ControllerClient
from topo.net.ovs_instance import CONTROLLER_ADDRESS, Pki, ovs_instance

pytestmark = requires_ovs
DP_ID = 0xB01


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A controller CA and a switch CA; the controller's key and certificate, and the switch's."""
    d = tmp_path_factory.mktemp("pki")
    for args in (["init"], ["req+sign", "ctl", "controller"], ["req+sign", "sc", "switch"]):
        subprocess.run(["ovs-pki", f"--dir={d / 'pki'}", "--force", *args], cwd=d, check=True, capture_output=True)
    return SimpleNamespace(controller=Pki(d / "ctl-privkey.pem", d / "ctl-cert.pem", d / "pki/switchca/cacert.pem"),
                           switch=Pki(d / "sc-privkey.pem", d / "sc-cert.pem", d / "pki/controllerca/cacert.pem"))


def tls_config(path: Path, pki, ovsdb: str) -> Path:
    ctl = pki.controller
    return controller_config(path, default={"ofp_listen_host": CONTROLLER_ADDRESS,
                                            "ctl_privkey": ctl.private_key, "ctl_cert": ctl.certificate,
                                            "ca_certs": ctl.ca_cert, "ofp_ssl_listen_port": 6653},
                             ovsdb=ovsdb, ovsdb_private_key=ctl.private_key, ovsdb_certificate=ctl.certificate,
                             ovsdb_ca_cert=ctl.ca_cert)


def policy() -> dict:
    # A FIFO port: classes on a userspace bridge of another host could not be steered (no tc there).
    return {"name": "tls", "switches": {"far": {"dp_id": DP_ID, "ports": {2: {"capacity": "10Mbit"}},
                                                "flows": [{"priority": 1000, "match": {"in_port": 1},
                                                           "actions": [{"output": 2}]}]}}}


def test_a_switch_of_another_ovs_is_reached_over_tls_and_its_queues_over_ssl(tmp_path, pki):
    links: list[str] = []
    with ovs_instance(pki=pki.switch) as far:
        try:
            userspace_bridge(far.vsctl, "tls0", DP_ID, f"ssl:{CONTROLLER_ADDRESS}:6653", links, far)
            proc = start_controller(tls_config(tmp_path / "qos.conf", pki, far.remote), tmp_path / "controller.log")
            try:
                client = ControllerClient()
                client.wait(lambda s: f"{DP_ID:016x}" in s["switches"], 30, "the far switch, over TLS")
                answer = client.put_policy(policy())
                assert answer["in_sync"], answer
                # The far OVS holds our rows (reached over SSL); the system's OVS none of them.
                assert "ovs-qos-controller=test" in far.vsctl("--columns=external_ids", "list", "qos")
                assert "ovs-qos-controller=test" not in subprocess.run(
                    ["ovs-vsctl", "--columns=external_ids", "list", "qos"], capture_output=True, text=True).stdout
                flows = far.ofctl("-O", "OpenFlow13", "dump-flows", "tls0")
                assert f"cookie={COOKIE >> 48:#x}" in flows and "in_port=1 actions=output:2" in flows
                vswitchd = (far.rundir / "ovs-vswitchd.log").read_text()
                assert f"tls0<->ssl:{CONTROLLER_ADDRESS}:6653: connected" in vswitchd
                client.clear_policy()
                assert "ovs-qos-controller=test" not in far.vsctl("--columns=external_ids", "list", "qos")
            finally:
                stop_controller(proc)
            log = (tmp_path / "controller.log").read_text()
            assert "connected" in log and "Traceback" not in log, log[-2000:]
        finally:
            for link in links:
                subprocess.run(["ip", "link", "del", link], capture_output=True)
    assert leftovers() == NOTHING_LEFT
    assert not Path("/run/ovs-qos-instances/ovs2").exists()


def test_a_switch_without_a_certificate_from_the_switch_ca_is_refused(tmp_path, pki):
    # The controller's own certificate is not signed by the switch CA: a switch presenting it is refused.
    impostor = Pki(pki.controller.private_key, pki.controller.certificate, pki.switch.ca_cert)
    with ovs_instance(pki=impostor) as far:
        userspace_bridge(far.vsctl, "tls1", DP_ID + 1, f"ssl:{CONTROLLER_ADDRESS}:6653", [], far, ports=0)
        proc = start_controller(tls_config(tmp_path / "qos.conf", pki, far.remote), tmp_path / "controller.log")
        try:
            vswitchd = far.rundir / "ovs-vswitchd.log"
            target = f"tls1<->ssl:{CONTROLLER_ADDRESS}:6653"
            assert f"{target}: connection dropped" not in vswitchd.read_text()
            # The positive evidence: the switch tried, and the controller dropped it.
            wait_for(lambda: f"{target}: connection dropped" in vswitchd.read_text(), 30, "tls1 dropped")
            assert f"{target}: connected" not in vswitchd.read_text()
            assert f"{DP_ID + 1:016x}" not in ControllerClient().status()["switches"]
        finally:
            stop_controller(proc)
    assert leftovers() == NOTHING_LEFT


def test_a_switch_without_tls_is_refused_while_the_same_switch_with_tls_is_accepted(tmp_path, pki):
    # A switch speaking plain TCP to the TLS-only controller gets no OpenFlow session at all, while a
    # bridge of the same OVS that speaks TLS is accepted: the wait was long enough for a connection.
    with ovs_instance(pki=pki.switch) as far:
        userspace_bridge(far.vsctl, "tls2", DP_ID + 2, f"tcp:{CONTROLLER_ADDRESS}:6653", [], far, ports=0)
        userspace_bridge(far.vsctl, "tls3", DP_ID + 3, f"ssl:{CONTROLLER_ADDRESS}:6653", [], far, ports=0)
        proc = start_controller(tls_config(tmp_path / "qos.conf", pki, far.remote), tmp_path / "controller.log")
        try:
            client = ControllerClient()
            status = client.wait(lambda s: f"{DP_ID + 3:016x}" in s["switches"], 30, "tls3, over TLS")
            assert f"{DP_ID + 2:016x}" not in status["switches"]
            log = (far.rundir / "ovs-vswitchd.log").read_text()
            assert f"tls3<->ssl:{CONTROLLER_ADDRESS}:6653: connected" in log
            assert f"tls2<->tcp:{CONTROLLER_ADDRESS}:6653: connecting" in log
            assert f"tls2<->tcp:{CONTROLLER_ADDRESS}:6653: connected" not in log
        finally:
            stop_controller(proc)
    assert leftovers() == NOTHING_LEFT


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.2)
