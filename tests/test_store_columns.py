"""ResourceStore's column path: a decoded scrape with the same series as the node's last one is
stored a column at a time, and everything read back (usage, exports, counts, refusals, history)
is what storing it container by container gives."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kcms.model import ContainerColumns, NodeBatch
from kcms.sources.kubelet_decode import DecodeReuse, decode_resource_metrics
from kcms.store.history import HistoryStore
from kcms.store.resource import REFUSED, ResourceStore

# a past the future limit never reaches (the decoder screens against the wall clock)
BASE = time.time() - 500_000.0
REASONS = ("counter_backwards", "absurd_rate", "future_timestamp")

# per node: (namespace, pod) -> container -> [start time, CPU seconds, memory bytes]
Series = dict[tuple[str, str], dict[str, list[float]]]


def render(
    series: Series, ts: float, node_cpu: float, node_ts: float | None = None, late: dict[str, float] | None = None
) -> bytes:
    """A kubelet /metrics/resource body in the kubelet's layout (series sorted by labels); the node
    lines are stamped ``node_ts`` (default ``ts``), a container named in ``late`` that many seconds
    before ``ts`` (a kubelet stamps each container with its own stats' time)."""
    ms = int(ts * 1000)
    late = late or {}
    node_ms = ms if node_ts is None else int(node_ts * 1000)
    rows = sorted((c, ns, pod, v) for (ns, pod), cs in series.items() for c, v in cs.items())
    out = []
    families = (
        ("container_cpu_usage_seconds_total", "counter", lambda v: repr(v[1])),
        ("container_memory_working_set_bytes", "gauge", lambda v: repr(float(v[2]))),
        ("container_start_time_seconds", "gauge", lambda v: repr(v[0])),
    )
    for fam, kind, value in families:
        out.append(f"# HELP {fam} x\n# TYPE {fam} {kind}\n")
        for c, ns, pod, v in rows:
            stamp = ms - int(late.get(c, 0.0) * 1000)
            out.append(f'{fam}{{container="{c}",namespace="{ns}",pod="{pod}"}} {value(v)} {stamp}\n')
    out.append(f"# HELP node_cpu_usage_seconds_total x\n# TYPE node_cpu_usage_seconds_total counter\n"
               f"node_cpu_usage_seconds_total {node_cpu!r} {node_ms}\n")  # fmt: skip
    out.append(f"# HELP node_memory_working_set_bytes x\n# TYPE node_memory_working_set_bytes gauge\n"
               f"node_memory_working_set_bytes 1.5e+09 {node_ms}\n")  # fmt: skip
    out.append("# HELP resource_scrape_error x\n# TYPE resource_scrape_error gauge\nresource_scrape_error 0\n")
    return "".join(out).encode()


def refused() -> dict[str, float]:
    return {r: REFUSED.labels(r)._value.get() for r in REASONS}


def stores() -> tuple[ResourceStore, ResourceStore]:
    a, b = ResourceStore(15.0), ResourceStore(15.0)
    a.history, b.history = HistoryStore(600.0, 15.0), HistoryStore(600.0, 15.0)
    return a, b


def store_both(
    a: ResourceStore, b: ResourceStore, node: str, body: bytes, reuse: DecodeReuse, now: float = BASE + 10_000.0
) -> NodeBatch:
    """Store ``body`` decoded (as a KubeletClient does) in ``a``, and decoded again with its columns
    taken away in ``b`` (the container-by-container path); the refusals counted must match."""
    batch = decode_resource_metrics(node, body, now=now, reuse=reuse)
    plain = decode_resource_metrics(node, body, now=now)
    plain.columns = None
    c = batch.columns
    if c is None:
        assert batch == plain
    else:  # compared through a copy of the columns: ``batch``'s own readings stay unmade, as in a scrape
        copy = ContainerColumns(c.signature, c.start, c.times, c.cpu_ns, c.memory, c.places)
        assert NodeBatch(node, batch.node_point, copy.pods(), batch.rejected) == plain
        assert c._readings is None
    before = refused()
    token, version = a.pod_block(node, 0.0), a.pod_block_changes(0)[0]
    a.store(batch, received=0.0)
    mid = refused()
    # a new token for the node's pods, and the log of changed nodes says so (rendering ahead reads it)
    assert a.pod_block(node, 0.0) is not token and node in (a.pod_block_changes(version)[1] or ())
    b.store(plain, received=0.0)
    after = refused()
    assert {r: mid[r] - before[r] for r in REASONS} == {r: after[r] - mid[r] for r in REASONS}
    return batch


def _container(name: str, ts: float, window: float, ns: int, mem: int) -> tuple:
    return (name, ts, window, ns, mem)


def _pod(ts: float, window: float, cs: list) -> tuple:
    return (ts, window, tuple(cs))


def same_reads(a: ResourceStore, b: ResourceStore, keys: set[tuple[str, str]]) -> None:
    for ns, name in sorted(keys):
        assert a.pod_usage(ns, name, now=0.0) == b.pod_usage(ns, name, now=0.0)
        assert a.pod_node(ns, name) == b.pod_node(ns, name)
    for node in ("n1", "n2"):
        assert a.node_usage(node, now=0.0) == b.node_usage(node, now=0.0)
        assert a.node_pod_rates(node, _container, _pod) == b.node_pod_rates(node, _container, _pod)


def same_everything(a: ResourceStore, b: ResourceStore, keys: set[tuple[str, str]]) -> None:
    same_reads(a, b, keys)
    assert a.export_nodes() == b.export_nodes()
    assert a.stats() == b.stats()
    assert a.newest("n1") == b.newest("n1") and a.newest("n2") == b.newest("n2")
    ha, hb = a.history, b.history
    assert ha is not None and hb is not None
    assert ha.stats() == hb.stats()
    for node in ("n1", "n2"):
        assert ha.node_points(node, 0.0) == hb.node_points(node, 0.0)
    for ns, name in sorted(keys):
        assert ha.pod_points(ns, name, 0.0) == hb.pod_points(ns, name, 0.0)
        assert ha.pod_node(ns, name) == hb.pod_node(ns, name)


def initial() -> dict[str, Series]:
    return {
        node: {
            (ns, f"{node}-{p}"): {c: [BASE - 3600.0, 100.0 + i + p, 1e6 * (1 + p)] for i, c in enumerate(("app", "side"))}
            for p in range(3)
            for ns in (("default",) if p else ("kube-system",))
        }
        for node in ("n1", "n2")
    }


def plain_scrapes(count: int) -> Iterator[tuple[int, Series]]:
    """Node n1's series ``count`` times, every container's CPU 2.5 s further on each time."""
    series = initial()["n1"]
    for k in range(count):
        for cs in series.values():
            for v in cs.values():
                v[1] += 2.5
        yield k, series


def test_newest_of_a_node_stored_by_columns_is_its_newest_container_reading():
    """The newest reading of a node stored a column at a time is read from the columns (its
    containers may be newer than its node point), without making its pairs."""
    a, b = stores()
    reuse = DecodeReuse()
    for k, series in plain_scrapes(3):
        ts = BASE + 15.0 * k
        store_both(a, b, "n1", render(series, ts, 1000.0 + 20 * k, node_ts=ts - 5.0), reuse)
    assert a._nodes["n1"].pods is None  # stored by columns
    assert a.newest("n1") == b.newest("n1") == int((BASE + 30.0) * 1000) / 1000.0
    assert a._nodes["n1"].pods is None  # and still no pairs made


def test_plain_scrapes_take_the_column_path_and_read_the_same():
    """Scrapes that only move the numbers on are stored a column at a time (the pairs are made
    on the first read), and give exactly what the loop gives."""
    a, b = stores()
    reuse = DecodeReuse()
    for k, series in plain_scrapes(6):
        batch = store_both(a, b, "n1", render(series, BASE + 15.0 * k, 1000.0 + 20 * k), reuse)
        assert batch.columns is not None
        if k >= 1:
            entry = a._nodes["n1"]
            assert entry.pods is None  # stored by columns: no pair made yet
            history = a.history._nodes["n1"]  # type: ignore[union-attr]
            assert history.layout is entry.layout  # the history took the columns too
        if k % 2:
            same_reads(a, b, set(series))
    same_everything(a, b, set(series))
    usage = a.pod_usage("default", "n1-1", now=0.0)
    assert usage is not None and [u.cpu_nanocores for _, u in usage.containers] == [166666666, 166666666]


def test_containers_stamped_apart_read_the_same_by_columns():
    """A pod's containers stamped at different times, the later container's reading older in one
    scrape and newer in the next: the column path reads every pod with the loop's rates, and the
    pod's timestamp and window are its oldest container's."""
    a, b = stores()
    reuse = DecodeReuse()
    for k, series in plain_scrapes(5):
        late = {"side": (2.0, 0.5, 3.0, 1.0, 4.0)[k], "app": (0.0, 1.0, 0.0, 2.5, 0.0)[k]}
        store_both(a, b, "n1", render(series, BASE + 15.0 * k, 1000.0 + 20 * k, late=late), reuse)
        if k >= 1:
            assert a._nodes["n1"].pods is None  # stored by columns
            same_reads(a, b, set(series))
    rates = dict(a.node_pod_rates("n1", _container, _pod))
    assert rates == dict(b.node_pod_rates("n1", _container, _pod))
    # scrape 4: app at ts (15 s after its 2.5 s late reading), side 4 s late (12 s after its 1 s late one)
    ts, window, (app, side) = rates[("default", "n1-1")]  # type: ignore[misc]
    assert (app[0], side[0]) == ("app", "side")
    assert app[2] == pytest.approx(17.5) and side[2] == pytest.approx(12.0)
    assert side[1] < app[1] and (ts, window) == (side[1], side[2])


def test_a_batch_the_store_screens_again_loses_its_columns():
    """A batch decoded as of an hour ahead passes its decoder's screen; the store's own screen then
    refuses its readings, and what is left is stored pod by pod (the columns still hold them)."""
    a, b = stores()
    reuse = DecodeReuse()
    series = initial()["n1"]
    store_both(a, b, "n1", render(series, BASE, 1000.0), reuse)
    ahead = time.time() + 3600.0
    for cs in series.values():
        for v in cs.values():
            v[1] += 3.0
    batch = store_both(a, b, "n1", render(series, ahead, 1100.0), reuse, now=ahead)
    assert batch.columns is None and not batch.pods  # every reading refused by the store's screen
    same_everything(a, b, set(series))
    assert a.pod_node("default", "n1-1") == ""


def test_a_node_of_one_container():
    """The column path with a single series (the history's reorder of one value)."""
    a, b = stores()
    reuse = DecodeReuse()
    series: Series = {("default", "solo"): {"app": [BASE - 3600.0, 10.0, 3e6]}}
    for k in range(5):
        series[("default", "solo")]["app"][1] += 1.5
        store_both(a, b, "n1", render(series, BASE + 15.0 * k, 1000.0 + k), reuse)
    assert a._nodes["n1"].pods is None  # stored by columns
    same_everything(a, b, {("default", "solo")})
    assert len(a.history.pod_points("default", "solo", 0.0)[1]) == 4  # type: ignore[union-attr]


ACTIONS = ("none", "none", "none", "backwards", "jump", "restart", "drop", "add", "move", "copy")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["n1", "n2"]),
            st.sampled_from(ACTIONS),
            st.integers(min_value=0, max_value=50),  # which series or pod
            st.sampled_from([15.0, 15.0, 15.0, 0.0, -5.0]),  # timestamp step: the same, an older reading
            st.booleans(),  # read everything after this scrape
        ),
        min_size=1,
        max_size=16,
    )
)
@example(  # pods added in a scrape the history keeps no point of (same timestamp), then the same series
    steps=[("n1", "none", 0, 15.0, False), ("n1", "none", 0, 15.0, False), ("n1", "add", 0, 0.0, False),
           ("n1", "none", 0, 15.0, True)]
)  # fmt: skip
@example(steps=[("n1", "none", 0, 15.0, False), ("n1", "none", 0, 15.0, False), ("n1", "restart", 0, 15.0, True)])
def test_column_path_gives_what_the_loop_gives(steps):
    """Whatever a node's scrapes do (counters going backwards or jumping, restarts, the same or
    an older reading, pods added, dropped, moving between nodes or in two nodes' scrapes), reads
    between them and at the end, refusals counted and the history are those of the
    container-by-container store."""
    a, b = stores()
    reuse = DecodeReuse()
    state = initial()
    clock = {"n1": BASE, "n2": BASE}
    keys: set[tuple[str, str]] = set()
    added = 0
    for node, action, which, step, read in steps:
        series = state[node]
        rows = [v for cs in series.values() for v in cs.values()]
        clock[node] += step
        if step > 0:
            for i, v in enumerate(rows):
                v[1] += 0.5 + i % 3
                v[2] += 4096.0 * (i % 2)
        if rows and action in ("backwards", "jump", "restart"):
            v = rows[which % len(rows)]
            if action == "backwards":
                v[1] = max(0.5, v[1] - 50.0)
            elif action == "jump":
                v[1] += 1e9  # over MAX_NANOCORES for 15 s
            else:
                v[0] += 1.0
                v[1] = 0.25
        elif action == "drop" and len(series) > 1:
            del series[sorted(series)[which % len(series)]]
        elif action == "add":
            added += 1
            series[("default", f"new-{added}")] = {"app": [BASE - 60.0, 1.0, 2e6]}
        elif action in ("move", "copy"):
            other = state["n2" if node == "n1" else "n1"]
            if other:
                key = sorted(other)[which % len(other)]
                if action == "move":
                    series[key] = other.pop(key)
                else:  # a pod in both nodes' scrapes (its old node still lists it): the last scrape owns it
                    series[key] = {c: list(v) for c, v in other[key].items()}
        keys.update(series)
        store_both(a, b, node, render(series, clock[node], 1000.0 + clock[node] - BASE), reuse)
        if read:
            same_reads(a, b, keys)
    same_everything(a, b, keys)
