"""The etcd adapter against a real etcd (started here, on loopback, with its own data): each read gives the
policy in force with its revision, a new one as soon as it is stored, and the switches' owners beside it."""
from controller.adapters.coordination import Coordination
from topo.harness.etcd import etcd


def test_each_read_gives_the_policy_in_force_and_a_stored_one_at_once(tmp_path):
    with etcd(23792, tmp_path / "etcd.log") as url:
        member = Coordination(url, "adapter", "m1", 4)
        member.connect()
        try:
            assert member.read().policy is None                     # nothing stored yet
            first = member.save_policy({"name": "a"})
            assert member.read().policy == member.read().policy == (first, {"name": "a"})
            assert member.claim(0xC1, renew=False) is not None
            second = member.save_policy({"name": "b"})
            read = member.read()
            assert second > first and read.policy == (second, {"name": "b"})
            assert read.owners == {0xC1: "m1"} and read.members == ("m1",)
            cleared = member.save_policy(None)
            assert member.read().policy == (cleared, None)
            other = Coordination(url, "adapter", "m2", 4)          # a member that never saw the earlier ones
            other.connect()
            try:
                assert other.read().policy == (cleared, None)
            finally:
                other.leave()
        finally:
            member.leave()
