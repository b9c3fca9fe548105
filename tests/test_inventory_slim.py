"""The slim inventory (kcms.kube.inventory / objects / informer) against the fake API server over HTTPS:
Running pods only (status.phase=Running in LIST and WATCH), full pods decoded to the fields kept or
metadata only (PartialObjectMetadata), node names kept where node binding needs them, the scrape loop
starting before the pods are listed, hostile objects skipped one by one."""

from __future__ import annotations

import asyncio
import logging

import pytest
from _kube_helpers import eventually
from fakeapi import make_node, make_pod
from prometheus_client import REGISTRY

from kcms.collector.kubelet import KubeletClient, KubeletClientConfig
from kcms.collector.scheduler import Collector
from kcms.kube import KubeClient, KubeInventory
from kcms.kube.objects import Skip, pod_from_json
from kcms.nodescope import NodeScope
from kcms.sim import SimulatedCluster


@pytest.fixture
async def client(fake_kube):
    c = await KubeClient.load(str(fake_kube.kubeconfig))
    yield c
    await c.close()


def skipped(resource: str, reason: str) -> float:
    return REGISTRY.get_sample_value(
        "kcms_kube_objects_skipped_total", {"resource": resource, "reason": reason}
    ) or 0.0


def pod_requests(fake) -> list[dict[str, str]]:
    return [q for m, p, q in fake.requests if m == "GET" and p == "/api/v1/pods"]


@pytest.mark.parametrize("node_names", [True, False], ids=["full", "metadata"])
async def test_running_pods_only_through_list_and_watch(fake_kube, client, node_names):
    fake_kube.upsert(make_node("n1"))
    fake_kube.upsert(make_pod("a", "run", "n1", labels={"app": "x"}))
    fake_kube.upsert(make_pod("a", "wait", "n1", phase="Pending"))
    fake_kube.upsert(make_pod("b", "done", "n1", phase="Succeeded"))
    fake_kube.upsert(make_pod("b", "lost", "n1", phase="Unknown"))
    inv = KubeInventory(client, pod_node_names=node_names, page_size=1)
    await inv.start()
    try:
        assert inv.has_synced() and inv.nodes_synced()
        assert [(p.namespace, p.name) for p in inv.pods()] == [("a", "run")]
        run = inv.pod("a", "run")
        assert run.phase == "Running" and run.labels == {"app": "x"} and run.creation_timestamp == ""
        # full pods keep spec.nodeName (node binding needs it); metadata-only pods have none
        assert run.node_name == ("n1" if node_names else "")
        # the selector is sent with the LIST and with the WATCH
        await eventually(lambda: any(q.get("watch") == "true" for q in pod_requests(fake_kube)))
        assert all(q.get("fieldSelector") == "status.phase=Running" for q in pod_requests(fake_kube))

        fake_kube.upsert(make_pod("a", "run", "n1", labels={"app": "x"}, phase="Succeeded"))  # leaves
        fake_kube.upsert(make_pod("a", "wait", "n1", labels={"app": "y"}))  # becomes Running: appears
        fake_kube.upsert(make_pod("c", "new", "n1", labels={"v": "1"}))
        await eventually(lambda: inv.pod("a", "run") is None and inv.pod("c", "new") is not None)
        await eventually(lambda: inv.pod("a", "wait") is not None)
        assert inv.pod("a", "wait").labels == {"app": "y"}
        fake_kube.upsert(make_pod("c", "new", "n1", labels={"v": "2"}))  # labels update
        await eventually(lambda: inv.pod("c", "new").labels == {"v": "2"})
        fake_kube.delete("pods", "c", "new")
        await eventually(lambda: inv.pod("c", "new") is None)
        assert sorted(p.name for p in inv.pods()) == ["wait"] and len(inv.pod_informer) == 1
        assert [p.name for p in inv.pods("a")] == ["wait"] and list(inv.pods("c")) == []
    finally:
        await inv.stop()


