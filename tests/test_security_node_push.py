"""Node push under hostile agents (kcms/apis/nodepush.py, kcms/apis/nodebinding.py): a real aggregated
API server over TLS, delegated authentication (TokenReview with the bound-token claims, client
certificates from the test CA) and authorization (SubjectAccessReview) through the fake Kubernetes
API, and a real list+watch inventory of it.

Every attack checks that it is refused with the right code or counted reason, that the other node's
data served through metrics.k8s.io is unchanged, that the server stays ready, and that the log holds
no traceback."""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import trustme
from prometheus_client import REGISTRY

from kcms.apis.metrics.api import MetricsAPI
from kcms.apis.nodebinding import NODE_NAME_EXTRA, POD_NAME_EXTRA
from kcms.apis.nodepush import NODES_PATH, NodePushAPI
from kcms.apis.quota import SeriesQuota
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions
from kcms.kube.client import KubeClient
from kcms.kube.inventory import KubeInventory
from kcms.kube.reviews import AccessReviewer, TokenReviewer
from kcms.store.resource import ResourceStore
from kcms.store.series import SeriesStore
from kcms.store.wire import CONTENT_TYPE, WireNode, WirePod, Write, WriteAck, decode, encode

AGENT_SA = "system:serviceaccount:kube-system:kcms-agent"
OTHER_SA = "system:serviceaccount:shop:web"  # allowed to push by RBAC, but bound to no node
GIB = 1 << 30
METRICS = "/apis/metrics.k8s.io/v1beta1"
START = time.time() - 100_000  # when the nodes and containers started

# The cluster: node-a runs shop/web-a and the agent pod agent-a; node-b runs shop/web-b and agent-b;
# node-c runs ops/tool-c.
PODS = [
    ("shop", "web-a", "node-a"),
    ("kube-system", "agent-a", "node-a"),
    ("shop", "web-b", "node-b"),
    ("kube-system", "agent-b", "node-b"),
    ("ops", "tool-c", "node-c"),
]
TOKENS = {
    # bound ServiceAccount tokens of the agent pods: the node claim (Kubernetes >= 1.30) and pod claim
    "node-a-token": {NODE_NAME_EXTRA: ["node-a"], POD_NAME_EXTRA: ["agent-a"]},
    "node-b-token": {NODE_NAME_EXTRA: ["node-b"], POD_NAME_EXTRA: ["agent-b"]},
    "node-c-token": {NODE_NAME_EXTRA: ["node-c"]},
    "pod-b-token": {POD_NAME_EXTRA: ["agent-b"]},  # an older cluster: the pod claim only
    "ghost-token": {NODE_NAME_EXTRA: ["node-z"]},  # a node the inventory does not list
    "two-nodes-token": {NODE_NAME_EXTRA: ["node-a", "node-b"]},
    "disagree-token": {NODE_NAME_EXTRA: ["node-a"], POD_NAME_EXTRA: ["agent-b"]},
    "gone-pod-token": {POD_NAME_EXTRA: ["agent-x"]},
    "newline-token": {NODE_NAME_EXTRA: ["node-a\nFAKE LOG LINE"]},
}


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def refused(item: str, reason: str) -> float:
    return value("kcms_push_node_refused_total", item=item, reason=reason)


def authorize(spec: dict) -> tuple[bool, str]:
    """RBAC as deploy/ha/push grants it: the agents' ServiceAccount may POST node pushes; so, here, may
    one more ServiceAccount, kubelets (group system:nodes) and any system:node: user, so that what
    the binding refuses is not already refused by RBAC. The reader reads metrics."""
    attrs = spec.get("nonResourceAttributes")
    if attrs is not None and (attrs["path"], attrs["verb"]) == (NODES_PATH, "post"):
        user = spec.get("user", "")
        ok = (
            user in (AGENT_SA, OTHER_SA)
            or user.startswith("system:node:")
            or "system:nodes" in spec.get("groups", [])
        )
        return ok, "kcms-node-pusher"
    if spec.get("user") == "reader" and spec.get("resourceAttributes", {}).get("group") == "metrics.k8s.io":
        return True, "reader"
    return False, ""


