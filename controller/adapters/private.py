"""What the controller takes from python-ovs's private insides, in one place, each with why: it
offers no public way to it. tests/unit/test_private.py fails when an upgrade takes one away.
"""
from __future__ import annotations

from typing import Any

import ovs.timeval


def session(idl: Any) -> Any:
    """An IDL's JSON-RPC session (ovs.jsonrpc.Session): whether it is connected, its reconnections (seqno), its
    back-off and probe interval. python-ovs's Idl keeps it in `_session`."""
    return idl._session


def silent_for(idl: Any) -> float:
    """Seconds since the IDL's session last received anything (an update, a reply, an echo's answer): the
    reconnect state machine of its session keeps when, in python-ovs's monotonic milliseconds."""
    session_ = idl._session
    stats = session_.reconnect.get_stats(ovs.timeval.msec())
    silent: float = max(0.0, (ovs.timeval.msec() - stats.last_activity) / 1000)
    return silent


def steal_lock(idl: Any) -> None:
    """RFC 7047's "steal" of the IDL's lock. python-ovs's Idl asks only "lock"; its private request builder
    takes the method, and the reply is matched by `_lock_request_id`. Our own request first withdrawn:
    ovsdb-server refuses a second request for a lock a session already waits for."""
    idl._Idl__do_send_lock_request("unlock")
    idl._lock_request_id = idl._Idl__do_send_lock_request("steal")


def table_name(row: Any) -> str:
    """The table of a row the IDL notifies of (ovs.db.idl.Row keeps it in `_table`)."""
    name: str = row._table.name
    return name


def changed_columns(updates: Any) -> set[str]:
    """The columns an update changed: python-ovs passes their old values as a Row, whose values are `_data`."""
    return set(updates._data)


def referenced(row: Any, column: str) -> set[Any]:
    """The uuids a reference column names in a row, or in an update's old values, read from its raw datum:
    python-ovs's conversion to rows leaves out a row that is gone, and an orphan's is what we look for."""
    datum = row._data.get(column)
    if datum is None:
        return set()
    return {atom.value for atom in (datum.values.values() if datum.type.is_map() else datum.values)}
