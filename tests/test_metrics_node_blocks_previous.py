"""While lists of every pod come often (blocks rendered ahead), a list during a scrape cycle serves
a node's previous block when its newest scrape is not rendered yet (kcms.apis.metrics.blocks):
never a pod twice, never a pod the inventory no longer holds as it was, never a block rendered more
than two resolutions before, and the newest readings once rendering ahead has caught up."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import time
from types import SimpleNamespace

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_metrics_list_render import POD_HEAD, MutableInventory, collect, pod_info
from test_metrics_node_blocks import (
    CREATED,
    PODS,
    START,
    LoggedInventory,
    apply,
    delete,
    operations,
    reference,
    rendered,
    rendering_ahead_for,
    scrape,
    scrape_all,
)

from kcms.apis.metrics import blocks, render
from kcms.store.resource import ResourceStore
from kcms.tasks import STREAMS


def previous() -> float:
    return blocks.BLOCKS_PREVIOUS._value.get()  # noqa: SLF001 - prometheus_client's value


async def listed(renderer: blocks.NodeBlocks, store: ResourceStore, gzipped: bool = False) -> bytes:
    """A list of every pod; ``gzipped``: the gzip member spliced from compressed blocks, inflated."""
    if not gzipped:
        return await collect(POD_HEAD, renderer.items(store, time.monotonic(), CREATED))
    chunks = renderer.items(store, time.monotonic(), CREATED, gzip_head=POD_HEAD)
    return gzip.decompress(b"".join([c async for c in chunks]))


def cluster(
    prerender_within: float, inventory: type[MutableInventory] = MutableInventory
) -> tuple[MutableInventory, ResourceStore, blocks.NodeBlocks]:
    """PODS in an inventory, an empty store, and the blocks of a renderer over them."""
    inv = inventory()
    for namespace, name in PODS:
        inv.put_pod(pod_info(namespace, name, {}))
    store = ResourceStore(15.0, max_age=3600.0)
    return inv, store, blocks.NodeBlocks(render.ListRenderer(inv), prerender_within=prerender_within)


def items_by_pod(body: bytes) -> dict[tuple[str, str], dict]:
    items = orjson.loads(body)["items"]
    by_pod = {(i["metadata"].get("namespace", ""), i["metadata"]["name"]): i for i in items}
    assert len(by_pod) == len(items)  # each pod once
    return by_pod


async def test_a_list_during_a_cycle_serves_nodes_not_rendered_yet_as_of_their_previous_scrape():
    from _kube_helpers import eventually

    inv, store, renderer = await rendering_ahead_for(5.0)
    before = reference(store, inv, time.monotonic())[0]  # what the lists just served
    await asyncio.sleep(1.0)  # the next list 1 s after the last: rendering ahead goes on
    on_list, stood_in, ahead = rendered("on_list"), previous(), rendered("ahead")
    scrape_all(store, START + 30)  # no turn of the loop since: nothing rendered ahead yet
    during = await listed(renderer, store, gzipped=True)  # blocks compressed as they stand in
    assert during == before  # every node as of its previous scrape, nothing rendered by the list
    assert during != reference(store, inv, time.monotonic())[0]
    assert rendered("on_list") == on_list and previous() - stood_in == 3
    # the nodes it stood in for are rendered ahead, and the next list serves the newest scrape
    await eventually(lambda: rendered("ahead") - ahead == 3)
    after = await listed(renderer, store, gzipped=True)  # rendered ahead for gzipped lists: compressed
    assert after == reference(store, inv, time.monotonic())[0] and previous() - stood_in == 3
    spliced = [b.gz not in (None, blocks.NO_SPLICE) for b in renderer._blocks.values()]  # noqa: SLF001
    assert spliced and all(spliced)  # every block compressed, none refused


# Each changes PODS[0] or PODS[3] (n0's) after two scrapes of every node and two lists.


def moved(inv: MutableInventory, store: ResourceStore) -> None:
    """PODS[0] is recreated on n1 under the same name (a StatefulSet's), and n1's scrape carries
    it; n0's next scrape has not come. n0's block still holds it: standing in would list it twice."""
    store.store(scrape("n1", {1, 4, 7, 0}, 2, START + 30))


def relabelled(inv: MutableInventory, store: ResourceStore) -> None:
    scrape_all(store, START + 30)
    inv.put_pod(dataclasses.replace(inv.pod(*PODS[3]), labels={"app": "relabelled"}))


def deleted(inv: MutableInventory, store: ResourceStore) -> None:
    """PODS[3] is deleted: gone from the inventory, and n0's next scrape no longer carries it."""
    store.store(scrape("n0", {0, 6}, 2, START + 30))
    delete(inv, PODS[3])


def not_running(inv: MutableInventory, store: ResourceStore) -> None:
    """PODS[3] succeeded: still in the inventory and (for a last time) in n0's scrape."""
    scrape_all(store, START + 30)
    inv.put_pod(dataclasses.replace(inv.pod(*PODS[3]), phase="Succeeded"))


@pytest.mark.parametrize("change", [moved, relabelled, deleted, not_running])
@pytest.mark.parametrize("inventory", [MutableInventory, LoggedInventory])
async def test_a_block_does_not_stand_in_once_one_of_its_pods_moved_changed_or_left(change, inventory):
    inv, store, renderer = cluster(5.0, inventory)
    for t in (START, START + 15):
        scrape_all(store, t)
    for pause in (0.1, 0):
        await listed(renderer, store)
        await asyncio.sleep(pause)
    on_list = rendered("on_list")
    change(inv, store)
    got = items_by_pod(await listed(renderer, store))  # no turn of the loop since: nothing rendered ahead
    newest = items_by_pod(reference(store, inv, time.monotonic())[0])
    for key in PODS[0::3]:  # n0's pods: its block did not stand in, it was rendered again
        assert got.get(key) == newest.get(key)
    assert rendered("on_list") - on_list >= 1


def test_a_nodes_claims_change_when_a_pod_leaves_its_readings_or_it_is_stored_anew():
    """ResourceStore.node_claims, which the stand-in check compares instead of looking up each of a
    block's pods: the same while the node keeps or gains pods, new when one moves to another node's
    scrape or drops out of its own, and new for a node forgotten and stored again."""
    store = ResourceStore(15.0, max_age=3600.0)
    assert store.node_claims("n0") is None
    store.store(scrape("n0", {0, 1}, 1, START))
    store.store(scrape("n1", {3}, 1, START))
    seen = [store.node_claims("n0"), store.node_claims("n1")]
    assert None not in seen and seen[0] != seen[1]
    store.store(scrape("n0", {0, 1, 2}, 1, START + 15))  # a new scrape with a pod more
    store.store(scrape("n1", {3, 4}, 1, START + 15))
    assert [store.node_claims("n0"), store.node_claims("n1")] == seen
    store.store(scrape("n1", {3, 4, 2}, 1, START + 16))  # PODS[2] moved to n1's scrape
    assert store.node_claims("n0") not in seen and store.node_claims("n1") == seen[1]
    seen.append(store.node_claims("n0"))
    store.store(scrape("n0", {0}, 1, START + 30))  # PODS[1] left n0's scrape
    assert store.node_claims("n0") not in seen
    seen.append(store.node_claims("n0"))
    store.forget_node("n0")
    assert store.node_claims("n0") is None
    store.store(scrape("n0", {0}, 1, START + 45))
    assert store.node_claims("n0") not in seen


async def test_a_block_rendered_more_than_two_resolutions_ago_does_not_stand_in():
    inv, store, renderer = cluster(0.5)  # "a resolution" of 0.5 s
    assert blocks.STAND_IN_FOR == 2
    for t in (START, START + 15):
        scrape_all(store, t)
    for _ in range(4):  # lists 0.4 s apart, nothing scraped: the blocks rendered by the first stay
        await listed(renderer, store)
        await asyncio.sleep(0.4)
    on_list, stood_in = rendered("on_list"), previous()
    scrape_all(store, START + 30)
    assert await listed(renderer, store) == reference(store, inv, time.monotonic())[0]
    assert rendered("on_list") - on_list == 3 and previous() == stood_in


async def test_no_block_stands_in_once_rendering_ahead_has_run_its_time():
    """Rendering ahead's window ends up to PRERENDER_IDLE_PERIOD before its next step notices;
    a list in between renders the superseded blocks itself (nothing would replace a stand-in)."""
    inv, store, renderer = await rendering_ahead_for(5.0)
    assert renderer._prerender_handle is not None  # noqa: SLF001 - a step is still to come
    renderer._prerender_until = time.monotonic() - 1.0  # noqa: SLF001 - the window has just ended
    on_list, stood_in = rendered("on_list"), previous()
    scrape_all(store, START + 30)
    assert await listed(renderer, store) == reference(store, inv, time.monotonic())[0]
    assert rendered("on_list") - on_list == 3 and previous() == stood_in


async def test_a_node_with_no_pod_served_yet_is_rendered_by_the_list():
    """At start each node's first scrape gives no rate: its block is empty. The list after its
    second scrape renders it (its pods are served from then on) rather than serving it empty."""
    inv, store, renderer = cluster(5.0)
    scrape_all(store, START)
    for pause in (0.5, 0):  # rendering ahead on for the next second
        assert items_by_pod(await listed(renderer, store)) == {}
        await asyncio.sleep(pause)
    scrape_all(store, START + 15)
    body = await listed(renderer, store)
    assert body == reference(store, inv, time.monotonic())[0] and len(items_by_pod(body)) == len(PODS)


async def test_rendering_ahead_takes_smaller_steps_while_a_long_response_streams(monkeypatch):
    """A step renders nodes for PRERENDER_TURN_SECONDS, PRERENDER_STREAMING_TURN_SECONDS while a
    long response streams (the list's next chunk waits behind less), by the clock, not by pods:
    a node costs several times as much in a busy process as in a loop."""
    nodes = [f"s{i}" for i in range(40)]
    keys = {node: [("s", f"{node}-p{j}") for j in range(30)] for node in nodes}
    inv = MutableInventory()
    for node_keys in keys.values():
        for key in node_keys:
            inv.put_pod(pod_info(*key, {}))
    store = ResourceStore(15.0, max_age=3600.0)
    renderer = blocks.NodeBlocks(render.ListRenderer(inv), prerender_within=60.0)

    def scrape_every_node(t: float) -> None:
        for node, node_keys in keys.items():
            batch = scrape(node, set(), 1, t)
            for key in node_keys:
                batch.pods[key] = dict(scrape(node, {0}, 1, t).pods[PODS[0]])
            store.store(batch)

    for t in (START, START + 15):
        scrape_every_node(t)
    for pause in (0.5, 0):  # two lists 0.5 s apart: rendering ahead for the next second
        await listed(renderer, store)
        await asyncio.sleep(pause)
    renderer._prerender_handle.cancel()  # noqa: SLF001 - steps are run by hand below
    tick = 2.0**-13  # the step's clock moves this much at each look (a power of two: exact sums)
    clock = [0.0]

    def ticking() -> float:
        clock[0] += tick
        return clock[0]

    monkeypatch.setattr(blocks, "perf_counter", ticking)
    steps = {}
    for streams, t in ((0, START + 30), (1, START + 45)):
        monkeypatch.setattr(STREAMS, "count", streams)
        scrape_every_node(t)
        ahead = rendered("ahead")
        clock[0] = 0.0
        renderer._prerender_step()  # noqa: SLF001
        renderer._prerender_handle.cancel()  # noqa: SLF001
        steps[streams] = rendered("ahead") - ahead
        renderer._pending.clear()  # noqa: SLF001 - the next round starts from its own scrapes
    # a look at the clock before each node: as many nodes as whole ticks fit in the step's time
    within = {0: blocks.PRERENDER_TURN_SECONDS, 1: blocks.PRERENDER_STREAMING_TURN_SECONDS}
    assert steps == {s: int(within[s] / tick) for s in steps}, steps
    assert 0 < steps[1] < steps[0] < len(nodes)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations, st.booleans(), st.lists(st.booleans(), min_size=41, max_size=41))
