"""The controller's TCP listeners, which never share a port with another process.

eventlet's listen() sets SO_REUSEPORT, so a second controller used to bind 6653, 8080 and 9101
beside the first one, and the kernel split connections between them. Our HTTP servers bind
without it, and the OpenFlow port (which os-ken opens itself) is tried first the same way.
"""
from __future__ import annotations

import errno
import socket

import eventlet.wsgi


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


def serve(sock: socket.socket, app) -> None:
    """Serve a WSGI app on a listening socket, each request in its own greenthread (osken-manager has
    monkey-patched `socket`, so the socket is already green)."""
    eventlet.wsgi.server(sock, app, log_output=False)
