"""A cluster's members watching each other through OVSDB locks: a member that dies is known the moment
its session closes, not when its lease runs out.

Each member holds a lock of its own on its first OVSDB remote, on a session of its own, and asks for
every other member's lock too, so it waits in line behind the holder. ovsdb-server gives a lock to the
next in line the moment its holder's session closes (as ovn-northd's instances take over from each
other), so the first member in line is told at once that a peer's session is gone: its process died, or
its connection to OVSDB did. Which of the two is confirmed before anything moves (liveness.py); a dead
member's lease is then revoked, so that its keys go now and the ring's next owners claim its switches at
once. A peer that takes its lock back (its session reconnected) lives. A false suspicion that gets
through (a member alive but cut off from OVSDB and etcd at once) is safe: its writes are fenced by tokens
(the switches' OpenFlow generation id, the epoch in OVSDB, the host locks for tc), and it joins again when
its keepalive finds its lease gone. A host that vanishes without closing anything (a power cut, a silent
partition) is still caught by the lease.

Each member takes its own lock with "steal", and the others ask for it with "lock": so, once a member
holds its lock, a lock it did not hold can never be handed on as if it had died. A watcher that got a
peer's lock at once (nobody held it: the peer not connected yet) keeps it until the peer steals it back,
and a member publishes its lease for revoking only once it holds its lock. The session is probed only
after a lease of silence (and closed after as much again): a stall of OVSDB, or of its path, shorter than
a lease closes nothing. The watch runs in an OS thread of its own, like the lease keepalive, so a busy
event loop does not delay it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from eventlet import patcher
from ovs import jsonrpc, poller

from controller.adapters.liveness import Liveness

LOG = logging.getLogger(__name__)
RETRY_SECONDS = 1.0
BACKOFF_MS = (250, 1000)   # reconnection back-off: a member whose path reset takes its lock back soon after
_threading = patcher.original("threading")
_time = patcher.original("time")


def member_lock(owner: str, member: str) -> str:
    """An OVSDB lock name (RFC 7047: letters, digits, '_'), the bytes in hex keeping owners and members apart."""
    return f"ovs_qos_member_{owner.encode().hex()}_{member.encode().hex()}"


class PeerWatch:
    """`liveness` hears, in this thread, of a peer's OVSDB session closed while we waited for its lock, of a peer
    back, and whether we hold our own lock."""

    def __init__(self, remote: str, owner: str, member: str, liveness: Liveness, probe: float) -> None:
        """`probe`: seconds of silence before the session is probed (and closed as many after): a lease."""
        self.owner, self.member, self._liveness = owner, member, liveness
        self._open: Callable[[], Any] = lambda: jsonrpc.Session.open(remote, int(probe * 1000))
        self.peers: frozenset[str] = frozenset()      # set by the coordination loop, replaced whole
        self.own_held = False                         # read by the coordination loop: publish our leases only then
        self._names: dict[str, str] = {}              # lock name → peer ('' for our own)
        self._queued: frozenset[str] = frozenset()    # peers whose lock we wait in line for (replaced whole)
        self._asked: set[str] = set()                 # peers whose lock we asked for on this session
        self._requests: dict[Any, str] = {}           # lock request id → peer
        self._steal_at = float("inf")                 # when to take our own lock back
        self._stop = _threading.Event()
        self._thread = _threading.Thread(target=self._run, name="ovsdb-peer-watch", daemon=True)

    def start(self) -> None:
        """The watch started, once (connecting to etcd again starts nothing more)."""
        if self._thread.ident is None:
            self._thread.start()

    @property
    def watching(self) -> frozenset[str]:
        """The peers whose lock we wait in line for: those whose death we would hear of at once."""
        return self._queued

    def stop(self) -> None:
        """Ends the thread at its next turn (within RETRY_SECONDS), closing the session; not waited for."""
        self._stop.set()

    def _run(self) -> None:
        session = self._open()
        session.reconnect.set_backoff(*BACKOFF_MS)
        state: tuple[int, bool] | None = None
        try:
            while not self._stop.is_set():
                session.run()
                now = (session.get_seqno(), session.is_connected())
                if now != state:            # connected anew, or lost: nothing asked holds now
                    state = now
                    self._queued, self.own_held = frozenset(), False
                    self._asked.clear()
                    self._requests.clear()
                    if session.is_connected():
                        self._send(session, "steal", "")
                if session.is_connected() and not self.own_held and _time.monotonic() >= self._steal_at:
                    self._steal_at = float("inf")    # our request still waits in line: withdrawn, then a steal
                    session.send(jsonrpc.Message.create_request("unlock", [member_lock(self.owner, self.member)]))
                    self._send(session, "steal", "")
                if session.is_connected():
                    for peer in sorted(self.peers - self._asked - {self.member}):
                        self._asked.add(peer)
                        self._send(session, "lock", peer)
                for _ in range(50):
                    msg = session.recv()
                    if msg is None:
                        break
                    self._on(session, msg)
                self._liveness.held(self.own_held)
                due = self._liveness.due(_time.monotonic())
                wait = poller.Poller()
                session.wait(wait)
                session.recv_wait(wait)
                wait.timer_wait(max(1, int(min(RETRY_SECONDS, due) * 1000)))
                wait.block()
        finally:
            session.close()

    def _send(self, session: Any, method: str, peer: str) -> None:
        name = member_lock(self.owner, peer or self.member)
        self._names[name] = peer
        request = jsonrpc.Message.create_request(method, [name])
        self._requests[request.id] = peer
        session.send(request)

    def _on(self, session: Any, msg: Any) -> None:
        if msg.type == jsonrpc.Message.T_REPLY and msg.id in self._requests:
            peer = self._requests.pop(msg.id)
            locked = bool((msg.result or {}).get("locked"))
            if not peer:
                self.own_held = locked
            elif not locked:                # in line behind the peer, or behind a watcher keeping it for the peer
                self._queued = self._queued | {peer}
        elif msg.type == jsonrpc.Message.T_NOTIFY and msg.params and msg.method in ("locked", "stolen"):
            named = self._names.get(msg.params[0])
            if named == "":
                self.own_held = msg.method == "locked"
                if not self.own_held:    # a stale session of ours (a connection a partition held back), or a twin
                    LOG.warning("another session took this member's OVSDB lock (an old connection of %s, or %s "
                                "running twice); taken back in %g s", self.member, self.member, RETRY_SECONDS)
                    self._steal_at = _time.monotonic() + RETRY_SECONDS
            elif named is not None and msg.method == "stolen":   # the peer is back and took its lock from us:
                self._queued = self._queued | {named}             # ovsdb-server keeps us first in line behind it
                self._liveness.back(named)
            elif named is not None and named in self._queued:     # its holder's session closed
                self._queued = self._queued - {named}
                self._liveness.suspect(named, _time.monotonic())
