"""controller/adapters/private.py against the installed python-ovs: each private inside the controller uses is
still there, on real objects (an IDL that never connects)."""
import uuid

import ovs.db.idl

from controller.adapters import private

SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"


def idl() -> ovs.db.idl.Idl:
    helper = ovs.db.idl.SchemaHelper(location=SCHEMA)
    helper.register_all()
    return ovs.db.idl.Idl("unix:/nonexistent/db.sock", helper)


def test_python_ovs_still_has_what_the_ovsdb_adapter_takes_from_it():
    made = idl()
    session = private.session(made)
    assert not session.is_connected() and isinstance(session.get_seqno(), int)
    session.reconnect.set_probe_interval(2000)
    assert session.reconnect.get_probe_interval() == 2000
    assert private.silent_for(made) >= 0.0         # since it was made: it never heard anything
    assert callable(made._Idl__do_send_lock_request) and hasattr(made, "_lock_request_id")
    made.set_lock("test_lock")
    private.steal_lock(made)              # unconnected, nothing is sent ...
    assert made._lock_request_id is None  # ... so no reply is awaited
    row = ovs.db.idl.Row(made, made.tables["Bridge"], uuid.uuid4(), {})
    assert private.table_name(row) == "Bridge" and private.changed_columns(row) == set()
    made.close()
