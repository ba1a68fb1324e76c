"""The policy in force, kept on disk so a restarted controller carries on with it instead of
starting bare (and, with secure fail-mode switches, dropping traffic until someone puts it again).

Written whole or not at all (temporary file, fsync, rename), whenever a policy is put or cleared, as
{"policy": <document or null>, "saved": <unix time>}. A file that is not exactly that (empty, cut
short, binary, or JSON of another shape) is refused with one line: the controller then starts without
a policy and leaves the switches as they are, never clearing them on a misreading.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from controller.core.document import load_json, read_file
from controller.core.errors import PolicyError
from controller.core.events import PolicyLoaded
from controller.core.keeper import SAVED_ABSENT, SAVED_CLEARED, SAVED_POLICY


class StateFile:
    def __init__(self, path: Path):
        self.path = path

    def read(self) -> tuple[str, Any]:
        """(SAVED_ABSENT, None), (SAVED_CLEARED, None) or (SAVED_POLICY, document); a PolicyError names
        a damaged file, an OSError one that cannot be read."""
        try:
            data = read_file(self.path, str(self.path))
        except FileNotFoundError:
            return SAVED_ABSENT, None
        except OSError as err:
            raise OSError(f"{self.path}: cannot read the saved policy ({err.strerror})") from None
        saved = load_json(data, str(self.path))
        if not isinstance(saved, dict) or "policy" not in saved or not isinstance(saved["policy"], (dict, type(None))):
            raise PolicyError(f"{self.path}: not a saved policy (expected {{\"policy\": {{...}} or null, \"saved\": "
                              "TIME}); remove the file, or put the policy again")
        document = saved["policy"]
        return (SAVED_CLEARED, None) if document is None else (SAVED_POLICY, document)

    def write(self, document: Any) -> None:
        """Save `document` (None: the policy was cleared)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w") as out:
                json.dump({"policy": document, "saved": time.time()}, out)
                out.flush()
                os.fsync(out.fileno())
            tmp.replace(self.path)
        finally:
            tmp.unlink(missing_ok=True)


def load(store: StateFile) -> PolicyLoaded:
    """What the store holds, as the core takes it (a file that cannot be read or used: why)."""
    try:
        saved, document = store.read()
    except (OSError, PolicyError) as err:
        return PolicyLoaded(SAVED_ABSENT, error=str(err))
    return PolicyLoaded(saved, document)
