"""The OVSDB adapter against the real ovsdb-server and ovs-vswitchd: rows read back, ownership, the owner's
lock, many ports in bounded transactions, HTB classes."""
import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
from ovs.db import idl

from controller.adapters import ovsdb
from controller.adapters.ovsdb import Fenced, LockHeld, Ovsdb, OvsdbError, Unconfirmed
from controller.adapters.remotes import Remotes
from controller.adapters.statefile import StateFile
from controller.adapters.store import PairStore
from controller.adapters.tc import Leaf, Tc
from controller.core import events as ev
from controller.core.plan import ABSENT, FOREIGN
from controller.core.policy import load_document, parse_policy
from controller.core.queues import fifo_qos, leaf_chain, leaf_in_force, reserve_qos
from tests.integration.conftest import remove_rows, requires_ovs
from topo.harness import capabilities, host

pytestmark = requires_ovs
POLICY = parse_policy(load_document("policies/reserve.yaml"))
TC = Tc()
PORT = POLICY.switch(1).port(1)
QUEUES = len(POLICY.classes) + 1          # reserve's classes (tcp, udp, voice) and the default queue


def sh(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


@contextmanager
def userspace_bridge(bridge: str, ifaces: list[str], up: bool = False):
    """An Ovsdb of a fresh owner, and a userspace bridge with a veth port per name; all removed
    afterwards whatever happens."""
    db = None
    try:
        for iface in ifaces:
            sh("ip", "link", "add", iface, "type", "veth", "peer", "name", f"{iface}p")
            if up:
                sh("ip", "link", "set", iface, "up")
        sh("ovs-vsctl", "add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev",
           *[a for iface in ifaces for a in ("--", "add-port", bridge, iface)])
        db = Ovsdb(owner=f"test-{bridge}")
        yield db
    finally:
        if db is not None:
            remove_rows(db.owner)
            db.close()
        sh("ovs-vsctl", "--if-exists", "del-br", bridge)
        for iface in ifaces:
            subprocess.run(["ip", "link", "del", iface], capture_output=True)


@pytest.fixture
def port():
    """A userspace bridge with one veth port (up)."""
    tag = uuid.uuid4().hex[:6]
    iface = f"tv{tag}"
    with userspace_bridge(f"tb{tag}", [iface], up=True) as db:
        yield db, iface



def rows(table, owner):
    """The rows of `table` whose external_ids name `owner` (ovs-vsctl quotes values with '-')."""
    return [line for line in sh("ovs-vsctl", "--columns=external_ids", "list", table).splitlines()
            if re.search(rf'ovs-qos-controller="?{owner}"?[,}}]', line)]


def wait_classes(iface, count):
    for _ in range(50):
        classes = {c for c in TC.classes(iface) if c != "1:fffe"}
        if len(classes) == count:
            return classes
        time.sleep(0.1)
    raise AssertionError(f"{iface}: HTB classes {TC.classes(iface)} never became {count}")


def test_reserve_then_fifo_then_remove(port):
    db, iface = port
    reserve = reserve_qos(POLICY, PORT, userspace=True)
    db.apply({iface: reserve}, {"policy": "reserve"})
    assert len(rows("QoS", db.owner)) == 1 and len(rows("Queue", db.owner)) == QUEUES == 4
    assert wait_classes(iface, QUEUES) == {"1:1", "1:2", "1:3", "1:4"}   # applied before apply() returned
    assert db.port_qos(iface) == reserve.ovsdb                # read back row by row
    # Userspace datapath: filters carry the class choice; they must be removable before a change.
    TC.replace_filters(iface, ((1, 1), (2, 2)))
    assert TC.filters(iface) == {(family, dscp, cls) for family in ("ipv4", "ipv6") for dscp, cls in ((1, "1:2"),
                                                                                                      (2, "1:3"))}
    shown = sh("tc", "filter", "show", "dev", iface, "parent", "1:")
    assert "match 00040000/00fc0000 at 0" in shown    # IPv4's DS field, as `tc ... match ip dsfield` writes it
    assert "match 00400000/0fc00000 at 0" in shown    # IPv6's traffic class, as `match ip6 priority` writes it
    TC.replace_leaf(iface, "1:2", (("pfifo_head_drop", "limit", "25"),))
    assert TC.leaves(iface)["1:2"] == Leaf("pfifo_head_drop", 25)
    TC.replace_filters(iface, ())
    assert TC.filters(iface) == set()
    db.apply({iface: fifo_qos(PORT, userspace=True)}, {"policy": "none"})
    assert len(rows("QoS", db.owner)) == 1 and len(rows("Queue", db.owner)) == 1   # old rows gone, same txn
    assert wait_classes(iface, 1) == {"1:1"}
    sh("ovs-vsctl", "set", "queue", sh("ovs-vsctl", "--columns=_uuid", "--bare", "find", "queue",
                                       f"external_ids:iface={iface}").strip(), "other_config:max-rate=1000")
    deadline = time.monotonic() + 5                                               # the IDL hears of it
    while db.port_qos(iface) == fifo_qos(PORT, userspace=True).ovsdb:             # a hand-made change shows
        assert time.monotonic() < deadline
        time.sleep(0.05)
    db.apply({iface: None}, {})
    assert rows("QoS", db.owner) == [] and rows("Queue", db.owner) == []
    assert sh("ovs-vsctl", "get", "port", iface, "qos").strip() == "[]"


def test_reads_follow_each_row_and_the_generation_ignores_what_every_transaction_moves(port):
    db, iface = port
    bridge = sh("ovs-vsctl", "port-to-br", iface).strip()
    fifo = fifo_qos(PORT, userspace=True)
    db.apply({iface: fifo}, {})
    assert db.port_qos(iface) == fifo.ovsdb
    before = db.generation
    # ovs-vsctl moves next_cfg (and vswitchd cur_cfg) with each change; the generation id is external_ids.
    key = f"ovs-qos-controller-generation-{db.owner}"
    sh("ovs-vsctl", "set", "open_vswitch", ".", f"external_ids:{key}=7")
    try:
        deadline = time.monotonic() + 5
        while db.generation_id() != 7:                             # the IDL has heard of it
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        sh("ovs-vsctl", "remove", "open_vswitch", ".", "external_ids", key)
    assert db.generation == before
    sh("ovs-vsctl", "del-port", bridge, iface)
    while db.port_qos(iface) == fifo.ovsdb:                        # the Port row gone: read again
        assert time.monotonic() < deadline + 5
        time.sleep(0.05)
    assert db.port_qos(iface) == ABSENT and db.generation != before
    sh("ovs-vsctl", "add-port", bridge, iface)
    while db.port_qos(iface) == ABSENT:                               # a port of that name again
        assert time.monotonic() < deadline + 10
        time.sleep(0.05)
    assert db.port_qos(iface) is None


def test_a_transaction_past_its_timeout_is_waited_for_and_counts_as_unconfirmed_only_after_that(port):
    db, iface = port
    pid = int(Path("/var/run/openvswitch/ovsdb-server.pid").read_text())
    waits, gives_up = (Ovsdb(owner=db.owner, timeout=1, late=late, lock=False) for late in (5, 1))
    try:
        for ovsdb, stopped, spec in ((waits, 2.5, fifo_qos(PORT, userspace=True)),
                                     (gives_up, 4.0, reserve_qos(POLICY, PORT, userspace=True))):
            os.kill(pid, signal.SIGSTOP)                      # OVSDB answers nothing for `stopped` seconds
            threading.Timer(stopped, os.kill, (pid, signal.SIGCONT)).start()
            started = time.monotonic()
            try:
                ovsdb.apply({iface: spec}, {})
                outcome = "confirmed"
            except Unconfirmed:
                outcome = "unconfirmed"
            took = time.monotonic() - started
            time.sleep(max(0.0, stopped - took) + 0.5)
            if ovsdb is waits:   # answered late, within timeout + late: waited for, not sent again
                assert outcome == "confirmed" and took >= stopped - 0.2, (outcome, took)
            else:                # not within timeout + late: said so then (and it commits once OVSDB is back)
                assert outcome == "unconfirmed" and took < stopped - 1, (outcome, took)
            deadline = time.monotonic() + 10
            while db.port_qos(iface) != spec.ovsdb:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert len(rows("QoS", db.owner)) == 1                # each change committed once
    finally:
        os.kill(pid, signal.SIGCONT)
        for ovsdb in (waits, gives_up):
            ovsdb.close()


def test_a_dead_runs_rows_are_removed_in_transactions_of_bounded_size(port, monkeypatch):
    db, iface = port
    db.apply({iface: reserve_qos(POLICY, PORT, userspace=True)}, {})
    assert len(rows("QoS", db.owner)) == 1 and len(rows("Queue", db.owner)) == QUEUES
    monkeypatch.setattr(host, "VSCTL_COMMANDS", 2)            # 6 commands: the port, its QoS, 4 queues
    assert host.remove_rows(db.owner, "unix:/var/run/openvswitch/db.sock") == 1 + QUEUES
    assert rows("QoS", db.owner) == [] and rows("Queue", db.owner) == []
    assert sh("ovs-vsctl", "get", "port", iface, "qos").strip() == "[]"


def test_another_tools_qos_is_never_overwritten(port):
    db, iface = port
    foreign = sh("ovs-vsctl", "--", "set", "port", iface, "qos=@q", "--", "--id=@q", "create", "qos",
                 "type=linux-htb").strip()
    try:
        with pytest.raises(OvsdbError, match="did not create"):
            db.apply({iface: fifo_qos(PORT, userspace=True)}, {})
        assert sh("ovs-vsctl", "get", "port", iface, "qos").strip() == foreign
        assert db.port_qos(iface) == FOREIGN
        assert remove_rows(db.owner) == 0
    finally:
        sh("ovs-vsctl", "clear", "port", iface, "qos", "--", "destroy", "qos", foreign)


def test_a_second_connection_of_the_same_owner_is_refused_and_another_owner_is_not(port):
    db, _ = port
    with pytest.raises(LockHeld, match=f"another controller with owner '{db.owner}' is running"):
        Ovsdb(owner=db.owner, lock_wait=5)
    other = Ovsdb(owner=db.owner + "-other")
    other.close()


def test_a_cluster_member_deposed_by_a_newer_epoch_changes_no_row(port):
    # Two members of one owner (no lock: etcd decides), the second owning the switch under a newer epoch.
    _, iface = port
    bridge, dp_id = "tb" + iface[2:], 0xE90C
    sh("ovs-vsctl", "set", "bridge", bridge, f"other_config:datapath-id={dp_id:016x}")
    key = "external_ids:ovs-qos-epoch-cluster"
    members = [Ovsdb(owner="cluster", lock=False) for _ in range(2)]
    old, new = members
    try:
        wait_for(lambda: old.bridge(dp_id) and new.bridge(dp_id), "both replicas hold the bridge")
        assert subprocess.run(["ovs-vsctl", "get", "bridge", bridge, key], capture_output=True).returncode != 0
        reserve = reserve_qos(POLICY, PORT, userspace=True)
        assert old.fence({dp_id: 10}) == {}
        old.apply({iface: reserve}, epochs={dp_id: 10})
        held = sh("ovs-vsctl", "get", "port", iface, "qos").strip()
        assert held != "[]" and sh("ovs-vsctl", "get", "bridge", bridge, key).strip() == '"10"'
        assert new.fence({dp_id: 20}) == {}                          # the new owner raises the epoch first
        assert sh("ovs-vsctl", "get", "bridge", bridge, key).strip() == '"20"'
        # The old owner does not know yet: its writes fail in OVSDB, and it cannot lower the epoch.
        wait_for(lambda: "another controller of this owner holds it now" in old.fence({dp_id: 15}).get(dp_id, ""), "the new epoch seen")
        with pytest.raises(Fenced, match=f"switch {dp_id:016x}: another controller of this owner holds it now"):
            old.apply({iface: None}, epochs={dp_id: 10})
        assert sh("ovs-vsctl", "get", "port", iface, "qos").strip() == held
        assert sh("ovs-vsctl", "get", "bridge", bridge, key).strip() == '"20"'
        new.apply({iface: None}, epochs={dp_id: 20})                 # the owner's own write goes through
        assert sh("ovs-vsctl", "get", "port", iface, "qos").strip() == "[]"
        assert new.fence({0xDEAD: 30}) == {0xDEAD: "its bridge is not in OVSDB"}
    finally:
        remove_rows("cluster")
        for member in members:
            member.close()
        sh("ovs-vsctl", "remove", "bridge", bridge, "external_ids", "ovs-qos-epoch-cluster")


def test_a_pairs_policy_is_saved_only_under_its_lock_and_its_next_holder_reads_it_whole(port):
    """A standby pair keeps its policy in OVSDB (controller/adapters/store.py): a holder whose lock was taken
    cannot save there however late it comes, as OVSDB refuses it, and the new holder reads what was saved
    before the lock moved; its generation id (tc's epoch) is above any epoch a bridge holds."""
    _, iface = port
    bridge, owner = "tb" + iface[2:], f"pair{uuid.uuid4().hex[:6]}"
    key, epoch = f"ovs-qos-controller-policy-{owner}", f"external_ids:ovs-qos-epoch-{owner}"
    first = Ovsdb(owner=owner, standby=True)
    second = None
    try:
        wait_for(lambda: first.has_lock, "the first holds the lock")
        second = Ovsdb(owner=owner, standby=True)
        assert second.saved_policy(verified=False) is None
        first.save_policy('{"policy": {"name": "p1"}}')
        second.steal_lock()
        wait_for(lambda: second.has_lock and not first.has_lock, "the lock moved")
        with pytest.raises((OvsdbError, RuntimeError), match="lock|not owner"):
            first.save_policy('{"policy": {"name": "late"}}')
        assert second.saved_policy(verified=True) == '{"policy": {"name": "p1"}}'
        assert sh("ovs-vsctl", "get", "open", ".", f"external_ids:{key}").strip() == '"{\\"policy\\": {\\"name\\": \\"p1\\"}}"'
        sh("ovs-vsctl", "set", "bridge", bridge, f"{epoch}=41")   # left by an earlier run of the owner
        wait_for(lambda: second.next_generation_id() > 41, "a generation id above the bridge's epoch")
    finally:
        for db in (first, second):
            if db is not None:
                db.close()
        sh("ovs-vsctl", "remove", "open", ".", "external_ids", key, f"ovs-qos-controller-generation-{owner}",
           f"ovs-qos-controller-alive-{owner}")
        sh("ovs-vsctl", "remove", "bridge", bridge, "external_ids", f"ovs-qos-epoch-{owner}")


def test_a_generation_id_past_the_last_64_bit_one_is_1_and_an_epoch_is_compared_as_openflow_does(port):
    """Ids wrap (OpenFlow compares them as the signed difference of two 64-bit numbers): a claim after 2^64 - 1
    is 1, never 0 (no id at all to the core), and that 1 is not refused by a bridge whose epoch is 2^64 - 1."""
    _, iface = port
    bridge, owner, dp_id = "tb" + iface[2:], f"wrap{uuid.uuid4().hex[:6]}", 0xE91C
    key, epoch = f"ovs-qos-controller-generation-{owner}", f"ovs-qos-epoch-{owner}"
    sh("ovs-vsctl", "set", "bridge", bridge, f"other_config:datapath-id={dp_id:016x}")
    sh("ovs-vsctl", "set", "open", ".", f"external_ids:{key}={2**64 - 1}")
    sh("ovs-vsctl", "set", "bridge", bridge, f"external_ids:{epoch}={2**64 - 1}")
    db = Ovsdb(owner=owner, standby=True)
    try:
        wait_for(lambda: db.has_lock and db.bridge(dp_id), "the lock and the bridge")
        assert db.next_generation_id() == 1
        assert db.fence({dp_id: 1}) == {}
        assert sh("ovs-vsctl", "get", "bridge", bridge, f"external_ids:{epoch}").strip() == '"1"'
        assert "holds it now" in db.fence({dp_id: 2**64 - 2}).get(dp_id, "")     # older than 1, as OpenFlow has it
    finally:
        db.close()
        sh("ovs-vsctl", "remove", "open", ".", "external_ids", key, f"ovs-qos-controller-alive-{owner}")
        sh("ovs-vsctl", "remove", "bridge", bridge, "external_ids", epoch)


def wait_for(condition, what, seconds=5):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def ports():
    """A userspace bridge with 50 veth ports."""
    tag = uuid.uuid4().hex[:5]
    ifaces = [f"tm{tag}{k}" for k in range(50)]
    with userspace_bridge(f"tm{tag}", ifaces) as db:
        yield db, ifaces



def test_many_ports_change_in_bounded_transactions_that_ask_vswitchd_once_and_orphans_are_swept(ports, monkeypatch):
    db, ifaces = ports
    spec = reserve_qos(POLICY, PORT, userspace=True)
    monkeypatch.setattr(ovsdb, "TRANSACTION_PORTS", 8)             # 50 ports: 7 transactions
    asked = int(sh("ovs-vsctl", "get", "open_vswitch", ".", "next_cfg"))
    db.apply(dict.fromkeys(ifaces, spec), {"policy": "reserve"})
    assert int(sh("ovs-vsctl", "get", "open_vswitch", ".", "next_cfg")) == asked + 1
    assert all(db.port_qos(iface) == spec.ovsdb for iface in ifaces)
    assert len(rows("QoS", db.owner)) == 50 and len(rows("Queue", db.owner)) == 50 * QUEUES
    # Our own change replaces the rows in its transaction: the sweep after it finds nothing, and reads no row.
    db.apply(dict.fromkeys(ifaces, spec), {"policy": "reserve"})
    assert db.remove_orphans(everywhere=False) == 0
    assert len(rows("QoS", db.owner)) == 50 and len(rows("Queue", db.owner)) == 50 * QUEUES
    # A QoS cleared off its port by hand, and a port that goes away (as a Mininet bridge does), leave rows of
    # ours that nothing names: the sweep after a change finds them, as the IDL hears of each.
    for by_hand in (["clear", "port", ifaces[1], "qos"], ["del-port", ifaces[0]]):
        sh("ovs-vsctl", *by_hand)
        removed, deadline = 0, time.monotonic() + 5
        while removed < 1 + QUEUES and time.monotonic() < deadline:
            removed += db.remove_orphans(everywhere=False)
            time.sleep(0.05)
        assert removed == 1 + QUEUES, by_hand
    assert len(rows("QoS", db.owner)) == 48 and len(rows("Queue", db.owner)) == 48 * QUEUES
    # A dead run's rows, named by nothing since before we connected: the first sweep over a connection reads
    # every row, even after a change.
    sh("ovs-vsctl", "clear", "port", ifaces[2], "qos")
    again = ovsdb.Ovsdb(owner=db.owner, lock=False)
    try:
        assert again.remove_orphans(everywhere=False) == 1 + QUEUES
        assert len(rows("QoS", db.owner)) == 47 and len(rows("Queue", db.owner)) == 47 * QUEUES
    finally:
        again.close()


def test_a_sweep_run_again_after_try_again_or_after_a_failed_one_still_finds_what_was_dropped(port, monkeypatch):
    """python-ovs answers TRY_AGAIN when the database moved under a transaction, and ovsdbapp then runs its
    commands again: the rerun of a sweep looks at the rows the first run took, not at an emptied set. A sweep
    whose transaction fails loses what it took: the next reads every row."""
    db, iface = port
    commit = idl.Transaction.commit_block

    def orphan():
        db.apply({iface: reserve_qos(POLICY, PORT, userspace=True)}, {"policy": "reserve"})
        assert db.remove_orphans(everywhere=False) == 0
        sh("ovs-vsctl", "clear", "port", iface, "qos")
        wait_for(lambda: db.port_qos(iface) is None, "the IDL to hear the QoS go")

    def answer_once(status, answered):
        def commit_block(txn):
            if answered:
                return commit(txn)
            answered.append(txn.abort())
            sh("ovs-vsctl", "--no-wait", "set", "interface", iface, f"external_ids:moved={uuid.uuid4()}")   # what ovsdbapp waits for
            return getattr(txn, status)
        monkeypatch.setattr(idl.Transaction, "commit_block", commit_block)

    orphan()
    answer_once("ERROR", failed := [])
    with pytest.raises(RuntimeError, match="OVSDB Error"):
        db.remove_orphans(everywhere=False)
    assert failed and len(rows("QoS", db.owner)) == 1
    assert db.remove_orphans(everywhere=False) == 1 + QUEUES
    orphan()
    answer_once("TRY_AGAIN", answered := [])
    assert db.remove_orphans(everywhere=False) == 1 + QUEUES
    assert answered and not rows("QoS", db.owner) and not rows("Queue", db.owner)


def test_a_bridge_is_read_again_when_its_ports_change_and_only_then(port):
    db, iface = port
    bridge = sh("ovs-vsctl", "port-to-br", iface).strip()
    dp_id = int(sh("ovs-vsctl", "get", "bridge", bridge, "datapath_id").strip().strip('"'), 16)

    def read_until(check):
        deadline = time.monotonic() + 5
        while not check(db.bridge(dp_id)):                      # the IDL hears of it within moments
            assert time.monotonic() < deadline, db.bridge(dp_id)
            time.sleep(0.05)
        return db.bridge(dp_id)

    first = read_until(lambda b: b is not None and iface in b.ports.values())
    db.apply({iface: fifo_qos(PORT, userspace=True)}, {})       # a port's QoS: not what a bridge is made of
    assert db.bridge(dp_id) is first
    extra = f"{iface}x"
    sh("ip", "link", "add", extra, "type", "veth", "peer", "name", f"{extra}p")
    try:
        sh("ovs-vsctl", "add-port", bridge, extra)               # numbered by vswitchd a moment later
        read_until(lambda b: extra in b.ports.values())
        sh("ovs-vsctl", "del-port", bridge, extra)
        read_until(lambda b: extra not in b.ports.values() and iface in b.ports.values())
    finally:
        sh("ovs-vsctl", "--if-exists", "del-port", bridge, extra)
        subprocess.run(["ip", "link", "del", extra], capture_output=True)


def test_a_declared_delay_is_read_and_netem_goes_under_a_class_or_is_refused_leaving_its_queue_whole(port):
    """A link's delay= as the launcher declares it. A kernel without netem refuses it in one error, and the
    class keeps the queue it had; with netem, netem is the class's FIFO (its limit holding what is in
    flight too) or sits above another discipline, and without the delay the queue is alone again."""
    db, iface = port
    bridge = sh("ovs-vsctl", "port-to-br", iface).strip()
    dp_id = int(sh("ovs-vsctl", "get", "bridge", bridge, "datapath_id").strip().strip('"'), 16)
    ofport = int(sh("ovs-vsctl", "get", "interface", iface, "ofport").strip())

    def read_until(delays):
        deadline = time.monotonic() + 5
        while (found := db.bridge(dp_id)) is None or found.delays != delays:
            assert time.monotonic() < deadline, found
            time.sleep(0.05)

    read_until({})
    sh("ovs-vsctl", "set", "interface", iface, "external_ids:ovs-qos-delay=10ms")
    read_until({ofport: 10_000})
    sh("ovs-vsctl", "set", "interface", iface, "external_ids:ovs-qos-delay=10 ms")   # no delay: ignored
    read_until({})
    plain, delayed = fifo_qos(PORT, userspace=True), fifo_qos(PORT, userspace=True, delay_us=10_000)
    db.apply({iface: delayed}, {})
    wait_classes(iface, 1)

    def in_force():
        leaf = TC.leaves(iface)["1:1"]
        return leaf.kind, leaf.limit, leaf.delay_us

    kernel_fifo = fifo_qos(PORT, userspace=False)
    for spec in (kernel_fifo, plain):    # pfifo, then pfifo_head_drop: a kind the kernel will not change into
        TC.replace_leaf(iface, "1:1", leaf_chain(spec))
        assert in_force() == leaf_in_force(spec)
    assert in_force() == ("pfifo_head_drop", PORT.queue_packets, 0)
    if not capabilities.netem_available():
        with pytest.raises(OSError, match="netem"):
            TC.replace_leaf(iface, "1:1", leaf_chain(delayed))
        assert in_force() == leaf_in_force(plain) and "netem" not in sh("tc", "qdisc", "show", "dev", iface)
        return
    for spec in (delayed, dataclasses.replace(delayed, delay_us=2_500), plain):   # made, changed, taken off
        TC.replace_leaf(iface, "1:1", leaf_chain(spec))
        assert in_force() == leaf_in_force(spec)
    assert in_force()[0] != "netem" and "netem" not in sh("tc", "qdisc", "show", "dev", iface)
    if capabilities.qdisc_available("codel"):            # another discipline goes below netem
        below = dataclasses.replace(delayed, leaf=("codel", "limit", "25"))
        TC.replace_leaf(iface, "1:1", leaf_chain(below))
        assert in_force() == leaf_in_force(below) == ("codel", None, 10_000)


@pytest.fixture
def private_ovsdb(tmp_path):
    """An ovsdb-server of the test's own, with an Open_vSwitch database and no vswitchd: (its pid, remote)."""
    db, sock = tmp_path / "conf.db", tmp_path / "db.sock"
    sh("ovsdb-tool", "create", str(db), "/usr/share/openvswitch/vswitch.ovsschema")
    server = subprocess.Popen(["ovsdb-server", str(db), f"--remote=punix:{sock}", f"--unixctl={tmp_path / 'ctl'}",
                               "--no-chdir"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, "the private ovsdb-server's socket")
        sh("ovs-vsctl", f"--db=unix:{sock}", "--no-wait", "init")
        yield server.pid, f"unix:{sock}"
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.terminate()
        server.wait(10)


def test_a_pairs_save_ovsdb_does_not_answer_is_indeterminate_and_its_revision_is_not_used_again(private_ovsdb,
                                                                                                tmp_path):
    """The save may commit when OVSDB answers again (it does here): "nothing was changed" would be false."""
    pid, remote = private_ovsdb
    remotes = Remotes((remote,), lambda name: Ovsdb(name, owner="pair", timeout=1, standby=True), standby=True)
    remotes.connect(remote)
    pair = PairStore(remotes, StateFile(tmp_path / "state.json", shared=True))

    def stored():
        text = sh("ovs-vsctl", f"--db={remote}", "get", "open", ".", "external_ids:ovs-qos-controller-policy-pair")
        saved = json.loads(json.loads(text))
        return saved["policy"]["name"], saved["revision"]

    try:
        assert pair.save({"name": "first"}, 1) == ev.PolicySaved(None, 1) and stored() == ("first", 1)
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        saved = pair.save({"name": "lost"}, 2)
        assert saved.indeterminate and "did not confirm" in saved.error, saved
        assert time.monotonic() - started < 5
        os.kill(pid, signal.SIGCONT)
        wait_for(lambda: stored() == ("lost", 2), "the save committed once OVSDB answered again")
        # The core asks for revision 2 again (it put nothing in force): 2 may name "lost", so this is 3.
        assert pair.save({"name": "next"}, 2) == ev.PolicySaved(None, 3) and stored() == ("next", 3)
    finally:
        os.kill(pid, signal.SIGCONT)
        remotes.close()


def test_after_a_reconnection_ports_are_still_found_by_the_name_index_not_a_scan_of_the_table(port):
    """python-ovs makes the rows anew on a reconnection, without ovsdbapp's indexes: a member of 1000 ports then
    spent 15-20 s of its event loop reading the Port table a row at a time, and its switches left it."""
    from ovsdbapp.backend.ovs_idl import idlutils

    from controller.adapters import private
    db, iface = port
    fifo = fifo_qos(PORT, userspace=True)
    db.apply({iface: fifo}, {})
    ports = db._idl.tables["Port"].rows
    # A transaction id the server never had: it cannot send what changed since, and dumps the database again (as
    # when its history no longer holds ours, after a long or busy disconnection).
    db._idl.last_id = str(uuid.uuid4())
    private.session(db._idl).force_reconnect()
    key = f"wake-{db.owner}"                  # a change wakes the IDL's thread, which reconnects then
    sh("ovs-vsctl", "set", "open_vswitch", ".", f"external_ids:{key}=1")
    sh("ovs-vsctl", "remove", "open_vswitch", ".", "external_ids", key)
    deadline = time.monotonic() + 10
    while db._idl.tables["Port"].rows is ports or not db._idl.tables["Port"].rows:    # dumped anew
        assert time.monotonic() < deadline, "no reconnection"
        time.sleep(0.05)
    assert db.port_qos(iface) == fifo.ovsdb
    assert idlutils.index_lookup(db._idl.tables["Port"], name=iface).name == iface
