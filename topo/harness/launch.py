"""What every study command does around its traffic: root, one study per host, probes, datapath,
the results folder, and Ctrl-C or SIGTERM turned into an orderly clean-up."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topo.harness import capabilities
from topo.harness.host import Busy, HostLock, RunRecord
from topo.net import ovs_instance
from vm.harness import vm_environment

REPO = Path(__file__).resolve().parents[2]
USAGE_ERROR = 2
SWITCHES = ("s1", "s2")   # every topology's bridges; Mininet deletes a bridge of the same name first


class LaunchError(RuntimeError):
    """This host cannot run the study; `code` is the exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Host:
    environment: dict[str, Any]     # for results metadata (capabilities.environment)
    datapath: str                   # Mininet OVSSwitch datapath: "user" or "kernel"
    out: Path
    capabilities: dict[str, capabilities.Capability]   # by name, with how each was probed
    record: RunRecord               # what this run started, for the next one if this one is killed


@contextmanager
def launched(out: Path | None, datapath: str = "auto", name: str = "") -> Iterator[Host]:
    """Hold this host for a study: check root, take the host lock (removing what a killed run left),
    probe, pick the datapath, make the results folder (removed again if the study ends having written
    nothing in it); released however the study ends."""
    if os.geteuid() != 0:
        raise LaunchError("run as root: Mininet and Open vSwitch need it (sudo python3 topo/run.py ...)", USAGE_ERROR)
    out = out or REPO / "results" / (time.strftime("%Y%m%d-%H%M%S") + (f"-{name}" if name else ""))
    made = not out.exists()
    lock = HostLock()
    try:
        record, removed = lock.acquire(out)
    except Busy as err:
        raise LaunchError(str(err), 1) from None
    try:
        if removed:
            note(f"removed what a killed run left behind: {', '.join(removed)}")
        busy = sorted(set(SWITCHES) & set(_bridges()))
        if busy:
            raise LaunchError(f"OVS bridges {', '.join(busy)} exist, and no study of ours made them: another tool "
                              "uses these names (remove them, e.g. sudo mn -c, which removes every OVS bridge)", 1)
        caps = capabilities.probe_all()
        if capabilities.doctor_exit_code(caps):
            raise LaunchError(f"{capabilities.verdict(caps)} Run: python3 topo/run.py doctor", 1)
        env = capabilities.environment(caps)
        if datapath == "auto":
            datapath = "kernel" if "system" in env["datapath_types"] else "user"
        env = {**env, "datapath": "netdev (userspace)" if datapath == "user" else "system (kernel)",
               **({"vm": vm_environment()} if vm_environment() else {})}
        out.mkdir(parents=True, exist_ok=True)
        # Ctrl-C and SIGTERM both unwind through the `finally`s that clean up; a start from a
        # background job inherits SIGINT ignored, and Python then installs no handler of its own.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _interrupt)
        yield Host(env, datapath, out, {cap.name: cap for cap in caps}, record)
    finally:
        left = record.close()
        lock.release()
        if made and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        if left:
            note(f"removed what this run left behind: {', '.join(left)}")


def clean() -> int:
    """`topo/run.py clean`: remove what a killed run left, unless a run is alive."""
    if os.geteuid() != 0:
        print("error: run as root", file=sys.stderr)
        return USAGE_ERROR
    try:
        removed = remove_what_killed_runs_left()
    except Busy as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"removed: {', '.join(removed)}" if removed else "nothing was left behind")
    return 0


def remove_what_killed_runs_left() -> list[str]:
    """What a killed run recorded and the OVS instances it left, removed; raises Busy while a run is alive."""
    lock = HostLock()
    record, removed = lock.acquire(Path("(clean)"))
    try:
        return removed + record.close() + ovs_instance.stop_all()
    finally:
        lock.release()


def _bridges() -> list[str]:
    done = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True, text=True)
    return done.stdout.split() if done.returncode == 0 else []


def note(message: str) -> None:
    """Say once, plainly, what this host could not do (or what a run should know). On a terminal, over the
    progress bar's line, which its next tick draws again below."""
    print("\r\033[K" if sys.stderr.isatty() else "", f"note: {message}", sep="", file=sys.stderr)


def _interrupt(signum, frame):
    raise KeyboardInterrupt
