"""Keeping Python's cyclic garbage collector off the scrape path, and freed memory off the RSS.

Every scrape cycle replaces ~60 readings per node; the heap holds the inventory (30 000 pods at
1000 nodes) and the store. CPython's full collections re-scan all of it each time enough new
objects have survived, which at 1000 nodes cost ~300 µs per node per cycle — a third of the
cycle's CPU (measured with cProfile: the time lands in whatever allocates when GC triggers).

After each cycle we freeze the survivors (gc.freeze(): they move to a generation the collector
never scans; reference counting still frees them when they are dropped, which is how readings
and deleted pods die). Cyclic garbage that was frozen would never be collected, so every
``full_every`` seconds we unfreeze, collect everything once and freeze again.

Start-up (the first inventory list, the first bodies, TLS handshakes) leaves free memory inside
glibc's heap that it keeps rather than hands back, because live objects sit above it. After the
first ``trim_cycles`` cycles and after each full collection we ask glibc to return whole free
pages (``malloc_trim(0)``; ~1 ms at 50 nodes); elsewhere (musl, macOS) there is nothing to call
and nothing is done.
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable

TRIM_CYCLES = 3  # start-up's garbage is gone after the first cycles' readings are replaced


@functools.cache
def malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none."""
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (ImportError, OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


def trim_heap() -> bool:
    """Hand whole free pages of the C heap back to the system; False where that cannot be done."""
    trim = malloc_trim()
    if trim is None:
        return False
    trim()
    return True


class HeapFreezer:
    """Call ``after_cycle()`` once per scrape cycle."""

    def __init__(self, full_every: float = 600.0, trim_cycles: int = TRIM_CYCLES) -> None:
        self.full_every = full_every
        self._last_full = time.monotonic()
        self.full_collections = 0
        self.cycles = 0
        self.trim_cycles = trim_cycles
        self.trims = 0  # times freed memory was handed back to the system

    def after_cycle(self) -> None:
        now = time.monotonic()
        self.cycles += 1
        full = now - self._last_full >= self.full_every
        if full:
            gc.unfreeze()
            gc.collect()
            self._last_full = now
            self.full_collections += 1
        gc.freeze()
        if full or self.cycles <= self.trim_cycles:
            self.trim()

    def trim(self) -> bool:
        """:func:`trim_heap`, counted."""
        trimmed = trim_heap()
        self.trims += trimmed
        return trimmed
