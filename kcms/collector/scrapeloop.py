"""``--scrape-workers``: which scrape loop `kcms standalone` runs, and what ``auto`` means.

0: :class:`~kcms.collector.scheduler.Collector` in the serving process (as before workers
existed); N: :class:`~kcms.collector.workers.ScrapeWorkers` with N child processes; ``auto``
(the default): decided once the first node list is in (:func:`auto_workers`), by
:class:`AutoScrape` when the list is not in yet at wiring time.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from kcms.collector.kubelet import KubeletClient
from kcms.collector.scheduler import Collector
from kcms.collector.status import ScrapeStatus
from kcms.collector.workers import WORKERS, ScrapeWorkers
from kcms.model import Inventory, NodeBatch, NodeInfo
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# --scrape-workers auto: one worker once the first node list has AUTO_MIN_NODES nodes (after
# --node-selector) and this process may run on AUTO_MIN_CPUS CPUs or more; else in-process.
# Measured (bench/resource_pipeline.py on a 2-core machine that also runs the 5000 simulated
# kubelets and the list clients): at 1000 nodes a worker bought nothing and cost ~28 MB (39 MB RSS
# of its own); at 5000 nodes, against the current in-process loop, it cost 30-38 % more CPU and no
# list or scrape got better, because there was no idle core for it. So on 2 or 3 CPUs: no worker.
# With 4 or more a core is spare for it (not measured here: no such machine); at 50 nodes a
# worker would be more than metrics-server's whole footprint.
AUTO_MIN_NODES = 1000
AUTO_MIN_CPUS = 4


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_workers(nodes: int, cpus: int) -> int:
    """What ``--scrape-workers auto`` means for a first node list of ``nodes`` on ``cpus`` CPUs."""
    return 1 if nodes >= AUTO_MIN_NODES and cpus >= AUTO_MIN_CPUS else 0


class AutoScrape:
    """``--scrape-workers auto`` while the node list is not known yet: once the inventory has
    synced, becomes :class:`ScrapeWorkers` with one worker or an in-process :class:`Collector`
    (see :func:`auto_workers`) and delegates to it."""

    def __init__(self, inventory: Inventory, choose: Callable[[], Collector | ScrapeWorkers]) -> None:
        self.inventory = inventory
        self._choose = choose
        self.active: Collector | ScrapeWorkers | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kcms-scrape-auto")

    async def _run(self) -> None:
        while not self.inventory.nodes_synced():  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        self.active = self._choose()
        self.active.start()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        if self.active is not None:
            await self.active.stop()

    def healthy(self) -> tuple[bool, str]:
        if self.active is not None:
            return self.active.healthy()
        if self._task is None or self._task.done():
            return False, "scrape loop is not running"
        return True, "waiting for the node list"

    def missing_nodes(self, now: float | None = None) -> list[str]:
        return [] if self.active is None else self.active.missing_nodes(now)

    def missing_check(self) -> tuple[bool, str]:
        return (True, "ok") if self.active is None else self.active.missing_check()

    @property
    def status(self) -> ScrapeStatus:
        return self._no_status if self.active is None else self.active.status

    _no_status = ScrapeStatus()  # before the choice: no node scraped yet


ScrapeLoop = Collector | ScrapeWorkers | AutoScrape


def scrape_loop(
    workers: int | None,
    inventory: Inventory,
    kubelets: KubeletClient,
    sink: Callable[[NodeBatch], None],
    *,
    resolution: float,
    timeout: float,
    node_filter: Callable[[NodeInfo], bool] | None = None,
    on_cycle: Callable[[], None] | None = None,
) -> ScrapeLoop:
    """The scrape loop ``--scrape-workers`` asks for: ``workers`` None is ``auto``, decided now
    if the inventory has synced already, else as soon as it has."""
    max_in_flight = kubelets.config.max_in_flight

    def build(n: int) -> Collector | ScrapeWorkers:
        if n == 0:
            return Collector(
                inventory, kubelets, sink, resolution=resolution, timeout=timeout,
                max_in_flight=max_in_flight, node_filter=node_filter, on_cycle=on_cycle,
            )  # fmt: skip
        return ScrapeWorkers(
            inventory, kubelets.config, sink, workers=n, resolution=resolution, timeout=timeout,
            max_in_flight=max_in_flight, node_filter=node_filter, on_cycle=on_cycle,
        )  # fmt: skip

    def choose() -> Collector | ScrapeWorkers:
        nodes = sum(1 for n in inventory.nodes() if node_filter is None or node_filter(n))
        cpus = usable_cpus()
        n = auto_workers(nodes, cpus)
        log.info(
            "--scrape-workers auto: %d worker(s) for %d nodes on %d CPUs (a worker from %d nodes on %d+ CPUs)",
            n, nodes, cpus, AUTO_MIN_NODES, AUTO_MIN_CPUS,
        )  # fmt: skip
        WORKERS.set(n)
        return build(n)

    if workers is not None:
        WORKERS.set(workers)
        return build(workers)
    if inventory.nodes_synced():
        return choose()
    return AutoScrape(inventory, choose)
