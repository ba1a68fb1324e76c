"""The heap keeper: a slow full collection freezes what it found alive; a thaw hands it back."""
import gc
import weakref

import pytest

from controller.adapters.heap import Heap


class Node:
    def __init__(self):
        self.other = None


@pytest.fixture
def heap():
    gc.collect()
    gc.unfreeze()
    keeper = Heap(slow=0.0)
    keeper.install()
    yield keeper
    keeper.uninstall()
    gc.unfreeze()


def test_a_slow_full_collection_freezes_what_it_found_alive_and_a_young_one_does_not(heap):
    alive = [Node() for _ in range(50_000)]
    gc.collect(0)
    assert gc.get_freeze_count() == 0 and heap.frozen_after is None
    gc.collect()
    assert gc.get_freeze_count() >= len(alive) and heap.frozen_after is not None
    before = gc.get_freeze_count()
    more = [Node() for _ in range(1000)]
    gc.collect()            # walks only what was made since, and freezes that too
    assert gc.get_freeze_count() >= before + len(more)


def test_a_burst_of_objects_that_die_young_sets_off_no_collection_and_uninstall_restores_the_default(heap):
    before = gc.get_stats()[0]["collections"]
    burst = [Node() for _ in range(5_000)]   # alive together a moment, as a large reply's handling makes them
    del burst
    assert gc.get_stats()[0]["collections"] == before
    heap.uninstall()
    try:
        assert len([Node() for _ in range(5_000)]) and gc.get_stats()[0]["collections"] > before
    finally:
        heap.install()


def test_a_fast_full_collection_freezes_nothing():
    gc.collect()
    gc.unfreeze()
    keeper = Heap(slow=10.0)
    keeper.install()
    try:
        gc.collect()
        assert gc.get_freeze_count() == 0 and keeper.frozen_after is None
    finally:
        keeper.uninstall()


def test_a_frozen_cycle_dropped_later_is_freed_after_the_thaw(heap):
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    gc.collect()
    del a, b
    gc.collect()
    assert gone() is not None     # frozen: the collector does not look at it
    heap.thaw()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None


def test_an_object_frozen_and_dropped_without_a_cycle_is_freed_at_once(heap):
    lone = Node()
    gone = weakref.ref(lone)
    gc.collect()
    assert gc.get_freeze_count() > 0
    del lone
    assert gone() is None
