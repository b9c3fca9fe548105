"""The shared vocabulary of KCMS: what a scrape yields, what the inventory knows, who is asking.

Every folder may import from here; nothing here imports from the rest of the package.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
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


class PodPlaces(NamedTuple):
    """Where each pod's containers lie among a batch's readings in pods' order
    (``ContainerColumns.readings``), for the series ``signature`` names.

    Made once for a node's series by the decoder and kept while they stay the same
    (:mod:`kcms.sources.decode_reuse`), so a scrape of the same series makes no pod dicts at all:
    the store reads a pod's readings by position, and ``NodeBatch.pods`` is made only when asked
    for. Building those dicts container by container was the largest Python loop of a decode
    (a template decode of 60 containers, in a tight loop: 243 us with it, 211 without).
    """

    signature: str
    # pod -> (position of its first container's reading, its containers' names in order)
    of: dict[PodKey, tuple[int, tuple[str, ...]]]
    # a getter turning a sequence in the series' order into a tuple in pods' order
    in_pod_order: Any
    # the series' indexes in pods' order (what ``in_pod_order`` takes): a pod's are
    # ``order[at : at + len(containers)]``, so a single pod's read slices them instead of making
    # the node's whole order again (~0.5 kB a node of 60 containers, kept while the series stay)
    order: tuple[int, ...]


class ContainerColumns(msgspec.Struct, gc=False, eq=False):
    """A batch's container readings as the kubelet decoder read them: one column per field, one
    entry per series, in the body's order (``NodeBatch.columns``).

    ``signature`` names the series (their label values joined; equal signatures, equal series in
    the same order), so the store can compare two scrapes of a node a column at a time (in C)
    instead of container by container (kcms/store/resource.py), and keeps the columns of the
    scrape before as they are to take rates against.

    ``readings`` (one ``ResourcePoint`` a container, pod by pod) is made when first read and kept.
    The store's column path, the list of every pod and a single pod's read take what they need
    from the columns (:meth:`points`), so a usual scrape makes none (making and freeing 60 points
    a node of 60 containers took a scrape from 737 600 instructions to 783 300:
    docs/performance.md). Only a write that pairs the readings one by one, or ``NodeBatch.pods``,
    makes them. Never tracked by the cyclic collector: it refers to numbers, strings, its
    ``places`` and its points, none of which refers back to it. Compared by identity
    (``readings`` may be made in one copy and not the other).
    """

    signature: str
    start: list[float]
    times: list[float]
    cpu_ns: list[int]
    memory: list[Any]  # int bytes
    places: PodPlaces  # where each pod's are in ``readings``
    _readings: tuple[ResourcePoint, ...] | None = None  # made by ``readings``

    @property
    def readings(self) -> tuple[ResourcePoint, ...]:
        """The batch's points pod by pod, container by container (made at the first read)."""
        readings = self._readings
        if readings is None:
            points = list(map(ResourcePoint, self.start, self.times, self.cpu_ns, self.memory))
            readings = self._readings = self.places.in_pod_order(points)
        return readings

    def points(self, series: Iterable[int]) -> list[ResourcePoint]:
        """New points of the series at these indexes (the body's order), made from the columns."""
        start, times, cpu_ns, memory = self.start, self.times, self.cpu_ns, self.memory
        return [ResourcePoint(start[i], times[i], cpu_ns[i], memory[i]) for i in series]

    def pods(self) -> dict[PodKey, dict[str, ResourcePoint]]:
        """The readings as ``NodeBatch.pods`` holds them (new dicts)."""
        readings = self.readings
        return {
            key: dict(zip(names, readings[at : at + len(names)], strict=True))
            for key, (at, names) in self.places.of.items()
        }


class NodeBatch:
    """Everything one scrape of one kubelet yielded.

    ``pods``: (namespace, pod) -> container name -> point. A batch the kubelet decoder built from
    aligned columns makes it from ``columns`` only when it is first read (the store's usual path
    never reads it, see :class:`PodPlaces`). Equality and ``repr`` are over ``node``,
    ``node_point``, ``pods`` and ``rejected``, as when this was a dataclass.
    """

    __slots__ = ("node", "node_point", "_pods", "rejected", "screened", "_columns")

    def __init__(
        self,
        node: str,
        node_point: ResourcePoint | None = None,
        pods: dict[PodKey, dict[str, ResourcePoint]] | None = None,
        rejected: dict[str, int] | None = None,
        screened: float = 0.0,
        columns: ContainerColumns | None = None,
    ) -> None:
        self.node = node
        self.node_point = node_point
        # None: to be made from ``columns`` when first read
        self._pods = pods if pods is not None or columns is not None else {}
        # reason label -> number of samples (or pods) dropped for that reason
        self.rejected: dict[str, int] = {} if rejected is None else rejected
        # The future limit (kcms.limits.future_limit) every reading above was found within by the
        # decoder that made this batch in this process, which dropped the rest; 0.0: not screened.
        # The store screens again only when it is 0 or later than its own limit (~40 us a node of
        # 60 containers saved per scrape). Never carried over a wire (nor from a scrape worker,
        # kcms.collector.workerproto): a batch read from one is 0.
        self.screened = screened
        self._columns = columns

    @property
    def pods(self) -> dict[PodKey, dict[str, ResourcePoint]]:
        pods = self._pods
        if pods is None:
            columns = self._columns
            pods = self._pods = columns.pods() if columns is not None else {}
        return pods

    @pods.setter
    def pods(self, value: dict[PodKey, dict[str, ResourcePoint]]) -> None:
        self._pods = value

    @property
    def columns(self) -> ContainerColumns | None:
        """What ``pods`` was built from, when a decoder of this process built it from aligned
        columns (every series in one container of one pod, none refused or dropped); None
        otherwise. Whoever changes ``pods`` must set it to None (``pods`` is made first if it was
        not yet). Never carried over a wire."""
        return self._columns

    @columns.setter
    def columns(self, value: ContainerColumns | None) -> None:
        if self._pods is None and self._columns is not None:
            self._pods = self._columns.pods()  # made from the columns before they go
        self._columns = value

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, NodeBatch)
        return (self.node, self.node_point, self.pods, self.rejected) == (
            other.node,
            other.node_point,
            other.pods,
            other.rejected,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return (
            f"NodeBatch(node={self.node!r}, node_point={self.node_point!r}, pods={self.pods!r}, "
            f"rejected={self.rejected!r})"
        )


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
