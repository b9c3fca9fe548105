"""kcms.kube against the fake API server over real HTTPS, plus the fake's protocol itself."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import ssl
import tracemalloc

import aiohttp
import orjson
import pytest
from fakeapi import FakeKubeAPI, make_node, make_pod

from kcms.kube import (
    AccessReviewer,
    Informer,
    KubeAPIError,
    KubeClient,
    KubeConfigError,
    KubeInventory,
    ReviewError,
    StaticInventory,
    TokenReviewer,
    node_from_json,
    pod_from_json,
    read_extension_apiserver_authentication,
)
from kcms.model import RequestAttributes, UserInfo


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


async def eventually(cond, limit: float = 20.0) -> None:
    """Wait until cond() is true (a generous deadline, not a timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@pytest.fixture
async def client(fake_kube):
    c = await KubeClient.load(str(fake_kube.kubeconfig))
    yield c
    await c.close()


@pytest.fixture
async def raw(ca, fake_kube):
    """A plain aiohttp session with the admin token, to test the fake's protocol directly."""
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    async with aiohttp.ClientSession(
        base_url=fake_kube.url,
        connector=aiohttp.TCPConnector(ssl=ctx),
        headers={"Authorization": "Bearer admin-token"},
    ) as s:
        yield s


async def _watch_events(raw, path: str, params: dict, until: int | None = None) -> list[dict]:
    events = []
    async with raw.get(path, params={"watch": "1", **params}) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.strip():
                events.append(orjson.loads(line))
                if until is not None and len(events) >= until:
                    break
    return events


# ---- the fake's protocol ------------------------------------------------------------------------
async def test_fake_rejects_missing_and_wrong_token(fake_kube, ca):
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
        for headers in ({}, {"Authorization": "Bearer nope"}):
            async with s.get(fake_kube.url + "/api/v1/nodes", headers=headers) as resp:
                body = await resp.json()
                assert resp.status == 401
                assert body["kind"] == "Status" and body["code"] == 401 and body["reason"] == "Unauthorized"


async def test_fake_list_with_selectors_and_paging(fake_kube, raw):
    fake_kube.upsert(make_node("n1", labels={"role": "worker", "zone": "a"}))
    fake_kube.upsert(make_node("n2", labels={"role": "worker", "zone": "b"}))
    fake_kube.upsert(make_node("n3", labels={"role": "infra"}))
    fake_kube.upsert(make_pod("ns1", "p1", "n1", phase="Running"))
    fake_kube.upsert(make_pod("ns1", "p2", "n2", phase="Succeeded"))
    fake_kube.upsert(make_pod("ns2", "p3", "n1", phase="Pending"))

    async def names(path: str, **params) -> list[str]:
        async with raw.get(path, params=params) as resp:
            assert resp.status == 200, await resp.text()
            body = await resp.json()
        assert body["kind"].endswith("List") and body["apiVersion"] == "v1"
        assert int(body["metadata"]["resourceVersion"]) == fake_kube.rv
        return [i["metadata"]["name"] for i in body["items"]]

    assert await names("/api/v1/nodes") == ["n1", "n2", "n3"]
    assert await names("/api/v1/nodes", labelSelector="role=worker") == ["n1", "n2"]
    assert await names("/api/v1/nodes", labelSelector="role=worker,zone!=a") == ["n2"]
    assert await names("/api/v1/nodes", labelSelector="zone in (a,b)") == ["n1", "n2"]
    assert await names("/api/v1/nodes", labelSelector="!zone") == ["n3"]
    assert await names("/api/v1/nodes", fieldSelector="metadata.name=n2") == ["n2"]
    assert await names("/api/v1/pods", fieldSelector="spec.nodeName=n1") == ["p1", "p3"]
    assert await names("/api/v1/pods", fieldSelector="status.phase!=Succeeded,status.phase!=Failed") == [
        "p1",
        "p3",
    ]
    assert await names("/api/v1/namespaces/ns1/pods") == ["p1", "p2"]
    async with raw.get("/api/v1/pods", params={"fieldSelector": "spec.bogus=x"}) as resp:
        assert resp.status == 400 and (await resp.json())["reason"] == "BadRequest"
    # paging
    async with raw.get("/api/v1/nodes", params={"limit": "2"}) as resp:
        page = await resp.json()
    assert [i["metadata"]["name"] for i in page["items"]] == ["n1", "n2"]
    assert page["metadata"]["remainingItemCount"] == 1
    async with raw.get(
        "/api/v1/nodes", params={"limit": "2", "continue": page["metadata"]["continue"]}
    ) as resp:
        page2 = await resp.json()
    assert [i["metadata"]["name"] for i in page2["items"]] == ["n3"] and "continue" not in page2["metadata"]


async def test_fake_watch_events_bookmarks_and_410(fake_kube, raw):
    fake_kube.upsert(make_node("n1", labels={"role": "worker"}))
    rv0 = fake_kube.rv
    fake_kube.upsert(make_node("n2", labels={"role": "worker"}))
    fake_kube.upsert(make_node("n2", labels={"role": "infra"}))  # leaves the selection
    fake_kube.upsert(make_node("n1", labels={"role": "worker", "x": "y"}))
    fake_kube.delete("nodes", "", "n1")
    events = await _watch_events(
        raw, "/api/v1/nodes", {"resourceVersion": str(rv0), "labelSelector": "role=worker"}, 4
    )
    got = [(e["type"], e["object"]["metadata"]["name"]) for e in events]
    assert got == [("ADDED", "n2"), ("DELETED", "n2"), ("MODIFIED", "n1"), ("DELETED", "n1")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[-1] == fake_kube.rv

    # bookmarks only to watches that allow them; a bookmark carries only the resourceVersion
    async def watch_then_bookmark():
        await eventually(lambda: fake_kube.open_watches == 0)  # the watch above is gone
        task = asyncio.create_task(
            _watch_events(
                raw, "/api/v1/nodes", {"resourceVersion": str(fake_kube.rv), "allowWatchBookmarks": "true"}, 1
            )
        )
        await eventually(lambda: fake_kube.open_watches == 1)
        fake_kube.send_bookmarks()
        return await task

    (bm,) = await watch_then_bookmark()
    assert bm["type"] == "BOOKMARK" and bm["object"]["metadata"] == {"resourceVersion": str(fake_kube.rv)}
    assert bm["object"]["kind"] == "Node"

    # server-side timeout ends the stream normally, without events
    assert (
        await _watch_events(
            raw, "/api/v1/nodes", {"resourceVersion": str(fake_kube.rv), "timeoutSeconds": "1"}
        )
        == []
    )

    # expired history -> an ERROR event with a 410 Expired Status, then the stream closes
    fake_kube.expire_history()
    events = await _watch_events(raw, "/api/v1/nodes", {"resourceVersion": str(rv0)})
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert status["kind"] == "Status" and status["code"] == 410 and status["reason"] == "Expired"


async def test_fake_leases_optimistic_concurrency(client):
    path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "kcms-collector"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    created = await client.post_json(path, lease)
    rv1 = created["metadata"]["resourceVersion"]
    assert created["metadata"]["namespace"] == "kube-system" and created["metadata"]["uid"]
    with pytest.raises(KubeAPIError) as e:
        await client.post_json(path, lease)
    assert e.value.status == 409 and e.value.reason == "AlreadyExists"
    got = await client.get_json(path + "/kcms-collector")
    got["spec"]["holderIdentity"] = "b"
    updated = await client.put_json(path + "/kcms-collector", got)
    assert updated["spec"]["holderIdentity"] == "b" and updated["metadata"]["resourceVersion"] != rv1
    stale = dict(got, metadata={**got["metadata"], "resourceVersion": rv1})
    with pytest.raises(KubeAPIError) as e:
        await client.put_json(path + "/kcms-collector", stale)
    assert e.value.status == 409 and e.value.reason == "Conflict" and e.value.body["kind"] == "Status"
    with pytest.raises(KubeAPIError) as e:
        await client.get_json(path + "/missing")
    assert e.value.status == 404 and e.value.reason == "NotFound"


# ---- the client ---------------------------------------------------------------------------------
async def test_client_load_errors_name_the_flag(tmp_path, monkeypatch):
    with pytest.raises(KubeConfigError, match="--kubeconfig"):
        await KubeClient.load(str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="--kubeconfig"):
        await KubeClient.load(None)
    bad = tmp_path / "bad"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    with pytest.raises(KubeConfigError, match="--kubeconfig"):
        await KubeClient.load(str(bad))


async def test_client_identity_and_errors(fake_kube, client):
    assert client.bearer_token() == "admin-token"
    assert client.client_cert_files() is None and client.insecure is False
    assert _read(client.ca_file()) == fake_kube.ca.cert_pem.bytes()
    fake_kube.upsert(make_node("n1"))
    assert (await client.get_json("/api/v1/nodes"))["items"][0]["metadata"]["name"] == "n1"
    fake_kube.api_tokens.clear()
    with pytest.raises(KubeAPIError) as e:
        await client.get_json("/api/v1/nodes")
    assert e.value.status == 401 and e.value.reason == "Unauthorized"


async def test_client_cert_kubeconfig_and_wrong_token(fake_kube, ca, tmp_path):
    cert = ca.issue_cert("kcms-client")
    doc = json.loads(fake_kube.kubeconfig.read_text())
    doc["users"][0]["user"] = {
        "client-certificate-data": base64.b64encode(cert.cert_chain_pems[0].bytes()).decode(),
        "client-key-data": base64.b64encode(cert.private_key_pem.bytes()).decode(),
        "token": "admin-token",
    }
    path = tmp_path / "certs.kubeconfig"
    path.write_text(json.dumps(doc))
    c = await KubeClient.load(str(path), context="fake")
    try:
        cert_file, key_file = c.client_cert_files()
        assert _read(cert_file) == cert.cert_chain_pems[0].bytes()
        assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
    finally:
        await c.close()
    c = await KubeClient.load(str(fake_kube.write_kubeconfig(tmp_path / "wrong", token="wrong")))
    try:
        with pytest.raises(KubeAPIError) as e:
            await c.get_json("/api/v1/nodes")
        assert e.value.status == 401
    finally:
        await c.close()


async def test_rotating_credentials_token_file_and_exec_plugin(fake_kube, tmp_path):
    """A 401 makes the client re-read its tokenFile / re-run its exec plugin once and retry."""
    token_file = tmp_path / "token"
    token_file.write_text("token-1")
    plugin = tmp_path / "plugin.sh"
    plugin.write_text(
        "#!/bin/sh\n"
        'printf \'{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        f'"status":{{"token":"%s"}}}}\' "$(cat {token_file})"\n'
    )
    plugin.chmod(0o755)
    doc = json.loads(fake_kube.kubeconfig.read_text())
    users = {
        "file": {"tokenFile": str(token_file)},
        "exec": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}},
    }
    for kind, user in users.items():
        token_file.write_text("token-1")
        fake_kube.api_tokens = {"token-1"}
        doc["users"][0]["user"] = user
        path = tmp_path / f"{kind}.kubeconfig"
        path.write_text(json.dumps(doc))
        c = await KubeClient.load(str(path))
        try:
            assert c.bearer_token() == "token-1"
            assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
            token_file.write_text("token-2")
            fake_kube.api_tokens = {"token-2"}
            assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList", kind
            assert c.bearer_token() == "token-2"
        finally:
            await c.close()


