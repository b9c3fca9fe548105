"""custom.metrics.k8s.io (v1beta2 and v1beta1) over real HTTPS through AggregatedAPIServer, served by a
StoreProvider over a real SeriesStore filled here; objects from a StaticInventory and (for other
resources) a second fake API server. Read with aiohttp, the kubectl binary and the official client."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import shutil
import ssl
import subprocess
import time
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
from fake_more_resources import FakeResources
from fakeobjects import make_node, make_pod

from kcms.apis.custom import CustomMetricsAPI
from kcms.apis.external import ExternalMetricsAPI
from kcms.apis.objects import ObjectLabels
from kcms.apis.provider import StoreProvider
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions
from kcms.kube.inventory import StaticInventory
from kcms.model import ObjectRef, UserInfo
from kcms.quantity import parse_quantity
from kcms.store.series import SeriesStore

KUBECTL = shutil.which("kubectl")
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


@pytest.fixture
async def api(tmp_path):
    store = SeriesStore()
    times = fill(store)
    served, _, _ = await start_served(tmp_path, store, ObjectLabels(inventory()))
    served.times = times
    try:
        yield served
    finally:
        await served.server.stop()


# ---- shapes ------------------------------------------------------------------------------------
async def test_v1beta2_named_pod_exact_shape(api: Served):
    body = await api.ok(f"{V2}/namespaces/shop/pods/web-1/queue_depth")
    assert body == {
        "kind": "MetricValueList",
        "apiVersion": "custom.metrics.k8s.io/v1beta2",
        "metadata": {},
        "items": [
            {
                "describedObject": {"kind": "Pod", "namespace": "shop", "name": "web-1", "apiVersion": "/v1"},
                "metric": {"name": "queue_depth"},
                "timestamp": rfc3339(api.times[-1]),
                "value": "6",
            }
        ],
    }


async def test_v1beta1_named_pod_exact_shape(api: Served):
    body = await api.ok(f"{V1}/namespaces/shop/pods/web-1/queue_depth")
    assert body == {
        "kind": "MetricValueList",
        "apiVersion": "custom.metrics.k8s.io/v1beta1",
        "metadata": {},
        "items": [
            {
                "describedObject": {"kind": "Pod", "namespace": "shop", "name": "web-1", "apiVersion": "/v1"},
                "metricName": "queue_depth",
                "timestamp": rfc3339(api.times[-1]),
                "value": "6",
                "selector": None,
            }
        ],
    }


@pytest.mark.parametrize("base", [V2, V1])
async def test_cluster_scoped_nodes(api: Served, base: str):
    items = await api.items(f"{base}/nodes/n1/node_temperature")
    assert [i["describedObject"] for i in items] == [{"kind": "Node", "name": "n1", "apiVersion": "/v1"}]
    assert items[0]["value"] == "41500m"
    items = await api.items(f"{base}/nodes/*/node_temperature")
    assert [(i["describedObject"]["name"], i["value"]) for i in items] == [("n1", "41500m"), ("n2", "60")]
    items = await api.items(f"{base}/nodes/*/node_temperature?labelSelector=zone%3Db")
    assert [i["describedObject"]["name"] for i in items] == ["n2"]


@pytest.mark.parametrize("base", [V2, V1])
async def test_namespace_object_paths(api: Served, base: str):
    want = {"kind": "Namespace", "name": "shop", "apiVersion": "/v1"}
    items = await api.items(f"{base}/namespaces/shop/metrics/namespace_quota_used")
    assert [(i["describedObject"], i["value"]) for i in items] == [(want, "750m")]
    # the cluster-scoped form of the same object
    items = await api.items(f"{base}/namespaces/shop/namespace_quota_used")
    assert [(i["describedObject"], i["value"]) for i in items] == [(want, "750m")]
    status, body = await api.get(f"{base}/namespaces/other/metrics/namespace_quota_used")
    assert status == 404 and body["reason"] == "NotFound"
    assert body["message"] == "the server could not find the metric namespace_quota_used for namespaces other"


async def test_group_resource_without_selector(api: Served):
    items = await api.items(f"{V2}/namespaces/shop/deployments.apps/web/replicas_wanted")
    assert items[0]["describedObject"] == {
        "kind": "Deployment",
        "namespace": "shop",
        "name": "web",
        "apiVersion": "apps/v1",
    }
    assert items[0]["value"] == "3"
    items = await api.items(f"{V2}/namespaces/shop/deployments.apps/*/replicas_wanted")
    assert [(i["describedObject"]["name"], i["value"]) for i in items] == [("api", "5"), ("web", "3")]


# ---- selectors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("base", [V2, V1])
async def test_wildcard_and_label_selector_on_pods(api: Served, base: str):
    items = await api.items(f"{base}/namespaces/shop/pods/*/queue_depth")
    assert [(i["describedObject"]["name"], i["value"]) for i in items] == [
        ("db-1", "7"),
        ("web-1", "6"),
        ("web-2", "60"),
    ]
    sel = quote("app=web,tier in (front)")
    items = await api.items(f"{base}/namespaces/shop/pods/*/queue_depth?labelSelector={sel}")
    assert [i["describedObject"]["name"] for i in items] == ["web-1", "web-2"]
    items = await api.items(f"{base}/namespaces/shop/pods/*/queue_depth?labelSelector=app%21%3Dweb")
    assert [i["describedObject"]["name"] for i in items] == ["db-1"]
    # a selector matching no object, and a metric no object has: empty lists, not errors
    assert await api.items(f"{base}/namespaces/shop/pods/*/queue_depth?labelSelector=app%3Dnone") == []
    assert await api.items(f"{base}/namespaces/shop/pods/*/no_such_metric") == []
    # namespaces are kept apart
    items = await api.items(f"{base}/namespaces/other/pods/*/queue_depth")
    assert [(i["describedObject"]["name"], i["value"]) for i in items] == [("web-9", "9")]


async def test_metric_label_selector_v1beta2(api: Served):
    items = await api.items(f"{V2}/namespaces/shop/pods/web-1/requests_in_flight")
    assert sorted(i["value"] for i in items) == ["1500m", "250m"]
    assert all(i["metric"] == {"name": "requests_in_flight"} for i in items)
    items = await api.items(
        f"{V2}/namespaces/shop/pods/web-1/requests_in_flight?metricLabelSelector=path%3Da"
    )
    assert [(i["value"], i["metric"]["selector"]) for i in items] == [
        ("1500m", {"matchLabels": {"path": "a"}})
    ]
    sel = quote("path in (x,y),path!=z")  # valid, matches no series: the named object has no such value
    status, body = await api.get(
        f"{V2}/namespaces/shop/pods/web-1/requests_in_flight?metricLabelSelector={sel}"
    )
    assert status == 404 and body["reason"] == "NotFound"
    items = await api.items(f"{V2}/namespaces/shop/pods/*/requests_in_flight?metricLabelSelector={sel}")
    assert items == []
    items = await api.items(f"{V2}/namespaces/shop/pods/*/requests_in_flight?metricLabelSelector=path%3Db")
    assert [i["value"] for i in items] == ["250m"]
    assert items[0]["metric"] == {"name": "requests_in_flight", "selector": {"matchLabels": {"path": "b"}}}


async def test_metric_label_selector_with_real_label_values(tmp_path):
    store = SeriesStore()
    for code, v in (("200", 10.0), ("500", 2.0), ("404", 1.0)):
        store.append("responses", pod("shop", "web-1"), (("code", code),), time.time(), v)
    served, _, _ = await start_served(tmp_path, store, ObjectLabels(inventory()))
    try:
        path = f"{V2}/namespaces/shop/pods/web-1/responses?metricLabelSelector=" + quote("code in (500,404)")
        items = await served.items(path)
        assert sorted(i["value"] for i in items) == ["1", "2"]
        assert items[0]["metric"]["selector"] == {
            "matchExpressions": [{"key": "code", "operator": "In", "values": ["404", "500"]}]
        }
        path = f"{V2}/namespaces/shop/pods/web-1/responses?metricLabelSelector=" + quote("code!=200")
        assert sorted(i["value"] for i in await served.items(path)) == ["1", "2"]
        # v1beta1 has no metricLabelSelector: every series answers
        path = f"{V1}/namespaces/shop/pods/web-1/responses?metricLabelSelector=code%3D500"
        assert sorted(i["value"] for i in await served.items(path)) == ["1", "10", "2"]
    finally:
        await served.server.stop()


# ---- computed metrics --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("metric", "fn", "since"),
    [
        ("queue_depth_agg_avg", "avg", 60),  # the store's default window (60 s)
        ("queue_depth_agg_avg_30s", "avg", 30),
        ("queue_depth_agg_max_30s", "max", 30),
        ("queue_depth_agg_min_1m", "min", 60),
        ("queue_depth_agg_p50_30s", "p50", 30),
        ("queue_depth_agg_p90_1m", "p90", 60),
        ("queue_depth_agg_p99_20s", "p99", 20),
    ],
)
async def test_aggregations_through_the_api(api: Served, metric: str, fn: str, since: int):
    last = api.times[-1]
    inside = [(t, v) for t, v in zip(api.times, WEB2_DEPTH, strict=True) if t >= last - since]
    values = [v for _, v in inside]
    if fn == "avg":
        want = sum(values) / len(values)
    elif fn == "max":
        want = max(values)
    elif fn == "min":
        want = min(values)
    else:
        want = nearest_rank(values, int(fn[1:]))
    items = await api.items(f"{V2}/namespaces/shop/pods/web-2/{metric}")
    assert len(items) == 1
    assert parse_quantity(items[0]["value"]) == Decimal(repr(want))
    assert items[0]["windowSeconds"] == int(last - inside[0][0])
    assert items[0]["metric"] == {"name": metric}
    v1 = await api.items(f"{V1}/namespaces/shop/pods/web-2/{metric}")
    assert v1[0]["window"] == items[0]["windowSeconds"] and v1[0]["value"] == items[0]["value"]


async def test_rates_through_the_api(api: Served):
    items = await api.items(f"{V2}/namespaces/shop/pods/*/http_requests_per_second")
    got = {i["describedObject"]["name"]: (i["value"], i["windowSeconds"]) for i in items}
    assert got == {
        "db-1": ("500m", 10),  # 5 per 10 s
        "web-1": ("10", 10),  # 100 per 10 s
        "web-2": ("5", 10),  # restarted: 50 since the reset, over 10 s; never negative
    }
    # the counter itself, as a gauge
    items = await api.items(f"{V2}/namespaces/shop/pods/web-1/http_requests_total")
    assert items[0]["value"] == "500" and "windowSeconds" not in items[0]


# ---- errors ------------------------------------------------------------------------------------
async def test_named_object_without_the_metric_is_404(api: Served):
    status, body = await api.get(f"{V2}/namespaces/shop/pods/web-3/queue_depth")
    assert status == 404
    assert body["kind"] == "Status" and body["reason"] == "NotFound" and body["code"] == 404
    assert body["message"] == "the server could not find the metric queue_depth for pods web-3"
    status, body = await api.get(f"{V1}/nodes/n1/queue_depth")
    assert (
        status == 404 and body["message"] == "the server could not find the metric queue_depth for nodes n1"
    )


@pytest.mark.parametrize(
    "path",
    [
        f"{V2}/namespaces/shop/widgets.example.com/x/queue_depth",
        f"{V2}/widgets/x/queue_depth",
        f"{V2}/namespaces/shop/Pods/web-1/queue_depth",
        f"{V2}/namespaces/shop/nodes/n1/node_temperature",  # cluster-scoped asked in a namespace
        f"{V2}/pods/web-1/queue_depth",  # namespaced asked cluster-wide
    ],
)
async def test_unknown_resource_is_404(api: Served, path: str):
    status, body = await api.get(path)
    assert status == 404 and body["kind"] == "Status" and body["reason"] == "NotFound", body


@pytest.mark.parametrize(
    ("path", "words"),
    [
        (f"{V2}/namespaces/shop/pods/web-1/queue-depth", "invalid metric name"),
        (f"{V2}/namespaces/shop/pods/web-1/queue.depth", "invalid metric name"),
        (f"{V2}/namespaces/shop/pods/web-1/9lives", "invalid metric name"),
        (f"{V2}/namespaces/shop/pods/web-1/queue_depth_agg_p42", "unknown aggregation function"),
        (f"{V2}/namespaces/shop/pods/web-1/queue_depth_agg_avg_5x", "invalid aggregation window"),
        (f"{V2}/namespaces/shop/pods/web-1/queue_depth_agg_avg_2h", "longer than the retention"),
        (f"{V2}/namespaces/shop/pods/*/queue_depth?labelSelector=app+in+%28", "labelSelector"),
        (f"{V2}/namespaces/shop/pods/*/queue_depth?metricLabelSelector=%3D%3D", "metricLabelSelector"),
        (f"{V1}/nodes/*/node_temperature?labelSelector=zone%3D%3D%3D", "labelSelector"),
    ],
)
async def test_malformed_requests_are_400(api: Served, path: str, words: str):
    status, body = await api.get(path)
    assert status == 400, body
    assert body["kind"] == "Status" and body["reason"] == "BadRequest"
    assert words in body["message"]


@pytest.mark.parametrize(
    "tail",
    ["queue%2Fdepth", "queue%2F..%2Fdepth", "%2E%2E", "queue_depth%00", "qu%C3%A9ue", "x" * 300],
)
async def test_odd_metric_names_are_clean_errors(api: Served, tail: str):
    status, body = await api.get(f"{V2}/namespaces/shop/pods/web-1/{tail}")
    assert status in (400, 404), body
    assert body["kind"] == "Status"


async def test_stale_series_are_missing_not_frozen(tmp_path):
    store = SeriesStore(stale_after=60.0)
    now = time.time()
    store.append("queue_depth", pod("shop", "web-1"), (), now - 120, 5.0)
    store.append("queue_depth", pod("shop", "web-2"), (), now - 1, 6.0)
    served, _, _ = await start_served(tmp_path, store, ObjectLabels(inventory()))
    try:
        status, _ = await served.get(f"{V2}/namespaces/shop/pods/web-1/queue_depth")
        assert status == 404
        items = await served.items(f"{V2}/namespaces/shop/pods/*/queue_depth")
        assert [i["describedObject"]["name"] for i in items] == ["web-2"]
    finally:
        await served.server.stop()


# ---- discovery ---------------------------------------------------------------------------------
async def test_discovery_shape(api: Served):
    group = await api.ok("/apis/custom.metrics.k8s.io")
    assert group["preferredVersion"] == {
        "groupVersion": "custom.metrics.k8s.io/v1beta2",
        "version": "v1beta2",
    }
    assert [v["version"] for v in group["versions"]] == ["v1beta2", "v1beta1"]
    for base in (V2, V1):
        body = await api.ok(base)
        assert body["kind"] == "APIResourceList"
        assert body["groupVersion"] == base.removeprefix("/apis/")
        by_name = {r["name"]: r for r in body["resources"]}
        assert by_name["pods/queue_depth"] == {
            "name": "pods/queue_depth",
            "singularName": "",
            "namespaced": True,
            "kind": "MetricValueList",
            "verbs": ["get"],
        }
        assert by_name["nodes/node_temperature"]["namespaced"] is False
        assert by_name["namespaces/namespace_quota_used"]["namespaced"] is False
        assert by_name["deployments.apps/replicas_wanted"]["namespaced"] is True
        assert "pods/http_requests_per_second" in by_name and "pods/http_requests_total" in by_name
        assert not any(name.startswith("/") for name in by_name)  # external metrics stay out
        assert len(by_name) == len(body["resources"])


async def test_discovery_never_empty_and_cached(tmp_path):
    now = [1000.0]
    store = SeriesStore()
    served, custom, _ = await start_served(
        tmp_path, store, ObjectLabels(inventory()), discovery_ttl=1.0, clock=lambda: now[0]
    )
    try:
        for base in (V2, V1):
            body = await served.ok(base)
            assert len(body["resources"]) == 1
            assert body["resources"][0]["kind"] == "MetricValueList" and body["resources"][0]["verbs"] == [
                "get"
            ]
        store.append("queue_depth", pod("shop", "web-1"), (), time.time(), 1.0)
        body = await served.ok(V2)  # within the cache's second: still the placeholder
        assert [r["name"] for r in body["resources"]] == ["custommetrics"]
        now[0] += 1.5
        body = await served.ok(V2)
        assert [r["name"] for r in body["resources"]] == ["pods/queue_depth"]
        # a thousand metrics
        t = time.time()
        store.append_many((f"m_{i:04d}", pod("shop", "web-1"), (), t, float(i)) for i in range(1000))
        now[0] += 1.5
        body = await served.ok(V2)
        assert len(body["resources"]) == 1001
        assert custom.resources() is custom.resources()  # served from the cache
    finally:
        await served.server.stop()


async def test_openapi_documents_both_versions(api: Served):
    doc = await api.ok("/openapi/v2")
    assert f"{V2}/namespaces/{{namespace}}/{{resource}}/{{name}}/{{metric}}" in doc["paths"]
    assert f"{V1}/namespaces/{{namespace}}/metrics/{{metric}}" in doc["paths"]
    assert "io.k8s.metrics.pkg.apis.custom_metrics.v1beta2.MetricValueList" in doc["definitions"]
    assert "io.k8s.metrics.pkg.apis.custom_metrics.v1beta1.MetricValue" in doc["definitions"]


async def test_table_output(api: Served):
    status, body = await api.get(
        f"{V2}/namespaces/shop/pods/*/queue_depth", accept="application/json;as=Table;g=meta.k8s.io;v=v1"
    )
    assert status == 200 and body["kind"] == "Table"
    assert [r["cells"][:3] for r in body["rows"]] == [
        ["db-1", "queue_depth", "7"],
        ["web-1", "queue_depth", "6"],
        ["web-2", "queue_depth", "60"],
    ]


# ---- objects from the Kubernetes API -----------------------------------------------------------
async def test_label_selector_on_namespaces_and_deployments_from_the_api(ca, tmp_path):
    async with FakeResources(ca) as fake:
        fake.add("namespaces", "", "shop", {"team": "a"})
        fake.add("namespaces", "", "other", {"team": "b"})
        fake.add("deployments.apps", "shop", "web", {"tier": "front"})
        fake.add("deployments.apps", "shop", "api", {"tier": "back"})
        kube = fake.client(tmp_path)
        store = SeriesStore()
        times = fill(store)
        store.append("namespace_quota_used", ObjectRef("namespaces", "", "other"), (), times[-1], 0.5)
        objects = ObjectLabels(inventory(), kube)
        served, _, _ = await start_served(tmp_path, store, objects)
        try:
            items = await served.items(f"{V2}/namespaces/*/namespace_quota_used?labelSelector=team%3Db")
            assert [(i["describedObject"]["name"], i["value"]) for i in items] == [("other", "500m")]
            path = f"{V2}/namespaces/shop/deployments.apps/*/replicas_wanted?labelSelector=tier%3Dfront"
            items = await served.items(path)
            assert [(i["describedObject"], i["value"]) for i in items] == [
                ({"kind": "Deployment", "namespace": "shop", "name": "web", "apiVersion": "apps/v1"}, "3")
            ]
            lists = [(p, q) for p, q in fake.requests if q.get("labelSelector")]
            assert ("/apis/apps/v1/namespaces/shop/deployments", {"labelSelector": "tier=front"}) in lists
            assert ("/api/v1/namespaces", {"labelSelector": "team=b"}) in lists
            # a second read within the cache's seconds does not list again
            before = objects.api_lists
            await served.items(path)
            assert objects.api_lists == before
            # pods come from the inventory, not the API
            items = await served.items(f"{V2}/namespaces/shop/pods/*/queue_depth?labelSelector=app%3Ddb")
            assert [i["describedObject"]["name"] for i in items] == ["db-1"]
            assert not any(p.endswith("/pods") for p, _ in fake.requests)
            # a custom resource: kind and version come from the API's discovery
            fake.add_resource("example.com", "v1alpha1", "widgets", "Widget", True)
            fake.add("widgets.example.com", "shop", "w1", {"color": "red"})
            fake.add("widgets.example.com", "shop", "w2", {"color": "blue"})
            for name, v in (("w1", 1.0), ("w2", 2.0)):
                store.append("spin", ObjectRef("widgets.example.com", "shop", name), (), time.time(), v)
            items = await served.items(
                f"{V2}/namespaces/shop/widgets.example.com/*/spin?labelSelector=color%3Dblue"
            )
            assert [(i["describedObject"], i["value"]) for i in items] == [
                (
                    {
                        "kind": "Widget",
                        "namespace": "shop",
                        "name": "w2",
                        "apiVersion": "example.com/v1alpha1",
                    },
                    "2",
                )
            ]
            assert (
                "/apis/example.com/v1alpha1/namespaces/shop/widgets",
                {"labelSelector": "color=blue"},
            ) in [(p, q) for p, q in fake.requests]
            # a group the API does not serve
            status, body = await served.get(
                f"{V2}/namespaces/shop/gadgets.example.org/*/m?labelSelector=a%3Db"
            )
            assert status == 404 and body["kind"] == "Status"
        finally:
            await served.server.stop()
            await kube.close()


async def test_label_selector_on_other_resources_without_api_is_503(api: Served):
    status, body = await api.get(
        f"{V2}/namespaces/shop/deployments.apps/*/replicas_wanted?labelSelector=a%3Db"
    )
    assert status == 503 and body["kind"] == "Status"
    assert "no access to the Kubernetes API" in body["message"]


# ---- real clients ------------------------------------------------------------------------------
@pytest.mark.skipif(KUBECTL is None, reason="kubectl binary not installed")
async def test_kubectl_get_raw(api: Served):
    def kubectl(path: str) -> dict:
        out = subprocess.run(
            [KUBECTL, "--kubeconfig", str(api.kubeconfig), "get", "--raw", path],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    body = await asyncio.to_thread(
        kubectl, f"{V2}/namespaces/shop/pods/*/queue_depth?labelSelector=app%3Dweb"
    )
    assert [(i["describedObject"]["name"], i["value"]) for i in body["items"]] == [
        ("web-1", "6"),
        ("web-2", "60"),
    ]
    body = await asyncio.to_thread(kubectl, f"{V1}/namespaces/shop/metrics/namespace_quota_used")
    assert body["items"][0]["metricName"] == "namespace_quota_used"
    body = await asyncio.to_thread(kubectl, V2)
    assert any(r["name"] == "pods/queue_depth" for r in body["resources"])


async def test_official_python_client(api: Served):
    import kubernetes

    def read() -> tuple[dict, dict]:
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(api.kubeconfig), client_configuration=cfg)
        with kubernetes.client.ApiClient(cfg) as client:
            objs = kubernetes.client.CustomObjectsApi(client)
            ns_metric = objs.get_namespaced_custom_object(
                "custom.metrics.k8s.io", "v1beta2", "shop", "metrics", "namespace_quota_used"
            )
            method, url, headers, body, post = client.param_serialize(
                "GET",
                "/apis/custom.metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/{name}/{metric}",
                path_params={"namespace": "shop", "name": "*", "metric": "http_requests_per_second"},
                query_params=[("labelSelector", "app=web")],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = client.call_api(method, url, headers, body, post)
            response.read()
            pods = json.loads(response.data)
            return ns_metric, pods

    ns_metric, pods = await asyncio.to_thread(read)
    assert ns_metric["items"][0]["describedObject"]["kind"] == "Namespace"
    assert ns_metric["items"][0]["value"] == "750m"
    assert [(i["describedObject"]["name"], i["value"], i["window"]) for i in pods["items"]] == [
        ("web-1", "10", 10),
        ("web-2", "5", 10),
    ]


async def test_label_selector_on_pods_from_a_kube_inventory(fake_kube, tmp_path):
    from kcms.kube.client import KubeClient
    from kcms.kube.inventory import KubeInventory

    fake_kube.upsert(make_node("n1", {"zone": "a"}))
    fake_kube.upsert(make_pod("shop", "web-1", "n1", {"app": "web"}))
    fake_kube.upsert(make_pod("shop", "db-1", "n1", {"app": "db"}))
    kube = await KubeClient.load(str(fake_kube.kubeconfig))
    inv = KubeInventory(kube)
    await inv.start()
    store = SeriesStore()
    fill(store)
    served, _, _ = await start_served(tmp_path, store, ObjectLabels(inv, kube))
    try:
        for _ in range(100):
            if inv.has_synced() and inv.pod("shop", "db-1") is not None:
                break
            await asyncio.sleep(0.05)
        items = await served.items(f"{V2}/namespaces/shop/pods/*/queue_depth?labelSelector=app%3Ddb")
        assert [(i["describedObject"]["name"], i["value"]) for i in items] == [("db-1", "7")]
        # a pod that appears later is selected as soon as the watch delivers it
        fake_kube.upsert(make_pod("shop", "web-2", "n1", {"app": "db"}))
        for _ in range(100):
            if inv.pod("shop", "web-2") is not None:
                break
            await asyncio.sleep(0.05)
        items = await served.items(f"{V2}/namespaces/shop/pods/*/queue_depth?labelSelector=app%3Ddb")
        assert [i["describedObject"]["name"] for i in items] == ["db-1", "web-2"]
        assert not any(q.get("labelSelector") for _, _, q in fake_kube.requests)  # no LIST per request
    finally:
        await served.server.stop()
        await inv.stop()
        await kube.close()
