"""What each switch this controller owns holds of the policy in force: the record a change is answered
from (controller/core/keeper.py) and, in a cluster, the one this member publishes for the answers the
other members give. Kept up to date per event for the switches the event went to, since rebuilding it
from every switch after every event costs a large member more than its polls.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from controller.core.ha import Authority
from controller.core.switch import Switch


class Held:
    def __init__(self, authority: Authority):
        self.authority = authority
        self.record: dict[int, dict[str, Any]] = {}    # our switches → what they hold

    def owns(self, sw: Switch) -> bool:
        return sw.bridge is not None and self.authority.owns(sw.dp_id)

    def owned(self, switches: Iterable[Switch]) -> list[Switch]:
        return [sw for sw in switches if self.owns(sw)]

    def update(self, switches: Iterable[Switch], touched: list[Switch] | None) -> bool:
        """Bring the record up to date with the switches `touched` (None: every one of `switches`, and who
        owns which); whether it changed, or may have. A new record on a change: one already published stays
        as it was."""
        if touched is None:
            self.record = {sw.dp_id: _holds(sw) for sw in self.owned(switches)}
            return True
        record = self.record
        for sw in touched:
            entry = _holds(sw) if self.owns(sw) else None
            if entry != record.get(sw.dp_id):
                record = dict(record) if record is self.record else record
                if entry is None:
                    del record[sw.dp_id]
                else:
                    record[sw.dp_id] = entry
        changed, self.record = record is not self.record, record
        return changed


def _holds(sw: Switch) -> dict[str, Any]:
    return {"in_sync": sw.in_sync, "settled": sw.settled,
            "errors": sw.errors() if sw.settled and not sw.in_sync else {}}
