"""The simulated exporter the real Prometheus of :mod:`kcms.sim.prometheus` scrapes: Prometheus
text on 127.0.0.1 with known rates and values, labelled as cAdvisor and kube-state-metrics series.

The exporter's layout (all deterministic; ``pods`` lists :class:`SimPod` in order, ``i`` below
is a pod's index in it, ``k`` a container's index in ``containers``):

============================================  =====================================================
series                                        value
============================================  =====================================================
``http_requests_total{namespace,pod,          counter growing at ``request_rate(pod)`` =
deployment,method="GET"}``                    ``0.5 * (i + 1)`` per second
``http_requests_in_flight{namespace,pod,      gauge ``in_flight(pod)`` = ``i + 1``
deployment}``
``container_cpu_usage_seconds_total{          counter growing at ``cpu_rate(pod, c)`` =
namespace,pod,container,node,id,image,        ``0.01 * (i + 1) * (k + 1)`` cores; also the pod's
name,cpu="total"}`` (cAdvisor's names)        cgroup (no ``container`` label, ``id`` of the pod: the
                                              sum) and each node's root (``id="/"``, only ``node``):
                                              its pods' sum + ``NODE_SYSTEM_CPU``
``container_memory_working_set_bytes{...}``   gauge ``memory(pod, c)`` = ``(i + 1) * (k + 1) * 2**20``;
                                              pod cgroup and node root as for CPU (+ ``NODE_SYSTEM_MEMORY``)
``kube_pod_info{namespace,pod,node}``         1 (kube-state-metrics style)
``kube_deployment_status_replicas{            the deployment's pod count
namespace,deployment}``
``queue_messages_ready{namespace,             gauge ``deployment_queue(ns, name)`` = 10 * its pods
deployment}``
``node_temperature_celsius{node}``            gauge ``node_temperature(node)`` = 40 + node index
``queue_depth{queue}`` (no object labels,     gauge ``queue_depth(q)`` = 100 * (its index + 1)
external style)
``jobs_pending{namespace,queue}``             gauge ``jobs_pending(ns, q)`` = 5 * (ns index + 1) + q index
``app_bulk_<m>{namespace,pod,deployment}``    gauge ``bulk_value(pod, m)`` = ``i * 1000 + m``
(``bulk_metrics`` of them, m = 0..)
============================================  =====================================================

Counters are ``rate * (t - t0) + 1000`` at the moment of the scrape request, so ``rate(x[w])``
over a window the series fully covers equals the rate up to Prometheus's extrapolation and the
few milliseconds between its scrape timestamp and our clock (well under 1 %).
``SimExporter.bulk(n)`` gives about ``n`` series (100 pods by default, the rest in ``app_bulk_*``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

__all__ = ["NODE_SYSTEM_CPU", "NODE_SYSTEM_MEMORY", "SimExporter", "SimPod", "ThreadedExporter"]

NODE_SYSTEM_CPU = 0.1  # cores a node's root cgroup uses beyond its pods
NODE_SYSTEM_MEMORY = 256 * 2**20  # bytes likewise
COUNTER_BASE = 1000.0  # a counter's value at t0 (not 0: rate()'s zero-extrapolation stays out)
PROM_TEXT = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class SimPod:
    namespace: str
    name: str
    deployment: str
    node: str
    index: int  # position in SimExporter.pods

    @property
    def uid(self) -> str:
        return f"{self.index:08d}-0000-4000-8000-000000000000"


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}" if pairs else ""


class SimExporter:
    """Serves Prometheus text at ``/metrics`` on 127.0.0.1 with the series of the module docstring."""

    def __init__(
        self,
        *,
        namespaces: Sequence[str] = ("default", "team-a"),
        deployments: Sequence[str] = ("web", "worker"),
        pods_per_deployment: int = 3,
        containers: Sequence[str] = ("app", "sidecar"),
        nodes: Sequence[str] = ("node-1", "node-2"),
        queues: Sequence[str] = ("emails", "invoices"),
        bulk_metrics: int = 0,
    ) -> None:
        self.namespaces = tuple(namespaces)
        self.containers = tuple(containers)
        self.nodes = tuple(nodes)
        self.queues = tuple(queues)
        self.bulk_metrics = bulk_metrics
        self.pods: list[SimPod] = []
        for ns in self.namespaces:
            for dep in deployments:
                for r in range(pods_per_deployment):
                    i = len(self.pods)
                    self.pods.append(SimPod(ns, f"{dep}-{r}", dep, self.nodes[i % len(self.nodes)], i))
        self.t0 = time.time()
        self.scrapes = 0
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._counters, self._gauges = self._layout()

    @classmethod
    def bulk(cls, series: int, *, pods: int = 100) -> SimExporter:
        """About ``series`` series (at least the fixed ones and one ``app_bulk_0`` per pod): ``pods``
        pods in one namespace, ten deployments, one container each, and as many ``app_bulk_*``
        gauges per pod as make up the rest."""
        shape: dict[str, Any] = {
            "namespaces": ("bench",),
            "deployments": [f"app{d}" for d in range(10)],
            "pods_per_deployment": max(1, pods // 10),
            "containers": ("app",),
            "nodes": tuple(f"node-{n}" for n in range(10)),
        }
        fixed = cls(**shape)
        return cls(**shape, bulk_metrics=max(1, (series - fixed.series_count) // len(fixed.pods)))

    # known values ----------------------------------------------------------------------------

    def request_rate(self, pod: SimPod) -> float:
        return 0.5 * (pod.index + 1)

    def in_flight(self, pod: SimPod) -> float:
        return float(pod.index + 1)

    def cpu_rate(self, pod: SimPod, container: str) -> float:
        return 0.01 * (pod.index + 1) * (self.containers.index(container) + 1)

    def memory(self, pod: SimPod, container: str) -> float:
        return float((pod.index + 1) * (self.containers.index(container) + 1) * 2**20)

    def pod_cpu_rate(self, pod: SimPod) -> float:
        return sum(self.cpu_rate(pod, c) for c in self.containers)

    def pod_memory(self, pod: SimPod) -> float:
        return sum(self.memory(pod, c) for c in self.containers)

    def node_cpu_rate(self, node: str) -> float:
        return NODE_SYSTEM_CPU + sum(self.pod_cpu_rate(p) for p in self.pods if p.node == node)

    def node_memory(self, node: str) -> float:
        return NODE_SYSTEM_MEMORY + sum(self.pod_memory(p) for p in self.pods if p.node == node)

    def deployment_pods(self, namespace: str, deployment: str) -> list[SimPod]:
        return [p for p in self.pods if p.namespace == namespace and p.deployment == deployment]

    def deployment_queue(self, namespace: str, deployment: str) -> float:
        return 10.0 * len(self.deployment_pods(namespace, deployment))

    def node_temperature(self, node: str) -> float:
        return 40.0 + self.nodes.index(node)

    def queue_depth(self, queue: str) -> float:
        return 100.0 * (self.queues.index(queue) + 1)

    def jobs_pending(self, namespace: str, queue: str) -> float:
        return 5.0 * (self.namespaces.index(namespace) + 1) + self.queues.index(queue)

    def bulk_value(self, pod: SimPod, m: int) -> float:
        return float(pod.index * 1000 + m)

    # the text ----------------------------------------------------------------------------------

    @property
    def series_count(self) -> int:
        return len(self._counters) + len(self._gauges)

    def _layout(self) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """(line prefix, rate) of every counter and (line prefix, value) of every gauge, made once:
        a scrape only formats the numbers."""
        counters: list[tuple[str, float]] = []
        gauges: list[tuple[str, float]] = []
        deployments: dict[tuple[str, str], int] = {}
        for p in self.pods:
            obj = (("namespace", p.namespace), ("pod", p.name), ("deployment", p.deployment))
            counters.append(
                (f"http_requests_total{_labels(obj + (('method', 'GET'),))}", self.request_rate(p))
            )
            gauges.append((f"http_requests_in_flight{_labels(obj)}", self.in_flight(p)))
            info = (("namespace", p.namespace), ("pod", p.name), ("node", p.node))
            gauges.append((f"kube_pod_info{_labels(info)}", 1.0))
            pod_id = f"/kubepods/pod{p.uid}"
            base = (("namespace", p.namespace), ("pod", p.name), ("node", p.node))
            counters.append(
                (
                    f"container_cpu_usage_seconds_total{_labels(base + (('id', pod_id), ('cpu', 'total')))}",
                    self.pod_cpu_rate(p),
                )
            )
            gauges.append(
                (f"container_memory_working_set_bytes{_labels(base + (('id', pod_id),))}", self.pod_memory(p))
            )
            for c in self.containers:
                cl = (
                    ("container", c),
                    ("id", f"{pod_id}/{c}"),
                    ("image", f"example/{c}:1"),
                    ("name", f"k8s_{c}_{p.name}"),
                )
                counters.append(
                    (
                        f"container_cpu_usage_seconds_total{_labels(base + cl + (('cpu', 'total'),))}",
                        self.cpu_rate(p, c),
                    )
                )
                gauges.append((f"container_memory_working_set_bytes{_labels(base + cl)}", self.memory(p, c)))
            for m in range(self.bulk_metrics):
                gauges.append((f"app_bulk_{m}{_labels(obj)}", self.bulk_value(p, m)))
            key = (p.namespace, p.deployment)
            deployments[key] = deployments.get(key, 0) + 1
        for node in self.nodes:
            root = (("node", node), ("id", "/"), ("cpu", "total"))
            counters.append((f"container_cpu_usage_seconds_total{_labels(root)}", self.node_cpu_rate(node)))
            gauges.append((f"container_memory_working_set_bytes{_labels(root[:2])}", self.node_memory(node)))
            gauges.append(
                (f"node_temperature_celsius{_labels((('node', node),))}", self.node_temperature(node))
            )
        for (ns, dep), n in deployments.items():
            dl = (("namespace", ns), ("deployment", dep))
            gauges.append((f"kube_deployment_status_replicas{_labels(dl)}", float(n)))
            gauges.append((f"queue_messages_ready{_labels(dl)}", self.deployment_queue(ns, dep)))
        for q in self.queues:
            gauges.append((f"queue_depth{_labels((('queue', q),))}", self.queue_depth(q)))
            for ns in self.namespaces:
                gauges.append(
                    (f"jobs_pending{_labels((('namespace', ns), ('queue', q)))}", self.jobs_pending(ns, q))
                )
        return counters, gauges

    def counter_value(self, rate: float, t: float) -> float:
        return COUNTER_BASE + rate * (t - self.t0)

    def text(self, t: float | None = None) -> str:
        """The exposition at time ``t`` (now): families grouped, values with full precision."""
        t = time.time() if t is None else t
        # the series of one family are not adjacent in the layout: group them for the format
        families: dict[str, tuple[str, list[str]]] = {}
        for prefix, rate in self._counters:
            rows = families.setdefault(prefix.split("{", 1)[0], ("counter", []))[1]
            rows.append(f"{prefix} {self.counter_value(rate, t)!r}")
        for prefix, value in self._gauges:
            families.setdefault(prefix.split("{", 1)[0], ("gauge", []))[1].append(f"{prefix} {value!r}")
        lines: list[str] = []
        for name, (kind, rows) in families.items():
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(rows)
        lines.append("")
        return "\n".join(lines)

    # serving -----------------------------------------------------------------------------------

    async def _metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        return web.Response(body=self.text().encode(), headers={"Content-Type": PROM_TEXT})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    @property
    def target(self) -> str:
        """``host:port`` for a scrape config."""
        return f"127.0.0.1:{self.port}"


class ThreadedExporter:
    """A :class:`SimExporter` served by an event loop in a thread of its own, for synchronous
    fixtures that outlive one test's loop. ``with ThreadedExporter(SimExporter()) as exp: exp.target``."""

    def __init__(self, exporter: SimExporter) -> None:
        self.exporter = exporter
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sim-exporter", daemon=True)

    def start(self) -> ThreadedExporter:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.exporter.start(), self._loop).result(30)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.exporter.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    @property
    def target(self) -> str:
        return self.exporter.target

    def __enter__(self) -> ThreadedExporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
