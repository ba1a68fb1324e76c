"""One study at a time on a host, and nothing left behind by one that was killed.

A launcher holds an flock on /run/ovs-qos-study/lock (the kernel releases it however the process
dies) and records in /run/ovs-qos-study/run.json everything it starts: processes, with their start
time so that a reused pid is never killed, the OVS bridges and links of its networks, and the owner
and OVSDB remotes of the controller it started, the directories it made outside the results (a private
etcd's data), and the network namespace of each Mininet host: a
process started in a host the moment before the launcher was killed is in no record, but it is in that
namespace. A launcher that finds the record of a dead one, or
`topo/run.py clean`, removes what it lists: the controller and Prometheus first with SIGTERM, the rest
with SIGKILL (a private etcd after the controllers, which leave it as they stop), then the directories,
the bridges and links, then the controller owner's QoS and Queue rows (a controller
leaves them in place when it stops, for the next one to adopt; here there is no next one).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

STATE_DIR = Path("/run/ovs-qos-study")
GRACEFUL = ("controller", "prometheus")   # stopped with SIGTERM: they clean up after themselves
VSCTL_COMMANDS = 1000                   # ovs-vsctl commands per transaction when removing rows


class Busy(RuntimeError):
    """Another launcher holds this host."""


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone (a zombie is)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


class RunRecord:
    """What this launcher started, kept on disk while it runs."""

    def __init__(self, state_dir: Path, out: Path):
        self._path = state_dir / "run.json"
        self._data: dict[str, Any] = {"pid": os.getpid(), "start_time": start_time(os.getpid()),
                                      "out": str(out), "started": time.time(),
                                      "processes": [], "bridges": [], "links": [], "rows": [], "directories": []}
        self._save()

    def process(self, pid: int, what: str) -> None:
        self._data["processes"].append({"pid": pid, "start_time": start_time(pid), "what": what})
        self._save()

    def rows(self, owner: str, remotes: tuple[str, ...]) -> None:
        """A controller of `owner` runs on these OVSDB remotes: its rows go with the run."""
        self._data["rows"].append({"owner": owner, "remotes": list(remotes)})
        self._save()

    def directory(self, path: Path) -> None:
        """A directory this run made and removes; the next run removes it if this one is killed."""
        self._data["directories"].append(str(path))
        self._save()

    def network(self, bridges: list[str], links: list[str], hosts: dict[str, int]) -> None:
        self._data["bridges"] += bridges
        self._data["links"] += links
        self._data["processes"] += [{"pid": pid, "start_time": start_time(pid), "what": f"mininet host {name}"}
                                    for name, pid in hosts.items()]
        self._data.setdefault("namespaces", {}).update(
            {name: inode for name, pid in hosts.items() if (inode := net_namespace(pid)) is not None})
        self._save()

    def close(self) -> list[str]:
        """The run ended, in order or not: remove whatever it recorded that is still there (normally
        nothing: its own clean-up ran) and the record itself."""
        return remove_leftovers(self._path)

    def _save(self) -> None:
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._data, indent=1))
        tmp.replace(self._path)


class HostLock:
    """Held for a whole run: `acquire` refuses while another launcher lives, and removes what a dead one left."""

    def __init__(self, state_dir: Path = STATE_DIR):
        self.state_dir = state_dir
        self._fd: int | None = None

    def acquire(self, out: Path) -> tuple[RunRecord, list[str]]:
        """(the record of this run, what was removed of a dead run's)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Busy(_holder(self.state_dir / "run.json")) from None
        self._fd = fd
        removed = remove_leftovers(self.state_dir / "run.json")
        return RunRecord(self.state_dir, out), removed

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _holder(path: Path) -> str:
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError):
        return "another study holds this host"
    started = time.strftime("%H:%M:%S", time.localtime(run["started"]))
    return f"another study is running here (pid {run['pid']}, since {started}, results in {run['out']}); " \
           "wait for it to finish, or stop it"