async def test_in_cluster_service_account(fake_kube, tmp_path, monkeypatch):
    import kubernetes_asyncio.config.incluster_config as incluster

    (tmp_path / "token").write_text("admin-token\n")
    (tmp_path / "ca.crt").write_bytes(fake_kube.ca.cert_pem.bytes())
    monkeypatch.setattr(incluster, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(fake_kube.port))
    c = await KubeClient.load(None)
    try:
        assert c.bearer_token() == "admin-token" and c.ca_file() == str(tmp_path / "ca.crt")
        assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
    finally:
        await c.close()


async def test_official_kubernetes_client_reads_the_fake(fake_kube):
    import kubernetes

    fake_kube.upsert(make_node("n1", labels={"a": "b"}))
    fake_kube.upsert(make_pod("default", "web-1", "n1"))

    def read():
        api = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(str(fake_kube.kubeconfig)))
        nodes = api.list_node(label_selector="a=b")
        pods = api.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
        return [n.metadata.name for n in nodes.items], [p.metadata.name for p in pods.items], nodes.metadata

    nodes, pods, meta = await asyncio.to_thread(read)
    assert nodes == ["n1"] and pods == ["web-1"] and meta.resource_version == str(fake_kube.rv)


async def test_kubectl_reads_the_fake(fake_kube):
    fake_kube.upsert(make_node("n1"))
    proc = await asyncio.create_subprocess_exec(
        "/usr/bin/kubectl",
        "--kubeconfig",
        str(fake_kube.kubeconfig),
        "get",
        "--raw",
        "/api/v1/nodes",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    body = json.loads(out)
    assert body["kind"] == "NodeList" and body["items"][0]["metadata"]["name"] == "n1"
    assert ("GET", "/api/v1/nodes", {}) in fake_kube.requests


# ---- objects and informers ----------------------------------------------------------------------
def test_converters_keep_the_fields():
    n = node_from_json(
        make_node("n1", labels={"x": "y"}, addresses=[("InternalIP", "10.0.0.1")], kubelet_port=10255)
    )
    assert n.name == "n1" and n.labels["x"] == "y" and n.addresses == [("InternalIP", "10.0.0.1")]
    assert n.kubelet_port == 10255 and n.creation_timestamp == ""
    p = pod_from_json(make_pod("ns", "p", "n1", labels={"app": "a"}, phase="Pending"))
    assert (p.namespace, p.name, p.node_name, p.phase, p.labels) == ("ns", "p", "n1", "Pending", {"app": "a"})
    p2 = pod_from_json(make_pod("ns", "q", "n1", labels={"app": "a"}))
    assert p2.labels is p.labels  # equal label maps are shared
    assert node_from_json({"metadata": {"name": "bare"}}).kubelet_port == 0


async def test_informer_sync_and_propagation(fake_kube, client):
    fake_kube.upsert(make_node("n1"))
    fake_kube.upsert(make_node("n2"))
    inf = Informer(client, "/api/v1/nodes", node_from_json, lambda n: n.name, page_size=1)
    assert not inf.has_synced()
    await inf.start()
    try:
        assert inf.has_synced() and sorted(n.name for n in inf.values()) == ["n1", "n2"]
        assert inf.last_resource_version == str(fake_kube.rv)
        fake_kube.upsert(make_node("n3"))
        fake_kube.upsert(make_node("n1", labels={"new": "label"}))
        fake_kube.delete("nodes", "", "n2")
        await eventually(lambda: inf.get("n2") is None and inf.get("n3") is not None)
        await eventually(lambda: inf.get("n1").labels.get("new") == "label")
        assert inf.last_resource_version == str(fake_kube.rv)
        # bookmarks advance the resourceVersion without changing the cache
        fake_kube.upsert({"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d"}, "data": {}})
        fake_kube.send_bookmarks()
        await eventually(lambda: inf.last_resource_version == str(fake_kube.rv))
        assert inf.relists == 1
        paged = [q for q in fake_kube.requests if q[1] == "/api/v1/nodes" and "continue" in q[2]]
        assert paged, "the first list is paged"
    finally:
        await inf.stop()


