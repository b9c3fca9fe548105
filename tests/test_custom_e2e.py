"""All three API groups from one standalone process: pushes through the authenticated push endpoint,
reads through custom.metrics.k8s.io / external.metrics.k8s.io with the real kubectl and the official
client, beside metrics.k8s.io scraped from simulated kubelets."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from _kubectl import get_raw
from _pipeline import KUBECTL, READER, Env, start_env, stop_env, wait_ready

from kcms.quantity import parse_quantity
from kcms.sim import SimulatedCluster
from kcms.sim.agents import SimulatedAgents
from kcms.sim.apps import SimulatedAppMetrics, backlog, requests_rate

PUSHER = "pusher-token"


@pytest.fixture
async def env(ca, fake_kube, tmp_path):
    sim = SimulatedCluster(
        nodes=2, pods_per_node=3, containers_per_pod=1, seed=21, ca=ca, one_port_per_node=True
    )
    await sim.start()
    fake_kube.tokens[PUSHER] = {"username": "queue-reporter", "groups": ["pushers"]}
    e = await start_env(ca, fake_kube, tmp_path, sim)
    try:
        yield e
    finally:
        await stop_env(e)
        await sim.stop()


async def push(env: Env, body: dict, token: str = PUSHER) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {token}"}
        async with s.post(env.url + "/push/v1/samples", json=body, headers=headers, ssl=env.ssl) as r:
            return r.status, await r.json(content_type=None)


async def test_pushed_series_are_served_by_all_groups_from_one_server(env: Env):
    await wait_ready(env)
    now = time.time()
    pods = sorted((p.namespace, p.name) for n in env.sim.nodes for p in n.pods)
    ns, pod = pods[0]
    samples = [
        {"metric": "jobs_done_total", "resource": "pods", "namespace": ns, "name": pod, "value": v, "timestamp": now - 20 + 10 * i}
        for i, v in enumerate((100.0, 150.0, 230.0))
    ]  # fmt: skip
    samples.append(
        {
            "metric": "queue_backlog",
            "namespace": ns,
            "labels": {"queue": "emails"},
            "value": 42,
            "timestamp": now,
        }
    )
    samples.append(
        {
            "metric": "queue_backlog",
            "namespace": ns,
            "labels": {"queue": "bills"},
            "value": 7,
            "timestamp": now,
        }
    )
    status, summary = await push(env, {"samples": samples})
    assert status == 200, summary
    assert summary["accepted"] == 5 and summary["rejected"] == {}

    # A duplicate push of the same points is refused per sample, never stored twice.
    status, summary = await push(env, {"samples": samples[:1]})
    assert status == 200 and summary["accepted"] == 0 and summary["rejected"] == {"out_of_order": 1}

    status, body = await env.get(
        f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/{pod}/jobs_done_per_second"
    )
    assert status == 200, body
    (item,) = body["items"]
    assert float(parse_quantity(item["value"])) == pytest.approx(8.0)  # (230-150)/10 s
    assert item["windowSeconds"] == 10
    assert item["describedObject"] == {"kind": "Pod", "namespace": ns, "name": pod, "apiVersion": "/v1"}

    # the p99 of the rate over 5 minutes: rates 5/s and 8/s between the three pushed points
    status, body = await env.get(
        f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/{pod}/jobs_done_per_second_agg_p99_5m"
    )
    assert status == 200, body
    assert [(float(parse_quantity(i["value"])), i["windowSeconds"]) for i in body["items"]] == [
        (pytest.approx(8.0), 20)
    ]

    status, body = await env.get(
        f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/{pod}/jobs_done_total_agg_max_1m"
    )
    assert status == 200 and float(parse_quantity(body["items"][0]["value"])) == 230.0

    path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/queue_backlog?labelSelector=queue%3Demails"
    status, body = await env.get(path)
    assert status == 200 and [(i["metricLabels"], i["value"]) for i in body["items"]] == [
        ({"queue": "emails"}, "42")
    ]

    # metrics.k8s.io still answers from the kubelets.
    status, body = await env.get("/apis/metrics.k8s.io/v1beta1/nodes")
    assert status == 200 and len(body["items"]) == 2

    # Discovery lists what is present, per resource.
    status, body = await env.get("/apis/custom.metrics.k8s.io/v1beta2")
    names = {r["name"] for r in body["resources"]}
    assert {"pods/jobs_done_total", "pods/jobs_done_per_second"} <= names


async def test_push_needs_authentication_and_authorization(env: Env):
    await wait_ready(env)
    sample = {"samples": [{"metric": "x", "namespace": "default", "value": 1}]}
    status, body = await push(env, sample, token="nobody")
    assert status == 401 and body["kind"] == "Status"
    env.fake.authorize = lambda spec: (spec["user"] == "queue-reporter", "only the reporter pushes")
    # authenticated: the sample's target is authorized, per item, as a write of the external metric
    status, body = await push(env, sample, token=READER)
    assert status == 200 and body["accepted"] == 0 and body["rejected"] == {"forbidden": 1}
    attrs = env.fake.access_reviews[-1]["spec"]["resourceAttributes"]
    assert attrs == {
        "namespace": "default",
        "verb": "create",
        "group": "external.metrics.k8s.io",
        "resource": "x",
    }
    status, body = await push(env, sample)
    assert status == 200 and body["accepted"] == 1


@pytest.mark.skipif(KUBECTL is None, reason="kubectl binary not installed")
async def test_demo_app_metrics_read_with_kubectl_and_the_python_client(env: Env):
    await wait_ready(env)
    apps = SimulatedAppMetrics(env.sim, env.pipeline.series)
    t0 = time.time()
    apps.write_once(t0 - 5)
    apps.write_once(t0)
    pod = env.sim.nodes[0].pods[0]

    kubectl = get_raw(env.kubeconfig)

    path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{pod.namespace}/pods/*/http_requests_per_second"
    body = await asyncio.to_thread(kubectl, path)
    values = {i["describedObject"]["name"]: float(parse_quantity(i["value"])) for i in body["items"]}
    assert values[pod.name] == pytest.approx(requests_rate(pod.rate), rel=1e-6)
    assert values.keys() == {p.name for n in env.sim.nodes for p in n.pods if p.namespace == pod.namespace}

    body = await asyncio.to_thread(
        kubectl,
        f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{pod.namespace}/deployments.apps/{pod.app}/queue_backlog",
    )
    (item,) = body["items"]
    assert item["metricName"] == "queue_backlog" and item["describedObject"]["kind"] == "Deployment"

    import kubernetes

    def read_external() -> dict:
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(env.kubeconfig), client_configuration=cfg)
        with kubernetes.client.ApiClient(cfg) as api:
            return kubernetes.client.CustomObjectsApi(api).list_namespaced_custom_object(
                "external.metrics.k8s.io",
                "v1beta1",
                pod.namespace,
                "queue_backlog",
                label_selector="queue=invoices",
            )

    body = await asyncio.to_thread(read_external)
    assert [float(parse_quantity(i["value"])) for i in body["items"]] == [backlog("invoices", t0)]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl binary not installed")
async def test_simulated_agents_collector_store_api_read_with_kubectl_both_versions(ca, fake_kube, tmp_path):
    """Simulated agents -> the pipeline's agent collector -> series store -> both custom versions."""
    sim = SimulatedCluster(
        nodes=2, pods_per_node=3, containers_per_pod=1, seed=23, ca=ca, one_port_per_node=True
    )
    await sim.start()
    agents = SimulatedAgents(sim, history=10.0)
    await agents.start()
    env = await start_env(
        ca, fake_kube, tmp_path, sim, agent_targets=agents.targets, agent_insecure_http=True
    )
    try:
        await wait_ready(env)
        await env.pipeline.agents.run_cycle()
        pod = sim.nodes[1].pods[0]
        node = sim.nodes[1].name

        kubectl = get_raw(env.kubeconfig)

        for version in ("v1beta2", "v1beta1"):
            base = f"/apis/custom.metrics.k8s.io/{version}"
            body = await asyncio.to_thread(
                kubectl, f"{base}/namespaces/{pod.namespace}/pods/{pod.name}/http_requests_per_second"
            )
            (item,) = body["items"]
            assert float(parse_quantity(item["value"])) == pytest.approx(requests_rate(pod.rate), rel=1e-6)
            body = await asyncio.to_thread(kubectl, f"{base}/nodes/{node}/node_load1")
            assert len(body["items"]) == 1 and body["items"][0]["describedObject"]["name"] == node
            body = await asyncio.to_thread(kubectl, f"{base}/nodes/*/node_load1")
            assert {i["describedObject"]["name"] for i in body["items"]} == set(sim.node_names())
        assert env.pipeline.agents.duplicates == 0 and env.pipeline.agents.stored > 0
    finally:
        await stop_env(env)
        await agents.stop()
        await sim.stop()
