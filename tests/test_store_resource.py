"""ResourceStore: metrics-server's last/previous semantics, restarts, staleness."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from kcms.model import NodeBatch, ResourcePoint
from kcms.store.resource import ResourceStore

GiB = 1024**3


def batch(node: str, t: float, node_cpu_s: float | None, pods: dict | None = None) -> NodeBatch:
    b = NodeBatch(node)
    if node_cpu_s is not None:
        b.node_point = ResourcePoint(0.0, t, int(node_cpu_s * 1e9), 2 * GiB)
    for key, containers in (pods or {}).items():
        b.pods[key] = {
            name: ResourcePoint(start, t, int(cpu_s * 1e9), mem)
            for name, (start, cpu_s, mem) in containers.items()
        }
    return b


def test_node_rate_is_delta_over_window():
    s = ResourceStore(15.0)
    s.store(batch("n1", 1000.0, 100.0), received=0.0)
    assert s.node_usage("n1", now=0.0) is None  # one reading: no rate yet
    assert not s.ready()
    s.store(batch("n1", 1015.0, 103.0), received=15.0)
    u = s.node_usage("n1", now=15.0)
    assert u is not None
    assert u.window == 15.0
    assert u.cpu_nanocores == 200_000_000  # 3 core-seconds over 15 s
    assert u.memory == 2 * GiB
    assert u.timestamp == 1015.0


def test_repeated_reading_keeps_previous_pair():
    s = ResourceStore(15.0)
    s.store(batch("n1", 1000.0, 100.0), received=0.0)
    s.store(batch("n1", 1015.0, 103.0), received=15.0)
    # The kubelet had nothing new: same timestamp again. The rate stays the earlier one.
    s.store(batch("n1", 1015.0, 103.0), received=30.0)
    u = s.node_usage("n1", now=30.0)
    assert u is not None and u.window == 15.0 and u.cpu_nanocores == 200_000_000


def test_container_restart_never_gives_negative_or_inflated_rate():
    s = ResourceStore(15.0)
    key = ("default", "web")
    s.store(batch("n1", 1000.0, 1.0, {key: {"app": (500.0, 50.0, 4096)}}), received=0.0)
    s.store(batch("n1", 1015.0, 2.0, {key: {"app": (500.0, 51.5, 4096)}}), received=15.0)
    p = s.pod_usage(*key, now=15.0)
    assert p is not None and p.containers[0][1].cpu_nanocores == 100_000_000
    # Restarted long ago enough: new start time, counter back near zero.
    s.store(batch("n1", 1030.0, 3.0, {key: {"app": (1000.0, 0.5, 4096)}}), received=30.0)
    assert s.pod_usage(*key, now=30.0) is None  # no pair of the same start yet
    s.store(batch("n1", 1045.0, 4.0, {key: {"app": (1000.0, 2.0, 4096)}}), received=45.0)
    p = s.pod_usage(*key, now=45.0)
    assert p is not None and p.containers[0][1].cpu_nanocores == 100_000_000


def test_counter_reset_with_same_start_is_not_served():
    s = ResourceStore(15.0)
    key = ("default", "web")
    s.store(batch("n1", 1000.0, 1.0, {key: {"app": (500.0, 50.0, 4096)}}), received=0.0)
    s.store(batch("n1", 1015.0, 2.0, {key: {"app": (500.0, 10.0, 4096)}}), received=15.0)
    assert s.pod_usage(*key, now=15.0) is None


def test_counter_backwards_and_absurd_rates_are_counted_and_never_served():
    from prometheus_client import REGISTRY

    def refused(reason: str) -> float:
        return REGISTRY.get_sample_value("kcms_store_refused_readings_total", {"reason": reason}) or 0.0

    before = {r: refused(r) for r in ("counter_backwards", "absurd_rate")}
    s = ResourceStore(15.0)
    back, jump, ok = ("d", "back"), ("d", "jump"), ("d", "ok")
    s.store(batch("n1", 1000.0, 1.0, {back: {"a": (500.0, 50.0, 4096)}, jump: {"a": (500.0, 1.0, 4096)}}))
    # 1e7 core-seconds in 15 s (~7e5 cores) is under the bound; 1e8 (~7e6 cores) is not
    s.store(batch("n1", 1015.0, 2.0, {back: {"a": (500.0, 49.0, 4096)}, jump: {"a": (500.0, 1e8, 4096)}}))
    assert s.pod_usage(*back) is None and s.pod_usage(*jump) is None
    assert refused("counter_backwards") - before["counter_backwards"] == 1
    assert refused("absurd_rate") - before["absurd_rate"] == 1
    # both are new bases: the next honest reading gives a rate again
    s.store(
        batch("n1", 1030.0, 3.0, {back: {"a": (500.0, 50.0, 4096)}, jump: {"a": (500.0, 1e8 + 15, 4096)}})
    )
    assert s.pod_usage(*back).containers[0][1].cpu_nanocores == 66_666_666
    assert s.pod_usage(*jump).containers[0][1].cpu_nanocores == 1_000_000_000
    s.store(batch("n1", 1045.0, 4.0, {ok: {"a": (500.0, 1e7, 4096)}}))  # first reading, then +1e7 core-s
    s.store(batch("n1", 1060.0, 5.0, {ok: {"a": (500.0, 2e7, 4096)}}))
    assert s.pod_usage(*ok).containers[0][1].cpu_nanocores == 10**16 // 15  # ~6.7e5 cores: served


def test_fresh_container_is_served_after_one_reading():
    s = ResourceStore(15.0)
    key = ("default", "new")
    # started 12 s before its first reading, used 1.2 core-seconds since: 0.1 cores.
    s.store(batch("n1", 1012.0, 1.0, {key: {"app": (1000.0, 1.2, 8192)}}), received=0.0)
    p = s.pod_usage(*key, now=0.0)
    assert p is not None
    assert p.window == 12.0
    assert p.containers[0][1].cpu_nanocores == 100_000_000
    # Too young (under 10 s): not served from a single reading.
    s.store(batch("n2", 1012.0, 1.0, {("default", "newer"): {"app": (1005.0, 0.7, 8192)}}), received=0.0)
    assert s.pod_usage("default", "newer", now=0.0) is None


def test_pod_needs_every_container():
    s = ResourceStore(15.0)
    key = ("default", "two")
    s.store(batch("n1", 1000.0, 1.0, {key: {"a": (1.0, 1.0, 4096)}}), received=0.0)
    s.store(batch("n1", 1015.0, 2.0, {key: {"a": (1.0, 2.0, 4096), "b": (1.0, 1.0, 4096)}}), received=15.0)
    assert s.pod_usage(*key, now=15.0) is None  # b has one reading only
    s.store(batch("n1", 1030.0, 3.0, {key: {"a": (1.0, 3.0, 4096), "b": (1.0, 1.5, 4096)}}), received=30.0)
    p = s.pod_usage(*key, now=30.0)
    assert p is not None and [c for c, _ in p.containers] == ["a", "b"]


def test_readiness_probes_compute_no_pod_before_a_rate_can_be_taken():
    # /readyz is open to any client and asks ready() each time: with one reading of everything
    # (the first scrape cycle) it must answer without computing (and caching) a pod's usage.
    s = ResourceStore(15.0)
    now = time.monotonic()
    one = {("ns", f"a{i}"): {"app": (1.0, 1.0, 4096)} for i in range(40)}
    other = {("ns", f"b{i}"): {"app": (1.0, 1.0, 4096), "side": (1.0, 0.5, 4096)} for i in range(40)}
    s.store(batch("n1", 1000.0, 1.0, one), received=now)
    s.store(batch("n2", 1000.0, None, other), received=now)
    for _ in range(3):
        assert not s.ready()
    assert [entry.usage for entry in s._nodes.values()] == [{}, {}]


def test_ready_once_a_pod_can_be_served_and_from_then_on():
    s = ResourceStore(15.0)
    key = ("default", "web")
    t = time.monotonic()
    # readings with a pair, but older than max_age: nothing can be served
    s.store(batch("n1", 900.0, None, {key: {"app": (1.0, 0.5, 4096)}}), received=t - 100)
    s.store(batch("n1", 915.0, None, {key: {"app": (1.0, 0.6, 4096)}}), received=t - 85)
    assert not s.ready()
    # no node reading at all (a kubelet without the node lines): a pod is enough
    s.store(batch("n1", 1000.0, None, {key: {"app": (1.0, 1.0, 4096)}}), received=t - 15)
    s.store(batch("n1", 1015.0, None, {key: {"app": (1.0, 2.0, 4096)}}), received=t)
    assert s.node_usage("n1") is None and s.pod_usage(*key) is not None
    assert s.ready()
    # as metrics-server's storage: ready from then on, even once everything has aged out
    assert s.expire(now=t + 100) == ["n1"]
    assert s.ready()


def test_silent_node_ages_out_and_is_never_frozen():
    s = ResourceStore(15.0)  # max_age defaults to two resolutions
    key = ("default", "web")
    s.store(batch("n1", 1000.0, 1.0, {key: {"app": (1.0, 1.0, 4096)}}), received=0.0)
    s.store(batch("n1", 1015.0, 2.0, {key: {"app": (1.0, 2.0, 4096)}}), received=15.0)
    assert s.node_usage("n1", now=40.0) is not None
    assert s.node_usage("n1", now=46.0) is None  # older than 30 s: not served even before GC
    assert s.pod_usage(*key, now=46.0) is None
    assert s.expire(now=46.0) == ["n1"]
    assert s.stats() == (0, 0, 0)


def test_pod_leaving_a_node_is_forgotten_and_can_move():
    s = ResourceStore(15.0)
    key = ("default", "web")
    s.store(batch("n1", 1000.0, 1.0, {key: {"app": (1.0, 1.0, 4096)}}), received=0.0)
    s.store(batch("n1", 1015.0, 2.0, {}), received=15.0)
    assert s.pod_usage(*key, now=15.0) is None
    s.store(batch("n2", 1015.0, 2.0, {key: {"app": (1.0, 1.0, 4096)}}), received=15.0)
    s.store(batch("n2", 1030.0, 3.0, {key: {"app": (1.0, 2.5, 4096)}}), received=30.0)
    s.store(batch("n1", 1030.0, 3.0, {}), received=30.0)  # n1 must not take the pod away from n2
    p = s.pod_usage(*key, now=30.0)
    assert p is not None and p.containers[0][1].cpu_nanocores == 100_000_000


segments = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=8.0, allow_nan=False),  # true rate, cores
        st.integers(min_value=1, max_value=6),  # readings in this container start
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(segments, st.floats(min_value=1.0, max_value=60.0))
def test_served_rate_is_a_true_rate_across_restarts(segs, step):
    """Whatever restarts happen, a served rate is the true rate of the current start, never more."""
    s = ResourceStore(15.0)
    key = ("ns", "p")
    t = 10_000.0
    for rate, readings in segs:
        start = t - 50.0  # a distinct start time per segment (t only grows), well in the past
        for _ in range(readings):
            cpu = rate * (t - start)
            s.store(batch("n", t, None, {key: {"c": (start, cpu, 4096)}}), received=0.0)
            p = s.pod_usage(*key, now=0.0)
            if p is not None:
                got = p.containers[0][1].cpu_nanocores
                assert p.window > 0
                assert abs(got - rate * 1e9) <= 2 + rate * 1e9 * 1e-9
            t += step


def test_go_duration_matches_go_formatting():
    from kcms.apis.metrics.convert import go_duration

    assert go_duration(15.0) == "15s"
    assert go_duration(2.006000042) == "2.006s"
    assert go_duration(0.0) == "0s"
    assert go_duration(0.5) == "500ms"
    assert go_duration(0.0015) == "1.5ms"
    assert go_duration(60.0) == "1m0s"
    assert go_duration(90.25) == "1m30.25s"
    assert go_duration(3600.0) == "1h0m0s"
    assert go_duration(-1.5) == "-1.5s"


def _points_by_hand(s: ResourceStore) -> int:
    """Every reading the store holds, counted one by one from what it exports."""
    return sum(
        (prev.node_point is not None)
        + (last.node_point is not None)
        + sum(map(len, prev.pods.values()))
        + sum(map(len, last.pods.values()))
        for prev, last in s.export_nodes()
    )


_READINGS = st.tuples(
    st.sampled_from([("ns", "a"), ("ns", "b"), ("kube-system", "c")]),
    st.sampled_from(["app", "sidecar"]),
    st.sampled_from([0.0, 100.0]),  # start time: a change is a restart
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False),  # CPU seconds: may go backwards or jump
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["n1", "n2"]),
            st.floats(min_value=-20.0, max_value=30.0, allow_nan=False),  # next timestamp step
            st.booleans(),  # a node reading
            st.lists(_READINGS, max_size=6),
        ),
        max_size=12,
    )
)
def test_stored_readings_counted_as_they_are_stored(scrapes):
    """stats()'s count of readings (kept by store() as it goes: fresh containers, restarts,
    counters backwards, absurd jumps, repeated and older readings, pods moving between nodes)
    is always the number of readings the store holds."""
    s = ResourceStore(15.0)
    t = 10_000.0
    for node, step, with_node, readings in scrapes:
        t += step
        pods: dict = {}
        for key, container, start, cpu_s in readings:
            pods.setdefault(key, {})[container] = (start, cpu_s, 4096)
        s.store(batch(node, t, 1000.0 + t if with_node else None, pods), received=0.0)
        assert s.stats()[2] == _points_by_hand(s)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("store"), st.integers(0, 3), st.floats(0.0, 100.0)),
            st.tuples(st.just("forget"), st.integers(0, 3)),
            st.tuples(st.just("expire")),
            st.tuples(st.just("list"), st.floats(0.0, 200.0)),
        ),
        max_size=40,
    )
)
def test_pod_blocks_lists_each_fresh_node_with_its_token_now(ops):
    """``pod_blocks`` keeps its last list while nothing changed: whatever was stored, forgotten
    or expired, and at whatever time it is asked (earlier than before too), it is exactly the
    fresh nodes in store order, each with the token ``pod_block`` gives now."""
    s = ResourceStore(15.0, max_age=30.0)
    t = 1000.0
    for op in ops:
        if op[0] == "store":  # received at any time, older than the node's last too
            s.store(batch(f"n{op[1]}", t, t / 10), received=op[2])
            t += 15.0
        elif op[0] == "forget":
            s.forget_node(f"n{op[1]}")
        elif op[0] == "expire":
            s.expire(now=60.0)
        now = op[1] if op[0] == "list" else 50.0
        got = s.pod_blocks(now)
        want = [(n, s.pod_block(n, now)) for n in s.node_names() if s.pod_block(n, now) is not None]
        assert [n for n, _ in got] == [n for n, _ in want]
        assert all(a is b for (_, a), (_, b) in zip(got, want, strict=True))  # the same token objects


def test_pod_blocks_keeps_its_list_until_a_node_changes():
    s = ResourceStore(15.0, max_age=30.0)
    for n in ("a", "b"):
        s.store(batch(n, 1000.0, 1.0), received=10.0)
    first = s.pod_blocks(20.0)
    assert s.pod_blocks(25.0) is first  # nothing changed, both still fresh
    assert [n for n, _ in s.pod_blocks(41.0)] == []  # 31 s old: stale, and the list says so
    s.store(batch("a", 1015.0, 2.0), received=25.0)
    again = s.pod_blocks(30.0)
    assert again is not first and [n for n, _ in again] == ["a", "b"]
    assert again[0][1] is not first[0][1] and again[1][1] is first[1][1]  # a's token is new
