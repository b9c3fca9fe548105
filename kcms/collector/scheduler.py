"""The scrape loop: every resolution tick, every node, concurrently, each with its own deadline."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
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

# In the first cycle, each node that answers is scraped again once this long has passed since its
# own scrape and every node has had its first, so that it has two readings (and so a rate) within
# seconds of start rather than after two whole resolutions. At 5000 nodes the first pass takes
# 18-25 s, so by its end most nodes are due: their rescrapes follow at once, where a second cycle
# 2 s after the whole first one left the 2 s between them. (Rescrapes as soon as due, before the
# next node's first scrape, bought nothing at 5000 nodes: 95 % of nodes served after 25.8-31.6 s
# against 27.0-30.6 s, four starts each, alternated, the start being CPU-bound on this machine;
# and the 150 000-pod list, sharing the cores with them, took 30.6-32.6 s against 20.6-23.1 s.)
FIRST_RESCRAPE_DELAY = 2.0
# A kubelet serves its stats as of its last housekeeping (cAdvisor's, every 10-15 s), so a
# rescrape 2 s later often brings the same reading (no rate). While it does, the node is scraped
# again after twice the last wait (2, 4, 8 s: 14 s in all, a housekeeping period), at most this
# many times in all; a kubelet that stamps every scrape anew (the simulator, CRI stats) needs one.
FIRST_RESCRAPES = 3


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
        self.last_scrape_started = 0.0  # monotonic: a cycle still under way is not stuck
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
        """Liveness: the loop started a cycle, or a scrape, recently (it is not stuck). A scrape
        counts: the first cycle's rescrapes can take it past the limit at thousands of nodes (a
        pass of 18-25 s, then up to 14 s of waits for a kubelet serving the same reading)."""
        if self._task is None or self._task.done():
            return False, "scrape loop is not running"
        if self.last_cycle_started == 0.0:
            return True, "waiting for the first cycle"
        age = time.monotonic() - max(self.last_cycle_started, self.last_scrape_started)
        limit = 2 * self.resolution + self.timeout
        if age > limit:
            return False, f"last scrape cycle or scrape started {age:.1f}s ago (limit {limit:.1f}s)"
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
        next_tick = time.monotonic()
        await self.run_cycle(rescrape_after=FIRST_RESCRAPE_DELAY)
        while True:
            next_tick += self.resolution
            delay = next_tick - time.monotonic()
            if delay < 0:  # a cycle overran: skip the missed ticks rather than bunch them up
                next_tick += (-delay // self.resolution + 1) * self.resolution
                delay = next_tick - time.monotonic()
            await asyncio.sleep(delay)
            await self.run_cycle()

    async def run_cycle(self, rescrape_after: float | None = None) -> int:
        """Scrape every node once; return how many scrapes failed. With ``rescrape_after`` (the
        first cycle), each node that answered is scraped again in the same cycle, once every node
        has had its first scrape and that many seconds have passed since its own (see
        FIRST_RESCRAPES for a kubelet that answers with the same reading again)."""
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
        # rescrapes by when they are due: (due, order, node, rescrapes before it, node reading's time)
        again: list[tuple[float, int, NodeInfo, int, float]] = []
        order = itertools.count()
        firsts_open = [0]  # first scrapes under way: each may add a rescrape
        passed = [False]  # every node has had its first scrape (or has one under way)

        def rescrape(node: NodeInfo, tries: int, stamp: float) -> None:
            assert rescrape_after is not None
            due = time.monotonic() + rescrape_after * 2**tries
            heapq.heappush(again, (due, next(order), node, tries, stamp))

        async def worker() -> None:
            while True:
                node = next(queue, None)
                if node is not None:
                    firsts_open[0] += 1
                    batch = await self._scrape_one(node)
                    firsts_open[0] -= 1
                    if batch is None:
                        failed[0] += 1
                    elif rescrape_after is not None:
                        rescrape(node, 0, _reading_time(batch))
                    continue
                if rescrape_after is not None and not passed[0]:
                    passed[0] = True
                    # The rescrapes come all at once now: spread their decodes over turns of the
                    # loop as a cycle's are at its start. Decoded as they came (the spread of a
                    # 5000-node cycle's start long over), they held the loop, and the 150 000-pod
                    # list, fetched page by page meanwhile, took 26.1 s against 17.8 (two starts each).
                    self.client.spread_decodes(self.resolution / 3)
                now = time.monotonic()
                if again and again[0][0] <= now:
                    _, _, node, tries, stamp = heapq.heappop(again)
                    batch = await self._scrape_one(node)
                    if batch is None:
                        failed[0] += 1
                    elif stamp and _reading_time(batch) == stamp and tries + 1 < FIRST_RESCRAPES:
                        rescrape(node, tries + 1, stamp)  # the same reading again: no rate yet
                elif rescrape_after is not None and (again or firsts_open[0]):
                    # Anything added meanwhile is due at least rescrape_after from now: sleeping no
                    # longer than that, a worker is never late for it (nor ever busy-waits).
                    until = again[0][0] - now if again else math.inf
                    await asyncio.sleep(min(until, max(rescrape_after, 0.05)))
                else:
                    return

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

    async def _scrape_one(self, node: NodeInfo) -> NodeBatch | None:
        """Scrape ``node`` into the sink; the batch, or None when it failed."""
        t0 = self.last_scrape_started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                batch = await self.client.scrape(node)
        except ScrapeError as e:
            self.status.failure(node.name, e.reason)
            self._failed(node.name, e.reason, str(e))
            return None
        except TimeoutError:
            self.status.failure(node.name, "timeout")
            self._failed(node.name, "timeout", f"no answer within {self.timeout:.1f}s")
            return None
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
        return batch

    @staticmethod
    def _failed(node: str, reason: str, message: str) -> None:
        SCRAPES.labels("failure").inc()
        SCRAPE_FAILURES.labels(node, reason).inc()
        log.warning("scrape of node %s failed (%s): %s", node, reason, message)


def _reading_time(batch: NodeBatch) -> float:
    """When the kubelet took the node's reading (0.0 without one): the same again means the same
    stats again, as of the kubelet's last housekeeping."""
    return batch.node_point.timestamp if batch.node_point is not None else 0.0
