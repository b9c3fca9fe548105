"""Shared pieces of the Prometheus bridge's serving tests (test_prometheus_provider.py,
test_prometheus_e2e.py, test_metric_routing.py): a prometheus-adapter configuration using every rule
feature against the simulated exporter (kcms/sim/prometheus.py), Prometheus's own answer to a PromQL
expression (the independent reference the served values are compared with), the exporter's pods as
Kubernetes objects in the fake API, and a hostile Prometheus-compatible server.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import orjson
from _http_helpers import serve_app
from aiohttp import web
from fakeapi import make_node, make_pod

from kcms.quantity import parse_quantity

RATE = "[5s]"  # 1 s scrapes: five samples a window; the exporter's counters are straight lines

# Every rule feature of prometheus-adapter's format, against the exporter's series.
ADAPTER_CONFIG = f"""
rules:
# seriesQuery + seriesFilters, overrides, name.matches/as with a capture group, metricsQuery with
# LabelMatchers and GroupBy. The query also finds http_requests_in_flight, which name.matches would
# name requests_per_second too (and, sorted first, serve a rate of a gauge): the isNot filter drops it.
- seriesQuery: '{{__name__=~"^http_requests_.*",namespace!="",pod!=""}}'
  seriesFilters:
  - isNot: "_in_flight$"
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  name:
    matches: "^http_(requests)_.*$"
    as: "${{1}}_per_second"
  metricsQuery: 'sum(rate(<<.Series>>{{<<.LabelMatchers>>}}{RATE})) by (<<.GroupBy>>)'
# template: every label naming a resource (namespace, pod, deployment -> deployments.apps)
- seriesQuery: 'http_requests_in_flight{{namespace!="",pod!=""}}'
  resources:
    template: "<<.Resource>>"
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
# name.matches/as renaming a gauge; an override with a group
- seriesQuery: 'queue_messages_ready{{namespace!="",deployment!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      deployment: {{group: apps, resource: deployment}}
  name:
    matches: "^queue_(.*)_ready$"
    as: "${{1}}_waiting"
  metricsQuery: 'max(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
# a cluster-scoped resource
- seriesQuery: 'node_temperature_celsius{{node!=""}}'
  resources:
    overrides:
      node: {{resource: node}}
  metricsQuery: 'max(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
externalRules:
# not namespaced: the same values from any namespace; labelSelector becomes matchers
- seriesQuery: 'queue_depth{{queue!=""}}'
  resources:
    namespaced: false
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (queue)'
# namespaced: the request's namespace becomes a matcher on the namespace label
- seriesQuery: 'jobs_pending{{namespace!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (queue)'
resourceRules:
  cpu:
    containerQuery: 'sum(rate(container_cpu_usage_seconds_total{{<<.LabelMatchers>>,container!=""}}{RATE})) by (<<.GroupBy>>)'
    nodeQuery: 'sum(rate(container_cpu_usage_seconds_total{{<<.LabelMatchers>>,id="/"}}{RATE})) by (<<.GroupBy>>)'
    resources:
      overrides:
        node: {{resource: node}}
        namespace: {{resource: namespace}}
        pod: {{resource: pod}}
    containerLabel: container
  memory:
    containerQuery: 'sum(container_memory_working_set_bytes{{<<.LabelMatchers>>,container!=""}}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(container_memory_working_set_bytes{{<<.LabelMatchers>>,id="/"}}) by (<<.GroupBy>>)'
    resources:
      overrides:
        node: {{resource: node}}
        namespace: {{resource: namespace}}
        pod: {{resource: pod}}
    containerLabel: container
  window: 5s
"""


def write_config(tmp: Path, text: str = ADAPTER_CONFIG) -> str:
    path = tmp / "adapter.yaml"
    path.write_text(text)
    return str(path)


def promql(prom, expr: str, at: float | None = None) -> dict[tuple[tuple[str, str], ...], float]:
    """Prometheus's own answer to ``expr`` (read with urllib, not KCMS's client): labels -> value."""
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    data = prom.api("query", **params)
    assert data["resultType"] == "vector", data
    return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in data["result"]}


def one(prom, expr: str, **labels: str) -> float:
    """The value of the row of ``expr`` whose labels include ``labels``."""
    rows = promql(prom, expr)
    found = [v for k, v in rows.items() if all((name, value) in k for name, value in labels.items())]
    assert len(found) == 1, (expr, labels, rows)
    return found[0]


def close(served: str, expected: float, rel: float = 0.03) -> bool:
    """A served quantity equals a PromQL value: exactly for gauges, within ``rel`` for rates (the
    two reads evaluate ``rate()`` a few milliseconds apart over a moving window)."""
    value = float(parse_quantity(served))
    return math.isclose(value, expected, rel_tol=rel, abs_tol=1e-3)


def exporter_objects(fake, exporter) -> None:
    """The exporter's nodes and pods as Kubernetes objects (pods labelled ``app=<deployment>``)."""
    for node in exporter.nodes:
        fake.upsert(make_node(node))
    for p in exporter.pods:
        fake.upsert(
            make_pod(
                p.namespace, p.name, p.node, labels={"app": p.deployment}, containers=exporter.containers
            )
        )


class HostilePrometheus:
    """A Prometheus-compatible server that misbehaves on demand (``mode``): ``ok`` answers
    ``/api/v1/series`` with ``series`` and ``/api/v1/query`` with ``rows``; ``error`` (a Prometheus
    error body), ``http500`` (a proxy's HTML page), ``malformed`` (not JSON), ``wrong_shape`` (JSON
    of the wrong shape), ``huge`` (~3 MB: give the client a 1 MiB cap), ``slow`` (answers after
    ``delay`` seconds). ``down()`` closes the listener (connection refused), ``up()`` reopens it on
    the same port."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.delay = 5.0
        self.series: list[dict[str, str]] = []
        self.rows: list[dict] = []
        self.requests: list[str] = []
        self.seen: list[tuple[str, dict[str, str], dict]] = []  # (method, headers, form) of each request
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _answer(self, request: web.Request, data) -> web.StreamResponse:
        self.requests.append(request.path)
        self.seen.append((request.method, dict(request.headers), dict(await request.post())))
        mode = self.mode
        if mode == "slow":
            await asyncio.sleep(self.delay)
        if mode == "error":
            body = {
                "status": "error",
                "errorType": "execution",
                "error": "query processing would load too many samples\n\x1b[31m",
            }
            return web.json_response(body, status=422)
        if mode == "http500":
            return web.Response(status=500, text="<html>upstream exploded</html>", content_type="text/html")
        if mode == "malformed":
            return web.Response(
                text='{"status":"success","data":[{"__name__":', content_type="application/json"
            )
        if mode == "wrong_shape":
            return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": 7}})
        if mode == "huge":
            filler = [{"__name__": "x", "pad": "y" * 1000, "i": str(i)} for i in range(3000)]  # ~3 MB
            return web.Response(
                body=orjson.dumps({"status": "success", "data": filler}), content_type="application/json"
            )
        return web.json_response({"status": "success", "data": data})

    async def _series(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, self.series)

    async def _query(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, {"resultType": "vector", "result": self.rows})

    async def start(self) -> None:
        app = web.Application()
        for path, handler in (("/api/v1/series", self._series), ("/api/v1/query", self._query)):
            app.router.add_route("*", path, handler)
        if self.port:
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._runner = runner
        else:
            self._runner, self.port = await serve_app(app, access_log=None)

    async def down(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def up(self) -> None:
        await self.start()
