"""custom.metrics.k8s.io over real HTTPS: objects and labels from the Kubernetes API (a fake API
server), and reads by real clients (the kubectl binary, the official Python client)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from _custom_helpers import (
    KUBECTL,
    V1,
    V2,
    Served,
    api_fixture,  # noqa: F401  (pytest fixture)
    fill,
    inventory,
    start_served,
)
from _kubectl import get_raw
from fake_more_resources import FakeResources
from fakeobjects import make_node, make_pod

from kcms.apis.objects import ObjectLabels
from kcms.model import ObjectRef
from kcms.store.series import SeriesStore


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
    kubectl = get_raw(api.kubeconfig)

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


P99_RATE_5M = "http_requests_per_second_agg_p99_5m"  # the canonical autoscaling query


@pytest.mark.skipif(KUBECTL is None, reason="kubectl binary not installed")
async def test_kubectl_reads_the_p99_of_a_rate(api: Served):
    kubectl = get_raw(api.kubeconfig)
    body = await asyncio.to_thread(kubectl, f"{V2}/namespaces/shop/pods/web-2/{P99_RATE_5M}")
    [item] = body["items"]
    assert (item["metric"]["name"], item["value"]) == (P99_RATE_5M, "10")
    assert item["windowSeconds"] == int(api.times[-1] - api.times[0])


async def test_official_python_client_reads_the_p99_of_a_rate(api: Served):
    import kubernetes

    def read() -> dict:
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(api.kubeconfig), client_configuration=cfg)
        with kubernetes.client.ApiClient(cfg) as client:
            # the object name "*" and the metric are two path segments, which the generated
            # CustomObjectsApi cannot express (it escapes the slash): the client's own call path
            method, url, headers, body, post = client.param_serialize(
                "GET",
                "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/{name}/{metric}",
                path_params={"namespace": "shop", "name": "*", "metric": P99_RATE_5M},
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = client.call_api(method, url, headers, body, post)
            response.read()
            return json.loads(response.data)

    body = await asyncio.to_thread(read)
    got = {i["describedObject"]["name"]: (i["value"], i["windowSeconds"]) for i in body["items"]}
    span = int(api.times[-1] - api.times[0])
    assert got == {"web-1": ("10", span), "web-2": ("10", span), "db-1": ("500m", span)}


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
