"""HistoryStore (kcms/store/history.py) fed through ResourceStore.store, as in `kcms standalone`:
retention and eviction boundaries, restarts, alignment, bounds per object, and the same rates as
the resource store serves."""

from __future__ import annotations

import gc
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcms.model import NodeBatch, ResourcePoint
from kcms.store.history import HistoryStore
from kcms.store.resource import ResourceStore

GiB = 1024**3
T0 = 1_700_000_000.0  # kubelet clock (epoch seconds) of the first scrape


def batch(node: str, t: float, node_cpu_s: float | None, pods: dict | None = None) -> NodeBatch:
    """pods: {(ns, name): {container: (start_time, cpu_seconds, memory)}}"""
    b = NodeBatch(node)
    if node_cpu_s is not None:
        b.node_point = ResourcePoint(0.0, t, int(node_cpu_s * 1e9), 2 * GiB)
    for key, containers in (pods or {}).items():
        b.pods[key] = {
            name: ResourcePoint(start, t, int(cpu_s * 1e9), mem)
            for name, (start, cpu_s, mem) in containers.items()
        }
    return b


def stores(retention: float = 600.0, resolution: float = 15.0) -> tuple[ResourceStore, HistoryStore]:
    store = ResourceStore(resolution)
    store.history = HistoryStore(retention, resolution)
    return store, store.history


def pod(cpu_s: float, mem: int = 100 * 2**20, start: float = 1.0) -> dict:
    return {("ns", "p"): {"c": (start, cpu_s, mem)}}


def test_points_are_rates_oldest_first_with_shared_timestamps():
    store, h = stores()
    for i in range(4):
        t = T0 + 15 * i
        pods = {("ns", "p"): {"a": (1.0, 1.5 * i, 10 * 2**20), "b": (1.0, 0.75 * i, 20 * 2**20)}}
        store.store(batch("n1", t, 2.0 * i, pods))
    now = T0 + 45
    nodes = h.node_points("n1", h.since(None, now))
    # the first reading of a node gives no rate: three points, 2 cores each
    assert [(ts, cpu) for ts, cpu, _ in nodes] == [(T0 + 15 * i, 133_333_333) for i in (1, 2, 3)]
    names, points = h.pod_points("ns", "p", h.since(None, now))
    assert names == ("a", "b")
    assert [ts for ts, _ in points] == [T0 + 15, T0 + 30, T0 + 45]
    for _, values in points:
        assert values == [(100_000_000, 10 * 2**20), (50_000_000, 20 * 2**20)]


def test_node_rate_value():
    store, h = stores()
    store.store(batch("n1", T0, 100.0))
    store.store(batch("n1", T0 + 15, 103.0))
    assert h.node_points("n1", 0.0) == [(T0 + 15, 200_000_000, 2 * GiB)]


def test_retention_boundary_exactly_at_history_is_kept_older_is_not():
    store, h = stores(retention=60.0)
    for i in range(6):
        store.store(batch("n1", T0 + 15 * i, 1.0 * i, pod(0.5 * i)))
    newest = T0 + 75
    # a point exactly --history old is still served; a hair older is not
    now = T0 + 15 + 60.0
    assert [p[0] for p in h.node_points("n1", h.since(None, now))] == [T0 + 15 * i for i in range(1, 6)]
    assert [p[0] for p in h.pod_points("ns", "p", h.since(None, now))[1]] == [
        T0 + 15 * i for i in range(1, 6)
    ]
    now = T0 + 15 + 60.001
    assert [p[0] for p in h.node_points("n1", h.since(None, now))] == [T0 + 15 * i for i in range(2, 6)]
    # since: the same boundary rule, and never beyond --history
    assert [p[0] for p in h.node_points("n1", h.since(30.0, newest))] == [T0 + 45, T0 + 60, T0 + 75]
    assert h.since(10**9, newest) == h.since(None, newest) == newest - 60.0


def test_node_expires_when_its_newest_point_is_older_than_history():
    store, h = stores(retention=60.0)
    store.store(batch("n1", T0, 1.0, pod(0.1)))
    store.store(batch("n1", T0 + 15, 2.0, pod(0.2)))
    assert h.expire(now=T0 + 15 + 60.0) == []  # exactly at the boundary: kept
    assert h.node_names() == ["n1"]
    assert h.expire(now=T0 + 15 + 60.5) == ["n1"]
    assert h.node_names() == [] and h.pod_node("ns", "p") == ""
    assert h.node_points("n1", 0.0) == [] and h.pod_points("ns", "p", 0.0) == ((), [])


