"""KCMS's own metrics under clients that choose every name: /metrics must not grow with them.

A real aggregated API server over TLS (custom, external and resource metrics, the metric push and
the node push; anonymous requests allowed, so they reach authorization), a real agent (TLS,
authenticated /metrics, the OTLP receiver) and a real ``kcms store`` process, all on loopback, with
authentication and authorization delegated to the fake Kubernetes API. Clients send thousands of
requests with random paths, methods, API groups, resources, namespaces, metric names, label values,
tokens and content encodings (every random name carries the marker ``zq``), twice, with fresh names
the second time.

Checked, from the ``/metrics`` text of the API server's process (which holds the agent's metrics
too) and of the store, parsed with ``prometheus_client.parser``:

* no label value of a ``kcms_*`` metric holds a name a client chose (the marker);
* the first round adds fewer than a fixed number of label sets although it sends thousands of
  distinct names, and the second round adds none (bounded sets are full after one round);
* the resource label of the request metrics takes at most ``MAX_RESOURCE_LABELS`` values besides
  ``""`` and ``other``, even for external metrics that exist (an external metric's resource is its
  name);
* data written before the attack reads back unchanged, every server stays ready, no traceback.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from _stores import TOKEN, Stores
from fakeobjects import make_node, make_pod
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client.parser import text_string_to_metric_families

from kcms.agent.auth import MetricsAuth
from kcms.agent.buffer import SampleBuffer
from kcms.agent.otlp import otlp_routes
from kcms.agent.pods import PodsByIP, agent_pod_from_json
from kcms.agent.server import Agent, ServingTLS
from kcms.apis.custom import CustomMetricsAPI
from kcms.apis.external import ExternalMetricsAPI
from kcms.apis.metrics.api import MetricsAPI
from kcms.apis.nodebinding import NODE_NAME_EXTRA
from kcms.apis.nodepush import NODES_PATH, NodePushAPI
from kcms.apis.objects import ObjectLabels
from kcms.apis.provider import StoreProvider
from kcms.apis.push import PUSH_PATH, PushAPI, PushLimits
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions
from kcms.apiserver.server import MAX_RESOURCE_LABELS
from kcms.kube.client import KubeClient
from kcms.kube.inventory import KubeInventory
from kcms.kube.reviews import AccessReviewer, TokenReviewer
from kcms.quantity import parse_quantity
from kcms.store import wire
from kcms.store.resource import ResourceStore
from kcms.store.series import SeriesStore

MARK = "zq"  # in every name a client chooses
NODE = "node-a"
POD_IP = "127.0.0.2"  # shop/web-a's pod IP: OTLP from it is bound to that pod
AGENT_SA = "system:serviceaccount:kube-system:kcms-agent"
PUSHER = "system:serviceaccount:a:pusher"
CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"
RESOURCE_METRICS = "/apis/metrics.k8s.io/v1beta1"
CONCURRENCY = 8
# Label sets one round may add to all kcms_* metrics of a process: the request counter and histogram
# for each resource name a group serves (capped), and a few per refusal reason, request outcome and
# code. One label set per random name would be thousands.
PROCESS_BOUND = 2 * MAX_RESOURCE_LABELS + 150
STORE_BOUND = 60


def rnd() -> str:
    """A fresh name a hostile client picks (valid as a metric, DNS and label name)."""
    return MARK + secrets.token_hex(5)


def authorize(spec: dict[str, Any]) -> tuple[bool, str]:
    """RBAC of the test: ``reader`` reads everything, the pusher creates in namespace ``a`` only, the
    agent's ServiceAccount posts node pushes; everyone else (anonymous) is denied."""
    user = spec.get("user", "")
    res = spec.get("resourceAttributes")
    nonres = spec.get("nonResourceAttributes")
    if user == "reader":
        return True, "reader"
    if user == PUSHER and res is not None:
        return (res.get("verb") == "create" and res.get("namespace") == "a"), "pusher"
    if user == AGENT_SA and nonres is not None:
        return (nonres.get("path"), nonres.get("verb")) == (NODES_PATH, "post"), "node pusher"
    if user == AGENT_SA and res is not None:  # the agent's /metrics: nodes/metrics get
        return res.get("resource") == "nodes" and res.get("subresource") == "metrics", "agent"
    return False, "no RBAC policy matched"


