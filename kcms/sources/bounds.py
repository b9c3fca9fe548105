"""The bounds a resource reading (a node's or a container's CPU counter and memory) must be within.

metrics.k8s.io answers drive ``kubectl top``, the HPA and the VPA, and one bad item fails a whole
list for a Go client (a timestamp with a five-digit year) or scales a workload on nonsense (a
negative or exabyte working set). Every path that brings readings in (the ``/metrics/resource`` and
``/stats/summary`` decoders, and :meth:`kcms.store.resource.ResourceStore.store`, which every
collector, node push and store write ends in) screens them with :func:`screen_batch`, so a reading
outside these bounds is refused alone, counted, and never served:

* timestamp: finite, after the epoch (``bad_value``), at most :func:`kcms.limits.future_limit` ahead
  (``future_timestamp``); together these keep every served time inside years 0001-9999, the only
  ones RFC 3339 (and Go's ``time.Parse``) can carry;
* CPU counter (core-nanoseconds) and memory (bytes): not negative (``negative``); the counter at
  most :data:`MAX_CPU_NS` (the kubelet's counter is a ``uint64``), the memory at most
  :data:`MAX_MEMORY_BYTES` (8 PiB: ~250 times the largest machine sold, and the largest integer a
  float keeps exactly, so every JSON client reads it exactly) (``absurd_value``);
* container start time: finite (``non_finite``);
* names: namespace, pod and container names at most :data:`MAX_NAME_LENGTH` characters (a
  Kubernetes object name's bound) (``label_value_too_long``).

A refused container drops its pod (as a zero value does, following metrics-server): a pod's usage is
the sum of its containers and is never served partial. The node's reading and other pods are kept.

CPU *rates* are bounded where they are computed (:mod:`kcms.store.resource`): a rate above
:data:`MAX_CPU_CORES` cores is never served. KCMS keeps no node capacity in its inventory, so this is
an absolute bound, far above any node (the largest have a few thousand cores) and far below what a
counter jump gives (a jump of 2**63 ns in 15 s is 6e8 cores).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
from operator import attrgetter

from kcms import limits
from kcms.model import NodeBatch, ResourcePoint

__all__ = [
    "ABSURD_VALUE",
    "MAX_CPU_CORES",
    "MAX_CPU_NS",
    "MAX_MEMORY_BYTES",
    "MAX_NAME_LENGTH",
    "MAX_NANOCORES",
    "MAX_SERVED_TIMESTAMP",
    "MIN_SERVED_TIMESTAMP",
    "REASONS",
    "SAMPLE_REASONS",
    "point_problem",
    "screen_batch",
    "screen_rows",
]

MAX_CPU_CORES = 1_000_000
MAX_NANOCORES = MAX_CPU_CORES * 10**9
MAX_CPU_NS = 2**64 - 1
MAX_MEMORY_BYTES = 2**53
MAX_NAME_LENGTH = 253
# 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: the times RFC 3339's four-digit year can carry.
MIN_SERVED_TIMESTAMP = -62135596800.0
MAX_SERVED_TIMESTAMP = 253402300799.0

ABSURD_VALUE = "absurd_value"
NEGATIVE = "negative"
NON_FINITE = "non_finite"
BAD_VALUE = "bad_value"
# Every reason screen_batch counts (bounded: they are Prometheus label values).
REASONS = (
    limits.FUTURE_TIMESTAMP,
    ABSURD_VALUE,
    NEGATIVE,
    NON_FINITE,
    BAD_VALUE,
    limits.LABEL_VALUE_TOO_LONG,
)


def point_problem(p: ResourcePoint, latest: float) -> str | None:
    """The reason ``p`` is refused (one of :data:`REASONS`), or None. ``latest``: the latest
    acceptable timestamp (:func:`kcms.limits.future_limit`)."""
    try:
        ts, cpu, mem, start = p.timestamp, p.cpu_ns, p.memory, p.start_time
        if not 0 < ts <= latest:  # also false for NaN
            if ts > latest:
                return limits.FUTURE_TIMESTAMP if math.isfinite(ts) else NON_FINITE
            return BAD_VALUE if ts == ts else NON_FINITE
        if start - start or cpu - cpu or mem - mem:  # NaN or infinite (the decoders give ints)
            return NON_FINITE
        if cpu < 0 or mem < 0:
            return NEGATIVE
        if cpu > MAX_CPU_NS or mem > MAX_MEMORY_BYTES:
            return ABSURD_VALUE
    except TypeError:  # not numbers at all
        return BAD_VALUE
    return None


def screen_node_point(batch: NodeBatch, latest: float, counts: dict[str, int]) -> None:
    """Drop ``batch``'s node reading (in place) if it is outside the bounds, counting the reason."""
    point = batch.node_point
    if point is not None:
        reason = point_problem(point, latest)
        if reason is not None:
            counts[reason] = 1
            batch.node_point = None