def test_node_gone_from_the_inventory_is_dropped_at_once():
    store, h = stores()
    for i in range(3):
        store.store(batch("n1", T0 + 15 * i, 1.0 * i, pod(0.1 * i)))
        store.store(batch("n2", T0 + 15 * i, 1.0 * i, {("ns", "q"): {"c": (1.0, 0.1 * i, 1)}}))
    assert h.expire(now=T0 + 30, present=lambda n: n == "n2") == ["n1"]
    assert h.node_names() == ["n2"]
    assert h.pod_points("ns", "p", 0.0) == ((), []) and h.pod_points("ns", "q", 0.0)[1]


def test_deleted_pod_is_dropped_with_its_history_others_kept():
    store, h = stores()
    two = {("ns", "p"): {"c": (1.0, 0.0, 1)}, ("ns", "q"): {"c": (1.0, 0.0, 1)}}
    store.store(batch("n1", T0, 1.0, two))
    two = {("ns", "p"): {"c": (1.0, 1.0, 1)}, ("ns", "q"): {"c": (1.0, 1.0, 1)}}
    store.store(batch("n1", T0 + 15, 2.0, two))
    assert h.pod_points("ns", "p", 0.0)[1] and h.pod_points("ns", "q", 0.0)[1]
    store.store(batch("n1", T0 + 30, 3.0, {("ns", "q"): {"c": (1.0, 2.0, 1)}}))
    assert h.pod_points("ns", "p", 0.0) == ((), []) and h.pod_node("ns", "p") == ""
    assert len(h.pod_points("ns", "q", 0.0)[1]) == 2
    assert len(h.node_points("n1", 0.0)) == 2
    assert h.stats()[1] == 1


def test_pod_moved_to_another_node_follows_it():
    store, h = stores()
    store.store(batch("n1", T0, 1.0, pod(0.0)))
    store.store(batch("n1", T0 + 15, 2.0, pod(1.0)))
    store.store(batch("n2", T0 + 16, 1.0, pod(0.0, start=T0 + 10)))
    store.store(batch("n1", T0 + 30, 3.0, {}))  # n1 no longer has it: must not forget n2's
    assert h.pod_node("ns", "p") == "n2"
    store.store(batch("n2", T0 + 31, 2.0, pod(1.5, start=T0 + 10)))
    assert [ts for ts, _ in h.pod_points("ns", "p", 0.0)[1]] == [T0 + 31]


def test_counter_restart_gives_no_point_then_rates_again():
    store, h = stores()
    store.store(batch("n1", T0, 10.0, pod(100.0, start=1.0)))
    store.store(batch("n1", T0 + 15, 11.0, pod(101.5, start=1.0)))
    # the container restarted 5 s before the reading (too recent for a rate from its start time):
    # its counter starts again from ~0
    store.store(batch("n1", T0 + 30, 12.0, pod(0.2, start=T0 + 25)))
    store.store(batch("n1", T0 + 45, 13.0, pod(1.7, start=T0 + 25)))
    points = h.pod_points("ns", "p", 0.0)[1]
    assert [ts for ts, _ in points] == [T0 + 15, T0 + 45]  # none at the restart: no negative, no jump
    assert [v[0][0] for _, v in points] == [100_000_000, 100_000_000]
    # a counter that went down within one start: a new base, never a negative rate
    store.store(batch("n1", T0 + 60, 14.0, pod(0.5, start=T0 + 25)))
    assert [ts for ts, _ in h.pod_points("ns", "p", 0.0)[1]] == [T0 + 15, T0 + 45]
    assert all(cpu >= 0 for _, cpu, _ in h.node_points("n1", 0.0))


def test_same_reading_again_adds_no_point():
    store, h = stores()
    store.store(batch("n1", T0, 1.0, pod(0.0)))
    store.store(batch("n1", T0 + 15, 2.0, pod(1.0)))
    store.store(batch("n1", T0 + 15, 2.0, pod(1.0)))  # the kubelet had nothing new
    store.store(batch("n1", T0 + 10, 2.0, pod(1.0)))  # or answered with an older reading
    assert len(h.node_points("n1", 0.0)) == 1 and len(h.pod_points("ns", "p", 0.0)[1]) == 1


