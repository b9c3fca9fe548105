"""Resource history: node, pod and container usage over the last ``--history`` (default 10m).

Kept compact, because it lives beside the :class:`~kcms.store.resource.ResourceStore` in the
serving process and must stay within metrics-server's memory per node (0.40 MB) at 1000 nodes
x 30 pods. What one node holds (``_NodeHistory``):

- ``times``: an ``array('d')`` ring of ``capacity`` scrape timestamps (the node's reading, or
  the newest container reading when the kubelet gave no node reading). The containers of one node
  are scraped together, so one timestamp ring serves the node and all its containers, and the
  containers of a pod align point by point.
- ``node``: an ``array('q')`` of ``2 * capacity`` int64: CPU usage in nanocores (slots
  ``0..capacity-1``) and memory working set in bytes (``capacity..2*capacity-1``).
- ``pods``: per pod a ``(container names, bytearray)`` tuple; the bytearray holds native int64s
  (read and written through a ``memoryview`` cast to ``'q'``), per container ``capacity`` CPU
  values then ``capacity`` memory values. A ``bytearray`` and a tuple of strings are not tracked by
  the cyclic garbage collector (an ``array`` is), so the 30 000 pods of a 1000-node cluster add no
  work to full collections (with arrays they added 60 000 tracked objects).

``-1`` marks "no value at that slot": a container that was not there yet, or a reading with no
usable rate (the first one of a container start: a new container, a restart, a counter reset —
the rate is exactly the one :class:`~kcms.store.resource.ResourceStore` serves, taken from the
same pair of readings). A point is served for a pod only at the slots where every one of its
containers has a value, as metrics-server serves a pod only when every container has a rate.

``capacity`` is ``ceil(history / resolution) + 2`` slots per object, whatever the scrape cadence:
a node scraped faster than the resolution keeps that many points, not more (bounded per object).
Retention and eviction:

- a point older than ``history`` (by the wall clock, against the kubelet's timestamp) is never
  served; its slot is overwritten by the ring;
- a pod missing from its node's newest scrape is dropped with its history (it was deleted, or
  moved: metrics-server forgets it the same way); a container missing from its pod's scrape too;
- a node whose newest point is older than ``history``, or (``present``) no longer in the
  inventory, is dropped by :meth:`HistoryStore.expire` (run after every scrape cycle);
- a reading no newer than the node's newest slot (the kubelet served the same reading again)
  adds no point.

The write (:meth:`HistoryStore.record`) runs on the store's hot path, once per node scrape, with
the pairs of readings the store has just chosen, updating the node's pod records in place (a new
record only for a new pod or a changed set of containers). A scrape the store took a column at a
time with the same series as the last one recorded (:meth:`HistoryStore.record_columns`) is written
from the decoder's columns: rates computed a column at a time, then only stores into the records.
Measured (``bench/history_store.py``, 1000 nodes x 30 pods x 2 containers, 10m at 15s): ~50 us per
node scrape (~0.9 us per container) and 0.052 MB per node, allocated whole on a pod's first scrape; process figures with and without
history in ``docs/history.md`` (``bench/resource_pipeline.py``).
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable, Iterator, Mapping
from operator import truediv
from typing import Any

from kcms.model import ContainerColumns, PodKey, PodPlaces, ResourcePoint
from kcms.sources.bounds import MAX_NANOCORES

# Per container of a pod: (last reading, previous reading usable for a rate, or None)
Pairs = Mapping[str, tuple[ResourcePoint, ResourcePoint | None]]
# A served point: (timestamp, cpu nanocores, memory bytes)
Point = tuple[float, int, int]

MIN_CAPACITY = 3


def _rate(last: ResourcePoint, prev: ResourcePoint | None) -> int:
    """CPU nanocores between two readings of one container start, -1 if there is no usable rate
    (the same rules as kcms.store.resource.pod_rates)."""
    if prev is None:
        return -1
    span = last.timestamp - prev.timestamp
    cpu = last.cpu_ns - prev.cpu_ns
    if span <= 0 or cpu < 0:
        return -1
    rate = cpu / span
    if rate > MAX_NANOCORES:
        return -1
    return int(rate)


def _layout(places: PodPlaces, kept: dict[PodKey, tuple[tuple[str, ...], bytearray]]) -> _Layout:
    """How :meth:`HistoryStore.record_columns` writes a decoder's columns into ``kept``: the getter
    that puts the series in pod order (the decoder's, ``ContainerColumns.places``), each pod's
    record, and its number of series. Holds no name of its own (new strings per node would cost
    ~8 kB a node)."""
    of = places.of
    return places.in_pod_order, [kept[key][1] for key in of], [len(names) for _, names in of.values()]


# _layout(): series in pod order, each pod's record, its number of series
_Layout = tuple[Callable[[list[int]], tuple[int, ...]], list[bytearray], list[int]]


class _NodeHistory:
    __slots__ = ("count", "head", "layout", "node", "pods", "series", "times")

    def __init__(self, capacity: int) -> None:
        self.times = array("d", bytes(8 * capacity))
        self.node = array("q", [-1]) * (2 * capacity)
        self.head = 0  # the slot the next scrape is written to
        self.count = 0  # slots written (at most capacity)
        self.pods: dict[PodKey, tuple[tuple[str, ...], bytearray]] = {}
        self.layout: object = None  # the store's token for the series ``pods`` was last written with
        self.series: _Layout | None = None  # _layout() of the columns of ``layout``

    def newest(self, capacity: int) -> float:
        return self.times[(self.head - 1) % capacity] if self.count else 0.0

    def slots(self, capacity: int, since: float) -> list[int]:
        """Slot indices oldest first whose timestamp is at or after ``since``."""
        times = self.times
        out = []
        for k in range(self.count, 0, -1):
            i = (self.head - k) % capacity
            if times[i] >= since:
                out.append(i)
        return out


class HistoryStore:
    """Usage of every node, pod and container over the last ``retention`` seconds."""

    def __init__(self, retention: float, resolution: float) -> None:
        if not retention > 0 or not resolution > 0:
            raise ValueError("retention and resolution must be positive")
        self.retention = retention
        self.resolution = resolution
        self.capacity = max(MIN_CAPACITY, math.ceil(retention / resolution) + 2)
        self._nodes: dict[str, _NodeHistory] = {}
        self._pod_node: dict[PodKey, str] = {}

    # -- writing (the store's hot path) ----------------------------------------------------------

    def record(
        self,
        node: str,
        last: ResourcePoint | None,
        prev: ResourcePoint | None,
        pods: Mapping[PodKey, Pairs],
        layout: object = None,
    ) -> None:
        """One scrape of ``node``, as the store keeps it: the node's readings and, per pod and
        container, the last reading and the one its rate is taken from. Pods (and containers) not
        in ``pods`` are forgotten. ``layout``: the store's token for these series (see
        :meth:`record_columns`)."""
        if last is not None:
            ts = last.timestamp
        else:
            ts = max((p[0].timestamp for pairs in pods.values() for p in pairs.values()), default=0.0)
            if ts <= 0.0:
                return
        cap = self.capacity
        h = self._nodes.get(node)
        if h is None:
            h = self._nodes[node] = _NodeHistory(cap)
        slot = self._next_slot(h, ts, last, prev)
        if slot is None:
            return
        kept = h.pods  # updated in place: no new dict per scrape
        pod_node = self._pod_node
        step = 2 * cap
        most = MAX_NANOCORES
        for key, pairs in pods.items():
            rec = kept.get(key)
            names = tuple(pairs)
            if rec is None or rec[0] != names:
                rec = kept[key] = self._reshaped(rec, names)
                pod_node[key] = node
            data: Any = memoryview(rec[1]).cast("q")  # int64 view; released at the next assignment
            base = slot
            for cur, before in pairs.values():
                # _rate() inlined: this runs for every container of every scrape.
                cpu = -1
                if before is not None:
                    span = cur.timestamp - before.timestamp
                    delta = cur.cpu_ns - before.cpu_ns
                    if span > 0 and delta >= 0:
                        rate = delta / span
                        if rate <= most:
                            cpu = int(rate)
                data[base] = cpu
                data[base + cap] = cur.memory
                base += step
        if len(kept) != len(pods):  # pods gone since the last scrape (every pod here is in kept)
            for key in [k for k in kept if k not in pods]:
                del kept[key]
                if pod_node.get(key) == node:
                    del pod_node[key]
        h.layout = layout
        h.series = None

    def record_columns(
        self,
        node: str,
        last: ResourcePoint | None,
        prev: ResourcePoint | None,
        layout: object,
        columns: ContainerColumns,
        deltas: list[int],
        spans: list[float],
    ) -> bool:
        """:meth:`record` for a scrape the store took a column at a time
        (``ResourceStore._store_columns``): ``columns`` holds the same series, in the same order,
        as the last scrape recorded with ``layout``, and per series the CPU counter's rise over the
        seconds since the reading before (``deltas``, ``spans``: every span > 0, every rise >= 0).
        False, with nothing written, when :meth:`record` must do it: another layout recorded last,
        or a rate over MAX_NANOCORES. The pods' records are written in place; no pod is added or
        dropped. ~27 us against ~77 for :meth:`record`, a node of 60 containers in process."""
        h = self._nodes.get(node)
        if h is None or layout is None or h.layout is not layout:
            return False
        rates = list(map(truediv, deltas, spans))
        if max(rates) > MAX_NANOCORES:
            return False
        ts = last.timestamp if last is not None else max(columns.times)
        slot = self._next_slot(h, ts, last, prev)
        if slot is None:
            return True  # no new point, as record()
        if h.series is None:
            h.series = _layout(columns.places, h.pods)
        in_pod_order, records, sizes = h.series
        cap = self.capacity
        cpu = in_pod_order(list(map(int, rates)))
        memory = in_pod_order(columns.memory)
        step = 2 * cap
        i = 0
        for raw, n in zip(records, sizes, strict=True):
            data: Any = memoryview(raw).cast("q")
            base = slot
            for j in range(i, i + n):
                data[base] = cpu[j]
                data[base + cap] = memory[j]
                base += step
            i += n
        return True

    def _next_slot(
        self, h: _NodeHistory, ts: float, last: ResourcePoint | None, prev: ResourcePoint | None
    ) -> int | None:
        """Take the next slot of ``h`` for a scrape at ``ts`` and write its timestamp and node point
        there; return it (the caller writes the pods' values into it). None, with nothing written,
        when ``ts`` is no newer than the newest slot: the same reading again (or an older one)."""
        cap = self.capacity
        if h.count and ts <= h.times[(h.head - 1) % cap]:
            return None
        slot = h.head
        h.head = (slot + 1) % cap
        if h.count < cap:
            h.count += 1
        h.times[slot] = ts
        nd = h.node
        if last is None:
            nd[slot] = nd[cap + slot] = -1
        else:
            nd[slot] = _rate(last, prev)
            nd[cap + slot] = last.memory
        return slot

    def _reshaped(
        self, rec: tuple[tuple[str, ...], bytearray] | None, names: tuple[str, ...]
    ) -> tuple[tuple[str, ...], bytearray]:
        """A pod's record for a new set of containers: the columns of the ones kept, -1 for new."""
        span = 16 * self.capacity  # bytes of one container: capacity CPU + capacity memory int64s
        data = bytearray(b"\xff" * (span * len(names)))  # all bits set: int64 -1
        if rec is not None:
            old_names, old = rec
            for j, name in enumerate(names):
                if name in old_names:
                    i = old_names.index(name)
                    data[j * span : (j + 1) * span] = old[i * span : (i + 1) * span]
        return names, data

    def forget_node(self, node: str) -> None:
        h = self._nodes.pop(node, None)
        if h is None:
            return
        for key in h.pods:
            if self._pod_node.get(key) == node:
                del self._pod_node[key]

    def expire(self, now: float | None = None, present: Callable[[str], object] | None = None) -> list[str]:
        """Drop nodes with no point within the retention, or (``present``) gone from the
        inventory; return their names. ``now``: wall-clock seconds."""
        horizon = (time.time() if now is None else now) - self.retention
        cap = self.capacity
        gone = [
            n
            for n, h in self._nodes.items()
            if h.newest(cap) < horizon or (present is not None and not present(n))
        ]
        for node in gone:
            self.forget_node(node)
        return gone

    # -- reading ---------------------------------------------------------------------------------

    def since(self, since: float | None, now: float | None = None) -> float:
        """The oldest timestamp served for a look-back of ``since`` seconds (None: all kept)."""
        now = time.time() if now is None else now
        back = self.retention if since is None else min(since, self.retention)
        return now - back

    def node_points(self, node: str, oldest: float) -> list[Point]:
        """The node's points at or after ``oldest`` (wall clock), oldest first."""
        h = self._nodes.get(node)
        if h is None:
            return []
        cap = self.capacity
        nd, times = h.node, h.times
        return [(times[i], nd[i], nd[cap + i]) for i in h.slots(cap, oldest) if nd[i] >= 0]

    def pod_points(
        self, namespace: str, name: str, oldest: float
    ) -> tuple[tuple[str, ...], list[tuple[float, list[tuple[int, int]]]]]:
        """A pod's container names and its points at or after ``oldest``, oldest first: per point
        the timestamp and ``(cpu, memory)`` per container, only where every container has one."""
        key = (namespace, name)
        node = self._pod_node.get(key)
        h = self._nodes.get(node) if node is not None else None
        rec = h.pods.get(key) if h is not None else None
        if h is None or rec is None:
            return (), []
        cap = self.capacity
        span = 2 * cap
        names, raw = rec
        data: Any = memoryview(raw).cast("q")
        n = len(names)
        out = []
        for i in h.slots(cap, oldest):
            values = []
            for j in range(n):
                cpu = data[j * span + i]
                if cpu < 0:
                    break
                values.append((cpu, data[j * span + cap + i]))
            if len(values) == n and n:
                out.append((h.times[i], values))
        return names, out

    def pod_node(self, namespace: str, name: str) -> str:
        return self._pod_node.get((namespace, name), "")

    def node_names(self) -> list[str]:
        return list(self._nodes)

    def pod_keys(self) -> Iterator[PodKey]:
        return iter(list(self._pod_node))

    def stats(self) -> tuple[int, int, int]:
        """(nodes, pods, stored slots) — stored slots are bounded by capacity x objects."""
        slots = 0
        for h in self._nodes.values():
            slots += h.count * (1 + sum(len(names) for names, _ in h.pods.values()))
        return len(self._nodes), len(self._pod_node), slots