def test_while_rendering_ahead_a_list_serves_each_pod_once_as_it_is_or_was_then_catches_up(
    ops, logged, turns
):
    """Any sequence of scrapes, inventory changes and lists, with rendering ahead on and the loop
    turning (or not) after each operation: every list serves each pod at most once, each item as
    the per-pod rules served it at some moment since the start (the newest, or an older scrape with
    the inventory's current metadata); once rendering ahead has caught up, exactly the newest."""
    clock = [time.monotonic()]  # NodeBlocks' clock: 5 s pass before each list
    lists = [0]

    async def run() -> None:
        inv = LoggedInventory() if logged else MutableInventory()
        for namespace, name in PODS:
            inv.put_pod(pod_info(namespace, name, {"app": "web"}))
        store = ResourceStore(15.0, max_age=3600.0)
        renderer = blocks.NodeBlocks(render.ListRenderer(inv), prerender_within=60.0)
        served: dict[tuple[str, str], set[bytes]] = {}  # every item the per-pod rules gave

        async def list_items() -> bytes:
            clock[0] += 5.0  # lists 5 s apart: rendering ahead stays on (for 10 s of this clock)
            lists[0] += 1  # every other list gzipped: blocks compressed ahead, on the list, or not
            return await listed(renderer, store, gzipped=lists[0] % 2 == 0)

        t = START
        for _ in range(2):
            await list_items()
        for op, turn in zip([*ops, ("list",)], turns, strict=False):
            if op[0] != "list":
                t = apply(op, store, inv, t)
            else:
                for key, item in items_by_pod(await list_items()).items():
                    pod = inv.pod(*key)
                    assert pod is not None and pod.phase == "Running"
                    assert item["metadata"].get("labels", {}) == pod.labels
                    assert orjson.dumps(item) in served.get(key, ())
            for key, item in items_by_pod(reference(store, inv, time.monotonic())[0]).items():
                served.setdefault(key, set()).add(orjson.dumps(item))
            if turn:
                await asyncio.sleep(0)  # a step of rendering ahead may run
        expected = reference(store, inv, time.monotonic())[0]
        for _ in range(100):
            if await list_items() == expected:
                break
            await asyncio.sleep(0.001)
        else:
            raise AssertionError("rendering ahead never caught up")
        assert renderer._prerender_handle is not None  # noqa: SLF001 - it was on throughout
        renderer._prerender_handle.cancel()  # noqa: SLF001

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(blocks, "time", SimpleNamespace(monotonic=lambda: clock[0]))
        mp.setattr(blocks, "PRERENDER_PERIOD", 0.0)  # a step every turn of the loop
        mp.setattr(blocks, "PRERENDER_IDLE_PERIOD", 0.001)
        asyncio.run(run())
