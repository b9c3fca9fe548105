"""The pods of this node, as the agent needs them: a list+watch of the API server's pods.

One informer (field selector ``spec.nodeName=<node>``) serves the cgroup source (pod UID ->
namespace/name, container ID -> container name), the application scraper (annotations, pod IP) and
the OTLP receiver, which binds a connection to the pod it comes from with :class:`PodsByIP` (every
IP of ``status.podIPs``, as the OpenTelemetry k8sattributes processor associates by connection IP).

:class:`PodsByIP` answers, for a source IP, exactly one pod or why not: ``host_network_sender`` (the
node's own address: a ``hostNetwork`` pod or a node process, which cannot be told apart),
``ambiguous_sender`` (two live pods claim the address, e.g. a reused IP before the old pod's deletion
is seen) or ``unbound_sender`` (no pod of this node has it: another node, a host process on loopback).
Pods that have finished (``Succeeded``/``Failed``) no longer hold their IP and are not indexed.

:func:`workloads` gives a pod's owner chain as the k8sattributes processor infers it from the pod
alone: its ReplicaSet, StatefulSet, DaemonSet or Job owner; a ReplicaSet's Deployment is the
ReplicaSet's name minus ``-<pod-template-hash label>``; a Job's CronJob is the Job's name minus a
``-<digits>`` suffix.
"""

from __future__ import annotations

import ipaddress
import re
import sys
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from kcms.kube.client import KubeClient
from kcms.kube.informer import Informer
from kcms.kube.objects import shared_labels

__all__ = [
    "AgentPod",
    "PodsByIP",
    "Sender",
    "agent_pod_from_json",
    "container_id",
    "normal_ip",
    "pod_informer",
    "workloads",
]

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
    ips: tuple[str, ...] = ()  # every IP of status.podIPs (and podIP), normalised (normal_ip)
    host_ips: tuple[str, ...] = ()  # status.hostIPs / hostIP: the node's addresses, normalised
    host_network: bool = False  # spec.hostNetwork: the pod's IPs are the node's
    owners: tuple[tuple[str, str], ...] = ()  # (kind, name) of metadata.ownerReferences


def container_id(text: str) -> str:
    """A status ``containerID`` (``containerd://<id>``, ``cri-o://<id>``, ``docker://<id>``) without its scheme."""
    return text.rpartition("://")[2]


def normal_ip(text: str) -> str:
    """``text`` as one canonical IP string (IPv6 compressed, IPv4-mapped IPv6 as IPv4), "" if not an IP."""
    try:
        ip = ipaddress.ip_address(text.strip().split("%", 1)[0])
    except (ValueError, AttributeError):
        return ""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.compressed


def _ips(*values: Any) -> tuple[str, ...]:
    """Normalised distinct IPs of plain strings and ``[{"ip": ...}]`` lists, in order."""
    out: list[str] = []
    for value in values:
        items = value if isinstance(value, list) else [value]
        for item in items:
            text = item.get("ip") if isinstance(item, dict) else item
            ip = normal_ip(text) if isinstance(text, str) and text else ""
            if ip and ip not in out:
                out.append(ip)
    return tuple(out)


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
    spec = obj.get("spec") or {}
    owners = tuple(
        (str(ref.get("kind", "")), str(ref.get("name", "")))
        for ref in meta.get("ownerReferences") or ()
        if isinstance(ref, dict) and ref.get("kind") and ref.get("name")
    )
    return AgentPod(
        namespace=_intern(meta.get("namespace", "")),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        ip=status.get("podIP") or "",
        phase=_intern(status.get("phase") or ""),
        labels=shared_labels(meta.get("labels")),
        annotations={str(k): str(v) for k, v in annotations.items()} if isinstance(annotations, dict) else {},
        containers=containers,
        ips=_ips(status.get("podIP"), status.get("podIPs")),
        host_ips=_ips(status.get("hostIP"), status.get("hostIPs")),
        host_network=bool(spec.get("hostNetwork")),
        owners=owners,
    )


_CRONJOB_JOB = re.compile(r"(.+)-[0-9]+", re.ASCII)


