"""The policy in force, kept on disk so a restarted controller carries on with it instead of
starting bare (and, with secure fail-mode switches, dropping traffic until someone puts it again).

Written whole or not at all (temporary file, fsync, rename), whenever a policy is put or cleared, as
{"policy": <document or null>, "revision": <each save's one more>, "saved": <unix time>}. A file that is
not exactly that (empty, cut short, binary, or JSON of another shape) is refused with one line: the
controller then starts without a policy and leaves the switches as they are, never clearing them on a
misreading.

One controller per state file: the StateFile holds an exclusive flock on `.<name>.lock` beside it for
the process's life, and a second controller naming the same file is refused at start. An active/standby
pair keeps its policy in OVSDB instead (controller/adapters/store.py), and only reads a file it once
shared (`shared`: not locked, since both of the pair may name it).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, BinaryIO

from controller.core.document import load_json, read_file
from controller.core.errors import PolicyError
from controller.core.events import PolicyLoaded, PolicySaved
from controller.core.keeper import SAVED_ABSENT, SAVED_CLEARED, SAVED_POLICY

LOG = logging.getLogger(__name__)


class StateFileInUse(SystemExit):
    """Another process holds the state file's lock. A SystemExit because the app makes its StateFile while
    it starts: Python ends it with status 1 and prints this one line, with no traceback."""


class StateFile:
    def __init__(self, path: Path, *, shared: bool = False):
        self.path = path
        self.lock = path.with_name(f".{path.name}.lock")
        self._held = None if shared else self._take_lock()

    def _take_lock(self) -> BinaryIO | None:
        """The open lock file (the flock lives as long as it), or None where no lock can be had: a directory
        that cannot hold a lock file cannot hold the state either, and a put then says it cannot save."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            held = open(os.open(self.lock, os.O_RDONLY | os.O_CREAT, 0o600), "rb")   # flock needs no write access
        except OSError as err:
            LOG.warning("%s: cannot make the state file's lock (%s)", self.lock, err.strerror)
            return None
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.close()
            raise StateFileInUse(f"error: {self.path} is in use by another controller, which holds {self.lock}; "
                                 "give this one its own [qos] state_file, or stop the other (an active/standby "
                                 "pair sets [qos] standby = true on both)") from None
        except OSError as err:
            held.close()
            LOG.warning("%s: cannot lock the state file (%s)", self.lock, err.strerror)
            return None
        return held

    def read(self) -> tuple[str, Any, int]:
        """(SAVED_ABSENT, None, 0), (SAVED_CLEARED, None, revision) or (SAVED_POLICY, document, revision); a
        PolicyError names a damaged file, an OSError one that cannot be read."""
        try:
            data = read_file(self.path, str(self.path))
        except FileNotFoundError:
            return SAVED_ABSENT, None, 0
        except OSError as err:
            raise OSError(f"{self.path}: cannot read the saved policy ({err.strerror})") from None
        return decode(data, str(self.path), "remove the file, or put the policy again")

    def write(self, document: Any, revision: int) -> None:
        """Save `document` (None: the policy was cleared) as `revision`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w") as out:
                out.write(encode(document, revision))
                out.flush()
                os.fsync(out.fileno())
            tmp.replace(self.path)
        finally:
            tmp.unlink(missing_ok=True)


def encode(document: Any, revision: int) -> str:
    """A saved policy (None: cleared) and its revision, as the state file and a standby pair's OVSDB keep it."""
    return json.dumps({"policy": document, "revision": revision, "saved": time.time()})


def decode(data: bytes, where: str, fix: str) -> tuple[str, Any, int]:
    """(SAVED_CLEARED, None, revision) or (SAVED_POLICY, document, revision) of what `encode` made (one saved
    before revisions were kept is revision 0); a PolicyError naming `where` and saying `fix` for anything else."""
    saved = load_json(data, where)
    revision = saved.get("revision", 0) if isinstance(saved, dict) else None
    if not isinstance(saved, dict) or "policy" not in saved or not isinstance(saved["policy"], (dict, type(None))) \
            or type(revision) is not int or revision < 0:
        raise PolicyError(f"{where}: not a saved policy (expected {{\"policy\": {{...}} or null, \"revision\": N, "
                          f"\"saved\": TIME}}); {fix}")
    document = saved["policy"]
    return (SAVED_CLEARED, None, revision) if document is None else (SAVED_POLICY, document, revision)


def load(store: StateFile) -> PolicyLoaded:
    """What the store holds, as the core takes it (a file that cannot be read or used: why)."""
    try:
        saved, document, revision = store.read()
    except (OSError, PolicyError) as err:
        return PolicyLoaded(SAVED_ABSENT, error=str(err))
    return PolicyLoaded(saved, document, revision=revision)


def save(store: StateFile, document: Any, revision: int) -> PolicySaved:
    """Keep `document` (None: cleared) as `revision`, as the core takes the outcome."""
    try:
        store.write(document, revision)
    except OSError as err:
        return PolicySaved(f"{err}; make the state directory writable, or set [qos] state_file")
    return PolicySaved(None, revision)
