"""The metric-name grammar of custom and external metrics, and the aggregation math behind it.

A requested metric name is one of::

    <name>                                  the latest value of the series <name> (gauge semantics)
    <base>_per_second                       the per-second rate of the counter series <base>_total,
                                            from its last two points (counter resets handled, never
                                            negative)
    <name>_agg_<fn>                         fn over the store's default window of the series <name>
    <name>_agg_<fn>_<window>                fn over <window> = <positive int>(s|m|h), e.g. p99_5m, avg_30s
    <base>_per_second_agg_<fn>              fn over the per-second rates of the counter <base>_total
    <base>_per_second_agg_<fn>_<window>     in the window: n points of the counter in the window give
                                            the n - 1 rates between consecutive ones (each as in
                                            <base>_per_second); e.g. http_requests_per_second_agg_p99_5m

with ``fn`` one of :data:`AGG_FUNCTIONS`. A window is ``[newest - window, newest]`` of the series
(both ends included) and a value's reported window is the span its points actually cover, newest
minus oldest point used (for a rate aggregation: from the oldest counter point in the window to the
newest; ``latest`` of rates covers the last two points); a window with fewer than 2 counter points
has no rate and gives no value.

The store resolves a requested name by trying the literal series name first, then these forms, so a
series that happens to be called ``x_per_second`` is still served as itself, and
``x_per_second_agg_<fn>`` aggregates that series' values rather than rates of ``x_total`` — in the
resource and namespace where the literal series exists; elsewhere the name keeps its derived meaning
(a tenant's literal series never hides another namespace's rate). :func:`readings` lists those
readings in that order. :func:`parse_metric_name` is the grammar alone (it knows nothing of what is
stored); :func:`format_metric_name` is its inverse.

Percentiles use the nearest-rank method over the values inside the window: the value at rank
``ceil(p / 100 * n)`` of the ``n`` sorted values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AGG_FUNCTIONS",
    "MetricQuery",
    "aggregate",
    "counter_rate",
    "counter_rates",
    "format_metric_name",
    "format_window",
    "parse_metric_name",
    "percentile",
    "readings",
    "validate_metric_name",
]

AGG_FUNCTIONS = ("avg", "min", "max", "p50", "p90", "p95", "p99", "latest")
_PERCENTILES = {"p50": 50, "p90": 90, "p95": 95, "p99": 99}

_METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*", re.ASCII)
_WINDOW_RE = re.compile(r"([1-9][0-9]{0,8})([smh])", re.ASCII)
_UNITS = {"s": 1, "m": 60, "h": 3600}

_AGG_SEP = "_agg_"
_RATE_SUFFIX = "_per_second"
_COUNTER_SUFFIX = "_total"

Kind = Literal["latest", "rate", "agg", "rate_agg"]


@dataclass(frozen=True, slots=True)
class MetricQuery:
    """What a requested metric name asks for.

    ``series`` is the stored series it reads; ``kind`` is ``"latest"`` (the last value), ``"rate"``
    (per-second rate of a counter), ``"agg"`` (``fn`` over ``window`` seconds of the values;
    ``window`` ``None`` means the store's default window) or ``"rate_agg"`` (``fn`` over the
    per-second rates of a counter in ``window`` seconds).
    """

    series: str
    kind: Kind
    fn: str | None = None
    window: float | None = None


def validate_metric_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is a metric name (``[a-zA-Z_:][a-zA-Z0-9_:]*``)."""
    if not isinstance(name, str):
        raise ValueError(f"metric name must be a string, not {type(name).__name__}")
    if not name:
        raise ValueError("metric name must not be empty")
    if _METRIC_NAME_RE.fullmatch(name) is None:
        raise ValueError(f"invalid metric name {name!r}: must match [a-zA-Z_:][a-zA-Z0-9_:]*")


def parse_window(text: str, name: str = "") -> float:
    """Seconds in a window such as ``30s``, ``5m`` or ``1h`` (``ValueError`` if malformed)."""
    m = _WINDOW_RE.fullmatch(text)
    if m is None:
        where = f" in metric name {name!r}" if name else ""
        raise ValueError(
            f"invalid aggregation window {text!r}{where}: must be a positive integer without leading "
            "zeros followed by s, m or h (e.g. 30s, 5m, 1h)"
        )
    return float(int(m.group(1)) * _UNITS[m.group(2)])


def format_window(seconds: float) -> str:
    """The shortest grammar form of a whole, positive number of seconds (``300`` -> ``5m``)."""
    if seconds != int(seconds) or seconds <= 0:
        raise ValueError(f"window must be a positive whole number of seconds, not {seconds!r}")
    s = int(seconds)
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


