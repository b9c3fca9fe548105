"""OpenAPI (Swagger 2.0) definitions of the metrics.k8s.io/v1beta1 kinds, named as upstream names them."""

from __future__ import annotations

from kcms.apiserver.openapi import META_DEFINITIONS, get_operation, list_definition, query_parameter

_PKG = "io.k8s.metrics.pkg.apis.metrics.v1beta1"
_META = "io.k8s.apimachinery.pkg.apis.meta.v1"
_QUANTITY = {"$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"}
_USAGE = {
    "description": "The memory and CPU usage, as quantities.",
    "type": "object",
    "additionalProperties": _QUANTITY,
}


def _gvk(kind: str) -> list[dict]:
    return [{"group": "metrics.k8s.io", "version": "v1beta1", "kind": kind}]


def _list(kind: str, item: str) -> dict:
    return list_definition(_PKG, item, _gvk(kind))


_COMMON = {
    "apiVersion": {"type": "string"},
    "kind": {"type": "string"},
    "metadata": {"$ref": f"#/definitions/{_META}.ObjectMeta"},
    "timestamp": {"$ref": f"#/definitions/{_META}.Time"},
    "window": {"$ref": f"#/definitions/{_META}.Duration"},
}

DEFINITIONS: dict[str, dict] = {
    **META_DEFINITIONS,
    f"{_PKG}.NodeMetrics": {
        "description": "The resource usage of a node: CPU as a rate over `window`, memory as working set.",
        "type": "object",
        "required": ["timestamp", "window", "usage"],
        "properties": {**_COMMON, "usage": _USAGE},
        "x-kubernetes-group-version-kind": _gvk("NodeMetrics"),
    },
    f"{_PKG}.NodeMetricsList": _list("NodeMetricsList", "NodeMetrics"),
    f"{_PKG}.ContainerMetrics": {
        "description": "The resource usage of one container.",
        "type": "object",
        "required": ["name", "usage"],
        "properties": {"name": {"type": "string"}, "usage": _USAGE},
    },
    f"{_PKG}.PodMetrics": {
        "description": "The resource usage of the containers of a pod.",
        "type": "object",
        "required": ["timestamp", "window", "containers"],
        "properties": {
            **_COMMON,
            "containers": {"type": "array", "items": {"$ref": f"#/definitions/{_PKG}.ContainerMetrics"}},
        },
        "x-kubernetes-group-version-kind": _gvk("PodMetrics"),
    },
    f"{_PKG}.PodMetricsList": _list("PodMetricsList", "PodMetrics"),
}


def _get(kind: str, action: str, summary: str) -> dict:
    params = (
        [
            query_parameter("labelSelector", "A selector on the objects' labels."),
            query_parameter("fieldSelector", "metadata.name and metadata.namespace, with =, == or !=."),
        ]
        if action == "list"
        else []
    )
    return get_operation(
        group="metrics.k8s.io",
        version="v1beta1",
        kind=kind.removesuffix("List"),
        schema=f"{_PKG}.{kind}",
        action=action,
        operation_id=f"{action}MetricsV1beta1{kind}",
        description=summary,
        tag="metrics_v1beta1",
        parameters=params,
    )


PATHS: dict[str, dict] = {
    "/nodes": _get("NodeMetricsList", "list", "list NodeMetrics"),
    "/nodes/{name}": _get("NodeMetrics", "get", "read the NodeMetrics of a node"),
    "/pods": _get("PodMetricsList", "list", "list PodMetrics of all namespaces"),
    "/namespaces/{namespace}/pods": _get("PodMetricsList", "list", "list PodMetrics of a namespace"),
    "/namespaces/{namespace}/pods/{name}": _get("PodMetrics", "get", "read the PodMetrics of a pod"),
}
