"""The fake API server's own protocol (tests/fakeapi.py) over real HTTPS, and real clients reading it."""

from __future__ import annotations

import asyncio
import json
import ssl

import aiohttp
import orjson
import pytest
from _kube_helpers import eventually
from fakeapi import make_node, make_pod

from kcms.kube import KubeAPIError, KubeClient


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
