"""tc fenced by the switches' host locks, against the real ovsdb-server, ovs-vswitchd and tc: a cluster
member stopped in the middle of writing a switch's tc, and the member that owns the switch after it; a
deposed member (or a pair's deposed active) whose copy of OVSDB is behind the server's."""
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from controller.adapters.hostlock import SwitchLocks
from controller.adapters.ovsdb import DEFAULT_DB, Fenced, Ovsdb
from controller.adapters.tc import Tc
from controller.adapters.worker import Worker
from controller.compat import hub
from controller.core.jobs import Job
from controller.core.policy import load_document, parse_policy
from controller.core.queues import reserve_qos
from tests.integration.conftest import forget_datapaths, remove_rows, requires_ovs
from tests.integration.proxy import Proxy

pytestmark = requires_ovs
REPO = Path(__file__).resolve().parents[2]
POLICY = parse_policy(load_document(REPO / "policies/reserve.yaml"))
PORTS = 8
OWNER = "fence-test"
DP_ID = 0xFE4CE
OLD, NEW = 40, 25          # the leaves' packet limits of the deposed member's policy and of the new owner's
STOP_AT = 6                # the deposed member stops itself before its sixth leaf: the second port's

# The deposed member, as a process of its own: the real worker with the real adapters, under epoch 10, which
# stops (SIGSTOP, as a hung VM or a debugger would) just before one of its tc writes.
MEMBER = """
import dataclasses, json, os, signal, sys
from controller.adapters.hostlock import SwitchLocks
from controller.adapters.ovsdb import Ovsdb
from controller.adapters.tc import Tc
from controller.adapters.worker import Worker
from controller.compat import hub
from controller.core.jobs import Job
from controller.core.policy import load_document, parse_policy
from controller.core.queues import reserve_qos

class Stops(Tc):
    leaves = 0
    def replace_leaf(self, *args):
        Stops.leaves += 1
        if Stops.leaves == int(sys.argv[4]):
            os.kill(os.getpid(), signal.SIGSTOP)
        return super().replace_leaf(*args)

policy = parse_policy(load_document("policies/reserve.yaml"))
spec = dataclasses.replace(reserve_qos(policy, policy.switch(1).port(1), True), leaf=("pfifo", "limit", sys.argv[3]))
db = Ovsdb(owner=sys.argv[2], lock=False)
jobs = [Job(int(sys.argv[1]), 1, k + 1, iface, True, spec, True, epoch=10) for k, iface in enumerate(sys.argv[6:])]
worker = Worker(db, Stops(), lambda results: None, locks=SwitchLocks(__import__("pathlib").Path(sys.argv[5]), hub.sleep))
print(json.dumps([r.error for r in worker.execute(jobs)]))
db.close()
"""


