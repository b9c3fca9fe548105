"""OpenAPI (Swagger 2.0) definitions of the history.kcms.io/v1alpha1 kinds."""

from __future__ import annotations

from kcms.apis.custom.openapi import LABEL_SELECTOR, OBJECT_REFERENCE
from kcms.apiserver.openapi import META_DEFINITIONS, get_operation, list_definition, query_parameter

_PKG = "io.kcms.history.v1alpha1"
_META = "io.k8s.apimachinery.pkg.apis.meta.v1"
_QUANTITY = {"$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"}
_TIME = {"$ref": f"#/definitions/{_META}.Time"}
_USAGE = {"description": "CPU (a rate over `window`) and memory working set.", "type": "object",
          "additionalProperties": _QUANTITY}  # fmt: skip
_POINTS = {"type": "array", "items": {"$ref": f"#/definitions/{_PKG}.UsagePoint"}}


def _gvk(kind: str) -> list[dict]:
    return [{"group": "history.kcms.io", "version": "v1alpha1", "kind": kind}]


def _list(kind: str, item: str) -> dict:
    return list_definition(_PKG, item, _gvk(kind))


_COMMON = {
    "apiVersion": {"type": "string"},
    "kind": {"type": "string"},
    "metadata": {"$ref": f"#/definitions/{_META}.ObjectMeta"},
    "window": {"$ref": f"#/definitions/{_META}.Duration"},
}

DEFINITIONS: dict[str, dict] = {
    **META_DEFINITIONS,
    "io.k8s.api.core.v1.ObjectReference": OBJECT_REFERENCE,
    f"{_META}.LabelSelector": LABEL_SELECTOR,
    f"{_PKG}.UsagePoint": {
        "description": "One reading: its time and the usage then.",
        "type": "object",
        "required": ["timestamp", "usage"],
        "properties": {"timestamp": _TIME, "usage": _USAGE},
    },
    f"{_PKG}.NodeMetricsHistory": {
        "description": "A node's usage over the kept history, oldest point first.",
        "type": "object",
        "required": ["window", "points"],
        "properties": {**_COMMON, "points": _POINTS},
        "x-kubernetes-group-version-kind": _gvk("NodeMetricsHistory"),
    },
    f"{_PKG}.NodeMetricsHistoryList": _list("NodeMetricsHistoryList", "NodeMetricsHistory"),
    f"{_PKG}.ContainerMetricsHistory": {
        "description": "One container's usage points (aligned with the other containers of its pod).",
        "type": "object",
        "required": ["name", "points"],
        "properties": {"name": {"type": "string"}, "points": _POINTS},
    },
    f"{_PKG}.PodMetricsHistory": {
        "description": "The usage of a pod's containers over the kept history.",
        "type": "object",
        "required": ["window", "containers"],
        "properties": {
            **_COMMON,
            "containers": {
                "type": "array",
                "items": {"$ref": f"#/definitions/{_PKG}.ContainerMetricsHistory"},
            },
        },
        "x-kubernetes-group-version-kind": _gvk("PodMetricsHistory"),
    },
    f"{_PKG}.PodMetricsHistoryList": _list("PodMetricsHistoryList", "PodMetricsHistory"),
    f"{_PKG}.MetricSeriesHistory": {
        "description": "The points of one custom or external metric series over the kept history.",
        "type": "object",
        "required": ["describedObject", "metric", "points"],
        "properties": {
            "describedObject": {"$ref": "#/definitions/io.k8s.api.core.v1.ObjectReference"},
            "metric": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "selector": {"$ref": f"#/definitions/{_META}.LabelSelector"},
                },
            },
            "points": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["timestamp", "value"],
                    "properties": {"timestamp": _TIME, "value": _QUANTITY},
                },
            },
        },
        "x-kubernetes-group-version-kind": _gvk("MetricSeriesHistory"),
    },
    f"{_PKG}.MetricSeriesHistoryList": _list("MetricSeriesHistoryList", "MetricSeriesHistory"),
    f"{_PKG}.ScrapeStatus": {
        "description": "The collector's view of one node: last successful scrape, last failure, staleness.",
        "type": "object",
        "required": ["metadata", "consecutiveFailures", "stale"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"$ref": f"#/definitions/{_META}.ObjectMeta"},
            "lastSuccess": {**_TIME, "x-nullable": True},
            "lastError": {
                "type": "string",
                "x-nullable": True,
                "description": "Reason of the newest failure; null once a scrape succeeds.",
            },
            "consecutiveFailures": {"type": "integer", "format": "int64"},
            "stale": {"type": "boolean", "description": "No successful scrape for over a resolution."},
        },  # fmt: skip
        "x-kubernetes-group-version-kind": _gvk("ScrapeStatus"),
    },
    f"{_PKG}.ScrapeStatusList": _list("ScrapeStatusList", "ScrapeStatus"),
}

_SELECTORS = [
    query_parameter("labelSelector", "A selector on the objects' labels."),
    query_parameter("fieldSelector", "metadata.name and metadata.namespace, with =, == or !=."),
]
_SINCE = query_parameter(
    "since", "Only points this recent (a duration, e.g. 5m; default and most: --history)."
)
_SERIES = [
    query_parameter("metric", "The metric name (required)."),
    query_parameter("resource", "The described objects' resource (e.g. pods; default: all)."),
]


def _get(kind: str, action: str, summary: str, params: list[dict]) -> dict:
    return get_operation(
        group="history.kcms.io",
        version="v1alpha1",
        kind=kind.removesuffix("List"),
        schema=f"{_PKG}.{kind}",
        action=action,
        operation_id=f"{action}HistoryV1alpha1{kind}",
        description=summary,
        tag="history_v1alpha1",
        parameters=params,
    )


PATHS: dict[str, dict] = {
    "/nodes": _get("NodeMetricsHistoryList", "list", "list NodeMetricsHistory", [*_SELECTORS, _SINCE]),
    "/nodes/{name}": _get("NodeMetricsHistory", "get", "read a node's NodeMetricsHistory", [_SINCE]),
    "/pods": _get("PodMetricsHistoryList", "list", "list PodMetricsHistory of all namespaces", [*_SELECTORS, _SINCE]),
    "/namespaces/{namespace}/pods": _get(
        "PodMetricsHistoryList", "list", "list PodMetricsHistory of a namespace", [*_SELECTORS, _SINCE]
    ),
    "/namespaces/{namespace}/pods/{name}": _get("PodMetricsHistory", "get", "read a pod's PodMetricsHistory", [_SINCE]),
    "/series": _get(
        "MetricSeriesHistoryList", "list", "list the series of a metric about cluster-scoped objects or external",
        [*_SERIES, *_SELECTORS, _SINCE],
    ),
    "/namespaces/{namespace}/series": _get(
        "MetricSeriesHistoryList", "list", "list the series of a metric about a namespace's objects",
        [*_SERIES, *_SELECTORS, _SINCE],
    ),
    "/scrapes": _get("ScrapeStatusList", "list", "list the collector's per-node scrape status", _SELECTORS),
    "/scrapes/{name}": _get("ScrapeStatus", "get", "read a node's scrape status", []),
}  # fmt: skip
