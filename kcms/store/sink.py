"""Where a separate collector process puts what it scrapes: batched quorum writes to the stores.

The scrapers call :meth:`ClusterSink.store` (a kubelet's readings) and :meth:`ClusterSink.append_many`
(agent samples) as they do on an in-process store; the sink sends what accumulated every
``flush_interval`` seconds (or sooner when ``max_batch`` samples wait) as one write per store.

``gate()`` is asked before every send: a collector that lost its Lease drops what it holds instead
of writing, so two collectors never write at once. A write that misses its quorum is kept and sent
again with the next batch, once; then it is dropped and counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from prometheus_client import Counter

from kcms.model import Labels, NodeBatch, ObjectRef
from kcms.store.cluster import Sample, StoreCluster
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SENT = Counter(
    "kcms_collector_written_total",
    "What the collector sent to the stores, by kind and outcome.",
    ["kind", "outcome"],
)


class ClusterSink:
    def __init__(
        self,
        cluster: StoreCluster,
        *,
        gate: Callable[[], bool] = lambda: True,
        flush_interval: float = 0.2,
        max_batch: int = 20_000,
    ) -> None:
        self.cluster = cluster
        self.gate = gate
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self._nodes: list[NodeBatch] = []
        self._samples: list[Sample] = []
        self._retry: tuple[list[NodeBatch], list[Sample]] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self.acked_samples = 0
        self.acked_nodes = 0
        self.failed_writes = 0

    # ---- what the scrapers call ----------------------------------------------------------------

    def store(self, batch: NodeBatch) -> None:
        self._nodes.append(batch)

    def append(self, metric: str, obj: ObjectRef, labels: Labels, timestamp: float, value: float) -> bool:
        """Queue one sample (the push endpoint's sink); True: queued for the next quorum write."""
        self._samples.append((metric, obj, labels, timestamp, value))
        return True

    def append_many(self, samples: Iterable[Sample]) -> int:
        before = len(self._samples)
        self._samples.extend(samples)
        added = len(self._samples) - before
        if len(self._samples) >= self.max_batch:
            self._wake.set()
        return added

    # ---- sending -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kcms-collector-sink")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self.gate():
            await self.flush()

    def drop(self) -> int:
        """Forget everything waiting (leadership lost); return how many items were dropped."""
        n = len(self._nodes) + len(self._samples)
        if self._retry is not None:
            n += len(self._retry[0]) + len(self._retry[1])
        self._nodes, self._samples, self._retry = [], [], None
        return n

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.flush_interval)
            except TimeoutError:
                pass
            self._wake.clear()
            await self.flush()

    async def flush(self) -> bool:
        """Send what waits; True when every key reached its write quorum."""
        async with self._lock:
            if not self.gate():
                dropped = self.drop()
                if dropped:
                    log.warning("not the leader: dropped %d unsent items", dropped)
                return False
            nodes, samples = self._nodes, self._samples
            self._nodes, self._samples = [], []
            retry, self._retry = self._retry, None
            if retry is not None:
                nodes = retry[0] + nodes
                samples = retry[1] + samples
            if not nodes and not samples:
                return True
            result = await self.cluster.write(nodes, samples)
            self.acked_nodes += result.acked_nodes
            self.acked_samples += result.acked_samples
            SENT.labels("nodes", "acked").inc(result.acked_nodes)
            SENT.labels("samples", "acked").inc(result.acked_samples)
            if result.ok:
                return True
            self.failed_writes += 1
            if retry is None:
                self._retry = (list(nodes), list(samples))  # whole batch again: stores drop duplicates
            else:
                SENT.labels("nodes", "dropped").inc(result.failed_nodes)
                SENT.labels("samples", "dropped").inc(result.failed_samples)
            log.warning(
                "write quorum missed for %d nodes and %d samples: %s",
                result.failed_nodes,
                result.failed_samples,
                "; ".join(result.errors)[:300],
            )
            return False