def test_new_container_aligns_from_its_first_rate():
    store, h = stores()
    store.store(batch("n1", T0, 1.0, {("ns", "p"): {"a": (1.0, 0.0, 1)}}))
    store.store(batch("n1", T0 + 15, 2.0, {("ns", "p"): {"a": (1.0, 1.0, 1)}}))
    both = {("ns", "p"): {"a": (1.0, 2.0, 1), "b": (1.0, 5.0, 2)}}
    store.store(batch("n1", T0 + 30, 3.0, both))  # b's first reading: no rate yet
    both = {("ns", "p"): {"a": (1.0, 3.0, 1), "b": (1.0, 6.5, 2)}}
    store.store(batch("n1", T0 + 45, 4.0, both))
    names, points = h.pod_points("ns", "p", 0.0)
    assert names == ("a", "b")
    # a pod's points are where every container has one: aligned, as metrics-server serves a pod
    assert [(ts, len(v)) for ts, v in points] == [(T0 + 45, 2)]
    assert points[0][1] == [(66_666_666, 1), (100_000_000, 2)]
    # b goes away again: a's history is kept, b's column dropped
    store.store(batch("n1", T0 + 60, 5.0, {("ns", "p"): {"a": (1.0, 4.0, 1)}}))
    names, points = h.pod_points("ns", "p", 0.0)
    assert names == ("a",) and [ts for ts, _ in points] == [T0 + 15, T0 + 30, T0 + 45, T0 + 60]


def test_refused_readings_are_not_recorded():
    store, h = stores()
    store.store(batch("n1", T0, 1.0, pod(0.0)))
    store.store(batch("n1", T0 + 15, 2.0, pod(1.0)))
    # a counter jump that would be an absurd rate, and a negative memory reading (screened out)
    store.store(batch("n1", T0 + 30, 3.0, pod(1e9)))
    bad = batch("n1", T0 + 45, 4.0, {("ns", "p"): {"c": (1.0, 1e9 + 1, -5)}})
    store.store(bad)
    assert all(cpu <= 10**12 for _, values in h.pod_points("ns", "p", 0.0)[1] for cpu, _ in values)
    assert all(mem >= 0 for _, values in h.pod_points("ns", "p", 0.0)[1] for _, mem in values)


def test_points_per_object_are_bounded_whatever_the_scrape_rate():
    store, h = stores(retention=600.0, resolution=15.0)
    assert h.capacity == 42
    pods = 5
    for i in range(2000):  # scraped every second: 33 times the resolution
        t = T0 + i
        store.store(
            batch("n1", t, float(i), {("ns", f"p{k}"): {"c": (1.0, 0.1 * i, 1)} for k in range(pods)})
        )
    nodes, kept_pods, slots = h.stats()
    assert (nodes, kept_pods) == (1, pods)
    assert slots <= h.capacity * (1 + pods)
    assert len(h.node_points("n1", 0.0)) <= h.capacity
    assert len(h.pod_points("ns", "p0", 0.0)[1]) <= h.capacity
    # all served points are recent (the ring overwrote the rest)
    assert h.node_points("n1", 0.0)[0][0] >= T0 + 2000 - h.capacity


def test_pod_records_are_not_tracked_by_the_cyclic_gc():
    """Full collections must not visit the pods' history: bytearrays and tuples of strings only (the
    few per-node objects are tracked)."""
    store, h = stores()
    for i in range(3):
        store.store(batch("n1", T0 + 15 * i, 1.0 * i, pod(0.1 * i)))
    gc.collect()
    gc.collect()  # a tuple is untracked once its contents are: the names tuple first, then the record
    node = h._nodes["n1"]
    assert node.pods and not gc.is_tracked(node.data)
    for rec in node.pods.values():
        assert not gc.is_tracked(rec)


