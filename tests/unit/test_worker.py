"""controller/adapters/worker.py: a job's outcome as the core takes it."""
from controller.adapters.remotes import Remotes
from controller.adapters.worker import Worker
from controller.core.jobs import Job
from controller.core.policy import load_policy
from controller.core.queues import desired_qos
from tests.unit.fakes import S1, FakeOvsdb, FakeSwitch, FakeTc


class GoneTc(FakeTc):
    def ifindex(self, iface: str) -> None:   # as Tc.ifindex says of a device that is not there
        return None


def test_a_device_that_is_gone_has_no_ifindex_rather_than_a_made_up_one():
    ovsdb = FakeOvsdb(FakeSwitch(1, S1))
    remotes = Remotes(("fake",), lambda name: ovsdb.session())
    remotes.connect("fake")
    policy = load_policy("policies/reserve.yaml")
    spec = desired_qos(policy, policy.switch(1).port(1), True, True)
    (result,) = Worker(remotes.view("fake"), GoneTc(ovsdb), lambda results: None).execute(
        [Job(1, 7, 1, "s1-eth1", True, spec, True)])
    assert result.error is None and result.ifindex is None
