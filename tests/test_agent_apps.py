"""Application scraping: annotated pods of the fake API server, real Prometheus endpoints on loopback."""

from __future__ import annotations

import collections

import pytest
from _http_helpers import serve_app
from _kube_helpers import eventually
from aiohttp import web
from fakeapi import make_pod
from test_agent_buffer import parse_agent_text

from kcms.agent.apps import AppSource, parse_exposition, scrape_url
from kcms.agent.buffer import SampleBuffer
from kcms.agent.pods import agent_pod_from_json, pod_informer
from kcms.kube.client import KubeClient
from kcms.model import ObjectRef

APP_TEXT = """# HELP http_requests_total Requests served.
# TYPE http_requests_total counter
http_requests_total{path="/",code="200",kcms_name="spoof"} 1027
http_requests_total{path="/api",code="500"} 3 1700000000123
# TYPE queue_depth gauge
queue_depth 7.5
# TYPE latency_seconds histogram
latency_seconds_bucket{le="0.1"} 10
latency_seconds_bucket{le="+Inf"} 12
latency_seconds_sum 1.5
latency_seconds_count 12
not a valid line
bad_value{a="b"} twelve
summary_without_data NaN
"""


class App:
    """A real HTTP server on 127.0.0.1 serving Prometheus text; counts the requests per path."""

    def __init__(self) -> None:
        self.hits: collections.Counter[str] = collections.Counter()
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def serve(request: web.Request) -> web.Response:
            self.hits[request.path] += 1
            if request.path == "/broken":
                return web.Response(status=500, text="boom")
            if request.path == "/custom":
                return web.Response(text="custom_metric 1\n")
            return web.Response(text=APP_TEXT, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/{tail:.*}", serve)
        self._runner, self.port = await serve_app(app)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def app():
    a = App()
    await a.start()
    yield a
    await a.stop()


def annotated(namespace: str, name: str, node: str, port: int | str, **extra: str) -> dict:
    obj = make_pod(namespace, name, node)
    obj["status"]["podIP"] = "127.0.0.1"
    obj["metadata"]["annotations"] = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        **extra,
    }
    return obj


async def test_scrapes_annotated_pods_of_this_node_only(fake_kube, app: App) -> None:
    fake_kube.upsert(annotated("default", "web-1", "node-a", app.port))
    fake_kube.upsert(annotated("default", "custom-1", "node-a", app.port, **{"prometheus.io/path": "custom"}))
    fake_kube.upsert(
        annotated("default", "broken-1", "node-a", app.port, **{"prometheus.io/path": "/broken"})
    )
    fake_kube.upsert(annotated("default", "badport", "node-a", "http"))
    fake_kube.upsert(
        annotated("default", "elsewhere", "node-b", app.port, **{"prometheus.io/path": "/other"})
    )
    plain = make_pod("default", "plain", "node-a")
    plain["status"]["podIP"] = "127.0.0.1"
    fake_kube.upsert(plain)
    pending = annotated("default", "pending", "node-a", app.port, **{"prometheus.io/path": "/pending"})
    pending["status"]["phase"] = "Pending"
    fake_kube.upsert(pending)

    client = await KubeClient.load(str(fake_kube.kubeconfig))
    informer = pod_informer(client, "node-a")
    source = AppSource(informer.values, timeout=5.0)
    try:
        await informer.start()
        assert {p.name for p in informer.values()} == {
            "web-1",
            "custom-1",
            "broken-1",
            "badport",
            "plain",
            "pending",
        }
        buffer = SampleBuffer()
        buffer.add_many(await source.collect(1_700_000_100.0))
        for metric, kind in source.types.items():
            buffer.declare(metric, kind)
        types, samples = parse_agent_text(buffer.render().decode())

        assert app.hits == {"/metrics": 1, "/custom": 1, "/broken": 1}
        assert source.errors == {"malformed": 2, "scrape": 1, "annotation": 1}
        assert source.last_scraped == 2
        web1 = ObjectRef("pods", "default", "web-1")
        got = {(m, o, lb): (v, ms) for m, o, lb, v, ms in samples}
        # the app's labels are kept, its kcms_ label dropped; its own timestamp is kept
        value, _ = got[("http_requests_total", web1, (("code", "200"), ("path", "/")))]
        assert value == 1027
        assert got[("http_requests_total", web1, (("code", "500"), ("path", "/api")))] == (3, 1700000000123)
        assert got[("queue_depth", web1, ())][0] == 7.5
        assert got[("latency_seconds_bucket", web1, (("le", "+Inf"),))][0] == 12
        assert got[("custom_metric", ObjectRef("pods", "default", "custom-1"), ())][0] == 1
        assert not any(m in ("summary_without_data", "bad_value") for m, *_ in samples)
        assert types["latency_seconds_count"] == "counter" and types["queue_depth"] == "gauge"
        assert types["latency_seconds_bucket"] == "counter"

        # a deleted pod is no longer scraped
        fake_kube.delete("pods", "default", "custom-1")
        await eventually(lambda: all(p.name != "custom-1" for p in informer.values()))
        await source.collect(1_700_000_110.0)
        assert app.hits["/custom"] == 1 and app.hits["/metrics"] == 2
    finally:
        await source.close()
        await informer.stop()
        await client.close()


async def test_unreachable_endpoint_counts_a_failed_scrape(app: App) -> None:
    await app.stop()  # the port is now closed
    pod = agent_pod_from_json(annotated("default", "gone", "node-a", app.port))
    source = AppSource(lambda: [pod], timeout=2.0)
    try:
        assert await source.collect(1.0) == []
        assert source.errors["scrape"] == 1
    finally:
        await source.close()


def test_scrape_url_from_annotations() -> None:
    def url(**ann: str) -> str | None:
        obj = make_pod("ns", "p", "n")
        obj["status"]["podIP"] = "10.0.0.7"
        obj["metadata"]["annotations"] = ann
        return scrape_url(agent_pod_from_json(obj))

    assert url() is None
    assert url(**{"prometheus.io/scrape": "false", "prometheus.io/port": "80"}) is None
    assert (
        url(**{"prometheus.io/scrape": "true", "prometheus.io/port": "8080"})
        == "http://10.0.0.7:8080/metrics"
    )
    assert (
        url(
            **{
                "prometheus.io/scrape": "True",
                "prometheus.io/port": "443",
                "prometheus.io/scheme": "https",
                "prometheus.io/path": "/m",
            }
        )
        == "https://10.0.0.7:443/m"
    )
    for bad in (
        {"prometheus.io/port": "0"},
        {"prometheus.io/port": "99999"},
        {},
        {"prometheus.io/port": "80", "prometheus.io/scheme": "ftp"},
    ):
        with pytest.raises(ValueError):
            url(**{"prometheus.io/scrape": "true", **bad})


def test_parse_exposition_counts_malformed_and_keeps_timestamps() -> None:
    obj = ObjectRef("pods", "a", "b")
    types: dict[str, str] = {}
    samples, malformed = parse_exposition(APP_TEXT, obj, 42.0, types)
    assert malformed == 2
    assert ("queue_depth", obj, (), 42.0, 7.5) in samples
    assert ("http_requests_total", obj, (("code", "500"), ("path", "/api")), 1700000000.123, 3.0) in samples
    assert types["http_requests_total"] == "counter"
