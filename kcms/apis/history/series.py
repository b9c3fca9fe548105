"""history.kcms.io/v1alpha1 ``series``: the kept points of custom and external metric series
(MetricSeriesHistory), read from the :class:`~kcms.store.series.SeriesStore` that serves
custom.metrics.k8s.io and external.metrics.k8s.io.

``GET .../namespaces/<ns>/series?metric=<m>[&resource=<group-resource>]``: the series of ``m`` about
objects in ``ns`` (and the external series of ``ns`` unless ``resource`` is given);
``GET .../series?metric=<m>[&resource=...]``: about cluster-scoped objects (nodes, namespaces, ...) and
the external series of no namespace. ``resource`` ``external`` selects the external series only.
``labelSelector`` selects on the series' metric labels (as external.metrics.k8s.io and
``metricLabelSelector`` do), ``fieldSelector`` on the described object's ``metadata.name`` /
``metadata.namespace``; ``since`` bounds the points as for nodes and pods (and a point is never older
than ``--series-retention``). Only stored series: derived names (``<m>_per_second``,
``<m>_agg_max_5m``) are computed by the custom metrics API, not kept, so they have no history.
"""

from __future__ import annotations

import re
import time
from array import array
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web

from kcms.apis.custom.convert import described_object, quantity
from kcms.apis.history import convert
from kcms.apis.history.api import list_response, parse_since
from kcms.apis.objects import ResourceInfo
from kcms.apiserver import bad_request
from kcms.selectors import SelectorError, parse_field_selector, parse_label_selector
from kcms.store.history import HistoryStore
from kcms.store.query import validate_metric_name
from kcms.store.series import SeriesStore

FIELDS = frozenset({"metadata.name", "metadata.namespace"})
MAX_METRIC = 253
EXTERNAL = "external"
# a group-resource: "pods", "deployments.apps", "widgets.example.com"
_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class SeriesHistory:
    """The ``series`` handlers over a series store."""

    def __init__(
        self,
        series: SeriesStore,
        history: HistoryStore,
        info: Callable[[str], ResourceInfo],
    ) -> None:
        self.series = series
        self.history = history
        self.info = info  # group-resource -> kind, apiVersion (kcms.apis.objects.ObjectLabels)

    async def list_cluster(self, request: web.Request) -> web.StreamResponse:
        return await self._list(request, "")

    async def list_namespaced(self, request: web.Request) -> web.StreamResponse:
        return await self._list(request, request.match_info["namespace"])

    def _params(self, request: web.Request):
        metric = request.query.get("metric", "")
        if not metric:
            raise bad_request("metric: required (the series' metric name)")
        try:
            validate_metric_name(metric[: MAX_METRIC + 1])
            if len(metric) > MAX_METRIC:
                raise ValueError(f"metric: longer than {MAX_METRIC} characters")
        except ValueError as e:
            raise bad_request(str(e)) from None
        resource = request.query.get("resource")
        if resource is not None and resource != EXTERNAL and not _RESOURCE.fullmatch(resource):
            raise bad_request("resource: not a group-resource such as pods or deployments.apps")
        try:
            labels = parse_label_selector(request.query.get("labelSelector", ""))
            fields = parse_field_selector(request.query.get("fieldSelector", ""), FIELDS)
        except SelectorError as e:
            raise bad_request(str(e)) from None
        now = time.time()
        oldest = max(
            self.history.since(parse_since(request.query.get("since")), now), now - self.series.retention
        )
        return metric, resource, labels, fields, oldest

    async def _list(self, request: web.Request, namespace: str) -> web.StreamResponse:
        metric, resource, labels, fields, oldest = self._params(request)
        want = None if resource is None else ("" if resource == EXTERNAL else resource)

        def select(res: str, ns: str, name: str) -> bool:
            if ns != namespace or (want is not None and res != want):
                return False
            return fields.empty or fields.matches({"metadata.name": name, "metadata.namespace": ns})

        fmt = convert.TimeCache()

        def items() -> Iterator[dict]:
            for _, res, ns, name, series_labels, packed in self.series.export(select, (metric,)):
                if not labels.empty and not labels.matches(dict(series_labels)):
                    continue
                pts = array("d")
                pts.frombytes(packed)
                points = [
                    {"timestamp": fmt(pts[i]), "value": quantity(pts[i + 1])}
                    for i in range(0, len(pts), 2)
                    if pts[i] >= oldest
                ]
                if points:
                    yield self._item(res, ns, name, metric, series_labels, points)

        return await list_response(request, "MetricSeriesHistoryList", items())

    def _item(self, res: str, ns: str, name: str, metric: str, labels, points: list) -> dict:
        metric_obj: dict[str, Any] = {"name": metric}
        if labels:
            metric_obj["selector"] = {"matchLabels": dict(labels)}
        if res:
            obj = described_object(self.info(res), ns, name)
        else:  # an external series: about no object
            obj = (
                {"kind": "", "namespace": ns, "name": "", "apiVersion": ""}
                if ns
                else {"kind": "", "name": ""}
            )
        return {"describedObject": obj, "external": not res, "metric": metric_obj, "points": points}
