"""custom.metrics.k8s.io over real HTTPS: error statuses, stale series, discovery (never empty,
cached), OpenAPI and table output."""

from __future__ import annotations

import time

import pytest
from _custom_helpers import (
    V1,
    V2,
    Served,
    api_fixture,  # noqa: F401  (pytest fixture)
    inventory,
    pod,
    start_served,
)

from kcms.apis.objects import ObjectLabels
from kcms.store.series import SeriesStore


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
