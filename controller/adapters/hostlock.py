"""Per-switch locks that every controller writing one OVS's tc shares: tc's fence.

OVSDB fences a cluster member's writes itself (the epoch is a condition of each transaction), tc has no
such token: a member that was paused after its last check would, on waking, write an old policy's
leaves and filters over the new owner's. So a member writes a switch's tc only while it holds the
switch's lock, having had its epoch verified by ovsdb-server (not its own copy of OVSDB, which may be
far behind: controller/adapters/ovsdb_commands.py, Fence) under that lock, and a new owner raises the epoch
under the same lock. A deposed member's writes then all come before the new epoch exists: the new
owner's raise waits for them, and the deposed member's next check finds the newer epoch.

The locks are flock(2) locks on files beside the OVSDB unix socket: every controller that writes this
OVS's tc reaches that socket (a container mounts its directory), and the kernel drops a lock the moment
its holder dies. A holder that is stopped keeps it: the switch's tc then waits for it to run or die (its
flows and OVSDB rows do not), and the status names the file. The wait polls without blocking, so the
event loop runs on while a lock is busy.
"""
from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

WAIT_SECONDS = 1.0     # for a lock another controller holds, then the switch's jobs fail and come again
POLL_SECONDS = 0.01


class SwitchLocks:
    def __init__(self, directory: Path, sleep: Callable[[float], object], wait: float = WAIT_SECONDS) -> None:
        self.directory, self._sleep, self._wait = directory, sleep, wait

    @classmethod
    def beside(cls, remote: str, sleep: Callable[[float], object]) -> SwitchLocks:
        """The locks of the OVS served on `remote`, a unix: socket."""
        return cls(Path(remote.removeprefix("unix:")).parent, sleep)

    def path(self, dp_id: int) -> Path:
        return self.directory / f"ovs-qos-{dp_id:016x}.lock"

    @contextmanager
    def held(self, dp_ids: Iterable[int]) -> Iterator[dict[int, str]]:
        """Hold each switch's lock for the block; those not taken within the wait, each with why."""
        fds: dict[int, int] = {}
        held: set[int] = set()
        refused: dict[int, str] = {}
        deadline = time.monotonic() + self._wait
        try:
            pending = sorted(set(dp_ids))
            while pending:
                for dp_id in pending:
                    try:
                        if dp_id not in fds:
                            fds[dp_id] = os.open(self.path(dp_id), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                        fcntl.flock(fds[dp_id], fcntl.LOCK_EX | fcntl.LOCK_NB)
                        held.add(dp_id)
                    except BlockingIOError:
                        continue
                    except OSError as err:
                        refused[dp_id] = f"cannot lock {self.path(dp_id)} ({err.strerror}); tc needs it writable"
                pending = [dp for dp in pending if dp not in held and dp not in refused]
                if pending and time.monotonic() > deadline:
                    refused |= {dp: f"another controller on this host is writing its tc (it holds "
                                    f"{self.path(dp)}); tried again at the next poll" for dp in pending}
                    break
                if pending:
                    self._sleep(POLL_SECONDS)
            yield refused
        finally:
            for fd in fds.values():
                os.close(fd)   # drops the lock
