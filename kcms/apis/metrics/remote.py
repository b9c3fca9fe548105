"""metrics.k8s.io over store replicas: each request reads a quorum snapshot of what it needs.

:class:`RemoteResources` has the reading side of :class:`~kcms.store.resource.ResourceStore`
behind one ``await``: ``snapshot()`` asks the stores (newest reading per node or pod wins) and
returns an object with ``node_usage``/``pod_usage``, so the handlers stay the same in every mode.
"""

from __future__ import annotations

from collections.abc import Collection

from kcms.store.cluster import StoreCluster
from kcms.store.usage import PodUsage, Usage


class ResourceSnapshot:
    """Usage read from the stores for one request."""

    def __init__(self, nodes: dict[str, Usage], pods: dict[tuple[str, str], PodUsage]) -> None:
        self._nodes = nodes
        self._pods = pods

    def node_usage(self, node: str, now: float | None = None) -> Usage | None:
        return self._nodes.get(node)

    def pod_usage(self, namespace: str, name: str, now: float | None = None) -> PodUsage | None:
        return self._pods.get((namespace, name))

    def stats_pods(self) -> int:
        return len(self._pods)


class RemoteResources:
    """Resource usage from a :class:`StoreCluster`."""

    def __init__(self, cluster: StoreCluster) -> None:
        self.cluster = cluster

    async def snapshot(
        self, kind: str, namespace: str | None, names: Collection[str] | None
    ) -> ResourceSnapshot:
        """Raises :class:`kcms.store.cluster.QuorumError` when too few stores answer."""
        if kind == "nodes":
            rows = await self.cluster.query_nodes(names)
            return ResourceSnapshot({n: Usage(*u) for n, u in rows.items()}, {})
        found = await self.cluster.query_pods(namespace, names)
        pods = {
            key: PodUsage(ts, window, [(c, Usage(*u)) for c, u in containers])
            for key, (ts, window, containers) in found.items()
        }
        return ResourceSnapshot({}, pods)
