"""`kubectl kcms get METRIC`: the values of one custom or external metric.

    --pods [NAME]            GET /apis/custom.metrics.k8s.io/<v>/namespaces/<ns>/pods/<NAME|*>/<METRIC>
    --object RESOURCE/NAME   .../namespaces/<ns>/<resource>/<NAME>/<METRIC>, or /<resource>/<NAME>/<METRIC>
                             for a cluster-scoped resource (as discovery says), or
                             .../namespaces/<NAME>/metrics/<METRIC> for namespaces/NAME
    --external               GET /apis/external.metrics.k8s.io/v1beta1/namespaces/<ns>/<METRIC>

``-l`` selects objects (custom) or the metric's labels (external); ``--metric-selector`` the metric's
labels of a custom metric (v1beta2's metricLabelSelector). RESOURCE may be written as discovery lists it
(deployments.apps), or by its plural or singular name (deployments, deployment). With KCMS's history
API, a sparkline of the value's last minutes (MetricSeriesHistory; an object's series with several
label sets are summed) ends each row; derived metrics (``<m>_per_second``, ``<m>_agg_<fn>_<w>``) are
not kept as series, so they have no such column.
"""

from __future__ import annotations

import sys
from typing import Any

from kcms.kubectl import output
from kcms.kubectl.client import API, PluginError, one_line
from kcms.kubectl.metrics import CUSTOM, EXTERNAL, EXTERNAL_VERSION, custom_version, resources
from kcms.kubectl.sparkline import Axis, parse_time, resolution
from kcms.kubectl.top import HISTORY, HISTORY_GROUP, HISTORY_VERSION, check_label_selector

CLUSTER_SCOPED = {"nodes", "namespaces", "persistentvolumes"}
SINCE = "5m"
SINCE_SECONDS = 300.0


def _resolve(given: str, entries: list[dict], metric: str) -> tuple[str, bool]:
    """(resource as the adapter lists it, namespaced) for RESOURCE as the user wrote it."""
    given = given.lower()
    for e in entries:
        resource, _, m = e["name"].partition("/")
        plural = resource.split(".")[0]
        if m == metric and given in (resource, plural, plural.removesuffix("s"), plural.removesuffix("es")):
            return resource, bool(e.get("namespaced"))
    plural = given.split(".")[0]
    return given, plural not in CLUSTER_SCOPED and plural + "s" not in CLUSTER_SCOPED


