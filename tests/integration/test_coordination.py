"""The etcd adapter against a real etcd (started here, on loopback, with its own data): each read gives the
policy in force with its revision, a new one as soon as it is stored, and the switches' owners beside it."""
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from eventlet import patcher

from controller.adapters.coordination import Coordination
from controller.adapters.etcd import b64
from controller.adapters.membership import REFRESH_SECONDS, WEDGED_SECONDS
from tests.integration.proxy import Proxy
from topo.harness.etcd import etcd

_time = patcher.original("time")   # a sleep that yields to nothing, even under eventlet
threading = patcher.original("threading")


@contextmanager
def one_member(tmp_path: Path, lease: int) -> Iterator[tuple[Coordination, int]]:
    """Member m1 of a fresh private etcd, and etcd's process (to stop or kill it under the member)."""
    with etcd(23792, tmp_path / "etcd.log") as url:
        member = Coordination(url, "adapter", "m1", lease)
        member.connect()
        try:
            yield member, int(subprocess.run(["pgrep", "-f", "--newest", "etcd --name ovsqos"],
                                             capture_output=True, text=True).stdout.split()[0])
        finally:
            member.leave()


@contextmanager
def connected(*members: tuple[str, str]) -> Iterator[list[Coordination]]:
    """Members (url, name) of group "adapter", lease 4 s, connected for the block and leaving after it."""
    joined = [Coordination(url, "adapter", name, 4) for url, name in members]
    for member in joined:
        member.connect()
    try:
        yield joined
    finally:
        for member in joined:
            member.leave()


