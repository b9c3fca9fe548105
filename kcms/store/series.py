"""In-memory time series for custom and external metrics.

A series is a metric name, an object reference and sorted metric labels; its points live in one
compact ``bytearray`` of packed native ``timestamp, value`` double pairs (16 bytes a point, no
per-point Python objects). Points of a series must arrive in strictly increasing timestamp order: a
point not newer than the series' last one is refused (``append`` returns ``False``), so duplicates
from retried pushes are harmless.

Bounds:

* ``max_points``: queries see at most the newest ``max_points`` points of a series. A series is
  trimmed back to ``max_points`` when it reaches ``max_points + max_points // 8`` points, so a trim
  happens once per ``max_points // 8`` appends rather than on every one.
* ``retention``: a point is kept while ``now - timestamp <= retention`` (a point exactly
  ``retention`` seconds old is still kept). :meth:`SeriesStore.collect_garbage` drops older points
  incrementally, visiting at most ``budget`` series per call and resuming where the previous call
  stopped; a series whose newest point has expired is removed from every index (and from discovery
  when it was the last series of its ``(resource, metric)``).
* ``stale_after``: a series whose newest point is more than ``stale_after`` seconds old is not
  returned by queries (but kept until retention).
* Cadence: :meth:`SeriesStore.collect_garbage_forever` (the loop `kcms standalone` runs) takes one step
  of ``GC_BUDGET`` series every :meth:`SeriesStore.gc_interval` seconds, so that every series is
  visited once per ``min(retention / 10, GC_MAX_INTERVAL)`` seconds but never more than one step a
  second: one step every 30 s for up to 10 000 series at the default retention (was one a second
  whatever the size: the loop woke up 86 400 times a day over an empty store), one a second from
  300 000 series on (a pass over a million series still takes ~100 s). An expired point thus lives
  at most one pass past the retention (30 s up to 300 000 series at the default retention, ~100 s
  at a million, as before); queries never see it (they read by time).

Index: ``metric -> resource -> namespace -> node``, where a node maps an object name (series
without labels) or ``(name, labels)`` to the series' points; next to each namespace's node, the key
``(namespace,)`` holds ``{name: {labels: None, ...}}`` for the names that have labelled series (a
dict used as an insertion-ordered set). Discovery keeps a count of series per ``(resource, metric)``,
updated as series are created and removed.

Cost: creating, finding and removing a series are O(1) whatever the number of series of its object,
and a query costs O(series returned). Per-object label sets were once tuples rebuilt on every new or
removed series, which made one push of 80 000 labelled series for one object take seconds (see
``bench/series_object.py``); the garbage collector's cursor keeps a snapshot of the keys of the node
it walks instead of skipping ``position`` entries of the live dict on every call, which was quadratic
in the size of the node too.

Memory layout and the garbage collector: nodes hold only strings, tuples of strings and
bytearrays, none of which the cyclic garbage collector needs to track, so CPython untracks the
nodes and tuples and a full collection does not visit a million series (an ``array('d')`` per series
or a list of per-series records would be visited on every full collection: ~100 ms at 1 M series).

Aggregations (``<name>_agg_<fn>[_<window>]``) read the points whose timestamps lie in
``[last - window, last]`` where ``last`` is the series' newest timestamp (both ends included), and
report as their window the span actually covered: newest minus oldest timestamp used (``0`` for
``latest``, which uses one point). Rates report the interval between the two points used.
Aggregations of rates (``<base>_per_second_agg_<fn>[_<window>]``) read the points of the counter
``<base>_total`` in the same window, take the per-second rate between each consecutive pair (resets
as in :func:`~kcms.store.query.counter_rate`: never negative) and report the same span, from the
oldest counter point in the window to the newest (the last two points for ``latest``); a window
holding fewer than 2 points gives no result. A literal series ``<base>_per_second`` in the
requested resource and namespace is aggregated as itself instead (see
:func:`~kcms.store.query.readings`).

Not thread-safe: use it from one thread (the event loop).
"""

from __future__ import annotations

