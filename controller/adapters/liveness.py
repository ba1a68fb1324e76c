"""Whether a member whose OVSDB session closed is dead, confirmed before its lease is revoked (peers.py hears the
close): a session closes when its process dies, and also when its path to OVSDB resets or its probe gives up,
which says nothing of the process. A revocation moves every switch of the member; a flap shorter than a lease
must move none.

- On one host the kernel says it: each member holds an flock(2) on a file of its own beside the OVSDB socket
  (as the switches' host locks are, hostlock.py), holding its lease's id, for as long as its process lives.
  A peer whose file names the lease it published and is not locked is dead: revoked at once.
- Across hosts the member says it: its peer-watch thread writes cut/<member> (on its lease) the moment its own
  session closes, and deletes it once it holds its lock again. A peer that has not said so within WORD_SECONDS
  of its close, nor taken its lock back, is taken for dead. A member cut off from OVSDB and etcd at once is
  taken for dead too: it cannot say otherwise, and its writes are fenced by tokens (peers.py).

A member alive but cut off from OVSDB for good keeps its lease: it says, after a lease time, which switches it
cannot reach (cluster.py), and the others take them then.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from controller.adapters.etcd import LEASE_GONE, CoordinationError, Post, b64, kvs, text

LOG = logging.getLogger(__name__)
WORD_SECONDS = 0.5         # how long a peer whose session closed has to say, in etcd, that it lives


def directory(remote: str) -> Path | None:
    """Where the members that share `remote`'s host keep their files: beside its unix socket (None: not one)."""
    return Path(remote.removeprefix("unix:")).parent if remote.startswith("unix:") else None


