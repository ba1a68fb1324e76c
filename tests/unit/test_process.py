"""How the controller's process hears a signal (controller/adapters/process.py): at once, not at the event
hub's next timer. Run in a child process of its own, whose signal handlers and hub are its own."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import os, signal, sys, threading, time
import eventlet, eventlet.hubs
from controller.adapters.process import wake_on_signals

heard = []
def handler(signum, frame):   # as process.stop does: the work is scheduled on the hub, not done here
    eventlet.hubs.get_hub().schedule_call_global(0, lambda: heard.append(time.monotonic()))
signal.signal(signal.SIGUSR1, handler)
if sys.argv[1] == "wake":
    eventlet.spawn(wake_on_signals)
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()   # another OS thread, as the etcd keepalive
eventlet.sleep(0.2)
sent = time.monotonic()
threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1)).start()
while not heard:
    eventlet.sleep(2)          # the hub's only timer: without a wake-up it sleeps in epoll until then
print(round(heard[0] - sent - 0.1, 3))
"""


def heard_after(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD, mode], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.split()[-1])


@pytest.mark.parametrize("mode, heard", [("wake", lambda s: s < 1.0), ("none", lambda s: s > 1.5)])
def test_a_signal_is_handled_at_once_only_with_the_wakeup_fd(mode, heard):
    """Without the wake-up the handler's work waits for the hub's next timer (here 2 s): the controller's
    SIGTERM waited up to its next timer, about a second; with it, at once."""
    seconds = heard_after(mode)
    assert heard(seconds), seconds
