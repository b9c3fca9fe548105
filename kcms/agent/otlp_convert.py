"""OTLP metrics to KCMS samples: names, labels, data points (the mapping :mod:`kcms.agent.otlp`
documents for its receiver).

:func:`convert_request` turns every data point of an ``ExportMetricsServiceRequest`` into samples
``(metric, ObjectRef, Labels, seconds, value)`` or a refusal ``(reason, detail)``. The object of a
resource's points comes from a binder (:mod:`kcms.agent.otlp_bind`); the :mod:`kcms.limits` bounds
(name length with suffixes, label count and sizes, future timestamps) are checked here, then an
optional guard (the receiver's per-sender series budget), both before a delta point reaches its
running total so that a refused point changes nothing.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kcms import limits
from kcms.agent.delta import DeltaTotals
from kcms.agent.otlp_bind import Binder, bind_resource
from kcms.model import Labels, ObjectRef

__all__ = [
    "Guard",
    "PointResult",
    "Sample",
    "attribute_labels",
    "attribute_string",
    "bounds_problem",
    "convert_request",
    "label_name",
    "metric_name",
]

Sample = tuple[str, ObjectRef, Labels, float, float]
# One data point's outcome: its samples (None if refused), the (metric, kind) types its metric
# declares, the refusal reason ("" if converted) and a human-readable detail.
PointResult = tuple[list[Sample] | None, tuple[tuple[str, str], ...], str, str]
# A check of one data point's samples before they are kept: None, or (reason, detail).
Guard = Callable[[list[Sample]], tuple[str, str] | None]

_NO_RECORDED_VALUE = metrics_pb2.DataPointFlags.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
_CUMULATIVE = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
_DELTA = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_:]", re.ASCII)
_LABEL_BAD = re.compile(r"[^a-zA-Z0-9_]", re.ASCII)


# ---- names, labels, objects ----------------------------------------------------------------------


def metric_name(name: str) -> str | None:
    """The Prometheus name of an OTel metric name (dots etc. -> ``_``), or None if nothing is left."""
    if not name:
        return None
    out = _NAME_BAD.sub("_", name)
    return "_" + out if out[0].isdigit() else out


def label_name(key: str) -> str | None:
    """The label name of an attribute key, or None for keys that are dropped (empty, ``kcms_``, ``__``)."""
    if not key:
        return None
    out = _LABEL_BAD.sub("_", key)
    if out[0].isdigit():
        out = "_" + out
    if out.startswith(("kcms_", "__")):
        return None
    return out


def _plain(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_plain(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _plain(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    v = None if kind is None else getattr(value, kind)
    return repr(v) if kind == "double_value" and not math.isfinite(v) else v  # JSON has no NaN


def attribute_string(value: AnyValue) -> str:
    """The label value of an attribute value (see the module docstring)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind in ("int_value", "double_value"):
        return repr(getattr(value, kind))
    if kind is None:
        return ""
    plain = _plain(value)
    return plain if isinstance(plain, str) else orjson.dumps(plain).decode()


def attribute_labels(attributes: Iterable[KeyValue], drop: str = "") -> dict[str, str]:
    """Labels of data point attributes: key -> value, colliding keys' values joined with ``;``."""
    raw: list[tuple[str, str, str]] = []
    for kv in attributes:
        name = label_name(kv.key)
        if name is not None and name != drop:
            raw.append((name, kv.key, attribute_string(kv.value)))
    labels: dict[str, str] = {}
    if len({name for name, _, _ in raw}) != len(raw):
        raw.sort(key=lambda t: t[1])
        for name, _, value in raw:
            labels[name] = f"{labels[name]};{value}" if name in labels else value
        return labels
    for name, _, value in raw:
        labels[name] = value
    return labels


# ---- data points -> samples ----------------------------------------------------------------------


def _labels(d: dict[str, str], extra: tuple[str, str] | None = None) -> Labels:
    if extra is not None:
        d = {**d, extra[0]: extra[1]}
    return tuple(sorted(d.items()))


