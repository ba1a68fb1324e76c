"""What the benchmarks share: the controller they measure (its pid, the CPU it and its children used), and
how one runs (as root, under the host's lock, in a temporary directory, cleaned up on Ctrl-C)."""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from topo.harness.controller import ControllerClient, ControllerError, controller
from topo.harness.etcd import EtcdError
from topo.harness.host import Busy, HostLock
from topo.net.bridges import BridgeError

TICKS = os.sysconf("SC_CLK_TCK")


def controller_pid() -> int:
    found = subprocess.run(["pgrep", "-f", "--", "-manager .*qos_app.py"], capture_output=True,
                           text=True).stdout.split()
    if len(found) != 1:
        sys.exit(f"error: expected one controller process, found {len(found)}")
    return int(found[0])


def cpu_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime, in clock ticks: the process and the children it waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15])


def polls_counted(metrics_url: str) -> tuple[float, float]:
    """Statistics polls answered in full, summed over the switches, and when they were counted: as the
    request went out. The exposition reads the counters first and then formats them, seconds at thousands
    of ports: a window timed from the answer would hold those seconds and none of their polls (0.923 polls
    a switch a second at 10,000 ports, with a 2.7 s scrape, was 30 s of polls over 32.7 s). A reading
    within half a second of another scrape may be that one's (the exposition's cache)."""
    at = time.monotonic()
    with urllib.request.urlopen(metrics_url, timeout=60) as answer:
        text = answer.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("ovsqos_polls_total{")), at


def peak_rss_kib(pid: int) -> int:
    found = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    assert found is not None
    return int(found.group(1))


def bench_main(name: str, args: argparse.Namespace, run: Callable[[argparse.Namespace, Path, Any], int],
               interrupted: str) -> int:
    """Run `run(args, tmp, record)` as root, holding the host's lock (one study or benchmark at a time);
    Ctrl-C or SIGTERM ends it with what `interrupted` says was removed, and a failure of OVS, etcd or the
    controller with one line saying what failed."""
    if os.geteuid() != 0:
        sys.exit("run as root: it creates OVS bridges")
    # Started in the background, a process inherits SIGINT ignored; SIGTERM cleans up as Ctrl-C does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    lock = HostLock()
    try:
        record, _ = lock.acquire(Path(f"(bench/{name}.py)"))
    except Busy as err:
        sys.exit(f"error: {err}")
    try:
        with tempfile.TemporaryDirectory(prefix=f"ovsqos-{name}-") as tmp:
            return run(args, Path(tmp), record)
    except KeyboardInterrupt:
        print(f"interrupted: {interrupted}", file=sys.stderr)
        return 130
    except (BridgeError, ControllerError, EtcdError) as err:      # one line, not a traceback
        print(f"error: {err}; {interrupted}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as err:
        lines = (err.stderr or "").strip().splitlines() if isinstance(err.stderr, str) else []
        print(f"error: {' '.join(map(str, err.cmd[:4]))} ... exited with {err.returncode}"
              + (f" ({lines[-1][:300]})" if lines else "") + f"; {interrupted}", file=sys.stderr)
        return 1
    finally:
        record.close()
        lock.release()


def measured(args: argparse.Namespace, tmp: Path, record: Any) -> AbstractContextManager[ControllerClient]:
    """The controller measured: the one already on 127.0.0.1:8080 (--running), or one started for the run."""
    if args.running:
        client = ControllerClient()
        client.status()
        return nullcontext(client)
    return controller(args.log or tmp / "controller.log", record)
