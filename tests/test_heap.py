"""HeapFreezer: survivors frozen after a cycle; a periodic full collection still frees cycles."""

import gc
import weakref

from kcms.heap import HeapFreezer


class Node:
    def __init__(self) -> None:
        self.other: object = None


def test_freeze_then_periodic_full_collection_frees_frozen_cycles():
    gc.unfreeze()
    try:
        freezer = HeapFreezer(full_every=3600.0)
        a, b = Node(), Node()
        a.other, b.other = b, a  # a reference cycle
        probe = weakref.ref(a)
        freezer.after_cycle()
        assert gc.get_freeze_count() > 0
        del a, b
        gc.collect()
        assert probe() is not None  # frozen: the collector does not look at it
        freezer.full_every = 0.0
        freezer.after_cycle()  # the periodic full collection
        assert probe() is None
        assert freezer.full_collections == 1
        assert gc.get_freeze_count() > 0  # and what survived is frozen again
    finally:
        gc.unfreeze()
