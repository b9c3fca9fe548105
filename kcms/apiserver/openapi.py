"""OpenAPI documents: ``/openapi/v2`` (Swagger 2.0 of every installed group version), the
``/openapi/v3`` index and ``/openapi/v3/apis/<group>/<version>`` (OpenAPI 3.0), with ETags.

Definitions come from each :class:`~kcms.apiserver.discovery.APIGroupVersion` (v2 style, ``$ref``
to ``#/definitions/<name>``); v3 documents are derived from them.
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any

import orjson

from .discovery import APIGroupVersion

_PARAM = re.compile(r"\{([^}:]+)(?::[^}]*)?\}")
_SECURITY_V2 = {"BearerToken": {"type": "apiKey", "name": "authorization", "in": "header"}}
_VERB_ACTIONS = {"GET": "get", "POST": "post", "PUT": "put", "PATCH": "patch", "DELETE": "delete"}


def etag_of(body: bytes) -> str:
    """The strong ETag kube-openapi uses: quoted upper-case hex SHA-512 of the body."""
    return '"' + hashlib.sha512(body).hexdigest().upper() + '"'


def _full_path(gv: APIGroupVersion, path: str) -> str:
    return path if path.startswith("/apis/") or path.startswith("/api/") else gv.prefix + path


def _route_operation(gv: APIGroupVersion, method: str, path: str) -> dict[str, Any]:
    op_id = (
        method.lower()
        + re.sub(r"[^A-Za-z0-9]", "", (gv.group + gv.version).title())
        + re.sub(r"[^A-Za-z0-9]", "", _PARAM.sub(lambda m: m.group(1).title(), path).title())
    )
    return {
        "description": f"{method} {path}",
        "consumes": ["*/*"],
        "produces": ["application/json", "application/json;as=Table;v=v1;g=meta.k8s.io"],
        "schemes": ["https"],
        "tags": [re.sub(r"[^A-Za-z0-9]", "", gv.group.split(".")[0]) + "_" + gv.version],
        "operationId": op_id,
        "responses": {"200": {"description": "OK"}, "401": {"description": "Unauthorized"}},
        "x-kubernetes-action": _action(method, path),
    }


def _action(method: str, path: str) -> str:
    """kube's x-kubernetes-action: get for a named object, list for a collection."""
    if method != "GET":
        return _VERB_ACTIONS.get(method, method.lower())
    return "get" if path.rstrip("/").endswith("}") else "list"


def _path_params(path: str) -> list[dict[str, Any]]:
    return [
        {
            "uniqueItems": True,
            "type": "string",
            "description": f"{name} of the object",
            "name": name,
            "in": "path",
            "required": True,
        }
        for name in _PARAM.findall(path)
    ]


def v2_paths(gv: APIGroupVersion) -> dict[str, Any]:
    """The Swagger 2.0 paths of one group version: its ``openapi_paths`` plus minimal operations
    for routes not described there."""
    paths: dict[str, Any] = {}
    for key, item in gv.openapi_paths.items():
        paths[_full_path(gv, key)] = copy.deepcopy(item)
    for method, suffix, _handler in gv.routes:
        full = _full_path(gv, _PARAM.sub(lambda m: "{" + m.group(1) + "}", suffix))
        item = paths.setdefault(full, {})
        action = _VERB_ACTIONS.get(method.upper())
        if action and action not in item:
            item[action] = _route_operation(gv, method.upper(), full)
        params = _path_params(full)
        if params and "parameters" not in item:
            item["parameters"] = params
    return paths


def v2_document(gvs: list[APIGroupVersion]) -> dict[str, Any]:
    """The Swagger 2.0 document of the given group versions."""
    paths: dict[str, Any] = {}
    definitions: dict[str, Any] = {}
    for gv in gvs:
        paths.update(v2_paths(gv))
        definitions.update(copy.deepcopy(gv.openapi_definitions))
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v0.1.0"},
        "paths": dict(sorted(paths.items())),
        "definitions": dict(sorted(definitions.items())),
        "securityDefinitions": _SECURITY_V2,
        "security": [{"BearerToken": []}],
    }


def _to_v3_refs(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str) and v.startswith("#/definitions/"):
                out[k] = "#/components/schemas/" + v[len("#/definitions/") :]
            else:
                out[k] = _to_v3_refs(v)
        return out
    if isinstance(node, list):
        return [_to_v3_refs(v) for v in node]
    return node


def _v3_parameter(p: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in p.items() if k in ("name", "in", "description", "required")}
    schema = {k: v for k, v in p.items() if k in ("type", "format", "items", "enum", "default")}
    if p.get("in") == "body":  # not expected for read-only APIs; keep as a schema
        schema = p.get("schema", {})
    out["schema"] = schema or {"type": "string"}
    return out


def _v3_operation(op: dict[str, Any]) -> dict[str, Any]:
    produces = op.get("produces", ["application/json"])
    out: dict[str, Any] = {
        k: v for k, v in op.items() if k not in ("consumes", "produces", "schemes", "parameters", "responses")
    }
    if "parameters" in op:
        out["parameters"] = [_v3_parameter(p) for p in op["parameters"]]
    responses: dict[str, Any] = {}
    for code, resp in op.get("responses", {}).items():
        r: dict[str, Any] = {"description": resp.get("description", "")}
        if "schema" in resp:
            r["content"] = {mt: {"schema": resp["schema"]} for mt in produces}
        responses[code] = r
    out["responses"] = responses
    return out


