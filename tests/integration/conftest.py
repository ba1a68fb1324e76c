"""Integration tests need root, a running Open vSwitch and nothing else on the study's names."""
import os
import subprocess

import pytest


def _ovs_running() -> bool:
    return subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode == 0


requires_ovs = pytest.mark.skipif(os.geteuid() != 0 or not _ovs_running(),
                                  reason="needs root and a running Open vSwitch (scripts/setup.sh starts it)")


def leftovers() -> dict[str, str]:
    """What a run must not leave behind: bridges, QoS/Queue rows, iperf3, controllers."""
    def out(*args):
        return subprocess.run(args, capture_output=True, text=True).stdout.strip()
    return {"bridges": out("ovs-vsctl", "list-br"),
            "qos": out("ovs-vsctl", "--columns=_uuid", "list", "QoS"),
            "queues": out("ovs-vsctl", "--columns=_uuid", "list", "Queue"),
            "iperf3": out("pgrep", "-a", "-x", "iperf3"),
            "controller": out("pgrep", "-af", "osken-manager")}


NOTHING_LEFT = {"bridges": "", "qos": "", "queues": "", "iperf3": "", "controller": ""}