async def test_node_binding_sees_the_node_of_each_pod(fake_kube, client):
    """Agent scrapes and node pushes bind pods to nodes through the inventory (kcms/nodescope.py):
    the default inventory keeps spec.nodeName."""
    for n in ("n1", "n2"):
        fake_kube.upsert(make_node(n))
    fake_kube.upsert(make_pod("team", "mine", "n1"))
    fake_kube.upsert(make_pod("team", "theirs", "n2"))
    fake_kube.upsert(make_pod("team", "pending", "n1", phase="Pending"))
    inv = KubeInventory(client)
    await inv.start()
    try:
        scope = NodeScope("n1", inv)
        assert scope.node_known
        assert scope.pod_reason("team", "mine") is None
        assert scope.pod_reason("team", "theirs") == "pod_not_on_node"
        assert scope.pod_reason("team", "pending") == "unknown_pod"  # not Running: no usage to report
        fake_kube.upsert(make_pod("team", "theirs", "n1"))  # rescheduled (same name) onto n1
        await eventually(lambda: inv.pod("team", "theirs").node_name == "n1")
        assert NodeScope("n1", inv).pod_reason("team", "theirs") is None
    finally:
        await inv.stop()


async def test_scrape_loop_starts_before_the_pods_are_listed(ca, fake_kube, client):
    sim = SimulatedCluster(nodes=3, pods_per_node=2, containers_per_pod=1, seed=7, ca=ca,
                           one_port_per_node=True, token="kubelet-token")  # fmt: skip
    await sim.start()
    for obj in sim.inventory_objects():
        fake_kube.upsert(obj)
    gate = fake_kube.list_gates["pods"] = asyncio.Event()  # a pods LIST that takes "forever"
    inv = KubeInventory(client)
    kubelets = KubeletClient(
        KubeletClientConfig(
            use_node_status_port=True,
            preferred_address_types=("InternalIP",),
            extra_ca_pem=[ca.cert_pem.bytes().decode()],
            token_source=lambda: "kubelet-token",
        )
    )
    batches = []
    collector = Collector(inv, kubelets, batches.append, resolution=30.0, timeout=5.0)
    try:
        await inv.start(wait_for_pods=False)  # returns once the nodes are listed
        assert inv.nodes_synced() and not inv.has_synced()
        collector.start()
        await eventually(lambda: {b.node for b in batches} == set(sim.node_names()))
        assert not inv.has_synced() and list(inv.pods()) == []  # scraped while the pods were not listed
        assert all(b.node_point is not None and len(b.pods) == 2 for b in batches[:3])
        gate.set()
        await eventually(inv.has_synced)
        assert len(list(inv.pods())) == 6
    finally:
        gate.set()
        await collector.stop()
        await kubelets.close()
        await inv.stop()
        await sim.stop()


def _pod(name: str, namespace: str = "evil", **changes) -> dict:
    pod = make_pod(namespace, name, "n1", labels={"app": "ok"})
    for path, value in changes.items():
        target = pod
        *parents, last = path.split("__")
        for p in parents:
            target = target[p]
        target[last] = value
    return pod


HOSTILE_PODS = [
    _pod("huge-label", metadata__labels={"app": "x" * 1_000_000}),
    _pod("many-labels", metadata__labels={f"k{i}": "v" for i in range(300)}),
    _pod("long-key", metadata__labels={"k" * 400: "v"}),
    _pod("labels-list", metadata__labels=["a", "b"]),
    _pod("label-int", metadata__labels={"app": 5}),
    _pod("spec-string", spec="oops"),
    _pod("node-int", spec__nodeName=12),
    _pod("n" * 300),
    _pod("no-namespace", namespace=""),
    _pod("", namespace="evil"),
]