def reading(node: str, t: float, k: int, pods: list[tuple[str, str]], *, cpu_cores: float = 1.0) -> WireNode:
    """A kubelet scrape at time ``t``: ``k`` seconds of CPU at ``cpu_cores`` cores since start."""
    cpu = int(k * cpu_cores * 1e9)
    start = START
    return WireNode(
        node,
        (start, t, cpu, 4 * GIB),
        [WirePod(ns, name, [("app", (start, t, cpu // 4, GIB // 4))]) for ns, name in pods],
    )


@dataclass
class Cluster:
    fake: Any
    server: AggregatedAPIServer
    api: NodePushAPI
    resources: ResourceStore
    series: SeriesStore
    ca: trustme.CA
    tmp: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    def ctx(self, cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        self.ca.configure_trust(ctx)
        if cert is not None:
            cert.configure_cert(ctx)
        return ctx

    async def push(
        self, write: Write | bytes, *, token: str | None = None, cert: trustme.LeafCert | None = None
    ) -> tuple[int, Any]:
        headers = {"Content-Type": CONTENT_TYPE}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        body = write if isinstance(write, bytes) else encode(write)
        async with aiohttp.ClientSession() as s:
            async with s.post(self.url + NODES_PATH, data=body, headers=headers, ssl=self.ctx(cert)) as r:
                data = await r.read()
                if r.status == 200:
                    return 200, decode(data, WriteAck)
                return r.status, orjson.loads(data)

    async def get(self, path: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s:
            headers = {"Authorization": "Bearer reader"}
            async with s.get(self.url + path, headers=headers, ssl=self.ctx()) as r:
                return r.status, orjson.loads(await r.read())

    async def ready(self) -> bool:
        async with aiohttp.ClientSession() as s:
            async with s.get(self.url + "/readyz", ssl=self.ctx()) as r:
                return r.status == 200

    async def served(self) -> dict[str, Any]:
        """What metrics.k8s.io serves about node-b and its pod (the victim)."""
        out = {}
        for path in (f"{METRICS}/nodes/node-b", f"{METRICS}/namespaces/shop/pods/web-b"):
            status, body = await self.get(path)
            out[path] = (status, body.get("usage") or body.get("containers"), body.get("timestamp"))
        return out


@pytest.fixture
async def make_cluster(fake_kube, ca, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """``await make_cluster(quota=..., allow_namespaced=...)``: a push server over the fake API."""
    fake_kube.authorize = authorize
    for node in ("node-a", "node-b", "node-c"):
        fake_kube.upsert({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    for ns, name, node in PODS:
        fake_kube.upsert(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"namespace": ns, "name": name},
                "spec": {"nodeName": node},
                "status": {"phase": "Running"},
            }
        )
    for token, extra in TOKENS.items():
        fake_kube.tokens[token] = {"username": AGENT_SA, "uid": token, "extra": extra}
    fake_kube.tokens["other-sa-token"] = {"username": OTHER_SA, "uid": "o"}
    fake_kube.tokens["node-user-token"] = {"username": "system:node:node-a", "uid": "n"}  # no group
    fake_kube.tokens["reader"] = {"username": "reader", "uid": "r"}
    serving = ca.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.pem"
    serving.cert_chain_pems[0].write_to_path(str(cert_file))
    serving.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    kube = await KubeClient.load(str(fake_kube.kubeconfig))
    inventory = KubeInventory(kube)
    await inventory.start()
    started: list[AggregatedAPIServer] = []

    async def make(
        *, quota: SeriesQuota | None = None, allow_namespaced: bool = False, synced: bool = True
    ) -> Cluster:
        inv = inventory if synced else KubeInventory(kube)  # never started: never listed
        resources = ResourceStore(resolution=1.0, max_age=300.0)
        series = SeriesStore()
        server = AggregatedAPIServer(
            ServingOptions(
                secure_port=0,
                bind_address="127.0.0.1",
                tls_cert_file=str(cert_file),
                tls_private_key_file=str(key_file),
            ),
            AuthnOptions(client_ca_file=str(ca_file), skip_lookup=True, token_reviewer=TokenReviewer(kube)),
            AuthzOptions(access_reviewer=AccessReviewer(kube)),
        )
        api = NodePushAPI(resources, series, inventory=inv, quota=quota, allow_namespaced=allow_namespaced)
        api.attach(server.app)
        server.install(MetricsAPI(inv, resources).group_version())
        server.add_check(
            "informer-sync",
            lambda: (True, "ok") if inv.has_synced() else (False, "not listed"),
            livez=False,
            readyz=True,
        )
        await server.start()
        started.append(server)
        return Cluster(fake_kube, server, api, resources, series, ca, tmp_path)

    try:
        yield make
    finally:
        for server in started:
            await server.stop()
        await inventory.stop()
        await kube.close()


async def victim_reports(c: Cluster) -> dict[str, Any]:
    """node-b's own agent reports twice (a rate needs two readings); what is served about it."""
    now = time.time()
    for k, t in ((1, now - 20), (11, now - 10)):
        status, ack = await c.push(
            Write(nodes=[reading("node-b", t, k, [("shop", "web-b")])]), token="node-b-token"
        )
        assert status == 200 and ack.nodes == 1 and ack.refused == 0
    served = await c.served()
    for status, usage, _ in served.values():
        assert status == 200 and usage, served
    return served


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info]


# ---- a node's agent cannot report another node ----------------------------------------------------


async def test_a_nodes_agent_cannot_report_another_node_or_its_pods(make_cluster, caplog) -> None:
    caplog.set_level(logging.INFO)
    c = await make_cluster()
    before = await victim_reports(c)
    now = time.time()
    counts = {
        ("node", "other_node"): refused("node", "other_node"),
        ("pod", "pod_not_on_node"): refused("pod", "pod_not_on_node"),
        ("sample", "other_node"): refused("sample", "other_node"),
        ("sample", "pod_not_on_node"): refused("sample", "pod_not_on_node"),
    }
    attack = Write(
        nodes=[
            # node-a's own reading, smuggling node-b's pod into it
            reading("node-a", now - 5, 3, [("shop", "web-a"), ("shop", "web-b")]),
            # node-b's reading, forged: 1000 cores, twice, to give a rate
            reading("node-b", now - 4, 100_000, [("shop", "web-b")], cpu_cores=1000),
            reading("node-b", now - 3, 200_000, [("shop", "web-b")], cpu_cores=1000),
        ],
        samples=[
            ("queue_depth", "pods", "shop", "web-a", (), now - 1, 1.0),
            ("queue_depth", "pods", "shop", "web-b", (), now - 1, 666.0),
            ("load", "nodes", "", "node-b", (), now - 1, 666.0),
            ("load", "nodes", "", "node-a", (), now - 1, 2.0),
        ],
    )
    status, ack = await c.push(attack, token="node-a-token")
    assert status == 200
    assert ack == WriteAck(nodes=1, samples=2, refused=5)
    assert refused("node", "other_node") == counts["node", "other_node"] + 2
    assert refused("pod", "pod_not_on_node") == counts["pod", "pod_not_on_node"] + 1
    assert refused("sample", "other_node") == counts["sample", "other_node"] + 1
    assert refused("sample", "pod_not_on_node") == counts["sample", "pod_not_on_node"] + 1

    # node-b and its pod are served exactly as node-b reported them
    assert await c.served() == before
    assert c.resources.node_usage("node-b").cpu_nanocores == pytest.approx(1e9, rel=0.01)
    assert c.series.query("pods", "shop", ["web-b"], "queue_depth", now=now) == []
    assert c.series.query("nodes", "", ["node-b"], "load", now=now) == []
    # node-a's own data is stored: its node, its pod (without the smuggled one), its samples
    [(_, last)] = [pair for pair in c.resources.export_nodes() if pair[1].node == "node-a"]
    assert last.node_point is not None and list(last.pods) == [("shop", "web-a")]
    [r] = c.series.query("pods", "shop", ["web-a"], "queue_depth", now=now)
    assert r.value == 1.0
    [r] = c.series.query("nodes", "", ["node-a"], "load", now=now)
    assert r.value == 2.0
    assert c.api.fresh_nodes() == ["node-a", "node-b"]
    assert await c.ready()
    # one warning naming the caller and the node, no request text in it
    [line] = [r.getMessage() for r in caplog.records if "node push of" in r.getMessage()]
    assert "node-a" in line and "2 node other_node" in line and "1 pod pod_not_on_node" in line
    no_traceback(caplog)


async def test_unknown_nodes_and_pods_are_refused(make_cluster, caplog) -> None:
    caplog.set_level(logging.INFO)
    c = await make_cluster()
    before = await victim_reports(c)
    now = time.time()
    # a credential for a node the inventory does not list: everything refused, nothing stored
    unknown = refused("node", "unknown_node"), refused("sample", "unknown_node")
    ghost = Write(
        nodes=[reading("node-z", now - 1, 1, [])],
        samples=[
            ("load", "nodes", "", "node-z", (), now - 1, 1.0),
            ("x", "pods", "shop", "web-a", (), now, 1.0),
        ],
    )
    status, ack = await c.push(ghost, token="ghost-token")
    assert status == 200 and ack == WriteAck(nodes=0, samples=0, refused=3)
    assert refused("node", "unknown_node") == unknown[0] + 1
    assert refused("sample", "unknown_node") == unknown[1] + 2
    assert c.resources.node_usage("node-z") is None and "node-z" not in c.api.fresh_nodes()
    # from node-a: a pod no inventory lists, a node name nobody has, an empty node name
    counts = refused("pod", "unknown_pod"), refused("sample", "unknown_pod"), refused("node", "other_node")
    write = Write(
        nodes=[
            reading("node-a", now - 1, 1, [("shop", "web-a"), ("shop", "made-up")]),
            reading("", now, 1, []),
        ],
        samples=[("x", "pods", "shop", "made-up", (), now - 1, 1.0)],
    )
    status, ack = await c.push(write, token="node-a-token")
    assert status == 200 and ack == WriteAck(nodes=1, samples=0, refused=3)
    assert refused("pod", "unknown_pod") == counts[0] + 1
    assert refused("sample", "unknown_pod") == counts[1] + 1
    assert refused("node", "other_node") == counts[2] + 1
    assert c.resources.pod_usage("shop", "made-up") is None
    assert await c.served() == before and await c.ready()
    no_traceback(caplog)


# ---- each node identity is accepted, for its own node only -----------------------------------------


@pytest.mark.parametrize("identity", ["node_claim", "pod_claim", "node_certificate"])
async def test_each_node_identity_reports_its_own_node_only(make_cluster, caplog, identity: str) -> None:
    caplog.set_level(logging.INFO)
    c = await make_cluster()
    now = time.time()
    # every identity here is node-b's; the victim is node-a
    creds: dict[str, Any] = {
        "node_claim": {"token": "node-b-token"},
        "pod_claim": {"token": "pod-b-token"},  # agent-b runs on node-b: the inventory says so
        "node_certificate": {
            "cert": c.ca.issue_cert(
                "kubelet-b", common_name="system:node:node-b", organization_name="system:nodes"
            )
        },
    }[identity]
    victim = Write(nodes=[reading("node-a", now - 20, 1, [("shop", "web-a")])])
    assert (await c.push(victim, token="node-a-token"))[1].nodes == 1
    victim = Write(nodes=[reading("node-a", now - 10, 11, [("shop", "web-a")])])
    assert (await c.push(victim, token="node-a-token"))[1].nodes == 1
    node_a = c.resources.node_usage("node-a")
    pod_a = c.resources.pod_usage("shop", "web-a")

    own = Write(
        nodes=[reading("node-b", now - 2, 5, [("shop", "web-b")])],
        samples=[("load", "nodes", "", "node-b", (), now - 1, 3.0)],
    )
    status, ack = await c.push(own, **creds)
    assert status == 200 and ack == WriteAck(nodes=1, samples=1, refused=0), ack
    assert "node-b" in c.api.fresh_nodes()
    other = Write(
        nodes=[reading("node-a", now - 1, 9999, [("shop", "web-a")], cpu_cores=500)],
        samples=[("load", "nodes", "", "node-a", (), now - 1, 3.0)],
    )
    status, ack = await c.push(other, **creds)
    assert status == 200 and ack == WriteAck(nodes=0, samples=0, refused=2)
    assert c.resources.node_usage("node-a") == node_a
    assert c.resources.pod_usage("shop", "web-a") == pod_a
    assert await c.ready()
    no_traceback(caplog)


# ---- no node identity: 403 ------------------------------------------------------------------------


async def test_a_caller_without_a_node_identity_is_forbidden(make_cluster, caplog) -> None:
    caplog.set_level(logging.INFO)
    c = await make_cluster()
    before = await victim_reports(c)
    now = time.time()
    forged = Write(nodes=[reading("node-b", now - 1, 10**6, [("shop", "web-b")], cpu_cores=900)])
    forbidden = value("kcms_push_node_requests_total", outcome="forbidden")
    cases: list[dict[str, Any]] = [
        {"token": "other-sa-token"},  # a ServiceAccount RBAC lets push, with no claim at all
        {"token": "node-user-token"},  # system:node:node-a without the group system:nodes
        {"token": "two-nodes-token"},  # a node claim with two values
        {"token": "disagree-token"},  # a node claim and a pod claim on different nodes
        {"token": "gone-pod-token"},  # a pod claim the inventory does not know
        {"token": "newline-token"},  # a node claim that is not a node name
        {"cert": c.ca.issue_cert("kubelet-x", common_name="system:node:node-b", organization_name="ops")},
        {"cert": c.ca.issue_cert("bob", common_name="bob", organization_name="system:nodes")},
    ]
    for creds in cases:
        status, body = await c.push(forged, **creds)
        assert status == 403, (creds, body)
        assert body["kind"] == "Status" and body["reason"] == "Forbidden", body
        assert "cannot push node readings" in body["message"]
        assert "FAKE LOG LINE" not in body["message"]
    assert value("kcms_push_node_requests_total", outcome="forbidden") == forbidden + len(cases)
    # no credential at all: the middleware's 401
    status, body = await c.push(forged)
    assert status == 401 and body["reason"] == "Unauthorized"
    assert await c.served() == before and c.api.fresh_nodes() == ["node-b"]
    assert await c.ready()
    # one escaped line per refusal: the claim's newline never reaches the log
    assert not [r for r in caplog.records if "FAKE LOG LINE" in r.getMessage()]
    no_traceback(caplog)


async def test_a_push_before_the_inventory_is_listed_is_answered_503(make_cluster, caplog) -> None:
    caplog.set_level(logging.INFO)
    c = await make_cluster(synced=False)
    assert c.api.stale_nodes() == []  # nothing is marked stale for want of a list either
    before = value("kcms_push_node_requests_total", outcome="not_synced")
    status, body = await c.push(
        Write(nodes=[reading("node-a", time.time() - 1, 1, [])]), token="node-a-token"
    )
    assert status == 503 and body["reason"] == "ServiceUnavailable" and "not listed yet" in body["message"]
    assert value("kcms_push_node_requests_total", outcome="not_synced") == before + 1
    assert c.resources.stats() == (0, 0, 0)
    assert not await c.ready()  # and the server says so
    no_traceback(caplog)


# ---- bounds: cardinality per node, future timestamps, sizes ----------------------------------------


async def test_new_series_are_limited_per_node_and_in_total(make_cluster, caplog) -> None:
    caplog.set_level(logging.INFO)
    quota = SeriesQuota(max_total=120, max_per_writer=50, max_per_metric=None, ttl=600)
    c = await make_cluster(quota=quota)
    now = time.time()

    def labelled(node: str, n: int, t: float) -> Write:
        return Write(
            samples=[("requests", "nodes", "", node, (("path", f"/p{i}"),), t, 1.0) for i in range(n)]
        )

    limit = refused("sample", "series_limit_writer")
    status, ack = await c.push(labelled("node-a", 80, now - 5), token="node-a-token")
    assert status == 200 and ack == WriteAck(nodes=0, samples=50, refused=30)
    assert refused("sample", "series_limit_writer") == limit + 30
    # node-a exhausting its own quota leaves node-b's untouched
    status, ack = await c.push(labelled("node-b", 50, now - 5), token="node-b-token")
    assert status == 200 and ack == WriteAck(nodes=0, samples=50, refused=0)
    # known series keep accepting points; only new ones are refused
    status, ack = await c.push(labelled("node-a", 80, now - 4), token="node-a-token")
    assert ack == WriteAck(nodes=0, samples=50, refused=30)
    # the total: 100 of 120 used, node-c may add 20 more, then nobody
    total = refused("sample", "series_limit_total")
    c_write = Write(
        samples=[("requests", "pods", "ops", "tool-c", (("n", str(i)),), now - 5, 1.0) for i in range(30)]
    )
    status, ack = await c.push(c_write, token="node-a-token")
    assert ack == WriteAck(nodes=0, samples=0, refused=30)  # not node-a's pod: refused before any quota
    status, ack = await c.push(c_write, token="node-c-token")
    assert status == 200 and ack == WriteAck(nodes=0, samples=20, refused=10)
    assert refused("sample", "series_limit_total") == total + 10
    # memory stays bounded: the store and the quota hold no more than the limits
    assert quota.count() == 120 and quota.count(writer="system:node:node-a") == 50
    assert c.series.stats()["series"] == 120
    assert await c.ready()
    no_traceback(caplog)


async def test_future_timestamps_and_oversized_items_are_refused_alone(make_cluster, caplog) -> None:
    caplog.set_level(logging.INFO)
    c = await make_cluster()
    now = time.time()
    future = now + 3600
    counts = {
        k: refused(*k)
        for k in [
            ("node", "future_timestamp"),
            ("container", "future_timestamp"),
            ("sample", "future_timestamp"),
            ("sample", "metric_name_too_long"),
            ("sample", "label_value_too_long"),
            ("sample", "too_many_labels"),
            ("pod", "too_many_containers"),
            ("container", "invalid_container_name"),
            ("container", "negative"),
            ("sample", "unsupported"),
        ]
    }
    start = now - 10_000
    write = Write(
        nodes=[
            WireNode(
                "node-a",
                (start, future, 10**9, GIB),  # the node's reading from an hour ahead
                [
                    WirePod(
                        "shop",
                        "web-a",
                        [("app", (start, now - 1, 10**9, GIB)), ("late", (start, future, 1, 1))],
                    ),
                    WirePod(
                        "kube-system", "agent-a", [(f"c{i}", (start, now - 1, 1, 1)) for i in range(300)]
                    ),
                ],
            ),
        ],
        samples=[
            ("ok", "nodes", "", "node-a", (), now - 1, 1.0),
            ("ahead", "nodes", "", "node-a", (), future, 1.0),
            ("m" * 254, "nodes", "", "node-a", (), now - 1, 1.0),
            ("big", "nodes", "", "node-a", (("l", "v" * 5000),), now - 1, 1.0),
            ("wide", "nodes", "", "node-a", tuple((f"l{i}", "v") for i in range(40)), now - 1, 1.0),
        ],
        series=[("ok", "nodes", "", "node-a", (), b"\x00" * 16)],
    )
    status, ack = await c.push(write, token="node-a-token")
    assert status == 200 and ack == WriteAck(nodes=1, samples=1, refused=8), ack
    expected = {
        ("node", "future_timestamp"): 1,
        ("container", "future_timestamp"): 1,
        ("sample", "future_timestamp"): 1,
        ("sample", "metric_name_too_long"): 1,
        ("sample", "label_value_too_long"): 1,
        ("sample", "too_many_labels"): 1,
        ("pod", "too_many_containers"): 1,
        ("sample", "unsupported"): 1,
    }
    assert {k: refused(*k) - v for k, v in counts.items() if k in expected} == expected
    # the node's stored readings hold no future point: the node point was dropped, web-a with it
    # (a pod's usage is never partial), agent-a for its 300 containers
    assert c.resources.node_usage("node-a") is None
    assert c.resources.pod_usage("shop", "web-a") is None
    assert c.series.query("nodes", "", ["node-a"], "ahead", now=future) == []
    [r] = c.series.query("nodes", "", ["node-a"], "ok", now=now)
    assert r.value == 1.0

    # bad container names and readings
    write = Write(
        nodes=[
            WireNode(
                "node-a",
                (start, now - 1, 10**9, GIB),
                [
                    WirePod("shop", "web-a", [("Bad Name\n", (start, now - 1, 1, 1))]),
                    WirePod("kube-system", "agent-a", [("app", (start, now - 1, -5, 1))]),
                ],
            )
        ]
    )
    before = refused("container", "invalid_container_name"), refused("container", "negative")
    status, ack = await c.push(write, token="node-a-token")
    assert status == 200 and ack == WriteAck(nodes=1, samples=0, refused=2)
    assert (refused("container", "invalid_container_name"), refused("container", "negative")) == (
        before[0] + 1,
        before[1] + 1,
    )
    assert c.resources.stats()[1] == 0  # no pod stored
    assert await c.ready()
    no_traceback(caplog)


async def test_namespaced_objects_need_the_flag_and_a_pod_in_the_namespace(make_cluster, caplog) -> None:
    caplog.set_level(logging.INFO)
    now = time.time()
    samples = [
        ("replicas_busy", "deployments.apps", "shop", "web", (), now - 1, 2.0),  # node-a runs shop/web-a
        ("queue", "", "shop", "", (), now - 1, 3.0),  # an external metric of namespace shop
        ("replicas_busy", "deployments.apps", "ops", "tool", (), now - 1, 9.0),  # node-a runs nothing in ops
        ("size", "persistentvolumes", "", "pv-1", (), now - 1, 9.0),  # cluster-scoped, not a node
    ]
    strict = await make_cluster()
    counts = refused("sample", "object_not_bound"), refused("sample", "namespace_not_on_node")
    status, ack = await strict.push(Write(samples=samples), token="node-a-token")
    assert status == 200 and ack == WriteAck(nodes=0, samples=0, refused=4)
    assert refused("sample", "object_not_bound") == counts[0] + 4

    lenient = await make_cluster(allow_namespaced=True)
    counts = refused("sample", "object_not_bound"), refused("sample", "namespace_not_on_node")
    status, ack = await lenient.push(Write(samples=samples), token="node-a-token")
    assert status == 200 and ack == WriteAck(nodes=0, samples=2, refused=2)
    assert refused("sample", "namespace_not_on_node") == counts[1] + 1
    assert refused("sample", "object_not_bound") == counts[0] + 1
    [r] = lenient.series.query("deployments.apps", "shop", ["web"], "replicas_busy", now=now)
    assert r.value == 2.0
    assert lenient.series.query("deployments.apps", "ops", ["tool"], "replicas_busy", now=now) == []
    assert await strict.ready() and await lenient.ready()
    no_traceback(caplog)


# ---- the push overlay: the agents push with a projected, bound token --------------------------------


def test_the_push_overlay_gives_the_agents_a_bound_rotating_token_and_nothing_more() -> None:
    from _deploy_helpers import (
        DEPLOY,
        allowed,
        expanded_args,
        flag,
        kcms_containers,
        mount_source,
        only,
        render,
    )

    objects = render(DEPLOY / "overlays" / "push")
    agent = only(objects, "DaemonSet", "kcms-agent")
    [container] = kcms_containers(agent)
    token_file = flag(expanded_args(agent, container, objects), "--push-token-file") or ""
    volume, inner = mount_source(agent, container, token_file)
    [source] = volume["projected"]["sources"]
    projection = source["serviceAccountToken"]
    # a pod-bound token (it names the pod, and on Kubernetes >= 1.30 the node), rotated by the
    # kubelet, for the API server's audience, which is what the server's TokenReview checks
    assert projection["path"] == inner
    assert 600 <= projection["expirationSeconds"] <= 3600
    assert "audience" not in projection
    # RBAC lets the agents post node pushes only; what they may report is the binding's business
    account = agent["spec"]["template"]["spec"]["serviceAccountName"]
    assert allowed(objects, ("kube-system", account), verb="post", path=NODES_PATH)
    assert not allowed(objects, ("kube-system", account), verb="post", path="/push/v1/samples")
