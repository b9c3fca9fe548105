"""Which Kubernetes objects a custom-metrics request is about: ``*`` plus a ``labelSelector`` resolved
to object names, and what a group-resource is (its kind, API version and scope).

Pods and nodes come from an :class:`~kcms.model.Inventory` (a list+watch cache) when it has synced;
anything else (namespaces, ``deployments.apps``, custom resources) is listed from the Kubernetes API
with the selector, after discovering the group's preferred version. Answers are cached for a few
seconds, discovery for longer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kcms.kube.client import KubeAPIError, KubeClient
from kcms.model import Inventory, NodeInfo, PodInfo
from kcms.selectors import FieldSelector, LabelSelector

__all__ = [
    "WELL_KNOWN",
    "guess_info",
    "nodes_in_scope",
    "pod_scope",
    "pods_in_scope",
    "scoped_pods",
    "ObjectLabels",
    "ObjectLookupError",
    "ResourceInfo",
    "UnknownResourceError",
    "split_group_resource",
]


class ObjectLookupError(Exception):
    """The objects of a request could not be listed (``code`` is the HTTP status to answer)."""

    def __init__(self, message: str, code: int = 503) -> None:
        super().__init__(message)
        self.code = code


class UnknownResourceError(ObjectLookupError):
    """The Kubernetes API does not serve this group-resource."""

    def __init__(self, resource: str) -> None:
        super().__init__(f"the server could not find the requested resource {resource}", 404)
        self.resource = resource


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """What a group-resource is: where it is served and what its objects are called."""

    group: str  # "" for the core group
    version: str  # "" when not known
    resource: str  # the plural, without the group
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """The describedObject ``apiVersion`` as the upstream adapters write it: ``<group>/<version>``
        (``/v1`` for the core group)."""
        return f"{self.group}/{self.version}"

    @property
    def group_resource(self) -> str:
        """``<resource>.<group>`` (just ``<resource>`` for the core group)."""
        return f"{self.resource}.{self.group}" if self.group else self.resource


def split_group_resource(group_resource: str) -> tuple[str, str]:
    """``"deployments.apps" -> ("apps", "deployments")``, ``"pods" -> ("", "pods")``."""
    resource, _, group = group_resource.partition(".")
    return group, resource


def _table() -> dict[str, ResourceInfo]:
    rows = [
        ("", "v1", "pods", "Pod", True),
        ("", "v1", "nodes", "Node", False),
        ("", "v1", "namespaces", "Namespace", False),
        ("", "v1", "services", "Service", True),
        ("", "v1", "endpoints", "Endpoints", True),
        ("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True),
        ("", "v1", "persistentvolumes", "PersistentVolume", False),
        ("", "v1", "replicationcontrollers", "ReplicationController", True),
        ("", "v1", "configmaps", "ConfigMap", True),
        ("", "v1", "serviceaccounts", "ServiceAccount", True),
        ("apps", "v1", "deployments", "Deployment", True),
        ("apps", "v1", "statefulsets", "StatefulSet", True),
        ("apps", "v1", "daemonsets", "DaemonSet", True),
        ("apps", "v1", "replicasets", "ReplicaSet", True),
        ("batch", "v1", "jobs", "Job", True),
        ("batch", "v1", "cronjobs", "CronJob", True),
        ("networking.k8s.io", "v1", "ingresses", "Ingress", True),
        ("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True),
        ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
        ("storage.k8s.io", "v1", "storageclasses", "StorageClass", False),
        ("coordination.k8s.io", "v1", "leases", "Lease", True),
    ]
    out = {}
    for group, version, resource, kind, namespaced in rows:
        info = ResourceInfo(group, version, resource, kind, namespaced)
        out[info.group_resource] = info
    return out


WELL_KNOWN: dict[str, ResourceInfo] = _table()


def guess_info(group_resource: str) -> ResourceInfo:
    """A best guess for a group-resource nobody could describe: singular, capitalised kind."""
    group, resource = split_group_resource(group_resource)
    singular = resource
    if singular.endswith("ies"):
        singular = singular[:-3] + "y"
    elif singular.endswith(("ses", "xes", "ches", "shes")):
        singular = singular[:-2]
    elif singular.endswith("s"):
        singular = singular[:-1]
    return ResourceInfo(group, "", resource, singular[:1].upper() + singular[1:], True)


class ObjectLabels:
    """Resolves ``*`` + ``labelSelector`` to object names and describes group-resources.

    ``inventory`` serves pods and nodes; ``kube`` lists everything else (and pods and nodes while
    the inventory has not synced). ``ttl`` is how long a listing is reused, ``discovery_ttl`` how
    long a group-resource's description is.
    """

    def __init__(
        self,
        inventory: Inventory | None = None,
        kube: KubeClient | None = None,
        *,
        ttl: float = 5.0,
        discovery_ttl: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        max_cached: int = 1000,
    ) -> None:
        self.inventory = inventory
        self.kube = kube
        self.ttl = ttl
        self.discovery_ttl = discovery_ttl
        self.clock = clock
        self.max_cached = max_cached
        self._names: dict[tuple[str, str, str], tuple[float, frozenset[str]]] = {}
        self._infos: dict[str, tuple[float, ResourceInfo | None]] = {}
        self.api_lists = 0  # how many listings were asked of the Kubernetes API (for tests and metrics)

    # ---- what a resource is --------------------------------------------------------------------
    def cached_info(self, group_resource: str) -> ResourceInfo | None:
        """What is known without asking anyone: the well-known table, then discovery answers."""
        hit = self._infos.get(group_resource)
        if hit is not None and hit[1] is not None:
            return hit[1]
        return WELL_KNOWN.get(group_resource)

    def namespaced(self, group_resource: str) -> bool:
        """Whether objects of ``group_resource`` live in namespaces (True when nobody knows)."""
        info = self.cached_info(group_resource)
        return True if info is None else info.namespaced

    async def info(self, group_resource: str) -> ResourceInfo:
        """Describe a group-resource: discovered from the Kubernetes API when there is one (cached),
        else the well-known table, else a guess. Raises :class:`UnknownResourceError` when the API
        says it does not serve it."""
        now = self.clock()
        hit = self._infos.get(group_resource)
        if hit is not None and now - hit[0] < self.discovery_ttl:
            if hit[1] is None:
                raise UnknownResourceError(group_resource)
            return hit[1]
        known = WELL_KNOWN.get(group_resource)
        if self.kube is None:
            return known or guess_info(group_resource)
        try:
            found = await self._discover(group_resource)
        except (KubeAPIError, OSError, ValueError, TimeoutError) as e:
            if known is not None:
                self._infos[group_resource] = (now, known)
                return known
            if isinstance(e, KubeAPIError) and e.status == 404:
                self._infos[group_resource] = (now, None)
                raise UnknownResourceError(group_resource) from None
            raise ObjectLookupError(f"unable to discover {group_resource}: {e}") from None
        self._infos[group_resource] = (now, found)
        if found is None:
            raise UnknownResourceError(group_resource)
        return found

    async def _discover(self, group_resource: str) -> ResourceInfo | None:
        assert self.kube is not None
        group, resource = split_group_resource(group_resource)
        if group:
            doc = await self.kube.get_json(f"/apis/{group}")
            version = (doc.get("preferredVersion") or {}).get("version") or ""
            if not version:
                versions = doc.get("versions") or []
                version = versions[0].get("version", "") if versions else ""
            if not version:
                return None
            listing = await self.kube.get_json(f"/apis/{group}/{version}")
        else:
            version = "v1"
            listing = await self.kube.get_json("/api/v1")
        for r in listing.get("resources") or []:
            if r.get("name") == resource:
                return ResourceInfo(group, version, resource, r.get("kind", ""), bool(r.get("namespaced")))
        return None

    # ---- which objects match -------------------------------------------------------------------
    async def names(self, group_resource: str, namespace: str, selector: LabelSelector) -> frozenset[str]:
        """Names of the objects of ``group_resource`` in ``namespace`` ("" for cluster-scoped
        resources or all namespaces) whose labels match ``selector``.

        Raises :class:`ObjectLookupError` when they cannot be listed (no inventory for them and no
        Kubernetes API, or the API failed) and :class:`UnknownResourceError` for a resource the
        API does not serve."""
        inv = self.inventory
        if inv is not None and group_resource in ("pods", "nodes") and inv.has_synced():
            if group_resource == "pods":
                pods = inv.pods(namespace or None)
                return frozenset(p.name for p in pods if selector.matches(p.labels))
            return frozenset(n.name for n in inv.nodes() if selector.matches(n.labels))
        key = (group_resource, namespace, str(selector))
        now = self.clock()
        hit = self._names.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        if self.kube is None:
            raise ObjectLookupError(
                f"cannot resolve labelSelector for {group_resource}: no access to the Kubernetes API"
            )
        info = await self.info(group_resource)
        path = self._list_path(info, namespace)
        params = {"labelSelector": str(selector)} if not selector.empty else None
        try:
            doc = await self.kube.get_json(path, params)
        except KubeAPIError as e:
            if e.status == 404:
                raise UnknownResourceError(group_resource) from None
            raise ObjectLookupError(f"unable to list {group_resource}: {e}") from None
        except (OSError, ValueError, TimeoutError) as e:
            raise ObjectLookupError(f"unable to list {group_resource}: {e}") from None
        self.api_lists += 1
        names = frozenset(_item_names(doc))
        if len(self._names) >= self.max_cached:
            self._names = {k: v for k, v in self._names.items() if now - v[0] < self.ttl}
            if len(self._names) >= self.max_cached:
                self._names.clear()
        self._names[key] = (now, names)
        return names

    @staticmethod
    def _list_path(info: ResourceInfo, namespace: str) -> str:
        base = f"/apis/{info.group}/{info.version}" if info.group else "/api/v1"
        if info.namespaced and namespace:
            return f"{base}/namespaces/{namespace}/{info.resource}"
        return f"{base}/{info.resource}"


def _item_names(doc: Any) -> list[str]:
    items = doc.get("items") if isinstance(doc, dict) else None
    out = []
    for item in items or []:
        name = ((item or {}).get("metadata") or {}).get("name")
        if isinstance(name, str):
            out.append(name)
    return out


def nodes_in_scope(inventory: Inventory, fields: FieldSelector) -> tuple[str | None, Iterable[NodeInfo]]:
    """The nodes a list request is about: the one ``metadata.name=`` names (a point lookup; none if
    unknown), else every node. Returns (that name or None, the nodes)."""
    name = fields.required_value("metadata.name")
    if name is None:
        return None, inventory.nodes()
    one = inventory.node(name)
    return name, [one] if one is not None else []


def pod_scope(path_namespace: str | None, fields: FieldSelector) -> tuple[str | None, str | None]:
    """The namespace a list of pods is about (its path's, or ``metadata.namespace=``; None: all
    namespaces) and the pod's name when ``metadata.name=`` gives one."""
    return path_namespace or fields.required_value("metadata.namespace"), fields.required_value("metadata.name")


def scoped_pods(inventory: Inventory, namespace: str | None, name: str | None) -> Iterable[PodInfo]:
    """The pods of :func:`pod_scope`'s scope: with a namespace and a name, that one pod (a point
    lookup); else the namespace's, or every pod (a snapshot of 150 000 at 5000 nodes: make it only
    when it is read)."""
    if namespace is not None and name is not None:
        one = inventory.pod(namespace, name)
        return [one] if one is not None else []
    return inventory.pods(namespace)


def pods_in_scope(
    inventory: Inventory, path_namespace: str | None, fields: FieldSelector
) -> tuple[str | None, str | None, Iterable[PodInfo]]:
    """The pods a list request is about (:func:`pod_scope`, :func:`scoped_pods`). Returns
    (namespace, name, the pods)."""
    namespace, name = pod_scope(path_namespace, fields)
    return namespace, name, scoped_pods(inventory, namespace, name)
