"""``--resource-metrics-source prometheus``: metrics.k8s.io from prometheus-adapter's ``resourceRules``.

For clusters that already scrape cAdvisor into Prometheus: instead of scraping the kubelets, every
``--metric-resolution`` seconds :class:`PrometheusResources` runs the rules' ``containerQuery`` and
``nodeQuery`` (cpu and memory) over all pods and nodes, and writes the rows into the same
:class:`~kcms.store.resource.ResourceStore` the kubelet collector writes to, so every line of the
metrics.k8s.io serving code (lists, selectors, tables, readiness) is reused unchanged.

The rules' templates need object names (as in prometheus-adapter, which queries per request): the
pods and nodes come from the inventory, queried per namespace in chunks of :data:`NAMES_PER_QUERY`;
the first cycle waits until the inventory has listed both (serving starts once the nodes are).
The queries already give a CPU *rate* (cores, over the rule's ``window``), while the store keeps
cumulative counters and serves the rate between a container's last two readings. Each cycle
therefore writes two readings per container and node: ``0`` core-seconds at ``t - window`` and
``rate * window`` at ``t`` (``t`` the query's evaluation time), under a container start time of that
cycle (``t - window - 1 s``), so the store serves exactly Prometheus's rate with ``window`` as the
window, never a rate across two cycles, and restart detection never fires. Memory is the query's
value (working set bytes) in both readings.

Pods are stored under one pseudo-node (``prometheus/pods``, not a valid node name; the API lists
objects from the inventory, so it is never shown): a container query's rows seldom carry the node.
A failed query keeps the previous readings, which the store expires after ``max_age`` (never served
frozen), and is counted in ``kcms_prometheus_resource_query_failures_total{reason}``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from prometheus_client import Counter

from kcms.apis.prometheus.config import ResourceRules
from kcms.limits import printable
from kcms.model import Inventory, NodeBatch, ResourcePoint
from kcms.sources.prometheus_api import PrometheusClient, PrometheusError, Sample
from kcms.store.resource import ResourceStore
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

__all__ = ["PODS_NODE", "PrometheusResources"]

NAMES_PER_QUERY = 500  # pod or node names in one query's matcher (POST lifts URL limits; this bounds it)
MAX_CONCURRENT_QUERIES = 4
PODS_NODE = "prometheus/pods"  # the pseudo-node pods are stored under ("/" is never in a node name)
SYNC_POLL = 0.1  # seconds between looks at the inventory before the first cycle
FAILURES = Counter(
    "kcms_prometheus_resource_query_failures",
    "resourceRules queries (containerQuery, nodeQuery) that failed, by reason; the previous readings stay "
    "until they expire.",
    ["reason"],
)


def _chunks(names: list[str]) -> list[list[str]]:
    return [names[i : i + NAMES_PER_QUERY] for i in range(0, len(names), NAMES_PER_QUERY)]


class PrometheusResources:
    """Feeds ``store`` from ``rules`` every ``interval`` seconds; the collector interface of the
    standalone pipeline (``start``, ``stop``, ``healthy``, ``missing_check``)."""

    def __init__(
        self,
        client: PrometheusClient,
        rules: ResourceRules,
        store: ResourceStore,
        inventory: Inventory,
        *,
        interval: float,
        on_cycle: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.rules = rules
        self.store = store
        self.inventory = inventory
        self.interval = interval
        self.on_cycle = on_cycle
        self._task: asyncio.Task[None] | None = None
        self._last_cycle = 0.0  # monotonic end of the last cycle (ok or not)
        self._last_ok = 0.0
        self._problem = ""
        self._failed = 0  # queries of the current cycle that failed
        self._nodes_seen: set[str] = set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kcms-prometheus-resources")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        # The queries name the inventory's pods, and start-up starts this feed once the *nodes* are
        # listed: a cycle before the pods are would serve nodes only, and no pod for a whole period.
        while not self.inventory.has_synced():  # noqa: ASYNC110 (the Inventory protocol has no event)
            await asyncio.sleep(SYNC_POLL)
        while True:
            started = time.monotonic()
            try:
                await self.cycle()
            except Exception:  # never let the loop die
                log.exception("reading resource metrics from Prometheus failed")
            self._last_cycle = time.monotonic()
            if self.on_cycle is not None:
                self.on_cycle()
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def _query(self, what: str, promql: str) -> list[Sample] | None:
        try:
            return await self.client.query(promql)
        except PrometheusError as e:
            FAILURES.labels(e.reason).inc()
            self._failed += 1
            self._problem = f"{what}: {e.reason}: {e}"
            return None

    async def cycle(self) -> bool:
        """One round: cpu and memory of every listed pod (per namespace, in chunks of
        :data:`NAMES_PER_QUERY` names) and node; True when every query answered. Pods (nodes) are
        written only when all their queries answered, so a half-failed round never drops objects."""
        self._failed = 0
        pods: dict[str, list[str]] = {}
        for pod in self.inventory.pods():
            pods.setdefault(pod.namespace, []).append(pod.name)
        nodes = sorted(n.name for n in self.inventory.nodes())
        gate = asyncio.Semaphore(MAX_CONCURRENT_QUERIES)

        async def run(
            what: str, resource: str, build: Callable[[], str], ns: str = ""
        ) -> tuple[str, str, list[Sample] | None]:
            try:
                promql = build()
            except ValueError as e:  # a template that fails on these values: a configuration problem
                FAILURES.labels("render").inc()
                self._problem = f"{what} did not render: {printable(e, 300)}"
                log.warning("resourceRules %s", self._problem)
                return resource, ns, None
            async with gate:
                return resource, ns, await self._query(what, promql)

        r = self.rules
        pod_jobs = []
        node_jobs = []
        for resource in ("cpu", "memory"):
            for ns, names in sorted(pods.items()):
                for chunk in _chunks(sorted(names)):
                    pod_jobs.append(
                        run(
                            f"containerQuery {resource}",
                            resource,
                            lambda c=chunk, n=ns, x=resource: r.container_query(x, n, c),
                            ns,
                        )
                    )
            for chunk in _chunks(nodes):
                node_jobs.append(
                    run(f"nodeQuery {resource}", resource, lambda c=chunk, x=resource: r.node_query(x, c))
                )
        pod_answers = await asyncio.gather(*pod_jobs)
        node_answers = await asyncio.gather(*node_jobs)
        ok = True
        if all(rows is not None for _, _, rows in pod_answers):
            self._store_pods(pod_answers)
        else:
            ok = False
        if all(rows is not None for _, _, rows in node_answers):
            self._store_nodes(node_answers)
        else:
            ok = False
        if ok:
            self._last_ok = time.monotonic()
            self._problem = ""
        elif self._failed:  # one line a cycle, however many queries failed
            log.warning(
                "resourceRules: %d of %d queries failed (previous readings kept until they expire); %s",
                self._failed,
                len(pod_jobs) + len(node_jobs),
                self._problem,  # escaped: PrometheusError's text is, and render errors went through printable
            )
        self._last_cycle = time.monotonic()
        return ok

    def _pair(self, at: float, cores: float, memory: float) -> tuple[ResourcePoint, ResourcePoint]:
        """The two readings that make the store serve ``cores`` over the rule's window at ``at``."""
        window = self.rules.window
        start = at - window - 1.0
        cpu_ns = int(round(cores * window * 1e9))
        mem = int(memory)
        return ResourcePoint(start, at - window, 0, mem), ResourcePoint(start, at, cpu_ns, mem)

    def _store_pods(self, answers: list[tuple[str, str, list[Sample] | None]]) -> None:
        cpu: dict[tuple[str, str, str], Sample] = {}
        memory: dict[tuple[str, str, str], float] = {}
        for resource, ns, rows in answers:
            for s in rows or ():
                key = self._container_key(s, resource, ns)
                if key is None or not math.isfinite(s.value) or s.value < 0:
                    continue
                if resource == "cpu":
                    cpu[key] = s
                else:
                    memory[key] = s.value
        first = NodeBatch(PODS_NODE)
        second = NodeBatch(PODS_NODE)
        for key, s in cpu.items():
            if key not in memory:  # as metrics-server: a container with both cpu and memory, or not at all
                continue
            ns, pod, container = key
            a, b = self._pair(s.timestamp, s.value, memory[key])
            first.pods.setdefault((ns, pod), {})[container] = a
            second.pods.setdefault((ns, pod), {})[container] = b
        self.store.store(first)
        self.store.store(second)

    def _container_key(self, s: Sample, resource: str, namespace: str) -> tuple[str, str, str] | None:
        """(namespace, pod, container) of a row. The usual ``by (<<.GroupBy>>)`` is ``pod,container``
        (prometheus-adapter queries one namespace at a time): the namespace is the query's when the
        row has no namespace label."""
        rule = self.rules.cpu if resource == "cpu" else self.rules.memory
        labels = s.labels
        pod = labels.get(rule.pod_label)
        container = labels.get(rule.container_label)
        ns = labels.get(rule.namespace_label) or namespace
        if not pod or not container or not ns:
            return None
        return ns, pod, container

    def _store_nodes(self, answers: list[tuple[str, str, list[Sample] | None]]) -> None:
        cpu: dict[str, Sample] = {}
        memory: dict[str, float] = {}
        for resource, _, rows in answers:
            for s in rows or ():
                node = self.rules.node_of(s.labels, resource)
                if not node or not math.isfinite(s.value) or s.value < 0:
                    continue
                if resource == "cpu":
                    cpu[node] = s
                else:
                    memory[node] = s.value
        seen = set()
        for node, s in cpu.items():
            if node not in memory:
                continue
            a, b = self._pair(s.timestamp, s.value, memory[node])
            self.store.store(NodeBatch(node, node_point=a))
            self.store.store(NodeBatch(node, node_point=b))
            seen.add(node)
        self._nodes_seen = seen

    # ---- the collector interface ----------------------------------------------------------------
    def healthy(self) -> tuple[bool, str]:
        """Live while the loop runs and has ended a cycle recently (a failing Prometheus is not a
        reason to restart this process: that is readiness's and the metrics' business)."""
        if self._task is None or self._task.done():
            return False, "the resourceRules loop is not running"
        if self._last_cycle and time.monotonic() - self._last_cycle > 3 * self.interval + self.client.timeout:
            return False, "no resourceRules cycle ended for three periods"
        return True, "ok"

    @property
    def status(self) -> dict[str, object]:
        """No per-node scrape status (the history API's ``scrapes`` are the kubelet collector's)."""
        return {}

    def missing_nodes(self, now: float | None = None) -> list[str]:
        return sorted(n.name for n in self.inventory.nodes() if n.name not in self._nodes_seen)

    def missing_check(self) -> tuple[bool, str]:
        """Reports (never fails readiness) the nodes the last nodeQuery did not answer for, and a
        failing query."""
        if not self._last_cycle:
            return True, "resourceRules not queried yet"
        missing = self.missing_nodes()
        parts = []
        if self._problem:
            parts.append(f"last cycle failed: {self._problem[:300]}")
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            parts.append(f"{len(missing)} node(s) without resourceRules data: {shown}")
        return True, "; ".join(parts) or "ok"
