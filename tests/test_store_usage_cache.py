"""ResourceStore's per-pod usage cache: computed once per write of the pod's node, never served stale,
and made of objects the cyclic garbage collector does not have to scan.

The reference a cached read is compared with is metrics-server's rule computed here from the store's
own exported readings (:meth:`ResourceStore.export_nodes`), and a fresh store fed the same writes
and read only at the end (no cache to carry over).
"""

from __future__ import annotations

import dataclasses
import gc
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kcms.model import NodeBatch, ResourcePoint
from kcms.sources.bounds import MAX_NANOCORES
from kcms.store.resource import PodUsage, ResourceStore, Usage

KEY = ("team-a", "web-1")
OTHER = ("team-a", "web-2")


def batch(node: str, t: float, pods: dict, node_cpu_ns: int | None = None) -> NodeBatch:
    """``pods``: key -> container -> (start time, cumulative cpu ns, memory)."""
    b = NodeBatch(node)
    if node_cpu_ns is not None:
        b.node_point = ResourcePoint(0.0, t, node_cpu_ns, 1 << 30)
    for key, containers in pods.items():
        b.pods[key] = {c: ResourcePoint(start, t, cpu, mem) for c, (start, cpu, mem) in containers.items()}
    return b


def values(u: PodUsage | None):
    """Everything a PodUsage serves, as plain values."""
    if u is None:
        return None
    return (
        u.timestamp,
        u.window,
        [(c, x.timestamp, x.window, x.cpu_nanocores, x.memory) for c, x in u.containers],
    )


def two_scrapes(s: ResourceStore, node: str = "n1", pods: dict | None = None) -> None:
    pods = pods or {KEY: {"app": (100.0, 0, 4096), "proxy": (100.0, 0, 8192)}}
    s.store(batch(node, 1000.0, pods), received=0.0)
    later = {
        k: {c: (st_, cpu + 1_500_000_000, mem) for c, (st_, cpu, mem) in cs.items()} for k, cs in pods.items()
    }
    s.store(batch(node, 1015.0, later), received=15.0)


# ---- invalidation ---------------------------------------------------------------------------------


def test_cached_until_the_pods_node_is_written_again_then_recomputed_from_the_new_point():
    s = ResourceStore(15.0)
    two_scrapes(s)
    two_scrapes(s, node="n2", pods={OTHER: {"app": (100.0, 0, 1024)}})
    first = s.pod_usage(*KEY, now=15.0)
    assert values(first) == (
        1015.0,
        15.0,
        [("app", 1015.0, 15.0, 100_000_000, 4096), ("proxy", 1015.0, 15.0, 100_000_000, 8192)],
    )
    assert s.pod_usage(*KEY, now=16.0) is first  # no write since: the same object
    # Another node's write leaves this pod's cached usage alone.
    s.store(batch("n2", 1030.0, {OTHER: {"app": (100.0, 3_000_000_000, 1024)}}), received=30.0)
    assert s.pod_usage(*KEY, now=30.0) is first
    # A new point of the pod: recomputed, against the point before it.
    s.store(
        batch(
            "n1", 1030.0, {KEY: {"app": (100.0, 4_500_000_000, 4096), "proxy": (100.0, 1_800_000_000, 9000)}}
        ),
        received=30.0,
    )
    second = s.pod_usage(*KEY, now=30.0)
    assert second is not first
    assert values(second) == (
        1030.0,
        15.0,
        [("app", 1030.0, 15.0, 200_000_000, 4096), ("proxy", 1030.0, 15.0, 20_000_000, 9000)],
    )
    assert values(first)[2][0][3] == 100_000_000  # what a renderer still holds is not changed in place


