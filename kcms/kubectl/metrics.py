"""`kubectl kcms metrics`: the custom and external metrics the cluster serves, from API discovery.

GET /apis (which versions are served), then the preferred version's APIResourceList of
custom.metrics.k8s.io (v1beta2 before v1beta1) and external.metrics.k8s.io/v1beta1. A custom metric is
listed as ``<resource>/<metric>`` ("pods/http_requests_per_second", "deployments.apps/queue_backlog"),
an external one by its name. Table: TYPE (custom|external), RESOURCE, METRIC, NAMESPACED.
"""

from __future__ import annotations

import sys
from typing import Any

from kcms.kubectl import output
from kcms.kubectl.client import API, PluginError

CUSTOM, EXTERNAL = "custom.metrics.k8s.io", "external.metrics.k8s.io"
CUSTOM_VERSIONS = ("v1beta2", "v1beta1")
EXTERNAL_VERSION = "v1beta1"


async def custom_version(api: API) -> str | None:
    served = (await api.groups()).get(CUSTOM, [])
    return next((v for v in CUSTOM_VERSIONS if v in served), None)


def resources(body: Any, path: str) -> list[dict]:
    items = body.get("resources") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise PluginError(f"the answer to GET {path} is not an APIResourceList")
    return [r for r in items if isinstance(r, dict) and isinstance(r.get("name"), str)]


async def discover(api: API, custom: bool = True, external: bool = True) -> tuple[list[dict], list[str]]:
    """(rows {type, resource, metric, namespaced}, the APIResourceList paths read)."""
    rows: list[dict] = []
    lists: list[Any] = []
    version = await custom_version(api) if custom else None
    if custom and version is not None:
        path = f"/apis/{CUSTOM}/{version}"
        body = await api.get(path)
        lists.append(body)
        for r in resources(body, path):
            resource, _, metric = r["name"].partition("/")
            rows.append(
                {
                    "type": "custom",
                    "resource": resource,
                    "metric": metric,
                    "namespaced": bool(r.get("namespaced")),
                }
            )
    if external and await api.serves(EXTERNAL, EXTERNAL_VERSION):
        path = f"/apis/{EXTERNAL}/{EXTERNAL_VERSION}"
        body = await api.get(path)
        lists.append(body)
        for r in resources(body, path):
            rows.append({"type": "external", "resource": "", "metric": r["name"], "namespaced": True})
    return rows, lists


async def list_metrics(api: API, args: Any) -> int:
    want_custom, want_external = not args.external, not args.custom
    groups = await api.groups()
    if (not want_custom or CUSTOM not in groups) and (not want_external or EXTERNAL not in groups):
        wanted = [g for g, w in ((CUSTOM, want_custom), (EXTERNAL, want_external)) if w]
        raise PluginError(
            f"the cluster serves no {' or '.join(wanted)} (no custom or external metrics adapter)"
        )
    rows, lists = await discover(api, want_custom, want_external)
    if args.output:
        output.dump(output.as_list(lists), args.output)
        return 0
    if not rows:
        print("No metrics found", file=sys.stderr)
        return 0
    rows.sort(key=lambda r: (r["type"], r["resource"], r["metric"]))
    table = [["TYPE", "RESOURCE", "METRIC", "NAMESPACED"]]
    table += [[r["type"], r["resource"] or "-", r["metric"], str(r["namespaced"]).lower()] for r in rows]
    sys.stdout.write(output.table(table))
    return 0
