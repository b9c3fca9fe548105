"""The node agent's OTLP/HTTP metrics receiver: applications push with the OpenTelemetry SDK.

``POST /v1/metrics`` takes an ``ExportMetricsServiceRequest`` as binary protobuf
(``Content-Type: application/x-protobuf``) or in the OTLP/JSON mapping (``application/json``:
lowerCamelCase keys, 64-bit integers as strings or numbers, enums as integers, ``traceId``/``spanId``
as hex; unknown fields are ignored), optionally with ``Content-Encoding: gzip``. The body is limited
to ``max_body_bytes`` before *and* after decompression.

Answers (OTLP/HTTP): ``200`` with an ``ExportMetricsServiceResponse`` in the request's encoding,
whose ``partial_success`` (``rejected_data_points``, ``error_message``) is set only when some data
points were refused; ``400`` for a body that cannot be decoded, ``413`` over the size limit, ``415``
for another content type or content encoding, ``503`` (``Retry-After: 1``) while the agent has not
listed its pods yet. Error bodies are ``google.rpc.Status`` messages (``code``, ``message``) in the
request's encoding (JSON for ``415``).

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
- Object: bound to the sender (:mod:`kcms.agent.otlp_bind`). The connection's source IP must be
  exactly one pod of this node (the agent's pod informer, :class:`kcms.agent.pods.PodsByIP`); the
  ``k8s.*`` resource attributes are claims checked against that pod and its owner chain: a resource
  claiming another pod, namespace, workload or node has its points refused (``foreign_pod``,
  ``foreign_namespace``, ``foreign_workload``, ``foreign_node``). A resource without ``k8s.*``
  attributes is about the sending pod; ``k8s.deployment.name`` alone about its Deployment;
  ``k8s.namespace.name`` alone about its namespace (an external metric). Senders that are not one
  pod (``unbound_sender``, ``host_network_sender``, ``ambiguous_sender``) are refused unless
  ``allow_unbound`` (``--otlp-allow-unbound``); then the attributes are trusted:
  ``k8s.pod.name`` + ``k8s.namespace.name`` -> ``ObjectRef("pods", ns, pod)``; else
  ``k8s.deployment.name`` + ``k8s.namespace.name`` -> ``ObjectRef("deployments.apps", ns, name)``;
  else ``k8s.node.name`` -> ``ObjectRef("nodes", "", node)``; else ``k8s.namespace.name`` ->
  ``ObjectRef("", ns, "")``; else the points are refused (``unbound``). Names that are not valid
  Kubernetes names: ``invalid_object``. Until the pod list is in, requests are answered ``503``
  with ``Retry-After`` (an OTLP exporter retries them).
- Time: ``time_unix_nano`` (``0``: the time the request arrived). A point more than
  ``--max-future-skew`` ahead of the agent's clock is refused (``future_timestamp``).
- Bounds (:mod:`kcms.limits`): a mapped metric name (suffixes included) over 253 characters is
  ``metric_name_too_long``; a series with more than 32 labels, a label name over 128 or a value over
  1024 characters is ``too_many_labels`` / ``label_name_too_long`` / ``label_value_too_long``; a
  sender (a pod, or an address when unbound) keeps at most ``max_series_per_sender`` live series
  (``sender_limit``; the agent passes ``--max-series-per-pod``), whatever objects they are about.

A data point is refused as a whole (counted once, whatever number of samples it makes) with one of
``REASONS``: those above (the binding reasons, ``unbound``, ``invalid_object``, the bounds,
``delta_out_of_order``, ``delta_limit``, ``unspecified_temporality``, ``unsupported_type``),
``invalid_metric_name`` (an empty name),
``no_value`` (no value, or the no-recorded-value flag),
``non_finite_value`` (NaN or infinity anywhere in it), ``invalid_histogram`` (counts that do not
match the bounds or the total) or ``buffer_refused`` (the sink refused a sample of it, e.g. out of
order; the sink counts its own reason). Counters: ``kcms_agent_otlp_points_total{result}``
(``accepted``, ``rejected``) and ``kcms_agent_otlp_rejected_total{reason}``. Refusals are logged
(sender address and pod, counts by reason, request-derived text escaped) at most once per reason
every ``LOG_EVERY`` seconds.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import orjson
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from prometheus_client import Counter

from kcms import limits
from kcms.agent.delta import DeltaTotals
from kcms.agent.otlp_bind import (
    BIND_REASONS,
    Binder,
    SenderSeries,
    bind_resource,
    binder_for,
    sender_key,
)
from kcms.agent.otlp_convert import (
    Guard,
    Sample,
    attribute_labels,
    attribute_string,
    convert_request,
    label_name,
    metric_name,
)
from kcms.agent.pods import PodsByIP, Sender, normal_ip
from kcms.httpbody import BodyTooLarge, read_body

__all__ = [
    "DEFAULT_MAX_BODY",
    "OTLP_METRICS_PATH",
    "REASONS",
    "attribute_labels",
    "attribute_string",
    "bind_resource",
    "convert_request",
    "label_name",
    "metric_name",
    "otlp_routes",
]

log = logging.getLogger(__name__)

OTLP_METRICS_PATH = "/v1/metrics"
DEFAULT_MAX_BODY = 4 << 20

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Refusal reasons, stable (Prometheus label values; see the module docstring).
REASONS = (
    *BIND_REASONS,
    *"unbound invalid_object invalid_metric_name no_value non_finite_value delta_out_of_order delta_limit "
    "unspecified_temporality invalid_histogram unsupported_type buffer_refused".split(),
    *limits.REASONS,
)
LOG_EVERY = 30.0
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
_ID_KEYS = frozenset({"traceId", "spanId", "trace_id", "span_id"})


class SampleSink(Protocol):
    """Where converted samples go (``kcms.agent.buffer.SampleBuffer``); ``declare`` is optional."""

    def add_many(self, samples: Iterable[Sample]) -> int: ...


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
    """A ``google.rpc.Status`` body (code: INVALID_ARGUMENT; RESOURCE_EXHAUSTED for 413, UNAVAILABLE
    for 503)."""
    code = {413: 8, 503: 14}.get(status, 3)
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
    def __init__(
        self,
        sink: SampleSink,
        max_body_bytes: int,
        clock: Callable[[], float],
        pods: PodsByIP | None,
        node_name: str,
        allow_unbound: bool,
        budget: SenderSeries,
        totals: DeltaTotals,
    ) -> None:
        self.sink = sink
        self.limit = max_body_bytes
        self.clock = clock
        self.pods = pods
        self.node_name = node_name
        self.allow_unbound = allow_unbound
        self.budget = budget
        self.declare: Callable[[str, str], None] | None = getattr(sink, "declare", None)
        self.totals = totals
        self._last_log: dict[str, float] = {}

    def sender(self, request: web.Request) -> Sender | None:
        """Who sent ``request``, from the connection's peer address (never from a header); None
        while the pod list is not in yet."""
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        ip = normal_ip(peer[0]) if isinstance(peer, tuple) and peer and isinstance(peer[0], str) else ""
        if self.pods is None:
            return Sender(ip, None, "unbound_sender", "the agent has no pod list to bind senders to")
        if not self.pods.synced():
            return None
        if not ip:
            return Sender(ip, None, "unbound_sender", "the connection has no IP peer address")
        return self.pods.sender(ip)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        content_type = request.content_type
        if content_type not in (_PROTOBUF, _JSON):
            return _status_response(
                415,
                f"unsupported content type {limits.printable(content_type, 80)}; use {_PROTOBUF} or {_JSON}",
                _JSON,
            )
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", "x-gzip"):
            return _status_response(
                415, f"unsupported content encoding {limits.printable(encoding, 80)}; use gzip", content_type
            )
        sender = self.sender(request)
        if sender is None:  # retryable: the exporter sends it again once the agent knows its pods
            response = _status_response(503, "the agent has not listed this node's pods yet", content_type)
            response.headers["Retry-After"] = "1"
            if not request.content.is_eof():
                response.force_close()
            return response
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
        rejected, text = await self.ingest(message, self.clock(), sender)
        return web.Response(body=_encode_response(rejected, text, content_type), content_type=content_type)

    async def ingest(
        self, message: ExportMetricsServiceRequest, now: float, sender: Sender | None = None
    ) -> tuple[int, str]:
        """Convert and keep ``message``'s points as sent by ``sender`` (None: trusted attributes, no
        budget); ``(rejected, partial_success message)``."""
        accepted = 0
        by_reason: dict[str, int] = {}
        details: dict[str, str] = {}
        declared: tuple = ()
        bind: Binder = bind_resource
        guard: Guard | None = None
        if sender is not None:
            bind = binder_for(sender, self.node_name, self.allow_unbound)
            key, budget = sender_key(sender), self.budget

            def guard(samples: list[Sample]) -> tuple[str, str] | None:
                if budget.admit(key, samples):
                    return None
                return "sender_limit", f"the sender already has {budget.max_series} live series"

        points = convert_request(message, now, self.totals, bind, guard)
        for i, (samples, kinds, reason, detail) in enumerate(points, 1):
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
        if rejected:
            self._log(sender, rejected, accepted, text, by_reason)
        return rejected, (
            f"{rejected} of {accepted + rejected} data points rejected: {text}" if rejected else ""
        )

    def _log(self, sender: Sender | None, rejected: int, accepted: int, text: str, reasons: dict) -> None:
        """One line for a request with refusals, unless each of its reasons was logged lately (a
        hostile client must not flood the log); the details are already escaped."""
        mono = time.monotonic()
        fresh = [r for r in reasons if mono - self._last_log.get(r, -LOG_EVERY) >= LOG_EVERY]
        if not fresh:
            return
        for reason in fresh:
            self._last_log[reason] = mono
        who = "?" if sender is None else sender.ip or "?"
        if sender is not None and sender.pod is not None:
            who += f" (pod {sender.pod.namespace}/{sender.pod.name})"
        log.warning(
            "OTLP from %s: refused %d of %d data points: %s", who, rejected, accepted + rejected, text[:2000]
        )


def otlp_routes(
    sink: SampleSink,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    clock: Callable[[], float] = time.time,
    pods: PodsByIP | None = None,
    node_name: str = "",
    allow_unbound: bool = False,
    max_series_per_sender: int = 1000,
    series_idle: float = 300.0,
) -> list[tuple[str, str, Handler]]:
    """``[("POST", "/v1/metrics", handler)]`` feeding ``sink`` (``add_many``, and ``declare`` if it has
    one); ``clock`` (seconds since the epoch) stamps points without a time.

    Senders are bound to the pods of ``pods`` (this node, ``node_name``); without ``pods`` no sender
    is bound. Unbound senders are refused unless ``allow_unbound`` (then their attributes are
    trusted). A sender keeps at most ``max_series_per_sender`` series alive, each forgotten
    ``series_idle`` seconds (the buffer's retention) after its last point, or when the delta totals
    forget it if that is later."""
    totals = DeltaTotals()
    # A series counts against its sender while the buffer or the delta totals remember it: a
    # sender's running totals are then bounded by its budget too, not only by the global limit.
    budget = SenderSeries(max_series_per_sender, max(series_idle, totals.idle))
    receiver = _Receiver(sink, max_body_bytes, clock, pods, node_name, allow_unbound, budget, totals)
    return [("POST", OTLP_METRICS_PATH, receiver.handle)]
