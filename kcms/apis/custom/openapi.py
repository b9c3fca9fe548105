"""OpenAPI (Swagger 2.0) definitions and paths of custom.metrics.k8s.io v1beta2 and v1beta1, named as
upstream names them (``io.k8s.metrics.pkg.apis.custom_metrics.<version>.*``)."""

from __future__ import annotations

from typing import Any

from kcms.apiserver.openapi import META_DEFINITIONS, get_operation, query_parameter

GROUP = "custom.metrics.k8s.io"
_META = "io.k8s.apimachinery.pkg.apis.meta.v1"
_REF = {"$ref": "#/definitions/io.k8s.api.core.v1.ObjectReference"}

OBJECT_REFERENCE = {
    "description": "ObjectReference contains enough information to let you inspect or modify the referred object.",
    "type": "object",
    "properties": {
        name: {"type": "string"}
        for name in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
    },
}

LABEL_SELECTOR = {
    "description": "A label query over a set of resources: matchLabels and matchExpressions are ANDed.",
    "type": "object",
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"type": "string"},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}


def _pkg(version: str) -> str:
    return f"io.k8s.metrics.pkg.apis.custom_metrics.{version}"


def _gvk(version: str, kind: str) -> list[dict[str, str]]:
    return [{"group": GROUP, "version": version, "kind": kind}]


def definitions(version: str) -> dict[str, Any]:
    """The definitions of one version's kinds (plus the meta and core types they refer to)."""
    pkg = _pkg(version)
    common = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "describedObject": _REF,
        "timestamp": {"$ref": f"#/definitions/{_META}.Time"},
        "value": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"},
    }
    defs: dict[str, Any] = {
        **META_DEFINITIONS,
        "io.k8s.api.core.v1.ObjectReference": OBJECT_REFERENCE,
        f"{_META}.LabelSelector": LABEL_SELECTOR,
    }
    if version == "v1beta2":
        defs[f"{pkg}.MetricIdentifier"] = {
            "description": "MetricIdentifier identifies a metric by name and, optionally, selector.",
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "selector": {"$ref": f"#/definitions/{_META}.LabelSelector"},
            },
        }
        props = {
            **common,
            "metric": {"$ref": f"#/definitions/{pkg}.MetricIdentifier"},
            "windowSeconds": {"type": "integer", "format": "int64"},
        }
        required = ["describedObject", "metric", "timestamp", "value"]
    else:
        props = {
            **common,
            "metricName": {"type": "string"},
            "window": {"type": "integer", "format": "int64"},
            "selector": {"$ref": f"#/definitions/{_META}.LabelSelector"},
        }
        required = ["describedObject", "metricName", "timestamp", "value"]
    defs[f"{pkg}.MetricValue"] = {
        "description": "MetricValue is the metric value for some object.",
        "type": "object",
        "required": required,
        "properties": props,
        "x-kubernetes-group-version-kind": _gvk(version, "MetricValue"),
    }
    defs[f"{pkg}.MetricValueList"] = {
        "description": "MetricValueList is a list of values for a given metric for some set of objects.",
        "type": "object",
        "required": ["metadata", "items"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"$ref": f"#/definitions/{_META}.ListMeta"},
            "items": {"type": "array", "items": {"$ref": f"#/definitions/{pkg}.MetricValue"}},
        },
        "x-kubernetes-group-version-kind": _gvk(version, "MetricValueList"),
    }
    return defs


def _operation(version: str, op_id: str, description: str) -> dict[str, Any]:
    params = [
        query_parameter("labelSelector", "A selector on the described objects' labels (with the name *).")
    ]
    if version != "v1beta1":
        params.append(query_parameter("metricLabelSelector", "A selector on the metric's labels."))
    return get_operation(
        group=GROUP,
        version=version,
        kind="MetricValueList",
        schema=f"{_pkg(version)}.MetricValueList",
        action="list",
        operation_id=f"{op_id}CustomMetrics{version.title()}MetricValue",
        description=description,
        tag=f"custommetrics_{version}",
        parameters=params,
    )


def paths(version: str) -> dict[str, Any]:
    """The three path forms of one version."""
    return {
        "/{resource}/{name}/{metric}": _operation(
            version, "list", "list custom metrics describing a cluster-scoped object or objects"
        ),
        "/namespaces/{namespace}/{resource}/{name}/{metric}": _operation(
            version, "listNamespaced", "list custom metrics describing a namespaced object or objects"
        ),
        "/namespaces/{namespace}/metrics/{metric}": _operation(
            version, "readForNamespace", "read a custom metric describing a namespace"
        ),
    }
