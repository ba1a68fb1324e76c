"""controller/adapters/hostlock.py: the switches' host locks, on real files (flock needs no root)."""
import os
import signal
import subprocess
import sys
import time

from controller.adapters.hostlock import SwitchLocks

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


def test_a_busy_switch_is_refused_after_the_wait_naming_the_file_and_the_others_are_held(tmp_path):
    slept = []
    first, second = SwitchLocks(tmp_path, time.sleep), SwitchLocks(tmp_path, slept.append, wait=0.05)
    with first.held([1]) as busy:
        assert busy == {}
        with second.held([2, 1]) as refused:
            assert refused.keys() == {1} and str(first.path(1)) in refused[1] and "next poll" in refused[1]
            with SwitchLocks(tmp_path, time.sleep, wait=0).held([2]) as again:
                assert again.keys() == {2}             # the one it got is held until the block ends
        assert slept                                   # it polled for the busy one, never blocked in flock
    with second.held([1, 2]) as busy:
        assert busy == {}                              # both given back when the blocks ended


def test_a_lock_is_free_the_moment_its_holder_dies(tmp_path):
    locks = SwitchLocks(tmp_path, time.sleep, wait=0.05)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(locks.path(7))], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with locks.held([7]) as busy:
            assert busy.keys() == {7}
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        with locks.held([7]) as busy:
            assert busy == {}
    finally:
        holder.kill()
        holder.wait()


def test_a_directory_it_cannot_write_is_said_per_switch(tmp_path):
    with SwitchLocks(tmp_path / "gone", time.sleep).held([3]) as busy:
        assert "cannot lock" in busy[3] and "tc needs it writable" in busy[3]
