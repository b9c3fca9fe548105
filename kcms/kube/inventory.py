"""Inventories (kcms.model.Inventory): which nodes and pods exist.

- `KubeInventory`: list+watch caches of the Kubernetes API (nodes by the node selector, pods of all
  namespaces). Like metrics-server, it keeps only Running pods: the pod informer uses the field
  selector ``status.phase=Running``, so a pod that is not Running (Pending, finished, Unknown) is not
  listed, and one that stops running leaves the cache (the watch reports it as DELETED when it stops
  matching). Nothing that reads pods needs the others: only Running pods have usage
  (kcms/apis/metrics), an agent or a node push speaks for the pods running on its node
  (kcms/nodescope.py, kcms/apis/nodebinding.py), and a custom-metrics label selection names objects
  with metrics.

  Pods are decoded from the raw LIST/WATCH bytes by typed msgspec Structs that read only the fields
  kept (kcms/kube/objects.py), and stored namespace -> name -> PodInfo. With
  ``pod_node_names=False`` pods are listed as metadata only (``PartialObjectMetadataList``, as
  metrics-server does; ~30 % of the bytes of full pods): their ``node_name`` is "" then, which is
  right only where nothing binds pods to nodes (no agent scraping, no node push).

  ``start()`` lists nodes and pods at the same time. ``nodes_synced()`` is true once the nodes are
  listed: that is all the kubelet scrape loop needs, so it starts before a 150 000-pod list is in;
  ``has_synced()`` (readiness) waits for both.
- `StaticInventory`: a fixed list of Node and Pod objects (a v1 List file), for simulations and demos.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kcms.kube.client import KubeClient
from kcms.kube.informer import Informer
from kcms.kube.objects import NODE_WIRE, POD_META_WIRE, POD_WIRE, node_from_json, pod_from_json
from kcms.model import NodeInfo, PodInfo

RUNNING_PODS = "status.phase=Running"
PAGE_SIZE = 500  # objects per LIST page (client-go's default)


def _pod_key(p: PodInfo) -> tuple[str, str]:
    return (p.namespace, p.name)


def _node_key(n: NodeInfo) -> str:
    return n.name


class KubeInventory:
    """Nodes (matching ``node_selector``) and Running pods, kept current by list+watch."""

    def __init__(
        self,
        client: KubeClient,
        node_selector: str = "",
        *,
        watch_timeout: int = 300,
        pod_node_names: bool = True,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self.node_informer: Informer[NodeInfo] = Informer(
            client,
            "/api/v1/nodes",
            node_from_json,
            _node_key,
            label_selector=node_selector,
            wire=NODE_WIRE,
            page_size=page_size,
            watch_timeout=watch_timeout,
        )
        self.pod_informer: Informer[PodInfo] = Informer(
            client,
            "/api/v1/pods",
            pod_from_json,
            _pod_key,
            field_selector=RUNNING_PODS,
            wire=POD_WIRE if pod_node_names else POD_META_WIRE,
            nested=True,
            page_size=page_size,
            watch_timeout=watch_timeout,
        )

    async def start(self, *, wait_for_pods: bool = True) -> None:
        """Start both caches, listing at the same time; return when both have their first list, or
        (``wait_for_pods=False``) as soon as the nodes have theirs, the pods following."""
        pods = asyncio.ensure_future(self.pod_informer.start())
        try:
            await self.node_informer.start()
        except BaseException:
            pods.cancel()
            raise
        if wait_for_pods:
            await pods
        else:
            pods.add_done_callback(_quiet)

    async def stop(self) -> None:
        await self.node_informer.stop()
        await self.pod_informer.stop()

    def nodes_synced(self) -> bool:
        """True once the nodes are listed (enough to scrape kubelets)."""
        return self.node_informer.has_synced()

    def has_synced(self) -> bool:
        return self.node_informer.has_synced() and self.pod_informer.has_synced()

    def nodes(self) -> Iterable[NodeInfo]:
        return self.node_informer.values()

    def node(self, name: str) -> NodeInfo | None:
        return self.node_informer.get(name)

    def pods(self, namespace: str | None = None) -> Iterable[PodInfo]:
        if namespace is None:
            return self.pod_informer.values()
        return self.pod_informer.by_index(namespace)

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        return self.pod_informer.get((namespace, name))

    def pod_changes(self, since: int) -> tuple[int, Iterable[tuple[str, str]] | None]:
        """``(version, keys of the pods added, changed or removed after version ``since``)``, the
        keys None when the log does not reach back that far (kcms.model.PodChangeLog)."""
        return self.pod_informer.changes_since(since)  # type: ignore[return-value]


def _quiet(task: asyncio.Future[None]) -> None:
    """Retrieve a background start's outcome (its loop keeps retrying by itself)."""
    if not task.cancelled():
        task.exception()


class StaticInventory:
    """An inventory built once from Node and Pod JSON objects; always synced."""

    def __init__(self, objects: Iterable[dict[str, Any]]) -> None:
        self._nodes: dict[str, NodeInfo] = {}
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._by_ns: dict[str, dict[str, PodInfo]] = {}
        for obj in objects:
            kind = obj.get("kind")
            if kind == "Node":
                n = node_from_json(obj)
                self._nodes[n.name] = n
            elif kind == "Pod":
                p = pod_from_json(obj)
                self._pods[(p.namespace, p.name)] = p
                self._by_ns.setdefault(p.namespace, {})[p.name] = p

    @classmethod
    def from_document(cls, doc: Any) -> StaticInventory:
        """From a v1 List / NodeList / PodList object, a JSON array of objects, or a single object."""
        return cls(_flatten(doc))

    @classmethod
    def from_file(cls, path: str | Path) -> StaticInventory:
        """From a JSON (or, when PyYAML is installed, YAML; multi-document allowed) file."""
        text = Path(path).read_text()
        try:
            docs: list[Any] = [json.loads(text)]
        except ValueError:
            import yaml  # optional: only for YAML inputs

            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        return cls([o for d in docs for o in _flatten(d)])

    def has_synced(self) -> bool:
        return True

    def nodes_synced(self) -> bool:
        return True

    def nodes(self) -> Iterable[NodeInfo]:
        return list(self._nodes.values())

    def node(self, name: str) -> NodeInfo | None:
        return self._nodes.get(name)

    def pods(self, namespace: str | None = None) -> Iterable[PodInfo]:
        if namespace is None:
            return list(self._pods.values())
        return list(self._by_ns.get(namespace, {}).values())

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        return self._pods.get((namespace, name))

    def pod_changes(self, since: int) -> tuple[int, Iterable[tuple[str, str]] | None]:
        """Never any change (kcms.model.PodChangeLog)."""
        return 0, ()


def _flatten(doc: Any) -> list[dict[str, Any]]:
    if isinstance(doc, list):
        return [o for d in doc for o in _flatten(d)]
    if not isinstance(doc, dict):
        raise ValueError(f"expected a Kubernetes object or list, got {type(doc).__name__}")
    kind = str(doc.get("kind", ""))
    if "items" in doc:
        item_kind = kind[:-4] if kind.endswith("List") and kind != "List" else ""
        out = []
        for item in doc.get("items") or ():
            if isinstance(item, dict):
                if item_kind and "kind" not in item:
                    item = {**item, "kind": item_kind}
                out.extend(_flatten(item))
        return out
    return [doc]
