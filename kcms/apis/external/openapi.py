"""OpenAPI (Swagger 2.0) definitions and paths of external.metrics.k8s.io/v1beta1, named as upstream
names them (``io.k8s.metrics.pkg.apis.external_metrics.v1beta1.*``)."""

from __future__ import annotations

from typing import Any

from kcms.apiserver.openapi import META_DEFINITIONS, get_operation, list_definition, query_parameter

GROUP = "external.metrics.k8s.io"
VERSION = "v1beta1"
_PKG = "io.k8s.metrics.pkg.apis.external_metrics.v1beta1"
_META = "io.k8s.apimachinery.pkg.apis.meta.v1"


def _gvk(kind: str) -> list[dict[str, str]]:
    return [{"group": GROUP, "version": VERSION, "kind": kind}]


DEFINITIONS: dict[str, Any] = {
    **META_DEFINITIONS,
    f"{_PKG}.ExternalMetricValue": {
        "description": "A metric value for an external metric: a metric name and a set of string labels "
        "identify one value; one metric can have several values with different labels.",
        "type": "object",
        "required": ["metricName", "metricLabels", "timestamp", "value"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metricName": {"type": "string"},
            "metricLabels": {"type": "object", "additionalProperties": {"type": "string"}},
            "timestamp": {"$ref": f"#/definitions/{_META}.Time"},
            "window": {"type": "integer", "format": "int64"},
            "value": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"},
        },
        "x-kubernetes-group-version-kind": _gvk("ExternalMetricValue"),
    },
    f"{_PKG}.ExternalMetricValueList": list_definition(
        _PKG,
        "ExternalMetricValue",
        _gvk("ExternalMetricValueList"),
        "A list of values of one external metric.",
    ),
}

PATHS: dict[str, Any] = {
    "/namespaces/{namespace}/{metric}": get_operation(
        group=GROUP,
        version=VERSION,
        kind="ExternalMetricValueList",
        schema=f"{_PKG}.ExternalMetricValueList",
        action="list",
        operation_id="listNamespacedExternalMetricsV1beta1ExternalMetricValue",
        description="list the values of an external metric visible from a namespace",
        tag="externalmetrics_v1beta1",
        parameters=[query_parameter("labelSelector", "A selector on the metric's labels.")],
    ),
}