@pytest.mark.parametrize("page_size", [1, 500])
async def test_hostile_objects_are_skipped_one_by_one(fake_kube, client, caplog, page_size):
    caplog.set_level(logging.WARNING, logger="kcms.kube")
    fake_kube.upsert(make_node("n1"))
    fake_kube.upsert(make_node("bad-port", kubelet_port="10250"))
    bad_addresses = make_node("bad-addresses")
    bad_addresses["status"]["addresses"] = "127.0.0.1"
    fake_kube.upsert(bad_addresses)
    fake_kube.upsert(make_pod("good", "a", "n1", labels={"app": "a"}))
    for pod in HOSTILE_PODS:
        fake_kube.upsert(pod)
    fake_kube.upsert(make_pod("good", "z", "n1", labels={"app": "z"}))
    invalid, oversized = skipped("pods", "invalid"), skipped("pods", "oversized")
    bad_nodes = skipped("nodes", "invalid")
    inv = KubeInventory(client, page_size=page_size)
    await inv.start()
    try:
        assert sorted((p.namespace, p.name) for p in inv.pods()) == [("good", "a"), ("good", "z")]
        assert [n.name for n in inv.nodes()] == ["n1"]
        assert skipped("pods", "oversized") - oversized == 4  # huge value, 300 labels, long key, long name
        assert skipped("pods", "invalid") - invalid == 6
        assert skipped("nodes", "invalid") - bad_nodes == 2
        assert inv.pod_informer.skipped == 10 and inv.node_informer.skipped == 2
        # watch: a cached pod that turns hostile is dropped; hostile additions are skipped; the watch goes on
        fake_kube.upsert(make_pod("good", "a", "n1", labels={"app": "y" * 100}))
        fake_kube.upsert(_pod("later-huge", metadata__labels={"x": "y" * 100_000}))
        fake_kube.upsert(_pod("later-list", metadata__labels=["x"]))
        fake_kube.upsert(make_pod("good", "after", "n1"))
        await eventually(lambda: inv.pod("good", "after") is not None)
        assert inv.pod("good", "a") is None and inv.pod("evil", "later-huge") is None
        assert sorted(p.name for p in inv.pods()) == ["after", "z"]
        assert inv.pod_informer.skipped == 13 and inv.pod_informer.relists == 1
        assert inv.has_synced()
    finally:
        await inv.stop()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("kcms.kube")]
    assert lines and all(len(line) < 600 for line in lines)  # bounded, the 1 MB value not echoed
    assert not any(r.exc_info for r in caplog.records)
    assert "skipped" in lines[0]


def test_dict_conversion_refuses_what_the_wire_decoder_skips():
    with pytest.raises(Skip) as e:
        pod_from_json(_pod("huge", metadata__labels={"app": "x" * 100}))
    assert e.value.reason == "oversized"
    with pytest.raises(ValueError):
        pod_from_json(_pod("list", metadata__labels=["a"]))
    p = pod_from_json(_pod("fine"))
    assert (p.namespace, p.name, p.node_name, p.phase) == ("evil", "fine", "n1", "Running")


async def test_a_watch_event_beyond_the_line_bound_is_dropped_and_the_watch_goes_on(fake_kube, client, caplog):
    from kcms.kube.client import MAX_WATCH_LINE

    caplog.set_level(logging.WARNING, logger="kcms.kube")
    fake_kube.upsert(make_node("n1"))
    fake_kube.upsert(make_pod("good", "a", "n1"))
    inv = KubeInventory(client)
    await inv.start()
    try:
        await eventually(lambda: fake_kube.open_watches == 2)
        huge = make_pod("evil", "huge", "n1")
        huge["metadata"]["annotations"] = {"blob": "x" * (MAX_WATCH_LINE + 1024)}
        fake_kube.upsert(huge)
        fake_kube.upsert(make_pod("good", "b", "n1"))
        await eventually(lambda: inv.pod("good", "b") is not None)
        assert inv.pod("evil", "huge") is None and inv.pod_informer.relists == 1
        assert inv.pod_informer.last_resource_version == str(fake_kube.rv)
    finally:
        await inv.stop()
    assert any("skipped a watch event over" in r.getMessage() for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records)


def test_label_maps_are_shared_only_when_equal():
    from kcms.kube.objects import shared_labels

    a = shared_labels({"app": "web", "tier": "front"})
    assert shared_labels({"tier": "front", "app": "web"}) is a  # another key order: the same map
    assert shared_labels({"app": "web", "tier": "front"}) is a  # the fast path
    b = shared_labels({"app": "web", "tier": "back"})
    assert b is not a and b == {"app": "web", "tier": "back"} and a == {"app": "web", "tier": "front"}
    assert shared_labels({"app": 5}) == {"app": "5"}  # dict path: values made strings, not shared wrongly
    assert shared_labels({"app": "5"}) == {"app": "5"}
