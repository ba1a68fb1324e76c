"""The policy in force, kept on disk so a restarted controller carries on with it instead of
starting bare (and, with secure fail-mode switches, dropping traffic until someone puts it again).

Written whole or not at all (temporary file, fsync, rename), whenever a policy is put or cleared.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from controller.core.document import load_json

ABSENT = "absent"      # never saved: the controller starts without a policy and leaves switches alone
CLEARED = "cleared"    # the last word was DELETE /qos/v1/policy: nothing of ours belongs on the switches
POLICY = "policy"


def read(path: Path) -> tuple[str, Any]:
    """(ABSENT, None), (CLEARED, None) or (POLICY, document); a PolicyError names a damaged file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ABSENT, None
    except OSError as err:
        raise OSError(f"{path}: cannot read the saved policy ({err.strerror})") from None
    saved = load_json(data, str(path))
    document = saved.get("policy") if isinstance(saved, dict) else None
    return (CLEARED, None) if document is None else (POLICY, document)


def write(path: Path, document: Any) -> None:
    """Save `document` (None: the policy was cleared)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as out:
        json.dump({"policy": document, "saved": time.time()}, out)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)
