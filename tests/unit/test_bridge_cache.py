"""controller/adapters/ovsdb.py's BridgeCache: a bridge is read again only when a row it was read from changes."""
from controller.adapters.ovsdb_replica import BridgeCache
from controller.core.bridges import BridgeInfo

# datapath id → (its Bridge row, its Port and Interface rows); rows are their uuids
SITE = {dp: (f"br{dp}", [f"port{dp}.{p}" for p in (1, 2)] + [f"iface{dp}.{p}" for p in (1, 2)]) for dp in (1, 2, 3)}


def reader(site, reads):
    def read(dp_id):
        reads.append(dp_id)
        if dp_id not in site:
            return None, []
        bridge, rows = site[dp_id]
        return BridgeInfo(bridge, "netdev", {1: f"{bridge}p1"}), [bridge, *rows]
    return read


def test_a_change_to_one_bridges_rows_reads_that_bridge_again_and_no_other():
    cache, reads = BridgeCache(), []
    read = reader(SITE, reads)
    for dp in (1, 2, 3, 1, 2, 3):
        cache.get(dp, read)
    assert reads == [1, 2, 3]
    cache.forget({"iface2.1"}, renumbered=False)        # an interface of bridge 2 numbered
    for dp in (1, 2, 3):
        cache.get(dp, read)
    assert reads == [1, 2, 3, 2]
    assert cache.reads == {1: 1, 2: 2, 3: 1}
    cache.forget({"br3", "port1.2"}, renumbered=False)
    for dp in (1, 2, 3):
        cache.get(dp, read)
    assert reads == [1, 2, 3, 2, 1, 3]


def test_a_bridge_joining_reads_no_other_but_a_datapath_that_had_no_bridge_is_looked_for_again():
    site = dict(SITE)
    cache, reads = BridgeCache(), []
    read = reader(site, reads)
    for dp in (1, 2, 3, 4):
        cache.get(dp, read)
    assert cache.get(4, read) is None
    site[4] = ("br4", ["port4.1", "iface4.1"])          # made: a Bridge row created, others untouched
    cache.forget({"br4", "port4.1", "iface4.1"}, renumbered=True)
    assert cache.get(4, read) is not None
    for dp in (1, 2, 3):
        cache.get(dp, read)
    assert reads == [1, 2, 3, 4, 4]


def test_a_rows_readers_are_forgotten_with_the_reading_and_clear_forgets_everything():
    cache, reads = BridgeCache(), []
    read = reader(SITE, reads)
    cache.get(1, read)
    cache.forget({"br1"}, renumbered=False)
    cache.get(1, read)
    cache.forget({"port1.1"}, renumbered=False)
    cache.forget({"port1.1"}, renumbered=False)          # the reading made since is dropped once, not twice
    cache.get(1, read)
    assert reads == [1, 1, 1]
    cache.forget({"br2"}, renumbered=True)              # nothing read from it, and every datapath had a bridge
    cache.get(1, read)
    assert reads == [1, 1, 1]
    cache.forget({"iface1.2"}, renumbered=False)
    assert not cache.readings and not cache._readers    # no row kept for a reading that is gone
    cache.get(1, read)
    cache.clear()
    cache.get(1, read)
    assert reads == [1, 1, 1, 1, 1]
