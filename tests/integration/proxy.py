"""A TCP forwarder that partitions silently: what a cut network cable or a dropping firewall does to a
connection, which neither end hears of; or that resets every connection through it, as a restarted
middlebox or a flapping link does, which both ends hear of at once; or that loses a request, or the answer to
one that was carried out."""
from __future__ import annotations

import contextlib
import os
import socket
import threading
import time


class Proxy:
    """A forwarder from 127.0.0.1:`listen` to `target` (host, port), or from the unix socket at path `listen` to
    the one at `target`, that can drop everything silently (a partition: nothing closed, nothing answered, a new
    connection accepted and left unanswered) and heal, or reset every connection and refuse new ones for a
    while (`reset`)."""

    def __init__(self, listen: int | str, target: tuple[str, int] | str, forward_close: bool = True):
        """`forward_close` False: a side's close is not passed on (its FIN lost), so what it sent before is
        delivered to a peer that does not know it is gone."""
        self.target, self.open, self.forward_close = target, threading.Event(), forward_close
        self.refusing = threading.Event()            # set: a new connection is closed at once
        self.drop: bytes | None = None               # a request holding these bytes is lost: its connection closed
        self.mute: bytes | None = None               # a request holding these bytes is carried out, its answer lost
        self.sockets: list[socket.socket] = []       # closed with the proxy: none keeps its port taken after
        self.clients: set[socket.socket] = set()     # the ends that connect to the proxy
        self.open.set()
        if isinstance(listen, int):
            self.listener = socket.create_server(("127.0.0.1", listen))
        else:
            self.listener = socket.socket(socket.AF_UNIX)
            with contextlib.suppress(FileNotFoundError):         # a killed run's
                os.unlink(listen)
            self.listener.bind(listen)
            self.listener.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self.sockets.append(client)
        self.clients.add(client)
        if self.refusing.is_set():
            client.close()
            return
        self.open.wait()
        try:
            if isinstance(self.target, str):
                upstream = socket.socket(socket.AF_UNIX)
                upstream.connect(self.target)
            else:
                upstream = socket.create_connection(self.target)
        except OSError:                          # the target is down: the client's connection closes
            client.close()
            return
        self.sockets.append(upstream)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                self.open.wait()
                data = a.recv(65536)
                self.open.wait()
                if not data or self.drop is not None and self.drop in data and a in self.clients:
                    break
                b.sendall(data)
                if self.mute is not None and self.mute in data and a in self.clients:
                    a.shutdown(socket.SHUT_RDWR)     # its answer goes nowhere: the client hears its connection close
                    break
        except OSError:
            pass
        for s in (a, b) if self.forward_close else (a,):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def reset(self, seconds: float) -> None:
        """Every connection through the proxy closed (both ends hear it at once), and new ones refused for
        `seconds` (returns after them)."""
        self.refusing.set()
        for s in list(self.sockets):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        time.sleep(seconds)
        self.refusing.clear()

    def close(self) -> None:
        self.open.set()
        path = self.listener.getsockname() if self.listener.family == socket.AF_UNIX else None
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)   # else the accept blocked in _accept keeps it listening
        self.listener.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)
