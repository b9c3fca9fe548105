"""metrics.k8s.io end to end, in one process: simulated kubelets over TLS -> collector -> store ->
aggregated API server, with nodes and pods from the fake API server's list+watch and delegated
authn/authz through its TokenReview and SubjectAccessReview. Read with aiohttp, the real kubectl
binary and the official kubernetes Python client."""

from __future__ import annotations

import asyncio
import copy
import functools
import time

import aiohttp
import pytest
from _kubectl import kubectl_json
from _pipeline import BASE, KUBECTL, READER, Env, start_env, stop_env, wait_ready

from kcms.quantity import parse_quantity
from kcms.sim import SimulatedCluster


@pytest.fixture
async def env(ca, fake_kube, tmp_path):
    sim = SimulatedCluster(
        nodes=3, pods_per_node=4, containers_per_pod=(1, 3), seed=11, ca=ca, one_port_per_node=True
    )
    await sim.start()
    e = await start_env(ca, fake_kube, tmp_path, sim)
    try:
        yield e
    finally:
        await stop_env(e)
        await sim.stop()


def cores(q: str) -> float:
    return float(parse_quantity(q))


async def test_values_are_the_true_rates_and_ready_within_seconds(env: Env):
    ready_after = await wait_ready(env)
    assert ready_after < 10.0  # two readings come ~2 s apart, not two resolutions
    status, body = await env.get(f"{BASE}/nodes")
    assert status == 200, body
    assert body["kind"] == "NodeMetricsList" and body["apiVersion"] == "metrics.k8s.io/v1beta1"
    names = {i["metadata"]["name"] for i in body["items"]}
    assert names == set(env.sim.node_names())
    for item in body["items"]:
        true = env.sim.true_node_rate(item["metadata"]["name"])
        assert cores(item["usage"]["cpu"]) == pytest.approx(true, rel=0.01)
        assert item["usage"]["memory"].endswith("Ki") or item["usage"]["memory"].isdigit()
        assert item["window"].endswith("s") and item["timestamp"].endswith("Z")
        assert item["metadata"]["labels"]["kubernetes.io/hostname"] == item["metadata"]["name"]

    status, body = await env.get(f"{BASE}/pods")
    assert status == 200
    pods = {(i["metadata"]["namespace"], i["metadata"]["name"]): i for i in body["items"]}
    assert len(pods) == 12
    for (ns, name), item in pods.items():
        for c in item["containers"]:
            true = env.sim.true_container_rate(ns, name, c["name"])
            assert cores(c["usage"]["cpu"]) == pytest.approx(true, rel=0.01, abs=2e-9)
            mem = int(parse_quantity(c["usage"]["memory"]))
            assert mem == env.sim.memory_at(ns, name, c["name"], time.time()) or mem > 0


async def test_single_objects_selectors_and_not_found(env: Env):
    await wait_ready(env)
    node = env.sim.node_names()[0]
    status, body = await env.get(f"{BASE}/nodes/{node}")
    assert status == 200 and body["kind"] == "NodeMetrics" and body["metadata"]["name"] == node

    status, body = await env.get(f"{BASE}/nodes/no-such-node")
    assert status == 404
    assert body["kind"] == "Status" and body["reason"] == "NotFound" and body["code"] == 404
    assert body["message"] == 'nodemetrics.metrics.k8s.io "no-such-node" not found'
    assert body["details"] == {"name": "no-such-node", "group": "metrics.k8s.io", "kind": "nodemetrics"}

    status, all_pods = await env.get(f"{BASE}/pods")
    some = all_pods["items"][0]["metadata"]
    ns, name, app = some["namespace"], some["name"], some["labels"]["app"]
    status, body = await env.get(f"{BASE}/namespaces/{ns}/pods/{name}")
    assert status == 200 and body["kind"] == "PodMetrics"
    status, body = await env.get(f"{BASE}/namespaces/{ns}/pods/nope")
    assert status == 404 and body["message"] == 'podmetrics.metrics.k8s.io "nope" not found'

    status, body = await env.get(f"{BASE}/namespaces/{ns}/pods?labelSelector=app%3D{app}")
    same = {i["metadata"]["name"] for i in all_pods["items"]
            if i["metadata"]["namespace"] == ns and i["metadata"]["labels"]["app"] == app}  # fmt: skip
    assert status == 200 and name in same and {i["metadata"]["name"] for i in body["items"]} == same
    status, body = await env.get(f"{BASE}/namespaces/{ns}/pods?labelSelector=app%21%3D{app}")
    assert name not in {i["metadata"]["name"] for i in body["items"]}
    status, body = await env.get(f"{BASE}/pods?fieldSelector=metadata.namespace%3D{ns}")
    assert {i["metadata"]["namespace"] for i in body["items"]} == {ns}
    status, body = await env.get(f"{BASE}/nodes?fieldSelector=metadata.name%3D{node}")
    assert [i["metadata"]["name"] for i in body["items"]] == [node]
    status, body = await env.get(f"{BASE}/nodes?labelSelector=kubernetes.io%2Fhostname+in+%28{node}%29")
    assert [i["metadata"]["name"] for i in body["items"]] == [node]

    status, body = await env.get(f"{BASE}/pods?labelSelector=app+in+%28a")
    assert status == 400 and body["reason"] == "BadRequest"
    status, body = await env.get(f"{BASE}/pods?fieldSelector=spec.nodeName%3Dx")
    assert status == 400 and "spec.nodeName" in body["message"]