@contextmanager
def silent(pid: int) -> Iterator[None]:
    """etcd stopped for the block (SIGSTOP): what is sent to it is read by no one until it resumes."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_each_read_gives_the_policy_in_force_and_a_stored_one_at_once(tmp_path):
    with etcd(23792, tmp_path / "etcd.log") as url:
        member = Coordination(url, "adapter", "m1", 4)
        member.connect()
        try:
            assert member.read().policy is None                     # nothing stored yet
            first = member.register.save({"name": "a"}).revision
            assert member.read().policy == member.read().policy == (first, {"name": "a"})
            assert member.claims.claim(0xC1, renew=False) is not None
            second = member.register.save({"name": "b"}).revision
            read = member.read()
            assert second > first and read.policy == (second, {"name": "b"})
            assert read.owners == {0xC1: "m1"} and read.members == ("m1",)
            cleared = member.register.save(None).revision
            assert member.read().policy == (cleared, None)
            other = Coordination(url, "adapter", "m2", 4)          # a member that never saw the earlier ones
            other.connect()
            try:
                assert other.read().policy == (cleared, None)
            finally:
                other.leave()
        finally:
            member.leave()


def test_the_lease_outlives_a_loop_busy_for_longer_than_it_lasts_but_not_a_wedged_one(tmp_path):
    """The keepalive is an OS thread: a member whose event loop does not yield for twice its lease (this test's
    own thread, asleep) keeps its keys; one whose core has handled no event for WEDGED_SECONDS (the keepalive's
    word of it set back here; the app's wiring that sets it is test_cluster's) lets them go."""
    with etcd(23792, tmp_path / "etcd.log") as url:
        member = Coordination(url, "adapter", "m1", 3)
        member.connect()
        try:
            assert not member.confirmed(_time.monotonic())        # the core has not been told of a refresh yet
            member.membership.refresh()
            assert member.claims.claim(0xC1, renew=False) is not None
            _time.sleep(6)                                        # no yield: as a loop parsing OVSDB's JSON
            assert member.read().owners == {0xC1: "m1"}
            assert member.confirmed(_time.monotonic())            # the worker may write at once, on the thread's word
            assert _time.monotonic() - member.membership.refresh() < 1.5     # and the loop is told of the keepalive's refresh
            member.membership._keepalive.turned -= WEDGED_SECONDS            # as if the loop had not turned since
            _time.sleep(6)
            assert member.read().owners == {} and not member.confirmed(_time.monotonic())
            member.turned()                                       # the core handles an event again ...
            assert _time.monotonic() - member.membership.refresh() > 5       # ... no confirmation since
            _time.sleep(2 * REFRESH_SECONDS)                      # the keepalive finds the leases gone ...
            assert member.membership.refresh() is None                       # ... and the loop takes new ones,
            assert not member.confirmed(_time.monotonic())        # writing nothing before the core hears of them
            # The grant confirms them: the core's next report may write at once, not a keepalive round later.
            assert _time.monotonic() - member.membership.refresh() < 1 and member.confirmed(_time.monotonic())
            assert member.claims.claim(0xC1, renew=False) is not None
        finally:
            member.leave()


def test_if_match_any_holds_only_while_etcd_stores_a_policy(tmp_path):
    from controller.core.events import ANY_POLICY
    with etcd(23792, tmp_path / "etcd.log") as url, connected((url, "m1")) as (member,):
        assert member.register.save({"name": "a"}, ANY_POLICY).conflict               # nothing stored yet
        stored = member.register.save({"name": "a"}).revision
        saved = member.register.save({"name": "b"}, ANY_POLICY)
        assert not saved.conflict and saved.revision > stored and member.read().policy == (saved.revision, {"name": "b"})
        cleared = member.register.save(None, ANY_POLICY)                               # a DELETE with If-Match: *
        assert not cleared.conflict and member.read().policy == (cleared.revision, None)
        refused = member.register.save({"name": "c"}, ANY_POLICY)                      # cleared: no policy in force
        assert refused.conflict and refused.revision == cleared.revision and member.read().policy[1] is None


def test_the_policy_register_is_a_compare_and_swap_that_etcd_decides_never_a_members_copy(tmp_path):
    with etcd(23792, tmp_path / "etcd.log") as url, connected((url, "m1"), (url, "m2")) as (m1, m2):
        assert m2.current_policy() == (None, 0)
        first = m1.register.save({"name": "a", "x": [1, 2]})
        assert first.changed and not first.conflict and m2.current_policy() == ({"name": "a", "x": [1, 2]},
                                                                                  first.revision)
        same = m2.register.save({"x": [1, 2], "name": "a"})       # m2 never read it: etcd says it is unchanged
        assert (same.revision, same.changed) == (first.revision, False)
        stale = m2.register.save({"name": "b"}, expect=first.revision - 1)
        assert (stale.conflict, stale.revision) == (True, first.revision)
        assert m1.register.save({"name": "b"}, expect=0).conflict        # 0: only if none is stored
        second = m2.register.save({"name": "b"}, expect=first.revision)
        assert not second.conflict and second.revision > first.revision
        assert m1.current_policy() == ({"name": "b"}, second.revision)
        assert m1.register.save(None, expect=first.revision).conflict  # what m1 read last is stale now
        assert m1.current_policy() == ({"name": "b"}, second.revision)


def test_a_save_etcd_took_but_did_not_answer_is_indeterminate_and_one_it_never_got_is_not(tmp_path):
    with one_member(tmp_path, 4) as (member, pid):
        assert member.policy_saved({"name": "a"}).error is None
        with silent(pid):                                # the request is sent and read by no one: unknown
            unknown = member.policy_saved({"name": "b"})
        assert unknown.indeterminate and unknown.error and "etcd" in unknown.error
        os.kill(pid, signal.SIGKILL)                     # nothing listens: refused before anything is sent
        _time.sleep(0.5)
        refused = member.policy_saved({"name": "c"})
        assert refused.error and not refused.indeterminate


def test_a_save_a_partition_held_back_changes_nothing_once_a_newer_policy_is_stored(tmp_path):
    """m1 reaches etcd through a proxy that holds its bytes during a partition and delivers them at the heal (as TCP
    retransmission would, its close lost): its save times out (indeterminate), m2 stores a newer policy,
    the partition heals. What etcd then receives from m1 is conditional on what m1 read before, so the newer
    policy stays."""
    with etcd(23792, tmp_path / "etcd.log") as url:
        proxy = Proxy(23899, ("127.0.0.1", 23792), forward_close=False)   # a port no other test's etcd uses
        try:
            with connected((url.replace("23792", "23899"), "m1"), (url, "m2")) as (m1, m2):
                assert m1.policy_saved({"name": "a"}).error is None
                proxy.open.clear()
                held = m1.policy_saved({"name": "old"})
                assert held.indeterminate, held
                assert m2.policy_saved({"name": "new"}).error is None
                proxy.open.set()
                _time.sleep(2)                               # the held bytes delivered, and answered
                assert m2.current_policy()[0] == {"name": "new"}
        finally:
            proxy.close()


def passes(member: Coordination) -> list:
    """The member's loop, until it has read the cluster (its lease taken anew if etcd lost it): what it posted that
    says what etcd holds (not "etcd down")."""
    posted: list = []
    for _ in range(3):
        member._turn(posted.append, None, [])
        _time.sleep(0.1)
    return [e for e in posted if e.members is not None]


def test_after_etcd_lost_its_data_the_newest_copy_of_the_policy_is_put_back_whoever_finds_the_loss_first(tmp_path):
    """etcd restarted empty. m2, with the older copy, finds the loss first; m1, with the newer, reaches etcd through
    a proxy that loses its copy on its way the first time (its connection closed as it is sent): m1 recovers again
    at its next pass, and its copy replaces m2's."""
    first = ExitStack()
    url = first.enter_context(etcd(23792, tmp_path / "etcd.log"))
    proxy = Proxy(23899, ("127.0.0.1", 23792))
    try:
        with first, connected((url.replace("23792", "23899"), "m1"), (url, "m2")) as (m1, m2):
            m1.register.save({"name": "a"})
            m1.read()
            m2.read()                                            # m2's copy: a
            m1.register.save({"name": "b"})                        # m1's: b, stored just before the loss
            first.close()
            with etcd(23792, tmp_path / "etcd-empty.log"):      # the same etcd, its data gone
                # The stale copy finds the loss first and puts it back, but tells its core nothing (as if etcd were
                # down) until m1, in the group before the loss, has put back its own ...
                assert passes(m2) == [] and m2.current_policy()[0] == {"name": "a"}
                proxy.drop = b64(f"{m1.register.copy[0]:020d}").encode()   # m1's copy put back, with its revision
                assert passes(m1) == [] and m2.current_policy()[0] == {"name": "a"}
                proxy.drop = None
                assert passes(m1)[-1].policy[1] == {"name": "b"}           # ... the newer one, which replaces it
                assert passes(m2)[-1].policy[1] == {"name": "b"}
                m2.register.save({"name": "c"})                              # a PUT since the recovery stays
                m1.recovery._lost = "the loss found late"
                passes(m1)
                assert m1.current_policy()[0] == {"name": "c"}
    finally:
        proxy.close()


