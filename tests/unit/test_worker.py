"""controller/adapters/worker.py: a job's outcome as the core takes it."""
import socket
import time

from controller.adapters import rtnl
from controller.adapters.hostlock import SwitchLocks
from controller.adapters.remotes import Remotes
from controller.adapters.tc import Tc
from controller.adapters.worker import Worker
from controller.core.jobs import Job
from controller.core.policy import load_document, parse_policy
from controller.core.queues import QosSpec, desired_qos
from tests.unit.fakes import S1, FakeOvsdb, FakeSwitch, FakeTc


class GoneTc(FakeTc):
    def ifindex(self, iface: str) -> None:   # as Tc.ifindex says of a device that is not there
        return None


def one_switch() -> tuple[FakeOvsdb, Remotes, QosSpec]:
    """A fake OVSDB holding s1, its remotes connected, and reserve's queues for s1's port 1."""
    ovsdb = FakeOvsdb(FakeSwitch(1, S1))
    remotes = Remotes(("fake",), lambda name: ovsdb.session())
    remotes.connect("fake")
    policy = parse_policy(load_document("policies/reserve.yaml"))
    return ovsdb, remotes, desired_qos(policy, policy.switch(1).port(1), True, True)


def test_a_device_that_is_gone_has_no_ifindex_rather_than_a_made_up_one():
    ovsdb, remotes, spec = one_switch()
    (result,) = Worker(remotes.view("fake"), GoneTc(ovsdb), lambda results: None).execute(
        [Job(1, 7, 1, "s1-eth1", True, spec, True)])
    assert result.error is None and result.ifindex is None


def test_a_batch_ovsdb_does_not_answer_in_time_fails_once_and_is_not_retried_port_by_port():
    ovsdb, remotes, spec = one_switch()
    jobs = [Job(1, 7, port, iface, True, spec, True) for port, iface in sorted(S1.items())]
    ovsdb.slow = True
    results = Worker(remotes.view("fake"), FakeTc(ovsdb), lambda results: None).execute(jobs)
    assert [r.error for r in results] == ["OVSDB did not confirm the change of 3 ports"] * 3
    assert ovsdb.attempts == 1                   # one wait for vswitchd, not one per port after it
    ovsdb.slow, ovsdb.refuse = False, {"s1-eth2"}
    results = Worker(remotes.view("fake"), FakeTc(ovsdb), lambda results: None).execute(jobs)
    assert [r.error is None for r in results] == [True, False, True]   # a refusal is narrowed down
    assert ovsdb.attempts == 1 + 1 + 3


def test_filters_are_taken_off_before_a_change_only_where_a_qos_was():
    writes = {}
    for bare in (False, True):
        ovsdb, remotes, spec = one_switch()
        tc = FakeTc(ovsdb)
        (result,) = Worker(remotes.view("fake"), tc, lambda results: None).execute(
            [Job(1, 7, 1, "s1-eth1", True, spec, True, bare=bare)])
        assert result.error is None and tc.filters("s1-eth1") == {(f, dscp, f"1:{q + 1:x}") for f in ("ipv4", "ipv6")
                                                                   for dscp, q in spec.marks}
        writes[bare] = tc.writes
    assert writes[False] == writes[True] + 1     # the filters' removal, and nothing else


def test_a_check_that_finds_other_filters_replaces_them_all():
    ovsdb, remotes, spec = one_switch()
    tc = FakeTc(ovsdb)
    worker = Worker(remotes.view("fake"), tc, lambda results: None)
    worker.execute([Job(1, 7, 1, "s1-eth1", True, spec, True, bare=True)])
    wanted = tc.filters("s1-eth1")
    tc.filters_["s1-eth1"] = {("ipv4", 9, "1:2")}                          # another tool's, at our prio
    (result,) = worker.execute([Job(1, 7, 1, "s1-eth1", True, spec, False)])
    assert result.error is None and tc.filters("s1-eth1") == wanted


def test_a_netlink_answer_that_never_comes_is_the_ports_error_and_the_switchs_host_lock_is_free_again(tmp_path,
                                                                                                      monkeypatch):
    monkeypatch.setattr(rtnl, "TIMEOUT_SECONDS", 0.2)
    ovsdb, remotes, spec = one_switch()
    tc = Tc()
    tc._rtnl._sock.close()
    tc._rtnl._sock, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)   # a kernel that never answers
    tc._rtnl._sock.setblocking(False)                                                # as the Rtnl keeps its own
    worker = Worker(remotes.view("fake"), tc, lambda results: None, locks=SwitchLocks(tmp_path, time.sleep))
    try:
        (result,) = worker.execute([Job(1, 7, 1, "lo", True, spec, False, epoch=3)])   # a check of lo's tc
    finally:
        tc.close()
        kernel.close()
    assert result.error == "lo: tc: netlink: no answer within 0.2 s: class dump"
    with SwitchLocks(tmp_path, time.sleep, wait=0).held([1]) as busy:
        assert busy == {}
