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
- ``data``: one ``bytearray`` of native int64s (read and written through a ``memoryview`` cast
  to ``'q'``) holding every container's values, a row per slot: row ``i`` is the CPU of the node's
  ``n`` containers, then their memory, containers in pod order. ``pods`` maps each pod to its
  container names and the index of its first container in a row. A scrape is written as two slice
  assignments of a row (its containers' CPU, then their memory), not container by container. A
  ``bytearray`` and tuples of strings and ints are not tracked by the cyclic garbage collector
  (an ``array`` is), so the 30 000 pods of a 1000-node cluster add no work to full collections.

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
  moved: metrics-server forgets it the same way); a container missing from its pod's scrape too
  (a scrape with another set of pods or containers lays the node's rows out again, copying the
  columns of the containers kept);
- a node whose newest point is older than ``history``, or (``present``) no longer in the
  inventory, is dropped by :meth:`HistoryStore.expire` (run after every scrape cycle);
- a reading no newer than the node's newest slot (the kubelet served the same reading again)
  adds no point.

The write (:meth:`HistoryStore.record`) runs on the store's hot path, once per node scrape, with
the pairs of readings the store has just chosen, filling one row (the node's rows are laid out
again only for a new pod or a changed set of containers). A scrape the store took a column at a
time with the same series as the last one recorded (:meth:`HistoryStore.record_columns`) is written
from the decoder's columns: rates computed a column at a time and written into the row in its
order by one call of C (``put_row``, kcms/store/_columns.c; Python's two slice stores where that
is not built; a node of 60 containers, in process: 19-30 us a call with the two slices, against
40-59 when written container by container into per-pod records, the same noisy hour).
Measured (``bench/history_store.py``, 1000 nodes x 30 pods x 2 containers, 10m at 15s):
:meth:`HistoryStore.record` 65-73 us per node scrape (76-78 with per-pod records, same hour) and
0.0505 MB per node (0.0521), allocated whole when a node's set of pods changes; process figures
with and without history in ``docs/history.md`` (``bench/resource_pipeline.py``).
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kcms.model import ContainerColumns, PodKey, PodPlaces, ResourcePoint
from kcms.sources.bounds import MAX_NANOCORES
from kcms.store.columns import Rates
from kcms.store.columns import put_row as _put_row

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


def _row_order(places: PodPlaces, kept: dict[PodKey, tuple[tuple[str, ...], int]]) -> tuple[int, ...]:
    """Which of a decoder's columns (``ContainerColumns``, the series in the body's order) each
    container of the node's rows takes, row index -> column index: the decoder's own pod order
    (``places.order``) when the rows hold the pods in that order (the usual case: both were laid
    out from the same scrape), else that order rearranged to the rows'."""
    of, order = places.of, places.order
    if all(kept[key][1] == at for key, (at, _) in of.items()):
        return order
    # rows in another pod order: row index -> index in pod order -> column index
    source = [0] * sum(len(names) for names in (rec[0] for rec in kept.values()))
    for key, (at, names) in of.items():
        first = kept[key][1]
        for j in range(len(names)):
            source[first + j] = order[at + j]
    return tuple(source)


