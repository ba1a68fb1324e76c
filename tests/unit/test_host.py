"""topo/harness/host.py: one launcher per host, and what a dead one left removed, with real processes
(no root: the record's bridges and links are left empty here; the integration tests cover those)."""
import json
import multiprocessing
import os
import subprocess
import sys

import pytest

from topo.harness.host import Busy, HostLock, RunRecord, remove_leftovers, start_time


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def hold_lock(state_dir, ready, release):
    lock = HostLock(state_dir)
    lock.acquire(state_dir / "out")
    ready.set()
    release.wait(10)


def test_a_second_launcher_is_refused_with_who_holds_the_host(tmp_path):
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.Process(target=hold_lock, args=(tmp_path, ready, release))
    holder.start()
    try:
        assert ready.wait(10)
        with pytest.raises(Busy, match=rf"another study is running here \(pid {holder.pid}, since .*results in "
                                       rf"{tmp_path / 'out'}\)"):
            HostLock(tmp_path).acquire(tmp_path / "mine")
    finally:
        release.set()
        holder.join(10)
    record, removed = HostLock(tmp_path).acquire(tmp_path / "mine")   # the kernel released the dead one's lock
    assert removed == []


def test_the_record_of_a_dead_run_is_cleaned_up_and_a_reused_pid_is_spared(tmp_path):
    child, graceful = sleeper(), sleeper()
    record = RunRecord(tmp_path, tmp_path / "out")
    record.process(child.pid, "iperf3")
    record.process(graceful.pid, "controller")
    data = json.loads((tmp_path / "run.json").read_text())
    # A pid recorded with another start time belongs to some other process now: never touched.
    data["processes"].append({"pid": os.getpid(), "start_time": start_time(os.getpid()) + 1, "what": "iperf3"})
    (tmp_path / "run.json").write_text(json.dumps(data))
    removed = remove_leftovers(tmp_path / "run.json")
    assert sorted(removed) == sorted([f"iperf3 (pid {child.pid})", f"controller (pid {graceful.pid})"])
    assert child.wait(5) == -9                 # SIGKILL
    assert graceful.wait(5) == -15             # SIGTERM: it removes its own QoS rows on the way out
    assert not (tmp_path / "run.json").exists()
    assert remove_leftovers(tmp_path / "run.json") == []


def test_a_run_that_ended_in_order_leaves_nothing_to_remove(tmp_path):
    proc = sleeper()
    record = RunRecord(tmp_path, tmp_path / "out")
    record.process(proc.pid, "iperf3")
    proc.kill()
    proc.wait()
    assert record.close() == []
    assert not (tmp_path / "run.json").exists()


def test_what_a_host_started_but_no_record_names_is_killed_by_its_namespace(tmp_path):
    # A host, and in its network namespace a child the record never heard of: a launcher SIGKILLed
    # between starting a server in a host and writing its pid down leaves exactly that.
    host = subprocess.Popen(["unshare", "-rn", "sh", "-c", "sleep 60 & echo $!; exec sleep 60"],
                            stdout=subprocess.PIPE, text=True)
    orphan = int(host.stdout.readline())
    record = RunRecord(tmp_path, tmp_path / "out")
    record.network(bridges=[], links=[], hosts={"h4": host.pid})
    bystander = sleeper()        # in this test's namespace: not the dead run's
    try:
        host.kill()              # the host's shell goes with its launcher; the child stays
        host.wait()
        assert start_time(orphan) is not None
        removed = remove_leftovers(tmp_path / "run.json")
        assert removed == [f"sleep (pid {orphan}, in host h4)"]
        assert start_time(orphan) is None
        assert bystander.poll() is None
    finally:
        bystander.kill()