async def get_metric(api: API, args: Any) -> int:
    check_label_selector(args.selector)
    check_label_selector(args.metric_selector, "--metric-selector")
    if "/" in args.metric or not args.metric.strip():
        raise PluginError(f"invalid metric name {one_line(args.metric, 100)}")
    namespace = args.namespace or api.namespace or "default"
    if args.external:
        if not await api.serves(EXTERNAL, EXTERNAL_VERSION):
            raise PluginError(
                f"the cluster serves no {EXTERNAL}/{EXTERNAL_VERSION} (no external metrics adapter)"
            )
        path = f"/apis/{EXTERNAL}/{EXTERNAL_VERSION}/namespaces/{namespace}/{args.metric}"
        params = {"labelSelector": args.selector}
        series_path = f"{HISTORY}/namespaces/{namespace}/series"
        series_params = {"metric": args.metric, "resource": "external", "labelSelector": args.selector}
    else:
        version = await custom_version(api)
        if version is None:
            raise PluginError(f"the cluster serves no {CUSTOM} (no custom metrics adapter)")
        if args.pods is not None:
            resource, namespaced, name = "pods", True, args.pods
        else:
            resource, _, name = args.object.partition("/")
            if not resource or not name:
                raise PluginError(f"--object {one_line(args.object, 100)}: expected RESOURCE/NAME")
            listing = f"/apis/{CUSTOM}/{version}"
            resource, namespaced = _resolve(resource, resources(await api.get(listing), listing), args.metric)
        base = f"/apis/{CUSTOM}/{version}"
        if resource == "namespaces":
            path = f"{base}/namespaces/{name}/metrics/{args.metric}"
            namespace, namespaced = name, False
        elif namespaced:
            path = f"{base}/namespaces/{namespace}/{resource}/{name}/{args.metric}"
        else:
            path = f"{base}/{resource}/{name}/{args.metric}"
        params = {"labelSelector": args.selector, "metricLabelSelector": args.metric_selector}
        series_path = f"{HISTORY}/namespaces/{namespace}/series" if namespaced else f"{HISTORY}/series"
        series_params = {"metric": args.metric, "resource": resource, "labelSelector": args.metric_selector}
    body = await api.get(path, params)
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise PluginError(f"the answer to GET {path} is not a metric value list")
    items = output.typed(body, items)
    history: list[dict] | None = None
    warnings: list[str] = []
    if await api.serves(HISTORY_GROUP, HISTORY_VERSION):
        try:
            # a history API without series (404) simply has no history of this metric
            hbody = await api.get_optional(series_path, {**series_params, "since": SINCE})
            if isinstance(hbody, dict) and isinstance(hbody.get("items"), list):
                history = output.typed(hbody, [h for h in hbody["items"] if isinstance(h, dict)])
        except PluginError as e:
            warnings.append(f"warning: no history: {e}")
    for w in warnings:
        print(w, file=sys.stderr)
    if args.output:
        output.dump(output.as_list(items + (history or [])), args.output)
        return 0
    if not items:
        from kcms.kubectl.metrics import discover

        rows, _ = await discover(api, not args.external, args.external)
        listed = any(r["metric"] == args.metric for r in rows)
        hint = "" if listed else f" ({args.metric} is not in discovery: see `kubectl kcms metrics`)"
        print(f"No values of {args.metric} found in {namespace} namespace.{hint}", file=sys.stderr)
        return 0
    rows = [_row(i, args.external) for i in items]
    header = (
        ["METRIC", "LABELS", "VALUE", "WINDOW", "TIMESTAMP"]
        if args.external
        else ["OBJECT", "VALUE", "WINDOW", "TIMESTAMP"]
    )
    table = []
    series: dict[tuple, dict[float, float]] = {}
    for h in history or []:  # an object with several series (metric labels): their sum per time
        total = series.setdefault(_series_key(h, args.external), {})
        for t, v in _series_points(h):
            total[t] = total.get(t, 0.0) + v
    keys = [_item_key(i, args.external) for i in items]
    found = [sorted(series[k].items()) for k in keys if series.get(k)]
    if found:  # derived metrics (<m>_per_second, <m>_agg_...) are not kept: no column for them
        header.append(f"HISTORY({SINCE})")
        axis = Axis(max(t for s in found for t, _ in s), SINCE_SECONDS, resolution(found))
        for key, row in zip(keys, rows, strict=True):
            points = sorted(series.get(key, {}).items())
            row.append(axis.render(points) if points else "-")
    if not args.no_headers:
        table.append(header)
    sys.stdout.write(output.table(table + rows))
    return 0


def _text(value: Any, limit: int = 120) -> str:
    return one_line(value, limit) if isinstance(value, str | int | float) else "-"


def _row(item: dict, external: bool) -> list[str]:
    window = item.get("windowSeconds", item.get("window"))
    window_text = f"{window}s" if isinstance(window, int) else "-"
    if external:
        labels = item.get("metricLabels") if isinstance(item.get("metricLabels"), dict) else {}
        shown = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"
        return [_text(item.get("metricName")), one_line(shown, 200), _text(item.get("value")), window_text,
                _text(item.get("timestamp"))]  # fmt: skip
    obj = item.get("describedObject") if isinstance(item.get("describedObject"), dict) else {}
    kind = obj.get("kind") if isinstance(obj.get("kind"), str) else "?"
    name = obj.get("name") if isinstance(obj.get("name"), str) else "?"
    return [
        one_line(f"{kind.lower()}/{name}", 200),
        _text(item.get("value")),
        window_text,
        _text(item.get("timestamp")),
    ]


def _labels_key(labels: Any) -> tuple:
    return tuple(sorted((str(k), str(v)) for k, v in labels.items())) if isinstance(labels, dict) else ()


def _item_key(item: dict, external: bool) -> tuple:
    if external:
        return ("", _labels_key(item.get("metricLabels")))
    obj = item.get("describedObject") if isinstance(item.get("describedObject"), dict) else {}
    return (obj.get("namespace", ""), obj.get("name", ""))


def _series_key(h: dict, external: bool) -> tuple:
    if external:
        metric = h.get("metric") if isinstance(h.get("metric"), dict) else {}
        sel = metric.get("selector") if isinstance(metric.get("selector"), dict) else {}
        return ("", _labels_key(sel.get("matchLabels")))
    obj = h.get("describedObject") if isinstance(h.get("describedObject"), dict) else {}
    return (obj.get("namespace", ""), obj.get("name", ""))


def _series_points(h: dict) -> list[tuple[float, float]]:
    out = []
    points = h.get("points")
    for p in points[:10_000] if isinstance(points, list) else []:
        if not isinstance(p, dict):
            continue
        t = parse_time(p.get("timestamp"))
        try:
            v = output.quantity(p.get("value"), "history")
        except PluginError:
            continue
        if t is not None:
            out.append((t, float(v)))
    return out