async def test_informer_recovers_from_dropped_watches_and_timeouts(fake_kube, client):
    fake_kube.upsert(make_node("n1"))
    inf = Informer(client, "/api/v1/nodes", node_from_json, lambda n: n.name, watch_timeout=1)
    await inf.start()
    try:
        await eventually(lambda: fake_kube.open_watches == 1)
        assert fake_kube.drop_watches() == 1
        fake_kube.upsert(make_node("n2"))
        await eventually(lambda: inf.get("n2") is not None)
        # the 1 s server-side timeout ends watches normally; the informer re-watches from its RV
        watches = lambda: [q for q in fake_kube.requests if q[2].get("watch") == "true"]  # noqa: E731
        await eventually(lambda: len(watches()) >= 4)
        fake_kube.upsert(make_node("n3"))
        await eventually(lambda: inf.get("n3") is not None)
        assert inf.relists == 1  # never needed a relist
        assert all(q[2]["allowWatchBookmarks"] == "true" and q[2]["resourceVersion"] for q in watches())
    finally:
        await inf.stop()


async def test_informer_relists_after_restart_with_expired_history(fake_kube, client):
    fake_kube.upsert(make_node("n1"))
    fake_kube.upsert(make_node("n2"))
    inf = Informer(client, "/api/v1/nodes", node_from_json, lambda n: n.name, backoff_max=0.5)
    await inf.start()
    try:
        await eventually(lambda: fake_kube.open_watches == 1)
        await fake_kube.stop()
        # while the server is down: changes the informer cannot see, and the history is compacted
        fake_kube.delete("nodes", "", "n1")
        fake_kube.upsert(make_node("n3"))
        fake_kube.expire_history()
        await asyncio.sleep(0.3)  # let it hit a few connection errors
        await fake_kube.start()  # same port
        await eventually(lambda: inf.relists == 2)
        await eventually(lambda: sorted(n.name for n in inf.values()) == ["n2", "n3"])
        fake_kube.upsert(make_node("n4"))
        await eventually(lambda: inf.get("n4") is not None)
    finally:
        await inf.stop()


