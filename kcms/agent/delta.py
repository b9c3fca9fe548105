"""Running totals that turn OTLP delta-temporality points into cumulative counters.

An OpenTelemetry SDK configured for delta temporality sends, for each stream, what changed since its
previous export. Counters (monotonic sums), up-down counters and every series of a histogram
(``_bucket{le}``, ``_sum``, ``_count``) are additive, so the agent keeps one running total per
series (metric, object, labels) and exposes the total, as a cumulative exporter would have.

A point whose time is not after the previous point of its stream is a retry or arrived out of order:
adding it would count it twice, so it is refused (``delta_out_of_order``) and the total is unchanged.
Totals of streams silent for ``idle`` seconds are forgotten (the series then restart from zero, which
readers of counters treat as a reset), and at most ``max_series`` totals are kept: beyond, new
streams are refused (``delta_limit``). The receiver checks a point against its sender's series budget
(:class:`kcms.agent.otlp_bind.SenderSeries`, which remembers a series at least as long as these
totals do) before it reaches :meth:`DeltaTotals.accumulate`, so one sender holds at most its budget of
totals and cannot use up ``max_series`` for the other pods of the node.
"""

from __future__ import annotations

import time

from kcms.model import Labels, ObjectRef

Sample = tuple[str, ObjectRef, Labels, float, float]
_Key = tuple[str, ObjectRef, Labels]


class DeltaTotals:
    def __init__(self, max_series: int = 100_000, idle: float = 600.0) -> None:
        self.max_series = max_series
        self.idle = idle
        # series -> (time of its newest point, running total, monotonic time last touched)
        self._totals: dict[_Key, tuple[float, float, float]] = {}
        self._next_sweep = time.monotonic() + idle

    def __len__(self) -> int:
        return len(self._totals)

    def accumulate(self, samples: list[Sample]) -> tuple[list[Sample] | None, str]:
        """The cumulative samples of one delta point (all its samples share its time), or
        ``(None, reason)`` when the point must be refused; nothing changes then."""
        mono = time.monotonic()
        if mono >= self._next_sweep:
            self._sweep(mono)
        totals = self._totals
        new = 0
        for metric, obj, labels, ts, _ in samples:
            seen = totals.get((metric, obj, labels))
            if seen is None:
                new += 1
            elif ts <= seen[0]:
                return None, "delta_out_of_order"
        if new and len(totals) + new > self.max_series:
            return None, "delta_limit"
        out: list[Sample] = []
        for metric, obj, labels, ts, value in samples:
            key = (metric, obj, labels)
            seen = totals.get(key)
            total = value if seen is None else seen[1] + value
            totals[key] = (ts, total, mono)
            out.append((metric, obj, labels, ts, total))
        return out, ""

    def _sweep(self, mono: float) -> None:
        cutoff = mono - self.idle
        for key in [k for k, (_, _, touched) in self._totals.items() if touched < cutoff]:
            del self._totals[key]
        self._next_sweep = mono + self.idle / 4
