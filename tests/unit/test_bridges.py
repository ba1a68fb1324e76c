"""The idle bridges' plan, batches and ovs-vsctl commands (topo/net/bridges.py), without OVS."""
from topo.net.bridges import IdleBridge, batches, create_commands, delete_commands, plan


def test_plan_splits_the_ports_into_bridges_with_their_own_datapath_ids():
    bridges = plan(45, 20, prefix="s", first_dp_id=0x10)
    assert bridges == [IdleBridge("s0", 0x10, tuple(range(1, 21))), IdleBridge("s1", 0x11, tuple(range(1, 21))),
                       IdleBridge("s2", 0x12, (1, 2, 3, 4, 5))]
    assert plan(0, 20) == []


def test_batches_hold_whole_bridges_up_to_the_port_budget():
    bridges = plan(250 * 20, 20)
    done = batches(bridges, 1000)
    assert [len(b) for b in done] == [50] * 5
    assert [b for batch in done for b in batch] == bridges          # all, in order, once
    assert [len(b) for b in batches(plan(30, 20), 10)] == [1, 1]    # a bridge bigger than the budget goes alone
    assert batches([], 1000) == []


def test_create_commands_link_rows_by_id_and_never_look_one_up_by_name():
    (bridge,) = plan(2, 2, prefix="x", first_dp_id=0xC1)
    args = create_commands([bridge], ["tcp:127.0.0.1:6653", "tcp:127.0.0.1:6654"])
    commands = [c for c in " ".join(["", *args]).split(" -- ") if c]
    assert all(c.startswith("--id=@") and " create " in c or c.startswith("add open_vswitch . bridges @")
               for c in commands), commands
    ids = [c.split()[0] for c in commands if c.startswith("--id=")]
    assert len(ids) == len(set(ids))                                 # ovs-vsctl refuses an @id named twice
    assert '--id=@x0.c1 create controller target="tcp:127.0.0.1:6654"' in commands
    assert "--id=@x0p2.i create interface name=x0p2 type=internal ofport_request=2" in commands
    assert "--id=@x0.i create interface name=x0 type=internal" in commands   # the bridge's local port
    bridge_row = next(c for c in commands if " create bridge " in c)
    assert "other_config:datapath-id=00000000000000c1" in bridge_row and "fail_mode=secure" in bridge_row
    assert "controller=[@x0.c0,@x0.c1]" in bridge_row and "ports=[@x0.p,@x0p1.p,@x0p2.p]" in bridge_row


def test_delete_commands():
    assert delete_commands(["a", "b"]) == ["--", "--if-exists", "del-br", "a", "--", "--if-exists", "del-br", "b"]
