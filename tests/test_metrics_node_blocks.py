"""The list of every pod made of node blocks (kcms.apis.metrics.blocks.NodeBlocks) serves
exactly what the per-pod path serves, whatever happens between two lists: new scrapes, pods
added, relabelled, no longer Running or deleted in the inventory, pods moving to another node's
scrape, nodes forgotten. Byte for byte the dict path's JSON, node by node in the store's order,
each pod once."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import gzip
import time
import weakref

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_metrics_list_render import HOSTILE, POD_HEAD, MutableInventory, collect, pod_info

from kcms.apis.metrics import blocks, convert, render
from kcms.model import NodeBatch, PodChangeLog, ResourcePoint
from kcms.store.resource import ResourceStore

NODES = ["n0", "n1", "n2"]
PODS = [(("a", "b", HOSTILE)[i % 3], f"p{i}") for i in range(8)]
START = 1.7e9
CREATED = "2026-05-01T10:00:00Z"

operations = st.lists(
    st.one_of(
        st.tuples(st.just("scrape"), st.integers(0, 2), st.sets(st.integers(0, 7)), st.integers(1, 2)),
        st.tuples(
            st.just("put"),
            st.integers(0, 7),
            st.sampled_from([{}, {"app": "web"}, {"app": HOSTILE}]),
            st.sampled_from(["Running", "Running", "Pending"]),
        ),
        st.tuples(st.just("delete"), st.integers(0, 7)),
        st.tuples(st.just("forget"), st.integers(0, 2)),
        st.tuples(st.just("list")),
    ),
    max_size=40,
)


def scrape(node: str, keys: set[int], containers: int, t: float) -> NodeBatch:
    """A scrape of ``node`` with pods ``keys``; a second container's name holds every escape and
    a NUL byte (the blocks keep a NUL where creationTimestamp goes: JSON text must never)."""
    batch = NodeBatch(node, ResourcePoint(START - 3600, t, int(1e9 * (t - START + 3600)), 2**30))
    for i in sorted(keys):
        batch.pods[PODS[i]] = {
            ("c0", "c1" + HOSTILE)[c]: ResourcePoint(START - 3600, t, int((i + 1) * (c + 1) * 1e7 * (t - START + 3600)), 4096 * (i + 1))
            for c in range(containers)
        }  # fmt: skip
    return batch


def delete(inv: MutableInventory, key: tuple[str, str]) -> None:
    """Delete a pod from the inventory (logged in a LoggedInventory, as an informer's delete is)."""
    if inv.pod_map.pop(key, None) is not None and isinstance(inv, LoggedInventory):
        inv.version += 1
        inv.log.append(key)


def apply(op: tuple, store: ResourceStore, inv: MutableInventory, t: float) -> float:
    """Carry out one of ``operations`` other than "list"; the time of the last scrape after it."""
    if op[0] == "scrape":
        t += 15.0
        store.store(scrape(NODES[op[1]], op[2], op[3], t))
    elif op[0] == "put":
        namespace, name = PODS[op[1]]
        inv.put_pod(pod_info(namespace, name, op[2], phase=op[3]))
    elif op[0] == "delete":
        delete(inv, PODS[op[1]])
    elif op[0] == "forget":
        store.forget_node(NODES[op[1]])
    return t


async def joined(chunks) -> bytes:
    return b"".join([c async for c in chunks])


def reference(store: ResourceStore, inv: MutableInventory, now: float) -> tuple[bytes, set]:
    """The items the per-pod rules serve, in node-block order; and, independently of any order,
    which pods the per-pod path would list."""
    fmt = convert.TimeFormatter()
    items = []
    for node, _ in store.pod_blocks(now):
        for (namespace, name), _ in store.node_pod_rates(node, lambda *a: a, lambda *a: a):
            pod = inv.pod(namespace, name)
            if store.pod_node(namespace, name) != node or pod is None or pod.phase != "Running":
                continue
            usage = store.pod_usage(namespace, name, now)
            if usage is not None:
                items.append(convert.pod_metrics(pod, convert.pod_usage_body(usage, fmt), CREATED))
    per_pod = {
        (p.namespace, p.name)
        for p in inv.pods()
        if p.phase == "Running" and store.pod_usage(p.namespace, p.name, now) is not None
    }
    return orjson.dumps(convert.object_list("PodMetricsList", items)), per_pod


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_node_blocks_serve_what_the_per_pod_path_serves(ops):
    inv = MutableInventory()
    for namespace, name in PODS:
        inv.put_pod(pod_info(namespace, name, {"app": "web"}))
    store = ResourceStore(15.0, max_age=3600.0)
    # never rendered ahead, so no block stands in for a newer scrape: every list serves the newest
    # (tests/test_metrics_node_blocks_previous.py has the same operations with rendering ahead)
    renderer = blocks.NodeBlocks(render.ListRenderer(inv), prerender_within=0)
    t = START
    lists = 0
    # the store's log of changed nodes holds every node whose token changed (rendering ahead
    # looks at those alone)
    version, tokens = store.pod_block_changes(0)[0], dict(store.pod_blocks())
    for op in [*ops, ("list",)]:
        now_tokens = dict(store.pod_blocks())
        version, changed = store.pod_block_changes(version)
        assert changed is not None
        assert {node for node, token in now_tokens.items() if tokens.get(node) is not token} <= set(changed)
        tokens = now_tokens
        if op[0] != "list":
            t = apply(op, store, inv, t)
        else:
            now = time.monotonic()
            if lists % 2:  # gzipped: the first block compressed per list, the others too (no ahead)
                chunks = renderer.items(store, now, CREATED, gzip_head=POD_HEAD)
                got = gzip.decompress(asyncio.run(joined(chunks)))
            else:
                got = asyncio.run(collect(POD_HEAD, renderer.items(store, now, CREATED)))
            expected, per_pod = reference(store, inv, now)
            assert got == expected
            names = [
                (i["metadata"].get("namespace", ""), i["metadata"]["name"])
                for i in orjson.loads(got)["items"]
            ]
            assert len(names) == len(set(names)) and set(names) == per_pod
            lists += 1
    assert lists >= 1


def test_a_pod_moving_to_another_node_is_listed_once_with_its_new_readings():
    inv = MutableInventory()
    inv.put_pod(pod_info("a", "p0", {}))  # PODS[0]
    inv.put_pod(pod_info("b", "p1", {}))  # PODS[1]
    store = ResourceStore(15.0, max_age=3600.0)
    renderer = blocks.NodeBlocks(render.ListRenderer(inv), prerender_within=0)  # the newest, always

    def listed() -> dict:
        body = asyncio.run(collect(POD_HEAD, renderer.items(store, time.monotonic(), CREATED)))
        items = orjson.loads(body)["items"]
        by_name = {i["metadata"]["name"]: i for i in items}
        assert len(by_name) == len(items)  # each pod once
        return by_name

    for t in (START, START + 15):
        store.store(scrape("n0", {0, 1}, 1, t))
    assert set(listed()) == {"p0", "p1"}
    before = listed()["p0"]["containers"]
    # p0 is recreated on n1 (a StatefulSet pod keeps its name): n1's scrapes carry it, n0's
    # next scrape has not come yet
    for t in (START + 20, START + 35):
        batch = scrape("n1", {0}, 1, t)
        batch.pods[PODS[0]]["c0"] = ResourcePoint(START + 10, t, int(5e8 * (t - START - 10)), 1 << 20)
        store.store(batch)
    items = listed()
    assert set(items) == {"p0", "p1"}  # once, not from both nodes
    assert items["p0"]["containers"] != before and items["p0"]["containers"][0]["usage"]["memory"] == "1Mi"
    # relabelled in the inventory: the block is rendered again
    inv.put_pod(dataclasses.replace(inv.pod("a", "p0"), labels={"moved": "yes"}))
    assert listed()["p0"]["metadata"]["labels"] == {"moved": "yes"}
    # gone from the inventory: gone from the list; forgotten node: its pods too
    inv.pod_map.pop(("b", "p1"))
    assert set(listed()) == {"p0"}
    store.forget_node("n1")
    assert listed() == {}


# ---- with the informer-backed inventory: only changed pods' blocks are dropped -------------------


async def test_all_pods_follow_the_kubernetes_inventory_through_its_change_log(fake_kube):
    from _kube_helpers import eventually
    from fakeapi import make_node, make_pod

    from kcms.kube import KubeClient, KubeInventory

    fake_kube.upsert(make_node("n0"))
    for i in range(8):
        fake_kube.upsert(make_pod(PODS[i][0], PODS[i][1], "n0", labels={"app": "web"}))
    client = await KubeClient.load(str(fake_kube.kubeconfig))
    inv = KubeInventory(client, pod_node_names=False)
    await inv.start()
    store = ResourceStore(15.0, max_age=3600.0)
    renderer = blocks.NodeBlocks(render.ListRenderer(inv))

    async def listed() -> dict:
        now = time.monotonic()
        body = await collect(POD_HEAD, renderer.items(store, now, CREATED))
        expected, per_pod = reference(store, inv, now)
        assert body == expected
        items = orjson.loads(body)["items"]
        assert {(i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in items} == per_pod
        return {i["metadata"]["name"]: i for i in items}

    try:
        for t in (START, START + 15):
            store.store(scrape("n0", set(range(6)), 2, t))
            store.store(scrape("n1", {6, 7}, 1, t))
        assert set(await listed()) == {f"p{i}" for i in range(8)}
        version, changed = inv.pod_changes(renderer._inventory_version)  # noqa: SLF001 - what the renderer saw
        assert changed == []
        # one pod relabelled, one stops running, one deleted: the watch reports them
        fake_kube.upsert(make_pod(PODS[1][0], "p1", "n0", labels={"app": "api", "q": HOSTILE}))
        fake_kube.upsert(make_pod(PODS[2][0], "p2", "n0", phase="Succeeded"))
        fake_kube.delete("pods", PODS[7][0], "p7")
        await eventually(lambda: inv.pod(PODS[7][0], "p7") is None and inv.pod(PODS[2][0], "p2") is None)
        await eventually(lambda: inv.pod(PODS[1][0], "p1").labels.get("app") == "api")
        _, changed = inv.pod_changes(version)
        assert set(changed) == {PODS[1], PODS[2], PODS[7]}
        items = await listed()
        assert set(items) == {"p0", "p1", "p3", "p4", "p5", "p6"}
        assert items["p1"]["metadata"]["labels"] == {"app": "api", "q": HOSTILE}
        # a pod that comes back is listed again
        fake_kube.upsert(make_pod(PODS[7][0], "p7", "n1", labels={"back": "yes"}))
        await eventually(lambda: inv.pod(PODS[7][0], "p7") is not None)
        assert (await listed())["p7"]["metadata"]["labels"] == {"back": "yes"}
        # after a relist the log cannot say what changed: every block is checked
        await fake_kube.stop()
        fake_kube.upsert(make_pod(PODS[0][0], "p0", "n0", labels={"after": "relist"}))
        fake_kube.expire_history()
        await fake_kube.start()
        await eventually(lambda: inv.pod_informer.relists == 2)
        assert inv.pod_changes(version)[1] is None
        assert (await listed())["p0"]["metadata"]["labels"] == {"after": "relist"}
    finally:
        await inv.stop()
        await client.close()


def test_the_change_log_is_bounded_and_says_when_it_no_longer_reaches_back():
    from kcms.kube import Informer
    from kcms.kube import informer as informer_module

    cap = informer_module.CHANGE_LOG
    inf = Informer(None, "/api/v1/pods", lambda o: o, lambda p: (p.namespace, p.name), nested=True)  # type: ignore[arg-type]
    assert inf.changes_since(0) == (0, [])
    for i in range(2 * cap + 1):
        inf._put(pod_info("ns", f"p{i % 100}", {}))  # noqa: SLF001 - what a watch event does
    version = 2 * cap + 1
    assert len(inf._changes) == cap  # noqa: SLF001 - past twice its capacity the log keeps the last cap
    assert inf.changes_since(0) == (version, None)  # the oldest cap + 1 changes were dropped
    assert inf.changes_since(cap) == (version, None)
    _, keys = inf.changes_since(cap + 1)
    assert len(keys) == cap and keys[-1] == ("ns", f"p{(version - 1) % 100}")
    inf._remove_key(("ns", "p5"))  # noqa: SLF001
    assert inf.changes_since(version) == (version + 1, [("ns", "p5")])
    assert inf.changes_since(version + 2) == (version + 1, None)  # a version it never gave


def test_change_log_reset_and_trim():
    from kcms.changelog import ChangeLog

    log: ChangeLog[str] = ChangeLog(2)
    for key in "abcd":
        log.add(key)
    assert log.since(0) == (4, ["a", "b", "c", "d"]) and log.since(3) == (4, ["d"])
    log.add("e")  # five held would be over twice the capacity: the oldest three go
    assert log.since(2) == (5, None) and log.since(3) == (5, ["d", "e"])
    log.reset()
    assert log.since(5) == (6, None) and log.since(6) == (6, [])
    log.add("f")
    assert log.since(6) == (7, ["f"])


# ---- rendering ahead ------------------------------------------------------------------------------


def rendered(when: str) -> float:
    return blocks.BLOCKS_RENDERED.labels(when)._value.get()  # noqa: SLF001 - prometheus_client's value


async def test_blocks_of_scraped_nodes_are_rendered_ahead_while_lists_come_often_and_not_after():
    from _kube_helpers import eventually

    inv = MutableInventory()
    for namespace, name in PODS:
        inv.put_pod(pod_info(namespace, name, {"app": "web"}))
    store = ResourceStore(15.0, max_age=3600.0)
    renderer = blocks.NodeBlocks(render.ListRenderer(inv), prerender_within=5.0)
    t = START
    for t in (START, START + 15):
        for n, node in enumerate(NODES):
            store.store(scrape(node, {i for i in range(8) if i % 3 == n}, 2, t))

    async def listed() -> bytes:
        now = time.monotonic()
        body = await collect(POD_HEAD, renderer.items(store, now, CREATED))
        assert body == reference(store, inv, now)[0]
        return body

    on_list, ahead = rendered("on_list"), rendered("ahead")
    first = await listed()
    assert rendered("on_list") - on_list == 3  # the first list renders every node's pods
    await asyncio.sleep(2.0)
    await listed()  # two lists 2 s apart: render ahead for the next 4 s
    # two nodes are scraped again: their blocks are rendered in the background, not by the next list
    t += 15
    store.store(scrape("n0", {0, 3, 6}, 2, t))
    store.store(scrape("n2", {2, 5}, 2, t))
    await eventually(lambda: rendered("ahead") - ahead == 2)
    on_list = rendered("on_list")
    second = await listed()
    assert rendered("on_list") == on_list and second != first  # new readings, nothing left to render
    # a pod changed in the inventory is not a scrape: its block is checked and rendered by the list
    inv.put_pod(pod_info(*PODS[1], {"app": "changed"}))
    assert b'"changed"' in await listed() and rendered("on_list") == on_list + 1
    # nobody lists any more: soon nothing is rendered ahead
    await asyncio.sleep(5.5)
    ahead = rendered("ahead")
    store.store(scrape("n1", {1, 4, 7}, 2, t + 15))
    await asyncio.sleep(1.5)  # many periods of the background step
    assert rendered("ahead") == ahead
    assert b'"changed"' in await listed() and rendered("on_list") == on_list + 2


def scrape_all(store: ResourceStore, t: float) -> None:
    """A scrape of each of NODES at ``t``, each with its third of PODS."""
    for n, node in enumerate(NODES):
        store.store(scrape(node, {i for i in range(8) if i % 3 == n}, 2, t))


async def rendering_ahead_for(seconds: float) -> tuple[MutableInventory, ResourceStore, blocks.NodeBlocks]:
    """NODES scraped twice, then two lists of every pod ``seconds / 2`` apart: rendering ahead
    runs for the next ``seconds``."""
    inv = MutableInventory()
    for namespace, name in PODS:
        inv.put_pod(pod_info(namespace, name, {}))
    store = ResourceStore(15.0, max_age=3600.0)
    renderer = blocks.NodeBlocks(render.ListRenderer(inv), prerender_within=seconds)
    for t in (START, START + 15):
        scrape_all(store, t)
    for pause in (seconds / 2, 0):
        await collect(POD_HEAD, renderer.items(store, time.monotonic(), CREATED))
        await asyncio.sleep(pause)
    return inv, store, renderer


async def test_rendering_ahead_checks_every_node_when_the_stores_log_no_longer_reaches_back(monkeypatch):
    """Rendering ahead follows the store's log of changed nodes; when more nodes changed between
    two steps than the log holds, it checks every node instead, and still misses none."""
    from _kube_helpers import eventually

    from kcms.store import resource

    monkeypatch.setattr(resource, "NODE_CHANGE_LOG", 1)  # the log holds one or two writes
    inv, store, renderer = await rendering_ahead_for(3.0)
    ahead = rendered("ahead")
    scrape_all(store, START + 30)  # three writes before the next step: over the log's reach
    assert store.pod_block_changes(renderer._changes_seen)[1] is None  # noqa: SLF001
    await eventually(lambda: rendered("ahead") - ahead == 3)
    on_list = rendered("on_list")
    body = await collect(POD_HEAD, renderer.items(store, time.monotonic(), CREATED))
    assert rendered("on_list") == on_list and body == reference(store, inv, time.monotonic())[0]


async def test_rendering_ahead_looks_often_while_scrapes_come_and_backs_off_between_cycles():
    """Every PRERENDER_PERIOD while nodes change, so blocks are ready soon after their scrape; twice
    as late after each look that found nothing, up to PRERENDER_IDLE_PERIOD between cycles."""
    from _kube_helpers import eventually

    _, store, renderer = await rendering_ahead_for(5.0)
    period = lambda: renderer._prerender_period  # noqa: E731, SLF001
    await eventually(lambda: period() == blocks.PRERENDER_IDLE_PERIOD)  # nothing scraped: backed off
    ahead = rendered("ahead")
    store.store(scrape("n0", {0, 3, 6}, 2, START + 30))
    await eventually(lambda: rendered("ahead") == ahead + 1)
    assert period() == blocks.PRERENDER_PERIOD  # a node changed: looking often again


async def test_a_short_gap_between_two_lists_does_not_stop_rendering_ahead_sooner():
    """Two clients listing at once start lists milliseconds apart: that gap must not cut short the
    rendering ahead that the longer gap before it asked for."""
    from _kube_helpers import eventually

    _, store, renderer = await rendering_ahead_for(4.0)  # lists 2 s apart: on for the next 4 s
    await collect(POD_HEAD, renderer.items(store, time.monotonic(), CREATED))  # a few ms later
    await asyncio.sleep(0.5)  # past twice the short gap, within the 4 s
    ahead = rendered("ahead")
    store.store(scrape("n0", {0, 3, 6}, 2, START + 30))
    await eventually(lambda: rendered("ahead") == ahead + 1, limit=2.0)


async def test_lists_further_apart_than_a_resolution_never_render_ahead():
    inv = MutableInventory()
    for namespace, name in PODS:
        inv.put_pod(pod_info(namespace, name, {}))
    store = ResourceStore(15.0, max_age=3600.0)
    renderer = blocks.NodeBlocks(render.ListRenderer(inv), prerender_within=0.5)  # "a resolution" of 0.5 s
    for t in (START, START + 15):
        store.store(scrape("n0", set(range(8)), 1, t))
    ahead = rendered("ahead")
    for i in range(3):
        await collect(POD_HEAD, renderer.items(store, time.monotonic(), CREATED))
        store.store(scrape("n0", set(range(8)), 1, START + 30 + 15 * i))
        await asyncio.sleep(1.0)  # lists 1 s apart: rendering ahead would cost more than it saves
    assert rendered("ahead") == ahead


async def test_blocks_are_dropped_once_lists_stop_and_rendered_again_by_the_next():
    """A `kubectl top pods -A` now and then must not leave every pod's JSON held until the next
    one (57 MB at 150 000 pods): RELEASE_AFTER_RESOLUTIONS resolutions after the last list the
    blocks are gone; a list in between postpones it; the next list renders and serves as before."""
    inv = MutableInventory()
    for namespace, name in PODS:
        inv.put_pod(pod_info(namespace, name, {}))
    store = ResourceStore(15.0, max_age=3600.0)
    renderer = blocks.NodeBlocks(render.ListRenderer(inv), prerender_within=0.5)  # "a resolution" of 0.5 s
    assert renderer.release_after == 2 * 0.5
    for t in (START, START + 15):
        for n, node in enumerate(NODES):
            store.store(scrape(node, {i for i in range(8) if i % 3 == n}, 1, t))

    async def listed() -> None:
        now = time.monotonic()
        assert await collect(POD_HEAD, renderer.items(store, now, CREATED)) == reference(store, inv, now)[0]

    await listed()
    assert renderer.cached() == 3
    for _ in range(3):  # lists 0.7 s apart: never 1 s without one
        await asyncio.sleep(0.7)
        await listed()
        assert renderer.cached() == 3 and renderer.releases == 0
    await asyncio.sleep(1.5)
    assert renderer.cached() == 0 and renderer.releases == 1
    on_list = rendered("on_list")
    await listed()
    assert rendered("on_list") - on_list == 3 and renderer.cached() == 3


class LoggedInventory(MutableInventory):
    """A test inventory with a change log (kcms.model.PodChangeLog) that can lose it (a relist)."""

    def __init__(self) -> None:
        super().__init__()
        self.version = 0
        self.floor = 0
        self.log: list[tuple[str, str]] = []

    def put_pod(self, pod) -> None:
        super().put_pod(pod)
        self.version += 1
        self.log.append((pod.namespace, pod.name))

    def relist(self, pod) -> None:
        """Replace ``pod`` without logging it, as a relist does: the log no longer reaches back."""
        self.pod_map[(pod.namespace, pod.name)] = pod
        self.version += 1
        self.floor = self.version
        self.log = []

    def pod_changes(self, since: int):
        if since < self.floor:
            return self.version, None
        return self.version, self.log[since - self.floor :]


async def test_a_list_cut_short_after_a_relist_leaves_the_check_of_every_block_to_the_next():
    inv = LoggedInventory()
    keys = {node: [("ns", f"{node}-p{i}") for i in range(2500)] for node in NODES}  # > 1 MiB before n2
    for node_keys in keys.values():
        for namespace, name in node_keys:
            inv.put_pod(pod_info(namespace, name, {"app": "web"}))
    store = ResourceStore(15.0, max_age=3600.0)
    for t in (START, START + 15):
        for node, node_keys in keys.items():
            batch = NodeBatch(node, None)
            for i, key in enumerate(node_keys):
                batch.pods[key] = {
                    "c": ResourcePoint(START - 3600, t, int((i + 1) * 1e7 * (t - START + 3600)), 4096)
                }
            store.store(batch)
    renderer = blocks.NodeBlocks(render.ListRenderer(inv))
    assert isinstance(inv, PodChangeLog)
    await collect(POD_HEAD, renderer.items(store, time.monotonic(), CREATED))  # every block built
    inv.relist(pod_info("ns", "n2-p7", {"app": "relabelled"}))  # n2 is the last node listed
    chunks = renderer.items(store, time.monotonic(), CREATED)
    first = await chunks.__anext__()
    assert b"relabelled" not in first and len(first) >= blocks.BLOCK_CHUNK_BYTES
    await chunks.aclose()  # the client left: n2's block was not checked
    now = time.monotonic()
    body = await collect(POD_HEAD, renderer.items(store, now, CREATED))
    assert body == reference(store, inv, now)[0] and b'"relabelled"' in body


def test_a_full_render_leaves_the_garbage_collector_objects_per_node_not_per_pod():
    """Rendering every pod again (the first list after a scrape cycle) must not leave objects
    tracked by the cyclic collector, per pod or per node: at 150 000 pods the ~450 000 PodUsage
    tuples a render used to keep cost the next two lists 200-350 ms of collection
    (bench/resource_pipeline.py), and the blocks' ~60 references a node put gen-1 passes into
    lists during a 5000-node cycle. The blocks keep an object and two tuples a node, untracked;
    the pods' usage is rendered straight from the readings."""
    nodes = [f"gc-n{i}" for i in range(20)]
    keys = {node: [("gc", f"{node}-p{j}") for j in range(30)] for node in nodes}
    inv = MutableInventory()
    for node_keys in keys.values():
        for namespace, name in node_keys:
            inv.put_pod(pod_info(namespace, name, {"app": "web"}))
    store = ResourceStore(15.0, max_age=3600.0)
    renderer = blocks.NodeBlocks(render.ListRenderer(inv))

    def scrape_all(t: float) -> None:
        for node in nodes:
            batch = NodeBatch(node, ResourcePoint(START - 3600, t, int(1e9 * (t - START + 3600)), 2**30))
            for key in keys[node]:
                batch.pods[key] = {
                    c: ResourcePoint(START - 3600, t, int(1e7 * (t - START + 3600)), 4096) for c in ("c0", "c1")
                }
            store.store(batch)

    def tracked_after_a_list() -> tuple[int, int]:
        before = len(gc.get_objects())
        body = asyncio.run(collect(POD_HEAD, renderer.items(store, time.monotonic(), CREATED)))
        return len(gc.get_objects()) - before, len(orjson.loads(body)["items"])

    scrape_all(START)
    scrape_all(START + 15)
    tracked_after_a_list()  # the pods' metadata pieces are cached once
    gc.collect()
    gc.disable()  # no pass may untrack what a render left behind
    try:
        cached, listed = tracked_after_a_list()  # nothing rendered: the event loop's own objects
        assert listed == 600
        scrape_all(START + 30)
        rendered, listed = tracked_after_a_list()
        assert listed == 600
        assert renderer.cached() == len(nodes)
        assert rendered - cached <= 3 * len(nodes), (rendered, cached)
        # None of the blocks' objects is on the collector's lists where _gzsplice is built (CI
        # builds it); without it, three a node are.
        parts = {id(part) for b in renderer._blocks.values() for part in (b, b.keys, b.infos)}
        assert len(parts) == 3 * len(nodes)
        assert not [o for o in gc.get_objects() if id(o) in parts]
        assert all(len(b.keys) == len(b.infos) == 30 for b in renderer._blocks.values())
    finally:
        gc.enable()


def test_acyclic_untracks_only_and_what_it_untracked_is_freed_by_reference_counting():
    """``_gzsplice.acyclic`` (what node blocks go through) takes an object off the cyclic
    collector's lists and changes nothing else: same object returned, contents intact, objects
    without GC support accepted, and an untracked container freed by its last reference with what
    it held (nothing leaks: no cycle passes through a block)."""
    from kcms.apis.metrics._gzsplice import acyclic

    assert blocks.gzblocks.acyclic is acyclic  # the C one is in use where built
    pod = pod_info("ns", "p", {"app": "web"})
    infos = (pod, None)
    assert gc.is_tracked(infos) and gc.is_tracked(pod)
    assert acyclic(infos) is infos and not gc.is_tracked(infos)
    assert acyclic(infos) is infos and not gc.is_tracked(infos)  # twice: no change
    assert infos == (pod, None) and gc.is_tracked(pod)  # what it holds is left as it was
    for atom in (b"text", 7, None, "s"):
        assert acyclic(atom) is atom
    freed = []

    class Held:
        pass

    held = Held()
    weakref.finalize(held, freed.append, True)
    box = acyclic([held])
    del held
    assert not freed  # the untracked list keeps it alive
    del box
    assert freed == [True]  # and frees it with its last reference, without a collection
