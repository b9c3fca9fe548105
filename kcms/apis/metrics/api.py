"""metrics.k8s.io/v1beta1: NodeMetrics and PodMetrics over a ResourceStore and an Inventory.

JSON lists are made of cached byte pieces and streamed when large (:mod:`.render`), so that
listing every pod of a big cluster neither builds a dict per pod nor holds the event loop the
collector shares. ``Table`` output and single objects are built as dicts
(:mod:`.convert`); both paths give the same JSON.
"""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from kcms.apis.metrics import convert, gzblocks
from kcms.apis.metrics.blocks import PRERENDER_WITHIN, NodeBlocks
from kcms.apis.metrics.openapi import DEFINITIONS, PATHS
from kcms.apis.metrics.render import POD_LIST_HEAD, ListRenderer, gzipped_list_response, list_response
from kcms.apis.objects import nodes_in_scope, pod_scope, scoped_pods
from kcms.apiserver import APIGroupVersion, StatusError, TableConverter, bad_request, not_found, respond
from kcms.apiserver.responses import accepts_gzip, negotiate
from kcms.model import Inventory
from kcms.quantity import format_bytes, format_cpu_nanocores, parse_quantity
from kcms.selectors import (
    SelectorError,
    object_filter,
    parse_field_selector,
    parse_label_selector,
)
from kcms.store.cluster import QuorumError
from kcms.store.resource import ResourceStore

FIELDS = frozenset({"metadata.name", "metadata.namespace"})

RESOURCES = [
    {
        "name": "nodes",
        "singularName": "",
        "namespaced": False,
        "kind": "NodeMetrics",
        "verbs": ["get", "list"],
    },
    {"name": "pods", "singularName": "", "namespaced": True, "kind": "PodMetrics", "verbs": ["get", "list"]},
]


def _sum_containers(obj: dict, resource: str) -> str:
    """A pod's Table row shows the sum over its containers, as metrics-server's does."""
    total = sum(parse_quantity(c["usage"][resource]) for c in obj["containers"])
    if resource == "cpu":
        return format_cpu_nanocores(int(total * 10**9))
    return format_bytes(int(total))


def _columns(extra: str) -> list[dict]:
    cols = [{"name": "Name", "type": "string", "format": "name", "description": "Name of the resource"}]
    for name in ("cpu", "memory"):
        cols.append({"name": name, "type": "string", "format": "quantity", "description": f"{name} usage"})
    cols.append({"name": "Window", "type": "string", "format": "", "description": extra})
    return cols


NODE_TABLE = TableConverter(
    columns=_columns("Time window the usage was measured over"),
    row=lambda o: [o["metadata"]["name"], o["usage"]["cpu"], o["usage"]["memory"], o["window"]],
)
POD_TABLE = TableConverter(
    columns=_columns("Time window the usage was measured over"),
    row=lambda o: [
        o["metadata"]["name"],
        _sum_containers(o, "cpu"),
        _sum_containers(o, "memory"),
        o["window"],
    ],
)