import asyncio
import math
import struct
import time
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import NamedTuple

from kcms.model import Labels, ObjectRef
from kcms.selectors import LabelSelector
from kcms.store.query import aggregate, counter_rate, counter_rates, readings, validate_metric_name

__all__ = ["GC_BUDGET", "GC_MAX_INTERVAL", "GC_MIN_INTERVAL", "Result", "SeriesStore"]

GC_BUDGET = 10_000  # series visited by one garbage-collection step (bounds a step's duration)
GC_MIN_INTERVAL = 1.0  # seconds: at most one step a second, whatever the size
GC_MAX_INTERVAL = 30.0  # seconds: every series visited at least this often (and retention / 10)

Sample = tuple[str, ObjectRef, Labels, float, float]

# name (series without labels) or (name, labels) -> packed points
_Node = dict[str | tuple[str, Labels], bytearray]
# name -> labels of that name's labelled series, in creation order (a dict as an ordered set: O(1)
# to add and to remove one, where a tuple rebuilt per change was O(series of the object))
_Labelled = dict[str, dict[Labels, None]]

_POINT = 16  # bytes per point
_pack_point = struct.Struct("=dd").pack
_unpack_ts = struct.Struct("=d").unpack_from
_unpack_point = struct.Struct("=dd").unpack_from
_unpack_two = struct.Struct("=dddd").unpack_from


class Result(NamedTuple):
    """One answer of :meth:`SeriesStore.query`.

    ``window`` is ``None`` for a plain (latest) value, else the seconds actually covered by the rate
    or aggregation.
    """

    obj: ObjectRef
    labels: Labels
    value: float
    timestamp: float
    window: float | None


def _first_at_or_after(points: array, t: float) -> int:
    """Index (in points, not array slots) of the first point of interleaved ``points`` whose
    timestamp is ``>= t``; the number of points if there is none."""
    lo = 0
    hi = len(points) >> 1
    while lo < hi:
        mid = (lo + hi) >> 1
        if points[mid << 1] < t:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _check_labels(labels: Labels) -> Labels:
    """``labels`` as a tuple of ``(str, str)`` pairs sorted by key, or ``ValueError``."""
    try:
        pairs = tuple((k, v) for k, v in labels)
    except (TypeError, ValueError):
        raise ValueError(f"labels must be (key, value) pairs, not {labels!r}") from None
    for k, v in pairs:
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"label keys and values must be strings, not {k!r}={v!r}")
    out = tuple(sorted(pairs))
    if len({k for k, _ in out}) != len(out):
        raise ValueError(f"duplicate label key in {labels!r}")
    return out


