"""From an HTTP request to the :class:`~kcms.model.RequestAttributes` an authorizer decides on.

Follows the rules of Kubernetes' ``RequestInfoFactory``:

- ``/apis/<group>/<version>/...`` and ``/api/<version>/...`` with at least one segment after the
  version are resource requests; anything else (``/apis``, ``/apis/<group>``, ``/apis/<g>/<v>``,
  ``/openapi/...``, ``/metrics``, ``/healthz``) is a non-resource request whose verb is the HTTP
  method in lower case.
- ``namespaces/<ns>/<rest...>`` sets the namespace and continues with ``<rest>``; a bare
  ``namespaces/<ns>`` (or ``namespaces/<ns>/status|finalize``) is the resource ``namespaces``
  named ``<ns>``.
- The rest is ``resource[/name[/subresource]]``.
- GET/HEAD with a name is ``get``, without one ``list``, or ``watch`` with ``?watch=true`` (or a
  legacy ``/watch/`` segment); a ``fieldSelector`` of ``metadata.name=<n>`` names the object.
"""

from __future__ import annotations

from collections.abc import Mapping

from kcms.model import RequestAttributes

API_PREFIXES = ("apis", "api")
_GROUPLESS = ("api",)
_NAMESPACE_SUBRESOURCES = ("status", "finalize")
_SPECIAL_VERBS = ("proxy", "watch")
_METHOD_VERBS = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}


def _name_from_field_selector(selector: str) -> str:
    """The name a ``metadata.name=<n>`` / ``==`` field selector requires, or ""."""
    for term in selector.split(","):
        term = term.strip()
        for op in ("==", "="):
            key, sep, value = term.partition(op)
            if sep and "!" not in key:
                if key.strip() == "metadata.name":
                    value = value.strip()
                    if value and "/" not in value and "%" not in value and value not in (".", ".."):
                        return value
                break
    return ""


def request_attributes(method: str, path: str, query: Mapping[str, str]) -> RequestAttributes:
    """Compute the attributes of a request (``path`` without the query string)."""
    method = method.upper()
    non_resource = RequestAttributes(verb=method.lower(), path=path, resource_request=False)
    parts = [p for p in path.strip("/").split("/")] if path.strip("/") else []
    if len(parts) < 2 or parts[0] not in API_PREFIXES:
        return non_resource
    prefix = parts[0]
    rest = parts[1:]
    group = ""
    if prefix not in _GROUPLESS:
        if len(rest) < 2:  # /apis/<group> is discovery
            return non_resource
        group, rest = rest[0], rest[1:]
    version, rest = rest[0], rest[1:]
    if not rest:  # /apis/<group>/<version>, /api/v1 are discovery
        return non_resource

    verb = _METHOD_VERBS.get(method, "")
    if rest[0] in _SPECIAL_VERBS:
        if len(rest) < 2:
            return non_resource  # kube: "unable to determine kind and namespace"
        verb, rest = rest[0], rest[1:]

    namespace = ""
    if rest[0] == "namespaces":
        if len(rest) > 1:
            namespace = rest[1]
            if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
                rest = rest[2:]

    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) >= 2 else ""
    subresource = rest[2] if len(rest) >= 3 and verb not in _SPECIAL_VERBS else ""

    if not name and verb == "get":
        watch = query.get("watch")
        verb = "watch" if watch is not None and watch.lower() not in ("false", "0") else "list"
        selector = query.get("fieldSelector", "")
        if selector:
            name = _name_from_field_selector(selector)
    if not name and verb == "delete":
        verb = "deletecollection"

    return RequestAttributes(
        verb=verb,
        path=path,
        resource_request=True,
        api_group=group,
        api_version=version,
        resource=resource,
        subresource=subresource,
        namespace=namespace,
        name=name,
    )