class MetricsAPI:
    """The request handlers over an inventory and a store (and the pieces of rendered lists)."""

    def __init__(self, inventory: Inventory, store: ResourceStore) -> None:
        self.inventory = inventory
        self.store = store
        # Rendered JSON pieces per node and pod, reused while neither the object nor its usage
        # changes: listing 150 000 pods then formats nothing twice.
        self.renderer = ListRenderer(inventory)
        # The list of every pod, node by node (blocks.py). Rendering ahead pays off while such lists
        # come at least once a resolution.
        resolution = getattr(store, "resolution", None)  # a ResourceStore's; replicas: the default
        self.pod_blocks = NodeBlocks(self.renderer, prerender_within=resolution or PRERENDER_WITHIN)

    async def _view(self, kind: str, namespace: str | None, names: list[str] | None):
        """What to read usage from: the store itself, or (store replicas) a snapshot of the
        objects this request needs; a missed read quorum is a 503 Status."""
        snapshot = getattr(self.store, "snapshot", None)
        if snapshot is None:
            return self.store
        try:
            return await snapshot(kind, namespace, names)
        except QuorumError as e:
            raise StatusError(503, "ServiceUnavailable", str(e)) from None

    def group_version(self) -> APIGroupVersion:
        return APIGroupVersion(
            group=convert.GROUP,
            version=convert.VERSION,
            resources=RESOURCES,
            routes=[
                ("GET", "/nodes", self.list_nodes),
                ("GET", "/nodes/{name}", self.get_node),
                ("GET", "/pods", self.list_pods),
                ("GET", "/namespaces/{namespace}/pods", self.list_pods),
                ("GET", "/namespaces/{namespace}/pods/{name}", self.get_pod),
            ],
            openapi_definitions=DEFINITIONS,
            openapi_paths=PATHS,
        )

    # -- selectors ---------------------------------------------------------------------------

    @staticmethod
    def _selectors(request: web.Request):
        try:
            labels = parse_label_selector(request.query.get("labelSelector", ""))
            fields = parse_field_selector(request.query.get("fieldSelector", ""), FIELDS)
        except SelectorError as e:
            raise bad_request(str(e)) from None
        return labels, fields

    # -- nodes -------------------------------------------------------------------------------

    async def list_nodes(self, request: web.Request) -> web.StreamResponse:
        labels, fields = self._selectors(request)
        name, nodes = nodes_in_scope(self.inventory, fields)
        now = time.monotonic()
        created = convert.TimeFormatter()(time.time())
        store = await self._view("nodes", None, None if name is None else [name])
        keep = object_filter(labels, fields, namespaced=False)
        if negotiate(request.headers.get("Accept")).table_version is None:
            chunks = self.renderer.nodes(nodes, store.node_usage, now, keep, created)
            return await list_response(request, "NodeMetricsList", chunks)
        items = []
        fmt = convert.TimeFormatter()
        for node in nodes:
            if keep is not None and not keep(node):
                continue
            usage = store.node_usage(node.name, now)
            if usage is not None:
                items.append(convert.node_metrics(node, usage, created, fmt))
        return respond(request, convert.object_list("NodeMetricsList", items), table=NODE_TABLE)

    async def get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        node = self.inventory.node(name)
        usage = (await self._view("nodes", None, [name])).node_usage(name) if node is not None else None
        if node is None or usage is None:
            raise not_found(convert.GROUP, "nodemetrics", name)
        fmt = convert.TimeFormatter()
        obj = convert.node_metrics(node, usage, fmt(time.time()), fmt)
        return respond(request, convert.single(obj, "NodeMetrics"), table=NODE_TABLE)

    # -- pods --------------------------------------------------------------------------------

    async def list_pods(self, request: web.Request) -> web.StreamResponse:
        labels, fields = self._selectors(request)
        namespace, name = pod_scope(request.match_info.get("namespace"), fields)
        now = time.monotonic()
        created = convert.TimeFormatter()(time.time())
        store = await self._view("pods", namespace, None if name is None or namespace is None else [name])
        keep = object_filter(labels, fields, namespaced=True)
        if negotiate(request.headers.get("Accept")).table_version is None:
            if namespace is None and name is None and keep is None and hasattr(store, "pod_blocks"):
                # Every pod (kubectl top pods -A): node blocks, a few µs per node (blocks.py); gzipped,
                # spliced from blocks compressed once (gzblocks.py).
                if gzip_spliced(request, created):
                    chunks = self.pod_blocks.items(store, now, created, gzip_head=POD_LIST_HEAD)
                    return await gzipped_list_response(request, chunks)
                chunks = self.pod_blocks.items(store, now, created)
                return await list_response(request, "PodMetricsList", chunks)
            # The inventory's snapshot of every pod is made only here, not for the node blocks' list
            # above, which never read it: at 150 000 pods, 4.5-7 ms to make (an incref a pod) and
            # 5-8 ms each time a young collection walked it, twice (in process, 28 Nov).
            pods = scoped_pods(self.inventory, namespace, name)
            snapshot = store is not self.store  # new usage objects per request: compare values
            chunks = self.renderer.pods(pods, store.pod_usage, now, keep, created, by_value=snapshot)
            return await list_response(request, "PodMetricsList", chunks)
        items = []
        fmt = convert.TimeFormatter()
        for pod in scoped_pods(self.inventory, namespace, name):
            if pod.phase != "Running" or (keep is not None and not keep(pod)):
                continue
            usage = store.pod_usage(pod.namespace, pod.name, now)
            if usage is not None:
                items.append(convert.pod_metrics(pod, convert.pod_usage_body(usage, fmt), created))
        return respond(request, convert.object_list("PodMetricsList", items), table=POD_TABLE)

    async def get_pod(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        name = request.match_info["name"]
        pod = self.inventory.pod(namespace, name)
        usage = None
        if pod is not None and pod.phase == "Running":
            usage = (await self._view("pods", namespace, [name])).pod_usage(namespace, name)
        if pod is None or usage is None:
            raise not_found(convert.GROUP, "podmetrics", name)
        fmt = convert.TimeFormatter()
        obj = convert.pod_metrics(pod, convert.pod_usage_body(usage, fmt), fmt(time.time()))
        return respond(request, convert.single(obj, "PodMetrics"), table=POD_TABLE)


def gzip_spliced(request: web.Request, created: str) -> bool:
    """Whether the list of every pod goes out as a gzip member spliced from compressed node blocks:
    the client accepts gzip, ISA-L is there, and ``created`` is the usual 22 bytes of JSON."""
    if not gzblocks.AVAILABLE or not accepts_gzip(request):
        return False
    return len(orjson.dumps(created)) == gzblocks.STAMP_LENGTH