def _ts(point: Any, now: float) -> float:
    return point.time_unix_nano / 1e9 if point.time_unix_nano else now


def _number_point(name: str, obj: ObjectRef, point: Any, now: float) -> tuple[list[Sample] | None, str, str]:
    kind = point.WhichOneof("value")
    if kind is None:
        return None, "no_value", f"{name}: the point has neither as_double nor as_int"
    value = float(point.as_double if kind == "as_double" else point.as_int)
    if not math.isfinite(value):
        return None, "non_finite_value", f"{name}: value {value} is not finite"
    return [(name, obj, _labels(attribute_labels(point.attributes)), _ts(point, now), value)], "", ""


def _histogram_point(
    name: str, obj: ObjectRef, point: Any, now: float
) -> tuple[list[Sample] | None, str, str]:
    bounds = list(point.explicit_bounds)
    counts = list(point.bucket_counts)
    if counts and len(counts) != len(bounds) + 1:
        return None, "invalid_histogram", f"{name}: {len(counts)} bucket counts for {len(bounds)} bounds"
    if counts and sum(counts) != point.count:
        return None, "invalid_histogram", f"{name}: the bucket counts do not add up to the count"
    if any(b >= c for b, c in zip(bounds, bounds[1:], strict=False)) or any(math.isnan(b) for b in bounds):
        return None, "invalid_histogram", f"{name}: explicit bounds are not strictly increasing"
    has_sum = point.HasField("sum")
    if has_sum and not math.isfinite(point.sum):
        return None, "non_finite_value", f"{name}: sum {point.sum} is not finite"
    attrs = attribute_labels(point.attributes, drop="le")
    ts = _ts(point, now)
    samples: list[Sample] = []
    running = 0
    for bound, count in zip(bounds, counts, strict=False):
        running += count
        samples.append(
            (name + "_bucket", obj, _labels(attrs, ("le", repr(float(bound)))), ts, float(running))
        )
    samples.append((name + "_bucket", obj, _labels(attrs, ("le", "+Inf")), ts, float(point.count)))
    plain = _labels(attrs)
    if has_sum:
        samples.append((name + "_sum", obj, plain, ts, point.sum))
    samples.append((name + "_count", obj, plain, ts, float(point.count)))
    return samples, "", ""


def _summary_point(name: str, obj: ObjectRef, point: Any, now: float) -> tuple[list[Sample] | None, str, str]:
    values = (
        [point.sum] + [q.value for q in point.quantile_values] + [q.quantile for q in point.quantile_values]
    )
    if not all(math.isfinite(v) for v in values):
        return None, "non_finite_value", f"{name}: a quantile or the sum is not finite"
    attrs = attribute_labels(point.attributes, drop="quantile")
    ts = _ts(point, now)
    samples: list[Sample] = [
        (name, obj, _labels(attrs, ("quantile", repr(q.quantile))), ts, q.value)
        for q in point.quantile_values
    ]
    plain = _labels(attrs)
    samples.append((name + "_sum", obj, plain, ts, point.sum))
    samples.append((name + "_count", obj, plain, ts, float(point.count)))
    return samples, "", ""


def _refuse_all(points: Any, kinds: tuple, reason: str, detail: str) -> Iterator[PointResult]:
    for _ in points:
        yield None, kinds, reason, detail


def bounds_problem(samples: list[Sample], now: float) -> tuple[str, str] | None:
    """``(reason, detail)`` when one data point's samples break a :mod:`kcms.limits` bound (they share
    the point's time), else None; the metric name is checked per metric (:func:`_metric_points`)."""
    ts = samples[0][3]
    if ts > limits.future_limit(now):
        return (
            limits.FUTURE_TIMESTAMP,
            f"{samples[0][0]}: the point is {ts - now:.0f}s ahead of the agent's clock; at most "
            f"{limits.max_future_skew():g}s (--max-future-skew)",
        )
    for metric, _, labels, _, _ in samples:
        problem = limits.labels_problem(labels)
        if problem is not None:
            return problem[0], f"{metric}: {problem[1]}"
    return None


