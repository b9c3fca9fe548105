"""The pods of this node, as the agent needs them: a list+watch of the API server's pods.

One informer (field selector ``spec.nodeName=<node>``) serves both the cgroup source (pod UID ->
namespace/name, container ID -> container name) and the application scraper (annotations, pod IP).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from kcms.kube.client import KubeClient
from kcms.kube.informer import Informer
from kcms.kube.objects import shared_labels

__all__ = ["AgentPod", "agent_pod_from_json", "container_id", "pod_informer"]

_intern = sys.intern


@dataclass(slots=True, frozen=True)
class AgentPod:
    """The parts of a Pod object the agent uses."""

    namespace: str
    name: str
    uid: str
    ip: str  # status.podIP, "" if not yet assigned
    phase: str
    labels: dict[str, str]
    annotations: dict[str, str]
    containers: dict[str, str]  # bare container ID (runtime prefix stripped) -> container name


def container_id(text: str) -> str:
    """A status ``containerID`` (``containerd://<id>``, ``cri-o://<id>``, ``docker://<id>``) without its scheme."""
    return text.rpartition("://")[2]


def agent_pod_from_json(obj: dict[str, Any]) -> AgentPod:
    """An :class:`AgentPod` from a v1 Pod object (as listed or watched)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    containers: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or ():
            if isinstance(cs, dict) and cs.get("containerID") and cs.get("name"):
                containers[container_id(str(cs["containerID"]))] = str(cs["name"])
    annotations = meta.get("annotations") or {}
    return AgentPod(
        namespace=_intern(meta.get("namespace", "")),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        ip=status.get("podIP") or "",
        phase=_intern(status.get("phase") or ""),
        labels=shared_labels(meta.get("labels")),
        annotations={str(k): str(v) for k, v in annotations.items()} if isinstance(annotations, dict) else {},
        containers=containers,
    )


def pod_informer(client: KubeClient, node: str) -> Informer[AgentPod]:
    """A list+watch of the pods scheduled to ``node``, keyed by pod UID (``informer.get(uid)``)."""
    return Informer(
        client,
        "/api/v1/pods",
        agent_pod_from_json,
        key=lambda p: p.uid,
        field_selector=f"spec.nodeName={node}",
    )
