"""custom.metrics.k8s.io (v1beta2, preferred, and v1beta1): metrics about Kubernetes objects, served
from one or more :class:`~kcms.apis.provider.CustomMetricsProvider`.

Paths, relative to ``/apis/custom.metrics.k8s.io/<version>``::

    /<resource>/<name|*>/<metric>                  cluster-scoped objects (nodes, namespaces, ...)
    /namespaces/<ns>/<resource>/<name|*>/<metric>  namespaced objects
    /namespaces/<ns>/metrics/<metric>              the namespace object itself

``labelSelector`` (with ``*``) selects objects by their labels; ``metricLabelSelector`` (v1beta2)
selects series by their metric labels.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from kcms.apis.custom import convert
from kcms.apis.custom.openapi import definitions, paths
from kcms.apis.metrics.convert import TimeFormatter
from kcms.apis.objects import (
    WELL_KNOWN,
    ObjectLabels,
    ObjectLookupError,
    ResourceInfo,
    guess_info,
)
from kcms.apis.provider import CustomMetricsProvider, MetricValue, first_with_values
from kcms.apiserver import APIGroupVersion, StatusError, TableConverter, bad_request, respond
from kcms.selectors import LabelSelector, SelectorError, parse_label_selector

log = logging.getLogger(__name__)

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
MAX_METRIC_NAME = 253
_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_EMPTY = LabelSelector()

TABLE = TableConverter(
    columns=[
        {"name": "Name", "type": "string", "format": "name", "description": "The described object"},
        {"name": "Metric", "type": "string", "format": "", "description": "The metric"},
        {"name": "Value", "type": "string", "format": "quantity", "description": "The value"},
        {"name": "Timestamp", "type": "date", "format": "", "description": "When it was produced"},
    ],
    row=lambda o: [
        o["describedObject"]["name"],
        o["metric"]["name"] if "metric" in o else o["metricName"],
        o["value"],
        o["timestamp"],
    ],
)


def metric_not_found(metric: str, resource: str, name: str | None = None) -> StatusError:
    """404 in the upstream adapters' words: ``the server could not find the metric <m> for <r> [<n>]``."""
    target = f"{resource} {name}" if name is not None else resource
    return StatusError(404, "NotFound", f"the server could not find the metric {metric} for {target}")


def check_metric_name(metric: str) -> None:
    """Raise a 400 for a metric name outside the grammar (slashes, dashes, dots, ...)."""
    if len(metric) > MAX_METRIC_NAME or not METRIC_NAME.fullmatch(metric):
        shown = metric if len(metric) <= 80 else metric[:80] + "..."
        raise bad_request(f'invalid metric name "{shown}": must match [a-zA-Z_:][a-zA-Z0-9_:]*')


def parse_selector(request: web.Request, param: str) -> LabelSelector:
    """The label selector in query parameter ``param`` (empty if absent), or a 400."""
    text = request.query.get(param, "")
    if not text:
        return _EMPTY
    try:
        return parse_label_selector(text)
    except SelectorError as e:
        raise bad_request(f"invalid {param} {text!r}: {e}") from None


async def query_providers(providers: Sequence[Any], call: Callable[[Any], Any]) -> list[MetricValue]:
    """Ask providers in order; the first with values answers. When none has values and one found
    the metric name malformed (``ValueError``), answer 400 with its reason."""
    try:
        return await first_with_values(providers, call)
    except ValueError as e:
        raise bad_request(str(e)) from None