def parse_metric_name(name: str, max_window: float | None = None) -> MetricQuery:
    """Parse a requested metric name (see the module docstring).

    Raises ``ValueError`` naming the problem for an invalid metric name, an empty base name, an
    unknown aggregation function, a malformed window, or a window longer than ``max_window``.
    """
    validate_metric_name(name)
    base, sep, suffix = name.rpartition(_AGG_SEP)
    if sep:
        if not base:
            raise ValueError(f"metric name {name!r} has no series name before {_AGG_SEP!r}")
        fn, usep, wtext = suffix.partition("_")
        if fn not in AGG_FUNCTIONS:
            raise ValueError(
                f"unknown aggregation function {fn!r} in metric name {name!r}: "
                f"expected one of {', '.join(AGG_FUNCTIONS)}"
            )
        window: float | None = None
        if usep:
            window = parse_window(wtext, name)
            if max_window is not None and window > max_window:
                raise ValueError(
                    f"aggregation window {wtext!r} in metric name {name!r} is longer than the "
                    f"retention of {max_window:g}s"
                )
        if base.endswith(_RATE_SUFFIX) and len(base) > len(_RATE_SUFFIX):
            # the window aggregation of a rate: fn over the rates of the counter <base>_total
            return MetricQuery(base[: -len(_RATE_SUFFIX)] + _COUNTER_SUFFIX, "rate_agg", fn, window)
        return MetricQuery(base, "agg", fn, window)
    if name.endswith(_RATE_SUFFIX):
        base = name[: -len(_RATE_SUFFIX)]
        if not base:
            raise ValueError(f"metric name {name!r} has no counter name before {_RATE_SUFFIX!r}")
        return MetricQuery(base + _COUNTER_SUFFIX, "rate")
    return MetricQuery(name, "latest")


def format_metric_name(query: MetricQuery) -> str:
    """The requested name that :func:`parse_metric_name` turns back into ``query``."""
    if query.kind == "latest":
        return query.series
    if query.kind in ("rate", "rate_agg"):
        if not query.series.endswith(_COUNTER_SUFFIX) or len(query.series) == len(_COUNTER_SUFFIX):
            raise ValueError(f"a rate reads a counter named <base>_total, not {query.series!r}")
        rate = query.series[: -len(_COUNTER_SUFFIX)] + _RATE_SUFFIX
        if query.kind == "rate":
            return rate
        return format_metric_name(MetricQuery(rate, "agg", query.fn, query.window))
    if query.kind == "agg":
        if query.fn not in AGG_FUNCTIONS:
            raise ValueError(f"unknown aggregation function {query.fn!r}")
        text = f"{query.series}{_AGG_SEP}{query.fn}"
        if query.window is not None:
            text += "_" + format_window(query.window)
        return text
    raise ValueError(f"unknown query kind {query.kind!r}")


def readings(name: str, max_window: float | None = None) -> list[MetricQuery]:
    """The readings of a requested name in the order the store tries them; the first whose series
    exists in the requested scope answers. Never raises: a name outside the grammar has only its
    literal reading.

    The literal series ``name`` comes first; for ``<base>_per_second_agg_<fn>[_<window>]`` the
    aggregation of a literal series ``<base>_per_second`` (a gauge pushed under that name, as before
    rates composed with aggregations) comes before the aggregation of the rates of ``<base>_total``.
    """
    out = [MetricQuery(name, "latest")]
    try:
        q = parse_metric_name(name, max_window)
    except ValueError:
        return out
    if q.kind == "rate_agg":
        rate = q.series[: -len(_COUNTER_SUFFIX)] + _RATE_SUFFIX
        out.append(MetricQuery(rate, "agg", q.fn, q.window))
    if q.kind != "latest":
        out.append(q)
    return out


def percentile(values: Sequence[float], p: int) -> float:
    """Nearest-rank ``p``-th percentile (0 < p <= 100) of a non-empty sequence."""
    n = len(values)
    rank = (p * n + 99) // 100  # ceil(p * n / 100), exact in integers
    return sorted(values)[max(rank, 1) - 1]


def aggregate(fn: str, values: Sequence[float]) -> float:
    """``fn`` (one of :data:`AGG_FUNCTIONS`) over a non-empty sequence of values in time order."""
    if fn == "avg":
        try:
            mean = math.fsum(values) / len(values)
        except OverflowError:  # finite values near the float limit: their sum overflows, the mean does not
            # Each term at most max/(2n), so fsum's partial sums stay within max/2 (with v / n, three
            # values at the float limit overflowed it).
            n2 = 2 * len(values)
            mean = 2 * math.fsum(v / n2 for v in values)
        # Both roundings (the sum's, then the division's; or each term's) may put the mean an ulp
        # past the values, or the doubled sum at inf: the mean of three 6.467654830448661e16 came
        # out 6.4676548304486616e16 (found by CI's hypothesis run). The mean lies within them.
        return min(max(mean, min(values)), max(values))
    if fn == "max":
        return max(values)
    if fn == "min":
        return min(values)
    if fn == "latest":
        return values[-1]
    p = _PERCENTILES.get(fn)
    if p is None:
        raise ValueError(f"unknown aggregation function {fn!r}")
    return percentile(values, p)


def counter_rate(t0: float, v0: float, t1: float, v1: float) -> float:
    """Per-second rate of a counter between two points (``t1 > t0``), never negative.

    A decrease is a counter reset: the counter restarted from zero inside the interval, so at least
    ``v1`` was counted since; the rate is ``v1 / (t1 - t0)`` (a lower bound) rather than skipped.
    """
    dt = t1 - t0
    if v1 >= v0:
        return (v1 - v0) / dt
    return v1 / dt if v1 > 0 else 0.0


def counter_rates(times: Sequence[float], values: Sequence[float]) -> list[float]:
    """:func:`counter_rate` between each pair of consecutive points (strictly increasing ``times``):
    ``len(times) - 1`` rates. The same arithmetic inline, as one loop: the call per pair cost half of
    a 5-minute rate aggregation's time."""
    out: list[float] = []
    append = out.append
    it = zip(times, values, strict=True)
    for t0, v0 in it:
        for t1, v1 in it:
            dt = t1 - t0
            append((v1 - v0) / dt if v1 >= v0 else (v1 / dt if v1 > 0 else 0.0))
            t0, v0 = t1, v1
    return out
