"""One server, many sources, one routing rule: :class:`MetricRouter`.

KCMS serves custom.metrics.k8s.io and external.metrics.k8s.io from several sources at once (its own
series store, fed by agents, OTLP, pushes and remote write; a Prometheus-compatible backend through
:class:`~kcms.apis.prometheus.provider.PrometheusProvider`). Kubernetes lets one backend own an API
group, so the sources share it and each metric must come from exactly one of them. The rule:

* A **metric** is one discovery entry: ``<resource>/<metric>`` for custom metrics (so a store's
  ``pods/http_requests`` and Prometheus's ``deployments.apps/http_requests`` are two metrics) and
  ``<metric>`` for external metrics.
* It is served by the **first source in ``--metric-sources`` order** (default ``store,prometheus``)
  that lists it. Discovery lists it once; a read asks that source only, so its values never mix
  with another source's, and an error of that source (Prometheus down) is the answer, never a
  silent fall-through to another source's data.
* A name no source lists (the store's derived names such as ``<metric>_p95_5m`` or a counter's
  ``_per_second`` before its first points) is asked of the sources in order; the first with values
  answers (the behaviour of the API before routing).
* A source left out of ``--metric-sources`` is not served.

The table is rebuilt from the sources' own lists at most once per ``ttl`` seconds (the sources'
lists are cheap: the store's indexes, Prometheus's prebuilt relist), so a read costs one dict
lookup. ``GET /debug/metric-sources`` on the serving port shows the table: which source serves each
metric and which other sources list it too; it is authorized like any non-resource URL
(SubjectAccessReview with ``nonResourceAttributes``).

The router is itself a :class:`~kcms.apis.provider.CustomMetricsProvider` and
:class:`~kcms.apis.provider.ExternalMetricsProvider`, so the API groups mount it as their one
provider.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from kcms.apis.provider import MetricInfo, MetricValue, first_with_values
from kcms.apiserver.responses import json_response
from kcms.selectors import LabelSelector

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_ORDER", "SOURCE_NAMES", "MetricRouter", "parse_metric_sources", "route"]

SOURCE_NAMES = ("store", "prometheus")
DEFAULT_ORDER = ("store", "prometheus")
DEBUG_PATH = "/debug/metric-sources"


def parse_metric_sources(text: str) -> tuple[str, ...]:
    """``--metric-sources``: a comma-separated order of known source names, each at most once."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise ValueError(f"give at least one of {','.join(SOURCE_NAMES)}")
    unknown = [n for n in names if n not in SOURCE_NAMES]
    if unknown:
        raise ValueError(f"unknown source(s) {','.join(unknown)}; known: {','.join(SOURCE_NAMES)}")
    if len(set(names)) != len(names):
        raise ValueError("each source may appear once")
    return names


def route(order: Sequence[str] | None, available: dict[str, Any]) -> MetricRouter:
    """The router over the ``available`` sources (name -> provider) in ``order`` (``--metric-sources``;
    None: :data:`DEFAULT_ORDER`); a source left out of ``order`` is not served, a name in ``order``
    that is not available (no ``--prometheus-url``) is skipped."""
    names = order or DEFAULT_ORDER
    return MetricRouter([(name, available[name]) for name in names if name in available])


