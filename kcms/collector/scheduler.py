"""The scrape loop: every resolution tick, every node, concurrently, each with its own deadline."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram

from kcms.collector.kubelet import KubeletClient, ScrapeError
from kcms.collector.status import ScrapeStatus
from kcms.model import Inventory, NodeBatch, NodeInfo
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SCRAPE_DURATION = Histogram(
    "kcms_kubelet_scrape_duration_seconds",
    "Time to fetch and decode one kubelet's resource metrics.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
CYCLE_DURATION = Histogram(
    "kcms_scrape_cycle_duration_seconds",
    "Time to scrape every node once.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30),
)
SCRAPE_FAILURES = Counter(
    "kcms_kubelet_scrape_failures_total", "Failed node scrapes, by node and reason.", ["node", "reason"]
)
SCRAPES = Counter("kcms_kubelet_scrapes_total", "Node scrapes, by result.", ["result"])
_SUCCEEDED = SCRAPES.labels("success")  # once, not per scrape (labels() is ~1.3 us a call)
REJECTED = Counter("kcms_kubelet_rejected_samples_total", "Kubelet samples dropped, by reason.", ["reason"])
LAST_CYCLE = Gauge("kcms_scrape_last_cycle_timestamp_seconds", "When the last scrape cycle started.")
MISSING = Gauge(
    "kcms_kubelet_nodes_missing",
    "Nodes of the inventory with no successful scrape for more than a resolution (plus the scrape "
    "timeout); each is scraped again every cycle.",
)

# After the first cycle, the next one comes this soon, so that every node has two readings
# (and so a rate) within seconds of start rather than after two whole resolutions.
FIRST_RESCRAPE_DELAY = 2.0


class Collector:
    """Scrapes every node of an inventory each ``resolution`` seconds into a sink."""

    def __init__(
        self,
        inventory: Inventory,
        client: KubeletClient,
        sink: Callable[[NodeBatch], None],
        *,
        resolution: float = 15.0,
        timeout: float | None = None,
        max_in_flight: int = 200,
        node_filter: Callable[[NodeInfo], bool] | None = None,
        on_cycle: Callable[[], None] | None = None,
    ) -> None:
        self.inventory = inventory
        self.client = client
        self.sink = sink
        self.resolution = resolution
        # metrics-server's default: 90% of the resolution, so a cycle never overruns the next.
        self.timeout = timeout if timeout is not None else 0.9 * resolution
        self.node_filter = node_filter
        self.on_cycle = on_cycle
        self.max_in_flight = max(1, max_in_flight)
        self._task: asyncio.Task[None] | None = None
        self.last_cycle_started = 0.0  # monotonic; 0 until the first cycle
        self.cycles = 0
        self.last_cycle_seconds = 0.0
        self.last_cycle_failures = 0
        # node -> monotonic time of its last successful scrape, or of the cycle that first saw it
        # (a node that never answered counts as missing one resolution after it appeared)
        self._last_success: dict[str, float] = {}
        self.status = ScrapeStatus()  # per node: last success, last error, failures in a row

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kcms-scrape-loop")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def healthy(self) -> tuple[bool, str]:
        """Liveness: the loop started a cycle recently (it is not stuck)."""
        if self._task is None or self._task.done():
            return False, "scrape loop is not running"
        if self.last_cycle_started == 0.0:
            return True, "waiting for the first cycle"
        age = time.monotonic() - self.last_cycle_started
        limit = 2 * self.resolution + self.timeout
        if age > limit:
            return False, f"last scrape cycle started {age:.1f}s ago (limit {limit:.1f}s)"
        return True, "ok"

    def missing_nodes(self, now: float | None = None) -> list[str]:
        """Nodes (sorted) without a successful scrape for more than a resolution plus the timeout."""
        horizon = (time.monotonic() if now is None else now) - self.resolution - self.timeout
        return sorted(n for n, t in self._last_success.items() if t < horizon)

    def missing_check(self) -> tuple[bool, str]:
        """For ``/readyz?verbose``: always passing (a node down is not this server's failure, as in
        metrics-server), its detail names the missing nodes."""
        missing = self.missing_nodes()
        MISSING.set(len(missing))
        if not missing:
            return True, "ok"
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        return True, f"{len(missing)} of {len(self._last_success)} nodes not scraped for over a resolution: {shown}"

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        # Scraping needs only the nodes: start as soon as they are listed, not after a 150 000-pod
        # list. The Inventory protocol offers only a probe, so poll it.
        while not self.inventory.nodes_synced():  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        await self.run_cycle()
        await asyncio.sleep(FIRST_RESCRAPE_DELAY)
        next_tick = time.monotonic()
        while True:
            await self.run_cycle()
            next_tick += self.resolution
            delay = next_tick - time.monotonic()
            if delay < 0:  # a cycle overran: skip the missed ticks rather than bunch them up
                next_tick += (-delay // self.resolution + 1) * self.resolution
                delay = next_tick - time.monotonic()
            await asyncio.sleep(delay)

    async def run_cycle(self) -> int:
        """Scrape every node once; return how many failed."""
        t0 = time.monotonic()
        self.last_cycle_started = t0
        LAST_CYCLE.set(time.time())
        # Decodes spread over turns of the loop for a third of the resolution at most: a cycle
        # that has run longer is behind (spread over whole cycles, 5000-node cycles under two
        # clients listing every pod took 8.4-13.9 s of the 15; quiet, ~3.7 s).
        self.client.start_cycle(spread_for=self.resolution / 3)
        nodes = [n for n in self.inventory.nodes() if self.node_filter is None or self.node_filter(n)]
        seen = self._last_success
        self._last_success = {n.name: seen.get(n.name, t0) for n in nodes}  # nodes gone are forgotten
        self.status.retain(self._last_success)
        # At most max_in_flight workers, each scraping the next node not taken yet (in the nodes'
        # order, as a semaphore's queue gave them) until none is left. A task per node (5000 at
        # once) made the cycle's first turn of the event loop run 5000 task steps, and a list or
        # probe arriving then waited behind them all.
        queue = iter(nodes)
        failed = [0]

        async def worker() -> None:
            for node in queue:
                if not await self._scrape_one(node):
                    failed[0] += 1

        await asyncio.gather(*(worker() for _ in range(min(self.max_in_flight, len(nodes)))))
        failures = failed[0]
        elapsed = time.monotonic() - t0
        CYCLE_DURATION.observe(elapsed)
        self.cycles += 1
        self.last_cycle_seconds = elapsed
        self.last_cycle_failures = failures
        MISSING.set(len(self.missing_nodes()))
        if self.on_cycle is not None:
            self.on_cycle()
        log.debug("scrape cycle: %d nodes, %d failed, %.3fs", len(nodes), failures, elapsed)
        return failures

    async def _scrape_one(self, node: NodeInfo) -> bool:
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                batch = await self.client.scrape(node)
        except ScrapeError as e:
            self.status.failure(node.name, e.reason)
            return self._failed(node.name, e.reason, str(e))
        except TimeoutError:
            self.status.failure(node.name, "timeout")
            return self._failed(node.name, "timeout", f"no answer within {self.timeout:.1f}s")
        SCRAPE_DURATION.observe(time.monotonic() - t0)
        _SUCCEEDED.inc()
        self.status.success(node.name)
        if node.name in self._last_success:
            self._last_success[node.name] = time.monotonic()
        for reason, count in batch.rejected.items():
            REJECTED.labels(reason).inc(count)
        if batch.rejected:
            log.info("node %s: dropped samples %s", node.name, batch.rejected)
        self.sink(batch)
        return True

    @staticmethod
    def _failed(node: str, reason: str, message: str) -> bool:
        SCRAPES.labels("failure").inc()
        SCRAPE_FAILURES.labels(node, reason).inc()
        log.warning("scrape of node %s failed (%s): %s", node, reason, message)
        return False
