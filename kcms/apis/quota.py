"""New-series quotas for pushed metrics: per writer, per metric name and in total.

A push path (``kcms.apis.push`` for ``/push/v1/samples``, ``kcms.apis.nodepush`` for node reports)
asks :meth:`SeriesQuota.check` before storing a point and calls :meth:`SeriesQuota.record` after
the store took it. A series already known is never refused here (it keeps accepting points, so a
full quota never stops data that is already flowing); a *new* series is refused when

- its writer (the authenticated user name; a ServiceAccount is ``system:serviceaccount:<ns>:<name>``)
  already created ``max_per_writer`` live series: ``series_limit_writer``;
- its metric name already has ``max_per_metric`` live series: ``series_limit_metric``;
- ``max_total`` live series exist: ``series_limit_total``.

The per-writer limit is what keeps one writer from exhausting the cluster-wide cap for everyone:
with the defaults of ``kcms server`` (10 000 per writer, 100 000 in total) ten writers at their
quota are needed to fill the total.

A series counts against the writer that created it until it expires: no point for ``ttl`` seconds
(of ``clock``, monotonic). Another writer allowed to write the same series (RBAC decided that
before the quota is asked) keeps it alive without taking it over, so a writer's count only grows
through its own checks. Expiry is amortised: at most every ``ttl / 16`` seconds, least recently
written first, so its cost is the number of series forgotten.

Keys are opaque hashables that identify a series across metric names (``kcms.apis.push`` passes
``hash((metric, object, labels))``); only keys are kept, never the series' strings.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

# Refusal reasons (stable: Prometheus label values and answer keys of every push path).
SERIES_LIMIT_WRITER = "series_limit_writer"
SERIES_LIMIT_METRIC = "series_limit_metric"
SERIES_LIMIT_TOTAL = "series_limit_total"


class SeriesQuota:
    """Counts live series per writer, per metric and in total, and refuses new ones past the limits.

    A limit of ``None`` is no limit. Not thread-safe: used from one event loop.
    """

    def __init__(
        self,
        *,
        max_total: int | None = 100_000,
        max_per_writer: int | None = 10_000,
        max_per_metric: int | None = 10_000,
        ttl: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl <= 0 or not math.isfinite(ttl):
            raise ValueError(f"ttl must be a positive number of seconds, not {ttl}")
        self.max_total = max_total
        self.max_per_writer = max_per_writer
        self.max_per_metric = max_per_metric
        self.ttl = float(ttl)
        self.clock = clock
        # key -> [writer, metric, last write time]; least recently written first.
        self._series: OrderedDict[Hashable, list] = OrderedDict()
        self._per_writer: dict[str, int] = {}
        self._per_metric: dict[str, int] = {}
        self._next_expiry = -math.inf

    def check(self, writer: str, metric: str, key: Hashable) -> str | None:
        """The reason a point of series ``key`` from ``writer`` must be refused, or None.

        Only a new series can be refused. Before refusing, series past their TTL are forgotten
        (amortised), so a quota frees up even when no known series is written any more."""
        if key in self._series:
            return None
        reason = self._over(writer, metric)
        if reason is not None:
            self.expire()
            reason = self._over(writer, metric)
        return reason

    def _over(self, writer: str, metric: str) -> str | None:
        if self.max_per_writer is not None and self._per_writer.get(writer, 0) >= self.max_per_writer:
            return SERIES_LIMIT_WRITER
        if self.max_per_metric is not None and self._per_metric.get(metric, 0) >= self.max_per_metric:
            return SERIES_LIMIT_METRIC
        if self.max_total is not None and len(self._series) >= self.max_total:
            return SERIES_LIMIT_TOTAL
        return None

    def record(self, writer: str, metric: str, key: Hashable, now: float) -> None:
        """Note that a point of series ``key`` was stored at ``now`` (``clock`` time). A new series
        counts against ``writer`` and ``metric``; a known one is refreshed (its creator is kept)."""
        entry = self._series.get(key)
        if entry is not None:
            entry[2] = now
            self._series.move_to_end(key)
        else:
            self._series[key] = [writer, metric, now]
            self._per_writer[writer] = self._per_writer.get(writer, 0) + 1
            self._per_metric[metric] = self._per_metric.get(metric, 0) + 1
        if now >= self._next_expiry:
            self._expire(now)

    def count(self, writer: str | None = None, metric: str | None = None) -> int:
        """Live series: of one writer, of one metric, or (neither given) in total. Both given: the
        series of that metric created by that writer (a scan; for tests and diagnostics)."""
        self._expire(self.clock())
        if writer is not None and metric is not None:
            return sum(1 for w, m, _ in self._series.values() if w == writer and m == metric)
        if writer is not None:
            return self._per_writer.get(writer, 0)
        if metric is not None:
            return self._per_metric.get(metric, 0)
        return len(self._series)

    def writers(self) -> dict[str, int]:
        """Live series per writer (a copy)."""
        self._expire(self.clock())
        return dict(self._per_writer)

    def expire(self) -> None:
        """Forget expired series now if the amortisation period has passed."""
        now = self.clock()
        if now >= self._next_expiry:
            self._expire(now)

    def _expire(self, now: float) -> None:
        self._next_expiry = now + self.ttl / 16
        horizon = now - self.ttl
        series = self._series
        while series:
            key, (writer, metric, last) = next(iter(series.items()))
            if last >= horizon:
                break
            del series[key]
            _decrement(self._per_writer, writer)
            _decrement(self._per_metric, metric)


def _decrement(counts: dict[str, int], key: str) -> None:
    n = counts[key] - 1
    if n:
        counts[key] = n
    else:
        del counts[key]
