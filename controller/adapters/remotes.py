"""Every OVSDB the controller manages switches through (the `ovsdb` option's remotes), each connected,
and reconnected, on its own, so that one host down never stalls the others; what the core reads of them
(controller/core/controller.py's OvsdbView).

Each remote is connected by a greenthread of its own (controller/qos_app.py), from the start: one that
does not answer (refused, unreachable, no schema, a bad certificate) is tried again with back-off (1 s
doubling to 30 s), and delays nothing else. Once connected, python-ovs reconnects by itself; while it is
down, its last replica still answers reads, and changes for its ports fail at once, to be tried again.
A connecting datapath is matched to the remote whose Bridge table holds its datapath_id (or to the one
its policy pins). tc is reachable only for the ports of a unix: remote: the OVS of the controller's own
host (a tcp: or ssl: remote is another host, even on a loopback address: its ports may be in another
network namespace, as topo/net/ovs_instance.py's are).
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Protocol

from controller.adapters.ovsdb import LockHeld, OvsdbError
from controller.core.bridges import BridgeInfo
from controller.core.plan import ABSENT
from controller.core.queues import OvsdbQos, QosSpec

LOG = logging.getLogger(__name__)
FIRST_RETRY, MAX_RETRY = 1.0, 30.0


class Database(Protocol):
    """One remote's connection: controller/adapters/ovsdb.py's Ovsdb."""

    @property
    def generation(self) -> int: ...
    @property
    def connected(self) -> bool: ...
    @property
    def has_lock(self) -> bool: ...
    @property
    def lock_contended(self) -> bool: ...
    @property
    def bridge_reads(self) -> dict[int, int]: ...
    def bridge(self, dp_id: int) -> BridgeInfo | None: ...
    def port_qos(self, iface: str) -> OvsdbQos | str | None: ...
    def apply(self, changes: dict[str, QosSpec | None], tags: dict[str, str] | None = None,
              port_tags: dict[str, dict[str, str]] | None = None, epochs: dict[int, int] | None = None) -> None: ...
    def fence(self, epochs: dict[int, int]) -> dict[int, str]: ...
    def next_generation_id(self, above: int | None = None) -> int: ...
    def silent_for(self) -> float: ...
    def heartbeat(self) -> int: ...
    def beat(self) -> None: ...
    def steal_lock(self) -> None: ...
    def saved_policy(self, verified: bool) -> str | None: ...
    def save_policy(self, text: str) -> None: ...
    def remove_orphans(self, everywhere: bool = True) -> int: ...
    def close(self) -> None: ...


class Remotes:
    def __init__(self, names: tuple[str, ...], connect: Callable[[str], Database], standby: bool = False):
        """`standby`: this controller has a standby (or is one), so only the holder of the first remote's
        lock is active. Without one, a controller that started is the only one of its owner (a second is
        refused by each remote's lock), and is active whichever remotes answer."""
        self.names, self.standby = names, standby
        self._connect = connect
        self._claimed = 0
        self.dbs: dict[str, Database] = {}
        self.errors: dict[str, str] = {}                      # why a remote is not connected
        self._backoff = dict.fromkeys(names, FIRST_RETRY)

    def connect(self, name: str) -> float | None:
        """Try `name` once: None once it is connected, else how long to wait before trying again. Another
        controller of our owner holding the lock (LockHeld) is not retried: it is raised."""
        try:
            self.dbs[name] = self._connect(name)
        except LockHeld:
            raise
        except Exception as err:   # noqa: BLE001 - ovsdbapp's schema fetch raises a bare Exception
            message = " ".join(str(err).split()) or type(err).__name__
            if self.errors.get(name) != message:
                LOG.error("OVSDB %s: %s; trying again, every %g s at most", name, message, MAX_RETRY)
            self.errors[name] = message
            wait, self._backoff[name] = self._backoff[name], min(2 * self._backoff[name], MAX_RETRY)
            return wait
        self.errors.pop(name, None)
        LOG.info("OVSDB %s connected", name)
        return None

    @property
    def locked(self) -> bool:
        """Whether this controller is the active one: it holds its owner's lock on the first remote, or
        it has no standby."""
        db = self._first
        return bool(db and db.connected and db.has_lock) or not self.standby

    @property
    def lock_taken(self) -> bool:
        """Whether another controller of our owner holds the first remote's lock."""
        db = self._first
        return bool(db and db.connected and db.lock_contended)

    def beat(self) -> bool:
        """The active controller of a standby pair: one heartbeat in the first remote; whether OVSDB committed
        it (the transaction asserts the lock, so it commits only while the lock is ours)."""
        db = self._first
        if not (self.standby and db is not None and db.connected and db.has_lock):
            return False
        try:
            db.beat()
        except (OvsdbError, RuntimeError) as err:
            LOG.warning("OVSDB %s: heartbeat not written: %s", self.names[0], err)
            return False
        return True

    def silent_for(self) -> float:
        """Seconds since the first remote last said anything (0 while it cannot stall: a unix socket)."""
        db = self._first
        return db.silent_for() if db is not None and db.connected else 0.0

    def heartbeat(self) -> int:
        """The lock holder's heartbeat as the first remote's replica holds it (0: none, or not reached)."""
        db = self._first
        return db.heartbeat() if db is not None and db.connected else 0

    def steal_lock(self) -> None:
        """Take the owner's lock from its holder (the core decided its heartbeat stood still)."""
        db = self._first
        if db is not None and db.connected:
            LOG.warning("OVSDB %s: taking the lock from the controller holding it", self.names[0])
            db.steal_lock()

    def claim_generation(self, above: int | None) -> int | None:
        """A new generation id, newer than `above` too, for claiming mastership; None when this controller
        cannot (the first remote is not reached, or its lock is not ours: OVSDB refuses the transaction)."""
        db = self._first
        if db is None or not db.connected:
            if self.standby:
                return None
            # No standby to fence off: an id of our own, newer than the switch's, until the remote answers.
            self._claimed = max(self._claimed, above or 0) + 1
            return self._claimed
        try:
            self._claimed = db.next_generation_id(max(above or 0, self._claimed))
            return self._claimed
        except (OvsdbError, RuntimeError) as err:
            LOG.warning("OVSDB %s: cannot claim a generation id: %s", self.names[0], err)
            return None

    def saved_policy(self) -> str | None:
        """A standby pair's policy as kept in the first remote (JSON text; None: none kept): read under the lock
        by its holder, from the replica by the other. OvsdbError where the remote is not reached."""
        db = self._reached()
        return db.saved_policy(verified=db.has_lock)

    def save_policy(self, text: str) -> None:
        """A standby pair's policy kept in the first remote, by a transaction OVSDB refuses unless the lock is ours."""
        self._reached().save_policy(text)

    def _reached(self) -> Database:
        """The first remote's connection; OvsdbError while it is not connected."""
        db = self._first
        if db is None or not db.connected:
            raise OvsdbError(f"OVSDB {self.names[0]} is not connected")
        return db

    @property
    def _first(self) -> Database | None:
        """The first remote's connection, which holds the lock and the generation id; None until reached."""
        return self.dbs.get(self.names[0])

    def connected(self) -> dict[str, bool]:
        return {name: name in self.dbs and self.dbs[name].connected for name in self.names}

    @property
    def generation(self) -> tuple[int, ...]:
        """Changes whenever anything we read in any remote changes."""
        return tuple(self.dbs[n].generation if n in self.dbs else -1 for n in self.names)

    def bridge(self, dp_id: int, pinned: str | None = None) -> BridgeInfo | None:
        """The bridge with this datapath_id, in the remote `pinned` or in the first that has it."""
        for name in (pinned,) if pinned else self.names:
            db = self.dbs.get(name)
            found = db.bridge(dp_id) if db else None
            if found is not None:
                return dataclasses.replace(found, remote=name)
        return None

    def bridge_reads(self) -> dict[str, dict[int, int]]:
        """By remote, how many times each datapath's bridge was read from its replica (its metric)."""
        return {name: dict(db.bridge_reads) for name, db in self.dbs.items()}

    def port_qos(self, remote: str, iface: str) -> OvsdbQos | str | None:
        db = self.dbs.get(remote)
        return db.port_qos(iface) if db else ABSENT

    def view(self, remote: str) -> RemoteView:
        return RemoteView(self, remote)

    def close(self) -> None:
        for db in self.dbs.values():
            db.close()


class RemoteView:
    """One remote as the worker changes it: a remote not connected refuses at once."""

    def __init__(self, remotes: Remotes, name: str) -> None:
        self._remotes, self.name = remotes, name

    def _db(self) -> Database:
        db = self._remotes.dbs.get(self.name)
        if db is None or not db.connected:
            raise OvsdbError(f"OVSDB {self.name} is not connected; tried again when it is back")
        return db

    def apply(self, *args: Any, **kwargs: Any) -> None:
        self._db().apply(*args, **kwargs)

    def remove_orphans(self, everywhere: bool = True) -> int:
        return self._db().remove_orphans(everywhere)

    def fence(self, epochs: dict[int, int]) -> dict[int, str]:
        return self._db().fence(epochs)


def on_this_host(remote: str) -> bool:
    """Whether the remote's ports are devices of the controller's own network namespace (so tc reaches them):
    only a unix socket's. A TCP or SSL remote, loopback ones included, may serve a vswitchd whose devices
    are in another namespace (ovsdb-server on 127.0.0.2 beside a vswitchd in its own netns is how the
    launcher's second OVS runs), where tc would find no device or, worse, another of the same name."""
    return remote.startswith("unix:")