def test_columns_are_written_in_the_order_of_the_rows():
    """record_columns() on rows laid out by record() with the pods in another order than the
    decoder's: each container's rate and memory land in its own column."""
    from kcms.model import ContainerColumns
    from kcms.sources.decode_reuse import pod_places

    h = HistoryStore(600.0, 15.0)
    # the series in the body's order: a/c1, b/c1, a/c2 (pod order a: c1, c2; then b: c1)
    places = pod_places("sig", ["ns"] * 3, ["a", "b", "a"], ["c1", "c1", "c2"])
    assert places is not None

    def point(t: float, cpu_ns: int, memory: int) -> ResourcePoint:
        return ResourcePoint(1.0, t, cpu_ns, memory)

    token = object()
    first = {  # pod b first
        ("ns", "b"): {"c1": (point(T0, 0, 10), None)},
        ("ns", "a"): {"c1": (point(T0, 0, 20), None), "c2": (point(T0, 0, 30), None)},
    }
    h.record("n1", None, None, first, token)
    t = T0 + 15
    cpu_ns = [15 * 10**9, 30 * 10**9, 45 * 10**9]  # body order: a/c1, b/c1, a/c2
    memory = [21, 11, 31]
    columns = ContainerColumns("sig", [1.0] * 3, [t] * 3, cpu_ns, memory, places)
    readings = tuple(point(t, cpu_ns[i], memory[i]) for i in (0, 2, 1))  # pod order
    assert columns.readings == readings
    rates = ([10**9, 2 * 10**9, 3 * 10**9], True)  # body order, as column_rates gives them
    assert h.record_columns("n1", None, None, token, columns, rates)
    assert not h.record_columns("n1", None, None, token, columns, (rates[0], False))  # over the bound
    assert h.pod_points("ns", "a", 0.0) == (("c1", "c2"), [(t, [(10**9, 21), (3 * 10**9, 31)])])
    assert h.pod_points("ns", "b", 0.0) == (("c1",), [(t, [(2 * 10**9, 11)])])
    # The same scrape written by Python (C's put_row declines a tuple column): the same rows.
    again = HistoryStore(600.0, 15.0)
    again.record("n1", None, None, first, token)
    python_columns = ContainerColumns("sig", [1.0] * 3, [t] * 3, cpu_ns, tuple(memory), places)
    assert again.record_columns("n1", None, None, token, python_columns, rates)
    assert bytes(again._nodes["n1"].data) == bytes(h._nodes["n1"].data)
    # An order of another width than the rows' is never written by C (it would write from the
    # row's start past its width): Python's slice stores refuse it, as they always did.
    h._nodes["n1"].order = (0, 2)
    later = ContainerColumns("sig", [1.0] * 3, [t + 15] * 3, cpu_ns, memory, places)
    with pytest.raises(ValueError):
        h.record_columns("n1", None, None, token, later, rates)


def test_bad_construction_refused():
    for retention, resolution in ((0, 15), (600, 0), (-1, 15), (math.nan, 15)):
        with pytest.raises(ValueError):
            HistoryStore(retention, resolution)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_property_history_equals_what_the_resource_store_served(data):
    """At every scrape the newest history point of each pod is exactly the usage the resource store
    serves then (rate, memory, and no point when it serves none); history holds at most capacity."""
    rnd = random.Random(data.draw(st.integers(0, 10**6)))
    store, h = stores(retention=120.0, resolution=15.0)
    cpu = {c: 0.0 for c in ("a", "b")}
    start = {c: 1.0 for c in cpu}
    t = T0
    for step in range(data.draw(st.integers(2, 25))):
        before = t
        t += rnd.choice((0.0, 2.0, 15.0, 15.0, 16.5))
        for c in cpu:
            event = rnd.random()
            if event < 0.1:  # restart
                start[c], cpu[c] = t - 1, 0.01
            elif event < 0.15:  # counter backwards
                cpu[c] = max(0.0, cpu[c] - 1)
            else:
                cpu[c] += rnd.uniform(0, 4)
        pods = {("ns", "p"): {c: (start[c], cpu[c], 2**20 * (step + 1)) for c in cpu}}
        store.store(batch("n1", t, None, pods))
        served = store.pod_usage("ns", "p", now=0.0)
        names, points = h.pod_points("ns", "p", 0.0)
        newest = points[-1] if points else None
        assert len(points) <= h.capacity
        if t == before:
            continue  # a reading no newer than the last adds no point (test_same_reading_again...)
        if served is not None and newest is not None and newest[0] == t:
            assert names == tuple(n for n, _ in served.containers)
            assert newest[1] == [(u.cpu_nanocores, u.memory) for _, u in served.containers]
        elif newest is not None and newest[0] == t:
            pytest.fail("history has a point where the store serves none")
        elif served is not None and served.timestamp == t:
            pytest.fail("the store serves a new usage the history has no point for")
