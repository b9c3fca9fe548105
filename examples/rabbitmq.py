"""An example external-metrics provider: the depth of RabbitMQ queues, read from the management API.

Copy it and change :meth:`RabbitQueueProvider._fetch` to read anything else. It serves one external
metric (default ``rabbitmq_queue_messages``) in one namespace, one series per configured queue with
the labels ``vhost`` and ``queue``; an HPA selects a queue with ``selector.matchLabels`` (the default
vhost ``/`` is not a valid label value in a selector: select its queues by ``queue``). Each
queue's depth is read with ``GET <url>/api/queues/<vhost>/<queue>`` (the ``messages`` field) and
reused for ``ttl`` seconds; concurrent requests for the same queue share one read. A queue that
cannot be read gives no value (the HPA then keeps the current scale) rather than an old one.

Mount it beside the store (see examples/README.md)::

    external = ExternalMetricsAPI([StoreProvider(store, objects.namespaced), rabbit])
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import urllib.parse
from collections.abc import Iterable, Sequence

import aiohttp

from kcms.apis.provider import MetricValue
from kcms.model import ObjectRef
from kcms.selectors import LabelSelector

log = logging.getLogger(__name__)


class RabbitQueueProvider:
    """``ExternalMetricsProvider`` (kcms/apis/provider.py) for RabbitMQ queue depths.

    ``queues`` are ``(vhost, queue)`` pairs; ``url`` is the management API's base URL, e.g.
    ``http://rabbitmq.jobs:15672``; ``auth`` its user and password.
    """

    def __init__(
        self,
        url: str,
        queues: Sequence[tuple[str, str]],
        *,
        namespace: str,
        metric: str = "rabbitmq_queue_messages",
        auth: tuple[str, str] = ("guest", "guest"),
        ttl: float = 5.0,
        timeout: float = 2.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.queues = list(queues)
        self.namespace = namespace
        self.metric = metric
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}", "Accept": "application/json"}
        self.ttl = ttl
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        # (vhost, queue) -> (monotonic time read, task giving (value, timestamp))
        self._cache: dict[tuple[str, str], tuple[float, asyncio.Task[tuple[float, float]]]] = {}
        self.reads = 0  # HTTP reads made (to see the cache work)

    def list_external_metrics(self) -> Iterable[str]:
        """The one metric this provider serves."""
        return [self.metric]

    async def get_external_metrics(
        self, namespace: str, metric: str, selector: LabelSelector
    ) -> list[MetricValue]:
        """The depth of every configured queue whose labels match ``selector``."""
        if metric != self.metric or namespace != self.namespace:
            return []
        wanted = [
            (vhost, queue)
            for vhost, queue in self.queues
            if selector.matches({"vhost": vhost, "queue": queue})
        ]
        results = await asyncio.gather(*(self._depth(vq) for vq in wanted), return_exceptions=True)
        out = []
        for (vhost, queue), result in zip(wanted, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("rabbitmq queue %s/%s: %s", vhost, queue, result)
                continue
            value, timestamp = result
            labels = (("queue", queue), ("vhost", vhost))
            out.append(MetricValue(ObjectRef("", namespace, ""), metric, labels, value, timestamp, None))
        return out

    async def _depth(self, key: tuple[str, str]) -> tuple[float, float]:
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            task = hit[1]
            if not (task.done() and task.exception() is not None):
                return await asyncio.shield(task)
        task = asyncio.ensure_future(self._fetch(*key))
        self._cache[key] = (now, task)
        return await asyncio.shield(task)

    async def _fetch(self, vhost: str, queue: str) -> tuple[float, float]:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self.headers, timeout=self.timeout)
        path = f"/api/queues/{urllib.parse.quote(vhost, safe='')}/{urllib.parse.quote(queue, safe='')}"
        self.reads += 1
        async with self._session.get(self.url + path) as resp:
            resp.raise_for_status()
            doc = await resp.json()
        return float(doc["messages"]), time.time()

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