class SeriesStore:
    """Bounded in-memory series store with label-aware queries (see the module docstring)."""

    def __init__(
        self,
        retention: float = 600.0,
        stale_after: float = 300.0,
        max_points: int = 720,
        default_window: float = 60.0,
    ) -> None:
        if not retention > 0:
            raise ValueError(f"retention must be positive, not {retention!r}")
        if not 0 < stale_after <= retention:
            raise ValueError(f"stale_after must be in (0, retention], not {stale_after!r}")
        if max_points < 2:
            raise ValueError(f"max_points must be at least 2, not {max_points!r}")
        if not 0 < default_window <= retention:
            raise ValueError(f"default_window must be in (0, retention], not {default_window!r}")
        self.retention = float(retention)
        self.stale_after = float(stale_after)
        self.max_points = int(max_points)
        self.default_window = float(default_window)
        self._keep = _POINT * self.max_points  # bytes kept by a trim
        self._trim_at = _POINT * (self.max_points + max(1, self.max_points // 8))
        # metric -> resource -> {namespace: node, (namespace,): labelled names}
        self._index: dict[str, dict[str, dict]] = {}
        self._discovery: dict[tuple[str, str], int] = {}
        self._n_series = 0
        self._points = 0
        # garbage collection cursor: nodes still to visit in this pass, current node, a snapshot of
        # its keys when the visit began (series added since wait for the next pass) and the position
        self._gc_nodes: list[tuple[str, str, str]] = []
        self._gc_node: tuple[str, str, str] | None = None
        self._gc_keys: list[str | tuple[str, Labels]] = []
        self._gc_pos = 0

    # ------------------------------------------------------------------ writing

    def append(self, metric: str, obj: ObjectRef, labels: Labels, timestamp: float, value: float) -> bool:
        """Store one point. ``False`` (nothing stored) if it is not newer than the series' last point.

        Raises ``ValueError`` for a NaN or infinite timestamp or value, a timestamp or value that is
        not a number, an invalid metric name, an ``obj`` that is not an ``ObjectRef`` or malformed
        labels (labels are sorted by key if they are not already).
        """
        return self.append_many(((metric, obj, labels, timestamp, value),)) == 1

    def append_many(self, samples: Iterable[Sample]) -> int:
        """Store ``(metric, obj, labels, timestamp, value)`` samples; return how many were accepted.

        Samples not newer than their series' last point are skipped. An invalid sample raises
        ``ValueError`` as in :meth:`append`; the samples before it stay stored.
        """
        index = self._index
        keep = self._keep
        trim_at = self._trim_at
        pack = _pack_point
        last_ts = _unpack_ts
        accepted = 0
        dropped = 0
        try:
            for metric, obj, labels, ts, value in samples:
                # x - x is 0.0 for a finite float and NaN (truthy) for NaN or +-inf
                if ts - ts or value - value:
                    raise ValueError(f"timestamp and value must be finite, not {ts!r}, {value!r}")
                try:
                    points = index[metric][obj.resource][obj.namespace][
                        (obj.name, labels) if labels else obj.name
                    ]
                except (KeyError, TypeError, AttributeError):
                    points = self._new_series(metric, obj, labels, ts, value)
                n = len(points)
                if n:
                    if ts <= last_ts(points, n - 16)[0]:
                        continue
                    if n >= trim_at:
                        del points[: n - keep + 16]
                        dropped += (n - keep + 16) >> 4
                try:
                    points += pack(ts, value)
                except (struct.error, TypeError, OverflowError) as e:
                    raise ValueError(f"timestamp and value must be floats: {e}") from None
                accepted += 1
        except TypeError as e:  # a sample that is not (str, ObjectRef, labels, number, number)
            raise ValueError(f"malformed sample: {e}") from None
        finally:
            self._points += accepted - dropped
        return accepted

    def append_block(
        self,
        strings: Sequence[str],
        labelsets: Sequence[Labels],
        rows: Iterable[tuple[int, int, int, int, int, float, float]],
    ) -> tuple[int, int]:
        """Store samples as the store service receives them, their strings and label sets given once:
        each row is ``(metric, resource, namespace, name, labels, timestamp, value)`` with the first
        four indexes into ``strings`` and the fifth into ``labelsets``. Return ``(accepted, refused)``.

        The same as :meth:`append_many`, but shared strings arrive as one object each, whose hash
        is computed once per write, and an ``ObjectRef`` is built only for a new series (building
        one per sample cost more than storing it: 1.65 µs against 0.46 µs a sample). A malformed
        row (an index out of range, a bad name, NaN) is refused and counted, never stored, and does
        not stop the others.
        """
        index = self._index
        keep = self._keep
        trim_at = self._trim_at
        pack = _pack_point
        last_ts = _unpack_ts
        accepted = refused = dropped = 0
        for row in rows:
            try:
                m, r, ns, nm, lb, ts, value = row
                if ts - ts or value - value:  # NaN or infinite
                    refused += 1
                    continue
                metric, resource, namespace, name, labels = (
                    strings[m],
                    strings[r],
                    strings[ns],
                    strings[nm],
                    labelsets[lb],
                )
                try:
                    points = index[metric][resource][namespace][(name, labels) if labels else name]
                except (KeyError, TypeError):
                    points = self._new_series(metric, ObjectRef(resource, namespace, name), labels, ts, value)
                n = len(points)
                if n:
                    if ts <= last_ts(points, n - 16)[0]:
                        continue
                    if n >= trim_at:
                        del points[: n - keep + 16]
                        dropped += (n - keep + 16) >> 4
                points += pack(ts, value)
                accepted += 1
            except (ValueError, TypeError, IndexError, struct.error, OverflowError):
                refused += 1
        self._points += accepted - dropped
        return accepted, refused

    def _new_series(self, metric: str, obj: ObjectRef, labels: Labels, ts: float, value: float) -> bytearray:
        """The series for a key not found by the fast path: created, or found under sorted labels.

        Checks everything the fast path does not, before creating anything, so that no series is
        left empty: the metric name, the object, the labels, and that the point converts to floats.
        """
        try:
            float(ts), float(value)
        except (TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"timestamp and value must be floats: {e}") from None
        if metric not in self._index:
            validate_metric_name(metric)
        if not isinstance(obj, ObjectRef):
            raise ValueError(f"obj must be an ObjectRef, not {obj!r}")
        labels = _check_labels(labels)
        by_namespace = self._index.setdefault(metric, {}).setdefault(obj.resource, {})
        node: _Node = by_namespace.setdefault(obj.namespace, {})
        key = (obj.name, labels) if labels else obj.name
        points = node.get(key)
        if points is None:
            points = node[key] = bytearray()
            if labels:
                labelled: _Labelled = by_namespace.setdefault((obj.namespace,), {})
                names_labels = labelled.get(obj.name)
                if names_labels is None:
                    names_labels = labelled[obj.name] = {}
                names_labels[labels] = None
            self._n_series += 1
            dkey = (obj.resource, metric)
            self._discovery[dkey] = self._discovery.get(dkey, 0) + 1
        return points

    def merge(self, metric: str, obj: ObjectRef, labels: Labels, packed: bytes) -> int:
        """Merge packed ``(timestamp, value)`` native-double pairs (an :meth:`export` of another
        replica) into a series, keeping the union of both by timestamp (ours win on a tie); return
        how many points were new. Used by refill and read repair, not on the write path.

        Raises ``ValueError`` for a packed length that is not a whole number of points, and as
        :meth:`append` does for an invalid metric name, object or labels.
        """
        if len(packed) % _POINT:
            raise ValueError(f"packed points must be a multiple of {_POINT} bytes, not {len(packed)}")
        incoming = array("d", packed)
        pairs = {
            incoming[i]: incoming[i + 1]
            for i in range(0, len(incoming), 2)
            if not (incoming[i] - incoming[i] or incoming[i + 1] - incoming[i + 1])
        }
        if not pairs:
            return 0
        labels = _check_labels(labels)
        first = next(iter(pairs))
        points = self._new_series(metric, obj, labels, first, pairs[first])
        ours = array("d", points)
        before = len(ours) >> 1
        for i in range(0, len(ours), 2):
            pairs[ours[i]] = ours[i + 1]
        merged = array("d")
        for ts in sorted(pairs):
            merged.append(ts)
            merged.append(pairs[ts])
        data = merged.tobytes()[-self._keep :]
        points[:] = data
        after = len(data) >> 4
        self._points += after - before
        return max(0, after - before)

    def export(
        self,
        select: Callable[[str, str, str], bool] | None = None,
        metrics: Collection[str] | None = None,
    ) -> Iterator[tuple[str, str, str, str, Labels, bytes]]:
        """Every series as ``(metric, resource, namespace, name, labels, packed points)``, or those
        whose object ``select(resource, namespace, name)`` accepts and whose name is in ``metrics``.
        A snapshot per series (the bytes are copies), safe to send while writes go on."""
        for metric, by_resource in list(self._index.items()):
            if metrics is not None and metric not in metrics:
                continue
            for resource, by_namespace in list(by_resource.items()):
                for namespace, node in list(by_namespace.items()):
                    if type(namespace) is not str:
                        continue
                    for key, points in list(node.items()):
                        name, labels = (key, ()) if type(key) is str else key
                        if select is None or select(resource, namespace, name):
                            yield metric, resource, namespace, name, labels, bytes(points)

    # ------------------------------------------------------------------ retention

    def gc_interval(self, budget: int = GC_BUDGET) -> float:
        """Seconds until the next garbage-collection step of ``budget`` series: a whole pass per
        ``min(retention / 10, GC_MAX_INTERVAL)``, spread over the steps it needs, at most one step
        per ``GC_MIN_INTERVAL``. Read again after every step, so the cadence follows the store's size."""
        pass_seconds = min(self.retention / 10, GC_MAX_INTERVAL)
        steps = max(1, -(-self._n_series // max(1, budget)))
        return max(GC_MIN_INTERVAL, pass_seconds / steps)

    async def collect_garbage_forever(self, budget: int = GC_BUDGET) -> None:
        """Retention, forever (cancel to stop): a step of ``budget`` series every :meth:`gc_interval`
        seconds, so no step holds the event loop for long and an idle store costs a wake-up every
        30 s at the default retention rather than every second."""
        while True:
            await asyncio.sleep(self.gc_interval(budget))
            self.collect_garbage(budget=budget)

    def collect_garbage(self, now: float | None = None, budget: int = GC_BUDGET) -> int:
        """Drop points older than the retention from at most ``budget`` series; return points dropped.

        Each call resumes where the previous one stopped, so calling this often with a modest budget
        bounds each call's duration while every series is visited once per pass.
        """
        now = time.time() if now is None else now
        cutoff = now - self.retention
        left = min(budget, self._n_series)
        dropped = 0
        while left > 0:
            if self._gc_node is None:
                if not self._gc_nodes:
                    self._gc_nodes = [
                        (m, r, ns)
                        for m, by_resource in self._index.items()
                        for r, by_namespace in by_resource.items()
                        for ns in by_namespace
                        if type(ns) is str
                    ]
                    self._gc_nodes.reverse()
                self._gc_node = self._gc_nodes.pop()
                metric, resource, namespace = self._gc_node
                node = self._index.get(metric, {}).get(resource, {}).get(namespace)
                self._gc_keys = list(node) if node else []
                self._gc_pos = 0
            metric, resource, namespace = self._gc_node
            node = self._index.get(metric, {}).get(resource, {}).get(namespace)
            start = self._gc_pos
            keys = self._gc_keys[start : start + left]
            if not keys or not node:
                self._gc_node = None
                self._gc_keys = []
                continue
            left -= len(keys)
            self._gc_pos = start + len(keys)
            for key in keys:
                points = node.get(key)
                if points is None:  # removed since the snapshot
                    continue
                n = len(points)
                if _unpack_ts(points, n - 16)[0] < cutoff:
                    dropped += n >> 4
                    self._remove(metric, resource, namespace, key)
                elif _unpack_ts(points)[0] < cutoff:
                    k = _first_at_or_after(array("d", points), cutoff)
                    del points[: k << 4]
                    dropped += k
        self._points -= dropped
        return dropped

    def _remove(self, metric: str, resource: str, namespace: str, key: str | tuple[str, Labels]) -> None:
        by_resource = self._index[metric]
        by_namespace = by_resource[resource]
        node = by_namespace[namespace]
        del node[key]
        if type(key) is tuple:
            name, labels = key
            labelled = by_namespace[(namespace,)]
            rest = labelled[name]
            del rest[labels]
            if not rest:
                del labelled[name]
                if not labelled:
                    del by_namespace[(namespace,)]
        if not node:
            del by_namespace[namespace]
            if not by_namespace:
                del by_resource[resource]
                if not by_resource:
                    del self._index[metric]
        self._n_series -= 1
        dkey = (resource, metric)
        count = self._discovery[dkey] - 1
        if count:
            self._discovery[dkey] = count
        else:
            del self._discovery[dkey]

    # ------------------------------------------------------------------ reading

    def metrics(self) -> list[tuple[str, str]]:
        """``(resource, series metric name)`` pairs that have at least one series (external: ``""``)."""
        return list(self._discovery)

    def stats(self) -> dict[str, int]:
        """Counts: ``series``, ``points`` (held in memory) and ``metrics`` (distinct series names)."""
        return {"series": self._n_series, "points": self._points, "metrics": len(self._index)}

    def query(
        self,
        resource: str,
        namespace: str,
        names: Collection[str] | None,
        metric: str,
        label_selector: LabelSelector | None = None,
        now: float | None = None,
    ) -> list[Result]:
        """Values of ``metric`` (a requested name in the grammar of :mod:`kcms.store.query`) for the
        objects ``names`` of ``resource`` in ``namespace`` (``None``: all of them; ``""`` namespace
        for cluster-scoped objects and for external metrics of no namespace).

        Stale series, series with too few points for a rate, unknown metrics and malformed names
        give no result (never an exception). With ``names``, results come in the order of
        ``names``, each name's unlabelled series first; without, in series creation order.
        """
        kind = "latest"
        fn: str | None = None
        window = 0.0
        by_namespace = self._index.get(metric, {}).get(resource)
        node: _Node | None = None if by_namespace is None else by_namespace.get(namespace)
        if node is None:
            # No literal series of that name in this scope: a series literally named like a derived
            # metric (``x_per_second``) in another namespace must not hide that namespace's rate of x.
            # The derived readings in order (readings()[0] is the literal one, just tried).
            for q in readings(metric, self.retention)[1:]:
                by_namespace = self._index.get(q.series, {}).get(resource)
                node = None if by_namespace is None else by_namespace.get(namespace)
                if node is not None:
                    kind = q.kind
                    fn = q.fn
                    window = self.default_window if q.window is None else q.window
                    break
            else:
                return []
        if names is None:
            entries: Iterable[tuple[str | tuple[str, Labels], bytearray]] = node.items()
        else:
            labelled: _Labelled = by_namespace.get((namespace,), {})
            found: list[tuple[str | tuple[str, Labels], bytearray]] = []
            for name in dict.fromkeys(names):
                points = node.get(name)
                if points is not None:
                    found.append((name, points))
                for labels in labelled.get(name, ()):
                    key = (name, labels)
                    found.append((key, node[key]))
            entries = found

        now = time.time() if now is None else now
        fresh_after = now - self.stale_after
        oldest = now - self.retention
        view = self._keep
        unpack_point = _unpack_point
        unpack_two = _unpack_two
        selector = label_selector if label_selector is not None and not label_selector.empty else None
        out: list[Result] = []
        append = out.append
        for key, points in entries:
            n = len(points)
            last_ts, value = unpack_point(points, n - 16)
            if last_ts < fresh_after:
                continue
            if type(key) is str:
                name = key
                labels = ()
            else:
                name, labels = key
            if selector is not None and not selector.matches(dict(labels)):
                continue
            if kind == "latest":
                span: float | None = None
            elif kind == "rate":
                if n < 32:
                    continue
                t0, v0, _, _ = unpack_two(points, n - 32)
                value = counter_rate(t0, v0, last_ts, value)
                span = last_ts - t0
            elif kind == "rate_agg":
                visible = array("d", points[max(0, n - view) :])
                first = _first_at_or_after(visible, max(last_ts - window, oldest)) << 1
                if len(visible) - first < 4:  # fewer than 2 counter points in the window: no rate
                    continue
                if fn == "latest":  # the last rate alone: from the last two points
                    t0 = visible[-4]
                    value = counter_rate(t0, visible[-3], last_ts, value)
                    span = last_ts - t0
                else:
                    value = aggregate(fn, counter_rates(visible[first::2], visible[first + 1 :: 2]))  # type: ignore[arg-type]
                    span = last_ts - visible[first]
            elif fn == "latest":
                span = 0.0
            else:
                visible = array("d", points[max(0, n - view) :])
                first = _first_at_or_after(visible, max(last_ts - window, oldest)) << 1
                value = aggregate(fn, visible[first + 1 :: 2])  # type: ignore[arg-type]
                span = last_ts - visible[first]
            if not math.isfinite(value):  # a rate of finite extremes can overflow: never serve inf or nan
                continue
            append(Result(ObjectRef(resource, namespace, name), labels, value, last_ts, span))
        return out
