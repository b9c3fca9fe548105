"""The provider interface behind custom.metrics.k8s.io and external.metrics.k8s.io, and
:class:`StoreProvider`, which serves both from a :class:`~kcms.store.series.SeriesStore`.

A provider answers two questions: which metrics exist (for discovery) and what the values of one
metric are for some objects (or, for external metrics, for a namespace). Several providers can be
mounted side by side: the API asks them in order and the first one with values answers; discovery
is the union of what they list.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kcms.model import Labels, ObjectRef
from kcms.selectors import LabelSelector
from kcms.store.query import parse_metric_name

if TYPE_CHECKING:  # the store is only needed by StoreProvider, and only for typing
    from kcms.store.series import SeriesStore

__all__ = [
    "EVERYTHING",
    "CustomMetricsProvider",
    "ExternalMetricsProvider",
    "MetricInfo",
    "MetricValue",
    "StoreProvider",
    "custom_metric_infos",
    "external_metric_names",
    "first_with_values",
]

EVERYTHING = LabelSelector()  # the selector that matches every series


@dataclass(slots=True, frozen=True)
class MetricInfo:
    """A metric available about objects of one group-resource (one discovery entry)."""

    resource: str  # group-resource: "pods", "deployments.apps"
    metric: str
    namespaced: bool


@dataclass(slots=True)
class MetricValue:
    """One value of a metric about one object (or, with ``obj.resource == ""``, an external metric)."""

    obj: ObjectRef
    metric: str  # the metric name as requested
    labels: Labels  # the series' metric labels, sorted by key
    value: float
    timestamp: float  # seconds since the epoch
    window: float | None  # seconds the value was computed over; None for a plain reading


@runtime_checkable
class CustomMetricsProvider(Protocol):
    """A source of metrics about Kubernetes objects (custom.metrics.k8s.io)."""

    def list_metrics(self) -> Iterable[MetricInfo]:
        """Every (resource, metric) that has values now; must be cheap (called for discovery)."""
        ...

    async def get_metrics(
        self,
        resource: str,
        namespace: str,
        names: Collection[str] | None,
        metric: str,
        metric_selector: LabelSelector,
    ) -> list[MetricValue]:
        """Values of ``metric`` for the objects ``names`` (None: every object that has it) of
        ``resource`` in ``namespace`` ("" for cluster-scoped objects), restricted to the series whose
        metric labels match ``metric_selector``. Unknown metric or objects: an empty list.
        Raises ``ValueError`` for a malformed metric name."""
        ...


@runtime_checkable
class ExternalMetricsProvider(Protocol):
    """A source of metrics about nothing in the cluster (external.metrics.k8s.io)."""

    def list_external_metrics(self) -> Iterable[str]:
        """Every external metric that has values now."""
        ...

    async def get_external_metrics(
        self, namespace: str, metric: str, selector: LabelSelector
    ) -> list[MetricValue]:
        """Values of ``metric`` visible from ``namespace`` whose metric labels match ``selector``.
        Raises ``ValueError`` for a malformed metric name."""
        ...


def _with_rates(metric: str) -> tuple[str, ...]:
    """A series name, and ``<base>_per_second`` too when it is a counter ``<base>_total``."""
    if metric.endswith("_total") and len(metric) > len("_total"):
        return metric, metric[: -len("_total")] + "_per_second"
    return (metric,)


def custom_metric_infos(
    pairs: Iterable[tuple[str, str]], namespaced: Callable[[str], bool]
) -> list[MetricInfo]:
    """Discovery entries for stored ``(resource, series name)`` pairs (external ones skipped)."""
    out: list[MetricInfo] = []
    scoped: dict[str, bool] = {}
    for resource, metric in pairs:
        if not resource:
            continue
        ns = scoped.get(resource)
        if ns is None:
            ns = scoped[resource] = bool(namespaced(resource))
        out.extend(MetricInfo(resource, name, ns) for name in _with_rates(metric))
    return out


def external_metric_names(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """External metric names for stored ``(resource, series name)`` pairs (resource "")."""
    return [name for resource, metric in pairs if not resource for name in _with_rates(metric)]


async def first_with_values(
    providers: Sequence[Any], call: Callable[[Any], Awaitable[list[MetricValue]]]
) -> list[MetricValue]:
    """Ask ``providers`` in order; the first with values answers. When none has values and one
    found the metric name malformed, re-raise the first such ``ValueError``."""
    problem: ValueError | None = None
    for provider in providers:
        try:
            values = await call(provider)
        except ValueError as e:
            problem = problem or e
            continue
        if values:
            return values
    if problem is not None:
        raise problem
    return []


class StoreProvider:
    """Both provider interfaces over a :class:`~kcms.store.series.SeriesStore`.

    ``namespaced(resource)`` tells whether objects of a group-resource live in namespaces (for
    discovery's ``namespaced`` flag). Besides the stored series names, discovery lists
    ``<base>_per_second`` for every counter series ``<base>_total``. External metrics are the
    series whose object has resource ""; a request from namespace ``ns`` sees the ones stored in
    ``ns`` and the cluster-wide ones (stored with namespace "").
    """

    def __init__(self, store: SeriesStore, namespaced: Callable[[str], bool]) -> None:
        self.store = store
        self.namespaced = namespaced

    def _check_name(self, metric: str) -> None:
        """Raise ``ValueError`` naming the problem when ``metric`` is not in the store's grammar (the
        store itself answers such names with nothing)."""
        parse_metric_name(metric, self.store.retention)

    # ---- custom metrics ------------------------------------------------------------------------
    def list_metrics(self) -> Iterable[MetricInfo]:
        """Every (resource, metric) present in the store, and the rates of its counters."""
        return custom_metric_infos(self.store.metrics(), self.namespaced)

    async def get_metrics(
        self,
        resource: str,
        namespace: str,
        names: Collection[str] | None,
        metric: str,
        metric_selector: LabelSelector,
    ) -> list[MetricValue]:
        """Query the store (see :meth:`CustomMetricsProvider.get_metrics`)."""
        selector = None if metric_selector.empty else metric_selector
        results = self.store.query(resource, namespace, names, metric, label_selector=selector)
        if not results:
            self._check_name(metric)
        return [MetricValue(r.obj, metric, r.labels, r.value, r.timestamp, r.window) for r in results]

    # ---- external metrics ----------------------------------------------------------------------
    def list_external_metrics(self) -> Iterable[str]:
        """The external series names present in the store, and the rates of its counters."""
        return external_metric_names(self.store.metrics())

    async def get_external_metrics(
        self, namespace: str, metric: str, selector: LabelSelector
    ) -> list[MetricValue]:
        """The namespace's values of ``metric`` and then the cluster-wide ones."""
        sel = None if selector.empty else selector
        results = list(self.store.query("", namespace, None, metric, label_selector=sel))
        if namespace:
            results.extend(self.store.query("", "", None, metric, label_selector=sel))
        if not results:
            self._check_name(metric)
        return [MetricValue(r.obj, metric, r.labels, r.value, r.timestamp, r.window) for r in results]
