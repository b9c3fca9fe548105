"""Sparklines of the history API (history.kcms.io/v1alpha1): one row's last minutes in block characters.

The window (``--since``, default 5m) is cut into slots of one resolution (the median spacing of the
points, 15 s by default), at most `MAX_WIDTH`; the slots end half a slot after the newest point of the
whole answer (the server's clock, not ours), so every row shares one time axis and a point's jitter of
up to half a resolution keeps it in its slot. A slot holds the mean of its points; a slot without a
point is a space (the object did not exist yet, or was not scraped). Heights are relative to the row's
own peak in the window: ``▁`` is zero, ``█`` the peak, so the shape of a small pod is as visible as a
large one's (the CPU and MEMORY columns give the magnitude).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from datetime import datetime

BLOCKS = "▁▂▃▄▅▆▇█"
MAX_WIDTH = 40
DEFAULT_RESOLUTION = 15.0

_FRACTION = re.compile(r"\.(\d{1,6})\d*")


def parse_time(text: object) -> float | None:
    """An RFC 3339 timestamp in seconds since the epoch; None when it is not one."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        return datetime.fromisoformat(_FRACTION.sub(r".\1", text, count=1).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def resolution(series: Iterable[Sequence[tuple[float, float]]]) -> float:
    """The median spacing of consecutive points over all series (DEFAULT_RESOLUTION without any);
    of two middle gaps, the larger: a node's first two readings come seconds apart at start (its
    first point, then one a resolution on: 13 and 15 s), which would make the slots narrower while
    a series has few points."""
    gaps = [b[0] - a[0] for s in series for a, b in zip(s, s[1:], strict=False) if b[0] > a[0]]
    return statistics.median_high(gaps) if gaps else DEFAULT_RESOLUTION


class Axis:
    """The shared time axis of one table: ``width`` slots of ``slot`` seconds ending at ``end``."""

    def __init__(self, newest: float, since: float, step: float) -> None:
        step = max(step, 1.0)
        self.width = max(1, min(MAX_WIDTH, round(since / step)))
        self.slot = since / self.width
        self.end = newest + self.slot / 2
        self.start = self.end - since

    def render(self, points: Sequence[tuple[float, float]]) -> str:
        """The sparkline of (time, value) points (any order; values >= 0)."""
        sums = [0.0] * self.width
        counts = [0] * self.width
        for t, v in points:
            if t < self.start or t > self.end:
                continue
            i = min(self.width - 1, int((t - self.start) / self.slot))
            sums[i] += max(v, 0.0)
            counts[i] += 1
        means = [s / c if c else None for s, c in zip(sums, counts, strict=True)]
        peak = max((m for m in means if m is not None), default=0.0)
        out = []
        for m in means:
            if m is None:
                out.append(" ")
            elif peak <= 0:
                out.append(BLOCKS[0])
            else:
                out.append(BLOCKS[min(len(BLOCKS) - 1, int(m / peak * len(BLOCKS)))])
        return "".join(out)
