"""API groups and versions served by the kit, and their discovery documents
(``/apis`` APIGroupList, ``/apis/<group>`` APIGroup, ``/apis/<group>/<version>`` APIResourceList,
and the aggregated ``apidiscovery.k8s.io/v2`` APIGroupDiscoveryList on ``/apis``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kcms.model import RequestAttributes

from .responses import StatusError, not_acceptable, parse_accept

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Route = tuple[str, str, Handler]  # (HTTP method, path suffix after /apis/<g>/<v>, handler)
Resources = list[dict[str, Any]] | Callable[[], list[dict[str, Any]]]


@dataclass(slots=True)
class APIGroupVersion:
    """One version of an API group: its resources (APIResource dicts, or a callable evaluated per
    request), its routes, and its OpenAPI fragments.

    ``routes`` suffixes use aiohttp syntax, e.g. ``("GET", "/nodes/{name}", handler)``.
    ``openapi_paths`` keys may be full paths or suffixes (prefixed with ``/apis/<g>/<v>``).
    """

    group: str
    version: str
    resources: Resources
    routes: list[Route] = field(default_factory=list)
    openapi_definitions: dict[str, Any] = field(default_factory=dict)
    openapi_paths: dict[str, Any] = field(default_factory=dict)
    preferred: bool = False

    @property
    def group_version(self) -> str:
        """``<group>/<version>``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        """``/apis/<group>/<version>``."""
        return f"/apis/{self.group}/{self.version}"

    def resource_list(self) -> list[dict[str, Any]]:
        """The resources now."""
        res = self.resources() if callable(self.resources) else self.resources
        return list(res)


class Discovery:
    """The registry of installed group versions and the documents built from it."""

    def __init__(self) -> None:
        self.groups: dict[str, list[APIGroupVersion]] = {}

    def add(self, gv: APIGroupVersion) -> None:
        """Register a group version; a second registration of the same one replaces it."""
        versions = self.groups.setdefault(gv.group, [])
        versions[:] = [v for v in versions if v.version != gv.version]
        versions.append(gv)

    def find(self, group: str, version: str) -> APIGroupVersion | None:
        """The installed group version, or None."""
        for v in self.groups.get(group, []):
            if v.version == version:
                return v
        return None

    def check_watchable(self, attrs: RequestAttributes) -> None:
        """405 for ``watch=true`` on a resource that does not list ``watch`` among its verbs, as the
        generic apiserver answers for storage without a watcher (metrics-server's resources)."""
        gv = self.find(attrs.api_group, attrs.api_version)
        if gv is None:
            return  # not ours: the router answers 404
        for res in gv.resource_list():
            if res.get("name") == attrs.resource:
                if "watch" in res.get("verbs", ()):
                    return
                break
        qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
        raise StatusError(
            405,
            "MethodNotAllowed",
            f'watch is not supported on resources of kind "{qualified}"',
            {"group": attrs.api_group, "kind": attrs.resource},
        )

    def all(self) -> list[APIGroupVersion]:
        """Every installed group version."""
        return [v for versions in self.groups.values() for v in versions]

    @staticmethod
    def _preferred(versions: list[APIGroupVersion]) -> APIGroupVersion:
        for v in versions:
            if v.preferred:
                return v
        return versions[0]

    def _group(self, group: str) -> dict[str, Any]:
        versions = self.groups[group]
        pref = self._preferred(versions)
        ordered = [pref] + [v for v in versions if v is not pref]
        return {
            "name": group,
            "versions": [{"groupVersion": v.group_version, "version": v.version} for v in ordered],
            "preferredVersion": {"groupVersion": pref.group_version, "version": pref.version},
        }

    def group_list(self) -> dict[str, Any]:
        """``/apis``: APIGroupList."""
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self._group(g) for g in self.groups],
        }

    def group(self, group: str) -> dict[str, Any] | None:
        """``/apis/<group>``: APIGroup, or None if not installed."""
        if group not in self.groups:
            return None
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group(group)}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        """``/apis/<group>/<version>``: APIResourceList, or None if not installed."""
        gv = self.find(group, version)
        if gv is None:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv.group_version,
            "resources": gv.resource_list(),
        }

    def aggregated(self, api_version: str = "apidiscovery.k8s.io/v2") -> dict[str, Any]:
        """``/apis`` as an aggregated ``APIGroupDiscoveryList`` (what newer aggregators ask for)."""
        items = []
        for group, versions in self.groups.items():
            pref = self._preferred(versions)
            ordered = [pref] + [v for v in versions if v is not pref]
            items.append(
                {
                    "metadata": {"name": group, "creationTimestamp": None},
                    "versions": [
                        {"version": v.version, "resources": _aggregated_resources(v), "freshness": "Current"}
                        for v in ordered
                    ],
                }
            )
        return {"kind": "APIGroupDiscoveryList", "apiVersion": api_version, "metadata": {}, "items": items}


def _aggregated_resources(gv: APIGroupVersion) -> list[dict[str, Any]]:
    """APIResource dicts in the aggregated (v2) form: subresources nested under their parent."""
    parents: dict[str, dict[str, Any]] = {}
    subs: list[tuple[str, str, dict[str, Any]]] = []
    for r in gv.resource_list():
        name = r["name"]
        if "/" in name:
            parent, _, sub = name.partition("/")
            subs.append((parent, sub, r))
            continue
        entry: dict[str, Any] = {
            "resource": name,
            "responseKind": {
                "group": r.get("group", ""),
                "version": r.get("version", ""),
                "kind": r.get("kind", ""),
            },
            "scope": "Namespaced" if r.get("namespaced") else "Cluster",
            "singularResource": r.get("singularName", ""),
            "verbs": list(r.get("verbs", [])),
        }
        for key in ("shortNames", "categories"):
            if r.get(key):
                entry[key] = list(r[key])
        parents[name] = entry
    for parent, sub, r in subs:
        if parent in parents:
            parents[parent].setdefault("subresources", []).append(
                {
                    "subresource": sub,
                    "responseKind": {
                        "group": r.get("group", ""),
                        "version": r.get("version", ""),
                        "kind": r.get("kind", ""),
                    },
                    "verbs": list(r.get("verbs", [])),
                }
            )
    return list(parents.values())


def negotiate_discovery(accept: str | None, aggregated_ok: bool) -> str:
    """``"aggregated"`` or ``"legacy"`` for a discovery request; raise 406 if neither is acceptable."""
    if not accept or not accept.strip():
        return "legacy"
    for mr in parse_accept(accept):
        if (mr.type, mr.subtype) not in (("application", "json"), ("application", "*"), ("*", "*")):
            continue
        if "as" not in mr.params and not ({"g", "v"} & mr.params.keys()):
            return "legacy"
        if (
            aggregated_ok
            and mr.params.get("as") == "APIGroupDiscoveryList"
            and mr.params.get("g") == "apidiscovery.k8s.io"
            and mr.params.get("v") == "v2"
        ):
            return "aggregated"
    raise not_acceptable()
