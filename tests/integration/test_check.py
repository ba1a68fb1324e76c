"""The offline checker against a live OVSDB: the bridges it reads are the ones `ovs-vsctl` made."""
import subprocess
import sys

import pytest
import yaml

from tests.integration.conftest import REPO, forget_datapaths, requires_ovs

pytestmark = requires_ovs
BRIDGE, DP_ID = "chk0", 0xC01


@pytest.fixture
def bridge():
    args = ["ovs-vsctl", "--timeout=30", "add-br", BRIDGE, "--", "set", "bridge", BRIDGE, "datapath_type=netdev",
            "fail_mode=secure", f"other_config:datapath-id={DP_ID:016x}"]
    forget_datapaths(DP_ID)
    for port in (1, 2):
        args += ["--", "add-port", BRIDGE, f"{BRIDGE}p{port}", "--", "set", "interface", f"{BRIDGE}p{port}",
                 "type=internal", f"ofport_request={port}"]
    subprocess.run(args, check=True)
    try:
        yield
    finally:
        subprocess.run(["ovs-vsctl", "--timeout=30", "--if-exists", "del-br", BRIDGE], check=True)


def check(tmp_path, output: int):
    doc = {"name": "live", "switches": {"edge": {"dp_id": DP_ID, "ports": {1: {"capacity": "10Mbit"}},
                                                 "flows": [{"priority": 10, "match": {"in_port": 1},
                                                            "actions": [{"output": output}]}]}}}
    path = tmp_path / "live.yaml"
    path.write_text(yaml.safe_dump(doc))
    return subprocess.run([sys.executable, "-m", "controller.check", "--ovsdb", "unix:/var/run/openvswitch/db.sock",
                           str(path)], cwd=REPO, capture_output=True, text=True, timeout=60), path


def test_a_policy_that_fits_the_live_bridge_passes(bridge, tmp_path):
    done, _ = check(tmp_path, output=2)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["switches"]["edge"]["dp_id"] == DP_ID


def test_a_port_the_live_bridge_lacks_is_named(bridge, tmp_path):
    done, path = check(tmp_path, output=3)
    assert done.returncode == 2 and done.stdout == ""
    # The bridge's own (LOCAL) port 65534 is one of its ports too.
    assert done.stderr.strip() == (f"error: {path}: switches.edge.flows[0].actions[0].output: bridge "
                                   f"{DP_ID:016x} of switch edge has no OpenFlow port 3 (it has 1, 2, 65534); "
                                   "fix the port number")