def test_container_restart_invalidates_the_cached_usage():
    s = ResourceStore(15.0)
    two_scrapes(s)
    assert s.pod_usage(*KEY, now=15.0) is not None
    # "app" restarted 5 s before the reading (too recent for a rate from its start): no usage.
    s.store(
        batch(
            "n1", 1030.0, {KEY: {"app": (1025.0, 10_000_000, 4096), "proxy": (100.0, 3_000_000_000, 8192)}}
        ),
        received=30.0,
    )
    assert s.pod_usage(*KEY, now=30.0) is None
    assert s.pod_usage(*KEY, now=30.0) is None  # a cached "no usage" too
    # The next reading of the same start gives a rate again, from the restart's first reading.
    s.store(
        batch(
            "n1", 1045.0, {KEY: {"app": (1025.0, 760_000_000, 4096), "proxy": (100.0, 4_500_000_000, 8192)}}
        ),
        received=45.0,
    )
    assert values(s.pod_usage(*KEY, now=45.0)) == (
        1045.0,
        15.0,
        [("app", 1045.0, 15.0, 50_000_000, 4096), ("proxy", 1045.0, 15.0, 100_000_000, 8192)],
    )
    # Restarted 12 s before the reading: a rate from the start (a zero reading at start time).
    s.store(
        batch(
            "n1", 1060.0, {KEY: {"app": (1048.0, 1_200_000_000, 4096), "proxy": (100.0, 6_000_000_000, 8192)}}
        ),
        received=60.0,
    )
    restarted = s.pod_usage(*KEY, now=60.0)
    assert values(restarted) == (
        1060.0,
        12.0,
        [("app", 1060.0, 12.0, 100_000_000, 4096), ("proxy", 1060.0, 15.0, 100_000_000, 8192)],
    )


def test_pod_leaving_its_nodes_batch_or_moving_drops_the_cached_usage():
    s = ResourceStore(15.0)
    two_scrapes(s, pods={KEY: {"app": (100.0, 0, 4096)}, OTHER: {"app": (100.0, 0, 4096)}})
    assert s.pod_usage(*KEY, now=15.0) is not None
    # The next scrape of n1 no longer has KEY (deleted, or moved): not served from the cache.
    s.store(batch("n1", 1030.0, {OTHER: {"app": (100.0, 3_000_000_000, 4096)}}), received=30.0)
    assert s.pod_usage(*KEY, now=30.0) is None
    assert s.pod_node(*KEY) == ""
    assert values(s.pod_usage(*OTHER, now=30.0))[2][0][3] == 100_000_000
    # The same name shows up on n2 (a new pod of a StatefulSet): n2's readings, not n1's.
    two_scrapes(s, node="n2", pods={KEY: {"app": (900.0, 0, 2048)}})
    moved = s.pod_usage(*KEY, now=15.0)
    assert s.pod_node(*KEY) == "n2"
    assert values(moved) == (1015.0, 15.0, [("app", 1015.0, 15.0, 100_000_000, 2048)])


def test_expired_node_is_not_served_from_the_cache():
    s = ResourceStore(15.0, max_age=30.0)
    two_scrapes(s)
    cached = s.pod_usage(*KEY, now=15.0)
    assert cached is not None
    assert s.pod_usage(*KEY, now=45.0) is cached  # 30 s since the write: still within max_age
    assert s.pod_usage(*KEY, now=45.5) is None  # older than max_age: missing, not frozen
    assert s.expire(now=45.5) == ["n1"]
    assert s.pod_usage(*KEY, now=15.0) is None  # gone even for an earlier clock
    # Scraped again: one reading is no rate (the old pair went with the node).
    s.store(
        batch("n1", 1060.0, {KEY: {"app": (100.0, 9_000_000_000, 4096), "proxy": (100.0, 1, 1)}}),
        received=60.0,
    )
    assert s.pod_usage(*KEY, now=60.0) is None


