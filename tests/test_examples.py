"""The examples: the RabbitMQ provider of examples/rabbitmq.py against a loopback imitation of the
RabbitMQ management API, and deploy/examples/hpa.yaml read the way the HPA controller reads it.

Everything runs on one aggregated API server over real TLS, with authentication (TokenReview) and
authorization (SubjectAccessReview) delegated to the fake Kubernetes API: samples go in through the
push endpoint, values come out through custom.metrics.k8s.io and external.metrics.k8s.io at the
exact paths and query parameters of the HPA controller's clients (k8s.io/metrics pkg/client
custom_metrics and external_metrics, as called by pkg/controller/podautoscaler/metrics)."""

from __future__ import annotations

import base64
import importlib.util
import ssl
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _rbac as rbac
import aiohttp
import kubernetes.client
import orjson
import pytest
import yaml
from _http_helpers import serve_app
from aiohttp import web
from fakeobjects import make_pod
from yarl import URL

from kcms.apis.custom import CustomMetricsAPI
from kcms.apis.external import ExternalMetricsAPI
from kcms.apis.objects import ObjectLabels
from kcms.apis.provider import StoreProvider
from kcms.apis.push import PushAPI
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions
from kcms.kube.client import KubeClient
from kcms.kube.reviews import AccessReviewer, TokenReviewer
from kcms.quantity import parse_quantity
from kcms.store.series import SeriesStore

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "deploy" / "examples"
PUSHER, HPA = "pusher-token", "hpa-token"
HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
PUSHER_USER = "system:serviceaccount:jobs:queue-reporter"