def workloads(pod: AgentPod) -> dict[str, str]:
    """The pod's owner chain as ``{kind: name}`` (``ReplicaSet``, ``Deployment``, ``StatefulSet``,
    ``DaemonSet``, ``Job``, ``CronJob``), inferred from the pod alone (see the module docstring)."""
    out: dict[str, str] = {}
    for kind, name in pod.owners:
        if kind in ("ReplicaSet", "StatefulSet", "DaemonSet", "Job"):
            out.setdefault(kind, name)
        if kind == "ReplicaSet":
            # The Deployment controller names its ReplicaSets <deployment>-<pod-template-hash> and
            # labels their pods with that hash; without the label a bare ReplicaSet owns the pod.
            suffix = "-" + pod.labels.get("pod-template-hash", "")
            if len(suffix) > 1 and name.endswith(suffix) and len(name) > len(suffix):
                out.setdefault("Deployment", name[: -len(suffix)])
        elif kind == "Job":
            m = _CRONJOB_JOB.fullmatch(name)
            if m is not None:
                out.setdefault("CronJob", m.group(1))
    return out


@dataclass(slots=True, frozen=True)
class Sender:
    """Who a connection comes from: ``pod`` when exactly one pod of this node has the source IP;
    otherwise ``pod`` is None and ``reason`` says why (see the module docstring)."""

    ip: str
    pod: AgentPod | None
    reason: str = ""
    detail: str = ""


_UNBUILT = object()


class PodsByIP:
    """This node's pods indexed by IP (every ``status.podIPs`` entry), rebuilt when the pods change.

    ``pods`` lists the pods (``informer.values``); ``version`` returns something that changes whenever
    they do (:meth:`of_informer` uses the informer's list count and resourceVersion; without one the
    index is rebuilt on every lookup). ``node_ips`` are the node's own addresses (``$NODE_IP``), added
    to every pod's ``status.hostIPs``. ``synced`` says whether the first list is in.
    """

    def __init__(
        self,
        pods: Callable[[], Iterable[AgentPod]],
        *,
        version: Callable[[], Hashable] | None = None,
        synced: Callable[[], bool] = lambda: True,
        node_ips: Iterable[str] = (),
    ) -> None:
        self._pods = pods
        self._version = version
        self.synced = synced
        self._node_ips = frozenset(filter(None, (normal_ip(ip) for ip in node_ips)))
        self._built: object = _UNBUILT
        self._by_ip: dict[str, list[AgentPod]] = {}
        self._host_ips: frozenset[str] = self._node_ips

    @classmethod
    def of_informer(cls, informer: Informer[AgentPod], node_ips: Iterable[str] = ()) -> PodsByIP:
        """The index over a :func:`pod_informer`'s cache."""
        return cls(
            informer.values,
            # every watch event moves the resourceVersion (and a relist the count): a cheap signature
            version=lambda: (informer.relists, informer.last_resource_version, len(informer)),
            synced=informer.has_synced,
            node_ips=node_ips,
        )

    def _index(self) -> None:
        version = self._version() if self._version is not None else _UNBUILT
        if version is not _UNBUILT and version == self._built:
            return
        by_ip: dict[str, list[AgentPod]] = {}
        host_ips = set(self._node_ips)
        for pod in self._pods():
            host_ips.update(pod.host_ips)
            if pod.phase in ("Succeeded", "Failed"):  # finished: its IP may already be someone else's
                continue
            for ip in pod.ips:
                by_ip.setdefault(ip, []).append(pod)
        self._by_ip, self._host_ips, self._built = by_ip, frozenset(host_ips), version

    def pods_of(self, ip: str) -> list[AgentPod]:
        """The live pods with ``ip`` (normalised or not)."""
        self._index()
        return list(self._by_ip.get(normal_ip(ip), ()))

    def sender(self, ip: str) -> Sender:
        """Who a connection from ``ip`` is (see :class:`Sender`)."""
        self._index()
        ip = normal_ip(ip) or ip
        pods = self._by_ip.get(ip, [])
        if ip in self._host_ips or any(p.host_network for p in pods):
            return Sender(
                ip, None, "host_network_sender", f"{ip} is the node's address (a host-network pod or process)"
            )
        if len(pods) > 1:
            names = ", ".join(sorted(f"{p.namespace}/{p.name}" for p in pods)[:3])
            return Sender(ip, None, "ambiguous_sender", f"{ip} belongs to {len(pods)} pods ({names})")
        if not pods:
            return Sender(ip, None, "unbound_sender", f"{ip} is not the IP of a pod on this node")
        return Sender(ip, pods[0])


def pod_informer(client: KubeClient, node: str) -> Informer[AgentPod]:
    """A list+watch of the pods scheduled to ``node``, keyed by pod UID (``informer.get(uid)``)."""
    return Informer(
        client,
        "/api/v1/pods",
        agent_pod_from_json,
        key=lambda p: p.uid,
        field_selector=f"spec.nodeName={node}",
    )