def test_after_etcd_is_restored_from_an_older_snapshot_the_newest_policy_is_put_back(tmp_path):
    """etcd's data copied while it was stopped (a snapshot, holding policy "s"), then "a" and "b" stored since (m2
    read "a" only), then etcd restarted on the copy: the snapshot's policy is older than either member's copy, and
    the newest copy is put back, though the member with the older one finds the loss first (and puts its own)."""
    data, snapshot = tmp_path / "etcd-data", tmp_path / "snapshot"
    first = ExitStack()
    url = first.enter_context(etcd(23792, tmp_path / "etcd.log", data=data))
    with first, connected((url, "m1"), (url, "m2")) as (m1, m2):
        m1.register.save({"name": "s"})
        assert passes(m1)[-1].policy[1] == passes(m2)[-1].policy[1] == {"name": "s"}
        first.close()
        shutil.copytree(data, snapshot)
        with etcd(23792, tmp_path / "etcd-again.log", data=data):
            m1.register.save({"name": "a"})
            assert passes(m1)[-1].policy[1] == passes(m2)[-1].policy[1] == {"name": "a"}
            m1.register.save({"name": "b"})                          # m1's copy; m2 has not read it
        with etcd(23792, tmp_path / "etcd-restored.log", data=snapshot):
            assert m2.current_policy()[0] == {"name": "s"}             # restored, before anyone noticed
            assert passes(m2) == [] and m2.current_policy()[0] == {"name": "a"}   # m2's, newer than the snapshot's
            assert passes(m1)[-1].policy[1] == {"name": "b"} and passes(m2)[-1].policy[1] == {"name": "b"}
            assert all(member.recovery.restored for member in (m1, m2))       # each said so


def test_claims_sent_together_each_succeed_or_fail_alone(tmp_path):
    with etcd(23792, tmp_path / "etcd.log") as url, connected((url, "m1"), (url, "m2")) as (m1, m2):
        assert m2.claims.claim(0xC2, renew=False) is not None
        wanted = [(dp, False) for dp in range(0xC0, 0xC0 + 70)] + [(0xC1, True), (0xC2, True)]
        got, failed = m1.claims.claims(wanted)                                       # 72 claims: two transactions
        assert failed is None and len(got) == len(wanted)
        refused = [wanted[k] for k, revision in enumerate(got) if revision is None]
        assert refused == [(0xC2, False), (0xC2, True)]               # m2's, whether absent or ours was asked
        first, second = set(got[:64]) - {None}, set(got[64:]) - {None}
        assert len(first) == len(second) == 1 and max(first) < min(second)   # one revision per transaction
        owners = m1.read().owners
        assert owners.pop(0xC2) == "m2" and set(owners.values()) == {"m1"} and len(owners) == 69


def test_a_release_etcd_does_not_answer_is_tried_again_until_it_does(tmp_path):
    with one_member(tmp_path, 9) as (member, pid):
        claimed = member.claims.claim(0xC1, renew=False)
        assert claimed is not None and member.read().owners == {0xC1: "m1"}
        with silent(pid):                                            # the first attempt times out
            releasing = threading.Thread(target=member.claims.release, args=(0xC1, claimed))
            releasing.start()
            _time.sleep(4 * REFRESH_SECONDS)
            assert releasing.is_alive()                              # not given up: still trying
        releasing.join(timeout=20)
        assert not releasing.is_alive() and member.read().owners == {}