def load_example(name: str) -> Any:
    """Import examples/<name>.py as a user would copy it (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"kcms_example_{name}", REPO / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


# ---- a loopback imitation of the RabbitMQ management API ----------------------------------------------


class FakeRabbit:
    """``GET /api/queues/<vhost>/<queue>`` with basic auth, answering ``{"messages": N, ...}``."""

    def __init__(self) -> None:
        self.depths: dict[tuple[str, str], int] = {}
        self.paths: list[str] = []
        self.failing = False
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _queue(self, request: web.Request) -> web.Response:
        self.paths.append(request.raw_path)
        if request.headers.get("Authorization") != "Basic " + base64.b64encode(b"monitor:s3cret").decode():
            return web.json_response({"error": "not_authorised"}, status=401)
        if self.failing:
            return web.json_response({"error": "internal"}, status=500)
        key = (request.match_info["vhost"], request.match_info["queue"])
        if key not in self.depths:
            return web.json_response({"error": "Object Not Found", "reason": "Not Found"}, status=404)
        n = self.depths[key]
        return web.json_response(
            {"name": key[1], "vhost": key[0], "messages": n, "messages_ready": n, "consumers": 2}
        )

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/queues/{vhost}/{queue}", self._queue)
        self._runner, self.port = await serve_app(app)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


# ---- one server with push, custom and external metrics ----------------------------------------------


@dataclass
class Stack:
    server: AggregatedAPIServer
    store: SeriesStore
    rabbit: FakeRabbit
    provider: Any
    fake: Any
    ctx: ssl.SSLContext

    async def request(self, method: str, raw: str, token: str, body: bytes | None = None) -> tuple[int, Any]:
        """``raw`` is sent exactly as written (already URL-encoded), like client-go's request."""
        url = URL(f"https://127.0.0.1:{self.server.port}{raw}", encoded=True)
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        async with aiohttp.ClientSession() as s:
            async with s.request(method, url, data=body, headers=headers, ssl=self.ctx) as r:
                return r.status, await r.json(content_type=None)

    async def push(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        status, answer = await self.request(
            "POST", "/push/v1/samples", PUSHER, orjson.dumps({"samples": samples})
        )
        assert status == 200, answer
        assert not answer["rejected"], answer
        return answer


def _builtin(spec: dict) -> bool:
    """The cluster's built-in grants: the HPA controller's get/list on the custom and external metrics
    groups, and discovery (the system:discovery role) for everyone."""
    if nra := spec.get("nonResourceAttributes"):
        return nra["verb"] == "get" and (nra["path"] == "/apis" or nra["path"].startswith("/apis/"))
    ra = spec.get("resourceAttributes", {})
    return (
        spec.get("user") == HPA_USER
        and ra.get("group") in ("custom.metrics.k8s.io", "external.metrics.k8s.io")
        and ra.get("verb") in ("get", "list")
    )


# RBAC as the cluster would have it: the pusher's Role and RoleBinding from deploy/examples/push-rbac.yaml
# (evaluated by RBAC's rules, tests/_rbac.py) and the built-in grants above.
authorize = rbac.authorizer(docs("push-rbac.yaml"), privileged=_builtin)


@pytest.fixture
async def stack(ca, fake_kube, tmp_path):
    rabbit_mod = load_example("rabbitmq")
    fake_kube.authorize = authorize
    fake_kube.tokens[PUSHER] = {"username": PUSHER_USER, "uid": "1"}
    fake_kube.tokens[HPA] = {"username": HPA_USER, "uid": "2"}
    kube = await KubeClient.load(str(fake_kube.kubeconfig))
    rabbit = FakeRabbit()
    await rabbit.start()
    store = SeriesStore()
    objects = ObjectLabels(kube=kube)
    store_provider = StoreProvider(store, objects.namespaced)
    provider = rabbit_mod.RabbitQueueProvider(
        f"http://127.0.0.1:{rabbit.port}",
        [("/", "emails"), ("/", "sms"), ("billing", "invoices")],
        namespace="jobs",
        auth=("monitor", "s3cret"),
        ttl=60.0,
    )
    server = AggregatedAPIServer(
        ServingOptions(secure_port=0, bind_address="127.0.0.1", cert_dir=str(tmp_path / "certs")),
        AuthnOptions(skip_lookup=True, token_reviewer=TokenReviewer(kube)),
        AuthzOptions(access_reviewer=AccessReviewer(kube)),
    )
    for gv in CustomMetricsAPI([store_provider], objects).group_versions():
        server.install(gv)
    server.install(ExternalMetricsAPI([store_provider, provider]).group_version())
    PushAPI(store).install(server)
    await server.start()
    ctx = ssl.create_default_context(cafile=server.serving_cert_file)
    try:
        yield Stack(server, store, rabbit, provider, fake_kube, ctx)
    finally:
        await server.stop()
        await provider.close()
        await rabbit.stop()
        await kube.close()


def value(item: dict[str, Any]) -> float:
    return float(parse_quantity(item["value"]))


# ---- the RabbitMQ provider ----------------------------------------------------------------------------


async def test_rabbitmq_provider_serves_queue_depths_beside_the_store(stack: Stack) -> None:
    stack.rabbit.depths = {("/", "emails"): 17, ("/", "sms"): 3, ("billing", "invoices"): 120}
    await stack.push(
        [{"metric": "queue_backlog", "namespace": "jobs", "labels": {"queue": "emails"}, "value": 42}]
    )
    base = "/apis/external.metrics.k8s.io/v1beta1"

    status, doc = await stack.request("GET", base, HPA)
    assert status == 200
    assert {r["name"] for r in doc["resources"]} == {"queue_backlog", "rabbitmq_queue_messages"}

    status, doc = await stack.request(
        "GET", f"{base}/namespaces/jobs/rabbitmq_queue_messages?labelSelector=queue%3Demails", HPA
    )
    assert status == 200, doc
    assert doc["kind"] == "ExternalMetricValueList"
    [item] = doc["items"]
    assert item["metricName"] == "rabbitmq_queue_messages"
    assert item["metricLabels"] == {"queue": "emails", "vhost": "/"}
    assert value(item) == 17
    assert "%2F" in stack.rabbit.paths[-1]  # the default vhost "/" is escaped in the path

    status, doc = await stack.request("GET", f"{base}/namespaces/jobs/rabbitmq_queue_messages", HPA)
    got = {(i["metricLabels"]["vhost"], i["metricLabels"]["queue"]): value(i) for i in doc["items"]}
    assert got == {("/", "emails"): 17, ("/", "sms"): 3, ("billing", "invoices"): 120}
    status, doc = await stack.request(
        "GET", f"{base}/namespaces/jobs/rabbitmq_queue_messages?labelSelector=vhost%3Dbilling", HPA
    )
    assert [value(i) for i in doc["items"]] == [120]

    # cached for ttl: a new depth is not read again at once; with the cache expired it is
    reads = stack.provider.reads
    stack.rabbit.depths[("/", "emails")] = 99
    status, doc = await stack.request(
        "GET", f"{base}/namespaces/jobs/rabbitmq_queue_messages?labelSelector=queue%3Demails", HPA
    )
    assert value(doc["items"][0]) == 17 and stack.provider.reads == reads
    stack.provider.ttl = 0.0
    status, doc = await stack.request(
        "GET", f"{base}/namespaces/jobs/rabbitmq_queue_messages?labelSelector=queue%3Demails", HPA
    )
    assert value(doc["items"][0]) == 99 and stack.provider.reads == reads + 1

    # the management API fails: no value (never a stale one), and the store's metric is still served
    stack.rabbit.failing = True
    status, doc = await stack.request("GET", f"{base}/namespaces/jobs/rabbitmq_queue_messages", HPA)
    assert status == 200 and doc["items"] == []
    status, doc = await stack.request(
        "GET", f"{base}/namespaces/jobs/queue_backlog?labelSelector=queue%3Demails", HPA
    )
    assert [value(i) for i in doc["items"]] == [42]
    # another namespace does not see this provider's metric
    status, doc = await stack.request("GET", f"{base}/namespaces/other/rabbitmq_queue_messages", HPA)
    assert doc["items"] == []


# ---- deploy/examples: the APIServices and the HPA ------------------------------------------------------


def test_example_manifests_validate_against_kubernetes_models() -> None:
    if not hasattr(kubernetes.client.V1Deployment, "model_validate"):
        pytest.skip("this kubernetes client's models do not validate")
    for name in ("hpa.yaml", "apiservices.yaml", "push-rbac.yaml"):
        for obj in docs(name):
            _, _, version = obj["apiVersion"].rpartition("/")
            getattr(kubernetes.client, version.capitalize() + obj["kind"]).model_validate(obj, strict=True)


async def test_apiservices_name_what_the_server_serves(stack: Stack) -> None:
    services = {d["metadata"]["name"]: d["spec"] for d in docs("apiservices.yaml")}
    assert set(services) == {
        "v1beta2.custom.metrics.k8s.io",
        "v1beta1.custom.metrics.k8s.io",
        "v1beta1.external.metrics.k8s.io",
    }
    status, doc = await stack.request("GET", "/apis", HPA)
    assert status == 200
    served = {(g["name"], v["version"]) for g in doc["groups"] for v in g["versions"]}
    preferred = {g["name"]: g["preferredVersion"]["version"] for g in doc["groups"]}
    for name, spec in services.items():
        assert name == f"{spec['version']}.{spec['group']}"
        assert (spec["group"], spec["version"]) in served
        assert spec["service"] == {"name": "kcms", "namespace": "kube-system", "port": 443}
    by_priority = sorted(
        (s for s in services.values() if s["group"] == "custom.metrics.k8s.io"),
        key=lambda s: -s["versionPriority"],
    )
    assert by_priority[0]["version"] == preferred["custom.metrics.k8s.io"] == "v1beta2"


def group_resource(api_version: str, kind: str) -> str:
    """What client-go's RESTMapper gives for the kinds used here (Kind -> lower-case plural.group)."""
    group = api_version.rpartition("/")[0]
    plural = kind.lower() + "s"
    return f"{plural}.{group}" if group else plural


def selector_string(match_labels: dict[str, str]) -> str:
    """labels.Selector.String() of a matchLabels selector: sorted ``k=v`` joined by commas."""
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


def hpa_paths(hpa: dict[str, Any], pod_selector: str, version: str) -> dict[str, str]:
    """The raw paths (and query strings, url.Values-encoded) the HPA controller GETs for each metric."""
    ns = hpa["metadata"]["namespace"]
    out = {}
    for m in hpa["spec"]["metrics"]:
        src = m[m["type"].lower()]
        metric = src["metric"]["name"]
        params: dict[str, str] = {}
        if sel := src["metric"].get("selector"):
            key = "labelSelector" if m["type"] == "External" else "metricLabelSelector"
            params[key] = selector_string(sel["matchLabels"])
        if m["type"] == "Pods":
            params = {"labelSelector": pod_selector, **params}
            path = f"/apis/custom.metrics.k8s.io/{version}/namespaces/{ns}/pods/*/{metric}"
        elif m["type"] == "Object":
            ref = src["describedObject"]
            gr = group_resource(ref["apiVersion"], ref["kind"])
            path = f"/apis/custom.metrics.k8s.io/{version}/namespaces/{ns}/{gr}/{ref['name']}/{metric}"
        else:
            path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}"
        query = urllib.parse.urlencode(sorted(params.items()))
        out[m["type"]] = path + (f"?{query}" if query else "")
    return out