async def test_kube_inventory(fake_kube, client):
    fake_kube.upsert(make_node("w1", labels={"role": "worker"}))
    fake_kube.upsert(make_node("w2", labels={"role": "worker"}))
    fake_kube.upsert(make_node("m1", labels={"role": "master"}))
    fake_kube.upsert(make_pod("a", "p1", "w1"))
    fake_kube.upsert(make_pod("a", "p2", "w2"))
    fake_kube.upsert(make_pod("b", "p3", "w1"))
    fake_kube.upsert(make_pod("b", "done", "w1", phase="Succeeded"))
    inv = KubeInventory(client, node_selector="role=worker")
    await inv.start()
    try:
        assert inv.has_synced()
        assert sorted(n.name for n in inv.nodes()) == ["w1", "w2"] and inv.node("m1") is None
        assert sorted(p.name for p in inv.pods("a")) == ["p1", "p2"]
        assert sorted(p.name for p in inv.pods("b")) == ["p3"]  # terminal pods are not kept
        assert len(list(inv.pods())) == 3 and inv.pod("a", "p1").node_name == "w1"
        assert list(inv.pods("nope")) == []
        fake_kube.upsert(make_pod("b", "p3", "w1", phase="Failed"))  # becomes terminal -> leaves
        fake_kube.upsert(make_pod("c", "p4", "w2"))
        fake_kube.upsert(make_node("m1", labels={"role": "worker"}))  # starts matching
        await eventually(lambda: inv.pod("b", "p3") is None and inv.pod("c", "p4") is not None)
        await eventually(lambda: inv.node("m1") is not None)
        assert list(inv.pods("b")) == []
    finally:
        await inv.stop()


