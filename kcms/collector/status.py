"""Per-node scrape status as the collector sees it, for the history API's ``scrapes`` resource.

Kept by :class:`~kcms.collector.scheduler.Collector` (in-process scraping) and
:class:`~kcms.collector.workers.ScrapeWorkers` (the parent, from its workers' batches and cycle
summaries) alike: the wall-clock time of each node's last successful scrape, the reason of its
last failure (a bounded label such as ``timeout``, ``http_status``, ``tls``), and how many scrapes
in a row failed. Nodes leave with the inventory (:meth:`ScrapeStatus.retain`), so it is bounded by
the node count.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class NodeScrape:
    last_success: float | None = None  # wall clock, seconds since the epoch
    last_error: str | None = None  # the reason of the newest failure, cleared by a success
    consecutive_failures: int = 0


class ScrapeStatus:
    """node -> :class:`NodeScrape`."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeScrape] = {}

    def retain(self, nodes: Iterable[str]) -> None:
        """Keep exactly these nodes (new ones start with no scrape yet)."""
        old = self._nodes
        self._nodes = {n: old.get(n) or NodeScrape() for n in nodes}

    def success(self, node: str, now: float | None = None) -> None:
        entry = self._nodes.get(node)
        if entry is not None:
            entry.last_success = time.time() if now is None else now
            entry.last_error = None
            entry.consecutive_failures = 0

    def failure(self, node: str, reason: str) -> None:
        entry = self._nodes.get(node)
        if entry is not None:
            entry.last_error = reason
            entry.consecutive_failures += 1

    def get(self, node: str) -> NodeScrape | None:
        return self._nodes.get(node)

    def items(self) -> list[tuple[str, NodeScrape]]:
        return sorted(self._nodes.items())