def test_forgotten_node_and_merged_copies_invalidate():
    s = ResourceStore(15.0)
    two_scrapes(s)
    assert s.pod_usage(*KEY, now=15.0) is not None
    s.forget_node("n1")
    assert s.pod_usage(*KEY, now=15.0) is None
    # A replica's newer copy of the node replaces our (empty) readings and is computed afresh.
    peer = ResourceStore(15.0)
    two_scrapes(peer)
    peer.store(
        batch(
            "n1", 1030.0, {KEY: {"app": (100.0, 6_000_000_000, 4096), "proxy": (100.0, 3_000_000_000, 8192)}}
        ),
        received=30.0,
    )
    ((prev, last),) = peer.export_nodes()
    assert s.merge_node(prev, last)
    assert values(s.pod_usage(*KEY, now=30.0)) == values(peer.pod_usage(*KEY, now=30.0))


# ---- the objects: what the renderers and replicas rely on, and what GC has to scan ---------------


def test_usage_objects_are_untracked_and_keep_their_dataclass_face():
    s = ResourceStore(15.0)
    two_scrapes(s)
    pod = s.pod_usage(*KEY, now=15.0)
    assert pod is not None
    name, usage = pod.containers[0]
    assert name == "app" and isinstance(usage, Usage)
    assert not gc.is_tracked(pod) and not gc.is_tracked(usage)
    gc.collect(0)
    gc.collect(1)
    # a tuple of (str, untracked) tuples: untracked by the collector's young passes (the inner ones
    # at their first, the outer one at the next that sees it: a pass looks at it before its items)
    assert not gc.is_tracked(pod.containers) and not gc.is_tracked(pod.containers[0])
    # callers written for dataclasses keep working (a replica's snapshot, the renderer's tests)
    bumped = dataclasses.replace(usage, cpu_nanocores=usage.cpu_nanocores + 1)
    assert (bumped.cpu_nanocores, bumped.memory, bumped.window) == (100_000_001, 4096, 15.0)
    assert [f.name for f in dataclasses.fields(PodUsage)] == ["timestamp", "window", "containers"]
    assert dataclasses.asdict(usage) == {
        "timestamp": 1015.0,
        "window": 15.0,
        "cpu_nanocores": 100_000_000,
        "memory": 4096,
    }
    # equal by value (the renderer reuses a replica's rendering when equal), NaN by identity as before
    assert Usage(1.0, 2.0, 3, 4) == Usage(1.0, 2.0, 3, 4) and Usage(1.0, 2.0, 3, 4) != Usage(1.0, 2.0, 3, 5)
    nan = math.nan
    assert Usage(nan, 1.0, 1, 1) == Usage(nan, 1.0, 1, 1)
    assert PodUsage(1.0, 2.0, [("c", Usage(1.0, 2.0, 3, 4))]) == PodUsage(
        1.0, 2.0, [("c", Usage(1.0, 2.0, 3, 4))]
    )
    assert repr(usage) == "Usage(timestamp=1015.0, window=15.0, cpu_nanocores=100000000, memory=4096)"


def test_reading_many_pods_leaves_nothing_for_the_collector_to_scan():
    """Every pod's usage held (as the list renderer's cache holds it) after the young collections:
    the number of tracked objects has not grown with the pods (it grew by ~6 per pod before, and
    full collections then scanned them all)."""
    s = ResourceStore(15.0)
    pods = {("ns", f"p{i}"): {"app": (100.0, i, 4096), "proxy": (100.0, 2 * i, 8192)} for i in range(3000)}
    two_scrapes(s, pods=pods)
    keys = list(pods)
    gc.collect()
    before = len(gc.get_objects())
    held = [s.pod_usage(ns, name, now=15.0) for ns, name in keys]
    assert all(u is not None for u in held)
    gc.collect(0)
    gc.collect(1)
    # Young passes leave only the containers tuples a pass saw together with their items (about
    # one in ten, promoted while still tracked); ~18 000 objects here before.
    young = len(gc.get_objects()) - before
    assert young < len(keys) // 4, young
    gc.collect()  # a full pass untracks those too: nothing per pod is left to scan
    assert len(gc.get_objects()) - before < 100


# ---- property: the cached path equals a fresh computation --------------------------------------

NODES = ("n1", "n2")
PODS = (("a", "p0"), ("a", "p1"), ("b", "p0"))
CONTAINERS = ("app", "proxy")

