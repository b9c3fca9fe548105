"""The agent's OTLP/HTTP metrics receiver, over real HTTP on loopback, with real OTLP messages.

These tests are about decoding and mapping: their receivers trust the resource attributes of an
unbound sender (``allow_unbound=True``, the ``--otlp-allow-unbound`` behaviour). Binding senders to
pods is tested in tests/test_security_otlp.py.
"""

from __future__ import annotations

import asyncio
import gzip
import math
from collections.abc import AsyncIterator, Iterable

import aiohttp
import orjson
import pytest
from aiohttp import web
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client import REGISTRY

from kcms.agent.buffer import SampleBuffer
from kcms.agent.otlp import bind_resource, label_name, metric_name, otlp_routes
from kcms.agent.server import make_app
from kcms.model import ObjectRef

CUMULATIVE = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
NOW = 1_700_000_100.0  # the receiver's clock in these tests
T = 1_700_000_000_000_000_000  # a data point time, ns
TS = 1_700_000_000.0
PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}
POD = ObjectRef("pods", "shop", "web-1")


class ListSink:
    """A user-side sink: records what reached it (and the declared types)."""

    def __init__(self) -> None:
        self.samples: list[tuple] = []
        self.kinds: dict[str, str] = {}

    def add(self, metric, obj, labels, timestamp, value) -> bool:
        self.samples.append((metric, obj, labels, timestamp, value))
        return True

    def add_many(self, samples: Iterable[tuple]) -> int:
        return sum(self.add(*s) for s in samples)

    def declare(self, metric: str, kind: str) -> None:
        self.kinds[metric] = kind


# ---- payload builders ---------------------------------------------------------------------------------


def kv(key: str, value) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    if isinstance(value, list):
        return KeyValue(
            key=key, value=AnyValue(array_value=ArrayValue(values=[kv("", v).value for v in value]))
        )
    return KeyValue(key=key, value=AnyValue(string_value=value))


def attrs(d: dict) -> list[KeyValue]:
    return [kv(k, v) for k, v in d.items()]


def resource(res: dict, *metrics: pb.Metric) -> pb.ResourceMetrics:
    return pb.ResourceMetrics(
        resource=Resource(attributes=attrs(res)),
        scope_metrics=[pb.ScopeMetrics(scope={"name": "test"}, metrics=list(metrics))],
    )


def request(*rms: pb.ResourceMetrics) -> ExportMetricsServiceRequest:
    return ExportMetricsServiceRequest(resource_metrics=list(rms))


def gauge(name: str, *points: pb.NumberDataPoint) -> pb.Metric:
    return pb.Metric(name=name, unit="s", gauge=pb.Gauge(data_points=list(points)))


def total(name: str, *points, monotonic=True, temporality=CUMULATIVE) -> pb.Metric:
    return pb.Metric(
        name=name,
        sum=pb.Sum(data_points=list(points), is_monotonic=monotonic, aggregation_temporality=temporality),
    )


def num(value, a: dict | None = None, t: int = T, **kw) -> pb.NumberDataPoint:
    field = "as_int" if isinstance(value, int) else "as_double"
    return pb.NumberDataPoint(attributes=attrs(a or {}), time_unix_nano=t, **{field: value}, **kw)


POD_RES = {"k8s.pod.name": "web-1", "k8s.namespace.name": "shop", "service.name": "web"}


# ---- the server -----------------------------------------------------------------------------------------


async def serve(routes, auto_decompress: bool = True) -> tuple[web.AppRunner, str]:
    app = web.Application()
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app, auto_decompress=auto_decompress)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/v1/metrics"


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str, sink) -> None:
        self.session, self.url, self.sink = session, url, sink

    async def post(self, body: bytes, headers: dict) -> tuple[int, bytes, str]:
        async with self.session.post(self.url, data=body, headers=headers) as r:
            return r.status, await r.read(), r.headers.get("Content-Type", "")

    async def export(self, req: ExportMetricsServiceRequest) -> ExportMetricsServiceResponse:
        status, body, ctype = await self.post(req.SerializeToString(), PB)
        assert status == 200, body
        assert ctype.startswith("application/x-protobuf")
        return ExportMetricsServiceResponse.FromString(body)