_TIMESTAMP = attrgetter("timestamp")
_CPU_NS = attrgetter("cpu_ns")
_MEMORY = attrgetter("memory")
_START = attrgetter("start_time")


def _all_within(pods: dict[tuple[str, str], dict[str, ResourcePoint]], latest: float) -> bool:
    """True when every container reading and name of ``pods`` is within the bounds: the loop of
    :func:`screen_batch` a column at a time (C-level ``map``/``min``/``max``: ~8 us instead of ~20
    for 60 containers; every stored batch is screened, ``bench/scrape_cpu.py``). False when one
    may not be (or on anything unexpected): the caller then looks point by point. The sums make a
    NaN (which ``min``/``max`` can skip) or an infinity fail the test."""
    try:
        if not pods:
            return True
        if not (
            max(map(len, chain.from_iterable(pods))) <= MAX_NAME_LENGTH
            and min(map(len, pods)) == max(map(len, pods)) == 2  # (namespace, name), as the loop unpacks
        ):
            return False
        points = list(chain.from_iterable(map(dict.values, pods.values())))
        if not points:
            return True
        times = list(map(_TIMESTAMP, points))
        cpu = list(map(_CPU_NS, points))
        memory = list(map(_MEMORY, points))
        total = sum(times) + sum(cpu) + sum(memory) + sum(map(_START, points))
        return bool(
            total - total == 0
            and 0 < min(times)
            and max(times) <= latest
            and 0 <= min(cpu)
            and max(cpu) <= MAX_CPU_NS
            and 0 <= min(memory)
            and max(memory) <= MAX_MEMORY_BYTES
            and max(map(len, chain.from_iterable(pods.values()))) <= MAX_NAME_LENGTH
        )
    except Exception:  # noqa: BLE001 - not numbers, not strings, not pairs: the loop says why
        return False


def screen_batch(batch: NodeBatch, latest: float | None = None) -> dict[str, int]:
    """Drop from ``batch`` (in place) every reading outside the bounds; return the counts by reason.

    A refused container drops its whole pod; the node point and other pods stay. The usual batch,
    all within, passes after one look at each column (:func:`_all_within`); otherwise every
    reading is looked at (:func:`screen_pods`, ~20 us for a node of 60 containers).
    """
    if latest is None:
        latest = limits.future_limit()
    counts: dict[str, int] = {}
    if 0.0 < batch.screened <= latest:
        return counts  # its decoder screened it against this limit or an earlier (stricter) one
    screen_node_point(batch, latest, counts)
    if not _all_within(batch.pods, latest):
        screen_pods(batch, latest, counts)
    return counts


