"""The dashboard's read-only window on the Kubernetes API: a fixed allow-list of GET paths.

The browser never talks to the API server and never holds a credential: it asks the local dashboard
server for ``<token>/k8s/<API path>``, and only the paths below are forwarded, with the kubeconfig's
credentials, by `kcms.kube.client.KubeClient`. Everything else is refused before any request leaves
the machine. The list is what the page reads, nothing more:

- ``metrics.k8s.io/v1beta1``: nodes, pods (all, one namespace, one object);
- ``history.kcms.io/v1alpha1``: discovery, nodes, pods, series, scrapes (absent without history);
- ``custom.metrics.k8s.io/v1beta2`` and ``external.metrics.k8s.io/v1beta1``: discovery and values;
- ``/api/v1/nodes``: trimmed here to each node's name, allocatable and capacity (the page divides
  usage by allocatable), cached for `NODES_CACHE_SECONDS` (a list of every Node is large).

Path segments must look like Kubernetes names (no ``..``, no percent-escapes, no empty segment), and
only the listed query parameters pass, each once and bounded: a page (or a local program holding the
token) cannot turn the proxy into a general API client.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

# A Kubernetes object or namespace name (DNS subdomain), a group-resource, a metric name.
_NAME = r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
_RESOURCE = r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
_METRIC = r"[A-Za-z0-9_:][A-Za-z0-9_:.\-]{0,252}"
_OBJECT = rf"(?:{_NAME}|\*)"

ALLOWED_PATHS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        rf"/apis/metrics\.k8s\.io/v1beta1/nodes(?:/{_NAME})?",
        r"/apis/metrics\.k8s\.io/v1beta1/pods",
        rf"/apis/metrics\.k8s\.io/v1beta1/namespaces/{_NAME}/pods(?:/{_NAME})?",
        r"/apis/history\.kcms\.io/v1alpha1",
        rf"/apis/history\.kcms\.io/v1alpha1/(?:nodes(?:/{_NAME})?|pods|series|scrapes)",
        rf"/apis/history\.kcms\.io/v1alpha1/namespaces/{_NAME}/(?:pods(?:/{_NAME})?|series)",
        r"/apis/custom\.metrics\.k8s\.io/v1beta2",
        rf"/apis/custom\.metrics\.k8s\.io/v1beta2/{_RESOURCE}/{_OBJECT}/{_METRIC}",
        rf"/apis/custom\.metrics\.k8s\.io/v1beta2/namespaces/{_NAME}/{_RESOURCE}/{_OBJECT}/{_METRIC}",
        rf"/apis/custom\.metrics\.k8s\.io/v1beta2/namespaces/{_NAME}/metrics/{_METRIC}",  # the namespace's own
        r"/apis/external\.metrics\.k8s\.io/v1beta1",
        rf"/apis/external\.metrics\.k8s\.io/v1beta1/namespaces/{_NAME}/{_METRIC}",
        r"/api/v1/nodes",
    )
)
ALLOWED_PARAMS = frozenset(
    ("labelSelector", "fieldSelector", "metricLabelSelector", "since", "metric", "resource")
)
MAX_PATH = 1024
MAX_PARAM = 1024  # characters of one query value (a label selector of a few dozen terms)
NODES_PATH = "/api/v1/nodes"
NODES_CACHE_SECONDS = 60.0


class Refused(Exception):
    """A request the proxy does not forward: ``reason`` is a bounded label for the refusal counter."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Upstream:
    """A request to forward: the API path and its query parameters (already checked)."""

    path: str
    params: dict[str, str]


def check(raw_path: str, query: Mapping[str, str] | Any) -> Upstream:
    """The upstream request for the API path ``raw_path`` (as the browser sent it, undecoded) and its
    query (a multidict), or `Refused`."""
    if len(raw_path) > MAX_PATH:
        raise Refused("path", f"path over {MAX_PATH} characters")
    # Percent-escapes could hide "/" or ".." from the patterns below; no allowed path needs one (the
    # page sends the "*" of a custom metric query and the ":" of a metric name unescaped).
    if (
        "%" in raw_path
        or "//" in raw_path
        or "/./" in raw_path
        or "/../" in raw_path
        or raw_path.endswith(("/.", "/.."))
    ):
        raise Refused("path", "path not in the dashboard's allow-list")
    if not any(p.fullmatch(raw_path) for p in ALLOWED_PATHS):
        raise Refused("path", "path not in the dashboard's allow-list")
    params: dict[str, str] = {}
    for key in query:
        if key not in ALLOWED_PARAMS:
            raise Refused("query", "query parameter not in the dashboard's allow-list")
        values = query.getall(key) if hasattr(query, "getall") else [query[key]]
        if len(values) != 1:
            raise Refused("query", "a query parameter given twice")
        value = values[0]
        if len(value) > MAX_PARAM:
            raise Refused("query", f"a query parameter over {MAX_PARAM} characters")
        params[key] = value
    if raw_path == NODES_PATH and params:
        raise Refused("query", "/api/v1/nodes takes no query parameters here")
    return Upstream(raw_path, params)


def trim_nodes(body: bytes) -> bytes:
    """A NodeList reduced to what the page shows (name, allocatable, capacity): the rest of a Node
    (addresses, images, conditions, annotations) never reaches the browser."""
    doc = orjson.loads(body)
    items = []
    for node in doc.get("items") or ():
        if not isinstance(node, dict):
            continue
        meta = node.get("metadata") if isinstance(node.get("metadata"), dict) else {}
        status = node.get("status") if isinstance(node.get("status"), dict) else {}
        items.append(
            {
                "metadata": {"name": meta.get("name", "")},
                "status": {
                    "allocatable": _quantities(status.get("allocatable")),
                    "capacity": _quantities(status.get("capacity")),
                },
            }
        )
    return orjson.dumps({"kind": "NodeList", "apiVersion": "v1", "items": items})


def _quantities(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if k in ("cpu", "memory") and isinstance(v, str)}


class NodesCache:
    """The trimmed /api/v1/nodes answer, kept `NODES_CACHE_SECONDS`: allocatable rarely changes and a
    whole NodeList is the largest read the page could make."""

    def __init__(self, ttl: float = NODES_CACHE_SECONDS) -> None:
        self.ttl = ttl
        self._body: bytes | None = None
        self._at = 0.0

    def get(self) -> bytes | None:
        if self._body is not None and time.monotonic() - self._at < self.ttl:
            return self._body
        return None

    def put(self, body: bytes) -> None:
        self._body, self._at = body, time.monotonic()
