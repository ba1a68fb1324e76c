"""controller/adapters/remotes.py: several OVSDB remotes, each connected and retried on its own, a
datapath found in the remote that holds it, and a remote that is down refusing changes at once."""
import time

import pytest

from controller.adapters.ovsdb import BridgeInfo, LockHeld, OvsdbError
from controller.adapters.remotes import Remotes, on_this_host
from controller.core.plan import ABSENT


class Db:
    def __init__(self, bridges: dict[int, str]):
        self.bridges, self.connected, self.generation, self.applied = bridges, True, 7, []

    def bridge(self, dp_id):
        return BridgeInfo(self.bridges[dp_id], "netdev", {1: "p1"}) if dp_id in self.bridges else None

    def port_qos(self, iface):
        return None

    def apply(self, changes, **_):
        self.applied.append(changes)

    def close(self):
        self.connected = False


def test_a_remote_down_at_start_is_tried_again_with_back_off_and_the_others_serve_meanwhile():
    up = {"unix:/a": Db({1: "br1"}), "tcp:127.0.0.2:6640": Db({2: "br2"})}
    down = {"tcp:127.0.0.2:6640"}
    tries = []

    def connect(name):
        tries.append(name)
        if name in down:
            raise OvsdbError("connection refused")
        return up[name]

    remotes = Remotes(tuple(up), connect)
    remotes.connect_all_once()
    assert remotes.connected() == {"unix:/a": True, "tcp:127.0.0.2:6640": False}
    assert remotes.bridge(1).remote == "unix:/a" and remotes.bridge(2) is None
    assert remotes.errors == {"tcp:127.0.0.2:6640": "connection refused"}
    now = time.monotonic()
    assert remotes.connect_due(now) == [] and tries.count("tcp:127.0.0.2:6640") == 1   # not due yet
    remotes.connect_due(now + 1.5)
    remotes.connect_due(now + 2.0)                      # back-off doubled to 2 s: not due
    assert tries.count("tcp:127.0.0.2:6640") == 2
    down.clear()
    assert remotes.connect_due(now + 10) == ["tcp:127.0.0.2:6640"]
    assert remotes.bridge(2) == BridgeInfo("br2", "netdev", {1: "p1"}, "tcp:127.0.0.2:6640")
    assert remotes.errors == {}


def test_a_pinned_switch_is_looked_for_in_its_remote_only():
    remotes = Remotes(("unix:/a", "unix:/b"), {"unix:/a": Db({1: "a1"}), "unix:/b": Db({1: "b1"})}.__getitem__)
    remotes.connect_all_once()
    assert remotes.bridge(1).name == "a1" and remotes.bridge(1, "unix:/b").name == "b1"
    assert remotes.port_qos("unix:/c", "p1") == ABSENT


def test_a_remote_that_is_not_connected_refuses_changes_at_once():
    db = Db({})
    remotes = Remotes(("unix:/a",), lambda name: db)
    remotes.connect_all_once()
    view = remotes.view("unix:/a")
    view.apply({"p1": None})
    db.connected = False
    with pytest.raises(OvsdbError, match="^OVSDB unix:/a is not connected; tried again when it is back$"):
        view.apply({"p1": None})
    assert db.applied == [{"p1": None}]


def test_another_controller_holding_a_lock_stops_the_start():
    def connect(name):
        raise LockHeld("another controller with owner 'x' is running")
    with pytest.raises(LockHeld):
        Remotes(("unix:/a",), connect).connect_all_once()


@pytest.mark.parametrize("remote, local", [("unix:/var/run/openvswitch/db.sock", True), ("tcp:127.0.0.2:6640", False),
                                           ("ssl:[::1]:6640", False), ("tcp:192.0.2.7:6640", False)])
def test_tc_reaches_only_the_ports_of_this_machine(remote, local):
    assert on_this_host(remote) is local
