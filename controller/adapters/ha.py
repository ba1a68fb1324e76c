"""How this controller runs, chosen once at start from the config (chosen()): alone, one of an active/standby
pair, or a member of a cluster ([coordination]), the three ways controller/core/ha.py names. Each says how
its OVSDB sessions are opened (under the owner's lock, or none), the core's authority, where the policy is
kept (store.py), whether a worker may write now, and what runs beside the core: a cluster's coordination
with etcd (coordination.py), nothing for the others. The app asks, never which one it has.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from controller.adapters.config import Settings
from controller.adapters.coordination import Coordination
from controller.adapters.ovsdb import Ovsdb
from controller.adapters.remotes import Remotes
from controller.adapters.store import Store, alone_store, cluster_store, pair_store
from controller.adapters.worker import LEASE_UNCONFIRMED, LOCK_UNCONFIRMED
from controller.core import actions as act
from controller.core import events as ev
from controller.core.authority import Alone, Pair
from controller.core.cluster import Cluster
from controller.core.ha import Authority
from controller.core.member import Member

PAIR_PROBE_SECONDS = 1.0    # a pair's TCP or SSL session to OVSDB: probed after 1 s of silence (authority.py)
Post = Callable[[ev.Event], None]
ClusterAction = act.ClaimSwitch | act.ReleaseSwitch | act.Unreachable | act.PublishSync


class Mode(Protocol):
    """What the app asks of the way it runs."""
    unconfirmed: str                                # what a worker says of a job it may not write
    services: tuple[Callable[[Post], None], ...]    # run beside the core, each in a greenthread, posting events

    def remotes(self) -> Remotes:
        """The OVSDB remotes, each connected by its own session."""

    def authority(self, remotes: Remotes) -> Authority:
        """The core's authority, once the first remote has been tried."""

    def store(self, remotes: Remotes) -> Store:
        """Where the policy in force is kept."""

    def may_write(self, authority: Authority, now: float) -> bool:
        """Whether a worker may write now."""

    def turned(self) -> None:
        """The core handled an event."""

    def leave(self) -> None:
        """The process exits."""

    def execute(self, action: ClusterAction, post: Post) -> None:
        """A cluster's action."""


def chosen(settings: Settings) -> Mode:
    """The way this controller runs, from its config: the one place that asks which."""
    if settings.coordination is not None:
        return Clustered(settings)
    return Paired(settings) if settings.standby else Lone(settings)


class Lone:
    """Alone: the owner's OVSDB lock, held from the start (no standby to wait for), and the state file."""
    unconfirmed = LOCK_UNCONFIRMED
    services: tuple[Callable[[Post], None], ...] = ()

    def __init__(self, settings: Settings):
        self.settings = settings

    def remotes(self) -> Remotes:
        return _remotes(self.settings, True, PAIR_PROBE_SECONDS)

    def authority(self, remotes: Remotes) -> Authority:
        return Alone()

    def store(self, remotes: Remotes) -> Store:
        return alone_store(self.settings.state_file)

    def may_write(self, authority: Authority, now: float) -> bool:
        return authority.confirmed(now)

    def turned(self) -> None:
        """Nothing runs beside the core to tell."""

    def leave(self) -> None:
        """Nothing to give up: the lock goes with the session."""

    def execute(self, action: ClusterAction, post: Post) -> None:
        raise AssertionError(f"{action}: only a cluster's member asks this")


class Paired(Lone):
    """One of a pair: active once the lock is ours; the policy kept in the first remote under it."""

    def authority(self, remotes: Remotes) -> Authority:
        return Pair(remotes.locked)

    def store(self, remotes: Remotes) -> Store:
        return pair_store(remotes, self.settings.state_file)


class Clustered:
    """A cluster's member: no lock; etcd says who writes what, and keeps the policy."""
    unconfirmed = LEASE_UNCONFIRMED

    def __init__(self, settings: Settings):
        co = settings.coordination
        assert co is not None
        self.settings, self.co = settings, co
        self.coordination = Coordination(co.url, settings.owner, co.member, co.lease, settings.ovsdb[0])
        self.services: tuple[Callable[[Post], None], ...] = (self.coordination.run,)

    def remotes(self) -> Remotes:
        return _remotes(self.settings, False, self.co.lease / 3)

    def authority(self, remotes: Remotes) -> Authority:
        return Member(Cluster(self.co.member, self.co.lease))

    def store(self, remotes: Remotes) -> Store:
        return cluster_store(self.coordination)

    def may_write(self, authority: Authority, now: float) -> bool:
        """The core's word or the coordination's own, which may have heard etcd since."""
        return authority.confirmed(now) or self.coordination.confirmed(now)

    def turned(self) -> None:
        self.coordination.turned()   # the keepalive may refresh our leases

    def leave(self) -> None:
        """Our switches given up at once, so that the others take them over within a second."""
        self.coordination.leave()

    def execute(self, action: ClusterAction, post: Post) -> None:
        self.coordination.execute(action, post)


def _remotes(settings: Settings, lock: bool, probe: float) -> Remotes:
    """`lock`: each session asks for the owner's OVSDB lock; `probe`: OVSDB probes a silent one after this long."""
    return Remotes(settings.ovsdb, lambda name: Ovsdb(name, owner=settings.owner, timeout=10.0, ssl=settings.ovsdb_ssl,
                                                      standby=settings.standby, lock=lock, probe=probe),
                   settings.standby)
