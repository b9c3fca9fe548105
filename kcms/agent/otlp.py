"""The node agent's OTLP/HTTP metrics receiver: applications push with the OpenTelemetry SDK.

``POST /v1/metrics`` takes an ``ExportMetricsServiceRequest`` as binary protobuf
(``Content-Type: application/x-protobuf``) or in the OTLP/JSON mapping (``application/json``:
lowerCamelCase keys, 64-bit integers as strings or numbers, enums as integers, ``traceId``/``spanId``
as hex; unknown fields are ignored), optionally with ``Content-Encoding: gzip``. The body is limited
to ``max_body_bytes`` before *and* after decompression.

Answers (OTLP/HTTP): ``200`` with an ``ExportMetricsServiceResponse`` in the request's encoding,
whose ``partial_success`` (``rejected_data_points``, ``error_message``) is set only when some data
points were refused; ``400`` for a body that cannot be decoded, ``413`` over the size limit, ``415``
for another content type or content encoding. Error bodies are ``google.rpc.Status`` messages
(``code``, ``message``) in the request's encoding (JSON for ``415``).

Mapping to samples (each becomes ``(metric, ObjectRef, Labels, seconds, value)`` in the sink):

- Names: every character outside ``[a-zA-Z0-9_:]`` (OTel's dots, dashes, slashes) becomes ``_``, a
  leading digit gets a ``_`` prefix (``http.server.duration`` -> ``http_server_duration``). Units
  are *not* appended to names.
- Gauge -> a gauge of that name. Sum, monotonic and cumulative -> a counter ``<name>_total`` (the
  suffix is not doubled). Sum, not monotonic and cumulative -> a gauge. Histogram, cumulative ->
  counters ``<name>_bucket{le=...}`` (cumulative counts, the last one ``le="+Inf"`` = ``count``),
  ``<name>_sum`` (when the point has a sum) and ``<name>_count``; min, max and exemplars are not
  kept. Summary -> gauges ``<name>{quantile=...}`` plus counters ``<name>_sum``, ``<name>_count``.
- Delta temporality of Sum and Histogram: the agent keeps a running total per series and exposes
  it as the same counters (or gauge) a cumulative exporter would give (see
  :mod:`kcms.agent.delta`); a delta point not newer than its stream's previous one is refused
  (``delta_out_of_order``: a retry must not count twice), and so are new streams beyond the
  totals' limit (``delta_limit``). Unspecified temporality is refused
  (``unspecified_temporality``). Exponential histograms are refused (``unsupported_type``).
- Labels: the data point's attributes. Keys: characters outside ``[a-zA-Z0-9_]`` become ``_`` (a
  leading digit gets a ``_`` prefix); keys starting with ``kcms_`` or ``__`` are dropped, and so
  are ``le``/``quantile`` on the series that carry their own. Keys that collide after this join
  their values with ``;`` (in order of the original keys). Values: strings as they are, booleans
  ``true``/``false``, integers in decimal, doubles as Python ``repr``, bytes base64, arrays and
  maps as compact JSON. Resource attributes are not labels.
- Object: from the resource attributes: ``k8s.pod.name`` + ``k8s.namespace.name`` ->
  ``ObjectRef("pods", ns, pod)``; else ``k8s.deployment.name`` + ``k8s.namespace.name`` ->
  ``ObjectRef("deployments.apps", ns, name)``; else ``k8s.node.name`` -> ``ObjectRef("nodes", "",
  node)``; else ``k8s.namespace.name`` -> ``ObjectRef("", ns, "")`` (an external metric); else the
  points are refused (``unbound``). Names that are not valid Kubernetes names: ``invalid_object``.
- Time: ``time_unix_nano`` (``0``: the time the request arrived).

A data point is refused as a whole (counted once, whatever number of samples it makes) with one of
``REASONS``: those above (``unbound``, ``invalid_object``, ``delta_out_of_order``, ``delta_limit``,
``unspecified_temporality``, ``unsupported_type``), ``invalid_metric_name`` (an empty name),
``no_value`` (no value, or the no-recorded-value flag),
``non_finite_value`` (NaN or infinity anywhere in it), ``invalid_histogram`` (counts that do not
match the bounds or the total) or ``buffer_refused`` (the sink refused a sample of it, e.g. out of
order; the sink counts its own reason). Counters: ``kcms_agent_otlp_points_total{result}``
(``accepted``, ``rejected``) and ``kcms_agent_otlp_rejected_total{reason}``.
"""

from __future__ import annotations

import asyncio
import base64
import math
import re
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, Protocol

import orjson
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from prometheus_client import Counter

from kcms.agent.delta import DeltaTotals
from kcms.httpbody import BodyTooLarge, read_body
from kcms.model import Labels, ObjectRef

OTLP_METRICS_PATH = "/v1/metrics"
DEFAULT_MAX_BODY = 4 << 20

Sample = tuple[str, ObjectRef, Labels, float, float]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# One data point's outcome: its samples (None if refused), the (metric, kind) types its metric
# declares, the refusal reason ("" if converted) and a human-readable detail.
PointResult = tuple[list[Sample] | None, tuple[tuple[str, str], ...], str, str]