def test_a_lease_a_peer_revoked_is_taken_anew_and_the_group_joined_again_without_etcd_seeming_down(tmp_path):
    """What a member finds when the others took it for dead (peers.py): its lease revoked, so its membership is
    gone and writing on the old lease is refused ("Not Found"). That is not etcd down: the next passes take a
    new lease and join on it, and the core is never told coordination was lost."""
    with one_member(tmp_path, 4) as (member, _):
        posted: list = []
        watches: list = []
        member._turn(posted.append, None, watches)
        member._gateway.post("/kv/lease/revoke", {"ID": member.membership.lease})
        assert member.read().members == ()
        for _ in range(4):
            member._turn(posted.append, None, watches)
            _time.sleep(REFRESH_SECONDS)
        assert all(e.members is not None for e in posted), [e.members for e in posted]   # None: "etcd down"
        assert member.read().members == ("m1",)


def test_a_keepalive_round_on_a_lease_since_replaced_leaves_the_new_one_confirmed_and_a_release_done(tmp_path):
    """A keepalive round reads the lease id, then asks etcd; if the loop took a new lease meanwhile (the old one
    revoked), etcd says the old one is gone. That is no word on the new one: it stays confirmed, and a switch
    claimed on it and then handed on is deleted in etcd, not kept for ever on a live lease."""
    with one_member(tmp_path, 4) as (member, _):
        posted: list = []
        watches: list = []
        member._turn(posted.append, None, watches)
        keepalive = member.membership._keepalive
        old = member.membership.lease
        member._gateway.post("/kv/lease/revoke", {"ID": old})
        for _ in range(3):                                      # a new lease taken, the group joined again
            member._turn(posted.append, None, watches)
            _time.sleep(REFRESH_SECONDS)
        assert member.read().members == ("m1",) and old != keepalive._lease()
        claimed = member.claims.claim(0xC1, renew=False)
        assert claimed is not None and member.read().owners == {0xC1: "m1"}
        keepalive.round(old, _time.monotonic())                 # the round that read the id before the new one
        assert not keepalive.expired and member.confirmed(_time.monotonic())
        member.claims.release(0xC1, claimed)
        assert member.read().owners == {}


def test_a_release_deletes_only_the_claim_it_was_made_for_never_a_later_one(tmp_path):
    """A release etcd carries out late (retried while etcd did not answer, or held back by the network) after the
    member claimed the switch again: the later claim stays."""
    with one_member(tmp_path, 4) as (member, _):
        first = member.claims.claim(0xC1, renew=False)
        member.claims.release(0xC1, first)
        assert member.read().owners == {}
        again = member.claims.claim(0xC1, renew=False)                  # the ring gave it back
        renewed = member.claims.claim(0xC1, renew=True)                 # and the switch asked for a newer id
        assert first is not None and again is not None and renewed is not None and first < again < renewed
        member.claims.release(0xC1, first)                              # the first release, carried out late
        member.claims.release(0xC1, again)                              # one before the renewal
        assert member.read().owners == {0xC1: "m1"}
        member.claims.release(0xC1, renewed)
        assert member.read().owners == {}


def test_claims_sent_in_batches_keep_the_outcomes_of_those_before_a_batch_that_failed(tmp_path):
    """72 claims are two transactions; the second is lost on its way to etcd (its connection closed as it is
    sent): the first's 64 claims stand, and say so, and the rest are said to have failed."""
    with etcd(23792, tmp_path / "etcd.log") as url:
        proxy = Proxy(23899, ("127.0.0.1", 23792))
        try:
            with connected((url.replace("23792", "23899"), "m1")) as (member,):
                wanted = [(dp, False) for dp in range(0xC0, 0xC0 + 72)]
                proxy.drop = b64(f"{member.prefix}switch/{0xC0 + 70:016x}").encode()   # in the second batch only
                got, failed = member.claims.claims(wanted)
                assert failed is not None and len(got) == 64 and all(revision is not None for revision in got)
                assert set(member.read().owners) == {dp for dp, _ in wanted[:64]}
        finally:
            proxy.close()


def test_the_members_sign_their_probes_with_one_key_made_by_the_first_to_ask(tmp_path):
    """A member checks only the discovery frames signed with the key it holds: members with keys of their own
    would each see only the links their own probes crossed."""
    with etcd(23792, tmp_path / "etcd.log") as url, connected((url, "m1"), (url, "m2")) as (m1, m2):
        assert m1.read().probe_key is None
        (first,) = passes(m1)[-1:]
        (second,) = passes(m2)[-1:]
        assert first.probe_key is not None and len(first.probe_key) == 32
        assert second.probe_key == first.probe_key == m2.read().probe_key