async def test_hpa_example_reads_back_what_was_pushed(stack: Stack) -> None:
    manifests = docs("hpa.yaml")
    hpa = next(d for d in manifests if d["kind"] == "HorizontalPodAutoscaler")
    deployment = next(d for d in manifests if d["kind"] == "Deployment")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (deployment["kind"], deployment["metadata"]["name"])
    ns = hpa["metadata"]["namespace"]
    match = deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["template"]["metadata"]["labels"] == match
    for name in ("worker-a", "worker-b"):
        stack.fake.upsert(make_pod(ns, name, "node-1", labels=dict(match)))
    stack.fake.upsert(make_pod(ns, "api-0", "node-1", labels={"app": "api"}))  # not a worker

    pods_metric = next(m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods")
    counter = pods_metric.removesuffix("_per_second") + "_total"
    obj = next(m["object"] for m in hpa["spec"]["metrics"] if m["type"] == "Object")
    ext = next(m["external"] for m in hpa["spec"]["metrics"] if m["type"] == "External")
    t = time.time() - 1
    # worker-a counts 5 requests/s; worker-b restarted (its counter went from 1000 back to 50) and
    # then counts 7.5/s; api-0 is not selected by the HPA's pod selector
    samples = [
        {"metric": counter, "resource": "pods", "namespace": ns, "name": "worker-a", "value": 100, "timestamp": t - 10},
        {"metric": counter, "resource": "pods", "namespace": ns, "name": "worker-a", "value": 150, "timestamp": t},
        {"metric": counter, "resource": "pods", "namespace": ns, "name": "worker-b", "value": 1000, "timestamp": t - 20},
        {"metric": counter, "resource": "pods", "namespace": ns, "name": "worker-b", "value": 50, "timestamp": t - 10},
        {"metric": counter, "resource": "pods", "namespace": ns, "name": "worker-b", "value": 125, "timestamp": t},
        {"metric": counter, "resource": "pods", "namespace": ns, "name": "api-0", "value": 1, "timestamp": t - 10},
        {"metric": counter, "resource": "pods", "namespace": ns, "name": "api-0", "value": 9, "timestamp": t},
        {"metric": obj["metric"]["name"], "resource": group_resource(obj["describedObject"]["apiVersion"],
         obj["describedObject"]["kind"]), "namespace": ns, "name": obj["describedObject"]["name"], "value": 250},
        {"metric": ext["metric"]["name"], "namespace": ns, "labels": ext["metric"]["selector"]["matchLabels"], "value": 42},
        {"metric": ext["metric"]["name"], "namespace": ns, "labels": {"queue": "sms"}, "value": 9},
    ]  # fmt: skip
    answer = await stack.push(samples)
    assert answer["accepted"] == len(samples)

    pod_selector = selector_string(match)
    for version in ("v1beta2", "v1beta1"):
        paths = hpa_paths(hpa, pod_selector, version)
        assert paths["Pods"] == (
            f"/apis/custom.metrics.k8s.io/{version}/namespaces/jobs/pods/*/http_requests_per_second"
            "?labelSelector=app%3Dworker"
        )
        assert (
            paths["External"]
            == "/apis/external.metrics.k8s.io/v1beta1/namespaces/jobs/queue_backlog?labelSelector=queue%3Demails"
        )

        # Pods: one value per selected pod, the true per-second rate of its counter
        status, doc = await stack.request("GET", paths["Pods"], HPA)
        assert status == 200, doc
        assert doc["kind"] == "MetricValueList" and doc["apiVersion"] == f"custom.metrics.k8s.io/{version}"
        rates = {i["describedObject"]["name"]: value(i) for i in doc["items"]}
        assert rates == {"worker-a": pytest.approx(5.0), "worker-b": pytest.approx(7.5)}
        for item in doc["items"]:
            window = item["windowSeconds"] if version == "v1beta2" else item["window"]
            assert item["describedObject"]["kind"] == "Pod" and window == 10
            name = item["metric"]["name"] if version == "v1beta2" else item["metricName"]
            assert name == pods_metric

        # Object: exactly one value (the client refuses anything else), about the Deployment
        status, doc = await stack.request("GET", paths["Object"], HPA)
        assert status == 200, doc
        [item] = doc["items"]
        assert value(item) == 250
        assert item["describedObject"]["kind"] == "Deployment" and item["describedObject"]["name"] == "worker"
        assert item["describedObject"]["namespace"] == ns

        # External: only the selected queue
        status, doc = await stack.request("GET", paths["External"], HPA)
        assert status == 200, doc
        assert [(i["metricLabels"], value(i)) for i in doc["items"]] == [({"queue": "emails"}, 42.0)]

    # the pusher may not read, the HPA may not push: its sample is refused, the value stays
    status, _ = await stack.request("GET", hpa_paths(hpa, pod_selector, "v1beta2")["Object"], PUSHER)
    assert status == 403
    hostile = orjson.dumps({"samples": [{**samples[7], "value": 9999}]})
    status, answer = await stack.request("POST", "/push/v1/samples", HPA, hostile)
    assert status == 200 and answer["accepted"] == 0 and answer["rejected"] == {"forbidden": 1}
    status, doc = await stack.request("GET", hpa_paths(hpa, pod_selector, "v1beta2")["Object"], HPA)
    assert [value(i) for i in doc["items"]] == [250]
