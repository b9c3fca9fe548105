"""Push reporting (kcms/agent/push.py -> kcms/apis/nodepush.py): real aggregated API servers over
HTTPS with delegated authentication and authorization through the fake Kubernetes API, an active
and a standby server, failover, stale nodes, malformed input, and a real `kcms agent --push`
process scraping a simulated kubelet. Every push here is made with a node-bound credential (the
node claim of a bound ServiceAccount token); what other credentials may do is
tests/test_security_node_push.py's subject."""

from __future__ import annotations

import asyncio
import gzip
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import orjson
import pytest
from _process_helpers import stop_process
from prometheus_client import REGISTRY

from kcms.agent.buffer import SampleBuffer
from kcms.agent.push import PushReporter
from kcms.apis.nodebinding import NODE_NAME_EXTRA
from kcms.apis.nodepush import EPOCH_HEADER, NODES_PATH, STATUS_PATH, NodePushAPI
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions
from kcms.kube.client import KubeClient
from kcms.kube.inventory import StaticInventory
from kcms.kube.reviews import AccessReviewer, TokenReviewer
from kcms.model import NodeBatch, ObjectRef, ResourcePoint
from kcms.sim import SimulatedCluster
from kcms.store.resource import ResourceStore
from kcms.store.series import SeriesStore
from kcms.store.wire import CONTENT_TYPE, Write, WriteAck, block_of, decode, encode, node_to_wire

REPO = Path(__file__).resolve().parent.parent
AGENT_TOKEN, READER_TOKEN = "agent-token", "reader-token"
AGENT_USER = "system:serviceaccount:kcms:kcms-agent"
POD = ObjectRef("pods", "shop", "web-1")


def inventory(nodes: list[str], pods: list[tuple[str, str, str]]) -> StaticInventory:
    """Nodes by name and pods as ``(namespace, name, node)``."""
    objects: list[dict] = [{"kind": "Node", "metadata": {"name": n}} for n in nodes]
    objects += [
        {"kind": "Pod", "metadata": {"namespace": ns, "name": name}, "spec": {"nodeName": node}}
        for ns, name, node in pods
    ]
    return StaticInventory(objects)


# node-1 runs the pods shop/web-0 .. web-99
NODE_1 = inventory(["node-1"], [("shop", f"web-{i}", "node-1") for i in range(100)])


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def grant_pushes(spec: dict) -> tuple[bool, str]:
    """The RBAC rule of kcms/apis/nodepush.py's docstring, for the agents' service account."""
    attrs = spec.get("nonResourceAttributes")
    if spec.get("user") != AGENT_USER or attrs is None:
        return False, ""
    allowed = {(NODES_PATH, "post"), (STATUS_PATH, "get")}
    return (attrs["path"], attrs["verb"]) in allowed, "allowed by kcms-node-pusher"


@dataclass
class PushServer:
    """One aggregated API server with a NodePushAPI over its own stores."""

    server: AggregatedAPIServer
    api: NodePushAPI
    resources: ResourceStore
    series: SeriesStore
    active: bool = True

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"


