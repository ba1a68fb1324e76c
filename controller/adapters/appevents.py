"""The app's own os-ken events (controller/qos_app.py): a REST request handed to the event loop and its reply,
and one of the core's events from a timer, a worker, netlink, etcd or the OVSDB connectors."""
from __future__ import annotations

from typing import Any

from controller.adapters.rest import MakeRequest, Ticket
from controller.compat import EventBase, EventReplyBase, EventRequestBase
from controller.core import events as ev


class EventRequest(EventRequestBase):
    def __init__(self, make: MakeRequest):
        super().__init__()
        self.make, self.ticket = make, Ticket()


class EventReply(EventReplyBase):
    def __init__(self, dst: str, result: Any = None, error: Exception | None = None):
        super().__init__(dst)
        self.result, self.error = result, error


class EventCore(EventBase):
    """The core's events, from a timer, a worker, netlink or the OVSDB connectors: handled in their order."""

    def __init__(self, events: tuple[ev.Event, ...]):
        super().__init__()
        self.events = events