def remove_leftovers(path: Path) -> list[str]:
    """Remove what the dead run recorded at `path` lists; returns one phrase per thing removed."""
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    removed = []
    alive = [p for p in run["processes"] if p["start_time"] is not None and start_time(p["pid"]) == p["start_time"]]
    for graceful in (True, False):
        batch = [p for p in alive if (p["what"] in GRACEFUL) == graceful]
        for proc in batch:
            _signal(proc["pid"], signal.SIGTERM if graceful else signal.SIGKILL)
        for proc in batch:
            if _wait_gone(proc, 15 if graceful else 5):
                removed.append(f"{proc['what']} (pid {proc['pid']})")
            else:
                _signal(proc["pid"], signal.SIGKILL)
                removed.append(f"{proc['what']} (pid {proc['pid']}, killed)")
    removed += _empty_namespaces(run.get("namespaces", {}), run["start_time"])
    for directory in run.get("directories", ()):
        if Path(directory).exists():
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(f"directory {directory}")
    for bridge in run["bridges"]:
        if subprocess.run(["ovs-vsctl", "--timeout=10", "br-exists", bridge], capture_output=True).returncode == 0:
            subprocess.run(["ovs-vsctl", "--timeout=10", "del-br", bridge], capture_output=True)
            removed.append(f"bridge {bridge}")
    for link in run["links"]:
        if Path("/sys/class/net", link).exists():
            subprocess.run(["ip", "link", "del", link], capture_output=True)
            removed.append(f"link {link}")
    for rows in run.get("rows", ()):
        for remote in rows["remotes"]:
            count = remove_rows(rows["owner"], remote)
            if count:
                removed.append(f"{count} QoS/Queue rows of owner {rows['owner']} in {remote}")
    path.unlink(missing_ok=True)
    return removed


def net_namespace(pid: int) -> int | None:
    """The inode of the process's network namespace, or None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _empty_namespaces(namespaces: dict[str, int], since: int) -> list[str]:
    """SIGKILL what still runs in a dead run's host namespaces (by inode), when it started after that run
    began: an inode number is reused once its namespace is gone, and an older process cannot be ours."""
    hosts = {inode: name for name, inode in namespaces.items()}
    if not hosts:
        return []
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        host = hosts.get(net_namespace(pid) or 0)
        started = start_time(pid)
        if host is None or started is None or started < since:
            continue
        try:
            what = (entry / "comm").read_text().strip()
        except OSError:
            continue
        _signal(pid, signal.SIGKILL)
        killed.append((pid, started, f"{what} (pid {pid}, in host {host})"))
    for pid, started, _ in killed:
        _wait_gone({"pid": pid, "start_time": started}, 5)
    return [phrase for _, _, phrase in killed]


def remove_rows(owner: str, remote: str) -> int:
    """Take `owner`'s QoS off every port and remove its QoS and Queue rows, in transactions of at most
    VSCTL_COMMANDS commands (ports first, then QoS, then Queue rows: nothing is removed while in use); how
    many rows. A remote that does not answer is left as it is."""
    def vsctl(*args: str) -> str:
        done = subprocess.run(["ovs-vsctl", f"--db={remote}", "--timeout=10", *args], capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else ""
    tag = f"external_ids:ovs-qos-controller={owner}"
    qos, queues = (vsctl("--bare", "--columns=_uuid", "find", table, tag).split() for table in ("qos", "queue"))
    if not qos and not queues:
        return 0
    commands: list[tuple[str, ...]] = []
    ours = set(qos)
    # (--bare prints no heading: every line is a port)
    for line in vsctl("--bare", "--columns=name,qos", "--format=csv", "--data=bare", "list", "port").splitlines():
        name, _, used = line.partition(",")
        if used in ours:
            commands.append(("clear", "port", name, "qos"))
    commands += [("destroy", "qos", uuid) for uuid in qos] + [("destroy", "queue", uuid) for uuid in queues]
    for start in range(0, len(commands), VSCTL_COMMANDS):   # 10,000 rows in one would pass the kernel's ARG_MAX
        vsctl(*(arg for command in commands[start:start + VSCTL_COMMANDS] for arg in ("--", *command)))
    return len(qos) + len(queues)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _wait_gone(proc: dict, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while start_time(proc["pid"]) == proc["start_time"]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
