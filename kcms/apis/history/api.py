"""history.kcms.io/v1alpha1 handlers: NodeMetricsHistory, PodMetricsHistory, MetricSeriesHistory and
ScrapeStatus lists over a :class:`~kcms.store.history.HistoryStore`, the series store and the
collector's :class:`~kcms.collector.status.ScrapeStatus` (docs/history.md).

Objects are those of the inventory (a deleted pod or node is not served, whatever is kept), filtered
by ``labelSelector`` and ``fieldSelector`` (metadata.name, metadata.namespace) as metrics.k8s.io
filters, and their points by ``since`` (a duration, at most ``--history``). A list whose JSON grows
past :data:`STREAM_BYTES` is streamed in chunks (the loop is free between them, the whole body is
never held), so listing every pod's history of a large cluster neither stalls scrapes nor
doubles memory.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

import orjson
from aiohttp import web

from kcms.apis.history import convert
from kcms.apis.history.openapi import DEFINITIONS, PATHS
from kcms.apis.objects import nodes_in_scope, pods_in_scope
from kcms.apiserver import APIGroupVersion, TableConverter, bad_request, not_found, respond
from kcms.apiserver.responses import list_body_response, negotiate
from kcms.collector.status import ScrapeStatus
from kcms.flags import parse_duration
from kcms.model import Inventory, NodeInfo, PodInfo
from kcms.selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    object_filter,
    parse_field_selector,
    parse_label_selector,
)
from kcms.store.history import HistoryStore

FIELDS = frozenset({"metadata.name", "metadata.namespace"})
STREAM_BYTES = 1 << 20  # a list larger than this is streamed
CHUNK_BYTES = 1 << 16
MAX_SINCE_TEXT = 64  # characters of a `since` value

RESOURCES = [
    {"name": "nodes", "singularName": "", "namespaced": False, "kind": "NodeMetricsHistory", "verbs": ["get", "list"]},
    {"name": "pods", "singularName": "", "namespaced": True, "kind": "PodMetricsHistory", "verbs": ["get", "list"]},
    {"name": "series", "singularName": "", "namespaced": True, "kind": "MetricSeriesHistory", "verbs": ["list"]},
    {"name": "scrapes", "singularName": "", "namespaced": False, "kind": "ScrapeStatus", "verbs": ["get", "list"]},
]  # fmt: skip


class ScrapeSource(Protocol):
    """What the collector offers: per-node status and the nodes not scraped for too long."""

    @property
    def status(self) -> ScrapeStatus: ...

    def missing_nodes(self, now: float | None = None) -> list[str]: ...


class SeriesSource(Protocol):
    """The handlers of the ``series`` resource (:mod:`kcms.apis.history.series`)."""

    async def list_cluster(self, request: web.Request) -> web.StreamResponse: ...

    async def list_namespaced(self, request: web.Request) -> web.StreamResponse: ...


def _latest(resource: str) -> Callable[[dict], str]:
    def cell(obj: dict) -> str:
        points = obj["points"]
        return points[-1]["usage"][resource] if points else ""

    return cell


_NODE_CPU, _NODE_MEM = _latest("cpu"), _latest("memory")
NODE_TABLE = TableConverter(
    columns=[
        {"name": "Name", "type": "string", "format": "name", "description": "Name of the node"},
        {"name": "Points", "type": "integer", "format": "", "description": "Points kept"},
        {"name": "cpu", "type": "string", "format": "quantity", "description": "Newest cpu usage"},
        {"name": "memory", "type": "string", "format": "quantity", "description": "Newest memory usage"},
    ],
    row=lambda o: [o["metadata"]["name"], len(o["points"]), _NODE_CPU(o), _NODE_MEM(o)],
)
POD_TABLE = TableConverter(
    columns=[
        {"name": "Name", "type": "string", "format": "name", "description": "Name of the pod"},
        {"name": "Containers", "type": "integer", "format": "", "description": "Containers"},
        {"name": "Points", "type": "integer", "format": "", "description": "Points kept per container"},
    ],
    row=lambda o: [
        o["metadata"]["name"],
        len(o["containers"]),
        len(o["containers"][0]["points"]) if o["containers"] else 0,
    ],
)
SCRAPE_TABLE = TableConverter(
    columns=[
        {"name": "Name", "type": "string", "format": "name", "description": "Name of the node"},
        {"name": "Last Success", "type": "string", "format": "date-time", "description": "Last scrape that worked"},
        {"name": "Last Error", "type": "string", "format": "", "description": "Reason of the failure, if failing"},
        {"name": "Failures", "type": "integer", "format": "", "description": "Failures in a row"},
        {"name": "Stale", "type": "boolean", "format": "", "description": "No success for over a resolution"},
    ],
    row=lambda o: [
        o["metadata"]["name"], o["lastSuccess"] or "<never>", o["lastError"] or "",
        o["consecutiveFailures"], o["stale"],
    ],
)  # fmt: skip


def parse_since(text: str | None) -> float | None:
    """The ``since`` query parameter in seconds (None: absent); a bad one is a 400."""
    if text is None:
        return None
    if len(text) > MAX_SINCE_TEXT:
        raise bad_request(f"since: longer than {MAX_SINCE_TEXT} characters")
    try:
        seconds = parse_duration(text)
    except (argparse.ArgumentTypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise bad_request(f'since: "{text[:MAX_SINCE_TEXT]}" is not a positive duration such as 5m or 90s')
    return seconds


def _resource_of(path: str) -> str:
    """The resource a route suffix serves: its last segment that is not a parameter."""
    return [p for p in path.split("/") if p and not p.startswith("{")][-1]


def _list_head(kind: str) -> bytes:
    return (
        b'{"kind":"'
        + kind.encode()
        + b'","apiVersion":"'
        + convert.API_VERSION.encode()
        + b'","metadata":{},"items":['
    )


async def list_response(request: web.Request, kind: str, items: Iterator[dict]) -> web.StreamResponse:
    """The ``kind`` list of ``items``: one body when small, streamed in chunks when not."""
    dumps = orjson.dumps

    async def chunks() -> AsyncIterator[bytes]:
        parts: list[bytes] = []
        size = 0
        first = True
        for item in items:
            body = dumps(item)
            parts.append(body if first else b"," + body)
            first = False
            size += len(body) + 1
            if size >= CHUNK_BYTES:
                yield b"".join(parts)
                parts, size = [], 0
                await asyncio.sleep(0)  # let scrapes and other requests run between chunks
        yield b"".join(parts)

    return await list_body_response(request, _list_head(kind), chunks(), stream_above=STREAM_BYTES)


class HistoryAPI:
    """The request handlers of history.kcms.io/v1alpha1."""

    def __init__(
        self,
        inventory: Inventory,
        history: HistoryStore,
        scrapes: ScrapeSource | None,
        series: SeriesSource | None = None,
    ) -> None:
        self.inventory = inventory
        self.history = history
        self.scrapes = scrapes
        self.series = series
        self.window = convert.go_duration(history.resolution)

    def group_version(self) -> APIGroupVersion:
        routes = [
            ("GET", "/nodes", self.list_nodes),
            ("GET", "/nodes/{name}", self.get_node),
            ("GET", "/pods", self.list_pods),
            ("GET", "/namespaces/{namespace}/pods", self.list_pods),
            ("GET", "/namespaces/{namespace}/pods/{name}", self.get_pod),
            ("GET", "/scrapes", self.list_scrapes),
            ("GET", "/scrapes/{name}", self.get_scrape),
        ]
        # series and scrapes only when there is a source for them (the Prometheus bridge's resource
        # feed, for one, scrapes no kubelet)
        absent = {n for n, src in (("series", self.series), ("scrapes", self.scrapes)) if src is None}
        resources = [r for r in RESOURCES if r["name"] not in absent]
        paths = {k: v for k, v in PATHS.items() if _resource_of(k) not in absent}
        if self.scrapes is None:
            routes = [r for r in routes if not r[1].startswith("/scrapes")]
        if self.series is not None:
            routes += [
                ("GET", "/series", self.series.list_cluster),
                ("GET", "/namespaces/{namespace}/series", self.series.list_namespaced),
            ]
        return APIGroupVersion(
            group=convert.GROUP,
            version=convert.VERSION,
            resources=resources,
            routes=routes,
            openapi_definitions=DEFINITIONS,
            openapi_paths=paths,
        )

    # -- parameters ------------------------------------------------------------------------------

    def _params(self, request: web.Request) -> tuple[LabelSelector, FieldSelector, float]:
        try:
            labels = parse_label_selector(request.query.get("labelSelector", ""))
            fields = parse_field_selector(request.query.get("fieldSelector", ""), FIELDS)
        except SelectorError as e:
            raise bad_request(str(e)) from None
        oldest = self.history.since(parse_since(request.query.get("since")))
        return labels, fields, oldest

    @staticmethod
    def _table(request: web.Request) -> bool:
        return negotiate(request.headers.get("Accept")).table_version is not None

    # -- nodes -----------------------------------------------------------------------------------

    def _node_item(self, node: NodeInfo, oldest: float, created: str, fmt: convert.TimeCache) -> dict | None:
        points = self.history.node_points(node.name, oldest)
        if not points:
            return None
        return convert.node_history(node.name, node.labels, self.window, points, created, fmt)

    async def list_nodes(self, request: web.Request) -> web.StreamResponse:
        labels, fields, oldest = self._params(request)
        _, in_scope = nodes_in_scope(self.inventory, fields)
        nodes = list(in_scope)
        keep = object_filter(labels, fields, namespaced=False)
        fmt = convert.TimeCache()
        created = fmt(time.time())

        def items() -> Iterator[dict]:
            for node in nodes:
                if keep is None or keep(node):
                    item = self._node_item(node, oldest, created, fmt)
                    if item is not None:
                        yield item

        if self._table(request):
            obj = convert.object_list("NodeMetricsHistoryList", list(items()))
            return respond(request, obj, table=NODE_TABLE)
        return await list_response(request, "NodeMetricsHistoryList", items())

    async def get_node(self, request: web.Request) -> web.Response:
        _, _, oldest = self._params(request)
        name = request.match_info["name"]
        node = self.inventory.node(name)
        if node is None:
            raise not_found(convert.GROUP, "nodes", name)
        fmt = convert.TimeFormatter()
        points = self.history.node_points(name, oldest)
        obj = convert.node_history(name, node.labels, self.window, points, fmt(time.time()), fmt)
        return respond(request, convert.single(obj, "NodeMetricsHistory"), table=NODE_TABLE)

    # -- pods ------------------------------------------------------------------------------------

    def _pod_item(self, pod: PodInfo, oldest: float, created: str, fmt: convert.TimeCache) -> dict | None:
        names, points = self.history.pod_points(pod.namespace, pod.name, oldest)
        if not points:
            return None
        return convert.pod_history(
            pod.namespace, pod.name, pod.labels, self.window, names, points, created, fmt
        )

    async def list_pods(self, request: web.Request) -> web.StreamResponse:
        labels, fields, oldest = self._params(request)
        _, _, in_scope = pods_in_scope(self.inventory, request.match_info.get("namespace"), fields)
        pods = list(in_scope)
        keep = object_filter(labels, fields, namespaced=True)
        fmt = convert.TimeCache()
        created = fmt(time.time())

        def items() -> Iterator[dict]:
            for pod in pods:
                if keep is None or keep(pod):
                    item = self._pod_item(pod, oldest, created, fmt)
                    if item is not None:
                        yield item

        if self._table(request):
            obj = convert.object_list("PodMetricsHistoryList", list(items()))
            return respond(request, obj, table=POD_TABLE)
        return await list_response(request, "PodMetricsHistoryList", items())

    async def get_pod(self, request: web.Request) -> web.Response:
        _, _, oldest = self._params(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        pod = self.inventory.pod(namespace, name)
        if pod is None:
            raise not_found(convert.GROUP, "pods", name)
        fmt = convert.TimeFormatter()
        names, points = self.history.pod_points(namespace, name, oldest)
        if not points:
            names = ()
        obj = convert.pod_history(
            namespace, name, pod.labels, self.window, names, points, fmt(time.time()), fmt
        )
        return respond(request, convert.single(obj, "PodMetricsHistory"), table=POD_TABLE)

    # -- scrapes ---------------------------------------------------------------------------------

    def _scrape_items(self, keep: Callable[[Any], bool] | None) -> list[dict]:
        assert self.scrapes is not None  # the route exists only with a source
        stale = set(self.scrapes.missing_nodes())
        fmt = convert.TimeFormatter()
        out = []
        for name, entry in self.scrapes.status.items():
            if keep is not None:
                node = self.inventory.node(name)
                if node is None or not keep(node):
                    continue
            out.append(convert.scrape_status(name, entry, name in stale, fmt))
        return out

    async def list_scrapes(self, request: web.Request) -> web.Response:
        labels, fields, _ = self._params(request)
        items = self._scrape_items(object_filter(labels, fields, namespaced=False))
        return respond(request, convert.object_list("ScrapeStatusList", items), table=SCRAPE_TABLE)

    async def get_scrape(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        assert self.scrapes is not None  # the route exists only with a source
        entry = self.scrapes.status.get(name)
        if entry is None:
            raise not_found(convert.GROUP, "scrapes", name)
        stale = name in set(self.scrapes.missing_nodes())
        obj = convert.scrape_status(name, entry, stale, convert.TimeFormatter())
        return respond(request, convert.single(obj, "ScrapeStatus"), table=SCRAPE_TABLE)
