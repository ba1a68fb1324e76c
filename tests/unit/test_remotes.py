"""controller/adapters/remotes.py: several OVSDB remotes, each connected and retried on its own whatever
its connection raises, a datapath found in the remote that holds it, and a remote that is down refusing
changes at once. (The real connections, a real lock and remotes down at the controller's start:
tests/integration/test_remotes.py.)"""
import pytest

from controller.adapters.ovsdb import OvsdbError
from controller.adapters.remotes import Remotes, on_this_host
from controller.core.bridges import BridgeInfo
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


def test_a_remote_that_does_not_answer_is_tried_again_with_back_off_and_the_others_serve_meanwhile():
    up = {"unix:/a": Db({1: "br1"}), "tcp:127.0.0.2:6640": Db({2: "br2"})}
    down = {"tcp:127.0.0.2:6640"}
    tries = []

    def connect(name):
        tries.append(name)
        if name in down:   # what ovsdbapp's schema fetch raises when nothing answers: a bare Exception
            raise Exception("Could not retrieve schema from tcp:127.0.0.2:6640")
        return up[name]

    remotes = Remotes(tuple(up), connect)
    assert remotes.connect("unix:/a") is None
    waits = [remotes.connect("tcp:127.0.0.2:6640") for _ in range(7)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]             # doubling, to 30 s at most
    assert remotes.connected() == {"unix:/a": True, "tcp:127.0.0.2:6640": False}
    assert remotes.bridge(1).remote == "unix:/a" and remotes.bridge(2) is None
    assert remotes.errors == {"tcp:127.0.0.2:6640": "Could not retrieve schema from tcp:127.0.0.2:6640"}
    down.clear()
    assert remotes.connect("tcp:127.0.0.2:6640") is None
    assert remotes.bridge(2) == BridgeInfo("br2", "netdev", {1: "p1"}, "tcp:127.0.0.2:6640")
    assert remotes.errors == {}


def test_a_pinned_switch_is_looked_for_in_its_remote_only():
    remotes = Remotes(("unix:/a", "unix:/b"), {"unix:/a": Db({1: "a1"}), "unix:/b": Db({1: "b1"})}.__getitem__)
    for name in remotes.names:
        remotes.connect(name)
    assert remotes.bridge(1).name == "a1" and remotes.bridge(1, "unix:/b").name == "b1"
    assert remotes.port_qos("unix:/c", "p1") == ABSENT


def test_a_remote_that_is_not_connected_refuses_changes_at_once():
    db = Db({})
    remotes = Remotes(("unix:/a",), lambda name: db)
    remotes.connect("unix:/a")
    view = remotes.view("unix:/a")
    view.apply({"p1": None})
    db.connected = False
    with pytest.raises(OvsdbError, match="^OVSDB unix:/a is not connected; tried again when it is back$"):
        view.apply({"p1": None})
    assert db.applied == [{"p1": None}]


@pytest.mark.parametrize("remote, local", [
    ("unix:/var/run/openvswitch/db.sock", True),
    ("tcp:127.0.0.1:6640", False), ("ssl:127.0.0.53:6640", False), ("tcp:[::1]:6640", False),
    ("tcp:169.254.72.2:6640", False), ("ssl:[2001:db8::1]:6640", False),
])
def test_tc_is_written_for_a_unix_remote_only(remote, local):
    """A loopback TCP remote may serve a vswitchd in another namespace (the launcher's second OVS is one)."""
    assert on_this_host(remote) is local
