"""custom.metrics.k8s.io (v1beta2 and v1beta1) over real HTTPS through AggregatedAPIServer, served by a
StoreProvider over a real SeriesStore: path forms and response shapes, label and metric-label selectors,
computed metrics (aggregations and rates). See also test_custom_metrics_errors.py and
test_custom_metrics_clients.py; helpers in _custom_helpers.py."""

from __future__ import annotations

import time
from decimal import Decimal
from urllib.parse import quote

import pytest
from _custom_helpers import (
    V1,
    V2,
    WEB2_DEPTH,
    Served,
    api_fixture,  # noqa: F401  (pytest fixture)
    fill,  # noqa: F401  (re-exported: other test modules import it from here)
    inventory,
    nearest_rank,
    pod,
    rfc3339,
    start_served,
)

from kcms.apis.objects import ObjectLabels
from kcms.quantity import parse_quantity
from kcms.store.series import SeriesStore


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


@pytest.mark.parametrize("version", [V2, V1])
async def test_window_aggregations_of_rates_through_the_api(api: Served, version: str):
    """The HPA's p99 of a request rate over 5 minutes: fn over the rates between consecutive counter
    points in the window. web-1 counts 100 per 10 s; web-2 too until it restarts before its last
    point (50 counted since: 5/s); db-1 counts 5 per 10 s."""
    window = "windowSeconds" if version == V2 else "window"

    async def read(metric: str) -> dict[str, tuple[str, int]]:
        items = await api.items(f"{version}/namespaces/shop/pods/*/{metric}")
        return {i["describedObject"]["name"]: (i["value"], i[window]) for i in items}

    span = int(api.times[-1] - api.times[0])  # 50 s: every point of the fill lies in 5 minutes
    assert await read("http_requests_per_second_agg_p99_5m") == {
        "web-1": ("10", span),
        "web-2": ("10", span),  # rates 10, 10, 10, 10, 5
        "db-1": ("500m", span),
    }
    assert (await read("http_requests_per_second_agg_min_5m"))["web-2"] == ("5", span)
    assert (await read("http_requests_per_second_agg_avg_5m"))["web-2"] == ("9", span)  # 45 / 5
    # 20 s: the last three points, two rates (10 and 5); latest: the last rate, over its 10 s
    assert (await read("http_requests_per_second_agg_p50_20s"))["web-2"] == ("5", 20)
    assert (await read("http_requests_per_second_agg_max_20s"))["web-2"] == ("10", 20)
    assert (await read("http_requests_per_second_agg_latest_5m"))["web-2"] == ("5", 10)
    # a window holding one point of each counter has no rate: an empty list, not an error
    assert await api.items(f"{version}/namespaces/shop/pods/*/http_requests_per_second_agg_p99_5s") == []
    # a malformed composed name is the client's mistake, named in a 400 Status
    status, body = await api.get(f"{version}/namespaces/shop/pods/*/http_requests_per_second_agg_p42_5m")
    assert status == 400 and body["kind"] == "Status" and "p42" in body["message"]


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