class CustomMetricsAPI:
    """The custom metrics API over ``providers`` (asked in order) and ``objects`` (label selectors
    on objects, and what each group-resource is). Discovery is cached for ``discovery_ttl`` seconds."""

    def __init__(
        self,
        providers: Sequence[CustomMetricsProvider],
        objects: ObjectLabels | None = None,
        *,
        discovery_ttl: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.providers = list(providers)
        self.objects = objects if objects is not None else ObjectLabels()
        self.discovery_ttl = discovery_ttl
        self.clock = clock
        self._discovery_at = float("-inf")
        self._entries: list[dict[str, Any]] = []
        self._known: set[str] = set()

    def group_versions(self) -> list[APIGroupVersion]:
        """v1beta2 (preferred) and v1beta1, ready for ``AggregatedAPIServer.install``."""
        out = []
        for version in convert.VERSIONS:
            out.append(
                APIGroupVersion(
                    group=convert.GROUP,
                    version=version,
                    resources=self.resources,
                    routes=self._routes(version),
                    openapi_definitions=definitions(version),
                    openapi_paths=paths(version),
                    preferred=version == convert.VERSIONS[0],
                )
            )
        return out

    def _routes(self, version: str) -> list[tuple[str, str, Any]]:
        async def namespace_metric(request: web.Request) -> web.Response:
            ns = request.match_info["namespace"]
            return await self.serve(request, version, "namespaces", "", ns, request.match_info["metric"])

        async def namespaced(request: web.Request) -> web.Response:
            m = request.match_info
            return await self.serve(request, version, m["resource"], m["namespace"], m["name"], m["metric"])

        async def cluster(request: web.Request) -> web.Response:
            m = request.match_info
            return await self.serve(request, version, m["resource"], "", m["name"], m["metric"])

        return [
            ("GET", "/namespaces/{namespace}/metrics/{metric}", namespace_metric),
            ("GET", "/namespaces/{namespace}/{resource}/{name}/{metric}", namespaced),
            ("GET", "/{resource}/{name}/{metric}", cluster),
        ]

    # ---- discovery -----------------------------------------------------------------------------
    def _refresh(self) -> None:
        now = self.clock()
        if now - self._discovery_at < self.discovery_ttl:
            return
        seen: dict[tuple[str, str], bool] = {}
        for provider in self.providers:
            try:
                for info in provider.list_metrics():
                    seen.setdefault((info.resource, info.metric), info.namespaced)
            except Exception:  # one broken provider must not take discovery down
                log.exception("listing the metrics of %s failed", type(provider).__name__)
        self._entries = [
            convert.resource_entry(resource, metric, ns) for (resource, metric), ns in sorted(seen.items())
        ]
        self._known = {resource for resource, _ in seen}
        self._discovery_at = now

    def resources(self) -> list[dict[str, Any]]:
        """The APIResourceList entries now: ``<resource>/<metric>`` per metric, never empty."""
        self._refresh()
        return self._entries if self._entries else [convert.PLACEHOLDER]

    def known_resource(self, resource: str) -> bool:
        """Whether some provider has metrics about ``resource`` or it is a resource we can describe."""
        self._refresh()
        return (
            resource in self._known
            or resource in WELL_KNOWN
            or self.objects.cached_info(resource) is not None
        )

    # ---- reads ---------------------------------------------------------------------------------
    async def serve(
        self, request: web.Request, version: str, resource: str, namespace: str, name: str, metric: str
    ) -> web.Response:
        """Answer one read: validate, resolve the objects, ask the providers, convert."""
        check_metric_name(metric)
        if not _RESOURCE.fullmatch(resource):
            raise metric_not_found(metric, resource)
        cached = self.objects.cached_info(resource)
        if cached is not None and cached.namespaced != bool(namespace):
            raise metric_not_found(metric, resource)
        objects_selector = parse_selector(request, "labelSelector")
        metric_selector = _EMPTY
        if version != "v1beta1":  # v1beta1 has no metricLabelSelector
            metric_selector = parse_selector(request, "metricLabelSelector")

        names: frozenset[str] | list[str] | None
        if name == "*":
            names = None
            if not objects_selector.empty:
                try:
                    names = await self.objects.names(resource, namespace, objects_selector)
                except ObjectLookupError as e:
                    raise StatusError(
                        e.code, "NotFound" if e.code == 404 else "ServiceUnavailable", str(e)
                    ) from None
                if not names:
                    return respond(request, convert.value_list(version, []), table=TABLE)
        else:
            names = [name]

        values = await query_providers(
            self.providers, lambda p: p.get_metrics(resource, namespace, names, metric, metric_selector)
        )
        if not values and name != "*":
            raise metric_not_found(metric, resource, name)
        if not values and not self.known_resource(resource):
            raise metric_not_found(metric, resource)
        info = await self._describe(resource) if values else None
        fmt = TimeFormatter()
        selector = convert.selector_object(metric_selector)
        make = convert.ITEM[version]
        values.sort(key=lambda v: (v.obj.namespace, v.obj.name, v.labels))
        refs: dict[tuple[str, str], dict[str, str]] = {}
        items = []
        for v in values:
            key = (v.obj.namespace, v.obj.name)
            ref = refs.get(key)
            if ref is None:
                assert info is not None
                ref = refs[key] = convert.described_object(info, v.obj.namespace, v.obj.name)
            items.append(make(v, ref, metric, selector, fmt))
        return respond(request, convert.value_list(version, items), table=TABLE)

    async def _describe(self, resource: str) -> ResourceInfo:
        try:
            return await self.objects.info(resource)
        except ObjectLookupError:  # values exist, so describe it as well as we can
            return self.objects.cached_info(resource) or guess_info(resource)
