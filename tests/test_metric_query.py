"""The custom-metric name grammar and the aggregation math (kcms.store.query)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcms.store.query import (
    AGG_FUNCTIONS,
    MetricQuery,
    aggregate,
    counter_rate,
    counter_rates,
    format_metric_name,
    format_window,
    parse_metric_name,
    percentile,
    readings,
    validate_metric_name,
)

# ------------------------------------------------------------------ grammar: examples


def test_plain_name_is_latest():
    assert parse_metric_name("http_requests") == MetricQuery("http_requests", "latest")
    assert parse_metric_name("a:b_c") == MetricQuery("a:b_c", "latest")
    assert parse_metric_name("_x") == MetricQuery("_x", "latest")


def test_per_second_reads_the_total_counter():
    assert parse_metric_name("http_requests_per_second") == MetricQuery("http_requests_total", "rate")


def test_aggregation_forms():
    assert parse_metric_name("latency_agg_p99_5m") == MetricQuery("latency", "agg", "p99", 300.0)
    assert parse_metric_name("latency_agg_avg_30s") == MetricQuery("latency", "agg", "avg", 30.0)
    assert parse_metric_name("latency_agg_max_2h") == MetricQuery("latency", "agg", "max", 7200.0)
    assert parse_metric_name("latency_agg_min") == MetricQuery("latency", "agg", "min", None)
    for fn in AGG_FUNCTIONS:
        assert parse_metric_name(f"q_agg_{fn}") == MetricQuery("q", "agg", fn, None)


def test_last_agg_separator_wins():
    # the base name may itself contain _agg_ or end in _per_second
    assert parse_metric_name("x_agg_avg_agg_p50_1m") == MetricQuery("x_agg_avg", "agg", "p50", 60.0)
    assert parse_metric_name("x_per_second_agg_max_agg_p50") == MetricQuery(
        "x_per_second_agg_max", "agg", "p50", None
    )
    assert parse_metric_name("x__agg_avg") == MetricQuery("x_", "agg", "avg", None)
    # a name that is only the rate suffix is a series name, not a rate of "_total"
    assert parse_metric_name("_per_second_agg_avg") == MetricQuery("_per_second", "agg", "avg", None)


def test_rates_compose_with_aggregations():
    assert parse_metric_name("http_requests_per_second_agg_p99_5m") == MetricQuery(
        "http_requests_total", "rate_agg", "p99", 300.0
    )
    assert parse_metric_name("x_per_second_agg_max") == MetricQuery("x_total", "rate_agg", "max", None)
    assert parse_metric_name("a_per_second_per_second_agg_avg_1h") == MetricQuery(
        "a_per_second_total", "rate_agg", "avg", 3600.0
    )
    for fn in AGG_FUNCTIONS:
        q = MetricQuery("jobs_total", "rate_agg", fn, 30.0)
        assert parse_metric_name(f"jobs_per_second_agg_{fn}_30s") == q
        assert format_metric_name(q) == f"jobs_per_second_agg_{fn}_30s"
    assert format_metric_name(MetricQuery("jobs_total", "rate_agg", "p99", None)) == "jobs_per_second_agg_p99"
    with pytest.raises(ValueError, match="longer than the retention"):
        parse_metric_name("x_per_second_agg_p99_11m", max_window=600.0)
    with pytest.raises(ValueError, match="unknown aggregation function 'p42'"):
        parse_metric_name("x_per_second_agg_p42_5m")


def test_readings_try_the_literal_series_first():
    assert readings("x_per_second_agg_p99_5m") == [
        MetricQuery("x_per_second_agg_p99_5m", "latest"),
        MetricQuery("x_per_second", "agg", "p99", 300.0),  # a gauge pushed as x_per_second
        MetricQuery("x_total", "rate_agg", "p99", 300.0),
    ]
    assert readings("x_per_second") == [MetricQuery("x_per_second", "latest"), MetricQuery("x_total", "rate")]
    assert readings("x_agg_avg") == [MetricQuery("x_agg_avg", "latest"), MetricQuery("x", "agg", "avg", None)]
    assert readings("plain") == [MetricQuery("plain", "latest")]
    # outside the grammar (or beyond the retention): only the literal series can answer
    assert readings("x_agg_nope") == [MetricQuery("x_agg_nope", "latest")]
    assert readings("x_per_second_agg_avg_1h", 600.0) == [MetricQuery("x_per_second_agg_avg_1h", "latest")]


def test_window_limit():
    assert parse_metric_name("x_agg_avg_10m", max_window=600.0).window == 600.0
    with pytest.raises(ValueError, match="longer than the retention"):
        parse_metric_name("x_agg_avg_11m", max_window=600.0)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "must not be empty"),
        ("http-requests", "invalid metric name"),
        ("9lives", "invalid metric name"),
        ("a b", "invalid metric name"),
        ("x_agg_p98", "unknown aggregation function 'p98'"),
        ("x_agg_", "unknown aggregation function ''"),
        ("x_agg_mean_5m", "unknown aggregation function 'mean'"),
        ("_agg_avg", "no series name before"),
        ("x_agg_avg_", "invalid aggregation window ''"),
        ("x_agg_avg_5", "invalid aggregation window '5'"),
        ("x_agg_avg_5d", "invalid aggregation window '5d'"),
        ("x_agg_avg_0s", "invalid aggregation window '0s'"),
        ("x_agg_avg_05m", "invalid aggregation window '05m'"),
        ("x_agg_avg_5m_1s", "invalid aggregation window '5m_1s'"),
        ("x_agg_avg_m", "invalid aggregation window 'm'"),
        ("_per_second", "no counter name before"),
    ],
)
def test_malformed_names_say_what_is_wrong(name, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")) as info:
        parse_metric_name(name)
    if name:
        assert repr(name) in str(info.value) or name in str(info.value)


def test_validate_metric_name_rejects_non_strings():
    with pytest.raises(ValueError, match="must be a string"):
        validate_metric_name(42)  # type: ignore[arg-type]


def test_format_window_picks_largest_unit():
    assert format_window(3600) == "1h"
    assert format_window(300) == "5m"
    assert format_window(90) == "90s"
    assert format_window(5400) == "90m"
    for bad in (0, -60, 1.5):
        with pytest.raises(ValueError):
            format_window(bad)


def test_format_rejects_what_cannot_be_spelled():
    with pytest.raises(ValueError, match="_total"):
        format_metric_name(MetricQuery("requests", "rate"))
    with pytest.raises(ValueError, match="_total"):
        format_metric_name(MetricQuery("requests", "rate_agg", "p99", 300.0))
    with pytest.raises(ValueError, match="_total"):
        format_metric_name(MetricQuery("_total", "rate_agg", "p99", 300.0))
    with pytest.raises(ValueError, match="unknown aggregation"):
        format_metric_name(MetricQuery("x_total", "rate_agg", "median", None))
    with pytest.raises(ValueError, match="unknown aggregation"):
        format_metric_name(MetricQuery("x", "agg", "median", None))


# ------------------------------------------------------------------ grammar: properties

_first = st.sampled_from("abcxyzABC_:")
_rest = st.text(alphabet="abcz019_:", max_size=12)
names = st.builds(lambda a, b: a + b, _first, _rest)
windows = st.builds(lambda n, unit: float(n * unit), st.integers(1, 10_000), st.sampled_from([1, 60, 3600]))


# names ending in _per_second often enough for the composed form to be drawn
rate_names = st.builds(lambda n: n + "_per_second", names)


@st.composite
def queries(draw) -> MetricQuery:
    kind = draw(st.sampled_from(["latest", "rate", "agg", "rate_agg"]))
    if kind == "latest":
        name = draw(names.filter(lambda n: "_agg_" not in n and not n.endswith("_per_second")))
        return MetricQuery(name, "latest")
    if kind == "rate":
        return MetricQuery(draw(names.filter(lambda n: "_agg_" not in n)) + "_total", "rate")
    fn = draw(st.sampled_from(AGG_FUNCTIONS))
    window = draw(st.none() | windows)
    if kind == "rate_agg":
        return MetricQuery(draw(names) + "_total", "rate_agg", fn, window)
    # an aggregated series named <base>_per_second is spelled like the aggregation of a rate (the
    # store tells them apart by what it holds: readings()); every other series name round-trips
    series = draw(names.filter(lambda n: not n.endswith("_per_second") or n == "_per_second"))
    return MetricQuery(series, "agg", fn, window)


@given(queries())
def test_format_then_parse_round_trips(q):
    text = format_metric_name(q)
    assert parse_metric_name(text) == q
    assert format_metric_name(parse_metric_name(text)) == text
    assert readings(text)[0] == MetricQuery(text, "latest") and readings(text)[-1] == q


@given(rate_names, st.sampled_from(AGG_FUNCTIONS), st.none() | windows)
def test_an_aggregated_per_second_series_is_the_second_reading(series, fn, window):
    text = format_metric_name(MetricQuery(series, "agg", fn, window))
    counter = series[: -len("_per_second")] + "_total"
    assert parse_metric_name(text) == MetricQuery(counter, "rate_agg", fn, window)
    assert readings(text) == [
        MetricQuery(text, "latest"),
        MetricQuery(series, "agg", fn, window),
        MetricQuery(counter, "rate_agg", fn, window),
    ]


@given(names | st.builds(lambda a, b, c: a + b + c, rate_names, st.just("_agg_"), _rest))
def test_parse_then_format_round_trips_valid_names(name):
    try:
        q = parse_metric_name(name)
    except ValueError as e:
        # only a malformed aggregation suffix can be rejected once the characters are valid
        assert "_agg_" in name or name == "_per_second", e
        return
    assert parse_metric_name(format_metric_name(q)) == q


@given(st.text(max_size=20))
def test_parse_never_fails_other_than_value_error(text):
    try:
        q = parse_metric_name(text)
    except ValueError as e:
        assert str(e)
    else:
        assert q.series and q.kind in ("latest", "rate", "agg", "rate_agg")
        assert readings(text)[-1] == q


# ------------------------------------------------------------------ aggregation math

floats = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)


def nearest_rank(values, p):
    """Textbook nearest rank: the smallest value with at least p% of values <= it."""
    ordered = sorted(values)
    n = len(ordered)
    for i, v in enumerate(ordered):
        if (i + 1) * 100 >= p * n:
            return v
    raise AssertionError("unreachable")


@settings(max_examples=300)
@given(st.lists(floats, min_size=1, max_size=200))
def test_aggregations_match_direct_computation(values):
    assert aggregate("min", values) == min(values)
    assert aggregate("max", values) == max(values)
    assert aggregate("latest", values) == values[-1]
    assert aggregate("avg", values) == pytest.approx(math.fsum(values) / len(values), rel=1e-12, abs=1e-9)
    for fn, p in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
        got = aggregate(fn, values)
        assert got == nearest_rank(values, p)
        assert got in values
        assert sum(v <= got for v in values) * 100 >= p * len(values)
        assert sum(v < got for v in values) * 100 < p * len(values)


def test_percentile_examples():
    assert percentile([15, 20, 35, 40, 50], 50) == 35
    assert percentile([15, 20, 35, 40, 50], 90) == 50
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile(list(range(1, 101)), 95) == 95
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        aggregate("p42", [1.0])


def test_counter_rate_examples():
    assert counter_rate(0.0, 10.0, 10.0, 30.0) == 2.0
    assert counter_rate(0.0, 10.0, 10.0, 10.0) == 0.0
    assert counter_rate(0.0, 100.0, 10.0, 5.0) == 0.5  # reset: restarted from 0, counted 5 since
    assert counter_rate(0.0, 100.0, 10.0, 0.0) == 0.0
    assert counter_rate(0.0, 100.0, 10.0, -3.0) == 0.0  # never negative


@given(
    st.floats(0, 1e9),
    st.floats(min_value=1e-3, max_value=1e6),
    floats,
    floats,
)
def test_counter_rate_never_negative(t0, dt, v0, v1):
    r = counter_rate(t0, v0, t0 + dt, v1)
    assert r >= 0.0
    if v1 >= v0:
        assert r == pytest.approx((v1 - v0) / ((t0 + dt) - t0))


@given(st.lists(st.tuples(st.floats(min_value=1e-3, max_value=1e6), floats), max_size=30))
def test_counter_rates_are_counter_rate_between_consecutive_points(steps):
    times, values, t = [], [], 1e9
    for dt, v in steps:
        t += dt
        times.append(t)
        values.append(v)
    want = [counter_rate(times[i - 1], values[i - 1], times[i], values[i]) for i in range(1, len(times))]
    assert counter_rates(times, values) == want
    assert all(r >= 0.0 for r in want)
