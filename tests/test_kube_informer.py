"""kcms.kube objects, informers and inventories against the fake API server over real HTTPS."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc

import pytest
from _kube_helpers import eventually
from fakeapi import FakeKubeAPI, make_node, make_pod

from kcms.kube import Informer, KubeClient, KubeInventory, StaticInventory, node_from_json, pod_from_json


@pytest.fixture
async def client(fake_kube):
    c = await KubeClient.load(str(fake_kube.kubeconfig))
    yield c
    await c.close()


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
