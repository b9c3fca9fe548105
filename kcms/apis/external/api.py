"""external.metrics.k8s.io/v1beta1: metrics not about any Kubernetes object, served from one or more
:class:`~kcms.apis.provider.ExternalMetricsProvider`.

    /apis/external.metrics.k8s.io/v1beta1/namespaces/<ns>/<metric>?labelSelector=<on metric labels>
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from kcms.apis.custom.api import check_metric_name, parse_selector, query_providers
from kcms.apis.custom.convert import quantity, window_seconds
from kcms.apis.external.openapi import DEFINITIONS, GROUP, PATHS, VERSION
from kcms.apis.metrics.convert import TimeFormatter
from kcms.apis.provider import ExternalMetricsProvider, MetricValue
from kcms.apiserver import APIGroupVersion, TableConverter, respond

log = logging.getLogger(__name__)

API_VERSION = f"{GROUP}/{VERSION}"

# Served when no external metric is present: client-go's discovery treats an empty resource list as
# an error; adapters built on custom-metrics-apiserver (KEDA) list this one.
PLACEHOLDER = {
    "name": "externalmetrics",
    "singularName": "",
    "namespaced": True,
    "kind": "ExternalMetricValueList",
    "verbs": ["get"],
}

TABLE = TableConverter(
    columns=[
        {"name": "Metric", "type": "string", "format": "name", "description": "The metric"},
        {"name": "Labels", "type": "string", "format": "", "description": "The metric labels"},
        {"name": "Value", "type": "string", "format": "quantity", "description": "The value"},
        {"name": "Timestamp", "type": "date", "format": "", "description": "When it was produced"},
    ],
    row=lambda o: [
        o["metricName"],
        ",".join(f"{k}={v}" for k, v in o["metricLabels"].items()),
        o["value"],
        o["timestamp"],
    ],
)


def external_item(v: MetricValue, metric: str, fmt: TimeFormatter) -> dict[str, Any]:
    """One ``ExternalMetricValue`` (``metricLabels`` always present; ``window`` omitted when none)."""
    item: dict[str, Any] = {
        "metricName": metric,
        "metricLabels": dict(v.labels),
        "timestamp": fmt(v.timestamp),
    }
    window = window_seconds(v.window)
    if window is not None:
        item["window"] = window
    item["value"] = quantity(v.value)
    return item


class ExternalMetricsAPI:
    """The external metrics API over ``providers`` (asked in order; the first with values answers).
    Discovery (one entry per metric) is cached for ``discovery_ttl`` seconds."""

    def __init__(
        self,
        providers: Sequence[ExternalMetricsProvider],
        *,
        discovery_ttl: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.providers = list(providers)
        self.discovery_ttl = discovery_ttl
        self.clock = clock
        self._discovery_at = float("-inf")
        self._entries: list[dict[str, Any]] = []

    def group_version(self) -> APIGroupVersion:
        """external.metrics.k8s.io/v1beta1, ready for ``AggregatedAPIServer.install``."""
        return APIGroupVersion(
            group=GROUP,
            version=VERSION,
            resources=self.resources,
            routes=[("GET", "/namespaces/{namespace}/{metric}", self.get)],
            openapi_definitions=DEFINITIONS,
            openapi_paths=PATHS,
            preferred=True,
        )

    def resources(self) -> list[dict[str, Any]]:
        """The APIResourceList entries now: one per external metric, never empty."""
        now = self.clock()
        if now - self._discovery_at >= self.discovery_ttl:
            names: set[str] = set()
            for provider in self.providers:
                try:
                    names.update(provider.list_external_metrics())
                except Exception:  # one broken provider must not take discovery down
                    log.exception("listing the external metrics of %s failed", type(provider).__name__)
            self._entries = [
                {
                    "name": name,
                    "singularName": "",
                    "namespaced": True,
                    "kind": "ExternalMetricValueList",
                    "verbs": ["get"],
                }
                for name in sorted(names)
            ]
            self._discovery_at = now
        return self._entries if self._entries else [PLACEHOLDER]

    async def get(self, request: web.Request) -> web.Response:
        """``GET /namespaces/<ns>/<metric>``: the metric's values whose labels match ``labelSelector``."""
        namespace = request.match_info["namespace"]
        metric = request.match_info["metric"]
        check_metric_name(metric)
        selector = parse_selector(request, "labelSelector")
        values = await query_providers(
            self.providers, lambda p: p.get_external_metrics(namespace, metric, selector)
        )
        values.sort(key=lambda v: (v.labels, v.obj.namespace))
        fmt = TimeFormatter()
        items = [external_item(v, metric, fmt) for v in values]
        body = {"kind": "ExternalMetricValueList", "apiVersion": API_VERSION, "metadata": {}, "items": items}
        return respond(request, body, table=TABLE)