def label_sets(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Distinct (family, labels without ``le``) of the ``kcms_*`` metrics in an exposition."""
    out = set()
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("kcms_") or family.name.endswith("_created"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):  # a twin of its counter's label set
                continue
            out.add((family.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))))
    return out


def chosen(sets: set[tuple[str, tuple[tuple[str, str], ...]]]) -> list[tuple[str, tuple]]:
    """The label sets holding a name a client chose."""
    return [s for s in sets if any(MARK in v for _, v in s[1])]


def otlp_body(metrics: list[tuple[str, dict[str, str]]]) -> bytes:
    ns = int(time.time() * 1e9)
    req = ExportMetricsServiceRequest(
        resource_metrics=[
            pb.ResourceMetrics(
                resource=Resource(attributes=[]),
                scope_metrics=[
                    pb.ScopeMetrics(
                        metrics=[
                            pb.Metric(
                                name=name,
                                gauge=pb.Gauge(
                                    data_points=[
                                        pb.NumberDataPoint(
                                            time_unix_nano=ns,
                                            as_double=1.0,
                                            attributes=[
                                                KeyValue(key=k, value=AnyValue(string_value=v))
                                                for k, v in attrs.items()
                                            ],
                                        )
                                    ]
                                ),
                            )
                            for name, attrs in metrics
                        ]
                    )
                ],
            )
        ]
    )
    return req.SerializeToString()


@dataclass
class Targets:
    api: str
    api_ctx: ssl.SSLContext
    agent: str
    agent_ctx: ssl.SSLContext
    store: str
    store_log: Path


async def run_all(jobs: list[Callable[[], Awaitable[None]]]) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(job: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            await job()

    await asyncio.gather(*(one(j) for j in jobs))


async def request(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    token: str | None = None,
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
    ssl_ctx: ssl.SSLContext | bool = True,
) -> int:
    """Send one request; its status (0 when the server closed the connection, as the guard may)."""
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    try:
        async with session.request(method, url, headers=h, data=data, ssl=ssl_ctx) as r:
            await r.read()
            return r.status
    except (aiohttp.ClientError, ConnectionError):
        return 0


def api_jobs(t: Targets, session: aiohttp.ClientSession, codes: list[int], pushed: list[str]) -> list:
    """About 700 requests to the API server, every name random."""
    jobs: list[Callable[[], Awaitable[None]]] = []

    def add(method: str, path: str, **kw: Any) -> None:
        async def job() -> None:
            codes.append(await request(session, method, t.api + path, ssl_ctx=t.api_ctx, **kw))

        jobs.append(job)

    for _ in range(60):
        n = rnd()
        add("GET", f"/{n}/{rnd()}")  # unknown paths, anonymous
        add("GET", f"/apis/{n}.example.com/v{rnd()}/{rnd()}")  # unknown group and version
        add(n.upper(), f"{CUSTOM}/namespaces/a/pods/*/{rnd()}")  # an unknown method
        add("GET", f"{CUSTOM}/namespaces/{rnd()}/{rnd()}/*/{rnd()}")  # anonymous: 403 for a random resource
        add("GET", f"{CUSTOM}/namespaces/a/{rnd()}/*/{rnd()}", token="reader-token")  # unknown resource
        add("GET", f"{CUSTOM}/namespaces/a/{rnd()}/x/bad-{rnd()}", token="reader-token")  # 400
        add("GET", f"{CUSTOM}/{rnd()}/x/{rnd()}?watch=true", token="reader-token")
        add("GET", f"{EXTERNAL}/namespaces/a/{rnd()}", token="reader-token")  # 200, empty
        add("GET", f"{EXTERNAL}/namespaces/{rnd()}/{rnd()}?labelSelector={rnd()}%3D{rnd()}")  # anonymous
        add("GET", f"{RESOURCE_METRICS}/namespaces/{rnd()}/pods/{rnd()}", token="reader-token")
        add("GET", f"{RESOURCE_METRICS}/{rnd()}", token="reader-token")
        add("POST", PUSH_PATH, data=b"{}", headers={"Content-Encoding": rnd()})  # 415 from the guard
    add("GET", f"{RESOURCE_METRICS}/nodes", token="reader-token")  # served resources keep their names
    add("GET", f"{RESOURCE_METRICS}/pods", token="reader-token")
    # every pushed external metric exists: reading it is a 200 about a resource discovery lists
    for name in pushed:
        add("GET", f"{EXTERNAL}/namespaces/a/{name}", token="reader-token")

    def push(token: str | None, samples: list[dict[str, Any]]) -> None:
        add("POST", PUSH_PATH, token=token, data=orjson.dumps({"samples": samples}),
            headers={"Content-Type": "application/json"})  # fmt: skip

    for _ in range(20):
        hostile = [
            {"metric": rnd(), "resource": rnd(), "namespace": rnd(), "name": rnd(), "value": 1,
             "labels": {rnd(): rnd()}},
            {"metric": rnd(), "namespace": "b", "value": 1},  # another namespace: forbidden
            {"metric": f"bad-{rnd()}", "namespace": "a", "value": 1},  # invalid name
            {"metric": rnd(), "namespace": "a", "value": 1, "timestamp": time.time() + 3600},  # future
            {"metric": rnd(), "namespace": "a", "value": 1, "labels": {rnd(): "x" * 500}},  # too long
            {"metric": rnd(), "namespace": "a", "value": "NaN"},
        ]  # fmt: skip
        push(None, hostile)  # anonymous
        push("pusher-token", hostile + [{"metric": rnd(), "namespace": "a", "value": 1} for _ in range(10)])
        push("pusher-token", [{"metric": rnd(), "resource": "pods", "namespace": "a", "name": rnd(),
                               "labels": {"k": rnd()}, "value": 1}])  # fmt: skip
        # node pushes: anonymous (403), and the node's agent reporting random pods and metrics
        body = wire.encode(
            wire.Write(
                nodes=[wire.WireNode(rnd(), (0.0, time.time(), 1, 1), [])],
                samples=[(rnd(), "pods", rnd(), rnd(), ((rnd(), rnd()),), time.time(), 1.0)],
            )
        )
        for token in (None, "node-a-token"):
            add("POST", NODES_PATH, token=token, data=body, headers={"Content-Type": wire.CONTENT_TYPE})
    return jobs


def agent_jobs(t: Targets, session: aiohttp.ClientSession, pod_session: aiohttp.ClientSession) -> list:
    """About 300 requests to the agent: random tokens, paths, methods; OTLP with random names."""
    jobs: list[Callable[[], Awaitable[None]]] = []

    def add(s: aiohttp.ClientSession, method: str, path: str, **kw: Any) -> None:
        async def job() -> None:
            await request(s, method, t.agent + path, ssl_ctx=t.agent_ctx, **kw)

        jobs.append(job)

    pb_type = {"Content-Type": "application/x-protobuf"}
    for _ in range(40):
        add(session, "GET", "/metrics")
        add(session, "GET", "/metrics", token=rnd())  # a forged token: TokenReview says no
        add(session, "GET", f"/{rnd()}?since={rnd()}")
        add(session, rnd().upper(), "/metrics")
        add(session, "POST", "/v1/metrics", data=b"\x0a\x05junk", headers=pb_type)  # malformed
        add(session, "POST", "/v1/metrics", data=b"{}", headers={"Content-Type": f"application/{rnd()}"})
        # from the node's own address: not bound to a pod
        add(session, "POST", "/v1/metrics", data=otlp_body([(rnd(), {rnd(): rnd()})]), headers=pb_type)
        # from the pod: bound; random names until its series budget is spent
        body = otlp_body([(rnd(), {rnd(): rnd(), "k8s.pod.name": rnd()}), (rnd(), {"v": "x" * 300})])
        add(pod_session, "POST", "/v1/metrics", data=body, headers=pb_type)
    return jobs


def store_jobs(t: Targets, session: aiohttp.ClientSession) -> list:
    """About 300 requests to the store: random paths, methods, tokens and bodies."""
    jobs: list[Callable[[], Awaitable[None]]] = []

    def add(method: str, path: str, **kw: Any) -> None:
        async def job() -> None:
            await request(session, method, t.store + path, **kw)

        jobs.append(job)

    for _ in range(50):
        add("GET", f"/{rnd()}/{rnd()}")
        add("POST", f"/store/v1/{rnd()}", token=TOKEN, data=b"x")
        add(rnd().upper(), "/store/v1/write", token=TOKEN)
        add("POST", "/store/v1/write", token=rnd(), data=b"x")
        add("POST", "/store/v1/write", token=TOKEN, data=b"\xc1", headers={"Content-Encoding": rnd()})
        add("POST", "/store/v1/write", token=TOKEN, headers={"Content-Type": wire.CONTENT_TYPE},
            data=wire.encode(wire.Write(samples=[(f"bad-{rnd()}", rnd(), rnd(), rnd(), ((rnd(), rnd()),),
                                                  time.time() + 3600, 1.0)])))  # fmt: skip
    return jobs


@pytest.fixture
async def targets(ca, fake_kube, tmp_path: Path) -> AsyncIterator[tuple[Targets, SeriesStore]]:
    fake_kube.authorize = authorize
    fake_kube.tokens["reader-token"] = {"username": "reader", "uid": "r"}
    fake_kube.tokens["pusher-token"] = {"username": PUSHER, "uid": "p", "groups": ["system:serviceaccounts"]}
    fake_kube.tokens["node-a-token"] = {"username": AGENT_SA, "uid": "n", "extra": {NODE_NAME_EXTRA: [NODE]}}
    fake_kube.upsert(make_node(NODE))
    web_a = make_pod("shop", "web-a", NODE)
    web_a["status"]["podIP"] = POD_IP
    web_a["status"]["podIPs"] = [{"ip": POD_IP}]
    fake_kube.upsert(web_a)
    kube = await KubeClient.load(str(fake_kube.kubeconfig))
    inventory = KubeInventory(kube)
    await inventory.start()

    series = SeriesStore()
    resources = ResourceStore(resolution=1.0, max_age=300.0)
    provider = StoreProvider(series, ObjectLabels(kube=kube).namespaced)
    server = AggregatedAPIServer(
        ServingOptions(secure_port=0, bind_address="127.0.0.1", cert_dir=str(tmp_path / "certs")),
        AuthnOptions(skip_lookup=True, token_reviewer=TokenReviewer(kube), allow_anonymous=True),
        AuthzOptions(access_reviewer=AccessReviewer(kube)),
    )
    for gv in CustomMetricsAPI([provider], ObjectLabels(kube=kube)).group_versions():
        server.install(gv)
    server.install(ExternalMetricsAPI([provider]).group_version())
    server.install(MetricsAPI(inventory, resources).group_version())
    # a small per-writer quota: the first round uses it up, so both rounds refuse alike
    PushAPI(series, PushLimits(max_series_per_writer=100)).install(server)
    NodePushAPI(resources, series, inventory=inventory).attach(server.app)
    await server.start()

    pem = str(tmp_path / "agent.pem")
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(pem)
    buffer = SampleBuffer()
    routes = otlp_routes(
        buffer,
        pods=PodsByIP(lambda: [agent_pod_from_json(web_a)], node_ips=["127.0.0.1"]),
        node_name=NODE,
        max_series_per_sender=50,
    )
    auth = MetricsAuth(NODE, TokenReviewer(kube), AccessReviewer(kube))
    agent = Agent(
        buffer, {}, interval=3600, listen="127.0.0.1:0", extra_routes=routes,
        ssl_context=ServingTLS(pem, pem), auth=auth,
    )  # fmt: skip
    await agent.start()

    stores = Stores(tmp_path, 1)
    await asyncio.to_thread(stores.start_all)
    agent_ctx = ssl.create_default_context()
    ca.configure_trust(agent_ctx)
    try:
        yield (
            Targets(
                api=f"https://127.0.0.1:{server.port}",
                api_ctx=ssl.create_default_context(cafile=server.serving_cert_file),
                agent=f"https://127.0.0.1:{agent.port}",
                agent_ctx=agent_ctx,
                store=f"http://127.0.0.1:{stores.ports['s0']}",
                store_log=tmp_path / "s0.log",
            ),
            series,
        )
    finally:
        await asyncio.to_thread(stores.stop_all)
        await agent.stop()
        await server.stop()
        await inventory.stop()
        await kube.close()


async def scrape(session: aiohttp.ClientSession, t: Targets) -> tuple[set, set]:
    """The kcms_* label sets of the API server's process and of the store."""
    async with session.get(
        t.api + "/metrics", ssl=t.api_ctx, headers={"Authorization": "Bearer reader-token"}
    ) as r:
        assert r.status == 200
        process = label_sets(await r.text())
    async with session.get(t.store + "/metrics") as r:
        assert r.status == 200
        store = label_sets(await r.text())
    return process, store


async def test_hostile_names_never_become_label_values(targets, caplog) -> None:
    caplog.set_level(logging.INFO)
    t, series = targets
    async with aiohttp.ClientSession() as session:
        # the data an HPA in namespace a reads, written before the attack
        victim = {"samples": [{"metric": "queue_backlog", "namespace": "a", "value": 7}]}
        status = await request(session, "POST", t.api + PUSH_PATH, token="pusher-token", ssl_ctx=t.api_ctx,
                               data=orjson.dumps(victim), headers={"Content-Type": "application/json"})  # fmt: skip
        assert status == 200
        await asyncio.sleep(1.1)  # discovery lists it
        process0, store0 = await scrape(session, t)

        pod_connector = aiohttp.TCPConnector(local_addr=(POD_IP, 0), force_close=True)
        sizes = []
        async with aiohttp.ClientSession(connector=pod_connector) as pod_session:
            for round_ in range(2):
                codes: list[int] = []
                # the pusher's accepted external metrics exist: discovery lists them, reads are 200s
                pushed = [f"pushed_{secrets.token_hex(5)}" for _ in range(90)] if round_ == 0 else []
                if pushed:
                    samples = [{"metric": n, "namespace": "a", "value": 1} for n in pushed]
                    assert await request(session, "POST", t.api + PUSH_PATH, token="pusher-token",
                                         ssl_ctx=t.api_ctx, data=orjson.dumps({"samples": samples}),
                                         headers={"Content-Type": "application/json"}) == 200  # fmt: skip
                    await asyncio.sleep(2.2)  # discovery (1 s) and the server's view of it (1 s) refresh
                jobs = api_jobs(t, session, codes, pushed) + agent_jobs(t, session, pod_session)
                jobs += store_jobs(t, session)
                await run_all(jobs)
                assert len(jobs) > 1000
                # the attack reached the handlers: refusals of every kind, and successful reads
                assert {200, 400, 401, 403, 404, 405, 415} <= set(codes), sorted(set(codes))
                process, store = await scrape(session, t)
                sizes.append((len(process), len(store)))
                assert chosen(process) == [] and chosen(store) == []
                if round_ == 0:
                    print("new label sets: process", len(process - process0), "store", len(store - store0))
                    assert len(process - process0) < PROCESS_BOUND, sorted(process - process0)
                    assert len(store - store0) < STORE_BOUND, sorted(store - store0)
                    process1, store1 = process, store
                else:  # fresh names, the same kinds of requests: nothing new
                    assert process - process1 == set(), sorted(process - process1)
                    assert store - store1 == set(), sorted(store - store1)

        def resource_labels(sets: set) -> set[str]:
            return {dict(labels)["resource"] for name, labels in sets if name == "kcms_apiserver_requests"}

        # The metrics are process-wide: servers of earlier tests in this process may have named other
        # resources; this server's own budget bounds what it adds.
        resources = resource_labels(process)
        added = resources - resource_labels(process0)
        assert len(added - {"", "other"}) <= MAX_RESOURCE_LABELS, sorted(added)
        assert "other" in resources  # random and uncapped resources were counted, as "other"
        assert {"nodes", "pods"} <= resources  # the resources a group serves keep their names

        # the victim's data is intact and every server is ready
        async with session.get(
            t.api + f"{EXTERNAL}/namespaces/a/queue_backlog",
            ssl=t.api_ctx,
            headers={"Authorization": "Bearer reader-token"},
        ) as r:
            items = (await r.json())["items"]
        assert [parse_quantity(i["value"]) for i in items] == [7]
        assert await request(session, "GET", t.api + "/readyz", ssl_ctx=t.api_ctx) == 200
        assert await request(session, "GET", t.agent + "/healthz", ssl_ctx=t.agent_ctx) == 200
        assert await request(session, "GET", t.store + "/readyz") == 200
    assert series.stats()["series"] <= 1 + 100 + 100  # victim, the pusher's quota, one node's quota
    for record in caplog.records:
        assert record.exc_info is None, record.getMessage()
    assert "Traceback" not in caplog.text
    assert "Traceback" not in t.store_log.read_text()
