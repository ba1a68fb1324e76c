"""The switches' connections (a part of controller/core/controller.py): each accepted connection's switch,
the devices (ifindex) of their ports, for netlink's news, and rival claims to a connected datapath id.

A restarted switch reconnects before its old connection times out; an impostor connects while the switch
is up. The switch's own connection decides: it is asked for an echo, which only a switch that is there
answers, and the rival is closed if it does, or becomes the switch if it does not within CLAIM_SECONDS.
Plain OpenFlow is unauthenticated: TLS is the answer on an untrusted network.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from controller.core import actions as act
from controller.core import events as ev
from controller.core.switch import Switch

LOG = logging.getLogger("qos")
CLAIM_SECONDS = 3.0         # how long a switch's connection has to answer the echo that tests a rival's claim


@dataclass
class Rival:
    """A connection that claims the datapath id of a live switch, while that switch is asked for an echo."""
    up: ev.SwitchUp
    conn: int                 # the live switch's connection
    xid: int                  # its echo


class Connections:
    def __init__(self) -> None:
        self.switches: dict[int, Switch] = {}         # accepted connection → its switch
        self.devices: dict[int, int] = {}             # device (ifindex) → its switch's datapath id
        self.claims: dict[int, Rival] = {}            # rival connection → its claim

    def accepted(self, sw: Switch) -> None:
        self.switches[sw.conn] = sw

    def forget(self, sw: Switch) -> None:
        del self.switches[sw.conn]
        for index in sw.jobs.ifindex.values():
            self.devices.pop(index, None)

    def claim(self, up: ev.SwitchUp, live: Switch) -> list[act.Action]:
        """A connection claims the datapath id of `live`: its echo asked, or, while another claim is tested,
        the connection closed."""
        if any(rival.up.dp_id == up.dp_id for rival in self.claims.values()):
            LOG.warning("datapath %016x: yet another connection claims it while a claim is tested; closed", up.dp_id)
            return [act.Close(up.conn)]
        xid = live.link.xid()
        self.claims[up.conn] = Rival(up, live.conn, xid)
        return [act.Send(live.conn, (act.Echo(xid),)), act.Later(CLAIM_SECONDS, ev.ClaimDue(up.conn))]

    def echoed(self, reply: ev.EchoReply) -> list[act.Action]:
        """The switch answered: the rivals its echo tested are closed."""
        out: list[act.Action] = []
        for conn, rival in list(self.claims.items()):
            if (rival.conn, rival.xid) == (reply.conn, reply.xid):
                del self.claims[conn]
                LOG.warning("datapath %016x: another connection claimed it while the switch answers on its own; "
                            "closed that one (an impostor? use OpenFlow over TLS on an untrusted network)",
                            rival.up.dp_id)
                out.append(act.Close(conn))
        return out

    def due(self, conn: int) -> Rival | None:
        """The rival whose time is up (the switch did not answer): it is the switch now."""
        rival = self.claims.pop(conn, None)
        if rival is not None:
            LOG.warning("datapath %016x: its connection did not answer within %g s; the new one is the switch now",
                        rival.up.dp_id, CLAIM_SECONDS)
        return rival

    def left(self, conn: int) -> bool:
        """Whether the connection that left was a rival, before its claim was decided."""
        return self.claims.pop(conn, None) is not None