@pytest.fixture(params=[True, False], ids=["aiohttp-inflates", "receiver-inflates"])
async def client(request) -> AsyncIterator[Client]:
    """A receiver (64 KiB limit) on loopback; aiohttp's server inflates gzip bodies or leaves them be."""
    sink = ListSink()
    routes = otlp_routes(sink, max_body_bytes=64 * 1024, clock=lambda: NOW, allow_unbound=True)
    runner, url = await serve(routes, auto_decompress=request.param)
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield Client(session, url, sink)
    await runner.cleanup()


def counter(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# ---- tests ----------------------------------------------------------------------------------------------


def test_names_labels_objects():
    assert metric_name("http.server.duration") == "http_server_duration"
    assert metric_name("9lives/x-y") == "_9lives_x_y"
    assert metric_name("") is None
    assert label_name("http.route") == "http_route"
    assert label_name("kcms_resource") is None and label_name("kcms.name") is None
    assert label_name("__name__") is None and label_name("") is None
    assert bind_resource({"k8s.pod.name": "p", "k8s.namespace.name": "n"})[0] == ObjectRef("pods", "n", "p")
    assert bind_resource({"k8s.deployment.name": "d", "k8s.namespace.name": "n", "k8s.node.name": "x"})[
        0
    ] == ObjectRef("deployments.apps", "n", "d")
    assert bind_resource({"k8s.pod.name": "p", "k8s.node.name": "x"})[0] == ObjectRef("nodes", "", "x")
    assert bind_resource({"k8s.namespace.name": "n"})[0] == ObjectRef("", "n", "")
    assert bind_resource({"k8s.pod.name": "p"})[:2] == (None, "unbound")
    assert bind_resource({"k8s.namespace.name": "Bad_NS"})[:2] == (None, "invalid_object")


async def test_gauge_and_attributes(client: Client):
    before = counter("kcms_agent_otlp_points_total", result="accepted")
    req = request(
        resource(
            POD_RES,
            gauge(
                "process.memory.usage",
                num(1.5, {"http.route": "/a", "kcms_name": "evil", "ok": True, "n": 3, "ratio": 0.5}),
                num(7, {"tags": ["x", 1]}, t=0),  # no time: the receive time
            ),
        )
    )
    resp = await client.export(req)
    assert not resp.HasField("partial_success")
    assert client.sink.samples == [
        (
            "process_memory_usage",
            POD,
            (("http_route", "/a"), ("n", "3"), ("ok", "true"), ("ratio", "0.5")),
            TS,
            1.5,
        ),
        ("process_memory_usage", POD, (("tags", '["x",1]'),), NOW, 7.0),
    ]
    assert client.sink.kinds == {"process_memory_usage": "gauge"}
    assert counter("kcms_agent_otlp_points_total", result="accepted") == before + 2


async def test_sums(client: Client):
    before = counter("kcms_agent_otlp_rejected_total", reason="delta_out_of_order")
    req = request(
        resource(
            POD_RES,
            total("http.requests", num(10, {"code": "200"})),
            total("jobs_total", num(3)),
            total("queue.depth", num(-2), monotonic=False),
            # delta: running totals per stream; a point not newer than the last one is a retry
            total("bytes.sent", num(5), num(6, t=T + 10**9), num(6, t=T + 10**9), temporality=DELTA),
            total("inflight", num(3), num(-1, t=T + 10**9), monotonic=False, temporality=DELTA),
        )
    )
    resp = await client.export(req)
    assert resp.partial_success.rejected_data_points == 1
    assert "delta_out_of_order" in resp.partial_success.error_message
    assert client.sink.samples == [
        ("http_requests_total", POD, (("code", "200"),), TS, 10.0),
        ("jobs_total", POD, (), TS, 3.0),
        ("queue_depth", POD, (), TS, -2.0),
        ("bytes_sent_total", POD, (), TS, 5.0),
        ("bytes_sent_total", POD, (), TS + 1, 11.0),
        ("inflight", POD, (), TS, 3.0),
        ("inflight", POD, (), TS + 1, 2.0),
    ]
    assert client.sink.kinds == {
        "http_requests_total": "counter",
        "jobs_total": "counter",
        "queue_depth": "gauge",
        "bytes_sent_total": "counter",
        "inflight": "gauge",
    }
    assert counter("kcms_agent_otlp_rejected_total", reason="delta_out_of_order") == before + 1
    # the totals carry over to the next export, and a resent point is refused there too
    client.sink.samples.clear()
    resp = await client.export(
        request(
            resource(
                POD_RES, total("bytes.sent", num(6, t=T + 10**9), num(4, t=T + 2 * 10**9), temporality=DELTA)
            )
        )
    )
    assert resp.partial_success.rejected_data_points == 1
    assert client.sink.samples == [("bytes_sent_total", POD, (), TS + 2, 15.0)]


async def test_delta_histograms_accumulate_every_series(client: Client):
    await client.export(request(resource(POD_RES, histogram_metric(DELTA))))
    first = list(client.sink.samples)
    client.sink.samples.clear()
    later = histogram_metric(DELTA)
    later.histogram.data_points[0].time_unix_nano = T + 10**9
    await client.export(request(resource(POD_RES, later)))
    assert [s[0] for s in client.sink.samples] == [s[0] for s in first]
    for a, b in zip(first, client.sink.samples, strict=True):
        assert b[3] == a[3] + 1 and b[4] == 2 * a[4]  # every bucket, the sum and the count doubled


def histogram_metric(temporality=CUMULATIVE) -> pb.Metric:
    point = pb.HistogramDataPoint(
        attributes=attrs({"http.route": "/b", "le": "spoofed"}),
        time_unix_nano=T,
        count=10,
        sum=4.25,
        bucket_counts=[2, 5, 3],
        explicit_bounds=[0.1, 1.0],
        min=0.01,
        max=3.0,
    )
    return pb.Metric(
        name="http.server.duration",
        unit="s",
        histogram=pb.Histogram(data_points=[point], aggregation_temporality=temporality),
    )


async def test_histogram(client: Client):
    resp = await client.export(request(resource(POD_RES, histogram_metric())))
    assert not resp.HasField("partial_success")
    route = ("http_route", "/b")
    assert client.sink.samples == [
        ("http_server_duration_bucket", POD, (route, ("le", "0.1")), TS, 2.0),
        ("http_server_duration_bucket", POD, (route, ("le", "1.0")), TS, 7.0),
        ("http_server_duration_bucket", POD, (route, ("le", "+Inf")), TS, 10.0),
        ("http_server_duration_sum", POD, (route,), TS, 4.25),
        ("http_server_duration_count", POD, (route,), TS, 10.0),
    ]
    assert client.sink.kinds == {
        "http_server_duration_bucket": "counter",
        "http_server_duration_sum": "counter",
        "http_server_duration_count": "counter",
    }


async def test_resources_bind_objects(client: Client):
    g = gauge("up", num(1))
    req = request(
        resource(POD_RES, g),
        resource({"k8s.deployment.name": "api", "k8s.namespace.name": "shop"}, g),
        resource({"k8s.node.name": "node-a", "host.name": "x"}, g),
        resource({"k8s.namespace.name": "jobs"}, g),
        resource({"service.name": "lonely"}, g, gauge("other", num(1), num(2))),
        resource({"k8s.pod.name": "no-namespace"}, g),
        resource({"k8s.node.name": "Not A Name"}, g),
    )
    before = counter("kcms_agent_otlp_rejected_total", reason="unbound")
    resp = await client.export(req)
    assert resp.partial_success.rejected_data_points == 5
    assert "4 unbound" in resp.partial_success.error_message
    assert "1 invalid_object" in resp.partial_success.error_message
    assert [s[1] for s in client.sink.samples] == [
        POD,
        ObjectRef("deployments.apps", "shop", "api"),
        ObjectRef("nodes", "", "node-a"),
        ObjectRef("", "jobs", ""),
    ]
    assert counter("kcms_agent_otlp_rejected_total", reason="unbound") == before + 4


async def test_refused_points(client: Client):
    summary = pb.Metric(
        name="rpc.latency",
        summary=pb.Summary(
            data_points=[
                pb.SummaryDataPoint(
                    time_unix_nano=T,
                    count=4,
                    sum=2.0,
                    quantile_values=[pb.SummaryDataPoint.ValueAtQuantile(quantile=0.5, value=0.4)],
                ),
                pb.SummaryDataPoint(
                    time_unix_nano=T,
                    count=0,
                    sum=0.0,
                    quantile_values=[pb.SummaryDataPoint.ValueAtQuantile(quantile=0.5, value=math.nan)],
                ),
            ]
        ),
    )
    expo = pb.Metric(
        name="expo",
        exponential_histogram=pb.ExponentialHistogram(
            data_points=[pb.ExponentialHistogramDataPoint(time_unix_nano=T, count=1)],
            aggregation_temporality=CUMULATIVE,
        ),
    )
    bad_hist = histogram_metric()
    del bad_hist.histogram.data_points[0].bucket_counts[:]
    bad_hist.histogram.data_points[0].bucket_counts.extend([1, 2])  # 2 counts for 2 bounds
    uneven = histogram_metric()
    uneven.histogram.data_points[0].count = 11  # buckets add up to 10
    req = request(
        resource(
            POD_RES,
            gauge(
                "temp", num(math.nan), num(math.inf), num(2.0, flags=1), pb.NumberDataPoint(time_unix_nano=T)
            ),
            uneven,
            total("unspecified", num(1), temporality=0),
            summary,
            expo,
            bad_hist,
        )
    )
    resp = await client.export(req)
    ps = resp.partial_success
    assert ps.rejected_data_points == 9
    for part in (
        "3 non_finite_value",  # NaN, +Inf, a NaN quantile
        "2 no_value",
        "1 unsupported_type",
        "2 invalid_histogram",
        "1 unspecified_temporality",
    ):
        assert part in ps.error_message, ps.error_message
    assert client.sink.samples == [
        ("rpc_latency", POD, (("quantile", "0.5"),), TS, 0.4),
        ("rpc_latency_sum", POD, (), TS, 2.0),
        ("rpc_latency_count", POD, (), TS, 4.0),
    ]


async def test_bad_bodies(client: Client):
    before = len(client.sink.samples)
    status, body, ctype = await client.post(b"\xff\xff\xff\xff", PB)
    assert status == 400 and ctype.startswith("application/x-protobuf")
    assert body[:1] == b"\x08" and b"malformed protobuf" in body  # google.rpc.Status: code, message
    status, body, ctype = await client.post(b"{not json", JS)
    assert status == 400 and ctype.startswith("application/json")
    assert orjson.loads(body)["code"] == 3
    status, body, _ = await client.post(b'{"resourceMetrics": 5}', JS)
    assert status == 400, body
    status, body, _ = await client.post(b"[]", JS)
    assert status == 400
    deep = '{"arrayValue":{"values":[' * 60 + '{"stringValue":"x"}' + "]}}" * 60
    nested = '{"resourceMetrics":[{"resource":{"attributes":[{"key":"a","value":' + deep + "}]}}]}"
    status, body, _ = await client.post(nested.encode(), JS)
    assert status == 400  # past the protobuf nesting limit
    status, body, _ = await client.post(b"\x1f\x8bnot really gzip", {**PB, "Content-Encoding": "gzip"})
    assert status == 400
    status, body, _ = await client.post(b"x", {"Content-Type": "text/plain"})
    assert status == 415 and "unsupported content type" in orjson.loads(body)["message"]
    status, body, _ = await client.post(b"x", {**PB, "Content-Encoding": "compress"})
    assert status == 415
    assert len(client.sink.samples) == before == 0


async def test_gzip_and_size_limits(client: Client):
    req = request(resource(POD_RES, histogram_metric(), gauge("up", num(1))))
    await client.export(req)
    plain = list(client.sink.samples)
    client.sink.samples.clear()
    status, body, _ = await client.post(
        gzip.compress(req.SerializeToString()), {**PB, "Content-Encoding": "gzip"}
    )
    assert status == 200
    assert not ExportMetricsServiceResponse.FromString(body).HasField("partial_success")
    assert client.sink.samples == plain

    client.sink.samples.clear()
    big = request(resource(POD_RES, gauge("g", *[num(float(i), {"i": str(i)}) for i in range(3000)])))
    raw = big.SerializeToString()
    assert len(raw) > 64 * 1024  # the fixture's limit
    status, body, _ = await client.post(raw, PB)
    assert status == 413
    # Small on the wire, over the limit once inflated.
    bomb = gzip.compress(raw)
    assert len(bomb) < 64 * 1024
    status, body, _ = await client.post(bomb, {**PB, "Content-Encoding": "gzip"})
    assert status == 413
    assert client.sink.samples == []


def otlp_json(req: ExportMetricsServiceRequest) -> bytes:
    """The OTLP/JSON form of ``req`` as an OTel SDK writes it: camelCase, int64 as strings, enums as
    integers, hex trace/span ids; plus a field this receiver does not know."""
    doc = json_format.MessageToDict(req, use_integers_for_enums=True)
    doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["gauge"]["dataPoints"][0]["exemplars"] = [
        {
            "timeUnixNano": str(T),
            "asDouble": 1.0,
            "traceId": "5B8EFFF798038103D269B633813FC60C",
            "spanId": "eee19b7ec3c1b174",
        }
    ]
    doc["resourceMetrics"][0]["someFutureField"] = {"x": 1}
    return orjson.dumps(doc)


async def test_json_mapping_gives_same_samples(client: Client):
    req = request(
        resource(
            POD_RES,
            gauge("temp", num(21.5, {"room": "a"}), num(3, {"room": "b"})),
            total("http.requests", num(10)),
            histogram_metric(),
            total("bytes", num(1), temporality=0),  # unspecified: refused the same way each time
        ),
        resource({"k8s.namespace.name": "jobs"}, gauge("queue.backlog", num(42, {"queue": "emails"}))),
    )
    resp = await client.export(req)
    from_protobuf = list(client.sink.samples)
    assert len(from_protobuf) == 9 and resp.partial_success.rejected_data_points == 1
    client.sink.samples.clear()

    body = otlp_json(req)
    assert b'"timeUnixNano":"1700000000000000000"' in body and b'"aggregationTemporality":2' in body
    status, raw, ctype = await client.post(body, JS)
    assert status == 200, raw
    assert ctype.startswith("application/json")
    answer = orjson.loads(raw)
    assert answer["partialSuccess"]["rejectedDataPoints"] == "1"
    assert "unspecified_temporality" in answer["partialSuccess"]["errorMessage"]
    assert client.sink.samples == from_protobuf

    client.sink.samples.clear()
    status, raw, _ = await client.post(gzip.compress(body), {**JS, "Content-Encoding": "gzip"})
    assert status == 200 and client.sink.samples == from_protobuf

    bad_id = body.replace(b"eee19b7ec3c1b174", b"not-hex!")
    status, raw, _ = await client.post(bad_id, JS)
    assert status == 400 and "spanId" in orjson.loads(raw)["message"]


async def test_into_agent_app():
    """Through the agent's own app into its real buffer, read back from its /metrics: types are
    declared, and points the buffer refuses (out of order) are reported as refused."""
    buffer = SampleBuffer()
    runner = web.AppRunner(
        make_app(buffer, extra_routes=otlp_routes(buffer, clock=lambda: NOW, allow_unbound=True))
    )
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        req = request(resource(POD_RES, histogram_metric(), total("http.requests", num(10))))
        async with aiohttp.ClientSession() as session:
            client = Client(session, base + "/v1/metrics", buffer)
            assert not (await client.export(req)).HasField("partial_success")
            again = await client.export(req)  # same timestamps: out of order for the buffer
            assert again.partial_success.rejected_data_points == 2
            assert "2 buffer_refused" in again.partial_success.error_message
            async with session.get(base + "/metrics") as r:
                assert r.status == 200
                text = await r.text()
        assert "# TYPE http_server_duration_bucket counter" in text
        assert "# TYPE http_requests_total counter" in text
        assert (
            'http_server_duration_bucket{kcms_resource="pods",kcms_namespace="shop",kcms_name="web-1",'
            'http_route="/b",le="+Inf"} 10 1700000000000'
        ) in text
    finally:
        await runner.cleanup()


async def test_large_json_export():
    """A JSON export bigger than what is decoded inline (decoded in a worker thread) arrives whole."""
    sink = ListSink()
    # 3000 series from one sender: over the default per-sender budget of 1000
    runner, url = await serve(
        otlp_routes(sink, clock=lambda: NOW, allow_unbound=True, max_series_per_sender=5000)
    )
    try:
        req = request(resource(POD_RES, gauge("g", *[num(float(i), {"i": str(i)}) for i in range(3000)])))
        body = otlp_json(req)
        assert len(body) > 64 * 1024
        async with aiohttp.ClientSession() as session:
            status, raw, _ = await Client(session, url, sink).post(body, JS)
        assert status == 200 and orjson.loads(raw) == {}
        assert sink.samples == [("g", POD, (("i", str(i)),), TS, float(i)) for i in range(3000)]
    finally:
        await runner.cleanup()


async def test_opentelemetry_sdk_exporter():
    """The OpenTelemetry SDK's own OTLP/HTTP exporter (gzip) pushes into the receiver."""
    sdk_metrics = pytest.importorskip("opentelemetry.sdk.metrics")
    http_exporter = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource as SdkResource

    sink = ListSink()
    runner, url = await serve(otlp_routes(sink, allow_unbound=True))
    exporter = http_exporter.OTLPMetricExporter(endpoint=url, compression=Compression.Gzip, timeout=10)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = sdk_metrics.MeterProvider(
        resource=SdkResource.create({"k8s.pod.name": "web-1", "k8s.namespace.name": "shop"}),
        metric_readers=[reader],
    )
    try:
        meter = provider.get_meter("test")
        meter.create_counter("http.requests").add(3, {"http.route": "/a"})
        meter.create_up_down_counter("queue.depth").add(-2)
        meter.create_histogram("job.duration", unit="s").record(7.0)
        assert await asyncio.to_thread(provider.force_flush, 10_000)
        exported = list(sink.samples)  # one export (shutdown exports once more)
    finally:
        await asyncio.to_thread(provider.shutdown)
        await runner.cleanup()
    got = {(m, labels): v for m, obj, labels, _, v in exported if obj == POD}
    assert len(got) == len(exported) == 2 + 16 + 2  # all about the pod; 16 default buckets, sum, count
    assert got[("http_requests_total", (("http_route", "/a"),))] == 3.0
    assert got[("queue_depth", ())] == -2.0
    assert got[("job_duration_count", ())] == 1.0 and got[("job_duration_sum", ())] == 7.0
    assert got[("job_duration_bucket", (("le", "5.0"),))] == 0.0
    assert got[("job_duration_bucket", (("le", "10.0"),))] == 1.0
    assert got[("job_duration_bucket", (("le", "+Inf"),))] == 1.0
    assert sink.kinds["job_duration_bucket"] == "counter" and sink.kinds["queue_depth"] == "gauge"


async def test_opentelemetry_sdk_exporter_with_delta_temporality():
    """An SDK set to export deltas (as many backends prefer): the agent's totals equal what a
    cumulative exporter would have sent, across several exports."""
    sdk_metrics = pytest.importorskip("opentelemetry.sdk.metrics")
    http_exporter = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")
    from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource as SdkResource

    sink = ListSink()
    runner, url = await serve(otlp_routes(sink, allow_unbound=True))
    delta = {
        sdk_metrics.Counter: AggregationTemporality.DELTA,
        sdk_metrics.Histogram: AggregationTemporality.DELTA,
    }
    exporter = http_exporter.OTLPMetricExporter(endpoint=url, timeout=10, preferred_temporality=delta)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = sdk_metrics.MeterProvider(
        resource=SdkResource.create({"k8s.pod.name": "web-1", "k8s.namespace.name": "shop"}),
        metric_readers=[reader],
    )
    try:
        meter = provider.get_meter("test")
        requests, duration = meter.create_counter("http.requests"), meter.create_histogram("job.duration")
        for adds in ((3, 1.0), (4, 30.0), (5, 2.0)):
            requests.add(adds[0])
            duration.record(adds[1])
            assert await asyncio.to_thread(provider.force_flush, 10_000)
    finally:
        await asyncio.to_thread(provider.shutdown)
        await runner.cleanup()
    totals = [v for m, _, _, _, v in sink.samples if m == "http_requests_total"]
    assert totals[:3] == [3.0, 7.0, 12.0]
    counts = [v for m, _, _, _, v in sink.samples if m == "job_duration_count"]
    sums = [v for m, _, _, _, v in sink.samples if m == "job_duration_sum"]
    assert counts[:3] == [1.0, 2.0, 3.0] and sums[:3] == [1.0, 31.0, 33.0]