# Refusal reasons, stable (Prometheus label values; see the module docstring).
REASONS = tuple(
    "unbound invalid_object invalid_metric_name no_value non_finite_value delta_out_of_order delta_limit "
    "unspecified_temporality invalid_histogram unsupported_type buffer_refused".split()
)
POINTS = Counter("kcms_agent_otlp_points", "OTLP data points received, by result.", ["result"])
REJECTED = Counter("kcms_agent_otlp_rejected", "OTLP data points refused, by reason.", ["reason"])
for _result in ("accepted", "rejected"):
    POINTS.labels(_result)
for _reason in REASONS:
    REJECTED.labels(_reason)

_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
_JSON_INLINE = 64 << 10  # larger JSON bodies are decoded in a worker thread
_YIELD_EVERY = 2000  # data points ingested between two yields to the event loop
_NO_RECORDED_VALUE = metrics_pb2.DataPointFlags.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
_CUMULATIVE = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
_DELTA = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_:]", re.ASCII)
_LABEL_BAD = re.compile(r"[^a-zA-Z0-9_]", re.ASCII)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)
_ID_KEYS = frozenset({"traceId", "spanId", "trace_id", "span_id"})


class SampleSink(Protocol):
    """Where converted samples go (``kcms.agent.buffer.SampleBuffer``); ``declare`` is optional."""

    def add_many(self, samples: Iterable[Sample]) -> int: ...


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


def bind_resource(attributes: dict[str, str]) -> tuple[ObjectRef | None, str, str]:
    """The object a resource's points are about: ``(ref, "", "")``, or ``(None, reason, detail)``."""
    ns = attributes.get("k8s.namespace.name", "")
    pod = attributes.get("k8s.pod.name", "")
    deployment = attributes.get("k8s.deployment.name", "")
    node = attributes.get("k8s.node.name", "")
    if pod and ns:
        ref = ObjectRef("pods", ns, pod)
    elif deployment and ns:
        ref = ObjectRef("deployments.apps", ns, deployment)
    elif node:
        ref = ObjectRef("nodes", "", node)
    elif ns:
        ref = ObjectRef("", ns, "")
    else:
        return (
            None,
            "unbound",
            "the resource has none of k8s.pod.name with k8s.namespace.name, k8s.deployment.name with "
            "k8s.namespace.name, k8s.node.name or k8s.namespace.name",
        )
    if ref.namespace and (len(ref.namespace) > 63 or not _DNS_LABEL.fullmatch(ref.namespace)):
        return None, "invalid_object", f"namespace {ref.namespace[:80]!r} is not a valid namespace name"
    if ref.name and (len(ref.name) > 253 or not _DNS_SUBDOMAIN.fullmatch(ref.name)):
        return None, "invalid_object", f"{ref.resource} name {ref.name[:80]!r} is not a valid object name"
    return ref, "", ""


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