async def test_only_running_pods_and_watch_updates(env: Env):
    await wait_ready(env)
    status, body = await env.get(f"{BASE}/pods")
    first = body["items"][0]["metadata"]
    pod = copy.deepcopy(env.fake.get("pods", first["namespace"], first["name"]))
    pod["status"]["phase"] = "Succeeded"
    env.fake.upsert(pod)
    for _ in range(50):  # the watch brings the change within moments
        await asyncio.sleep(0.1)
        status, body = await env.get(f"{BASE}/namespaces/{first['namespace']}/pods/{first['name']}")
        if status == 404:
            break
    assert status == 404


async def test_authn_and_authz_are_delegated(env: Env):
    await wait_ready(env)
    status, body = await env.get(f"{BASE}/nodes", token=None)
    assert status == 401 and body["kind"] == "Status" and body["reason"] == "Unauthorized"
    status, body = await env.get(f"{BASE}/nodes", token="bogus")
    assert status == 401
    env.fake.authorize = lambda spec: (spec["user"] != "reader", "reader may not")
    status, body = await env.get(f"{BASE}/nodes", token=READER)
    assert status == 403 and body["reason"] == "Forbidden"
    sar = env.fake.access_reviews[-1]
    attrs = sar["spec"]["resourceAttributes"]
    assert attrs["group"] == "metrics.k8s.io" and attrs["resource"] == "nodes" and attrs["verb"] == "list"
    # health endpoints need no credentials
    status, _ = await env.get("/livez", token=None, accept=None)
    assert status == 200


async def test_failing_nodes_are_skipped_counted_and_age_out(env: Env):
    await wait_ready(env)
    names = env.sim.node_names()
    env.sim.set_node_mode(names[0], "garbage")
    env.sim.set_node_mode(names[1], "slow")
    collector = env.pipeline.collector
    t0 = time.monotonic()
    failures = await collector.run_cycle()
    assert failures == 2
    assert time.monotonic() - t0 < collector.timeout + 2.0  # the slow node did not hold up the cycle
    status, body = await env.get(f"{BASE}/nodes")
    # still fresh readings from before: served until they age out, never frozen past max_age
    assert {i["metadata"]["name"] for i in body["items"]} >= {names[2]}
    # Older than max_age: gone. (The next cycle takes ~2 s because of the slow node.)
    env.pipeline.store.max_age = 3.0
    await asyncio.sleep(3.1)
    await collector.run_cycle()
    status, body = await env.get(f"{BASE}/nodes")
    assert {i["metadata"]["name"] for i in body["items"]} == {names[2]}
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {READER}"}
        async with s.get(env.url + "/metrics", headers=headers, ssl=env.ssl) as r:
            text = await r.text()
    assert f'kcms_kubelet_scrape_failures_total{{node="{names[0]}",reason="decode_malformed"}}' in text
    assert f'kcms_kubelet_scrape_failures_total{{node="{names[1]}",reason="timeout"}}' in text
    assert 'kcms_store_objects{kind="nodes"} 1.0' in text
    assert "kcms_kubelet_scrape_duration_seconds_bucket" in text
    assert "kcms_apiserver_request_duration_seconds_bucket" in text


async def test_a_node_down_is_retried_every_cycle_listed_as_missing_and_comes_back(env: Env):
    """A node that stops answering is scraped again every cycle; once it has been silent for more
    than a resolution (plus the timeout) it is named in /readyz?verbose and counted in
    kcms_kubelet_nodes_missing, while the server stays ready; when it answers again it is served."""
    await wait_ready(env)
    names = env.sim.node_names()
    collector = env.pipeline.collector
    collector.resolution, collector.timeout = 0.5, 0.5  # a short horizon: 1 s of silence is "missing"

    async def readyz() -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(env.url + "/readyz?verbose", ssl=env.ssl) as r:
            return r.status, await r.text()

    async def missing_gauge() -> float:
        async with aiohttp.ClientSession() as s:
            headers = {"Authorization": f"Bearer {READER}"}
            async with s.get(env.url + "/metrics", headers=headers, ssl=env.ssl) as r:
                text = await r.text()
        (line,) = [ln for ln in text.splitlines() if ln.startswith("kcms_kubelet_nodes_missing ")]
        return float(line.split()[1])

    assert await collector.run_cycle() == 0
    status, text = await readyz()
    assert status == 200 and "[+]nodes-scraped ok\n" in text
    env.sim.set_node_mode(names[0], "down")
    assert await collector.run_cycle() == 1
    await asyncio.sleep(1.1)
    assert await collector.run_cycle() == 1  # scraped again, still down
    status, text = await readyz()
    assert status == 200, text  # a node down is not the server's failure (metrics-server stays ready)
    assert f"[+]nodes-scraped ok: 1 of {len(names)} nodes not scraped for over a resolution: {names[0]}" in text
    assert await missing_gauge() == 1.0
    env.sim.set_node_mode(names[0], "ok")
    assert await collector.run_cycle() == 0
    assert await collector.run_cycle() == 0  # two readings: a rate again
    status, text = await readyz()
    assert "[+]nodes-scraped ok\n" in text and await missing_gauge() == 0.0
    status, body = await env.get(f"{BASE}/nodes/{names[0]}")
    assert status == 200 and body["metadata"]["name"] == names[0]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl binary not installed")