class Liveness:
    """`post`: etcd for the peer-watch thread, on which every method but `mark` runs; `lease()`: ours."""

    def __init__(self, post: Post, prefix: str, owner: str, member: str, lease: Callable[[], int],
                 beside: Path | None) -> None:
        self._post, self._prefix, self._owner, self._member = post, prefix, owner, member
        self._lease, self._directory = lease, beside
        self._pending: dict[str, float] = {}     # peer whose session closed → until when its word is waited for
        self._ever = False                       # we have held our own lock
        self._told: tuple[bool, int] | None = (False, 0)   # our cut/<member> as etcd holds it, and on which lease
        self._mark: tuple[int, int] | None = None   # our file (-1: none), locked for our life; the lease it says

    def _path(self, member: str) -> Path:
        assert self._directory is not None
        return self._directory / f"ovs-qos-member-{self._owner.encode().hex()}-{member.encode().hex()}.lock"

    def mark(self, lease: int) -> None:
        """Our file beside the OVSDB socket says `lease`, locked for as long as this process lives (the loop's)."""
        if self._directory is None or self._mark is not None and self._mark[1] == lease:
            return
        fd = self._mark[0] if self._mark else -1
        try:
            if fd < 0:
                fd = os.open(self._path(self._member), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(lease).encode(), 0)
        except OSError as err:   # a twin holds it, or the directory is read-only: the others wait for our word
            LOG.warning("cannot hold %s (%s): members on this host take %g s longer to hear this one die",
                        self._path(self._member), err.strerror, WORD_SECONDS)
            if fd >= 0:
                os.close(fd)
            fd = -1
        self._mark = (fd, lease)

    def held(self, ours: bool) -> None:
        """Whether we hold our own lock now: once we have held it, its loss told to etcd as cut/<member> (on our
        lease), and the key deleted once we hold it again; tried again at each call until etcd has it."""
        self._ever = self._ever or ours
        lease = self._lease()
        cut = not ours and self._ever
        if not lease or self._told == (cut, lease) or not cut and self._told is not None and not self._told[0]:
            return                                # no lease (left): a key without one would stay for ever
        key = b64(f"{self._prefix}cut/{self._member}")
        try:
            if cut:
                self._post("/kv/put", {"key": key, "value": b64("{}"), "lease": lease})
            else:
                self._post("/kv/deleterange", {"key": key})
            self._told = (cut, lease)
        except CoordinationError as err:
            self._told = None
            LOG.debug("etcd: cannot say whether our OVSDB session is up: %s", err)

    def suspect(self, peer: str, now: float) -> None:
        """The peer's session closed while we waited in line for its lock. A file of its here that no process
        holds is a dead process's, whose lease (in it) is revoked without asking etcd first: a round trip less
        before the switches move. A lease etcd no longer has (the file of a process that left, or that ran here
        before the member moved) says nothing of the peer now: etcd is asked then."""
        found = self._file(peer)
        if found and found[0] and not found[1] and \
                self._revoke(peer, found[0], "its OVSDB session closed, its process gone", quiet=True):
            return
        dead, lease = self._verdict(peer, final=False)
        if dead is None:
            self._pending[peer] = now + WORD_SECONDS
        elif dead:
            self._revoke(peer, lease, "its OVSDB session closed, its process gone")

    def back(self, peer: str) -> None:
        """The peer holds its lock again: it lives."""
        if self._pending.pop(peer, None) is not None:
            LOG.info("member %s's OVSDB session closed and came back: nothing moves", peer)

    def due(self, now: float) -> float:
        """The suspicions whose wait is over decided; seconds until the next one is."""
        for peer, until in list(self._pending.items()):
            if now >= until:
                del self._pending[peer]
                dead, lease = self._verdict(peer, final=True)
                if dead:
                    self._revoke(peer, lease, f"its OVSDB session closed, and it did not say it lives within "
                                              f"{WORD_SECONDS:g} s")
        return min(self._pending.values(), default=now + 1.0) - now

    def _verdict(self, peer: str, final: bool) -> tuple[bool | None, int]:
        """Whether the peer is dead (None: not known yet), and the lease it published: by its file, if it has one
        here naming that lease; else, once its wait is over (`final`), by its silence."""
        try:
            answer = self._post("/kv/txn", {"success": [{"request_range": {"key": b64(f"{self._prefix}{k}/{peer}")}}
                                                        for k in ("lease", "cut")]})
        except CoordinationError as err:
            LOG.warning("etcd: member %s's OVSDB session closed, but whether it lives cannot be read (%s); its "
                        "switches move when its lease runs out", peer, err)
            return False, 0
        published, cut = kvs(answer, 0), kvs(answer, 1)
        if not published:
            return False, 0                       # it left, or its lease ran out: nothing to revoke
        lease = int(json.loads(text(published[0]["value"])))
        found = self._file(peer)
        locked = found[1] if found and found[0] == lease else None   # None: no file here naming that lease
        if locked is False:
            return True, lease
        if not final:
            return None, lease
        if locked or cut:
            LOG.info("member %s's OVSDB session closed, but it lives (%s): nothing moves; its switches move if it "
                     "cannot reach them for a lease", peer, "its process holds its file" if locked else "it says so")
            return False, lease
        return True, lease

    def _file(self, peer: str) -> tuple[int, bool] | None:
        """The peer's file here: the lease it names (0: none readable), and whether a process holds it (None: no
        file here)."""
        if self._directory is None:
            return None
        try:
            fd = os.open(self._path(peer), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            said = os.pread(fd, 32, 0)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                held = False
            except BlockingIOError:
                held = True
            return int(said) if said.isdigit() else 0, held
        finally:
            os.close(fd)      # drops our shared lock at once

    def _revoke(self, peer: str, lease: int, why: str, quiet: bool = False) -> bool:
        """Whether etcd revoked it; `quiet`: a lease etcd no longer has is not worth a warning."""
        try:
            self._post("/kv/lease/revoke", {"ID": lease})
        except CoordinationError as err:    # gone already (it left, or ran out), or etcd did not answer
            if not (quiet and str(err) == LEASE_GONE):
                LOG.warning("etcd: member %s is dead, but its lease was not revoked (%s); its switches move when "
                            "its lease runs out", peer, err)
            return False
        LOG.warning("member %s is dead (%s): its lease revoked, its switches move now", peer, why)
        return True
