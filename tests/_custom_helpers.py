"""Helpers and fixtures shared by the custom.metrics.k8s.io tests (test_custom_metrics_*.py): the
data every test reads, the object inventory, and a running AggregatedAPIServer with the custom and
external metrics APIs. The ``api`` fixture is declared with ``name=`` so that test modules can import
it without shadowing warnings."""

from __future__ import annotations

import base64
import json
import math
import ssl
import time
from pathlib import Path

import aiohttp
import pytest
from _kubectl import KUBECTL  # noqa: F401 (re-exported to the tests)
from fakeobjects import make_node, make_pod

from kcms.apis.custom import CustomMetricsAPI
from kcms.apis.external import ExternalMetricsAPI
from kcms.apis.objects import ObjectLabels
from kcms.apis.provider import StoreProvider
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions
from kcms.kube.inventory import StaticInventory
from kcms.model import ObjectRef, UserInfo
from kcms.store.series import SeriesStore

V2 = "/apis/custom.metrics.k8s.io/v1beta2"
V1 = "/apis/custom.metrics.k8s.io/v1beta1"


def point_times() -> list[float]:
    """Six whole-second timestamps 10 s apart, the last one now (taken when a test fills its store,
    so that a long test session never makes the data stale)."""
    base = float(int(time.time()) - 50)
    return [base + 10 * i for i in range(6)]


def rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def nearest_rank(values: list[float], p: int) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def pod(ns: str, name: str) -> ObjectRef:
    return ObjectRef("pods", ns, name)


WEB2_DEPTH = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
WEB2_COUNTER = [100.0, 200.0, 300.0, 400.0, 500.0, 50.0]  # restarted before the last point


def fill(store: SeriesStore) -> list[float]:
    """The data every test reads; returns the points' timestamps."""
    times = point_times()
    samples = []
    for i, t in enumerate(times):
        samples += [
            ("queue_depth", pod("shop", "web-1"), (), t, float(i + 1)),
            ("queue_depth", pod("shop", "web-2"), (), t, WEB2_DEPTH[i]),
            ("http_requests_total", pod("shop", "web-1"), (), t, 100.0 * i),
            ("http_requests_total", pod("shop", "web-2"), (), t, WEB2_COUNTER[i]),
            ("http_requests_total", pod("shop", "db-1"), (), t, 5.0 * i),
            ("requests_in_flight", pod("shop", "web-1"), (("path", "a"),), t, 1.5),
            ("requests_in_flight", pod("shop", "web-1"), (("path", "b"),), t, 0.25),
            ("node_temperature", ObjectRef("nodes", "", "n1"), (), t, 41.5),
            ("node_temperature", ObjectRef("nodes", "", "n2"), (), t, 60.0),
            ("namespace_quota_used", ObjectRef("namespaces", "", "shop"), (), t, 0.75),
            ("replicas_wanted", ObjectRef("deployments.apps", "shop", "web"), (), t, 3.0),
            ("replicas_wanted", ObjectRef("deployments.apps", "shop", "api"), (), t, 5.0),
            ("queue_messages", ObjectRef("", "shop", ""), (("queue", "orders"),), t, 40.0 + i),
            ("queue_messages", ObjectRef("", "shop", ""), (("queue", "billing"),), t, 7.0),
            ("queue_messages", ObjectRef("", "", ""), (("queue", "global"),), t, 1.0),
        ]
    samples.append(("queue_depth", pod("shop", "db-1"), (), times[-1], 7.0))
    samples.append(("queue_depth", pod("other", "web-9"), (), times[-1], 9.0))
    assert store.append_many(samples) == len(samples)
    return times


def inventory() -> StaticInventory:
    objs = [
        make_node("n1", {"zone": "a"}),
        make_node("n2", {"zone": "b"}),
        make_pod("shop", "web-1", "n1", {"app": "web", "tier": "front"}),
        make_pod("shop", "web-2", "n2", {"app": "web", "tier": "front"}),
        make_pod("shop", "db-1", "n1", {"app": "db"}),
        make_pod("other", "web-9", "n2", {"app": "web"}),
    ]
    return StaticInventory(objs)


READER = "reader-token"


class StaticTokens:
    """A TokenAuthenticator with one known token, so that kubectl (which prompts for credentials
    when the kubeconfig has none) can talk to the server; unauthenticated requests stay anonymous."""

    async def authenticate(self, token: str) -> UserInfo | None:
        return UserInfo("reader", "42", ("readers",)) if token == READER else None


class Served:
    """A running AggregatedAPIServer with the custom and external metrics APIs installed."""

    def __init__(self, server: AggregatedAPIServer, store: SeriesStore, tmp: Path) -> None:
        self.server = server
        self.store = store
        self.times: list[float] = []  # the timestamps fill() wrote, when it did
        self.url = f"https://127.0.0.1:{server.port}"
        self.ssl = ssl.create_default_context(cafile=server.serving_cert_file)
        ca_data = base64.b64encode(Path(server.serving_cert_file).read_bytes()).decode()
        self.kubeconfig = tmp / "cm.kubeconfig"
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "k", "cluster": {"server": self.url, "certificate-authority-data": ca_data}}
                    ],
                    "users": [{"name": "reader", "user": {"token": READER}}],
                    "contexts": [{"name": "k", "context": {"cluster": "k", "user": "reader"}}],
                    "current-context": "k",
                }
            )
        )

    async def get(self, path: str, accept: str = "application/json") -> tuple[int, dict]:
        async with aiohttp.ClientSession() as s:
            async with s.get(self.url + path, ssl=self.ssl, headers={"Accept": accept}) as r:
                return r.status, json.loads(await r.text())

    async def ok(self, path: str) -> dict:
        status, body = await self.get(path)
        assert status == 200, body
        return body

    async def items(self, path: str) -> list[dict]:
        body = await self.ok(path)
        assert body["kind"] in ("MetricValueList", "ExternalMetricValueList")
        return body["items"]


async def start_served(
    tmp: Path, store: SeriesStore, objects: ObjectLabels, **api_args
) -> tuple[Served, CustomMetricsAPI, ExternalMetricsAPI]:
    provider = StoreProvider(store, objects.namespaced)
    custom = CustomMetricsAPI([provider], objects, **api_args)
    external = ExternalMetricsAPI([provider], **api_args)
    server = AggregatedAPIServer(
        ServingOptions(secure_port=0, bind_address="127.0.0.1", cert_dir=str(tmp / "certs")),
        AuthnOptions(skip_lookup=True, allow_anonymous=True, token_reviewer=StaticTokens()),
        AuthzOptions(allow_all=True),
    )
    for gv in custom.group_versions():
        server.install(gv)
    server.install(external.group_version())
    await server.start()
    return Served(server, store, tmp), custom, external


@pytest.fixture(name="api")
async def api_fixture(tmp_path):
    store = SeriesStore()
    times = fill(store)
    served, _, _ = await start_served(tmp_path, store, ObjectLabels(inventory()))
    served.times = times
    try:
        yield served
    finally:
        await served.server.stop()