async def test_kubectl_get_raw(env: Env):
    await wait_ready(env)

    kubectl = functools.partial(kubectl_json, env.kubeconfig)

    body = await asyncio.to_thread(kubectl, "get", "--raw", f"{BASE}/nodes")
    assert len(body["items"]) == 3
    body = await asyncio.to_thread(kubectl, "get", "--raw", f"{BASE}/pods")
    assert len(body["items"]) == 12
    ns = body["items"][0]["metadata"]["namespace"]
    app = body["items"][0]["metadata"]["labels"]["app"]
    same = {i["metadata"]["name"] for i in body["items"]
            if i["metadata"]["namespace"] == ns and i["metadata"]["labels"]["app"] == app}  # fmt: skip
    body = await asyncio.to_thread(
        kubectl, "get", "--raw", f"{BASE}/namespaces/{ns}/pods?labelSelector=app%3D{app}"
    )
    assert {i["metadata"]["name"] for i in body["items"]} == same
    assert {i["metadata"]["labels"]["app"] for i in body["items"]} == {app}
    body = await asyncio.to_thread(kubectl, "get", "--raw", "/apis/metrics.k8s.io/v1beta1")
    assert {r["name"] for r in body["resources"]} == {"nodes", "pods"}


async def test_official_python_client(env: Env):
    await wait_ready(env)
    import kubernetes

    def read() -> tuple[dict, dict, dict]:
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(env.kubeconfig), client_configuration=cfg)
        with kubernetes.client.ApiClient(cfg) as api:
            objs = kubernetes.client.CustomObjectsApi(api)
            nodes = objs.list_cluster_custom_object("metrics.k8s.io", "v1beta1", "nodes")
            pods = objs.list_cluster_custom_object("metrics.k8s.io", "v1beta1", "pods")
            ns = pods["items"][0]["metadata"]["namespace"]
            name = pods["items"][0]["metadata"]["name"]
            one = objs.get_namespaced_custom_object("metrics.k8s.io", "v1beta1", ns, "pods", name)
            return nodes, pods, one

    nodes, pods, one = await asyncio.to_thread(read)
    assert len(nodes["items"]) == 3 and len(pods["items"]) == 12
    assert one["kind"] == "PodMetrics" and one["containers"]


async def test_summary_endpoint_serves_the_same_true_rates(ca, fake_kube, tmp_path):
    sim = SimulatedCluster(
        nodes=2, pods_per_node=3, containers_per_pod=2, seed=4, ca=ca, one_port_per_node=True
    )
    await sim.start()
    env = await start_env(ca, fake_kube, tmp_path, sim, kubelet_endpoint="summary")
    try:
        await wait_ready(env)
        status, body = await env.get(f"{BASE}/pods")
        assert status == 200 and len(body["items"]) == 6
        for item in body["items"]:
            ns, name = item["metadata"]["namespace"], item["metadata"]["name"]
            for c in item["containers"]:
                assert cores(c["usage"]["cpu"]) == pytest.approx(
                    env.sim.true_container_rate(ns, name, c["name"]), rel=0.01
                )
        status, body = await env.get(f"{BASE}/nodes")
        for item in body["items"]:
            assert cores(item["usage"]["cpu"]) == pytest.approx(
                env.sim.true_node_rate(item["metadata"]["name"]), rel=0.01
            )
    finally:
        await stop_env(env)
        await sim.stop()


def _refs(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            found |= _refs(value)
        return found
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node)) if node else set()
    return set()


async def test_openapi_documents_describe_the_kinds_and_every_ref_resolves(env: Env):
    status, doc = await env.get("/openapi/v2")
    assert status == 200 and doc["swagger"] == "2.0"
    for path in (
        "/apis/metrics.k8s.io/v1beta1/nodes",
        "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/{name}",
    ):
        assert doc["paths"][path]["get"]["responses"]["200"]["schema"]["$ref"].startswith("#/definitions/")
    node = doc["definitions"]["io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetrics"]
    assert node["x-kubernetes-group-version-kind"] == [
        {"group": "metrics.k8s.io", "version": "v1beta1", "kind": "NodeMetrics"}
    ]
    for ref in _refs(doc):
        assert ref.removeprefix("#/definitions/") in doc["definitions"], ref
    status, index = await env.get("/openapi/v3")
    assert status == 200
    url = index["paths"]["apis/metrics.k8s.io/v1beta1"]["serverRelativeURL"]
    status, v3 = await env.get(url)
    assert status == 200 and v3["openapi"].startswith("3.")
    for ref in _refs(v3):
        assert ref.removeprefix("#/components/schemas/") in v3["components"]["schemas"], ref
