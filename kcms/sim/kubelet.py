"""What one simulated kubelet serves: ``/metrics/resource``, ``/stats/summary`` and ``/healthz``.

The bodies follow the real kubelet (Kubernetes 1.29): the resource metrics endpoint in the
Prometheus text format (HELP/TYPE lines, families sorted by name, samples sorted by label
values, millisecond timestamps, Go float formatting) and the summary API JSON.

Every value is computed at request time from the node's workload, at a timestamp truncated to
the precision the format carries (milliseconds for Prometheus text, seconds for the summary's
``metav1.Time``), so that counters and timestamps are exactly consistent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

import orjson
from aiohttp import web

from kcms.sim.workload import SimNode, go_ns, rfc3339


class KubeletHost(Protocol):
    """What the kubelet app needs from the cluster serving it (``kcms.sim.cluster.SimulatedCluster``).

    A protocol here rather than an import of the cluster, which imports this module: the
    kubelet sits below the cluster and must not depend on it (tests/test_layout.py).
    """

    token: str | None

    def node_for_request(self, request: web.Request) -> SimNode | None: ...

    async def slow_wait(self) -> None: ...

MODES = ("ok", "slow", "error", "garbage", "down")
PROM_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_H = "# HELP {n} [STABLE] {h}\n# TYPE {n} {t}\n"
_HEAD_CONTAINER_CPU = _H.format(
    n="container_cpu_usage_seconds_total",
    h="Cumulative cpu time consumed by the container in core-seconds",
    t="counter",
)
_HEAD_CONTAINER_MEM = _H.format(
    n="container_memory_working_set_bytes", h="Current working set of the container in bytes", t="gauge"
)
_HEAD_CONTAINER_START = _H.format(
    n="container_start_time_seconds", h="Start time of the container since unix epoch in seconds", t="gauge"
)
_HEAD_NODE_CPU = _H.format(
    n="node_cpu_usage_seconds_total",
    h="Cumulative cpu time consumed by the node in core-seconds",
    t="counter",
)
_HEAD_NODE_MEM = _H.format(
    n="node_memory_working_set_bytes", h="Current working set of the node in bytes", t="gauge"
)
_HEAD_POD_CPU = _H.format(
    n="pod_cpu_usage_seconds_total", h="Cumulative cpu time consumed by the pod in core-seconds", t="counter"
)
_HEAD_POD_MEM = _H.format(
    n="pod_memory_working_set_bytes", h="Current working set of the pod in bytes", t="gauge"
)
_HEAD_SCRAPE_ERR = _H.format(
    n="resource_scrape_error",
    h="1 if there was an error while getting container metrics, 0 otherwise",
    t="gauge",
)

GARBAGE_METRICS = (
    b"# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time\n"
    b'container_cpu_usage_seconds_total{container="app",namespace="default",pod= 12.5.7 17x\n'
    b"node_memory_working_set_bytes{{{ \xff\xfe\x00 NaNNaN\n"
    b"# TYPE broken\x00"
)
GARBAGE_SUMMARY = b'{"node": {"nodeName": "sim", "cpu": {"usageCoreNanoSeconds": "many", "time": 17'


def render_resource_metrics(node: SimNode, now: float) -> bytes:
    """The ``/metrics/resource`` body of ``node`` at time ``now``."""
    ts_ms = int(now * 1000)
    t = ts_ms / 1000.0
    node.advance(t)
    tail = f" {ts_ms}\n"
    cs = node.containers_sorted
    ps = node.pods_sorted
    out: list[str] = [_HEAD_CONTAINER_CPU]
    add = out.append
    for c in cs:
        dt = t - c.start_time
        add(f"{c.cpu_prefix}{go_ns(int(c.rate * dt * 1e9)) if dt > 0 else '0'}{tail}")
    add(_HEAD_CONTAINER_MEM)
    for c in cs:
        add(f"{c.mem_prefix}{c.memory_text(t)}{tail}")
    add(_HEAD_CONTAINER_START)
    for c in cs:
        add(f"{c.start_prefix}{c.start_text}{tail}")
    add(_HEAD_NODE_CPU)
    add(f"node_cpu_usage_seconds_total {go_ns(node.cpu_ns(t))}{tail}")
    add(_HEAD_NODE_MEM)
    add(f"node_memory_working_set_bytes {node.memory_text(t)}{tail}")
    add(_HEAD_POD_CPU)
    for p in ps:
        add(f"{p.cpu_prefix}{go_ns(p.cpu_ns(t))}{tail}")
    add(_HEAD_POD_MEM)
    for p in ps:
        add(f"{p.mem_prefix}{p.memory_text(t)}{tail}")
    add(_HEAD_SCRAPE_ERR)
    add("resource_scrape_error 0\n")
    return "".join(out).encode()


def _cpu(ts: str, rate: float, ns: int) -> dict:
    return {"time": ts, "usageNanoCores": int(rate * 1e9), "usageCoreNanoSeconds": ns}


def _mem(ts: str, ws: int) -> dict:
    rss = (ws * 3 // 4) // 4096 * 4096
    return {
        "time": ts,
        "usageBytes": ws + (ws // 8) // 4096 * 4096,
        "workingSetBytes": ws,
        "rssBytes": rss,
        "pageFaults": ws // 4096 * 3,
        "majorPageFaults": ws // (4096 * 4096),
    }


def _fs(ts: str, used: int) -> dict:
    cap = 107374182400
    return {
        "time": ts,
        "availableBytes": cap // 2,
        "capacityBytes": cap,
        "usedBytes": used,
        "inodesFree": 6000000,
        "inodes": 6553600,
        "inodesUsed": 12,
    }


def render_summary(node: SimNode, now: float) -> bytes:
    """The ``/stats/summary`` body of ``node`` at time ``now`` (whole-second timestamps)."""
    t = float(int(now))
    node.advance(t)
    ts = rfc3339(t)
    pods = []
    for p in node.pods:
        containers = []
        for c in p.containers:
            containers.append(
                {
                    "name": c.name,
                    "startTime": c.start_rfc,
                    "cpu": _cpu(ts, c.rate, c.cpu_ns(t)),
                    "memory": _mem(ts, c.memory(t)),
                    "rootfs": _fs(ts, 40960),
                    "logs": _fs(ts, 8192),
                }
            )
        pods.append(
            {
                "podRef": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
                "startTime": rfc3339(p.start_time),
                "containers": containers,
                "cpu": _cpu(ts, p.rate, p.cpu_ns(t)),
                "memory": _mem(ts, p.memory(t)),
                "network": {"time": ts, "name": "eth0", "rxBytes": 1048576, "rxErrors": 0, "txBytes": 524288},
                "volume": [],
                "ephemeral-storage": _fs(ts, 49152),
                "process_stats": {"process_count": len(p.containers) * 2},
            }
        )
    node_start = rfc3339(node.start_time)
    body = {
        "node": {
            "nodeName": node.name,
            "systemContainers": [
                {
                    "name": "kubelet",
                    "startTime": node_start,
                    "cpu": _cpu(ts, node.overhead_rate / 2, int(node.cpu_ns(t) * 0.01)),
                    "memory": _mem(ts, node.overhead_memory // 4 // 4096 * 4096),
                },
                {
                    "name": "pods",
                    "startTime": node_start,
                    "cpu": _cpu(ts, node.rate - node.overhead_rate, sum(p.cpu_ns(t) for p in node.pods)),
                    "memory": _mem(ts, node.memory(t) - node.overhead_memory),
                },
            ],
            "startTime": node_start,
            "cpu": _cpu(ts, node.rate, node.cpu_ns(t)),
            "memory": dict(_mem(ts, node.memory(t)), availableBytes=8589934592),
            "network": {
                "time": ts,
                "name": "eth0",
                "rxBytes": 104857600,
                "rxErrors": 0,
                "txBytes": 52428800,
                "txErrors": 0,
                "interfaces": [{"name": "eth0", "rxBytes": 104857600, "rxErrors": 0, "txBytes": 52428800}],
            },
            "fs": _fs(ts, 21474836480),
            "runtime": {"imageFs": _fs(ts, 5368709120)},
            "rlimit": {"time": ts, "maxpid": 4194304, "curproc": 200 + 4 * len(node.pods)},
        },
        "pods": pods,
    }
    return orjson.dumps(body)


def make_app(cluster: KubeletHost) -> web.Application:
    """One aiohttp application serving every node; the node is found from the socket's local address."""
    app = web.Application()
    lookup: Callable[[web.Request], SimNode | None] = cluster.node_for_request
    token_header = f"Bearer {cluster.token}" if cluster.token else None

    async def prelude(request: web.Request) -> SimNode | web.StreamResponse:
        node = lookup(request)
        if node is None:
            return web.Response(status=404, text="no simulated node on this address")
        if token_header is not None and request.headers.get("Authorization") != token_header:
            return web.Response(status=401, text="Unauthorized")
        node.requests += 1
        mode = node.mode
        if mode == "ok":
            return node
        if mode == "slow":
            await cluster.slow_wait()
            return web.Response(status=503, text="simulated slow node gave up")
        if mode == "error":
            return web.Response(status=500, text="Internal Server Error: simulated failure")
        if mode == "down":
            request.protocol.force_close()
            transport = request.transport
            if transport is not None:
                transport.abort()
            raise asyncio.CancelledError
        return node  # garbage: the handler decides what garbage looks like

    def garbage(node: SimNode) -> bool:
        return node.mode == "garbage"

    async def resource(request: web.Request) -> web.StreamResponse:
        res = await prelude(request)
        if not isinstance(res, SimNode):
            return res
        if garbage(res):
            return web.Response(body=GARBAGE_METRICS, headers={"Content-Type": PROM_CONTENT_TYPE})
        body = render_resource_metrics(res, time.time())
        return web.Response(body=body, headers={"Content-Type": PROM_CONTENT_TYPE})

    async def summary(request: web.Request) -> web.StreamResponse:
        res = await prelude(request)
        if not isinstance(res, SimNode):
            return res
        if garbage(res):
            return web.Response(body=GARBAGE_SUMMARY, content_type="application/json")
        return web.Response(body=render_summary(res, time.time()), content_type="application/json")

    async def healthz(request: web.Request) -> web.StreamResponse:
        res = await prelude(request)
        if not isinstance(res, SimNode):
            return res
        if garbage(res):
            return web.Response(body=b"\x00\xffnot ok", content_type="text/plain")
        return web.Response(text="ok")

    app.router.add_get("/metrics/resource", resource)
    app.router.add_get("/stats/summary", summary)
    app.router.add_get("/healthz", healthz)
    return app
