"""custom.metrics.k8s.io objects (v1beta2 and v1beta1) as JSON-ready dicts, in the shapes of
``k8s.io/metrics/pkg/apis/custom_metrics``."""

from __future__ import annotations

from typing import Any

from kcms.apis.metrics.convert import TimeFormatter
from kcms.apis.objects import ResourceInfo
from kcms.apis.provider import MetricValue
from kcms.quantity import format_decimal
from kcms.selectors import LabelSelector

GROUP = "custom.metrics.k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # preferred first

_EXPRESSION_OPS = {"!=": "NotIn", "in": "In", "notin": "NotIn", "exists": "Exists", "!": "DoesNotExist"}


SIGNIFICANT_DIGITS = 6


def rounded(value: float) -> float:
    """``value`` as served: a whole number exactly, anything else to :data:`SIGNIFICANT_DIGITS`
    significant digits. Rates and averages carry float and timestamp noise (26.3 req/s computed as
    26.299999997) that would otherwise be served as ``"26299999997n"``; six digits keep a relative
    precision of 5e-6, finer than any autoscaler's tolerance (the HPA's is 10%), and, unlike a fixed
    milli or nano step, small values keep their digits (0.000123456789 -> ``"123457n"``)."""
    if value.is_integer():
        return value
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def quantity(value: float) -> str:
    """A metric value as a canonical quantity of its :func:`rounded` value (below a nano, apimachinery's
    rounding up to ``"1n"`` applies)."""
    return format_decimal(rounded(value))


def window_seconds(window: float | None) -> int | None:
    """The window as whole seconds, or None for a plain reading."""
    return None if window is None else int(round(window))


def selector_object(selector: LabelSelector) -> dict[str, Any] | None:
    """A parsed selector as a ``meta/v1`` ``LabelSelector`` (None when it is empty).

    ``=`` and ``==`` become ``matchLabels``; ``!=``, ``in``, ``notin``, existence and ``!key``
    become ``matchExpressions``; ``>`` and ``<`` (which LabelSelector cannot express) become
    ``Gt`` / ``Lt`` expressions, as apimachinery's internal selector names them.
    """
    if selector.empty:
        return None
    labels: dict[str, str] = {}
    expressions: list[dict[str, Any]] = []
    for r in selector.requirements:
        if r.operator in ("=", "==") and r.key not in labels:
            labels[r.key] = r.values[0]
            continue
        op = _EXPRESSION_OPS.get(r.operator)
        if r.operator in ("=", "=="):
            op = "In"
        if op is None:
            op = "Gt" if r.operator == ">" else "Lt"
        expr: dict[str, Any] = {"key": r.key, "operator": op}
        if op not in ("Exists", "DoesNotExist"):
            expr["values"] = list(r.values)
        expressions.append(expr)
    out: dict[str, Any] = {}
    if labels:
        out["matchLabels"] = labels
    if expressions:
        out["matchExpressions"] = expressions
    return out


def described_object(info: ResourceInfo, namespace: str, name: str) -> dict[str, str]:
    """A ``core/v1`` ``ObjectReference`` (empty fields omitted, in its field order)."""
    ref: dict[str, str] = {"kind": info.kind}
    if namespace:
        ref["namespace"] = namespace
    ref["name"] = name
    ref["apiVersion"] = info.api_version
    return ref


def item_v1beta2(
    v: MetricValue, ref: dict[str, str], metric: str, selector: dict | None, fmt: TimeFormatter
) -> dict[str, Any]:
    """One v1beta2 ``MetricValue``."""
    ident: dict[str, Any] = {"name": metric}
    if selector is not None:
        ident["selector"] = selector
    item: dict[str, Any] = {"describedObject": ref, "metric": ident, "timestamp": fmt(v.timestamp)}
    window = window_seconds(v.window)
    if window is not None:
        item["windowSeconds"] = window
    item["value"] = quantity(v.value)
    return item


def item_v1beta1(
    v: MetricValue, ref: dict[str, str], metric: str, selector: dict | None, fmt: TimeFormatter
) -> dict[str, Any]:
    """One v1beta1 ``MetricValue`` (``window`` instead of ``windowSeconds``; ``selector`` is
    always present, null when none)."""
    item: dict[str, Any] = {"describedObject": ref, "metricName": metric, "timestamp": fmt(v.timestamp)}
    window = window_seconds(v.window)
    if window is not None:
        item["window"] = window
    item["value"] = quantity(v.value)
    item["selector"] = selector
    return item


ITEM = {"v1beta2": item_v1beta2, "v1beta1": item_v1beta1}


def value_list(version: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``MetricValueList``."""
    return {"kind": "MetricValueList", "apiVersion": f"{GROUP}/{version}", "metadata": {}, "items": items}


def resource_entry(resource: str, metric: str, namespaced: bool) -> dict[str, Any]:
    """One discovery ``APIResource``: ``<resource>/<metric>``."""
    return {
        "name": f"{resource}/{metric}",
        "singularName": "",
        "namespaced": namespaced,
        "kind": "MetricValueList",
        "verbs": ["get"],
    }


# Served when no metric is present: clients built on client-go's discovery treat an empty resource
# list as an error ("Got empty response for: custom.metrics.k8s.io/v1beta2").
PLACEHOLDER = {
    "name": "custommetrics",
    "singularName": "",
    "namespaced": True,
    "kind": "MetricValueList",
    "verbs": ["get"],
}