def screen_pods(batch: NodeBatch, latest: float, counts: dict[str, int]) -> None:
    """:func:`screen_batch`'s pods, point by point: drop (in place) every pod with a reading or a
    name outside the bounds, counting the reasons into ``counts``."""
    drop: list[tuple[str, str]] = []
    for key, containers in batch.pods.items():
        ns, name = key
        if len(ns) > MAX_NAME_LENGTH or len(name) > MAX_NAME_LENGTH:
            counts[limits.LABEL_VALUE_TOO_LONG] = counts.get(limits.LABEL_VALUE_TOO_LONG, 0) + 1
            drop.append(key)
            continue
        bad = False
        for cname, p in containers.items():
            # the common case in one chained comparison; point_problem says why otherwise
            try:
                if (
                    0 < p.timestamp <= latest
                    and 0 <= p.cpu_ns <= MAX_CPU_NS
                    and 0 <= p.memory <= MAX_MEMORY_BYTES
                    and len(cname) <= MAX_NAME_LENGTH
                    and not p.start_time - p.start_time
                ):
                    continue
            except TypeError:
                pass
            reason = point_problem(p, latest) or limits.LABEL_VALUE_TOO_LONG
            counts[reason] = counts.get(reason, 0) + 1
            bad = True
        if bad:
            drop.append(key)
    for key in drop:
        del batch.pods[key]
    if drop:
        batch.columns = None  # no longer what ``pods`` holds


# ---- custom-metric samples in the store's block form ----------------------------------------------

MIN_SAMPLE_TIMESTAMP = MIN_SERVED_TIMESTAMP
BAD_TIMESTAMP = "bad_timestamp"
SAMPLE_REASONS = (*limits.REASONS, BAD_TIMESTAMP)

Row = tuple[int, int, int, int, int, float, float]


def _too_long(s: object) -> bool:
    return isinstance(s, str) and len(s) > MAX_NAME_LENGTH


def _labels_reason(labels: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    try:
        return limits.labels_problem(labels)
    except (TypeError, ValueError):  # not pairs: the store refuses the rows that use it
        return None


def screen_rows(
    strings: Sequence[str],
    labelsets: Sequence[Sequence[tuple[str, str]]],
    rows: list[Row],
    latest: float | None = None,
) -> tuple[list[Row], dict[str, int]]:
    """The rows of a sample block (``(metric, resource, namespace, name, labels, timestamp, value)``,
    the first four indexes into ``strings``, the fifth into ``labelsets``) within the bounds every
    ingestion path shares, and the counts of the others by reason (:data:`SAMPLE_REASONS`):
    a timestamp more than ``--max-future-skew`` ahead or before year 0001, a metric name over 253
    characters, an object field over :data:`MAX_NAME_LENGTH`, a label set over the label bounds.

    Malformed rows (an index out of range, a value that is not a number) are kept: the store refuses
    and counts them itself. The usual block passes whole after one look at each table (~0.1 us a row).
    """
    if latest is None:
        latest = limits.future_limit()
    counts: dict[str, int] = {}
    long_strings = [_too_long(s) for s in strings]
    bad_labels = [None if not ls else _labels_reason(ls) for ls in labelsets]
    try:
        if (
            not any(long_strings)
            and not any(bad_labels)
            and MIN_SAMPLE_TIMESTAMP <= min(r[5] for r in rows)
            and max(r[5] for r in rows) <= latest
        ):
            return rows, counts
    except (TypeError, ValueError, IndexError):
        pass  # malformed rows (or none): one by one
    kept: list[Row] = []
    for row in rows:
        reason = None
        try:
            m, r, ns, nm, lb, ts = row[0], row[1], row[2], row[3], row[4], row[5]
            if ts > latest:
                reason = limits.FUTURE_TIMESTAMP
            elif ts < MIN_SAMPLE_TIMESTAMP:
                reason = BAD_TIMESTAMP
            elif long_strings[m]:
                reason = limits.METRIC_NAME_TOO_LONG
            elif long_strings[r] or long_strings[ns] or long_strings[nm]:
                reason = limits.LABEL_VALUE_TOO_LONG
            elif (problem := bad_labels[lb]) is not None:
                reason = problem[0]
        except (TypeError, ValueError, IndexError):
            pass  # the store's own checks refuse it
        if reason is None:
            kept.append(row)
        else:
            counts[reason] = counts.get(reason, 0) + 1
    return kept, counts
