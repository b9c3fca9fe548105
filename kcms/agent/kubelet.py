"""The local kubelet as an agent source: its /metrics/resource readings, through the same client
and strict decoder the collector uses for metrics.k8s.io, as custom-metric series.

Series are prefixed ``kubelet_`` (``kubelet_container_cpu_usage_seconds_total{container}`` on the
pod, ``kubelet_container_memory_working_set_bytes{container}``, and ``kubelet_node_cpu_usage_
seconds_total`` / ``kubelet_node_memory_working_set_bytes`` on the node) so that they never
collide with the cgroup source's ``container_*`` series of the same containers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from kcms.collector.kubelet import KubeletClient, ScrapeError
from kcms.model import NodeBatch, NodeInfo, ObjectRef

log = logging.getLogger(__name__)

Sample = tuple[str, ObjectRef, tuple[tuple[str, str], ...], float, float]


def batch_samples(batch: NodeBatch) -> Iterator[Sample]:
    """The readings of one kubelet scrape as agent samples."""
    point = batch.node_point
    if point is not None:
        node = ObjectRef("nodes", "", batch.node)
        yield ("kubelet_node_cpu_usage_seconds_total", node, (), point.timestamp, point.cpu_ns / 1e9)
        yield ("kubelet_node_memory_working_set_bytes", node, (), point.timestamp, float(point.memory))
    for (namespace, pod), containers in batch.pods.items():
        ref = ObjectRef("pods", namespace, pod)
        for name, p in containers.items():
            labels = (("container", name),)
            yield ("kubelet_container_cpu_usage_seconds_total", ref, labels, p.timestamp, p.cpu_ns / 1e9)
            yield ("kubelet_container_memory_working_set_bytes", ref, labels, p.timestamp, float(p.memory))


class KubeletSource:
    """Scrapes this node's kubelet once per agent cycle."""

    def __init__(self, client: KubeletClient, node: NodeInfo) -> None:
        self.client = client
        self.node = node
        self.errors: dict[str, int] = {}

    async def collect(self, now: float) -> list[Sample]:
        batch = await self.scrape_batch()
        return [] if batch is None else list(batch_samples(batch))

    async def scrape_batch(self) -> NodeBatch | None:
        """One scrape of the kubelet as a :class:`NodeBatch` (push mode); None when it failed
        (counted in ``errors`` by reason, logged)."""
        self.client.start_cycle()
        try:
            return await self.client.scrape(self.node)
        except ScrapeError as e:
            self.errors[e.reason] = self.errors.get(e.reason, 0) + 1
            log.debug("kubelet scrape failed: %s", e)
            return None

    async def close(self) -> None:
        await self.client.close()
