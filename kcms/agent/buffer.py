"""The node agent's short buffer of samples, rendered in the KCMS agent exposition format.

Every source of the agent (cgroups, the node, application endpoints, OTLP) adds samples here; the
collector reads them back with ``GET /metrics`` (the newest point of every series) or
``GET /metrics?since=<ms>`` (every point newer than ``since``).

A series is ``(metric, ObjectRef, labels)``. Its points live in one ``bytearray`` of packed native
``(timestamp_ms, value)`` double pairs (16 bytes a point). Timestamps are kept in whole
milliseconds, the resolution of the exposition format, so a point is refused when its millisecond
timestamp is not greater than the series' last one. Next to the points, each series keeps its
rendered ``name{labels}`` prefix, so rendering is a join of prepared bytes and formatted numbers.

Refused samples return ``False`` and are counted by reason (``stats()["rejected"]`` and the
Prometheus counter ``kcms_agent_rejected_samples_total{reason}``): ``out_of_order`` (not newer than
the series' last point), ``invalid_name`` (metric name), ``invalid_labels`` (label names, reserved
``kcms_`` labels, duplicate keys, non-string values, an ``obj`` that is not an ``ObjectRef``),
``invalid_value`` (NaN, infinite or non-numeric timestamp or value), ``pod_limit`` (the pod already
has ``max_series_per_pod`` series; a pod is ``ObjectRef("pods", ns, name)``), ``node_limit`` (the
buffer already holds ``max_series_per_node`` series), and the bounds every ingestion path shares
(:mod:`kcms.limits`): ``future_timestamp`` (more than ``--max-future-skew`` ahead of the agent's
clock: one such point would make every later real point of its series ``out_of_order``; a time
before year 0001 is ``invalid_value``), ``metric_name_too_long`` (over 253 characters),
``too_many_labels``, ``label_name_too_long``, ``label_value_too_long`` (a label's value over the
limit, or the object's resource, namespace or name over 253 characters). Refusals are logged at
most once per reason every ``LOG_EVERY`` seconds.

Types: a metric whose name ends in ``_total`` is a counter, any other a gauge, unless a source
declares otherwise with :meth:`SampleBuffer.declare`.

Not thread-safe: use it from the event loop's thread.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterable

from prometheus_client import Counter

from kcms import limits
from kcms.model import Labels, ObjectRef

__all__ = ["KINDS", "REASONS", "Sample", "SampleBuffer", "format_value", "series_prefix"]

log = logging.getLogger(__name__)

Sample = tuple[str, ObjectRef, Labels, float, float]  # metric, object, labels, seconds, value

KINDS = ("gauge", "counter", "untyped")
REASONS = (
    "out_of_order",
    "invalid_name",
    "invalid_labels",
    "invalid_value",
    "pod_limit",
    "node_limit",
    *limits.REASONS,
)
LOG_EVERY = 30.0

REJECTED = Counter(
    "kcms_agent_rejected_samples",
    "Samples the agent's buffer refused, by reason.",
    ["reason"],
)
for _reason in REASONS:
    REJECTED.labels(_reason)

_METRIC_RE = limits.METRIC_NAME_RE
_LABEL_RE = limits.LABEL_NAME_RE
_POINT = 16
# A Kubernetes object name's bound (resource, namespace, name): what the collector's parser and the
# store accept (kcms.sources.exposition.object_problem, kcms.sources.bounds.screen_rows).
_MAX_OBJECT_FIELD = 253
_MIN_MS = -62135596800000.0  # 0001-01-01T00:00:00Z: earlier times have no RFC 3339 form
_pack = struct.Struct("=dd").pack
_unpack_point = struct.Struct("=dd").unpack_from
_unpack_ts = struct.Struct("=d").unpack_from
_iter_points = struct.Struct("=dd").iter_unpack

_Key = tuple[ObjectRef, Labels]
_Series = tuple[str, bytearray]  # rendered "name{labels}" prefix, packed points


class _Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def series_prefix(metric: str, obj: ObjectRef, labels: Labels) -> str:
    """The ``name{kcms_resource=...,kcms_namespace=...,kcms_name=...,labels...}`` text of a series."""
    parts = [
        f'kcms_resource="{_escape(obj.resource)}"',
        f'kcms_namespace="{_escape(obj.namespace)}"',
        f'kcms_name="{_escape(obj.name)}"',
    ]
    parts.extend(f'{k}="{_escape(v)}"' for k, v in labels)
    return f"{metric}{{{','.join(parts)}}}"


def format_value(value: float) -> str:
    """A finite float in exposition text: integers without a fraction, others as ``repr``."""
    if value.is_integer() and -1e15 < value < 1e15:
        return str(int(value))
    return repr(value)


def _check_labels(labels: Labels) -> Labels:
    """Labels sorted by key, or :class:`_Refused` (``invalid_labels``)."""
    try:
        pairs = tuple(sorted((k, v) for k, v in labels))
    except (TypeError, ValueError):
        raise _Refused(
            "invalid_labels", f"labels must be (key, value) string pairs, not {limits.printable(labels, 80)}"
        ) from None
    previous = None
    for k, v in pairs:
        if not isinstance(k, str) or not isinstance(v, str):
            raise _Refused(
                "invalid_labels",
                f"label keys and values must be strings, not {limits.printable(k, 40)}={limits.printable(v, 40)}",
            )
        if _LABEL_RE.fullmatch(k) is None or k.startswith("__"):
            raise _Refused("invalid_labels", f"invalid label name {limits.printable(k, 80)}")
        if k.startswith("kcms_"):
            raise _Refused(
                "invalid_labels", f"label {limits.printable(k, 80)} uses the reserved prefix kcms_"
            )
        if k == previous:
            raise _Refused("invalid_labels", f"duplicate label {limits.printable(k, 80)}")
        previous = k
    return pairs


class SampleBuffer:
    """Bounded recent samples of one node, by series (see the module docstring)."""

    def __init__(
        self,
        retention: float = 300.0,
        max_series_per_pod: int = 1000,
        max_series_per_node: int = 20000,
    ) -> None:
        if not retention > 0:
            raise ValueError(f"retention must be positive, not {retention!r}")
        if max_series_per_pod < 1 or max_series_per_node < 1:
            raise ValueError("series limits must be at least 1")
        self.retention = float(retention)
        self.max_series_per_pod = int(max_series_per_pod)
        self.max_series_per_node = int(max_series_per_node)
        # metric -> (obj, labels) -> (prefix, points); metrics and series in creation order
        self._metrics: dict[str, dict[_Key, _Series]] = {}
        self._kinds: dict[str, str] = {}
        self._per_pod: dict[tuple[str, str], int] = {}
        self._n_series = 0
        self._points = 0
        self._rejected: dict[str, int] = dict.fromkeys(REASONS, 0)
        self._last_log: dict[str, float] = {}

    # ------------------------------------------------------------------ writing

    def declare(self, metric: str, kind: str) -> None:
        """Set the exposition type of ``metric`` (``gauge``, ``counter`` or ``untyped``)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        self._kinds[metric] = kind

    def kind(self, metric: str) -> str:
        """The exposition type of ``metric``: declared, else ``counter`` for ``*_total``, else ``gauge``."""
        kind = self._kinds.get(metric)
        if kind is None:
            return "counter" if metric.endswith("_total") else "gauge"
        return kind

    def add(self, metric: str, obj: ObjectRef, labels: Labels, timestamp: float, value: float) -> bool:
        """Buffer one point (``timestamp`` in seconds since the epoch); ``False`` if refused (counted)."""
        try:
            ms = float(round(timestamp * 1000.0))
            value = float(value)
        except (TypeError, ValueError, OverflowError):
            return self._refuse(
                "invalid_value", f"{limits.printable(metric, 80)}: timestamp and value must be numbers"
            )
        if value - value or ms - ms or ms < _MIN_MS:  # NaN or infinite
            return self._refuse(
                "invalid_value", f"{limits.printable(metric, 80)}: timestamp and value must be finite"
            )
        if ms > limits.future_limit() * 1000.0:
            return self._refuse(
                limits.FUTURE_TIMESTAMP,
                f"{limits.printable(metric, 80)}: timestamp {timestamp:.3f} is more than "
                f"{limits.max_future_skew():g}s ahead of this node's clock",
            )
        by_key = self._metrics.get(metric)
        try:
            series = by_key.get((obj, labels)) if by_key is not None else None
        except TypeError:  # unhashable labels
            series = None
        if series is None:
            try:
                series = self._new_series(metric, obj, labels)
            except _Refused as e:
                return self._refuse(e.reason, f"{limits.printable(metric, 80)}: {e}")
        points = series[1]
        n = len(points)
        if n and ms <= _unpack_ts(points, n - _POINT)[0]:
            return self._refuse(
                "out_of_order",
                f"{limits.printable(metric, 80)}: timestamp not newer than the series' last point",
            )
        points += _pack(ms, value)
        self._points += 1
        return True

    def add_many(self, samples: Iterable[Sample]) -> int:
        """Buffer ``(metric, obj, labels, timestamp, value)`` samples; return how many were accepted."""
        add = self.add
        accepted = 0
        for metric, obj, labels, ts, value in samples:
            if add(metric, obj, labels, ts, value):
                accepted += 1
        return accepted

    def _new_series(self, metric: str, obj: ObjectRef, labels: Labels) -> _Series:
        if not isinstance(metric, str):
            raise _Refused("invalid_name", f"invalid metric name {limits.printable(metric, 80)}")
        problem = limits.metric_name_problem(metric)
        if problem is not None:
            raise _Refused(*problem)
        if _METRIC_RE.fullmatch(metric) is None:
            raise _Refused("invalid_name", f"invalid metric name {limits.printable(metric, 80)}")
        if not isinstance(obj, ObjectRef):
            raise _Refused("invalid_labels", f"obj must be an ObjectRef, not {limits.printable(obj, 80)}")
        fields = (obj.resource, obj.namespace, obj.name)
        if not all(isinstance(s, str) for s in fields):
            raise _Refused("invalid_labels", f"object fields must be strings: {limits.printable(obj, 80)}")
        if max(map(len, fields)) > _MAX_OBJECT_FIELD:
            raise _Refused(
                limits.LABEL_VALUE_TOO_LONG,
                f"an object name of {max(map(len, fields))} characters; at most {_MAX_OBJECT_FIELD}",
            )
        labels = _check_labels(labels)
        problem = limits.labels_problem(labels)
        if problem is not None:
            raise _Refused(*problem)
        by_key = self._metrics.get(metric)
        if by_key is not None:
            found = by_key.get((obj, labels))
            if found is not None:  # the caller's labels were not sorted
                return found
        if self._n_series >= self.max_series_per_node:
            raise _Refused("node_limit", f"the buffer holds {self.max_series_per_node} series")
        pod = (obj.namespace, obj.name) if obj.resource == "pods" else None
        if pod is not None and self._per_pod.get(pod, 0) >= self.max_series_per_pod:
            raise _Refused(
                "pod_limit",
                f"pod {limits.printable(pod[0] + '/' + pod[1], 80)} has {self.max_series_per_pod} series",
            )
        if by_key is None:
            by_key = self._metrics[metric] = {}
        series = (series_prefix(metric, obj, labels), bytearray())
        by_key[(obj, labels)] = series
        self._n_series += 1
        if pod is not None:
            self._per_pod[pod] = self._per_pod.get(pod, 0) + 1
        return series

    def _refuse(self, reason: str, detail: str) -> bool:
        self._rejected[reason] += 1
        REJECTED.labels(reason).inc()
        now = time.monotonic()
        last = self._last_log.get(reason)
        if last is None or now - last >= LOG_EVERY:
            self._last_log[reason] = now
            log.warning("refused a sample (%s): %s", reason, detail)
        return False

    # ------------------------------------------------------------------ retention

    def expire(self, now: float | None = None) -> int:
        """Drop points older than ``retention`` seconds before ``now`` and series left empty.

        A point exactly ``retention`` old is kept. Returns the number of points dropped.
        """
        now = time.time() if now is None else now
        cutoff = (now - self.retention) * 1000.0
        dropped = 0
        for metric in list(self._metrics):
            by_key = self._metrics[metric]
            for key in list(by_key):
                points = by_key[key][1]
                n = len(points)
                if _unpack_ts(points, n - _POINT)[0] < cutoff:
                    dropped += n // _POINT
                    del by_key[key]
                    self._forget(key[0])
                elif _unpack_ts(points, 0)[0] < cutoff:
                    lo, hi = 0, n // _POINT
                    while lo < hi:  # first point at or after the cutoff
                        mid = (lo + hi) >> 1
                        if _unpack_ts(points, mid * _POINT)[0] < cutoff:
                            lo = mid + 1
                        else:
                            hi = mid
                    del points[: lo * _POINT]
                    dropped += lo
            if not by_key:
                del self._metrics[metric]
        self._points -= dropped
        return dropped

    def _forget(self, obj: ObjectRef) -> None:
        self._n_series -= 1
        if obj.resource == "pods":
            pod = (obj.namespace, obj.name)
            left = self._per_pod[pod] - 1
            if left:
                self._per_pod[pod] = left
            else:
                del self._per_pod[pod]

    # ------------------------------------------------------------------ reading

    def render(self, since_ms: int | None = None) -> bytes:
        """The buffer in the agent exposition format.

        Without ``since_ms``: the newest point of every series. With it: every point whose
        millisecond timestamp is greater than ``since_ms``, oldest first per series. Families come
        in name order, each with one ``# TYPE`` line (omitted when no point of it is rendered).
        """
        out: list[bytes] = []
        append = out.append
        fmt = format_value
        for metric in sorted(self._metrics):
            by_key = self._metrics[metric]
            lines: list[str] = []
            if since_ms is None:
                for prefix, points in by_key.values():
                    ts, value = _unpack_point(points, len(points) - _POINT)
                    lines.append(f"{prefix} {fmt(value)} {int(ts)}\n")
            else:
                since = float(since_ms)
                for prefix, points in by_key.values():
                    n = len(points)
                    if _unpack_ts(points, n - _POINT)[0] <= since:
                        continue
                    start = n - _POINT
                    while start > 0 and _unpack_ts(points, start - _POINT)[0] > since:
                        start -= _POINT
                    for ts, value in _iter_points(points[start:]):
                        lines.append(f"{prefix} {fmt(value)} {int(ts)}\n")
            if lines:
                append(f"# TYPE {metric} {self.kind(metric)}\n".encode())
                append("".join(lines).encode())
        return b"".join(out)

    def series(self) -> list[tuple[str, ObjectRef, Labels]]:
        """Every buffered series as ``(metric, obj, labels)``, by metric then creation order."""
        return [(m, obj, labels) for m, by_key in self._metrics.items() for obj, labels in by_key]

    def stats(self) -> dict[str, object]:
        """``series``, ``points``, ``metrics``, ``pods`` (pods with series) and ``rejected`` by reason."""
        return {
            "series": self._n_series,
            "points": self._points,
            "metrics": len(self._metrics),
            "pods": len(self._per_pod),
            "rejected": dict(self._rejected),
        }
