"""What every study command does before its traffic starts: root, probes, datapath, output folder."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topo import capabilities

REPO = Path(__file__).resolve().parents[1]
USAGE_ERROR = 2


class LaunchError(RuntimeError):
    """This host cannot run the study; `code` is the exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


SWITCHES = ("s1", "s2")   # every topology's bridges; Mininet deletes a bridge of the same name first


@dataclass(frozen=True)
class Host:
    environment: dict[str, Any]     # for results metadata (capabilities.environment)
    datapath: str                   # Mininet OVSSwitch datapath: "user" or "kernel"
    out: Path
    capabilities: dict[str, capabilities.Capability]   # by name, with how each was probed


def prepare(out: Path | None, datapath: str = "auto", name: str = "") -> Host:
    """Check root and capabilities, pick the datapath, make the results folder; Ctrl-C and SIGTERM clean up."""
    if os.geteuid() != 0:
        raise LaunchError("run as root: Mininet and Open vSwitch need it (sudo python3 topo/run.py ...)", USAGE_ERROR)
    busy = sorted(set(SWITCHES) & set(_bridges()))
    if busy:
        raise LaunchError(f"OVS bridges {', '.join(busy)} exist: another study is running, or a crashed one "
                          "left them (clean up with: sudo mn -c)", 1)
    caps = capabilities.probe_all()
    if capabilities.doctor_exit_code(caps):
        raise LaunchError(f"{capabilities.verdict(caps)} Run: python3 topo/run.py doctor", 1)
    env = capabilities.environment(caps)
    if datapath == "auto":
        datapath = "kernel" if "system" in env["datapath_types"] else "user"
    env = {**env, "datapath": "netdev (userspace)" if datapath == "user" else "system (kernel)"}
    out = out or REPO / "results" / (time.strftime("%Y%m%d-%H%M%S") + (f"-{name}" if name else ""))
    out.mkdir(parents=True, exist_ok=True)
    # Ctrl-C and SIGTERM both unwind through the `finally`s that clean up; a start from a
    # background job inherits SIGINT ignored, and Python then installs no handler of its own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    return Host(env, datapath, out, {cap.name: cap for cap in caps})


def _bridges() -> list[str]:
    done = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True, text=True)
    return done.stdout.split() if done.returncode == 0 else []


def note(message: str) -> None:
    """Say once, plainly, what this host could not do."""
    print(f"note: {message}", file=sys.stderr)


def _interrupt(signum, frame):
    raise KeyboardInterrupt
