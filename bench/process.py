"""The controller process as the benchmarks measure it: its pid, and the CPU it and its children used."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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


def peak_rss_kib(pid: int) -> int:
    found = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    assert found is not None
    return int(found.group(1))