container_reading = st.tuples(
    st.sampled_from([100.0, 100.0, 100.0, 990.0]),  # start time: mostly the same; a restart
    st.sampled_from([0, 1, 1, 1, -1]),  # counter direction: up, or backwards (a reset)
    st.integers(0, 4 * 10**9),  # delta of the counter
    st.integers(0, 2**40),  # memory
)
write = st.tuples(
    st.just("write"),
    st.sampled_from(NODES),
    st.sampled_from([-5.0, 0.0, 7.0, 15.0, 15.0, 30.0]),  # timestamp step (older, same, newer)
    st.dictionaries(
        st.sampled_from(PODS),
        st.dictionaries(st.sampled_from(CONTAINERS), container_reading, min_size=1),
        max_size=3,
    ),
)
read = st.tuples(st.just("read"), st.sampled_from(PODS), st.sampled_from([0.0, 10.0, 40.0]))
expire = st.tuples(st.just("expire"), st.sampled_from([0.0, 40.0]))
steps = st.lists(st.one_of(write, write, read, read, expire), max_size=30)


def reference(s: ResourceStore, key: tuple[str, str]):
    """metrics-server's pod usage from the store's exported readings (the pre-cache computation)."""
    node = s.pod_node(*key)
    pairs = {last.node: (prev, last) for prev, last in s.export_nodes()}.get(node)
    if pairs is None or key not in pairs[1].pods:
        return None
    prev_b, last_b = pairs
    out = []
    ts = window = 0.0
    for c, last in last_b.pods[key].items():
        prev = prev_b.pods.get(key, {}).get(c)
        if prev is None:
            return None
        w = last.timestamp - prev.timestamp
        if w <= 0 or last.cpu_ns < prev.cpu_ns:
            return None
        rate = (last.cpu_ns - prev.cpu_ns) / w
        if rate > MAX_NANOCORES:
            return None
        out.append((c, last.timestamp, w, int(rate), last.memory))
        if ts == 0.0 or last.timestamp < ts:
            ts, window = last.timestamp, w
    return (ts, window, out) if out else None


@settings(max_examples=300, deadline=None)
@given(steps)
def test_cached_reads_equal_a_fresh_computation(ops):
    s = ResourceStore(15.0, max_age=35.0)
    done: list = []  # the writes and expiries so far, replayed into a fresh store at each read
    clock = 0.0  # monotonic receive time
    t = {n: 1000.0 for n in NODES}  # each node's kubelet clock
    cpu: dict = {}
    received: dict = {}  # node -> receive time of its last write
    for op in ops:
        if op[0] == "write":
            _, node, step, pods = op
            t[node] += step
            clock += 5.0
            readings = {}
            for key, containers in pods.items():
                readings[key] = {}
                for c, (start, sign, delta, mem) in containers.items():
                    value = max(0, cpu.get((key, c), 10**9) + sign * delta)
                    cpu[(key, c)] = value
                    readings[key][c] = (start, value, mem)
            b = batch(node, t[node], readings, node_cpu_ns=int(t[node] * 1e9))
            s.store(b, received=clock)
            received[node] = clock
            done.append(("write", batch(node, t[node], readings, node_cpu_ns=int(t[node] * 1e9)), clock))
        elif op[0] == "expire":
            s.expire(now=clock + op[1])
            done.append(("expire", clock + op[1]))
        else:
            _, key, ahead = op
            now = clock + ahead
            got = s.pod_usage(*key, now=now)
            assert s.pod_usage(*key, now=now) is got  # a second read is the cached object
            fresh = ResourceStore(15.0, max_age=35.0)
            for d in done:
                if d[0] == "write":
                    fresh.store(d[1], received=d[2])
                else:
                    fresh.expire(now=d[1])
            assert values(got) == values(fresh.pod_usage(*key, now=now))
            node = s.pod_node(*key)
            fresh_node = node != "" and now - received[node] <= 35.0
            assert values(got) == (reference(s, key) if fresh_node else None)
