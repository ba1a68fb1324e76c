"""What the parts of one switch share (controller/core/switch.py): its connection as they write to it
during one event, and the small set of hooks every part answers.

A switch is split by concern, each part owning its own state: the OpenFlow role (role.py), the flows and
meters it holds (flowsync.py), its ports' OVSDB/tc jobs (portjobs.py), and its statistics polls with the
congestion detector (poller.py). A part reads the switch's view (controller/core/view.py) and writes to
the Link; the switch returns what the link gathered as its actions.
"""
from __future__ import annotations

import logging

from controller.core import actions as act
from controller.core import events as ev
from controller.core.telemetry import SwitchTelemetry

LOG = logging.getLogger("qos")


class Link:
    """One switch connection: the xids it numbers, the statistics requests in flight (with the flow
    batch they were sent after), and the messages and actions gathered for the event being handled."""

    def __init__(self, conn: int, dp_id: int, telemetry: SwitchTelemetry):
        self.conn, self.dp_id, self.telemetry = conn, dp_id, telemetry
        self.epoch = 0                                     # flow batches sent: a reply to an older request is stale
        self.requests: dict[int, tuple[int, str]] = {}     # xid → (epoch when sent, what was asked)
        self.messages: list[act.Message] = []
        self.actions: list[act.SwitchAction] = []
        self._xid = 0

    def xid(self) -> int:
        self._xid = self._xid % 0x7FFF_FFFF + 1
        return self._xid

    def send(self, *messages: act.Message) -> None:
        self.messages.extend(messages)

    def ask(self, kind: str, port: int | None = None) -> int:
        """A statistics request, remembered with the epoch it was sent in."""
        xid = self.xid()
        self.requests[xid] = (self.epoch, kind)
        self.send(act.StatsRequest(xid, kind, port))
        return xid

    def answered(self, xid: int) -> tuple[str | None, int | None]:
        """What a reply answers, and the epoch it was asked in."""
        epoch, what = self.requests.pop(xid, (None, None))
        return what, epoch

    def later(self, seconds: float, event: ev.Event, slack: float = 0.0) -> None:
        self.actions.append(act.Later(seconds, event, slack))

    def do(self, action: act.SwitchAction) -> None:
        self.actions.append(action)

    def drift(self, kind: str, what: str) -> None:
        """What the switch, OVSDB or a device held differed from what we put there; it is put right."""
        self.telemetry.count(self.telemetry.drift_repairs, kind)
        LOG.warning("switch %016x: drift (%s) repaired: %s", self.dp_id, kind, what)

    def drain(self) -> list[act.SwitchAction]:
        out: list[act.SwitchAction] = [act.Send(self.conn, tuple(self.messages))] if self.messages else []
        out += self.actions
        self.messages, self.actions = [], []
        return out


class SwitchPart:
    """The hooks every part of a switch answers; the switch calls them on all its parts alike."""

    def __init__(self, link: Link):
        self.link = link

    def read_anew(self) -> None:
        """This controller takes the switch over: what the part believed of the switch is read again."""

    def stand_down(self) -> None:
        """This controller stood down: the part stops whatever it had under way."""

    def errors(self) -> dict[str, str]:
        """What of the part's is not as the policy says, and why."""
        return {}
