"""The shared vocabulary of KCMS: what a scrape yields, what the inventory knows, who is asking.

Every folder may import from here; nothing here imports from the rest of the package.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import msgspec


class ResourcePoint(msgspec.Struct, gc=False):
    """One cumulative resource reading of a node or a container (metrics-server's MetricsPoint).

    CPU is kept as an integer counter of core-nanoseconds so that deltas are exact.

    A ``msgspec`` struct, not a dataclass: built in C (~30 ns instead of ~180 ns; every scrape
    makes one per container) and, holding only numbers, never tracked by the cyclic garbage
    collector (nor, then, the store's ``(last, previous)`` tuples of them). Same fields, positional
    and keyword construction, ``==`` and ``repr`` as the dataclass it was.
    """

    start_time: float  # seconds since the epoch the container (or node) started; 0.0 if unknown
    timestamp: float  # seconds since the epoch the reading was taken, by the kubelet's clock
    cpu_ns: int  # cumulative CPU time used, core-nanoseconds
    memory: int  # working set, bytes


PodKey = tuple[str, str]  # (namespace, name)


class ContainerColumns(NamedTuple):
    """A batch's container readings as the kubelet decoder read them: one column per field, one
    entry per series, in the body's order (``NodeBatch.columns``).

    ``signature`` names the series (their label values joined; equal signatures, equal series in
    the same order), so the store can compare two scrapes of a node a column at a time (in C)
    instead of container by container (kcms/store/resource.py).
    """

    signature: str
    start: list[float]
    times: list[float]
    cpu_ns: list[int]
    memory: list[Any]  # int bytes
    readings: list[ResourcePoint]  # the batch's points pod by pod, container by container, as in ``pods``


@dataclass(slots=True)
class NodeBatch:
    """Everything one scrape of one kubelet yielded."""

    node: str
    node_point: ResourcePoint | None = None
    # (namespace, pod) -> container name -> point
    pods: dict[PodKey, dict[str, ResourcePoint]] = field(default_factory=dict)
    # reason label -> number of samples (or pods) dropped for that reason
    rejected: dict[str, int] = field(default_factory=dict)
    # The future limit (kcms.limits.future_limit) every reading above was found within by the
    # decoder that made this batch in this process, which dropped the rest; 0.0: not screened.
    # The store screens again only when it is 0 or later than its own limit (~40 us a node of
    # 60 containers saved per scrape). Never carried over a wire: a batch read from one is 0.
    screened: float = field(default=0.0, compare=False, repr=False)
    # What ``pods`` was built from, when a decoder of this process built it from aligned columns
    # (every series in one container of one pod, none refused or dropped); None otherwise. Whoever
    # changes ``pods`` must set it to None. Never carried over a wire.
    columns: ContainerColumns | None = field(default=None, compare=False, repr=False)


class DecodeError(ValueError):
    """A kubelet response that cannot be used at all; the node is skipped for this cycle.

    ``reason`` is a short, stable label (used as a Prometheus label value).
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)
class NodeInfo:
    """The parts of a Node object that KCMS needs."""

    name: str
    labels: dict[str, str]
    addresses: list[tuple[str, str]]  # status.addresses as (type, address), in order
    kubelet_port: int  # status.daemonEndpoints.kubeletEndpoint.Port, 0 if absent
    creation_timestamp: str  # "" from kcms.kube: nothing reads it


@dataclass(slots=True)
class PodInfo:
    """The parts of a Pod object that KCMS needs."""

    namespace: str
    name: str
    labels: dict[str, str]
    node_name: str  # spec.nodeName, "" if unscheduled
    phase: str  # status.phase
    creation_timestamp: str  # "" from kcms.kube: nothing reads it (10 MB at 150 000 pods)


class Inventory(Protocol):
    """Which nodes and pods exist: a list+watch cache of the Kubernetes API, or a static list."""

    def has_synced(self) -> bool: ...  # nodes and pods listed (readiness)

    def nodes_synced(self) -> bool: ...  # nodes listed: enough to scrape kubelets

    def nodes(self) -> Iterable[NodeInfo]: ...

    def node(self, name: str) -> NodeInfo | None: ...

    def pods(self, namespace: str | None = None) -> Iterable[PodInfo]: ...

    def pod(self, namespace: str, name: str) -> PodInfo | None: ...


@runtime_checkable
class PodChangeLog(Protocol):
    """An inventory that can tell which pods changed: caches of per-pod renderings then check only
    those instead of every pod (kcms/apis/metrics/blocks.py)."""

    def pod_changes(self, since: int) -> tuple[int, Iterable[PodKey] | None]:
        """``(version, keys of pods added, changed or removed after version ``since``)``; None
        instead of the keys when that is no longer known (then any pod may have changed)."""
        ...


@dataclass(slots=True, frozen=True)
class ObjectRef:
    """What a custom-metric series is about: a Kubernetes object, or nothing (external metrics)."""

    resource: str  # group-resource: "pods", "nodes", "namespaces", "deployments.apps"; "" = external
    namespace: str  # "" for cluster-scoped objects
    name: str  # "" for external metrics


Labels = tuple[tuple[str, str], ...]  # a series' metric labels, sorted by key


@dataclass(slots=True, frozen=True)
class UserInfo:
    """An authenticated caller (Kubernetes user.Info)."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()  # sorted (key, values) pairs; hashable


@dataclass(slots=True, frozen=True)
class RequestAttributes:
    """What a request asks to do, in the terms of a SubjectAccessReview."""

    verb: str  # get, list, watch, create, ... (resource requests) or the HTTP verb in lower case
    path: str
    resource_request: bool
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
