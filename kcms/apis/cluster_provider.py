"""Both provider interfaces over store replicas (:class:`~kcms.store.cluster.StoreCluster`).

Discovery must be cheap and synchronous, so the list of metrics is refreshed in the background
(every ``refresh`` seconds) from the union of the stores' answers; a query asks the stores and
merges by newest point per series (see :mod:`kcms.store.cluster`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable

from kcms.apis.provider import MetricInfo, MetricValue, custom_metric_infos, external_metric_names
from kcms.apiserver import StatusError
from kcms.selectors import LabelSelector
from kcms.store.cluster import QuorumError, StoreCluster
from kcms.store.query import parse_metric_name
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def _selector_text(selector: LabelSelector) -> str:
    return "" if selector.empty else str(selector)


class ClusterProvider:
    """Custom and external metrics read from the stores."""

    def __init__(
        self,
        cluster: StoreCluster,
        namespaced: Callable[[str], bool],
        *,
        retention: float = 600.0,
        refresh: float = 1.0,
    ) -> None:
        self.cluster = cluster
        self.namespaced = namespaced
        self.retention = retention
        self.refresh = refresh
        self._pairs: list[tuple[str, str]] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._refresh_loop(), name="kcms-provider-discovery")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def refresh_now(self) -> None:
        self._pairs = await self.cluster.metrics(max_age=0.0)

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self.refresh_now()
            except Exception:  # keep serving the last list; the next round may work
                log.exception("refreshing the metric list from the stores failed")
            await asyncio.sleep(self.refresh)

    def _check_name(self, metric: str) -> None:
        parse_metric_name(metric, self.retention)

    async def _query(self, resource, namespace, names, metric, selector: LabelSelector):
        try:
            return await self.cluster.query_series(
                resource, namespace, names, metric, _selector_text(selector)
            )
        except QuorumError as e:
            raise StatusError(503, "ServiceUnavailable", str(e)) from None

    # ---- custom metrics ------------------------------------------------------------------------
    def list_metrics(self) -> Iterable[MetricInfo]:
        return custom_metric_infos(self._pairs, self.namespaced)

    async def get_metrics(
        self,
        resource: str,
        namespace: str,
        names: Collection[str] | None,
        metric: str,
        metric_selector: LabelSelector,
    ) -> list[MetricValue]:
        self._check_name(metric)
        rows = await self._query(resource, namespace, names, metric, metric_selector)
        return [MetricValue(r.obj, metric, r.labels, r.value, r.timestamp, r.window) for r in rows]

    # ---- external metrics ----------------------------------------------------------------------
    def list_external_metrics(self) -> Iterable[str]:
        return external_metric_names(self._pairs)

    async def get_external_metrics(
        self, namespace: str, metric: str, selector: LabelSelector
    ) -> list[MetricValue]:
        self._check_name(metric)
        rows = list(await self._query("", namespace, None, metric, selector))
        if namespace:
            rows.extend(await self._query("", "", None, metric, selector))
        return [MetricValue(r.obj, metric, r.labels, r.value, r.timestamp, r.window) for r in rows]
