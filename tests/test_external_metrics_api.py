"""external.metrics.k8s.io/v1beta1 over real HTTPS through AggregatedAPIServer, served by a StoreProvider
over a real SeriesStore (filled by tests/test_custom_metrics_api.fill). Read with aiohttp, kubectl and
the official client."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal
from urllib.parse import quote

import pytest
from _kubectl import KUBECTL, get_raw
from test_custom_metrics_api import Served, fill, inventory, rfc3339, start_served

from kcms.apis.objects import ObjectLabels
from kcms.model import ObjectRef
from kcms.quantity import parse_quantity
from kcms.store.series import SeriesStore

EM = "/apis/external.metrics.k8s.io/v1beta1"


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


async def test_exact_shape(api: Served):
    body = await api.ok(f"{EM}/namespaces/shop/queue_messages?labelSelector=queue%3Dorders")
    assert body == {
        "kind": "ExternalMetricValueList",
        "apiVersion": "external.metrics.k8s.io/v1beta1",
        "metadata": {},
        "items": [
            {
                "metricName": "queue_messages",
                "metricLabels": {"queue": "orders"},
                "timestamp": rfc3339(api.times[-1]),
                "value": "45",
            }
        ],
    }


async def test_selectors_and_namespaces(api: Served):
    items = await api.items(f"{EM}/namespaces/shop/queue_messages")
    # the namespace's own series, then the cluster-wide one (stored without a namespace)
    assert sorted((i["metricLabels"]["queue"], i["value"]) for i in items) == [
        ("billing", "7"),
        ("global", "1"),
        ("orders", "45"),
    ]
    items = await api.items(f"{EM}/namespaces/other/queue_messages")
    assert [i["metricLabels"] for i in items] == [{"queue": "global"}]
    sel = quote("queue notin (global,billing)")
    items = await api.items(f"{EM}/namespaces/shop/queue_messages?labelSelector={sel}")
    assert [i["metricLabels"] for i in items] == [{"queue": "orders"}]
    assert await api.items(f"{EM}/namespaces/shop/queue_messages?labelSelector=queue%3Dnone") == []
    assert await api.items(f"{EM}/namespaces/shop/no_such_metric") == []
    # custom metrics about objects are not external metrics
    assert await api.items(f"{EM}/namespaces/shop/queue_depth") == []


async def test_aggregation_and_rate(api: Served, tmp_path):
    items = await api.items(f"{EM}/namespaces/shop/queue_messages_agg_avg_1m?labelSelector=queue%3Dorders")
    values = [40.0 + i for i in range(6)]
    assert parse_quantity(items[0]["value"]) == Decimal(repr(sum(values) / len(values)))
    assert items[0]["window"] == int(api.times[-1] - api.times[0])
    items = await api.items(f"{EM}/namespaces/shop/queue_messages_agg_max_20s?labelSelector=queue%3Dorders")
    assert items[0]["value"] == "45" and items[0]["window"] == 20


async def test_external_counter_rate(tmp_path):
    store = SeriesStore()
    base = float(int(time.time()) - 4)
    store.append("jobs_done_total", ObjectRef("", "batch", ""), (("queue", "q1"),), base, 100.0)
    store.append("jobs_done_total", ObjectRef("", "batch", ""), (("queue", "q1"),), base + 4, 102.0)
    served, _, _ = await start_served(tmp_path, store, ObjectLabels(inventory()))
    try:
        items = await served.items(f"{EM}/namespaces/batch/jobs_done_per_second")
        assert [(i["metricLabels"], i["value"], i["window"]) for i in items] == [({"queue": "q1"}, "500m", 4)]
        body = await served.ok(EM)
        assert {r["name"] for r in body["resources"]} == {"jobs_done_total", "jobs_done_per_second"}
    finally:
        await served.server.stop()


@pytest.mark.parametrize(
    ("tail", "words"),
    [
        ("queue-messages", "invalid metric name"),
        ("queue_messages_agg_median", "unknown aggregation function"),
        ("queue_messages?labelSelector=queue+in+%28a", "labelSelector"),
    ],
)
async def test_malformed_requests_are_400(api: Served, tail: str, words: str):
    status, body = await api.get(f"{EM}/namespaces/shop/{tail}")
    assert status == 400 and body["kind"] == "Status" and body["reason"] == "BadRequest"
    assert words in body["message"]


async def test_odd_paths_are_clean_errors(api: Served):
    for path in (f"{EM}/namespaces/shop/a%2Fb", f"{EM}/namespaces/shop", f"{EM}/queue_messages"):
        status, body = await api.get(path)
        assert status in (400, 404) and body["kind"] == "Status", (path, body)


async def test_discovery(api: Served, tmp_path):
    group = await api.ok("/apis/external.metrics.k8s.io")
    assert group["preferredVersion"]["version"] == "v1beta1"
    body = await api.ok(EM)
    assert body["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    assert body["resources"] == [
        {
            "name": "queue_messages",
            "singularName": "",
            "namespaced": True,
            "kind": "ExternalMetricValueList",
            "verbs": ["get"],
        }
    ]


async def test_discovery_never_empty(tmp_path):
    now = [0.0]
    store = SeriesStore()
    served, _, external = await start_served(
        tmp_path, store, ObjectLabels(inventory()), discovery_ttl=1.0, clock=lambda: now[0]
    )
    try:
        body = await served.ok(EM)
        assert [r["name"] for r in body["resources"]] == ["externalmetrics"]
        assert body["resources"][0]["kind"] == "ExternalMetricValueList"
        store.append("backlog", ObjectRef("", "", ""), (), time.time(), 3.0)
        now[0] += 2
        body = await served.ok(EM)
        assert [r["name"] for r in body["resources"]] == ["backlog"]
        items = await served.items(f"{EM}/namespaces/anywhere/backlog")
        assert [(i["metricLabels"], i["value"]) for i in items] == [({}, "3")]
    finally:
        await served.server.stop()


@pytest.mark.skipif(KUBECTL is None, reason="kubectl binary not installed")
async def test_kubectl_get_raw(api: Served):
    kubectl = get_raw(api.kubeconfig)

    body = await asyncio.to_thread(
        kubectl, f"{EM}/namespaces/shop/queue_messages?labelSelector=queue%3Dbilling"
    )
    assert [(i["metricLabels"], i["value"]) for i in body["items"]] == [({"queue": "billing"}, "7")]


async def test_official_python_client(api: Served):
    import kubernetes

    def read() -> dict:
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(api.kubeconfig), client_configuration=cfg)
        with kubernetes.client.ApiClient(cfg) as client:
            objs = kubernetes.client.CustomObjectsApi(client)
            return objs.list_namespaced_custom_object(
                "external.metrics.k8s.io", "v1beta1", "shop", "queue_messages", label_selector="queue=orders"
            )

    body = await asyncio.to_thread(read)
    assert body["kind"] == "ExternalMetricValueList"
    assert [(i["metricLabels"], i["value"]) for i in body["items"]] == [({"queue": "orders"}, "45")]
