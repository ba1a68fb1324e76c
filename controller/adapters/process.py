"""How the controller's process ends: a bad start in one line, a stop signal or an exit from any greenthread.

Imported by the app as the manager loads it, in the manager's own greenlet: that is the greenlet a stop is
raised in, whatever greenthread runs when it comes, so that the manager closes every app.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from types import FrameType
from typing import NoReturn

import eventlet.hubs
import greenlet

STOP_SECONDS = 10           # a stop that has not finished by then ends the process
EXIT_FAILED = 70            # a handler raised (EX_SOFTWARE): the service restarts the controller
_MAIN = greenlet.getcurrent()   # the manager's greenlet


def fail(err: Exception, code: int) -> NoReturn:
    print(f"error: {err}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def wake_on_signals() -> None:
    """Run as a greenthread: a signal wakes the event hub at once. A signal may land on another OS thread (the
    etcd keepalive's, the peers' watch), which leaves the main thread asleep in epoll until its next timer, up
    to a second, and its Python handler (stop, above) waits for it; CPython writes every signal's number to
    the wakeup fd from the C handler, and that fd is one the hub polls."""
    read, write = os.pipe()
    for fd in (read, write):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(write)
    try:
        while True:
            eventlet.hubs.trampoline(read, read=True)
            with contextlib.suppress(BlockingIOError):
                os.read(read, 512)
    finally:
        signal.set_wakeup_fd(-1)
        os.close(read)
        os.close(write)


def stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM or SIGINT: stop now, whatever greenthread runs. The stop is raised in the manager's own
    greenlet, which then closes every app; raised anywhere else it would end only that greenthread.
    If closing has not ended the process within STOP_SECONDS, SIGALRM's default action ends it."""
    signal.alarm(STOP_SECONDS)
    if greenlet.getcurrent() is _MAIN:
        raise KeyboardInterrupt
    throw(KeyboardInterrupt())


def throw(exc: BaseException) -> None:
    """Raise `exc` in the manager's greenlet, from the event hub (as eventlet kills a greenthread)."""
    eventlet.hubs.get_hub().schedule_call_global(0, _MAIN.throw, exc)