def test_static_inventory(tmp_path):
    doc = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [make_node("n1"), make_pod("a", "p1", "n1"), make_pod("b", "p2", "n1")],
    }
    path = tmp_path / "inv.json"
    path.write_text(json.dumps(doc))
    inv = StaticInventory.from_file(path)
    assert inv.has_synced() and [n.name for n in inv.nodes()] == ["n1"]
    assert [p.name for p in inv.pods("a")] == ["p1"] and len(list(inv.pods())) == 2
    assert inv.pod("b", "p2").namespace == "b" and inv.node("zz") is None
    pods = {"kind": "PodList", "items": [{k: v for k, v in make_pod("a", "x", "n").items() if k != "kind"}]}
    assert [p.name for p in StaticInventory.from_document(pods).pods()] == ["x"]
    yml = tmp_path / "inv.yaml"
    yml.write_text("kind: Node\nmetadata:\n  name: y1\n---\nkind: Pod\nmetadata: {name: q, namespace: z}\n")
    assert [n.name for n in StaticInventory.from_file(yml).nodes()] == ["y1"]


# ---- reviews ------------------------------------------------------------------------------------
async def test_token_reviewer(fake_kube, client):
    fake_kube.tokens["good"] = {
        "username": "alice",
        "uid": "u1",
        "groups": ["devs", "system:authenticated"],
        "extra": {"scopes": ["a", "b"]},
    }
    tr = TokenReviewer(client, cache_ttl=60.0, failure_ttl=60.0)
    results = await asyncio.gather(*(tr.authenticate("good") for _ in range(5)))
    assert len(fake_kube.token_reviews) == 1  # concurrent identical look-ups share one request
    user = results[0]
    assert user == UserInfo("alice", "u1", ("devs", "system:authenticated"), (("scopes", ("a", "b")),))
    assert fake_kube.token_reviews[0]["spec"]["token"] == "good"
    assert fake_kube.token_reviews[0]["kind"] == "TokenReview"
    assert await tr.authenticate("good") == user and len(fake_kube.token_reviews) == 1  # cached
    assert await tr.authenticate("bad") is None and len(fake_kube.token_reviews) == 2
    assert await tr.authenticate("bad") is None and len(fake_kube.token_reviews) == 2  # failures cached too
    nocache = TokenReviewer(client, cache_ttl=0, failure_ttl=0)
    await nocache.authenticate("good")
    await nocache.authenticate("good")
    assert len(fake_kube.token_reviews) == 4
    bounded = TokenReviewer(client, max_entries=3)
    for i in range(10):
        await bounded.authenticate(f"t{i}")
    assert len(bounded._cache) == 3
    await fake_kube.stop()
    with pytest.raises(ReviewError):
        await TokenReviewer(client).authenticate("good")


