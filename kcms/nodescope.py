"""What one node may report: the object-to-node decision shared by every path a node writes through.

A node speaks for itself, the pods the inventory places on it and (optionally) namespaced objects of
the namespaces it runs pods of. Two paths use this: the node push (:mod:`kcms.apis.nodebinding`,
where the node comes from the credential) and the collector's agent scrape
(:mod:`kcms.collector.agents`, where it is the agent pod's ``spec.nodeName``). It is a top-level
helper so that both layers can import it (the collector must not import ``kcms/apis``).

:class:`NodeScope` decides each object (the reasons are Prometheus label values):

* about another node: ``other_node``; about the node itself when the inventory does not list it (not
  yet, or not selected by ``--node-selector``): ``unknown_node`` -- and then everything is refused so;
* a pod the inventory does not list: ``unknown_pod``; listed on another node: ``pod_not_on_node``;
* any other cluster-scoped object: ``object_not_bound`` (a node has no claim on it);
* a namespaced object other than a pod (a Deployment, or an external metric of a namespace):
  ``object_not_bound`` -- unless ``allow_namespaced``, and then only in a namespace where the
  inventory places at least one pod on the node (else ``namespace_not_on_node``). These are the
  agent's OTLP receiver's Deployment and namespace series; with it, a node can write such series for
  every object of the namespaces it runs pods of, not only for the pods' own owners.

Resource names are compared exactly (``pods``, ``nodes``): they are the strings the stores index and
the metric APIs read. Answers are cached per scope: build one scope per push or scrape (the inventory
is a cache that may change between awaits, and a scope is used synchronously).
"""

from __future__ import annotations

from kcms.model import Inventory

__all__ = [
    "NAMESPACE_NOT_ON_NODE",
    "OBJECT_NOT_BOUND",
    "OTHER_NODE",
    "POD_NOT_ON_NODE",
    "REASONS",
    "UNKNOWN_NODE",
    "UNKNOWN_POD",
    "NodeScope",
]

# Refusal reasons (stable: Prometheus label values).
OTHER_NODE = "other_node"
UNKNOWN_NODE = "unknown_node"
UNKNOWN_POD = "unknown_pod"
POD_NOT_ON_NODE = "pod_not_on_node"
OBJECT_NOT_BOUND = "object_not_bound"
NAMESPACE_NOT_ON_NODE = "namespace_not_on_node"
REASONS = (OTHER_NODE, UNKNOWN_NODE, UNKNOWN_POD, POD_NOT_ON_NODE, OBJECT_NOT_BOUND, NAMESPACE_NOT_ON_NODE)

MAX_CACHED_PODS = 100_000  # a report naming many distinct pods must not grow a scope's cache unbounded
MAX_CACHED_NAMESPACES = 10_000


class NodeScope:
    """What node ``node`` may report, by ``inventory`` (see the module docstring)."""

    __slots__ = ("_namespaces", "_pods", "allow_namespaced", "inventory", "node", "node_known")

    def __init__(self, node: str, inventory: Inventory, *, allow_namespaced: bool = False) -> None:
        self.node = node
        self.inventory = inventory
        self.allow_namespaced = allow_namespaced
        self.node_known = inventory.node(node) is not None
        self._pods: dict[tuple[str, str], str | None] = {}
        self._namespaces: dict[str, bool] = {}

    def node_reason(self, name: str) -> str | None:
        """Why a reading or sample about node ``name`` is refused, or None."""
        if name != self.node:
            return OTHER_NODE
        return None if self.node_known else UNKNOWN_NODE

    def pod_reason(self, namespace: str, name: str) -> str | None:
        """Why a reading or sample about pod ``namespace/name`` is refused, or None."""
        key = (namespace, name)
        try:
            return self._pods[key]
        except KeyError:
            pass
        if not self.node_known:
            reason: str | None = UNKNOWN_NODE
        else:
            pod = self.inventory.pod(namespace, name)
            reason = UNKNOWN_POD if pod is None else None if pod.node_name == self.node else POD_NOT_ON_NODE
        if len(self._pods) < MAX_CACHED_PODS:
            self._pods[key] = reason
        return reason

    def object_reason(self, resource: str, namespace: str, name: str) -> str | None:
        """Why a sample about ``(resource, namespace, name)`` is refused, or None (the reference is
        already known to be well formed)."""
        if resource == "pods" and namespace:
            return self.pod_reason(namespace, name)
        if resource == "nodes" and not namespace:
            return self.node_reason(name)
        if not self.node_known:
            return UNKNOWN_NODE
        if not namespace or not self.allow_namespaced:
            return OBJECT_NOT_BOUND
        hosted = self._namespaces.get(namespace)
        if hosted is None:
            hosted = any(p.node_name == self.node for p in self.inventory.pods(namespace))
            if len(self._namespaces) < MAX_CACHED_NAMESPACES:
                self._namespaces[namespace] = hosted
        return None if hosted else NAMESPACE_NOT_ON_NODE