class _NodeHistory:
    __slots__ = ("count", "data", "head", "layout", "n", "node", "order", "pods", "times")

    def __init__(self, capacity: int) -> None:
        self.times = array("d", bytes(8 * capacity))
        self.node = array("q", [-1]) * (2 * capacity)
        self.head = 0  # the slot the next scrape is written to
        self.count = 0  # slots written (at most capacity)
        # pod -> (container names, index of its first container in a row)
        self.pods: dict[PodKey, tuple[tuple[str, ...], int]] = {}
        self.n = 0  # containers in a row
        self.data = bytearray()  # capacity rows of 2 * n int64: CPU of each container, then memory
        self.layout: object = None  # the store's token for the series ``pods`` was last written with
        self.order: tuple[int, ...] | None = None  # _row_order() of the columns of ``layout``

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

    def lay_out(self, capacity: int, pods: dict[PodKey, tuple[str, ...]]) -> None:
        """Rows for ``pods`` (pod -> container names, in this order): the values of every container
        kept (same pod, same name) are copied, the others are -1."""
        old, old_n, old_pods = memoryview(self.data).cast("q"), self.n, self.pods
        kept: dict[PodKey, tuple[tuple[str, ...], int]] = {}
        n = 0
        for key, names in pods.items():
            kept[key] = (names, n)
            n += len(names)
        data = bytearray(b"\xff" * (16 * capacity * n))  # all bits set: int64 -1
        new = memoryview(data).cast("q")
        for key, (names, first) in kept.items():
            rec = old_pods.get(key)
            if rec is None:
                continue
            old_names, old_first = rec
            for j, name in enumerate(names):
                if name in old_names:
                    i = old_first + old_names.index(name)
                    # a container's column of every row: CPU, then memory (strided copies, in C)
                    new[first + j :: 2 * n] = old[i :: 2 * old_n]
                    new[n + first + j :: 2 * n] = old[old_n + i :: 2 * old_n]
        self.pods, self.n, self.data = kept, n, data


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
        kept = h.pods
        names_of = {key: tuple(pairs) for key, pairs in pods.items()}
        # new pods here, or pods with new containers
        changed = [key for key, names in names_of.items() if (rec := kept.get(key)) is None or rec[0] != names]
        if changed or len(kept) != len(names_of):
            pod_node = self._pod_node
            for key in kept.keys() - names_of.keys():  # pods gone since the last scrape
                if pod_node.get(key) == node:
                    del pod_node[key]
            for key in changed:
                pod_node[key] = node
            h.lay_out(cap, names_of)
            kept = h.pods
        n = h.n
        cpus = [-1] * n
        memory = [-1] * n
        most = MAX_NANOCORES
        for key, pairs in pods.items():
            i = kept[key][1]
            for cur, before in pairs.values():
                # _rate() inlined: this runs for every container of every scrape.
                if before is not None:
                    span = cur.timestamp - before.timestamp
                    delta = cur.cpu_ns - before.cpu_ns
                    if span > 0 and delta >= 0:
                        rate = delta / span
                        if rate <= most:
                            cpus[i] = int(rate)
                memory[i] = cur.memory
                i += 1
        self._write_row(h, slot, cpus, memory)
        h.layout = layout
        h.order = None

    def record_columns(
        self,
        node: str,
        last: ResourcePoint | None,
        prev: ResourcePoint | None,
        layout: object,
        columns: ContainerColumns,
        rates: Rates,
    ) -> bool:
        """:meth:`record` for a scrape the store took a column at a time
        (``ResourceStore._store_columns``): ``columns`` holds the same series, in the same order,
        as the last scrape recorded with ``layout``, and ``rates`` their CPU rates since the
        readings before (:func:`kcms.store.columns.column_rates`). False, with nothing written,
        when :meth:`record` must do it: another layout recorded last, or a rate over MAX_NANOCORES.
        The pods' records are written in place; no pod is added or dropped."""
        h = self._nodes.get(node)
        cpus, within = rates
        if h is None or layout is None or h.layout is not layout or not within:
            return False
        ts = last.timestamp if last is not None else max(columns.times)
        slot = self._next_slot(h, ts, last, prev)
        if slot is None:
            return True  # no new point, as record()
        order = h.order
        if order is None:
            order = h.order = _row_order(columns.places, h.pods)
        memory = columns.memory
        # C writes 2 * len(order) values from the row's start: only a row of exactly that width
        # (Python's slice stores refuse any other, as they did before C)
        if _put_row is None or len(order) != h.n or not _put_row(h.data, 2 * h.n * slot, order, cpus, memory):
            self._write_row(h, slot, [cpus[i] for i in order], [memory[i] for i in order])
        return True

    @staticmethod
    def _write_row(h: _NodeHistory, slot: int, cpus: Any, memory: Any) -> None:
        """Row ``slot`` of ``h``: its containers' CPU, then their memory (two slice stores, in C)."""
        n = h.n
        row: Any = memoryview(h.data).cast("q")
        base = 2 * n * slot
        row[base : base + n] = array("q", cpus)
        row[base + n : base + 2 * n] = array("q", memory)

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
        names, first = rec
        n = len(names)
        if not n:
            return names, []
        row, width = h.n, 2 * h.n  # a container's memory is ``row`` after its CPU
        data: Any = memoryview(h.data).cast("q")
        times = h.times
        out = []
        for i in h.slots(self.capacity, oldest):
            at = width * i + first
            values = []
            for j in range(at, at + n):
                cpu = data[j]
                if cpu < 0:
                    break  # served only where every container has a value
                values.append((cpu, data[j + row]))
            else:
                out.append((times[i], values))
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
            slots += h.count * (1 + h.n)
        return len(self._nodes), len(self._pod_node), slots
