"""SeriesStore: bounded series, refusals, retention and incremental GC, staleness, queries."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kcms.model import ObjectRef
from kcms.selectors import parse_label_selector
from kcms.store import wire
from kcms.store.query import AGG_FUNCTIONS, counter_rate, percentile
from kcms.store.series import Result, SeriesStore

T0 = 1_700_000_000.0


def pod(name: str, ns: str = "default") -> ObjectRef:
    return ObjectRef("pods", ns, name)


# ------------------------------------------------------------------ writing


def test_append_and_latest():
    s = SeriesStore()
    assert s.append("queue_depth", pod("a"), (), T0, 3.0)
    assert s.append("queue_depth", pod("a"), (), T0 + 15, 5.0)
    assert s.query("pods", "default", ["a"], "queue_depth", now=T0 + 20) == [
        Result(pod("a"), (), 5.0, T0 + 15, None)
    ]
    assert s.stats() == {"series": 1, "points": 2, "metrics": 1}


def test_duplicates_and_out_of_order_points_are_refused():
    s = SeriesStore()
    assert s.append("m", pod("a"), (), T0 + 10, 1.0)
    assert not s.append("m", pod("a"), (), T0 + 10, 2.0)  # same timestamp
    assert not s.append("m", pod("a"), (), T0 + 5, 3.0)  # older
    assert s.query("pods", "default", None, "m", now=T0 + 10)[0].value == 1.0
    assert s.stats()["points"] == 1
    batch = [("m", pod("a"), (), T0 + t, float(t)) for t in (20, 20, 15, 30, 25, 40)]
    assert s.append_many(batch) == 3  # 20, 30, 40
    assert s.stats()["points"] == 4
    assert s.query("pods", "default", None, "m_agg_min_1m", now=T0 + 40)[0].value == 1.0


@pytest.mark.parametrize(
    ("ts", "value"),
    [(T0, math.nan), (T0, math.inf), (T0, -math.inf), (math.nan, 1.0), (math.inf, 1.0)],
)
def test_non_finite_points_raise_and_store_nothing(ts, value):
    s = SeriesStore()
    with pytest.raises(ValueError, match="finite"):
        s.append("m", pod("a"), (), ts, value)
    assert s.stats() == {"series": 0, "points": 0, "metrics": 0}
    assert s.metrics() == []


def test_non_numbers_raise_without_leaving_a_broken_series():
    s = SeriesStore()
    for ts, value in ((T0, "1"), ("1", 1.0), (None, 1.0), (T0, None)):
        with pytest.raises(ValueError):
            s.append("m", pod("a"), (), ts, value)  # type: ignore[arg-type]
    for _ in range(2):  # before and after metric m exists
        with pytest.raises(ValueError, match="ObjectRef"):
            s.append("m", ("pods", "default", "a"), (), T0, 1.0)  # type: ignore[arg-type]
        s.append("m", pod("z"), (), T0, 1.0)
    with pytest.raises(ValueError):
        s.append_many([("m", pod("a"), (), T0)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="floats"):
        s.append("m", pod("a"), (), T0, 10**400)
    assert s.stats()["series"] == 1  # only pod z
    s.append("m", pod("a"), (), T0, 1.0)
    with pytest.raises(ValueError, match="floats"):
        s.append("m", pod("a"), (), T0 + 1, 10**400)
    s.append("m", pod("a"), (), T0 + 2, 2.0)  # the series is still aligned
    assert s.query("pods", "default", ["a"], "m_per_second", now=T0 + 2) == []
    assert s.query("pods", "default", ["a"], "m", now=T0 + 2)[0].value == 2.0
    assert s.query("pods", "default", ["a"], "m_agg_avg", now=T0 + 2)[0].value == 1.5


@pytest.mark.parametrize("metric", ["", "bad-name", "1abc", "a b", "x.y"])
def test_invalid_metric_names_raise(metric):
    s = SeriesStore()
    with pytest.raises(ValueError, match="metric name"):
        s.append(metric, pod("a"), (), T0, 1.0)
    assert s.stats()["series"] == 0


def test_labels_are_validated_and_sorted():
    s = SeriesStore()
    with pytest.raises(ValueError, match="pairs"):
        s.append("m", pod("a"), ("x",), T0, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strings"):
        s.append("m", pod("a"), (("k", 1),), T0, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="duplicate"):
        s.append("m", pod("a"), (("k", "1"), ("k", "2")), T0, 1.0)
    assert s.append("m", pod("a"), (("z", "1"), ("a", "2")), T0, 1.0)
    assert not s.append("m", pod("a"), (("a", "2"), ("z", "1")), T0, 2.0)  # the same series
    assert s.append("m", pod("a"), (("a", "2"), ("z", "1")), T0 + 1, 2.0)
    [r] = s.query("pods", "default", None, "m", now=T0 + 1)
    assert r.labels == (("a", "2"), ("z", "1"))
    assert s.stats()["series"] == 1


def test_append_many_raises_at_a_bad_sample_and_keeps_the_ones_before():
    s = SeriesStore()
    batch = [("m", pod("a"), (), T0, 1.0), ("m", pod("b"), (), T0, math.nan), ("m", pod("c"), (), T0, 1.0)]
    with pytest.raises(ValueError):
        s.append_many(batch)
    assert [r.obj.name for r in s.query("pods", "default", None, "m", now=T0)] == ["a"]
    assert s.stats() == {"series": 1, "points": 1, "metrics": 1}


def test_max_points_bounds_storage_and_queries():
    s = SeriesStore(retention=10_000, stale_after=100, max_points=16, default_window=10_000)
    for i in range(1000):
        s.append("m", pod("a"), (), T0 + i, float(i))
        assert s.stats()["points"] <= 16 + 16 // 8
        [r] = s.query("pods", "default", None, "m_agg_min", now=T0 + i)
        assert r.value == max(0, i - 15)  # queries see exactly the newest 16 points
        assert r.window == min(i, 15)
    assert s.stats()["points"] >= 16


# ------------------------------------------------------------------ discovery and indexes


def test_discovery_is_incremental():
    s = SeriesStore(retention=100, stale_after=50)
    assert s.metrics() == []
    s.append("rps", pod("a"), (), T0, 1.0)
    s.append("rps", pod("b", "other"), (("path", "root"),), T0 + 50, 1.0)
    s.append("rps", ObjectRef("deployments.apps", "default", "web"), (), T0, 1.0)
    s.append("queue", ObjectRef("", "default", ""), (), T0, 1.0)
    s.append("up", ObjectRef("nodes", "", "n1"), (), T0, 1.0)
    assert sorted(s.metrics()) == [
        ("", "queue"),
        ("deployments.apps", "rps"),
        ("nodes", "up"),
        ("pods", "rps"),
    ]
    # GC after pod a's only point expired: pods/rps stays, pod b still has a series
    assert s.collect_garbage(now=T0 + 120) == 4
    assert s.metrics() == [("pods", "rps")]
    assert s.query("pods", "default", None, "rps", now=T0 + 120) == []
    assert [r.obj for r in s.query("pods", "other", None, "rps", now=T0 + 100)] == [pod("b", "other")]
    s.collect_garbage(now=T0 + 151)
    assert s.metrics() == []
    assert s.stats() == {"series": 0, "points": 0, "metrics": 0}
    assert s._index == {}  # every level pruned
    # a removed series can come back
    s.append("rps", pod("a"), (), T0 + 200, 1.0)
    assert s.metrics() == [("pods", "rps")]


def test_query_scopes_by_resource_namespace_and_names():
    s = SeriesStore()
    for ns in ("a", "b"):
        for name in ("p1", "p2", "p3"):
            s.append("m", pod(name, ns), (), T0, float(len(ns + name)))
    s.append("m", ObjectRef("nodes", "", "n1"), (), T0, 7.0)
    s.append("m", ObjectRef("", "a", ""), (("queue", "q1"),), T0, 8.0)
    s.append("m", ObjectRef("", "", ""), (), T0, 9.0)
    q = s.query
    assert [r.obj.name for r in q("pods", "a", None, "m", now=T0)] == ["p1", "p2", "p3"]
    assert [r.obj for r in q("pods", "b", ["p3", "nope", "p1", "p3"], "m", now=T0)] == [
        pod("p3", "b"),
        pod("p1", "b"),
    ]
    assert q("pods", "c", None, "m", now=T0) == []
    assert q("pods", "", None, "m", now=T0) == []
    assert [r.value for r in q("nodes", "", None, "m", now=T0)] == [7.0]
    assert q("nodes", "", ["n2"], "m", now=T0) == []
    assert q("", "a", None, "m", now=T0) == [
        Result(ObjectRef("", "a", ""), (("queue", "q1"),), 8.0, T0, None)
    ]
    assert [r.value for r in q("", "", None, "m", now=T0)] == [9.0]
    assert q("services", "a", None, "m", now=T0) == []
    assert q("pods", "a", None, "unknown", now=T0) == []
    assert q("pods", "a", None, "unknown_per_second", now=T0) == []
    assert q("pods", "a", None, "m_agg_nope", now=T0) == []  # malformed: nothing, no exception
    assert q("pods", "a", None, "m_agg_avg_1h", now=T0) == []  # window beyond retention
    assert q("pods", "a", None, "bad-name", now=T0) == []


def test_label_selector_matches_series_labels():
    s = SeriesStore()
    for path in ("root", "api", "health"):
        for code in ("200", "500"):
            s.append("http_requests", pod("a"), (("code", code), ("path", path)), T0, 1.0)
    sel = parse_label_selector
    assert len(s.query("pods", "default", None, "http_requests", sel("code=500"), now=T0)) == 3
    got = s.query("pods", "default", None, "http_requests", sel("code=200,path in (api,root)"), now=T0)
    assert sorted(r.labels for r in got) == [
        (("code", "200"), ("path", "api")),
        (("code", "200"), ("path", "root")),
    ]
    assert len(s.query("pods", "default", None, "http_requests", sel(""), now=T0)) == 6
    assert len(s.query("pods", "default", None, "http_requests", None, now=T0)) == 6
    assert s.query("pods", "default", None, "http_requests", sel("!code"), now=T0) == []
    assert len(s.query("pods", "default", None, "http_requests", sel("tier notin (x)"), now=T0)) == 6


def test_literal_series_name_wins_over_the_grammar():
    s = SeriesStore()
    s.append("jobs_per_second", pod("a"), (), T0, 42.0)
    s.append("jobs_total", pod("a"), (), T0, 0.0)
    s.append("jobs_total", pod("a"), (), T0 + 10, 50.0)
    assert s.query("pods", "default", None, "jobs_per_second", now=T0 + 10)[0].value == 42.0
    s2 = SeriesStore()
    s2.append("jobs_total", pod("a"), (), T0, 0.0)
    s2.append("jobs_total", pod("a"), (), T0 + 10, 50.0)
    assert s2.query("pods", "default", None, "jobs_per_second", now=T0 + 10) == [
        Result(pod("a"), (), 5.0, T0 + 10, 10.0)
    ]


# ------------------------------------------------------------------ staleness and retention


def test_staleness_boundary():
    s = SeriesStore(retention=600, stale_after=300)
    s.append("m", pod("a"), (), T0, 1.0)
    assert len(s.query("pods", "default", None, "m", now=T0 + 300)) == 1  # exactly stale_after: fresh
    assert s.query("pods", "default", None, "m", now=T0 + 300.001) == []
    assert s.query("pods", "default", None, "m_agg_avg", now=T0 + 301) == []
    assert s.stats()["series"] == 1  # still kept until retention
    s.append("m", pod("a"), (), T0 + 400, 2.0)
    assert s.query("pods", "default", None, "m", now=T0 + 400)[0].value == 2.0


def test_retention_boundary_is_inclusive():
    s = SeriesStore(retention=600, stale_after=300)
    for t in (0, 10, 20):
        s.append("m", pod("a"), (), T0 + t, float(t))
    assert s.collect_garbage(now=T0 + 610) == 1  # the point at T0 is 610 s old
    assert s.stats()["points"] == 2
    assert s.stats()["points"] == 2  # T0+10 is exactly 600 s old: kept
    assert s.collect_garbage(now=T0 + 620) == 1
    assert s.stats()["points"] == 1  # T0+20 is exactly 600 s old: kept
    assert s.collect_garbage(now=T0 + 620) == 0
    assert s.stats() == {"series": 1, "points": 1, "metrics": 1}
    assert s.collect_garbage(now=T0 + 620.5) == 1
    assert s.stats() == {"series": 0, "points": 0, "metrics": 0}


def test_gc_budget_and_round_robin():
    s = SeriesStore(retention=100, stale_after=50)
    for i in range(10):
        s.append("m", pod(f"old{i}"), (), T0, 1.0)
        s.append("m", pod(f"new{i}"), (), T0 + 100, 1.0)
    now = T0 + 150
    removed = []
    while s.stats()["series"] > 10:
        before = s.stats()["series"]
        s.collect_garbage(now=now, budget=3)
        removed.append(before - s.stats()["series"])
    assert len(removed) <= 7  # one pass over the 20 series, 3 per call
    assert all(0 <= r <= 3 for r in removed)
    assert sum(removed) == 10
    assert sorted(r.obj.name for r in s.query("pods", "default", None, "m", now=now)) == sorted(
        f"new{i}" for i in range(10)
    )
    assert s.collect_garbage(now=now, budget=0) == 0


def test_gc_trims_within_a_series_and_queries_ignore_expired_points():
    s = SeriesStore(retention=60, stale_after=60, default_window=60)
    for t in range(0, 100, 10):
        s.append("m", pod("a"), (), T0 + t, float(t))
    # before GC, a window ending at the last point never reaches past the retention
    [r] = s.query("pods", "default", None, "m_agg_min_1m", now=T0 + 120)
    assert r.value == 60.0 and r.window == 30.0
    s.collect_garbage(now=T0 + 120)
    assert s.stats()["points"] == 4  # 60, 70, 80, 90


# ------------------------------------------------------------------ rates and aggregations


def test_rate_needs_two_points_and_handles_resets():
    s = SeriesStore()
    a = pod("a")
    s.append("req_total", a, (), T0, 100.0)
    assert s.query("pods", "default", None, "req_per_second", now=T0) == []
    s.append("req_total", a, (), T0 + 10, 150.0)
    assert s.query("pods", "default", None, "req_per_second", now=T0 + 10) == [
        Result(a, (), 5.0, T0 + 10, 10.0)
    ]
    s.append("req_total", a, (), T0 + 30, 20.0)  # reset: counted 20 since the restart
    assert s.query("pods", "default", None, "req_per_second", now=T0 + 30) == [
        Result(a, (), 1.0, T0 + 30, 20.0)
    ]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.001, 100), st.floats(0, 1e9), st.booleans()),
        min_size=2,
        max_size=50,
    )
)
def test_rates_across_resets_are_never_negative(steps):
    s = SeriesStore(retention=1e7, stale_after=1e7, max_points=8, default_window=60)
    t, v = T0, 0.0
    prev = None
    for dt, inc, reset in steps:
        t += dt
        v = inc if reset else v + inc
        assert s.append("c_total", pod("a"), (), t, v)
        results = s.query("pods", "default", None, "c_per_second", now=t)
        if prev is None:
            assert results == []
        else:
            [r] = results
            assert r.value >= 0.0
            assert r.value == counter_rate(prev[0], prev[1], t, v)
            assert r.window == t - prev[0] and r.timestamp == t
        prev = (t, v)


# ------------------------------------------------------------------ aggregations of rates


def test_rate_aggregations_by_hand():
    """A counter read every 10 s growing 10/s for a minute, then 30/s for a minute."""
    s = SeriesStore(retention=600, stale_after=300, default_window=60)
    a = pod("a")
    v = 0.0
    for i in range(13):  # t = 0..120
        if i:
            v += 100.0 if i <= 6 else 300.0
        s.append("req_total", a, (("code", "200"),), T0 + 10 * i, v)
    assert v == 2400.0
    now = T0 + 120

    def one(metric: str) -> tuple[float, float | None]:
        [r] = s.query("pods", "default", ["a"], metric, now=now)
        assert r.obj == a and r.labels == (("code", "200"),) and r.timestamp == now
        return r.value, r.window

    # 2m: all 13 points, the 12 rates 10 x6 and 30 x6
    assert one("req_per_second_agg_avg_2m") == (20.0, 120.0)
    assert one("req_per_second_agg_min_2m") == (10.0, 120.0)
    assert one("req_per_second_agg_max_2m") == (30.0, 120.0)
    assert one("req_per_second_agg_p50_2m") == (10.0, 120.0)  # rank ceil(0.5 * 12) = 6 of 12
    assert one("req_per_second_agg_p90_2m") == (30.0, 120.0)
    assert one("req_per_second_agg_latest_2m") == (30.0, 10.0)  # the last rate: last two points
    # 90s: the points at 30..120 s, the 9 rates 10 x3 and 30 x6
    assert one("req_per_second_agg_avg_90s") == (pytest.approx(210.0 / 9), 90.0)
    assert one("req_per_second_agg_p50_90s") == (30.0, 90.0)  # rank 5 of 9
    assert one("req_per_second_agg_p99_90s") == (30.0, 90.0)
    assert one("req_per_second_agg_min_90s") == (10.0, 90.0)
    # 1m and the default window (60 s): only the faster minute
    assert one("req_per_second_agg_p50_1m") == (30.0, 60.0)
    assert one("req_per_second_agg_p50") == (30.0, 60.0)
    assert one("req_per_second_agg_min") == (30.0, 60.0)
    # a 5m window holds all there is; its span is what the points cover, not the request
    assert one("req_per_second_agg_p99_5m") == (30.0, 120.0)
    # the same through a wildcard query and a label selector
    got = s.query(
        "pods", "default", None, "req_per_second_agg_max_5m", parse_label_selector("code=200"), now=now
    )
    assert got == [Result(a, (("code", "200"),), 30.0, now, 120.0)]
    assert (
        s.query(
            "pods", "default", None, "req_per_second_agg_max_5m", parse_label_selector("code=500"), now=now
        )
        == []
    )
    # nothing for another namespace or resource, a missing counter, or a window beyond retention
    assert s.query("pods", "other", None, "req_per_second_agg_max_5m", now=now) == []
    assert s.query("nodes", "", None, "req_per_second_agg_max_5m", now=now) == []
    assert s.query("pods", "default", None, "nope_per_second_agg_max_5m", now=now) == []
    assert s.query("pods", "default", None, "req_per_second_agg_max_11m", now=now) == []
    # stale like every other form
    assert s.query("pods", "default", None, "req_per_second_agg_max_5m", now=now + 301) == []


def test_rate_aggregations_handle_resets():
    s = SeriesStore()
    a = pod("a")
    for t, v in ((0, 0.0), (10, 50.0), (20, 100.0), (30, 20.0), (40, 70.0), (50, 0.0)):
        s.append("jobs_total", a, (), T0 + t, v)
    # rates 5, 5, 2 (restarted: 20 counted since), 5, 0 (restarted at zero): never negative
    now = T0 + 50
    assert s.query("pods", "default", None, "jobs_per_second_agg_min_1m", now=now) == [
        Result(a, (), 0.0, now, 50.0)
    ]
    assert s.query("pods", "default", None, "jobs_per_second_agg_avg_1m", now=now)[0].value == 17.0 / 5
    assert s.query("pods", "default", None, "jobs_per_second_agg_p50_1m", now=now)[0].value == 5.0
    assert s.query("pods", "default", None, "jobs_per_second_agg_min_20s", now=now)[0].value == 0.0
    assert s.query("pods", "default", None, "jobs_per_second_agg_max_20s", now=now)[0].value == 5.0


def test_rate_aggregations_need_two_points_in_the_window():
    s = SeriesStore()
    a, b = pod("a"), pod("b")
    s.append("jobs_total", a, (), T0, 10.0)
    for fn in AGG_FUNCTIONS:  # one point: no rate, for every function
        assert s.query("pods", "default", None, f"jobs_per_second_agg_{fn}_5m", now=T0) == []
    s.append("jobs_total", a, (), T0 + 100, 30.0)
    s.append("jobs_total", b, (), T0 + 90, 0.0)
    s.append("jobs_total", b, (), T0 + 100, 40.0)
    now = T0 + 100
    for fn in AGG_FUNCTIONS:
        # a's two points are 100 s apart: a 30 s window holds one of them, so only b answers
        assert s.query("pods", "default", None, f"jobs_per_second_agg_{fn}_30s", now=now) == [
            Result(b, (), 4.0, now, 10.0)
        ]
        assert s.query("pods", "default", None, f"jobs_per_second_agg_{fn}_2m", now=now) == [
            Result(a, (), 0.2, now, 100.0),
            Result(b, (), 4.0, now, 10.0),
        ]


def test_rate_aggregations_ignore_points_past_the_retention_not_yet_collected():
    s = SeriesStore(retention=300, stale_after=300)
    for k, v in enumerate((0.0, 1000.0, 1100.0, 1300.0)):  # rates 10, 1, 2 per second
        s.append("jobs_total", pod("a"), (), T0 + 100 * k, v)
    # at T0 + 350 the point at T0 has expired (garbage collection has not run): rates 1 and 2 only
    assert s.query("pods", "default", None, "jobs_per_second_agg_max_5m", now=T0 + 350) == [
        Result(pod("a"), (), 2.0, T0 + 300, 200.0)
    ]
    assert s.query("pods", "default", None, "jobs_per_second_agg_max_5m", now=T0 + 300)[0].value == 10.0


def test_a_literal_per_second_series_is_aggregated_as_itself_in_its_scope_only():
    s = SeriesStore()
    for ns in ("a", "b"):
        s.append("jobs_total", pod("p", ns), (), T0, 0.0)
        s.append("jobs_total", pod("p", ns), (), T0 + 10, 50.0)
    s.append("jobs_per_second", pod("p", "a"), (), T0, 42.0)  # a gauge pushed under the rate's name
    s.append("jobs_per_second", pod("p", "a"), (), T0 + 10, 44.0)
    now = T0 + 10
    assert s.query("pods", "a", None, "jobs_per_second_agg_avg_1m", now=now) == [
        Result(pod("p", "a"), (), 43.0, now, 10.0)
    ]
    # namespace b holds no such gauge: its name keeps the derived meaning, the rate of jobs_total
    assert s.query("pods", "b", None, "jobs_per_second_agg_avg_1m", now=now) == [
        Result(pod("p", "b"), (), 5.0, now, 10.0)
    ]


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(1, 40), st.floats(0, 1e6), st.booleans()), min_size=1, max_size=60),
    fn=st.sampled_from(AGG_FUNCTIONS),
    window=st.sampled_from([None, 1, 15, 30, 60, 120, 300]),
    max_points=st.integers(2, 70),
)
def test_rate_aggregations_match_direct_computation(steps, fn, window, max_points):
    s = SeriesStore(retention=600, stale_after=300, max_points=max_points, default_window=45)
    points = []
    t, v = T0, 0.0
    for gap, inc, reset in steps:
        t += gap
        v = inc if reset else v + inc
        points.append((t, v))
        s.append("c_total", pod("a"), (), t, v)
    name = f"c_per_second_agg_{fn}" + ("" if window is None else f"_{window}s")
    results = s.query("pods", "default", None, name, now=t)
    w = 45 if window is None else window
    inside = [(pt, pv) for pt, pv in points[-max_points:] if pt >= t - w]
    if len(inside) < 2:
        assert results == []
        return
    rates = [counter_rate(t0, v0, t1, v1) for (t0, v0), (t1, v1) in zip(inside, inside[1:], strict=False)]
    [r] = results
    assert r.timestamp == t and r.value >= 0.0
    assert r.value == pytest.approx(direct(fn, rates), rel=1e-12, abs=1e-9)
    assert r.window == (t - inside[-2][0] if fn == "latest" else t - inside[0][0])
    assert 0 < r.window <= w


def direct(fn: str, values: list[float]) -> float:
    if fn == "avg":
        return math.fsum(values) / len(values)
    if fn == "min":
        return min(values)
    if fn == "max":
        return max(values)
    if fn == "latest":
        return values[-1]
    return percentile(values, int(fn[1:]))


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.integers(1, 40), min_size=1, max_size=60),
    values=st.lists(st.floats(-1e9, 1e9), min_size=60, max_size=60),
    fn=st.sampled_from(AGG_FUNCTIONS),
    window=st.sampled_from([None, 1, 15, 30, 60, 120, 300]),
    max_points=st.integers(2, 70),
)
def test_aggregations_match_direct_computation(gaps, values, fn, window, max_points):
    s = SeriesStore(retention=600, stale_after=300, max_points=max_points, default_window=45)
    points = []
    t = T0
    for gap, v in zip(gaps, values, strict=False):
        t += gap
        points.append((t, v))
        s.append("lat", pod("a"), (), t, v)
    name = f"lat_agg_{fn}" + ("" if window is None else f"_{window}s")
    [r] = s.query("pods", "default", None, name, now=t)
    w = 45 if window is None else window
    visible = points[-max_points:]
    inside = [(pt, pv) for pt, pv in visible if pt >= t - w]
    assert r.timestamp == t
    assert r.value == pytest.approx(direct(fn, [pv for _, pv in inside]), rel=1e-12, abs=1e-6)
    assert r.window == (0.0 if fn == "latest" else t - inside[0][0])
    assert 0 <= r.window <= w


def test_labelled_series_in_named_queries_and_gc():
    s = SeriesStore(retention=100, stale_after=100)
    a = pod("a")
    s.append("m", a, (("shard", "2"),), T0, 2.0)
    s.append("m", a, (), T0, 0.0)
    s.append("m", a, (("shard", "1"),), T0 + 50, 1.0)
    s.append("m", pod("b"), (("shard", "1"),), T0 + 50, 3.0)
    got = s.query("pods", "default", ["a"], "m", now=T0 + 50)
    assert [(r.labels, r.value) for r in got] == [
        ((), 0.0),
        ((("shard", "2"),), 2.0),
        ((("shard", "1"),), 1.0),
    ]
    assert len(s.query("pods", "default", None, "m", now=T0 + 50)) == 4
    assert s.collect_garbage(now=T0 + 101) == 2  # a{} and a{shard=2} expire
    got = s.query("pods", "default", ["a", "b"], "m", now=T0 + 101)
    assert [(r.obj.name, r.labels) for r in got] == [("a", (("shard", "1"),)), ("b", (("shard", "1"),))]
    s.collect_garbage(now=T0 + 151)
    assert s.stats()["series"] == 0 and s._index == {}


SERIES_KEYS = [
    (
        "m" if a % 2 == 0 else "n",
        "x" if a % 4 < 2 else "y",
        f"p{a // 12}",
        ((), (("s", "1"),), (("s", "2"),))[(a % 12) // 4],
    )
    for a in range(24)
]


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(0, 23), st.integers(0, 30), st.floats(-10, 10)),
            st.tuples(st.just("gc"), st.integers(0, 50), st.integers(0, 4), st.just(0.0)),
        ),
        max_size=80,
    )
)
def test_store_agrees_with_a_model_under_appends_and_gc(ops):
    """Random appends and budgeted GCs over 24 series in 4 nodes against a list-of-points model."""
    retention = 100.0
    s = SeriesStore(retention=retention, stale_after=retention, max_points=1000, default_window=100)
    model: dict[tuple, list[tuple[float, float]]] = {}
    now = T0
    for op, a, b, v in ops:
        if op == "append":
            now += b
            ts = now - (b % 7)  # sometimes older than the series' last point
            metric, ns, name, labels = key = SERIES_KEYS[a]
            pts = model.setdefault(key, [])
            ok = not pts or ts > pts[-1][0]
            assert s.append(metric, pod(name, ns), labels, ts, v) == ok
            if ok:
                pts.append((ts, v))
        else:
            now += a
            for _ in range(24):  # 24 calls with budget b>0 make at least one full pass
                s.collect_garbage(now=now, budget=b)
            if b:
                for k in list(model):
                    model[k] = [(pt, pv) for pt, pv in model[k] if pt >= now - retention]
                    if not model[k]:
                        del model[k]
                assert s.stats()["series"] == len(model)
                assert s.stats()["points"] == sum(len(p) for p in model.values())
                assert sorted(s.metrics()) == sorted({("pods", k[0]) for k in model})
        got = {}
        for metric in ("m", "n"):
            for ns in ("x", "y"):
                wild = s.query("pods", ns, None, metric, now=now)
                named = s.query("pods", ns, ["p1", "p0", "p9"], metric, now=now)
                assert sorted(wild, key=repr) == sorted(named, key=repr)
                assert [r.obj.name for r in named] == sorted((r.obj.name for r in named), reverse=True)
                for r in wild:
                    assert r.obj == pod(r.obj.name, ns)
                    got[(metric, ns, r.obj.name, r.labels)] = (r.timestamp, r.value)
        want = {k: p[-1] for k, p in model.items() if p and p[-1][0] >= now - retention}
        assert got == want


_wire_sample = st.tuples(
    st.sampled_from(["m_a", "m_b", "bad/name"]),
    st.sampled_from(["pods", "nodes", ""]),
    st.sampled_from(["", "ns1"]),
    st.sampled_from(["p0", "p1", ""]),
    st.sampled_from([(), (("k", "v"),), (("b", "2"), ("a", "1"))]),
    st.floats(min_value=1e9, max_value=1e9 + 100) | st.sampled_from([math.nan, math.inf]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_wire_sample, max_size=40))
def test_append_block_stores_what_append_does_one_at_a_time(samples):
    """The store service's fast path keeps exactly the points that one-by-one appends keep, and
    refuses (counts) exactly the ones append refuses with an error."""
    fast, slow = SeriesStore(retention=1e12, stale_after=1e12), SeriesStore(retention=1e12, stale_after=1e12)
    block = wire.block_of(samples)
    accepted, refused = fast.append_block(block.strings, block.labels, block.rows)
    want_accepted = want_refused = 0
    for metric, resource, namespace, name, labels, ts, value in samples:
        try:
            want_accepted += slow.append(metric, ObjectRef(resource, namespace, name), labels, ts, value)
        except ValueError:
            want_refused += 1
    assert (accepted, refused) == (want_accepted, want_refused)
    assert fast.stats() == slow.stats()
    assert sorted(fast.export()) == sorted(slow.export())


def test_append_block_refuses_rows_that_point_outside_the_tables():
    store = SeriesStore(retention=1e12, stale_after=1e12)
    rows = [
        (0, 1, 2, 3, 0, 1e9, 1.0),
        (0, 1, 2, 9, 0, 1e9, 2.0),
        (0, 1, 2, 3, 5, 1e9 + 1, 3.0),
        (0, 1, 2, 3, 0, 1e9 + 2, 4.0),
    ]
    assert store.append_block(["m", "pods", "ns", "p"], [()], rows) == (2, 2)
    assert [r.value for r in store.query("pods", "ns", ["p"], "m")] == [4.0]


@settings(max_examples=200, deadline=None)
@example([1.7976931348623157e308] * 3, "x_total_agg_avg")  # v / 3 rounded up: fsum overflowed
@example([1.7976931348623157e308] * 6, "x_total_agg_avg")
@example([-1.7976931348623157e308] * 5, "x_total_agg_avg")
@example([6.467654830448661e16] * 3, "x_total_agg_avg")  # (3v) / 3 rounded an ulp above v
@given(
    st.lists(
        st.floats(allow_nan=False, allow_infinity=False, min_value=-1.7976931348623157e308),
        min_size=2,
        max_size=6,
    ),
    st.sampled_from(
        [
            "x_per_second",
            *(f"x_total_agg_{fn}" for fn in AGG_FUNCTIONS),
            *(f"x_per_second_agg_{fn}" for fn in AGG_FUNCTIONS),
        ]
    ),
)
def test_extreme_finite_points_never_yield_an_error_or_a_non_finite_value(values, metric):
    """Finite points near the float limit (any writer may store them) must not make a derived read
    raise (the whole list would fail for every reader) nor serve inf or nan."""
    store = SeriesStore(retention=600)
    now = 1_700_000_000.0
    for i, v in enumerate(values):
        store.append("x_total", pod("p"), (), now - len(values) + i, v)
    store.append("x_total", pod("q"), (), now - 1, 1.0)
    store.append("x_total", pod("q"), (), now, 2.0)
    results = store.query("pods", "default", None, metric, now=now)
    assert all(math.isfinite(r.value) for r in results)
    assert "q" in [r.obj.name for r in results]  # the honest neighbour is always served
    if metric == "x_total_agg_avg":  # the mean of finite values is finite: served, within them
        (mean,) = [r.value for r in results if r.obj.name == "p"]
        assert min(values) <= mean <= max(values)
