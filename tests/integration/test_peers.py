"""controller/adapters/peers.py against a real ovsdb-server of the test's own (a private database and
socket): a member's session closed is heard the moment its process dies, and only then; one that comes back
is heard too. (Whether the member died is liveness.py's to confirm: test_cluster.py.)"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.adapters.peers import PeerWatch
from tests.integration.conftest import requires_ovs

pytestmark = requires_ovs
REPO = Path(__file__).resolve().parents[2]
SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"

# A member in a process of its own, watching like the others, until it is killed.
MEMBER = """
import sys, time
from controller.adapters.peers import PeerWatch
from tests.integration.test_peers import Heard
watch = PeerWatch(sys.argv[1], "site", "c", Heard("c", []), probe=4)
watch.peers = frozenset(("a", "b", "c"))
watch.start()
while not watch.own_held:
    time.sleep(0.01)
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def ovsdb(tmp_path):
    """A private ovsdb-server on a unix socket under tmp_path; stopped afterwards."""
    db, sock = tmp_path / "conf.db", tmp_path / "db.sock"
    subprocess.run(["ovsdb-tool", "create", str(db), SCHEMA], check=True)
    server = subprocess.Popen(["ovsdb-server", str(db), f"--remote=punix:{sock}", "--no-chdir",
                               f"--unixctl={tmp_path / 'ctl'}", "--log-file=" + str(tmp_path / "ovsdb.log")])
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert server.poll() is None and time.monotonic() < deadline, "ovsdb-server did not start"
            time.sleep(0.02)
        yield f"unix:{sock}"
    finally:
        server.terminate()
        server.wait(timeout=10)


class Heard:
    """What a member's watch tells liveness.py, kept: (member, peer whose session closed, when); and each peer back."""

    def __init__(self, me: str, heard: list) -> None:
        self.me, self.heard, self.back_again = me, heard, []

    def suspect(self, peer: str, now: float) -> None:
        self.heard.append((self.me, peer, time.monotonic()))

    def back(self, peer: str) -> None:
        self.back_again.append(peer)

    def held(self, ours: bool) -> None:
        pass

    def due(self, now: float) -> float:
        return 1.0


def wait_for(condition, what, seconds=10):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.01)


def test_a_member_killed_is_heard_at_once_by_the_first_in_line_and_a_stranger_never(ovsdb):
    heard: list[tuple[str, str, float]] = []
    told = {name: Heard(name, heard) for name in ("a", "b")}
    watches = {name: PeerWatch(ovsdb, "site", name, told[name], probe=4) for name in ("a", "b")}
    member = subprocess.Popen([sys.executable, "-c", MEMBER, ovsdb], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert member.stdout.readline() == "held\n"
        for watch in watches.values():
            watch.peers = frozenset(("a", "b", "c", "d"))     # d: a member that never connects
            watch.start()
        wait_for(lambda: all(w.own_held and w.watching - {"d"} == {"a", "b", "c"} - {n} for n, w in watches.items()),
                 "each member holds its lock and waits in line for the others'")
        time.sleep(2)                   # d's lock, kept for it by whichever asked first, is no sign of anything
        assert heard == []
        os.kill(member.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: any(peer == "c" for _, peer, _ in heard), "c's death heard")
        first = next(t for _, peer, t in heard if peer == "c")
        print(f"kill -9 of a member: heard {first - killed:.3f} s later")
        time.sleep(1.5)
        assert {peer for _, peer, _ in heard} == {"c"}
        # c back: it takes its lock from whoever kept it (who hears it back), and its death is heard again.
        member = subprocess.Popen([sys.executable, "-c", MEMBER, ovsdb], cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert member.stdout.readline() == "held\n"
        wait_for(lambda: "c" in told["a"].back_again + told["b"].back_again, "c back, heard by the one that kept its lock")
        wait_for(lambda: all("c" in w.watching for w in watches.values()), "both in line for c's lock again")
        os.kill(member.pid, signal.SIGKILL)
        wait_for(lambda: sum(peer == "c" for _, peer, _ in heard) == 2, "c's second death heard")
        # The one who heard gave the lock back; a member alive is still watched by each other member.
        assert watches["a"].watching >= {"b"} and watches["b"].watching >= {"a"}
        watches["b"].stop()             # b's session closes with its thread: a hears it
        wait_for(lambda: ("a", "b") in {(me, peer) for me, peer, _ in heard}, "b's close heard by a")
    finally:
        member.kill()
        member.wait()
        for watch in watches.values():
            watch.stop()
