"""The controller's TCP listeners: never shared with another process, and not held by idle or
hostile peers.

eventlet's listen() sets SO_REUSEPORT, so a second controller used to bind 6653, 8080 and 9101
beside the first one, and the kernel split connections between them. Our HTTP servers bind
without it, and the OpenFlow port (which os-ken opens itself) is tried first the same way.

HTTP: a connection idle for IDLE_SECONDS is closed, and beyond MAX_CONNECTIONS at once a new one is
answered 503 and closed, so idle or slow clients cannot hold the API (eventlet's default pool stops
accepting once 1024 connections are open, however idle). OpenFlow: a peer that sends what os-ken
cannot parse is logged in one line and dropped; the switches are served on.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import resource
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import eventlet
import eventlet.wsgi

from controller.compat import FRAMEWORK, openflow_controller

if TYPE_CHECKING:
    from wsgiref.types import WSGIApplication

    from eventlet.greenthread import GreenThread

LOG = logging.getLogger(__name__)
IDLE_SECONDS = 5.0
MAX_CONNECTIONS = 2000
_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: 48\r\n\r\n{\"error\": \"too many connections; try again\"}\n")


class PortInUse(OSError):
    """Another process listens on the address."""


def listen(addr: tuple[str, int]) -> socket.socket:
    family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # TIME_WAIT only, never a live listener
    try:
        sock.bind(addr)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise PortInUse(f"{addr[0]}:{addr[1]} is in use by another process (another controller?); stop it "
                            "or choose another port") from None
        raise
    sock.listen(128)
    return sock


def check_free(addr: tuple[str, int]) -> None:
    """Raise PortInUse unless `addr` could be listened on now."""
    listen(addr).close()


def serve(sock: socket.socket, app: WSGIApplication) -> None:
    """Serve a WSGI app on a listening socket, each connection in its own greenthread (the manager has
    monkey-patched `socket`, so the socket is already green)."""
    eventlet.wsgi.server(sock, app, log_output=False, custom_pool=_BoundedPool(MAX_CONNECTIONS),
                         keepalive=IDLE_SECONDS, socket_timeout=IDLE_SECONDS)


class _BoundedPool(eventlet.GreenPool):
    """Beyond `limit` connections at once, a new one gets a 503 and is closed, instead of waiting (and
    keeping every later one waiting) for a free greenthread."""

    def __init__(self, limit: int):
        super().__init__(limit + 64)   # refusals are greenthreads too, for an instant
        self.limit, self.serving = limit, 0

    def spawn(self, function: Callable[[list[Any]], None], connection: list[Any]) -> GreenThread:
        """`connection`: eventlet.wsgi's [address, socket, state]."""
        if self.serving >= self.limit:
            return super().spawn(_refuse, connection)
        self.serving += 1
        thread = super().spawn(function, connection)
        thread.link(self._done)
        return thread

    def _done(self, _thread: GreenThread) -> None:
        self.serving -= 1


def _refuse(connection: list[Any]) -> None:
    with contextlib.suppress(OSError):
        connection[1].sendall(_REFUSED)


def raise_file_limit() -> None:
    """Let the process hold as many sockets as the hard limit allows: MAX_CONNECTIONS HTTP clients and
    every switch must fit (a soft limit of 1024 is common)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def guard_openflow() -> None:
    """A peer that sends what os-ken cannot parse (another protocol, a version it does not know, a
    message cut short) ends its own connection with one line in the log, not a traceback. os-ken starts
    each OpenFlow connection through this module-level factory, which it looks up when it listens."""
    module = openflow_controller()

    def factory(sock: socket.socket, address: tuple[Any, ...]) -> None:
        with contextlib.closing(module.Datapath(sock, address)) as datapath:
            try:
                datapath.serve()
            except Exception as err:   # noqa: BLE001 - whatever the peer sent, it is only that peer's end
                dp_id = f"datapath {datapath.id:016x}" if datapath.id is not None else "a peer"
                LOG.warning("OpenFlow: %s at %s:%s sent what cannot be read (%s: %s); connection closed", dp_id,
                            address[0], address[1], type(err).__name__, err)

    setattr(module, "datapath_connection_factory", factory)   # noqa: B010 - the framework's module attribute
    logging.getLogger(f"{FRAMEWORK}.ofproto.ofproto_parser").addFilter(_one_line)


def _one_line(record: logging.LogRecord) -> bool:
    """os-ken's parser logs a message it cannot parse (and then ignores) with a traceback and a hex dump of
    it: one line is enough."""
    if record.exc_info and str(record.msg).startswith("Encountered an error while parsing"):
        record.msg = "OpenFlow: a message a switch sent cannot be parsed (version 0x%02x, type %d, length %d); ignored"
        record.args = tuple(record.args[:3]) if isinstance(record.args, tuple) else ()
        record.exc_info, record.exc_text = None, None
    return True
