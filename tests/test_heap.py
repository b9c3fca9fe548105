"""HeapFreezer: survivors frozen after a cycle; a periodic full collection still frees cycles."""

import gc
import os
import platform
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


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_freed_memory_goes_back_to_the_system_after_the_first_cycles_and_full_collections():
    gc.unfreeze()
    try:
        freezer = HeapFreezer(full_every=3600.0, trim_cycles=2)
        if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            assert freezer.trim() is False  # nothing to call: nothing done, nothing raised
            return
        # 60 MB of 1 kB blocks in the C heap with a live block above them (as start-up leaves
        # the heap): glibc keeps the freed blocks in the process unless asked to trim.
        blocks = [bytes(1000) + bytes([i % 256]) for i in range(60_000)]
        above = bytes(2000) + b"!"
        before = _rss()
        del blocks
        assert _rss() > before - (30 << 20)  # still held after free()
        freezer.after_cycle()
        assert freezer.trims == 1
        assert _rss() < before - (30 << 20)  # handed back: 60 MB less
        freezer.after_cycle()
        freezer.after_cycle()  # past trim_cycles: no more trims...
        assert freezer.trims == 2
        freezer.full_every = 0.0
        freezer.after_cycle()  # ...except after a full collection
        assert (freezer.trims, freezer.full_collections) == (3, 1)
        assert above
    finally:
        gc.unfreeze()