def sh(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def bridge():
    """A userspace bridge of PORTS veth ports, datapath id DP_ID; removed afterwards whatever happens."""
    tag = uuid.uuid4().hex[:5]
    name, ifaces = f"tf{tag}", [f"tf{tag}{k}" for k in range(PORTS)]
    forget_datapaths(DP_ID)
    try:
        for iface in ifaces:
            sh("ip", "link", "add", iface, "type", "veth", "peer", "name", f"{iface}p")
            sh("ip", "link", "set", iface, "up")
        sh("ovs-vsctl", "add-br", name, "--", "set", "bridge", name, "datapath_type=netdev",
           f"other_config:datapath-id={DP_ID:016x}", *[a for iface in ifaces for a in ("--", "add-port", name, iface)])
        yield name, ifaces
    finally:
        sh("ovs-vsctl", "--if-exists", "del-br", name)
        for iface in ifaces:
            subprocess.run(["ip", "link", "del", iface], capture_output=True)
        remove_rows(OWNER)


def epoch(name):
    done = subprocess.run(["ovs-vsctl", "get", "bridge", name, f"external_ids:ovs-qos-epoch-{OWNER}"],
                          capture_output=True, text=True)
    return int(done.stdout.strip().strip('"')) if done.returncode == 0 else None


def limits(tc, ifaces):
    """Each port's leaf limits, the parent class left out."""
    return {iface: {leaf.limit for leaf in tc.leaves(iface).values()} for iface in ifaces}


def stopped(pid):
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "T"


def test_a_member_stopped_mid_write_never_writes_tc_after_the_new_owners_epoch(bridge, tmp_path):
    name, ifaces = bridge
    assert epoch(name) is None and sh("ovs-vsctl", "get", "port", ifaces[0], "qos").strip() == "[]"
    member = subprocess.Popen([sys.executable, "-c", MEMBER, str(DP_ID), OWNER, str(OLD), str(STOP_AT), str(tmp_path),
                               *ifaces], cwd=REPO, stdout=subprocess.PIPE, text=True)
    tc, db = Tc(), Ovsdb(owner=OWNER, lock=False)
    try:
        deadline = time.monotonic() + 60
        while not stopped(member.pid):
            assert member.poll() is None and time.monotonic() < deadline, "the member never reached its tc writes"
            time.sleep(0.02)
        assert epoch(name) == 10
        # The new owner, past the member's lease: epoch 20, the same classes with other leaves.
        new = dataclasses.replace(reserve_qos(POLICY, POLICY.switch(1).port(1), True), leaf=("pfifo", "limit", str(NEW)))
        jobs = [Job(DP_ID, 2, k + 1, iface, True, new, True, epoch=20) for k, iface in enumerate(ifaces)]
        worker = Worker(db, tc, lambda results: None, locks=SwitchLocks(tmp_path, hub.sleep))
        first = worker.execute(jobs)
        os.kill(member.pid, signal.SIGCONT)
        out, _ = member.communicate(timeout=60)
        assert member.returncode == 0 and json.loads(out) == [None] * PORTS
        # Whoever's epoch OVSDB holds now, tc holds its leaves on every port: the woken member wrote nothing
        # after the newer epoch existed. (Unfenced, it finished its old leaves over the new owner's.)
        held = epoch(name)
        assert all(found == {OLD if held == 10 else NEW} for found in limits(tc, ifaces).values()), \
            (held, limits(tc, ifaces))
        # How: the stopped member held the switch's lock, so the new owner raised no epoch and wrote nothing.
        assert held == 10
        assert all("another controller on this host is writing its tc" in (r.error or "") for r in first)
        done = worker.execute(jobs)
        assert [r.error for r in done] == [None] * PORTS
        assert epoch(name) == 20 and all(found == {NEW} for found in limits(tc, ifaces).values())
    finally:
        if member.poll() is None:
            member.kill()
            os.kill(member.pid, signal.SIGCONT)
            member.wait()
        db.close()
        tc.close()


class HeldReplica(Proxy):
    """A member's OVSDB connection through a unix socket of its own. After hold(), what the server sends it
    (the updates its copy of OVSDB is made of) waits until the member next sends the server something: its
    copy stays as it was, however long, as a paused process's does while updates queue up for it, unless it
    asks the server."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path), DEFAULT_DB.removeprefix("unix:"))
        self.flowing = threading.Event()
        self.flowing.set()

    def hold(self) -> None:
        self.flowing.clear()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        to_member = a.getpeername() == self.target
        try:
            while data := a.recv(65536):
                if to_member:
                    self.flowing.wait()
                else:
                    self.flowing.set()
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@pytest.mark.parametrize("pair", [False, True], ids=["cluster member", "pair's active"])
def test_a_deposed_member_whose_copy_of_ovsdb_is_behind_writes_no_tc_after_the_new_owners_epoch(bridge, tmp_path,
                                                                                                 pair):
    """Its epoch is still the one its copy shows, so its fence checks nothing it could see locally: only the
    server knows of the newer epoch (a pair's: and that the lock was stolen)."""
    _, ifaces = bridge
    proxy = HeldReplica(tmp_path / "ovsdb.sock")
    old = Ovsdb(f"unix:{tmp_path / 'ovsdb.sock'}", owner=OWNER, lock=pair, standby=pair)
    new = Ovsdb(owner=OWNER, lock=pair, standby=pair)
    tc = Tc()
    try:
        specs = {limit: dataclasses.replace(reserve_qos(POLICY, POLICY.switch(1).port(1), True),
                                            leaf=("pfifo", "limit", str(limit))) for limit in (OLD, NEW)}
        locks = SwitchLocks(tmp_path, hub.sleep)
        deposed, owner = (Worker(db, tc, lambda results: None, locks=locks) for db in (old, new))
        done = deposed.execute([Job(DP_ID, 1, k + 1, iface, True, specs[OLD], True, epoch=10)
                                for k, iface in enumerate(ifaces)])
        assert [r.error for r in done] == [None] * PORTS and epoch(bridge[0]) == 10
        proxy.hold()
        if pair:
            new.steal_lock()
            deadline = time.monotonic() + 10
            while not new.has_lock:
                assert time.monotonic() < deadline, "the lock never moved"
                time.sleep(0.05)
        done = owner.execute([Job(DP_ID, 2, k + 1, iface, True, specs[NEW], True, epoch=20)
                              for k, iface in enumerate(ifaces)])
        assert [r.error for r in done] == [None] * PORTS and epoch(bridge[0]) == 20
        assert all(found == {NEW} for found in limits(tc, ifaces).values())
        # The deposed one checks its ports' tc, as at each poll: its leaves are not the new owner's.
        late = deposed.execute([Job(DP_ID, 1, k + 1, iface, True, specs[OLD], False, epoch=10)
                                for k, iface in enumerate(ifaces)])
        assert all(found == {NEW} for found in limits(tc, ifaces).values()), limits(tc, ifaces)
        assert all(r.error and ("another controller of this owner holds it now" in r.error or
                                pair and "lock" in r.error) for r in late), [r.error for r in late]
    finally:
        proxy.flowing.set()
        for db in (old, new):
            db.close()
        tc.close()
        proxy.close()


def test_a_deposed_member_whose_copy_of_ovsdb_is_behind_changes_no_qos_row_after_the_new_owners_epoch(bridge,
                                                                                                     tmp_path):
    """The same for OVSDB: the new owner only raised the epoch (it adopted the port's QoS as it was), so
    nothing the deposed member's transaction reads or writes on the port changed."""
    name, ifaces = bridge
    proxy = HeldReplica(tmp_path / "ovsdb.sock")
    old = Ovsdb(f"unix:{tmp_path / 'ovsdb.sock'}", owner=OWNER, lock=False)
    new = Ovsdb(owner=OWNER, lock=False)
    try:
        spec = reserve_qos(POLICY, POLICY.switch(1).port(1), True)
        old.apply({ifaces[0]: spec}, epochs={DP_ID: 10})
        held = sh("ovs-vsctl", "get", "port", ifaces[0], "qos").strip()
        assert held != "[]" and epoch(name) == 10
        proxy.hold()
        assert new.fence({DP_ID: 20}) == {} and epoch(name) == 20
        with pytest.raises(Fenced, match="another controller of this owner holds it now"):
            old.apply({ifaces[0]: None}, epochs={DP_ID: 10})
        assert sh("ovs-vsctl", "get", "port", ifaces[0], "qos").strip() == held
    finally:
        proxy.flowing.set()
        for db in (old, new):
            db.close()
        proxy.close()