def v3_document(gv: APIGroupVersion) -> dict[str, Any]:
    """The OpenAPI 3.0 document of one group version (``/openapi/v3/apis/<group>/<version>``)."""
    paths: dict[str, Any] = {}
    for path, item in v2_paths(gv).items():
        new_item: dict[str, Any] = {}
        for key, value in item.items():
            if key == "parameters":
                new_item[key] = [_v3_parameter(p) for p in value]
            elif key in ("get", "put", "post", "delete", "patch", "head", "options"):
                new_item[key] = _v3_operation(value)
            else:
                new_item[key] = value
        paths[path] = new_item
    return _to_v3_refs(
        {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v0.1.0"},
            "paths": dict(sorted(paths.items())),
            "components": {
                "schemas": dict(sorted(copy.deepcopy(gv.openapi_definitions).items())),
                "securitySchemes": {
                    "BearerToken": {
                        "type": "apiKey",
                        "description": "Bearer Token authentication",
                        "name": "authorization",
                        "in": "header",
                    }
                },
            },
        }
    )


class OpenAPICache:
    """Serialized documents and their ETags, rebuilt when the set of group versions changes."""

    def __init__(self) -> None:
        self._generation = -1
        self._v2: tuple[bytes, str] | None = None
        self._v3: dict[str, tuple[bytes, str]] = {}

    def refresh(self, generation: int, gvs: list[APIGroupVersion]) -> None:
        """Rebuild lazily when ``generation`` (bumped at each install) changed."""
        if generation == self._generation:
            return
        self._generation = generation
        body = orjson.dumps(v2_document(gvs))
        self._v2 = (body, etag_of(body))
        self._v3 = {}
        for gv in gvs:
            b = orjson.dumps(v3_document(gv))
            self._v3[f"apis/{gv.group}/{gv.version}"] = (b, etag_of(b))

    def v2(self) -> tuple[bytes, str]:
        """(body, etag) of ``/openapi/v2``."""
        assert self._v2 is not None
        return self._v2

    def v3(self, key: str) -> tuple[bytes, str] | None:
        """(body, etag) of ``/openapi/v3/<key>`` with key ``apis/<group>/<version>``."""
        return self._v3.get(key)

    def v3_index(self) -> dict[str, Any]:
        """The ``/openapi/v3`` index: each group version with its hash-pinned URL."""
        return {
            "paths": {
                key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={etag.strip(chr(34))}"}
                for key, (_body, etag) in sorted(self._v3.items())
            }
        }


_META = "io.k8s.apimachinery.pkg.apis.meta.v1"

# The apimachinery definitions that API kinds refer to, for groups to include in their
# ``openapi_definitions`` (kube's documents carry them the same way).
META_DEFINITIONS: dict[str, Any] = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {
        "description": 'A fixed-point number in Kubernetes quantity syntax, e.g. "1500m", "1536Ki".',
        "type": "string",
    },
    f"{_META}.Time": {
        "description": "RFC 3339 date and time, in seconds.",
        "type": "string",
        "format": "date-time",
    },
    f"{_META}.Duration": {"description": 'A duration in Go syntax, e.g. "15.002s".', "type": "string"},
    f"{_META}.ObjectMeta": {
        "description": "Standard object metadata.",
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            "creationTimestamp": {"$ref": f"#/definitions/{_META}.Time"},
            "resourceVersion": {"type": "string"},
            "uid": {"type": "string"},
        },
    },
    f"{_META}.ListMeta": {
        "description": "Standard list metadata.",
        "type": "object",
        "properties": {
            "resourceVersion": {"type": "string"},
            "continue": {"type": "string"},
            "remainingItemCount": {"type": "integer", "format": "int64"},
        },
    },
}


def list_definition(
    package: str, item: str, gvk: list[dict[str, str]], description: str | None = None
) -> dict[str, Any]:
    """The Swagger 2.0 definition of a Kubernetes list kind whose items are ``<package>.<item>``;
    ``gvk`` is its ``x-kubernetes-group-version-kind`` (the list kind's); ``description`` defaults
    to "A list of <item> objects."."""
    return {
        "description": description or f"A list of {item} objects.",
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"$ref": f"#/definitions/{_META}.ListMeta"},
            "items": {"type": "array", "items": {"$ref": f"#/definitions/{package}.{item}"}},
        },
        "x-kubernetes-group-version-kind": gvk,
    }


def query_parameter(name: str, description: str) -> dict[str, Any]:
    """A string query parameter of a Swagger 2.0 operation."""
    return {"name": name, "in": "query", "type": "string", "uniqueItems": True, "description": description}


def get_operation(
    *,
    group: str,
    version: str,
    kind: str,
    schema: str,
    action: str,
    operation_id: str,
    description: str,
    tag: str,
    parameters: list[dict[str, Any]],
) -> dict[str, Any]:
    """A Swagger 2.0 path item with one GET operation answering ``schema`` (a definition name),
    as the API groups declare in their ``openapi_paths``."""
    return {
        "get": {
            "description": description,
            "operationId": operation_id,
            "produces": ["application/json", "application/json;as=Table;v=v1;g=meta.k8s.io"],
            "schemes": ["https"],
            "tags": [tag],
            "parameters": parameters,
            "responses": {
                "200": {"description": "OK", "schema": {"$ref": f"#/definitions/{schema}"}},
                "401": {"description": "Unauthorized"},
            },
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": kind},
        }
    }
