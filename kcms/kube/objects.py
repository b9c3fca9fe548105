"""Convert Kubernetes Node and Pod JSON objects to the slim kcms.model dataclasses.

Memory matters (tens of thousands of pods): repeated strings (label keys and values, namespaces, node
names, phases) are interned, and identical label maps are shared between objects. Label dicts returned
here must therefore be treated as read-only.
"""

from __future__ import annotations

import sys
from typing import Any

from kcms.model import NodeInfo, PodInfo

_intern = sys.intern
_EMPTY: dict[str, str] = {}
_LABEL_CACHE_MAX = 50_000
_label_cache: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}


def shared_labels(labels: dict[str, Any] | None) -> dict[str, str]:
    """Return a read-only label dict with interned strings, shared with every equal label map seen."""
    if not labels:
        return _EMPTY
    key = tuple(sorted((_intern(str(k)), _intern(str(v))) for k, v in labels.items()))
    found = _label_cache.get(key)
    if found is None:
        if len(_label_cache) >= _LABEL_CACHE_MAX:
            _label_cache.clear()  # bounded: objects keep their dicts, only sharing restarts
        found = _label_cache[key] = dict(key)
    return found


def node_from_json(obj: dict[str, Any]) -> NodeInfo:
    """A NodeInfo from a v1 Node object (as listed or watched)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    addresses = [
        (_intern(a.get("type", "")), a.get("address", ""))
        for a in status.get("addresses") or ()
        if isinstance(a, dict)
    ]
    endpoint = (status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}
    try:
        port = int(endpoint.get("Port") or 0)
    except (TypeError, ValueError):
        port = 0
    return NodeInfo(
        name=_intern(meta.get("name", "")),
        labels=shared_labels(meta.get("labels")),
        addresses=addresses,
        kubelet_port=port,
        creation_timestamp=_intern(meta.get("creationTimestamp") or ""),
    )


def pod_from_json(obj: dict[str, Any]) -> PodInfo:
    """A PodInfo from a v1 Pod object (as listed or watched)."""
    meta = obj.get("metadata") or {}
    return PodInfo(
        namespace=_intern(meta.get("namespace", "")),
        name=meta.get("name", ""),
        labels=shared_labels(meta.get("labels")),
        node_name=_intern((obj.get("spec") or {}).get("nodeName") or ""),
        phase=_intern((obj.get("status") or {}).get("phase") or ""),
        creation_timestamp=_intern(meta.get("creationTimestamp") or ""),
    )