@pytest.fixture
def pki(ca, tmp_path: Path) -> tuple[str, str, str]:
    """(CA file, serving cert file, key file) for 127.0.0.1, issued by the test CA."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return str(ca_file), str(cert_file), str(key_file)


@pytest.fixture
async def make_server(fake_kube, pki) -> AsyncIterator[Callable[..., Any]]:
    """Start push servers: ``await make_server(active=..., node_stale_after=..., ...)``."""
    fake_kube.authorize = grant_pushes
    # the bound token of node-1's agent pod: TokenReview gives its node claim
    fake_kube.tokens[AGENT_TOKEN] = {
        "username": AGENT_USER,
        "uid": "1",
        "extra": {NODE_NAME_EXTRA: ["node-1"]},
    }
    fake_kube.tokens[READER_TOKEN] = {"username": "reader", "uid": "2"}
    kube = await KubeClient.load(str(fake_kube.kubeconfig))
    _, cert_file, key_file = pki
    started: list[PushServer] = []

    async def make(
        *,
        active: bool = True,
        node_stale_after: float = 60.0,
        max_body_bytes: int = 16 << 20,
        inventory: StaticInventory = NODE_1,
    ) -> PushServer:
        resources = ResourceStore(resolution=1.0, max_age=300.0)
        series = SeriesStore()
        server = AggregatedAPIServer(
            ServingOptions(
                secure_port=0,
                bind_address="127.0.0.1",
                tls_cert_file=cert_file,
                tls_private_key_file=key_file,
            ),
            AuthnOptions(skip_lookup=True, token_reviewer=TokenReviewer(kube)),
            AuthzOptions(access_reviewer=AccessReviewer(kube)),
        )
        holder: dict[str, PushServer] = {}
        api = NodePushAPI(
            resources,
            series,
            active=lambda: holder["s"].active,
            node_stale_after=node_stale_after,
            max_body_bytes=max_body_bytes,
            inventory=inventory,
        )
        ps = holder["s"] = PushServer(server, api, resources, series, active=active)
        api.attach(server.app)
        await server.start()
        started.append(ps)
        return ps

    try:
        yield make
    finally:
        for ps in started:
            await ps.server.stop()
        await kube.close()


class SimulatedNode:
    """``collect()`` for the reporter: a node at exactly 2 cores and a pod at 0.5, one second of
    kubelet time per call."""

    def __init__(self, name: str = "node-1") -> None:
        self.name = name
        self.calls = 0
        self.t0 = time.time() - 100

    async def collect(self) -> Write:
        self.calls += 1
        k = self.calls
        ts = self.t0 + k
        batch = NodeBatch(
            self.name,
            ResourcePoint(self.t0 - 1000, ts, k * 2_000_000_000, 4 << 30),
            {(POD.namespace, POD.name): {"app": ResourcePoint(self.t0 - 1000, ts, k * 500_000_000, 1 << 28)}},
        )
        return Write(nodes=[node_to_wire(batch)])


def reporter(servers: list[PushServer], ca_file: str, node: SimulatedNode, buffer: SampleBuffer | None):
    return PushReporter(
        [s.url for s in servers],
        interval=3600,
        timeout=5,
        token_source=lambda: AGENT_TOKEN,
        ca_file=ca_file,
        collect=node.collect,
        buffer=buffer,
    )


def points(series: SeriesStore) -> int:
    return series.stats()["points"]


# ---- active / standby and failover --------------------------------------------------------------------


async def test_the_active_server_stores_the_standby_refuses_and_failover_moves_the_reporter(
    make_server, pki
) -> None:
    ca_file = pki[0]
    standby, active = await make_server(active=False), await make_server(active=True)
    node = SimulatedNode()
    buffer = SampleBuffer()
    now = time.time()
    buffer.add("queue_depth", POD, (("queue", "q"),), now - 5, 1.0)
    buffer.add("queue_depth", POD, (("queue", "q"),), now - 4, 2.0)
    rep = reporter([standby, active], ca_file, node, buffer)  # the standby is listed first
    standby_before = value("kcms_push_node_requests_total", outcome="standby")
    agent_standby_before = value("kcms_agent_pushes_total", endpoint=standby.url, outcome="standby")
    try:
        assert await rep.push_once()
        assert rep.active_endpoint == active.url
        assert rep.last_ack == WriteAck(nodes=1, samples=2, refused=0)
        assert value("kcms_push_node_requests_total", outcome="standby") == standby_before + 1
        assert (
            value("kcms_agent_pushes_total", endpoint=standby.url, outcome="standby")
            == agent_standby_before + 1
        )

        buffer.add("queue_depth", POD, (("queue", "q"),), now - 3, 3.0)
        assert await rep.push_once()
        assert rep.last_ack == WriteAck(nodes=1, samples=1, refused=0)  # only the new point
        usage = active.resources.node_usage("node-1")
        assert usage is not None and usage.cpu_nanocores == 2_000_000_000 and usage.window == 1.0
        pod = active.resources.pod_usage(POD.namespace, POD.name)
        assert pod is not None and pod.containers[0][1].cpu_nanocores == 500_000_000
        [r] = active.series.query("pods", "shop", ["web-1"], "queue_depth", now=now)
        assert r.value == 3.0 and points(active.series) == 3
        # the standby stored nothing at all
        assert standby.resources.stats() == (0, 0, 0) and points(standby.series) == 0
        assert standby.api.fresh_nodes() == []

        # failover: the reporter moves within one push, and sends the whole buffer there
        active.active, standby.active = False, True
        buffer.add("queue_depth", POD, (("queue", "q"),), now - 2, 4.0)
        assert await rep.push_once()
        assert rep.active_endpoint == standby.url
        assert rep.last_ack == WriteAck(nodes=1, samples=4, refused=0)
        assert points(standby.series) == 4
        assert active.resources.node_usage("node-1") is None  # a server that stepped down forgets
        assert await rep.push_once()
        usage = standby.resources.node_usage("node-1")
        assert usage is not None and usage.cpu_nanocores == 2_000_000_000
        assert rep.last_ack == WriteAck(nodes=1, samples=0, refused=0)  # nothing new in the buffer
    finally:
        await rep.stop()


async def test_a_server_that_held_data_afresh_gets_the_whole_buffer_again(make_server, pki) -> None:
    server = await make_server()
    node = SimulatedNode()
    buffer = SampleBuffer()
    now = time.time()
    for i in range(3):
        buffer.add("queue_depth", POD, (), now - 10 + i, float(i))
    rep = reporter([server], pki[0], node, buffer)
    accepted = lambda: value("kcms_agent_pushes_total", endpoint=server.url, outcome="accepted")  # noqa: E731
    try:
        assert await rep.push_once() and rep.last_ack is not None and rep.last_ack.samples == 3
        before = accepted()
        # a standby period the reporter never saw: the server starts afresh with a new epoch
        server.active = False
        server.api.stale_nodes()
        server.active = True
        server.series = server.api.series = SeriesStore()  # as a new process would hold
        buffer.add("queue_depth", POD, (), now - 5, 9.0)
        conflicts = value("kcms_agent_pushes_total", endpoint=server.url, outcome="epoch_changed")
        assert await rep.push_once()
        # the delta was refused (409, nothing stored), the whole buffer followed at once
        assert value("kcms_agent_pushes_total", endpoint=server.url, outcome="epoch_changed") == conflicts + 1
        assert accepted() == before + 1
        assert rep.last_ack is not None and rep.last_ack.samples == 4
        assert points(server.series) == 4
        buffer.add("queue_depth", POD, (), now - 4, 10.0)
        assert await rep.push_once() and rep.last_ack.samples == 1  # and deltas again after that
    finally:
        await rep.stop()


async def test_connection_errors_move_on_and_4xx_ends_the_round(make_server, pki, tmp_path) -> None:
    server = await make_server()
    dead = "https://127.0.0.1:1"  # nothing listens on port 1
    node = SimulatedNode()
    token = {"value": AGENT_TOKEN}
    rep = PushReporter(
        [dead, server.url],
        interval=3600,
        timeout=2,
        token_source=lambda: token["value"],
        ca_file=pki[0],
        collect=node.collect,
    )
    try:
        unreachable = value("kcms_agent_pushes_total", endpoint=dead, outcome="unreachable")
        assert await rep.push_once() and rep.active_endpoint == server.url
        assert value("kcms_agent_pushes_total", endpoint=dead, outcome="unreachable") == unreachable + 1
        # a token without the grant: refused (403), counted, and the dead endpoint is not tried
        token["value"] = READER_TOKEN
        rejected = value("kcms_agent_pushes_total", endpoint=server.url, outcome="rejected")
        assert not await rep.push_once()
        assert value("kcms_agent_pushes_total", endpoint=server.url, outcome="rejected") == rejected + 1
        assert value("kcms_agent_pushes_total", endpoint=dead, outcome="unreachable") == unreachable + 1
        token["value"] = AGENT_TOKEN  # re-read on every push: a rotated token works at once
        assert await rep.push_once()
    finally:
        await rep.stop()


async def test_a_token_rotated_during_a_push_is_retried_once_and_no_token_sends_nothing(
    make_server, pki, fake_kube
) -> None:
    server = await make_server()
    # the kubelet swaps the projected token file while a push with the old one is in flight: the old
    # one is no longer valid by the time the server reviews it
    reads = iter(["expired-token", AGENT_TOKEN, AGENT_TOKEN, "", ""])
    rep = PushReporter(
        [server.url],
        interval=3600,
        timeout=5,
        token_source=lambda: next(reads),
        ca_file=pki[0],
        collect=SimulatedNode().collect,
    )
    rejected = value("kcms_agent_pushes_total", endpoint=server.url, outcome="rejected")
    accepted = value("kcms_agent_pushes_total", endpoint=server.url, outcome="accepted")
    try:
        assert await rep.push_once()
        assert value("kcms_agent_pushes_total", endpoint=server.url, outcome="rejected") == rejected + 1
        assert value("kcms_agent_pushes_total", endpoint=server.url, outcome="accepted") == accepted + 1
        reviews = [r["spec"]["token"] for r in fake_kube.token_reviews]
        assert reviews[-2:] == ["expired-token", AGENT_TOKEN]
        # an empty token file: nothing is sent (an anonymous push would only be refused)
        no_token = value("kcms_agent_pushes_total", endpoint=server.url, outcome="no_token")
        received = value("kcms_push_node_requests_total", outcome="accepted")
        assert not await rep.push_once()
        assert value("kcms_agent_pushes_total", endpoint=server.url, outcome="no_token") == no_token + 1
        assert value("kcms_push_node_requests_total", outcome="accepted") == received
        assert len(fake_kube.token_reviews) == len(reviews)
    finally:
        await rep.stop()


async def test_a_push_over_the_size_limit_is_retried_with_the_newest_points_only(make_server, pki) -> None:
    server = await make_server(max_body_bytes=64 * 1024)
    buffer = SampleBuffer()
    now = time.time()
    for p in range(100):
        for k in range(30):
            buffer.add("queue_depth", ObjectRef("pods", "shop", f"web-{p}"), (), now - 60 + k, float(k))
    rep = reporter([server], pki[0], SimulatedNode(), buffer)
    too_large = value("kcms_agent_pushes_total", endpoint=server.url, outcome="too_large")
    try:
        assert await rep.push_once()
        assert value("kcms_agent_pushes_total", endpoint=server.url, outcome="too_large") == too_large + 1
        assert rep.last_ack == WriteAck(nodes=1, samples=100, refused=0)
        assert {r.value for r in server.series.query("pods", "shop", None, "queue_depth", now=now)} == {29.0}
        buffer.add("queue_depth", ObjectRef("pods", "shop", "web-0"), (), now - 1, 99.0)
        assert await rep.push_once() and rep.last_ack.samples == 1  # deltas from there on
    finally:
        await rep.stop()


# ---- stale nodes -------------------------------------------------------------------------------------


async def get_status(server: PushServer, ca_file: str, token: str = AGENT_TOKEN) -> tuple[int, Any]:
    ctx = ssl.create_default_context(cafile=ca_file)
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as s:
        async with s.get(server.url + STATUS_PATH, headers=headers, ssl=ctx) as r:
            return r.status, orjson.loads(await r.read())


async def test_a_silent_node_becomes_stale_is_not_served_and_is_fresh_again_when_it_reports(
    make_server, pki
) -> None:
    server = await make_server(node_stale_after=0.5)
    # node-9 is in the inventory and never reports
    server.api.inventory = inventory(["node-1", "node-9"], [(POD.namespace, POD.name, "node-1")])
    node = SimulatedNode()
    rep = reporter([server], pki[0], node, None)
    marked = value("kcms_push_nodes_marked_stale_total")
    try:
        assert await rep.push_once() and await rep.push_once()
        assert server.resources.node_usage("node-1") is not None
        status, body = await get_status(server, pki[0])
        assert status == 200 and body["active"] is True and body["nodeStaleAfterSeconds"] == 0.5
        assert body["nodes"]["fresh"] == 1

        # silence: the server's sweep marks node-1 stale (node-9 too, once the server has been
        # active for node_stale_after) and forgets its readings
        deadline = time.monotonic() + 20
        while value("kcms_push_stale_nodes") != 2:
            assert time.monotonic() < deadline, value("kcms_push_stale_nodes")
            await asyncio.sleep(0.05)
        assert server.api.stale_nodes() == ["node-1", "node-9"]
        # forgotten: not served even though the store's max_age (300 s) would still allow it
        assert server.resources.max_age > 100
        assert server.resources.node_usage("node-1") is None
        assert server.resources.pod_usage(POD.namespace, POD.name) is None
        status, body = await get_status(server, pki[0])
        assert body["nodes"] == {"fresh": 0, "stale": ["node-1", "node-9"]}
        assert value("kcms_push_stale_nodes") == 2
        assert value("kcms_push_nodes_marked_stale_total") == marked + 2

        assert await rep.push_once()  # it reports again: fresh at once
        status, body = await get_status(server, pki[0])
        assert body["nodes"] == {"fresh": 1, "stale": ["node-9"]}
        assert value("kcms_push_stale_nodes") == 1
        assert await rep.push_once()
        assert server.resources.node_usage("node-1") is not None
        assert value("kcms_push_nodes_marked_stale_total") == marked + 2  # node-9 is not counted twice

        server.api.inventory = NODE_1  # node-9 left the inventory: no longer listed
        assert server.api.stale_nodes() == []
        status, body = await get_status(server, pki[0], READER_TOKEN)
        assert status == 403 and body["reason"] == "Forbidden"
    finally:
        await rep.stop()


# ---- malformed input and access ------------------------------------------------------------------------


async def post(
    server: PushServer,
    ca_file: str,
    body: Any,
    *,
    token: str | None = AGENT_TOKEN,
    content_type: str = CONTENT_TYPE,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, Any]:
    ctx = ssl.create_default_context(cafile=ca_file)
    hdrs = {"Content-Type": content_type}
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    hdrs.update(headers or {})
    async with aiohttp.ClientSession() as s:
        async with s.post(server.url + NODES_PATH, data=body, headers=hdrs, ssl=ctx) as r:
            return r.status, await r.read(), r.headers


def status_of(data: bytes) -> dict:
    doc = orjson.loads(data)
    assert doc["kind"] == "Status" and doc["status"] == "Failure"
    return doc


async def test_bad_input_is_refused_with_status_objects(make_server, pki) -> None:
    server = await make_server(max_body_bytes=64 * 1024)
    ca_file = pki[0]
    good = encode(Write(nodes=[node_to_wire(NodeBatch("node-1", ResourcePoint(1.0, time.time(), 5, 6)))]))

    code, data, _ = await post(server, ca_file, b"\xc1\xc1")
    assert code == 400 and "malformed push body" in status_of(data)["message"]
    code, data, _ = await post(server, ca_file, msgspec.msgpack.encode({"nodes": "x"}))
    assert code == 400 and status_of(data)["reason"] == "BadRequest"
    code, data, _ = await post(server, ca_file, msgspec.msgpack.encode([[["n", None, "pods"]]]))
    assert code == 400 and "$[0][0][2]" in status_of(data)["message"]  # names where it is wrong
    code, data, _ = await post(
        server, ca_file, gzip.compress(good)[:-12], headers={"Content-Encoding": "gzip"}
    )
    assert code == 400 and "truncated" in status_of(data)["message"]
    corrupt = gzip.compress(good)[:10] + b"\xff" * 40
    code, data, _ = await post(server, ca_file, corrupt, headers={"Content-Encoding": "gzip"})
    assert code == 400 and "cannot read the request body (gzip)" in status_of(data)["message"]

    code, data, _ = await post(server, ca_file, b"\x00" * 70_000)
    assert code == 413 and status_of(data)["reason"] == "RequestEntityTooLarge"
    bomb = gzip.compress(encode(Write(series=[("m", "", "ns", "", (), b"\x00" * 200_000)])))
    assert len(bomb) < 64 * 1024
    code, data, _ = await post(server, ca_file, bomb, headers={"Content-Encoding": "gzip"})
    assert code == 413 and "65536 bytes" in status_of(data)["message"]  # the limit is on decoded bytes

    code, data, _ = await post(server, ca_file, good, content_type="application/json")
    assert code == 415 and status_of(data)["reason"] == "UnsupportedMediaType"

    code, data, _ = await post(server, ca_file, good, token=None)
    assert code == 401 and status_of(data)["reason"] == "Unauthorized"
    code, data, _ = await post(server, ca_file, good, token=READER_TOKEN)
    assert code == 403 and 'cannot post path "/push/v1/nodes"' in status_of(data)["message"]
    assert server.resources.stats() == (0, 0, 0)

    # a well-formed write: malformed samples are refused one by one (counted by reason), the rest stored
    now = time.time()
    samples = [
        ("queue_depth", "pods", "shop", "web-1", (("queue", "q"),), now - 1, 5.0),
        ("9lives", "pods", "shop", "web-1", (), now - 1, 1.0),
        ("queue_depth", "pods", "Shop", "web-1", (), now - 1, 1.0),
        ("queue_depth", "pods", "shop", "web-1", (("-x", "1"),), now - 1, 1.0),
        ("queue_depth", "pods", "shop", "web-1", (("a", "1"), ("a", "2")), now - 1, 1.0),
        ("queue_depth", "pods", "shop", "web-2", (), now - 1, float("nan")),
        ("queue_depth", "pods", "shop", "web-1", (("queue", "q"),), now - 1, 6.0),  # not newer
        ("jobs_waiting", "", "jobs", "", (), now - 1, 7.0),  # not about node-1 or its pods
        ("queue_depth", "nodes", "", "node-1", (), now - 1, 3.0),
    ]
    refused = value("kcms_push_node_samples_total", result="refused")
    reasons = [
        "invalid_metric_name",
        "invalid_object",
        "invalid_label_name",
        "non_finite_value",
        "object_not_bound",
    ]
    before = {r: value("kcms_push_node_refused_total", item="sample", reason=r) for r in reasons}
    code, data, headers = await post(
        server,
        ca_file,
        gzip.compress(encode(Write(nodes=[], samples=samples))),
        headers={"Content-Encoding": "gzip"},
    )
    assert code == 200, data
    assert headers["Content-Type"] == CONTENT_TYPE and headers[EPOCH_HEADER] == server.api.epoch
    assert decode(data, WriteAck) == WriteAck(nodes=0, samples=2, refused=6)
    assert value("kcms_push_node_samples_total", result="refused") == refused + 6
    got = {r: value("kcms_push_node_refused_total", item="sample", reason=r) - before[r] for r in reasons}
    assert got == {r: 2 if r == "invalid_label_name" else 1 for r in reasons}
    [r] = server.series.query("pods", "shop", ["web-1"], "queue_depth", now=now)
    assert r.value == 5.0
    [r] = server.series.query("nodes", "", ["node-1"], "queue_depth", now=now)
    assert r.value == 3.0
    assert server.series.query("", "jobs", None, "jobs_waiting", now=now) == []

    # the same in the compact block form (what store writers send): stored too, a row whose index
    # points outside the tables refused alone
    block = block_of([("queue_depth", "pods", "shop", "web-3", (), now - 1, 8.0)])
    block.rows.append((0, 1, 2, 99, 0, now - 1, 9.0))
    code, data, _ = await post(server, ca_file, encode(Write(block=block)))
    assert code == 200 and decode(data, WriteAck) == WriteAck(nodes=0, samples=1, refused=1)
    [r] = server.series.query("pods", "shop", ["web-3"], "queue_depth", now=now)
    assert r.value == 8.0

    # a standby answers 503 and stores nothing
    server.active = False
    code, data, _ = await post(server, ca_file, good)
    doc = status_of(data)
    assert (
        code == 503
        and doc["reason"] == "ServiceUnavailable"
        and doc["message"] == "standby: not the active server"
    )
    assert server.resources.stats() == (0, 0, 0)
    status, body = await get_status(server, ca_file)
    assert body == {"active": False, "nodes": {"fresh": 0, "stale": []}, "nodeStaleAfterSeconds": 60.0}


# ---- the agent command line --------------------------------------------------------------------------


def project_token(directory: Path, token: str, generation: int) -> None:
    """Write ``token`` the way the kubelet updates a projected volume: a new timestamped directory,
    then an atomic swap of the ``..data`` symlink (``token`` is a symlink to ``..data/token``)."""
    directory.mkdir(exist_ok=True)
    data = directory / f"..2026_11_23_{generation:02d}"
    data.mkdir()
    (data / "token").write_text(token)
    tmp = directory / "..data_tmp"
    tmp.symlink_to(data.name)
    tmp.replace(directory / "..data")
    if not (directory / "token").is_symlink():
        (directory / "token").symlink_to("..data/token")


def run_agent(*args: str) -> tuple[int, str]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kcms.cmd.agent",
            "--node-name=node-a",
            "--no-cgroups",
            "--no-apps",
            "--insecure-serving",  # its own /metrics is not what these tests are about
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, result.stderr


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--push", "ftp://example"], "--push"),
        (["--push", ","], "--push"),
        (["--push", "https://a:99999"], "--push"),
        (["--push", "https://a", "--no-kubelet"], "--push"),
        (["--push", "https://a", "--push-interval", "0s"], "--push-interval"),
        (["--push", "https://a", "--push-timeout", "soon"], "--push-timeout"),
        (["--push", "https://a", "--push-interval", "1s", "--push-timeout", "2s"], "--push-timeout"),
        (["--push", "https://a", "--push-token-file", "/nonexistent/token"], "--push-token-file"),
        (["--push", "https://a", "--push-ca-file", "/nonexistent/ca.pem"], "--push-ca-file"),
    ],
)
def test_bad_push_flags_stop_start_up_naming_the_flag(args: list[str], flag: str) -> None:
    code, stderr = run_agent(*args)
    assert code == 2, stderr
    assert flag in stderr


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--node-push-max-series-per-node", "0"], "--node-push-max-series-per-node"),
        (["--node-push-max-series", "-1"], "--node-push-max-series"),
        (["--node-push-max-series-per-metric", "lots"], "--node-push-max-series-per-metric"),
    ],
)
def test_bad_node_push_limits_stop_the_server_naming_the_flag(args: list[str], flag: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kcms", "server", "--active-standby", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2, result.stderr
    assert f"argument {flag}:" in result.stderr


def test_a_ca_file_that_is_not_a_certificate_stops_start_up(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    code, stderr = run_agent("--push", "https://a", f"--push-ca-file={bad}", "--kubelet-port=1")
    assert code == 2 and "--push-ca-file" in stderr


async def test_agent_process_pushes_its_kubelet_readings_to_the_active_server(
    make_server, pki, ca, fake_kube, tmp_path: Path
) -> None:
    ca_file = pki[0]
    sim = SimulatedCluster(
        nodes=1, pods_per_node=2, containers_per_pod=1, seed=5, ca=ca, one_port_per_node=True
    )
    await sim.start()
    sim_node = sim.nodes[0]
    cluster = StaticInventory(sim.inventory_objects())
    standby = await make_server(active=False, inventory=cluster)
    active = await make_server(active=True, inventory=cluster)
    # the agent pod's bound token names its node
    extra = {NODE_NAME_EXTRA: [sim_node.name]}
    fake_kube.tokens["sim-agent-token"] = {"username": AGENT_USER, "uid": "3", "extra": extra}
    # laid out as the kubelet projects a token: token -> ..data/token, ..data -> a timestamped dir
    projected = tmp_path / "push-token"
    project_token(projected, "sim-agent-token", 1)
    token_file = projected / "token"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listen_port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kcms.cmd.agent",
        f"--node-name={sim_node.name}",
        f"--kubeconfig={fake_kube.kubeconfig}",
        "--no-cgroups",
        "--no-apps",
        "--no-otlp",
        "--insecure-serving",
        f"--listen=127.0.0.1:{listen_port}",
        "--interval=200ms",
        f"--kubelet-address={sim_node.address}",
        f"--kubelet-port={sim_node.port}",
        f"--kubelet-certificate-authority={ca_file}",
        f"--push={standby.url},{active.url}",
        "--push-interval=300ms",
        "--push-timeout=250ms",
        f"--push-token-file={token_file}",
        f"--push-ca-file={ca_file}",
        cwd=REPO,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 45
        pods = [(p.namespace, p.name) for p in sim_node.pods]
        while True:
            assert proc.returncode is None, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
            assert loop.time() < deadline, "the node's usage never appeared on the active server"
            usage = active.resources.node_usage(sim_node.name)
            pod_usages = [active.resources.pod_usage(ns, name) for ns, name in pods]
            custom = active.series.query(
                "nodes", "", [sim_node.name], "kubelet_node_memory_working_set_bytes"
            )
            if usage is not None and all(pod_usages) and custom:
                break
            await asyncio.sleep(0.2)
        assert usage.cpu_nanocores / 1e9 == pytest.approx(sim.true_node_rate(sim_node.name), rel=0.02)
        for (ns, name), pu in zip(pods, pod_usages, strict=True):
            assert pu is not None
            got = sum(c.cpu_nanocores for _, c in pu.containers) / 1e9
            assert got == pytest.approx(sim.true_pod_rate(ns, name), rel=0.02)
        assert standby.resources.stats() == (0, 0, 0)
        status, body = await get_status(active, ca_file)
        assert body["nodes"] == {"fresh": 1, "stale": []}

        # the kubelet rotates the token: the agent pushes with the new one from its next push on
        fake_kube.tokens["sim-agent-token-2"] = {"username": AGENT_USER, "uid": "3", "extra": extra}
        project_token(projected, "sim-agent-token-2", 2)
        del fake_kube.tokens["sim-agent-token"]
        reviewed = len(fake_kube.token_reviews)
        while not any(r["spec"]["token"] == "sim-agent-token-2" for r in fake_kube.token_reviews[reviewed:]):
            assert loop.time() < deadline + 30, "the agent never pushed with the rotated token"
            await asyncio.sleep(0.1)
        stored = value("kcms_push_nodes_stored_total")
        while value("kcms_push_nodes_stored_total") == stored:
            assert loop.time() < deadline + 30, "no push was accepted after the rotation"
            await asyncio.sleep(0.1)
    finally:
        try:
            assert await stop_process(proc) == 0
        finally:
            await sim.stop()
