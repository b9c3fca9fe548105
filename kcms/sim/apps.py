"""Simulated application metrics for the demo: what annotated pods and a job queue would report.

Every ``period`` seconds it writes, for each simulated pod, a counter ``http_requests_total``
growing at a known rate (served as ``http_requests_per_second``), for each app a
``queue_backlog`` about its Deployment (``deployments.apps``), and per namespace an external
``queue_backlog{queue=...}``. Values are functions of time, so tests can check what is served.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable

from kcms.model import ObjectRef
from kcms.sim.cluster import SimulatedCluster
from kcms.tasks import cancel_and_wait

Sample = tuple[str, ObjectRef, tuple[tuple[str, str], ...], float, float]
QUEUES = ("emails", "invoices")


def requests_rate(cpu_cores: float) -> float:
    """Requests per second of a pod: 200 per core used, rounded to a tenth."""
    return round(200 * cpu_cores, 1)


def backlog(queue: str, t: float) -> float:
    """A queue's length at time t: a slow wave between 0 and 200, different per queue."""
    phase = sum(map(ord, queue)) % 60
    return float(round(100 + 100 * math.sin((t + phase) / 60.0)))


class SimulatedAppMetrics:
    """Feeds a series store (anything with ``append_many``) with the demo's application metrics."""

    def __init__(self, cluster: SimulatedCluster, sink, period: float = 5.0) -> None:
        self.cluster = cluster
        self.sink = sink
        self.period = period
        self._task: asyncio.Task[None] | None = None

    def samples(self, t: float) -> Iterable[Sample]:
        apps: dict[tuple[str, str], int] = {}
        for node in self.cluster.nodes:
            for pod in node.pods:
                ref = ObjectRef("pods", pod.namespace, pod.name)
                count = requests_rate(pod.rate) * (t - pod.start_time)
                yield ("http_requests_total", ref, (("path", "/"),), t, round(count, 3))
                key = (pod.namespace, pod.app)
                apps[key] = apps.get(key, 0) + 1
        for (namespace, app), replicas in apps.items():
            ref = ObjectRef("deployments.apps", namespace, app)
            yield ("queue_backlog", ref, (), t, backlog(app, t) * replicas)
        for namespace in sorted({ns for ns, _ in apps}):
            for queue in QUEUES:
                yield (
                    "queue_backlog",
                    ObjectRef("", namespace, ""),
                    (("queue", queue),),
                    t,
                    backlog(queue, t),
                )

    def write_once(self, t: float | None = None) -> int:
        return self.sink.append_many(self.samples(time.time() if t is None else t))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kcms-sim-app-metrics")

    async def _run(self) -> None:
        # Start with a point one period back, so that rates are served from the first moment.
        self.write_once(time.time() - self.period)
        while True:
            self.write_once()
            await asyncio.sleep(self.period)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