async def test_access_reviewer(fake_kube, client):
    def decide(spec):
        ra = spec.get("resourceAttributes")
        if ra and ra.get("resource") == "pods" and spec["user"] == "alice":
            return True, "alice may see pods"
        return False, "no"

    fake_kube.authorize = decide
    ar = AccessReviewer(client, allowed_ttl=60.0, denied_ttl=60.0)
    alice = UserInfo("alice", "u1", ("devs",), (("k", ("v",)),))
    pods = RequestAttributes(
        "list",
        "/apis/metrics.k8s.io/v1beta1/namespaces/a/pods",
        True,
        "metrics.k8s.io",
        "v1beta1",
        "pods",
        "",
        "a",
    )
    nodes = RequestAttributes(
        "get", "/apis/metrics.k8s.io/v1beta1/nodes/n1", True, "metrics.k8s.io", "v1beta1", "nodes", name="n1"
    )
    health = RequestAttributes("get", "/healthz", False)
    assert await ar.authorize(alice, pods) == (True, "alice may see pods")
    spec = fake_kube.access_reviews[0]["spec"]
    assert spec["user"] == "alice" and spec["uid"] == "u1" and spec["groups"] == ["devs"]
    assert spec["extra"] == {"k": ["v"]}
    assert spec["resourceAttributes"] == {
        "namespace": "a",
        "verb": "list",
        "group": "metrics.k8s.io",
        "version": "v1beta1",
        "resource": "pods",
    }
    assert await ar.authorize(alice, nodes) == (False, "no")
    assert fake_kube.access_reviews[1]["spec"]["resourceAttributes"]["name"] == "n1"
    assert await ar.authorize(alice, health) == (False, "no")
    assert fake_kube.access_reviews[2]["spec"]["nonResourceAttributes"] == {"path": "/healthz", "verb": "get"}
    assert len(fake_kube.access_reviews) == 3
    assert await ar.authorize(alice, pods) == (True, "alice may see pods")  # cache hits
    assert await ar.authorize(alice, nodes) == (False, "no")
    assert len(fake_kube.access_reviews) == 3
    assert (await ar.authorize(UserInfo("bob"), pods))[0] is False and len(fake_kube.access_reviews) == 4
    short = AccessReviewer(client, allowed_ttl=0, denied_ttl=0)
    await short.authorize(alice, pods)
    await short.authorize(alice, pods)
    assert len(fake_kube.access_reviews) == 6


async def test_read_extension_apiserver_authentication(fake_kube, client, ca):
    pem = ca.cert_pem.bytes().decode()
    fake_kube.upsert(
        {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
            "data": {
                "client-ca-file": pem,
                "requestheader-client-ca-file": pem,
                "requestheader-allowed-names": '["front-proxy-client"]',
                "requestheader-username-headers": '["X-Remote-User"]',
                "requestheader-group-headers": '["X-Remote-Group"]',
                "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
            },
        }
    )
    got = await read_extension_apiserver_authentication(client)
    assert got["client-ca-file"] == pem and got["requestheader-client-ca-file"] == pem
    assert got["requestheader-allowed-names"] == ["front-proxy-client"]
    assert got["requestheader-username-headers"] == ["X-Remote-User"]
    assert got["requestheader-group-headers"] == ["X-Remote-Group"]
    assert got["requestheader-extra-headers-prefix"] == ["X-Remote-Extra-"]
    assert got["requestheader-uid-headers"] == []


# ---- memory -------------------------------------------------------------------------------------
async def test_memory_of_30000_pods_in_an_informer(ca, tmp_path, capsys):
    """30 000 pods (3 000 deployments x 10 replicas over 300 nodes) listed and cached; prints bytes/pod."""
    n_pods = 30_000
    async with FakeKubeAPI(ca) as fake:
        for i in range(n_pods):
            dep = i // 10
            labels = {"app": f"app-{dep}", "pod-template-hash": f"{dep:08x}", "tier": "backend"}
            fake.upsert(make_pod(f"ns-{dep % 50}", f"app-{dep}-{i:05x}", f"node-{i % 300}", labels=labels))
        c = await KubeClient.load(str(fake.write_kubeconfig(tmp_path / "kc")))
        gc.collect()
        tracemalloc.start()
        try:
            inf = Informer(c, "/api/v1/pods", pod_from_json, lambda p: (p.namespace, p.name))
            await inf.start()
            await inf.stop()
            gc.collect()
            held, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            await c.close()
    assert len(inf) == n_pods
    per_pod = held / n_pods
    with capsys.disabled():
        print(
            f"\n[kube memory] {n_pods} pods cached: {held / 1e6:.1f} MB, {per_pod:.0f} B/pod, list peak {peak / 1e6:.1f} MB"
        )
    assert per_pod < 600, per_pod
