"""The main study's --fault SECONDS under --controllers N: the member that owns the bottleneck's switch killed
(kill -9, as a crash) that long into the traffic, to see what TCP gets through the failover, and how long
until another member masters the switch, as the members' statuses say. The member is started again once the
traffic is over, so that the next run starts with the whole cluster."""
from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

from topo.harness.cluster import ClusterClient
from topo.harness.controller import ControllerError
from topo.harness.launch import note

POLL_SECONDS = 0.05
REMASTER_SECONDS = 30.0     # past this, the switch is reported as not mastered again


class Fault:
    def __init__(self, client: ClusterClient, dp_id: str, after: float, label: str) -> None:
        self.client, self.dp_id, self.after, self.label = client, dp_id, after, label
        self.killed: tuple[str, float] | None = None          # the member, and when (time.time())
        self.remastered: tuple[str, float] | None = None      # the member that masters the switch now, and when
        self._thread = threading.Thread(target=self._run, name="fault", daemon=True)

    def __enter__(self) -> Fault:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._thread.join()
        if self.killed is not None:
            self.client.revive()

    def _run(self) -> None:
        time.sleep(max(0.0, self._start + self.after - time.monotonic()))
        try:
            owner = self.client.status()["switches"].get(self.dp_id, {}).get("member")
            if owner is None:
                note(f"{self.label}: --fault: no member masters switch {self.dp_id}; nothing killed")
                return
            self.client.kill(owner)
            self.killed = (owner, time.time())
            deadline = time.monotonic() + REMASTER_SECONDS
            while time.monotonic() < deadline:
                member = self.client.status()["switches"].get(self.dp_id, {}).get("member")
                if member is not None and member != owner:
                    self.remastered = (member, time.time())
                    break
                time.sleep(POLL_SECONDS)
        except ControllerError as err:
            note(f"{self.label}: --fault: {err}")

    def result(self, t0: float) -> dict[str, Any] | None:
        """What happened, times in seconds from `t0` (TCP's start): for summary.json."""
        if self.killed is None:
            return None
        member, at = self.killed
        return {"member": member, "dp_id": self.dp_id, "killed_s": round(at - t0, 3),
                "mastered_by": self.remastered[0] if self.remastered else None,
                "remaster_seconds": round(self.remastered[1] - at, 3) if self.remastered else None}
