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
