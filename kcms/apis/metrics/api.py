"""metrics.k8s.io/v1beta1: NodeMetrics and PodMetrics over a ResourceStore and an Inventory."""

from __future__ import annotations

import time
from collections.abc import Iterable

from aiohttp import web

from kcms.apis.metrics import convert
from kcms.apis.metrics.openapi import DEFINITIONS, PATHS
from kcms.apiserver import APIGroupVersion, StatusError, TableConverter, bad_request, not_found, respond
from kcms.model import Inventory, NodeInfo, PodInfo
from kcms.quantity import format_bytes, format_cpu_nanocores, parse_quantity
from kcms.selectors import SelectorError, parse_field_selector, parse_label_selector
from kcms.store.cluster import QuorumError
from kcms.store.resource import PodUsage, ResourceStore

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
    """The request handlers over an inventory and a store (and a cache of rendered pod usage)."""

    def __init__(self, inventory: Inventory, store: ResourceStore) -> None:
        self.inventory = inventory
        self.store = store
        # Rendered usage per pod, reused while the store hands out the same PodUsage (until the
        # pod's node is scraped again): listing 30 000 pods then formats nothing twice.
        self._rendered: dict[tuple[str, str], tuple[PodUsage, dict]] = {}

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

    def _pod_body(self, key: tuple[str, str], usage: PodUsage, fmt: convert.TimeFormatter) -> dict:
        hit = self._rendered.get(key)
        if hit is not None and hit[0] is usage:
            return hit[1]
        body = convert.pod_usage_body(usage, fmt)
        self._rendered[key] = (usage, body)
        return body

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

    async def list_nodes(self, request: web.Request) -> web.Response:
        labels, fields = self._selectors(request)
        name = fields.required_value("metadata.name")
        if name is not None:
            one = self.inventory.node(name)
            nodes: Iterable[NodeInfo] = [one] if one is not None else []
        else:
            nodes = self.inventory.nodes()
        items = []
        now = time.monotonic()
        created = convert.TimeFormatter()(time.time())
        fmt = convert.TimeFormatter()
        store = await self._view("nodes", None, None if name is None else [name])
        usage_of = store.node_usage
        for node in nodes:
            if not labels.empty and not labels.matches(node.labels):
                continue
            if not fields.empty and not fields.matches(
                {"metadata.name": node.name, "metadata.namespace": ""}
            ):
                continue
            usage = usage_of(node.name, now)
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

    async def list_pods(self, request: web.Request) -> web.Response:
        labels, fields = self._selectors(request)
        namespace = request.match_info.get("namespace") or fields.required_value("metadata.namespace")
        name = fields.required_value("metadata.name")
        pods: Iterable[PodInfo]
        if namespace is not None and name is not None:
            one = self.inventory.pod(namespace, name)
            pods = [one] if one is not None else []
        else:
            pods = self.inventory.pods(namespace)
        items = []
        now = time.monotonic()
        created = convert.TimeFormatter()(time.time())
        fmt = convert.TimeFormatter()
        store = await self._view("pods", namespace, None if name is None or namespace is None else [name])
        usage_of = store.pod_usage
        if len(self._rendered) > 2 * store.stats_pods() + 1000:
            self._rendered.clear()  # drop what deleted pods left behind
        for pod in pods:
            if pod.phase != "Running":
                continue
            if not labels.empty and not labels.matches(pod.labels):
                continue
            if not fields.empty and not fields.matches(
                {"metadata.name": pod.name, "metadata.namespace": pod.namespace}
            ):
                continue
            usage = usage_of(pod.namespace, pod.name, now)
            if usage is not None:
                body = self._pod_body((pod.namespace, pod.name), usage, fmt)
                items.append(convert.pod_metrics(pod, body, created))
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
        obj = convert.pod_metrics(pod, self._pod_body((namespace, name), usage, fmt), fmt(time.time()))
        return respond(request, convert.single(obj, "PodMetrics"), table=POD_TABLE)