class MetricRouter:
    """Both provider interfaces over named ``sources`` (in routing order); see the module docstring.

    ``sources`` are ``(name, provider)`` pairs; a provider may implement either interface or both.
    """

    def __init__(
        self,
        sources: Sequence[tuple[str, Any]],
        *,
        ttl: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sources = list(sources)
        self.ttl = ttl
        self.clock = clock
        self._built_at = float("-inf")
        # (resource, metric) -> (index of the serving source, namespaced); every lister's index too
        self._custom: dict[tuple[str, str], tuple[int, bool]] = {}
        self._custom_also: dict[tuple[str, str], list[int]] = {}
        self._external: dict[str, int] = {}
        self._external_also: dict[str, list[int]] = {}
        self._infos: list[MetricInfo] = []
        self._external_names: list[str] = []

    @property
    def order(self) -> list[str]:
        return [name for name, _ in self.sources]

    # ---- the table -----------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Rebuild the routing table from the sources' lists (at most once per ``ttl``)."""
        now = self.clock()
        if not force and now - self._built_at < self.ttl:
            return
        custom: dict[tuple[str, str], tuple[int, bool]] = {}
        custom_also: dict[tuple[str, str], list[int]] = {}
        external: dict[str, int] = {}
        external_also: dict[str, list[int]] = {}
        for i, (name, provider) in enumerate(self.sources):
            if hasattr(provider, "list_metrics"):
                try:
                    infos = list(provider.list_metrics())
                except Exception as e:  # one broken source must not take the others' metrics down
                    log.warning("listing the custom metrics of source %s failed: %s", name, e)
                    infos = self._previous_custom(i)
                for info in infos:
                    key = (info.resource, info.metric)
                    if key in custom:
                        also = custom_also.setdefault(key, [])
                        if i not in also:
                            also.append(i)
                    else:
                        custom[key] = (i, info.namespaced)
            if hasattr(provider, "list_external_metrics"):
                try:
                    names = list(provider.list_external_metrics())
                except Exception as e:
                    log.warning("listing the external metrics of source %s failed: %s", name, e)
                    names = [m for m, owner in self._external.items() if owner == i]
                for metric in names:
                    if metric in external:
                        also = external_also.setdefault(metric, [])
                        if i not in also:
                            also.append(i)
                    else:
                        external[metric] = i
        self._custom, self._custom_also = custom, custom_also
        self._external, self._external_also = external, external_also
        self._infos = [MetricInfo(resource, metric, ns) for (resource, metric), (_, ns) in custom.items()]
        self._external_names = list(external)
        self._built_at = now

    def _previous_custom(self, index: int) -> list[MetricInfo]:
        return [MetricInfo(r, m, ns) for (r, m), (owner, ns) in self._custom.items() if owner == index]

    def custom_source(self, resource: str, metric: str) -> str | None:
        """The name of the source serving ``resource/metric``, or None when no source lists it."""
        self.refresh()
        found = self._custom.get((resource, metric))
        return None if found is None else self.sources[found[0]][0]

    def external_source(self, metric: str) -> str | None:
        """The name of the source serving external ``metric``, or None when no source lists it."""
        self.refresh()
        found = self._external.get(metric)
        return None if found is None else self.sources[found][0]

    # ---- CustomMetricsProvider -----------------------------------------------------------------
    def list_metrics(self) -> Iterable[MetricInfo]:
        """One entry per routed ``resource/metric``."""
        self.refresh()
        return self._infos

    async def get_metrics(
        self,
        resource: str,
        namespace: str,
        names: Collection[str] | None,
        metric: str,
        metric_selector: LabelSelector,
    ) -> list[MetricValue]:
        """The serving source's values; for an unlisted name, the first source's with values."""
        self.refresh()
        found = self._custom.get((resource, metric))
        if found is not None:
            return await self.sources[found[0]][1].get_metrics(
                resource, namespace, names, metric, metric_selector
            )
        return await self._first_with_values(
            "get_metrics", lambda p: p.get_metrics(resource, namespace, names, metric, metric_selector)
        )

    # ---- ExternalMetricsProvider ---------------------------------------------------------------
    def list_external_metrics(self) -> Iterable[str]:
        """One entry per routed external metric."""
        self.refresh()
        return self._external_names

    async def get_external_metrics(
        self, namespace: str, metric: str, selector: LabelSelector
    ) -> list[MetricValue]:
        """The serving source's values; for an unlisted name, the first source's with values."""
        self.refresh()
        found = self._external.get(metric)
        if found is not None:
            return await self.sources[found][1].get_external_metrics(namespace, metric, selector)
        return await self._first_with_values(
            "get_external_metrics", lambda p: p.get_external_metrics(namespace, metric, selector)
        )

    async def _first_with_values(self, method: str, call: Callable[[Any], Any]) -> list[MetricValue]:
        """Ask the sources that have ``method`` in order (:func:`first_with_values`)."""
        return await first_with_values([p for _, p in self.sources if hasattr(p, method)], call)

    # ---- the debug endpoint --------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The routing table as served on ``/debug/metric-sources``."""
        self.refresh()
        names = self.order
        custom = []
        for (resource, metric), (owner, namespaced) in sorted(self._custom.items()):
            entry: dict[str, Any] = {
                "resource": resource,
                "metric": metric,
                "namespaced": namespaced,
                "source": names[owner],
            }
            also = self._custom_also.get((resource, metric))
            if also:
                entry["alsoListedBy"] = [names[i] for i in also]
            custom.append(entry)
        external = []
        for metric, owner in sorted(self._external.items()):
            entry = {"metric": metric, "source": names[owner]}
            also = self._external_also.get(metric)
            if also:
                entry["alsoListedBy"] = [names[i] for i in also]
            external.append(entry)
        return {
            "kind": "MetricSources",
            "order": names,
            "rule": "each metric (custom: <resource>/<metric>, external: <metric>) is served by the first "
            "source in this order that lists it; a name no source lists is asked of the sources in order",
            "custom": custom,
            "external": external,
        }

    def install(self, server: Any) -> None:
        """Serve ``GET /debug/metric-sources`` on ``server`` (authorized by its middleware like any
        non-resource URL)."""

        async def handler(request: Any) -> Any:
            return json_response(request, self.describe())

        server.app.router.add_get(DEBUG_PATH, handler)
