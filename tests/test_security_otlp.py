"""Hostile OTLP senders against a real agent: points are bound to the pod whose IP sent them.

A real agent (``kcms.agent.server.Agent`` with its buffer and OTLP receiver, and one test with the
``kcms agent`` process) reads this node's pods from the fake API server with its real informer.
Each pod gets a loopback address (127.0.0.x) as its pod IP, and every client binds its socket to
the address of the pod it plays, so the agent sees exactly the source IP a pod would have. The
attacks: claiming another pod, namespace, Deployment or StatefulSet; sending from an address that
is no pod of this node, the node's own address, a finished pod's or a shared one; future timestamps,
oversize names and labels, 100 000 distinct series. Each test also checks that the victim's series
are unchanged, the agent stays healthy and the log has no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest
from _stores import free_port
from fakeapi import FakeKubeAPI, make_pod
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client import REGISTRY
from test_agent_buffer import parse_agent_text

from kcms.agent.buffer import SampleBuffer
from kcms.agent.otlp import otlp_routes
from kcms.agent.otlp_bind import SenderSeries
from kcms.agent.pods import PodsByIP, agent_pod_from_json, pod_informer, workloads
from kcms.agent.server import Agent
from kcms.kube.client import KubeClient
from kcms.model import ObjectRef

REPO = Path(__file__).resolve().parent.parent
PB = {"Content-Type": "application/x-protobuf"}
NODE = "node-a"
HOST_IP = "127.0.0.1"  # the node's address: hostNetwork pods and node processes send from it

# The pods of node-a (and one of node-b), each with its own loopback address.
WEB_IP, LEDGER_IP, API_IP, DUAL_IP, OTHER_NODE_IP, DONE_IP, SHARED_IP, NOBODY_IP, JOB_IP = (
    "127.0.0.2",
    "127.0.0.3",
    "127.0.0.4",
    "127.0.0.7",
    "127.0.0.8",
    "127.0.0.9",
    "127.0.0.10",
    "127.0.0.11",
    "127.0.0.12",
)
WEB = ObjectRef("pods", "shop", "web-7d9f8c6b5-x2x4q")
API = ObjectRef("pods", "shop", "api-5f6d7c8b9-k7m2p")
LEDGER = ObjectRef("pods", "bank", "ledger-0")


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def gauge_req(
    groups: list[tuple[dict[str, str], str, float]], t: float | None = None
) -> ExportMetricsServiceRequest:
    """One resource group per (resource attributes, metric, value), each with one gauge point."""
    ns = int((time.time() if t is None else t) * 1e9)
    return ExportMetricsServiceRequest(
        resource_metrics=[
            pb.ResourceMetrics(
                resource=Resource(attributes=[kv(k, v) for k, v in res.items()]),
                scope_metrics=[
                    pb.ScopeMetrics(
                        metrics=[
                            pb.Metric(
                                name=metric,
                                gauge=pb.Gauge(
                                    data_points=[pb.NumberDataPoint(time_unix_nano=ns, as_double=value)]
                                ),
                            )
                        ]
                    )
                ],
            )
            for res, metric, value in groups
        ]
    )


def pod(namespace: str, name: str, ip: str, node: str = NODE, **kw) -> dict:
    obj = make_pod(namespace, name, node, labels=kw.pop("labels", None), phase=kw.pop("phase", "Running"))
    obj["status"]["podIP"] = ip
    obj["status"]["podIPs"] = [{"ip": ip}]
    obj["status"]["hostIP"] = HOST_IP
    obj["status"]["hostIPs"] = [{"ip": HOST_IP}]
    owners = kw.pop("owners", None)
    if owners is not None:
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": k, "name": n, "uid": f"{k}-{n}", "controller": True}
            for k, n in owners
        ]
    if kw.pop("host_network", False):
        obj["spec"]["hostNetwork"] = True
    assert not kw, kw
    return obj


def cluster(fake: FakeKubeAPI) -> None:
    """Deployment web and api in shop, StatefulSet ledger in bank, and the odd senders."""
    fake.upsert(
        pod(
            "shop",
            WEB.name,
            WEB_IP,
            labels={"app": "web", "pod-template-hash": "7d9f8c6b5"},
            owners=[("ReplicaSet", "web-7d9f8c6b5")],
        )
    )
    fake.upsert(
        pod(
            "shop",
            API.name,
            API_IP,
            labels={"app": "api", "pod-template-hash": "5f6d7c8b9"},
            owners=[("ReplicaSet", "api-5f6d7c8b9")],
        )
    )
    fake.upsert(pod("bank", LEDGER.name, LEDGER_IP, owners=[("StatefulSet", "ledger")]))
    dual = pod("shop", "dual-1", "10.244.0.9", owners=[("DaemonSet", "dual")])
    dual["status"]["podIPs"] = [{"ip": "10.244.0.9"}, {"ip": DUAL_IP}]  # dual-stack: the second is ours
    fake.upsert(dual)
    fake.upsert(pod("batch", "report-28391520-abcde", JOB_IP, owners=[("Job", "report-28391520")]))
    fake.upsert(
        pod("kube-system", "node-exporter-q8x7z", HOST_IP, host_network=True, owners=[("DaemonSet", "ne")])
    )
    fake.upsert(pod("shop", "elsewhere-1", OTHER_NODE_IP, node="node-b"))
    fake.upsert(pod("shop", "done-1", DONE_IP, phase="Succeeded"))
    fake.upsert(pod("shop", "twin-a", SHARED_IP))
    fake.upsert(pod("bank", "twin-b", SHARED_IP))


@dataclass
class Node:
    """The agent under attack."""

    agent: Agent
    buffer: SampleBuffer
    url: str

    @property
    def base(self) -> str:
        return self.url.removesuffix("/v1/metrics")

    async def export(self, ip: str, req: ExportMetricsServiceRequest) -> ExportMetricsServiceResponse:
        """POST ``req`` from a socket bound to ``ip`` (as the pod with that IP would)."""
        status, body = await post_from(ip, self.url, req.SerializeToString())
        assert status == 200, body
        return ExportMetricsServiceResponse.FromString(body)

    def latest(self) -> dict[tuple[str, ObjectRef, tuple], float]:
        """What the agent would serve: the newest value of every series."""
        _, samples = parse_agent_text(self.buffer.render().decode())
        return {(m, o, labels): v for m, o, labels, v, _ in samples}

    async def healthy(self) -> bool:
        async with aiohttp.ClientSession() as s, s.get(self.base + "/healthz") as r:
            return r.status == 200


async def post_from(ip: str, url: str, body: bytes, headers: dict | None = None) -> tuple[int, bytes]:
    connector = aiohttp.TCPConnector(local_addr=(ip, 0), force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(url, data=body, headers=headers or PB) as r,
    ):
        return r.status, await r.read()


@contextlib.asynccontextmanager
async def running_agent(fake: FakeKubeAPI, listen: str = "127.0.0.1:0", **otlp) -> AsyncIterator[Node]:
    client = await KubeClient.load(str(fake.kubeconfig))
    informer = pod_informer(client, NODE)
    await informer.start()
    buffer = SampleBuffer(max_series_per_pod=otlp.pop("max_series_per_pod", 1000))
    routes = otlp_routes(
        buffer,
        pods=PodsByIP.of_informer(informer, node_ips=[HOST_IP]),
        node_name=NODE,
        max_series_per_sender=buffer.max_series_per_pod,
        **otlp,
    )
    agent = Agent(buffer, {}, interval=3600, listen=listen, extra_routes=routes)
    await agent.start()
    host = listen.rpartition(":")[0]
    try:
        yield Node(agent, buffer, f"http://{host}:{agent.port}/v1/metrics")
    finally:
        await agent.stop()
        await informer.stop()
        await client.close()


@pytest.fixture
async def node(fake_kube: FakeKubeAPI) -> AsyncIterator[Node]:
    cluster(fake_kube)
    async with running_agent(fake_kube) as n:
        yield n


def rejected(reason: str) -> float:
    return REGISTRY.get_sample_value("kcms_agent_otlp_rejected_total", {"reason": reason}) or 0.0


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        assert record.exc_info is None, record.getMessage()
        assert "Traceback" not in record.getMessage()
        assert record.levelno < logging.ERROR, record.getMessage()


# ---- binding ------------------------------------------------------------------------------------


async def test_a_pods_points_are_about_itself(node: Node, caplog):
    res = [
        ({}, "no_attributes", 1.0),  # no k8s.* attribute: the sending pod
        ({"k8s.pod.name": WEB.name, "k8s.namespace.name": "shop", "k8s.node.name": NODE}, "named", 2.0),
        ({"k8s.deployment.name": "web", "k8s.namespace.name": "shop"}, "per_deployment", 3.0),
        ({"k8s.replicaset.name": "web-7d9f8c6b5", "service.name": "web"}, "per_replicaset", 4.0),
        ({"k8s.namespace.name": "shop"}, "queue_backlog", 5.0),  # its namespace: an external metric
    ]
    resp = await node.export(WEB_IP, gauge_req(res))
    assert not resp.HasField("partial_success"), resp
    got = node.latest()
    assert got[("no_attributes", WEB, ())] == 1.0
    assert got[("named", WEB, ())] == 2.0
    assert got[("per_deployment", ObjectRef("deployments.apps", "shop", "web"), ())] == 3.0
    assert got[("per_replicaset", WEB, ())] == 4.0
    assert got[("queue_backlog", ObjectRef("", "shop", ""), ())] == 5.0
    # a dual-stack pod sends from its second IP; a Job's pod may name its CronJob
    await node.export(DUAL_IP, gauge_req([({"k8s.daemonset.name": "dual"}, "dual_up", 1.0)]))
    job = {
        "k8s.job.name": "report-28391520",
        "k8s.cronjob.name": "report",
        "k8s.pod.name": "report-28391520-abcde",
    }
    assert not (await node.export(JOB_IP, gauge_req([(job, "rows", 9.0)]))).HasField("partial_success")
    got = node.latest()
    assert got[("dual_up", ObjectRef("pods", "shop", "dual-1"), ())] == 1.0
    assert got[("rows", ObjectRef("pods", "batch", "report-28391520-abcde"), ())] == 9.0
    no_traceback(caplog)


async def test_claims_of_another_pod_namespace_or_workload_are_refused(node: Node, caplog):
    # the victims write their own series first
    await node.export(LEDGER_IP, gauge_req([({}, "balance", 100.0)]))
    await node.export(API_IP, gauge_req([({"k8s.deployment.name": "api"}, "queue_depth", 3.0)]))
    before = node.latest()
    counts = {
        r: rejected(r) for r in ("foreign_namespace", "foreign_pod", "foreign_workload", "foreign_node")
    }

    attacks = [
        ({"k8s.pod.name": LEDGER.name, "k8s.namespace.name": "bank"}, "balance", 0.0),  # another namespace
        ({"k8s.namespace.name": "bank"}, "balance", 0.0),  # an external metric of another namespace
        ({"k8s.pod.name": API.name, "k8s.namespace.name": "shop"}, "queue_depth", 999.0),  # a neighbour
        ({"k8s.pod.name": API.name}, "queue_depth", 999.0),
        ({"k8s.pod.ip": API_IP}, "queue_depth", 999.0),
        (
            {"k8s.deployment.name": "api", "k8s.namespace.name": "shop"},
            "queue_depth",
            999.0,
        ),  # its Deployment
        ({"k8s.statefulset.name": "ledger"}, "balance", 0.0),
        (
            {"k8s.pod.name": WEB.name, "k8s.deployment.name": "api"},
            "queue_depth",
            999.0,
        ),  # own pod, wrong chain
        ({"k8s.node.name": "node-b", "k8s.pod.name": WEB.name}, "up", 1.0),  # another node
        ({"k8s.node.name": NODE}, "node_disk_free", 0.0),  # the node itself
    ]
    legit = ({"k8s.pod.name": WEB.name}, "requests_inflight", 4.0)
    resp = await node.export(WEB_IP, gauge_req([*attacks, legit]))
    ps = resp.partial_success
    assert ps.rejected_data_points == len(attacks)
    for part in ("2 foreign_namespace", "3 foreign_pod", "3 foreign_workload", "2 foreign_node"):
        assert part in ps.error_message, ps.error_message
    assert f"the sender is pod shop/{WEB.name}" in ps.error_message
    assert rejected("foreign_namespace") == counts["foreign_namespace"] + 2
    assert rejected("foreign_pod") == counts["foreign_pod"] + 3
    assert rejected("foreign_workload") == counts["foreign_workload"] + 3
    assert rejected("foreign_node") == counts["foreign_node"] + 2

    after = node.latest()
    assert after.pop(("requests_inflight", WEB, ())) == 4.0  # the request's honest point got through
    assert after == before  # nothing about the victims (nor the node) changed
    assert await node.healthy()
    no_traceback(caplog)


async def test_senders_that_are_not_one_pod_of_this_node_are_refused(node: Node, caplog):
    claim = ({"k8s.pod.name": LEDGER.name, "k8s.namespace.name": "bank"}, "balance", 0.0)
    cases = {
        NOBODY_IP: "unbound_sender",  # no pod has it
        OTHER_NODE_IP: "unbound_sender",  # a pod of another node
        DONE_IP: "unbound_sender",  # a finished pod no longer holds its IP
        HOST_IP: "host_network_sender",  # the node / a hostNetwork pod: cannot tell which
        SHARED_IP: "ambiguous_sender",  # two live pods claim it
    }
    for ip, reason in cases.items():
        before = rejected(reason)
        resp = await node.export(ip, gauge_req([claim, ({}, "up", 1.0)]))
        assert resp.partial_success.rejected_data_points == 2, ip
        assert f"2 {reason}" in resp.partial_success.error_message
        assert "--otlp-allow-unbound" in resp.partial_success.error_message
        assert rejected(reason) == before + 2
    # the same in OTLP/JSON
    body = json_format.MessageToJson(gauge_req([claim])).encode()
    status, raw = await post_from(NOBODY_IP, node.url, body, {"Content-Type": "application/json"})
    assert status == 200
    answer = orjson.loads(raw)["partialSuccess"]
    assert answer["rejectedDataPoints"] == "1" and "unbound_sender" in answer["errorMessage"]
    assert node.buffer.series() == []
    assert await node.healthy()
    no_traceback(caplog)
    assert any("refused 2 of 2 data points" in r.getMessage() for r in caplog.records)


async def test_allow_unbound_trusts_unbound_senders_only(fake_kube: FakeKubeAPI, caplog):
    cluster(fake_kube)
    async with running_agent(fake_kube, allow_unbound=True) as node:
        claim = {"k8s.pod.name": LEDGER.name, "k8s.namespace.name": "bank"}
        resp = await node.export(NOBODY_IP, gauge_req([(claim, "balance", 7.0)]))
        assert not resp.HasField("partial_success")
        resp = await node.export(HOST_IP, gauge_req([({"k8s.node.name": NODE}, "node_temp", 40.0)]))
        assert not resp.HasField("partial_success")
        # a pod is still bound to itself: the flag trusts only senders that are no pod
        resp = await node.export(WEB_IP, gauge_req([(claim, "balance", 0.0)]))
        assert resp.partial_success.rejected_data_points == 1
        assert "foreign_namespace" in resp.partial_success.error_message
        # without any k8s.* attribute, an unbound sender's points are about nothing
        resp = await node.export(NOBODY_IP, gauge_req([({"service.name": "x"}, "up", 1.0)]))
        assert "1 unbound" in resp.partial_success.error_message
        got = node.latest()
        assert got == {("balance", LEDGER, ()): 7.0, ("node_temp", ObjectRef("nodes", "", NODE), ()): 40.0}
    no_traceback(caplog)


async def test_binding_follows_the_pod_list(fake_kube: FakeKubeAPI, caplog):
    """An IP freed by a deleted pod and given to a pod of another namespace speaks for the new pod."""
    cluster(fake_kube)
    async with running_agent(fake_kube) as node:
        await node.export(LEDGER_IP, gauge_req([({}, "balance", 100.0)]))
        fake_kube.delete("pods", "bank", LEDGER.name)

        async def refused() -> bool:
            resp = await node.export(LEDGER_IP, gauge_req([({}, "probe", 1.0)]))
            return "unbound_sender" in resp.partial_success.error_message

        await eventually_async(refused)
        fake_kube.upsert(pod("shop", "cache-0", LEDGER_IP, owners=[("StatefulSet", "cache")]))

        async def bound_to_new_pod() -> bool:
            resp = await node.export(LEDGER_IP, gauge_req([({}, "hits", 5.0)]))
            return not resp.HasField("partial_success")

        await eventually_async(bound_to_new_pod)
        resp = await node.export(LEDGER_IP, gauge_req([({"k8s.namespace.name": "bank"}, "balance", 0.0)]))
        assert "foreign_namespace" in resp.partial_success.error_message
        got = node.latest()
        assert got[("hits", ObjectRef("pods", "shop", "cache-0"), ())] == 5.0
        assert got[("balance", LEDGER, ())] == 100.0
        assert ("probe", LEDGER, ()) not in got
    no_traceback(caplog)


async def eventually_async(check, limit: float = 20.0) -> None:
    """Until the async ``check`` is true (a generous deadline, not a timing assertion)."""
    deadline = asyncio.get_running_loop().time() + limit
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_before_the_pod_list_is_in_pushes_are_retried_not_lost(caplog):
    buffer = SampleBuffer()
    pods = PodsByIP(lambda: [], synced=lambda: False)
    agent = Agent(
        buffer, {}, interval=3600, listen="127.0.0.1:0", extra_routes=otlp_routes(buffer, pods=pods)
    )
    await agent.start()
    try:
        url = f"http://127.0.0.1:{agent.port}/v1/metrics"
        async with aiohttp.ClientSession() as s:
            body = gauge_req([({}, "up", 1.0)]).SerializeToString()
            async with s.post(url, data=body, headers=PB) as r:
                assert r.status == 503 and r.headers["Retry-After"] == "1"  # OTLP exporters retry a 503
                assert b"not listed this node's pods yet" in await r.read()
        assert buffer.series() == []
    finally:
        await agent.stop()
    no_traceback(caplog)


async def test_an_ipv6_sender_is_bound_by_its_podips_entry(fake_kube: FakeKubeAPI, caplog):
    """Dual-stack: the pod's IPv6 address (written non-canonically in status.podIPs) binds a sender
    connecting over IPv6; its claim on another pod is refused as from any address."""
    cluster(fake_kube)
    v6 = pod("shop", "v6-1", "10.244.0.20")
    v6["status"]["podIPs"] = [{"ip": "10.244.0.20"}, {"ip": "0:0:0:0:0:0:0:1"}]
    fake_kube.upsert(v6)
    async with running_agent(fake_kube, listen="[::1]:0") as node:
        resp = await node.export("::1", gauge_req([({}, "up", 1.0), ({"k8s.pod.name": API.name}, "q", 9.0)]))
        assert resp.partial_success.rejected_data_points == 1
        assert "foreign_pod" in resp.partial_success.error_message
        assert node.latest() == {("up", ObjectRef("pods", "shop", "v6-1"), ()): 1.0}
        assert await node.healthy()
    no_traceback(caplog)


def test_owner_chain_as_the_k8sattributes_processor_infers_it():
    def chain(owners, labels=None):
        obj = pod("ns", "p-1", "10.0.0.1", labels=labels, owners=owners)
        return workloads(agent_pod_from_json(obj))

    assert chain([("ReplicaSet", "web-7d9f8c6b5")], {"pod-template-hash": "7d9f8c6b5"}) == {
        "ReplicaSet": "web-7d9f8c6b5",
        "Deployment": "web",
    }
    assert chain([("ReplicaSet", "web-7d9f8c6b5")]) == {"ReplicaSet": "web-7d9f8c6b5"}  # a bare ReplicaSet
    assert chain([("ReplicaSet", "web")], {"pod-template-hash": "web"}) == {"ReplicaSet": "web"}
    assert chain([("Job", "report-28391520")]) == {"Job": "report-28391520", "CronJob": "report"}
    assert chain([("StatefulSet", "db")]) == {"StatefulSet": "db"}
    assert chain([("Node", "node-a")]) == {}  # a static pod's mirror: no workload
    assert chain([]) == {}
    p = agent_pod_from_json(
        {"metadata": {"name": "x"}, "status": {"podIP": "::ffff:10.0.0.1", "podIPs": "bad"}}
    )
    assert p.ips == ("10.0.0.1",)


# ---- bounds -------------------------------------------------------------------------------------


async def test_future_timestamps_are_refused(node: Node, caplog):
    before = rejected("future_timestamp")
    now = time.time()
    resp = await node.export(WEB_IP, gauge_req([({}, "ahead", 1.0)], t=now + 3600))
    assert resp.partial_success.rejected_data_points == 1
    assert "1 future_timestamp" in resp.partial_success.error_message
    assert "--max-future-skew" in resp.partial_success.error_message
    year_2500 = gauge_req([({}, "ahead", 1.0)], t=16_725_225_600.0)
    assert (await node.export(WEB_IP, year_2500)).partial_success.rejected_data_points == 1
    resp = await node.export(WEB_IP, gauge_req([({}, "slightly_ahead", 1.0)], t=now + 20))  # within 60 s
    assert not resp.HasField("partial_success")
    assert rejected("future_timestamp") == before + 2
    assert [m for m, _, _ in node.buffer.series()] == ["slightly_ahead"]
    no_traceback(caplog)


async def test_oversize_names_and_labels_are_refused(node: Node, caplog):
    def point(**attrs: str) -> pb.NumberDataPoint:
        return pb.NumberDataPoint(
            time_unix_nano=time.time_ns(), as_double=1.0, attributes=[kv(k, v) for k, v in attrs.items()]
        )

    ok = pb.Metric(name="fine", gauge=pb.Gauge(data_points=[point(route="/a")]))
    long_name = pb.Metric(name="n" * 300, gauge=pb.Gauge(data_points=[point(), point(x="1")]))
    hist = pb.Histogram(
        data_points=[pb.HistogramDataPoint(time_unix_nano=time.time_ns(), count=1, bucket_counts=[1])],
        aggregation_temporality=pb.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE,
    )
    suffix_too_long = pb.Metric(name="h" * 250, histogram=hist)  # h*250_bucket is 257 characters
    labels = pb.Metric(
        name="labelled",
        gauge=pb.Gauge(
            data_points=[
                point(**{f"k{i}": "v" for i in range(40)}),
                point(big="v" * 5000),
                point(**{"k" * 200: "v"}),
                point(evil="\n\x1b[31mFAKE LOG LINE"),  # fine as a value; escaped wherever printed
            ]
        ),
    )
    req = ExportMetricsServiceRequest(
        resource_metrics=[
            pb.ResourceMetrics(
                resource=Resource(attributes=[kv("k8s.pod.name", "x\n\x1b[2J" + "y" * 10_000)]),
                scope_metrics=[pb.ScopeMetrics(metrics=[ok])],
            ),
            pb.ResourceMetrics(
                scope_metrics=[pb.ScopeMetrics(metrics=[ok, long_name, suffix_too_long, labels])]
            ),
        ]
    )
    resp = await node.export(WEB_IP, req)
    ps = resp.partial_success
    assert ps.rejected_data_points == 7
    for part in (
        "1 foreign_pod",
        "3 metric_name_too_long",
        "1 too_many_labels",
        "1 label_value_too_long",
        "1 label_name_too_long",
    ):
        assert part in ps.error_message, ps.error_message
    assert len(ps.error_message) < 3000  # bounded, whatever the client sent
    assert "\n" not in ps.error_message and "\x1b" not in ps.error_message
    got = node.latest()
    assert got == {
        ("fine", WEB, (("route", "/a"),)): 1.0,
        ("labelled", WEB, (("evil", "\n\x1b[31mFAKE LOG LINE"),)): 1.0,
    }
    for record in caplog.records:
        assert "\x1b" not in record.getMessage() and "\n" not in record.getMessage()
    no_traceback(caplog)


async def test_a_flood_of_series_stays_within_the_senders_budget(fake_kube: FakeKubeAPI, caplog):
    """A pod sending 100 000 distinct series (about itself, its Deployment and its namespace) keeps at
    most its budget alive; its neighbour still writes; the buffer and the budget stay bounded."""
    cluster(fake_kube)
    limit = 500
    async with running_agent(fake_kube, max_series_per_pod=limit) as node:
        await node.export(API_IP, gauge_req([({}, "queue_depth", 3.0)]))
        before = rejected("sender_limit")
        targets = [{}, {"k8s.deployment.name": "web"}, {"k8s.namespace.name": "shop"}]
        sent = refused = 0
        for chunk in range(10):
            points = [
                pb.NumberDataPoint(
                    time_unix_nano=time.time_ns(), as_double=1.0, attributes=[kv("id", f"{chunk}-{i}")]
                )
                for i in range(10_000)
            ]
            res = targets[chunk % 3]
            req = ExportMetricsServiceRequest(
                resource_metrics=[
                    pb.ResourceMetrics(
                        resource=Resource(attributes=[kv(k, v) for k, v in res.items()]),
                        scope_metrics=[
                            pb.ScopeMetrics(
                                metrics=[pb.Metric(name="flood", gauge=pb.Gauge(data_points=points))]
                            )
                        ],
                    )
                ]
            )
            resp = await node.export(WEB_IP, req)
            sent += len(points)
            refused += resp.partial_success.rejected_data_points
        assert sent == 100_000 and refused == sent - limit
        assert rejected("sender_limit") == before + refused
        flood = [s for s in node.buffer.series() if s[0] == "flood"]
        assert len(flood) == limit
        # the neighbour is unaffected: its series is there and it can still add new ones
        assert not (await node.export(API_IP, gauge_req([({}, "new_series", 1.0)]))).HasField(
            "partial_success"
        )
        got = node.latest()
        assert got[("queue_depth", API, ())] == 3.0 and got[("new_series", API, ())] == 1.0
        assert node.buffer.stats()["series"] == limit + 2
        assert await node.healthy()
    logged = [r for r in caplog.records if "sender_limit" in r.getMessage()]
    assert 1 <= len(logged) < 10  # ten refused requests: one line per reason every LOG_EVERY seconds
    no_traceback(caplog)


def test_sender_budget_forgets_idle_series():
    budget = SenderSeries(max_series=2, idle=0.05)
    sample = ("m", ObjectRef("pods", "a", "b"), (("i", "1"),), 0.0, 1.0)
    other = ("m", ObjectRef("pods", "a", "b"), (("i", "2"),), 0.0, 1.0)
    third = ("m", ObjectRef("pods", "a", "b"), (("i", "3"),), 0.0, 1.0)
    assert budget.admit("p", [sample]) and budget.admit("p", [other]) and budget.admit("p", [sample])
    assert not budget.admit("p", [third]) and budget.count("p") == 2
    assert budget.admit("q", [third])  # per sender
    time.sleep(0.1)
    assert budget.admit("p", [third]) and budget.count("p") == 1 and len(budget) == 1


# ---- the real SDK and the real process ------------------------------------------------------------


async def test_opentelemetry_sdk_from_a_pod_ip(node: Node, caplog):
    """The OpenTelemetry SDK's exporter, unmodified but for its socket's source address, with the
    resource the SDK makes by itself (no k8s.* attribute): the points are about the sending pod."""
    sdk_metrics = pytest.importorskip("opentelemetry.sdk.metrics")
    http_exporter = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")
    import requests
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from requests.adapters import HTTPAdapter

    class FromPodIP(HTTPAdapter):
        def init_poolmanager(self, *args, **kwargs):
            kwargs["source_address"] = (WEB_IP, 0)
            super().init_poolmanager(*args, **kwargs)

    session = requests.Session()
    session.mount("http://", FromPodIP())
    exporter = http_exporter.OTLPMetricExporter(endpoint=node.url, timeout=10, session=session)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = sdk_metrics.MeterProvider(metric_readers=[reader])
    try:
        provider.get_meter("test").create_counter("http.requests").add(3, {"http.route": "/a"})
        assert await asyncio.to_thread(provider.force_flush, 10_000)
    finally:
        await asyncio.to_thread(provider.shutdown)
    assert node.latest()[("http_requests_total", WEB, (("http_route", "/a"),))] == 3.0
    no_traceback(caplog)


@pytest.mark.parametrize("allow", [False, True], ids=["default", "allow-unbound"])
async def test_kcms_agent_process_binds_otlp_senders(fake_kube: FakeKubeAPI, allow: bool):
    """``kcms agent`` (a real process) with its informer: a pod's honest point is kept, its claim on
    another namespace refused; an unbound sender is refused unless --otlp-allow-unbound."""
    cluster(fake_kube)
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "kcms.cmd.agent",
        f"--node-name={NODE}",
        f"--kubeconfig={fake_kube.kubeconfig}",
        f"--listen=127.0.0.1:{port}",
        "--insecure-serving",
        "--no-cgroups",
        "--no-apps",
        "--no-node",
        "--no-kubelet",
        f"--kubelet-address={HOST_IP}",
        *(["--otlp-allow-unbound"] if allow else []),
    ]
    proc = await asyncio.create_subprocess_exec(
        *args, cwd=REPO, stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    url = f"http://127.0.0.1:{port}/v1/metrics"
    try:
        body = gauge_req(
            [({}, "up", 1.0), ({"k8s.namespace.name": "bank"}, "balance", 0.0)]
        ).SerializeToString()
        deadline = asyncio.get_running_loop().time() + 30
        while True:  # until it listens and has listed the pods (503 before)
            assert proc.returncode is None
            assert asyncio.get_running_loop().time() < deadline, "the agent never accepted OTLP"
            with contextlib.suppress(aiohttp.ClientError):
                status, raw = await post_from(WEB_IP, url, body)
                if status == 200:
                    break
                assert status == 503, raw
            await asyncio.sleep(0.1)
        ps = ExportMetricsServiceResponse.FromString(raw).partial_success
        assert ps.rejected_data_points == 1 and "foreign_namespace" in ps.error_message
        claim = gauge_req([({"k8s.pod.name": LEDGER.name, "k8s.namespace.name": "bank"}, "balance", 7.0)])
        status, raw = await post_from(NOBODY_IP, url, claim.SerializeToString())
        assert status == 200
        ps = ExportMetricsServiceResponse.FromString(raw).partial_success
        assert ps.rejected_data_points == (0 if allow else 1)
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
            _, samples = parse_agent_text(await r.text())
        got = {(m, o): v for m, o, _, v, _ in samples}
        expected = {("up", WEB): 1.0}
        if allow:
            expected[("balance", LEDGER)] = 7.0
        assert got == expected
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/healthz") as r:
            assert r.status == 200
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        stderr = (await asyncio.wait_for(proc.communicate(), 30))[1].decode()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    if not allow:
        assert "unbound_sender" in stderr  # the refusal is logged, once
    assert orjson.dumps(stderr)  # printable


def test_contradictory_otlp_flags_stop_start_up_naming_the_flag():
    import subprocess

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kcms.cmd.agent",
            f"--node-name={NODE}",
            "--insecure-serving",
            "--no-otlp",
            "--otlp-allow-unbound",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "argument --otlp-allow-unbound: not allowed with --no-otlp" in result.stderr
    assert "Traceback" not in result.stderr
