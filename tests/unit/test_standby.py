"""Active/standby (controller/qos_app.py): the controller without its owner's OVSDB lock is the switches'
OpenFlow slave, changes nothing and refuses changes; when the lock comes to it, it becomes master, takes
the saved policy and adopts what the active one programmed, without rolling it back."""
import dataclasses
from types import SimpleNamespace

import pytest

from controller import qos_app
from controller.adapters.rest import Busy
from tests.unit.fakes import flood, mode, up


@pytest.fixture
def pair(net):
    """The study's switches under an active controller that has programmed auto's reservation, and a
    standby of the same owner connected to them."""
    up(net, "auto")
    for _ in range(2):
        flood(net, 2.5e6, 2.5e6)
        net.app.poll()
    assert mode(net) == "reserve"
    net.ovsdb.has_lock = False                       # the active one holds the lock
    standby = net.app.another()
    for dp in (net.s1, net.s2):
        dp.sent.clear()
        standby.connect(dp)
    return SimpleNamespace(net=net, standby=standby)


def test_the_standby_is_a_slave_that_changes_nothing_and_refuses_changes(pair):
    standby, s1 = pair.standby, pair.net.s1
    assert standby.role == "standby" and s1.role == s1.ofproto.OFPCR_ROLE_SLAVE
    assert s1.generation_id == 1                     # the active one's: a slave's must not be stale either
    standby.poll()
    assert [type(m).__name__ for m in s1.sent] == ["OFPRoleRequest", "OFPMeterFeaturesStatsRequest",
                                                   "OFPMeterConfigStatsRequest", "OFPFlowStatsRequest"]
    _, error = standby.request("clear_policy")
    assert isinstance(error, Busy) and "standby" in str(error)
    status, _ = standby.request("status")
    assert status["role"] == "standby" and standby.snapshot.role == "standby"


def test_the_standby_takes_over_when_the_lock_is_its_and_keeps_what_the_active_one_programmed(pair):
    standby, net = pair.standby, pair.net
    pair.net.ovsdb.has_lock = True                   # the active one died: its lock is released to us
    standby.posted.append(qos_app.EventRemotes({"fake": True}, [], locked=True))
    standby.settle()
    assert standby.role == "active" and net.s1.role == net.s1.ofproto.OFPCR_ROLE_MASTER
    assert net.s1.generation_id == 2 == net.ovsdb.generation_ids   # newer than the dead one's, kept in OVSDB
    assert standby.policy.name == "auto"             # the policy the active one saved
    net.app = standby
    for _ in range(3):                               # the flood goes on: nothing rolled back and put again
        flood(net, 2.5e6, 2.5e6)
        standby.poll()
    assert mode(net) == "reserve" and net.s1.flow_mods() == [] and not standby.decisions
    for _ in range(6):                               # calm: its own rollback, then a new episode is answered
        standby.poll()
    assert mode(net) == "fifo"
    for _ in range(2):
        flood(net, 2.5e6, 2.5e6)
        standby.poll()
    assert [d["action"] for d in standby.decisions] == ["rollback", "program"] and mode(net) == "reserve"


def test_an_active_controller_whose_lock_another_took_stands_down(pair):
    standby, net = pair.standby, pair.net
    net.ovsdb.has_lock = True
    standby.posted.append(qos_app.EventRemotes({"fake": True}, [], locked=True))
    standby.settle()
    standby.settings = dataclasses.replace(standby.settings, standby=True)
    standby.posted.append(qos_app.EventRemotes({"fake": True}, [], locked=False, taken=True))
    standby.settle()
    net.s1.sent.clear()
    standby.poll()
    assert standby.role == "standby" and net.s1.role == net.s1.ofproto.OFPCR_ROLE_SLAVE and net.s1.sent == []