def _metric_points(
    metric: Any,
    obj: ObjectRef | None,
    why: str,
    detail: str,
    now: float,
    totals: DeltaTotals,
    guard: Guard | None = None,
) -> Iterator[PointResult]:
    kind = metric.WhichOneof("data")
    if kind is None:
        return
    data = getattr(metric, kind)
    points = data.data_points
    if obj is None:
        yield from _refuse_all(points, (), why, detail)
        return
    name = metric_name(metric.name)
    if name is None:
        yield from _refuse_all(points, (), "invalid_metric_name", "a metric has an empty name")
        return
    problem = limits.metric_name_problem(name)
    if problem is not None:  # checked first: the details below quote the name
        yield from _refuse_all(points, (), *problem)
        return
    delta = False
    if kind in ("sum", "histogram") and data.aggregation_temporality != _CUMULATIVE:
        if data.aggregation_temporality != _DELTA:
            text = f"{name}: the aggregation temporality is unspecified"
            yield from _refuse_all(points, (), "unspecified_temporality", text)
            return
        delta = True
    if kind == "gauge" or (kind == "sum" and not data.is_monotonic):
        kinds: tuple[tuple[str, str], ...] = ((name, "gauge"),)
        convert = _number_point
    elif kind == "sum":
        if not name.endswith("_total"):
            name += "_total"
        kinds, convert = ((name, "counter"),), _number_point
    elif kind == "histogram":
        kinds = ((name + "_bucket", "counter"), (name + "_sum", "counter"), (name + "_count", "counter"))
        convert = _histogram_point
    elif kind == "summary":
        kinds = ((name, "gauge"), (name + "_sum", "counter"), (name + "_count", "counter"))
        convert = _summary_point
    else:
        yield from _refuse_all(points, (), "unsupported_type", f"{name}: {kind} is not supported")
        return
    for metric_kind in kinds:  # the suffixes count: a name that fits may not with _bucket
        problem = limits.metric_name_problem(metric_kind[0])
        if problem is not None:
            yield from _refuse_all(points, (), *problem)
            return
    for point in points:
        if point.flags & _NO_RECORDED_VALUE:
            yield None, kinds, "no_value", f"{name}: the point carries the no-recorded-value flag"
            continue
        samples, reason, text = convert(name, obj, point, now)
        if samples is not None:
            problem = bounds_problem(samples, now)
            if problem is None and guard is not None:  # before the delta totals: a refusal changes nothing
                problem = guard(samples)
            if problem is not None:
                yield None, kinds, problem[0], problem[1]
                continue
        if delta and samples is not None:
            samples, reason = totals.accumulate(samples)
            text = f"{name}: a delta point not newer than the previous one, or beyond the totals' limit"
        yield samples, kinds, reason, text


def convert_request(
    request: ExportMetricsServiceRequest,
    now: float,
    totals: DeltaTotals | None = None,
    bind: Binder = bind_resource,
    guard: Guard | None = None,
) -> Iterator[PointResult]:
    """Every data point of ``request`` converted (or refused), in order; ``now`` stands for time 0
    and is the clock future timestamps are measured against; ``totals`` carries delta streams'
    running totals from one request to the next; ``bind`` maps a resource's attributes to the
    object of its points (by default they are trusted); ``guard`` may refuse a point's samples
    before they count (e.g. a per-sender series budget)."""
    totals = DeltaTotals() if totals is None else totals
    for rm in request.resource_metrics:
        attrs = {kv.key: attribute_string(kv.value) for kv in rm.resource.attributes}
        obj, why, detail = bind(attrs)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                yield from _metric_points(metric, obj, why, detail, now, totals, guard)
