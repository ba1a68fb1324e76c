"""One switch's OpenFlow role for this controller, and the generation id behind it (a part of
controller/core/switch.py).

The switch is first asked its bridge's generation id (a role request that changes nothing); then this
controller claims master with its own id when it is the active one, newer than every id the switch has
seen, or slave. An id that is not newer must be claimed anew first, which concerns every switch: the
switch asks its controller for it (actions.NeedGeneration) and claims once it has it (events.RoleDue).
A switch that refuses the claim (stale: another controller claimed with a newer id) is asked again.
Only a switch that confirmed master on this very connection is written to (writable).
"""
from __future__ import annotations

import enum

from controller.core import actions as act
from controller.core import events as ev
from controller.core.part import LOG, Link, SwitchPart
from controller.core.view import SwitchRole, SwitchView


class Asked(enum.Enum):
    """What a role request in flight asked."""
    GENERATION = enum.auto()     # nochange: the bridge's generation id
    CLAIM = enum.auto()


class RoleManager(SwitchPart):
    def __init__(self, link: Link):
        super().__init__(link)
        self.role = SwitchRole.UNKNOWN
        self.learned = False                  # the switch has said its bridge's generation id
        self.seen: int | None = None          # that id (None: it never had one)
        self.waiting = False                  # for the controller's new generation id
        self.pending: dict[int, Asked] = {}   # role requests in flight
        self.since: float | None = None       # when the switch last confirmed a role other than the one before

    def writable(self, view: SwitchView) -> bool:
        return view.confirmed and self.role is SwitchRole.MASTER

    def ask(self) -> None:
        xid = self.link.xid()
        self.pending[xid] = Asked.GENERATION
        self.link.send(act.RoleRequest(xid, "nochange"))

    def claim(self, view: SwitchView) -> None:
        """Master with the controller's generation id when it is active (once it has one newer than the
        switch's), else slave with the switch's own."""
        if not self.learned:
            return
        if view.active and not (view.generation and (self.seen is None or not_older(view.generation, self.seen))):
            self.waiting = True
            self.link.do(act.NeedGeneration(self.link.dp_id, self.seen or 0))
            return
        self.waiting = False
        xid = self.link.xid()
        self.pending[xid] = Asked.CLAIM
        self.link.send(act.RoleRequest(xid, "master", view.generation) if view.active
                       else act.RoleRequest(xid, "slave", self.seen or 0))

    def due(self, view: SwitchView) -> None:
        """The controller's id or role changed: a switch mastered (or waiting to be) claims again."""
        if self.waiting or self.role is SwitchRole.MASTER or not view.active:
            self.claim(view)

    def reply(self, reply: ev.RoleReply, view: SwitchView, now: float) -> bool:
        """Whether the switch is ours to write now."""
        asked = self.pending.pop(reply.xid, None)
        if asked is None:
            return False
        self.seen = reply.generation
        if asked is Asked.GENERATION:
            self.learned = True
            self.claim(view)
            return False
        if SwitchRole(reply.role) is not self.role:
            self.role, self.since = SwitchRole(reply.role), now
        return self.writable(view)

    def refused(self, reply: ev.ErrorReply) -> bool:
        """Whether the error answers a role request of ours (a stale claim): learn the id and try again."""
        if self.pending.pop(reply.xid, None) is None:
            return False
        self.role = SwitchRole.REFUSED
        LOG.warning("switch %016x refused our role request: %s", self.link.dp_id, reply.what)
        self.ask()
        return True

    def demoted(self) -> None:
        """The switch refused a write as from a slave: another controller is master. Learn its id; claim
        again only while this controller is the active one."""
        if self.role is SwitchRole.MASTER:
            self.role = SwitchRole.SLAVE
            self.ask()


def not_older(ours: int, theirs: int) -> bool:
    """Whether the switch accepts generation id `ours` after `theirs` (OpenFlow compares them as the
    signed difference of two 64-bit numbers, so that they may wrap)."""
    return (ours - theirs) % 2**64 < 2**63