def _metric_points(
    metric: Any, obj: ObjectRef | None, why: str, detail: str, now: float, totals: DeltaTotals
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
    for point in points:
        if point.flags & _NO_RECORDED_VALUE:
            yield None, kinds, "no_value", f"{name}: the point carries the no-recorded-value flag"
            continue
        samples, reason, text = convert(name, obj, point, now)
        if delta and samples is not None:
            samples, reason = totals.accumulate(samples)
            text = f"{name}: a delta point not newer than the previous one, or beyond the totals' limit"
        yield samples, kinds, reason, text


def convert_request(
    request: ExportMetricsServiceRequest, now: float, totals: DeltaTotals | None = None
) -> Iterator[PointResult]:
    """Every data point of ``request`` converted (or refused), in order; ``now`` stands for time 0;
    ``totals`` carries delta streams' running totals from one request to the next."""
    totals = DeltaTotals() if totals is None else totals
    for rm in request.resource_metrics:
        attrs = {kv.key: attribute_string(kv.value) for kv in rm.resource.attributes}
        obj, why, detail = bind_resource(attrs)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                yield from _metric_points(metric, obj, why, detail, now, totals)


# ---- HTTP ----------------------------------------------------------------------------------------


class _Failure(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _status_response(status: int, message: str, content_type: str) -> web.Response:
    """A ``google.rpc.Status`` body (code: INVALID_ARGUMENT, RESOURCE_EXHAUSTED for 413)."""
    code = 8 if status == 413 else 3
    if content_type == _PROTOBUF:
        text = message.encode()
        body = b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text
    else:
        content_type, body = _JSON, orjson.dumps({"code": code, "message": message})
    return web.Response(status=status, body=body, content_type=content_type)


async def _read_body(request: web.Request, limit: int) -> bytes:
    try:
        return await read_body(request, limit)
    except BodyTooLarge as e:
        raise _Failure(413, str(e)) from None
    except web.RequestPayloadError as e:  # e.g. a gzip body aiohttp could not inflate
        raise _Failure(400, f"cannot read the body: {e}") from None


def _gunzip(body: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as e:
        raise _Failure(400, f"the body is not valid gzip: {e}") from None
    if len(out) > limit:
        raise _Failure(413, f"the decompressed request body is larger than {limit} bytes")
    if not d.eof:
        raise _Failure(400, "the gzip body is truncated")
    return out


def _hex_ids(node: Any) -> None:
    """Turn the hex ``traceId``/``spanId`` of OTLP/JSON into the base64 the protobuf mapping reads."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                try:
                    node[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
                except ValueError:
                    raise _Failure(400, f"{key}: {value[:64]!r} is not hex") from None
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)


def _decode_body(body: bytes, content_type: str) -> ExportMetricsServiceRequest:
    """Decode an ``ExportMetricsServiceRequest``; raise ``_Failure(400)`` when it cannot be."""
    message = ExportMetricsServiceRequest()
    if content_type == _PROTOBUF:
        try:
            message.ParseFromString(body)
        except ProtobufDecodeError as e:
            raise _Failure(400, f"malformed protobuf: {e}") from None
        return message
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise _Failure(400, f"malformed JSON: {e}") from None
    if not isinstance(doc, dict):
        raise _Failure(400, "the body must be a JSON object (an ExportMetricsServiceRequest)")
    try:
        _hex_ids(doc)
        json_format.ParseDict(doc, message, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as e:
        raise _Failure(400, f"not an ExportMetricsServiceRequest: {e}") from None
    return message


def _encode_response(rejected: int, message: str, content_type: str) -> bytes:
    response = ExportMetricsServiceResponse()
    if rejected:
        response.partial_success.rejected_data_points = rejected
        response.partial_success.error_message = message
    if content_type == _PROTOBUF:
        return response.SerializeToString()
    return json_format.MessageToJson(response, indent=None).encode()


class _Receiver:
    def __init__(self, sink: SampleSink, max_body_bytes: int, clock: Callable[[], float]) -> None:
        self.sink = sink
        self.limit = max_body_bytes
        self.clock = clock
        self.declare: Callable[[str, str], None] | None = getattr(sink, "declare", None)
        self.totals = DeltaTotals()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        content_type = request.content_type
        if content_type not in (_PROTOBUF, _JSON):
            return _status_response(
                415, f"unsupported content type {content_type!r}; use {_PROTOBUF} or {_JSON}", _JSON
            )
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", "x-gzip"):
            return _status_response(415, f"unsupported content encoding {encoding!r}; use gzip", content_type)
        try:
            body = await _read_body(request, self.limit)
            # aiohttp's server inflates gzip bodies itself by default; a body still starting with the
            # gzip magic was not inflated (neither protobuf nor JSON can start with 0x1f).
            if body[:2] == b"\x1f\x8b":
                body = _gunzip(body, self.limit)
            if content_type == _JSON and len(body) > _JSON_INLINE:
                # json_format is pure Python (~0.2 s a MB): keep the event loop responsive meanwhile
                message = await asyncio.to_thread(_decode_body, body, content_type)
            else:
                message = _decode_body(body, content_type)
        except _Failure as e:
            response = _status_response(e.status, str(e), content_type)
            if not request.content.is_eof():  # the rest of the body is not read: no keep-alive
                response.force_close()
            return response
        rejected, text = await self.ingest(message, self.clock())
        return web.Response(body=_encode_response(rejected, text, content_type), content_type=content_type)

    async def ingest(self, message: ExportMetricsServiceRequest, now: float) -> tuple[int, str]:
        accepted = 0
        by_reason: dict[str, int] = {}
        details: dict[str, str] = {}
        declared: tuple = ()
        for i, (samples, kinds, reason, detail) in enumerate(convert_request(message, now, self.totals), 1):
            if i % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let other requests run during a large export
            if samples is not None:
                if kinds is not declared and self.declare is not None:
                    for metric, kind in kinds:
                        self.declare(metric, kind)
                    declared = kinds
                if self.sink.add_many(samples) == len(samples):
                    accepted += 1
                    continue
                reason, detail = "buffer_refused", f"{samples[0][0]}: the buffer refused a sample"
            by_reason[reason] = by_reason.get(reason, 0) + 1
            details.setdefault(reason, detail)
        rejected = sum(by_reason.values())
        POINTS.labels("accepted").inc(accepted)
        POINTS.labels("rejected").inc(rejected)
        for reason, n in by_reason.items():
            REJECTED.labels(reason).inc(n)
        text = "; ".join(f"{n} {reason} (e.g. {details[reason]})" for reason, n in sorted(by_reason.items()))
        return rejected, (
            f"{rejected} of {accepted + rejected} data points rejected: {text}" if rejected else ""
        )


def otlp_routes(
    sink: SampleSink,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    clock: Callable[[], float] = time.time,
) -> list[tuple[str, str, Handler]]:
    """``[("POST", "/v1/metrics", handler)]`` feeding ``sink`` (``add_many``, and ``declare`` if it has
    one); ``clock`` (seconds since the epoch) stamps points without a time."""
    receiver = _Receiver(sink, max_body_bytes, clock)
    return [("POST", OTLP_METRICS_PATH, receiver.handle)]
