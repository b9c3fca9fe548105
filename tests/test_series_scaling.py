"""SeriesStore with many labelled series on few objects: behaviour and the work done, never time.

The store once kept an object's label sets in a tuple rebuilt on every new or removed series, and
its garbage collector skipped ``position`` entries of a live dict on every call: both quadratic in
the number of series of one object (bench/series_object.py prints the cost per series). These tests
check what must hold for any interleaving of objects, labels, appends and collections: a query
returns exactly the live series appended, in creation order per object (unlabelled first), the
indexes hold exactly the live series (nothing left behind by removals), and removing one series
compares a bounded number of label values however many series its object has.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kcms.model import ObjectRef
from kcms.store.series import SeriesStore

T0 = 1_700_000_000.0
RETENTION = 100.0
OBJECTS = [ObjectRef("pods", "x", "p0"), ObjectRef("pods", "x", "p1"), ObjectRef("pods", "y", "p0")]
LABELS = [()] + [(("code", str(c)), ("path", f"/p/{i}")) for i in range(6) for c in (200, 500)]


def index_sizes(s: SeriesStore) -> dict[tuple[str, str, str], int]:
    """Series per (metric, namespace, name) as the store's indexes hold them, checking that the
    labelled-names index agrees with the nodes and that no empty level is left behind."""
    out: dict[tuple[str, str, str], int] = {}
    for metric, by_resource in s._index.items():
        assert by_resource, metric
        for by_namespace in by_resource.values():
            assert by_namespace
            for ns, node in by_namespace.items():
                if type(ns) is not str:
                    continue
                assert node
                labelled = by_namespace.get((ns,), {})
                for key in node:
                    name = key if type(key) is str else key[0]
                    out[(metric, ns, name)] = out.get((metric, ns, name), 0) + 1
                    if type(key) is tuple:
                        assert key[1] in labelled[name]
                for name, sets in labelled.items():
                    assert sets, name
                    assert all((name, lb) in node for lb in sets)
    return out


ops_strategy = st.lists(
    st.one_of(
        # append: metric, object, labels, seconds since the previous operation
        st.tuples(
            st.just("append"),
            st.sampled_from("mn"),
            st.integers(0, 2),
            st.integers(0, 12),
            st.integers(0, 30),
        ),
        # gc: seconds to advance, budget
        st.tuples(st.just("gc"), st.just(""), st.integers(0, 60), st.integers(1, 7), st.just(0)),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(ops_strategy)
def test_queries_return_exactly_the_live_series_for_any_interleaving(ops):
    s = SeriesStore(retention=RETENTION, stale_after=RETENTION, max_points=8, default_window=60)
    # (metric, object, labels) -> (last timestamp, value, creation number); dict order = creation
    model: dict[tuple, tuple[float, float, int]] = {}
    now = T0
    created = 0
    for op, metric, a, b, c in ops:
        if op == "append":
            now += c
            key = (metric, OBJECTS[a], LABELS[b])
            if key not in model:
                created += 1
            old = model.get(key)
            assert s.append(metric, OBJECTS[a], LABELS[b], now, float(created)) == (
                old is None or now > old[0]
            )
            if old is None:
                model[key] = (now, float(created), created)
            elif now > old[0]:
                model[key] = (now, float(created), old[2])
        else:
            now += a
            # enough budgeted calls for at least one full pass over every series
            for _ in range(len(model) // b + 3):
                s.collect_garbage(now=now, budget=b)
            for key in [k for k, v in model.items() if v[0] < now - RETENTION]:
                del model[key]
            # a series that comes back after its removal is a new series (created again)
        assert s.stats()["series"] == len(model)
        want_sizes: dict[tuple[str, str, str], int] = {}
        for metric_, obj, _ in model:
            k = (metric_, obj.namespace, obj.name)
            want_sizes[k] = want_sizes.get(k, 0) + 1
        assert index_sizes(s) == want_sizes
        for metric_ in "mn":
            for ns in ("x", "y"):
                # series not yet collected but older than stale_after are not served
                live = [
                    (k, v)
                    for k, v in model.items()
                    if k[0] == metric_ and k[1].namespace == ns and v[0] >= now - RETENTION
                ]
                for name in ("p0", "p1"):
                    got = s.query("pods", ns, [name], metric_, now=now)
                    mine = sorted(
                        ((k, v) for k, v in live if k[1].name == name),
                        key=lambda kv: (kv[0][2] != (), kv[1][2]),  # unlabelled first, then creation
                    )
                    assert [(r.obj, r.labels, r.timestamp, r.value) for r in got] == [
                        (k[1], k[2], v[0], v[1]) for k, v in mine
                    ]
                wild = s.query("pods", ns, None, metric_, now=now)
                assert sorted((r.obj.name, r.labels, r.value) for r in wild) == sorted(
                    (k[1].name, k[2], v[1]) for k, v in live
                )


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    removed=st.sets(st.integers(0, 299)),
    budget=st.integers(1, 50),
)
def test_removing_any_subset_of_one_objects_series_keeps_the_rest_in_order(n, removed, budget):
    obj = OBJECTS[0]
    s = SeriesStore(retention=RETENTION, stale_after=RETENTION)
    labels = [(("i", str(i)),) for i in range(n)]
    for i, lb in enumerate(labels):
        # the removed ones stop at T0, the others get a newer point
        s.append("m", obj, lb, T0, float(i))
    kept = [i for i in range(n) if i not in removed]
    for i in kept:
        s.append("m", obj, labels[i], T0 + 60, float(i))
    now = T0 + RETENTION + 1
    for _ in range(n // budget + 3):
        s.collect_garbage(now=now, budget=budget)
    got = s.query("pods", obj.namespace, [obj.name], "m", now=now)
    assert [r.value for r in got] == [float(i) for i in kept]
    assert s.stats()["series"] == len(kept)
    assert index_sizes(s) == ({("m", "x", "p0"): len(kept)} if kept else {})


class CountingStr(str):
    """A label value that counts how often it is compared for equality."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountingStr.compared += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        CountingStr.compared += 1
        return str.__ne__(self, other)

    __hash__ = str.__hash__


def test_removing_a_series_compares_a_bounded_number_of_label_values():
    """Removing n series of one object compares O(n) label values, not O(n^2) (a per-object tuple
    of label sets rebuilt per removal compared each removed set with every other)."""
    for n in (200, 2000):
        s = SeriesStore(retention=RETENTION, stale_after=RETENTION)
        obj = OBJECTS[0]
        for i in range(n):
            s.append("m", obj, (("path", CountingStr(f"/p/{i}")),), T0, 1.0)
        CountingStr.compared = 0
        while s.stats()["series"]:
            s.collect_garbage(now=T0 + RETENTION + 1, budget=97)
        assert s._index == {}
        # a dict lookup compares a key with the few of equal hash it meets: a constant per series
        assert CountingStr.compared <= 4 * n, (n, CountingStr.compared)
