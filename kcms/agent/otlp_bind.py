"""Which object an OTLP resource's points are about, decided by who sent them.

The agent's OTLP receiver (:mod:`kcms.agent.otlp`) finds the sending pod from the connection's
source IP among the pods of its node (:class:`kcms.agent.pods.PodsByIP`), as the OpenTelemetry
k8sattributes processor associates telemetry by connection. The ``k8s.*`` resource attributes are
then *claims* checked against that pod (:func:`bind_to_pod`); a resource whose claims do not hold
has all its points refused with one of :data:`BIND_REASONS`:

- ``foreign_namespace``: ``k8s.namespace.name`` is not the pod's namespace;
- ``foreign_pod``: ``k8s.pod.name``, ``k8s.pod.uid`` or ``k8s.pod.ip`` is not the pod's;
- ``foreign_workload``: ``k8s.deployment.name``, ``k8s.replicaset.name``, ``k8s.statefulset.name``,
  ``k8s.daemonset.name``, ``k8s.job.name`` or ``k8s.cronjob.name`` is not in the pod's owner chain
  (:func:`kcms.agent.pods.workloads`);
- ``foreign_node``: ``k8s.node.name`` is another node, or the points would be about the node itself
  (a pod speaks for itself, its workload or its namespace, never for the node it runs on).

A bound pod's points are about (the object rules of the unbound mapping, with the pod's identity):
the pod when the resource names it (``k8s.pod.*``) or has no ``k8s.*`` attribute at all; its
Deployment for ``k8s.deployment.name`` without a pod; its namespace (an external metric) for
``k8s.namespace.name`` alone.

Senders that are not exactly one pod (``unbound_sender``, ``host_network_sender``,
``ambiguous_sender``: see :mod:`kcms.agent.pods`) are refused unless the agent runs with
``--otlp-allow-unbound``; then their attributes are trusted as before binding existed
(:func:`bind_resource`).

:class:`SenderSeries` bounds the distinct series one sender keeps alive (``sender_limit``), whatever
objects they are about: the buffer's per-pod limit alone would let a pod fill the node's buffer with
series about its Deployment or namespace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable

from kcms import limits
from kcms.agent.pods import AgentPod, Sender, normal_ip, workloads
from kcms.limits import printable
from kcms.model import Labels, ObjectRef

__all__ = [
    "BIND_REASONS",
    "Binder",
    "SenderSeries",
    "bind_resource",
    "bind_to_pod",
    "binder_for",
    "sender_key",
]

Sample = tuple[str, ObjectRef, Labels, float, float]
# The object of a resource's points, or None with the refusal reason and a readable detail.
Binding = tuple[ObjectRef | None, str, str]
Binder = Callable[[dict[str, str]], Binding]

BIND_REASONS = (
    "unbound_sender",
    "host_network_sender",
    "ambiguous_sender",
    "foreign_pod",
    "foreign_namespace",
    "foreign_workload",
    "foreign_node",
    "sender_limit",
)

_DNS_LABEL = limits.DNS_LABEL_RE
_DNS_SUBDOMAIN = limits.DNS_SUBDOMAIN_RE
_WORKLOAD_ATTRIBUTES = (
    ("k8s.deployment.name", "Deployment"),
    ("k8s.replicaset.name", "ReplicaSet"),
    ("k8s.statefulset.name", "StatefulSet"),
    ("k8s.daemonset.name", "DaemonSet"),
    ("k8s.job.name", "Job"),
    ("k8s.cronjob.name", "CronJob"),
)
_ALLOW_FLAG = "--otlp-allow-unbound"


def bind_resource(attributes: dict[str, str]) -> Binding:
    """The object a resource's points are about when its attributes are trusted (an unbound sender
    with ``--otlp-allow-unbound``): ``(ref, "", "")``, or ``(None, reason, detail)``."""
    ns = attributes.get("k8s.namespace.name", "")
    pod = attributes.get("k8s.pod.name", "")
    deployment = attributes.get("k8s.deployment.name", "")
    node = attributes.get("k8s.node.name", "")
    if pod and ns:
        ref = ObjectRef("pods", ns, pod)
    elif deployment and ns:
        ref = ObjectRef("deployments.apps", ns, deployment)
    elif node:
        ref = ObjectRef("nodes", "", node)
    elif ns:
        ref = ObjectRef("", ns, "")
    else:
        return (
            None,
            "unbound",
            "the resource has none of k8s.pod.name with k8s.namespace.name, k8s.deployment.name with "
            "k8s.namespace.name, k8s.node.name or k8s.namespace.name",
        )
    if ref.namespace and (len(ref.namespace) > 63 or not _DNS_LABEL.fullmatch(ref.namespace)):
        return (
            None,
            "invalid_object",
            f"namespace {printable(ref.namespace, 80)} is not a valid namespace name",
        )
    if ref.name and (len(ref.name) > 253 or not _DNS_SUBDOMAIN.fullmatch(ref.name)):
        return (
            None,
            "invalid_object",
            f"{ref.resource} name {printable(ref.name, 80)} is not a valid object name",
        )
    return ref, "", ""


def bind_to_pod(attributes: dict[str, str], pod: AgentPod, node_name: str) -> Binding:
    """The object a resource sent by ``pod`` (on node ``node_name``) is about, its ``k8s.*``
    attributes checked as claims (see the module docstring)."""
    who = f"the sender is pod {pod.namespace}/{pod.name}"

    def claim(key: str) -> str | None:
        return attributes.get(key) or None  # an empty attribute claims nothing

    ns = claim("k8s.namespace.name")
    if ns is not None and ns != pod.namespace:
        return None, "foreign_namespace", f"k8s.namespace.name is {printable(ns, 80)}; {who}"
    name, uid, ip = claim("k8s.pod.name"), claim("k8s.pod.uid"), claim("k8s.pod.ip")
    if name is not None and name != pod.name:
        return None, "foreign_pod", f"k8s.pod.name is {printable(name, 80)}; {who}"
    if uid is not None and uid != pod.uid:
        return None, "foreign_pod", f"k8s.pod.uid is {printable(uid, 80)}; {who} (uid {pod.uid})"
    if ip is not None and normal_ip(ip) not in pod.ips:
        return None, "foreign_pod", f"k8s.pod.ip is {printable(ip, 80)}; {who}"
    node = claim("k8s.node.name")
    if node is not None and node != node_name:
        return None, "foreign_node", f"k8s.node.name is {printable(node, 80)}; {who} on node {node_name}"
    chain: dict[str, str] | None = None
    for key, kind in _WORKLOAD_ATTRIBUTES:
        value = claim(key)
        if value is None:
            continue
        chain = workloads(pod) if chain is None else chain
        if chain.get(kind) != value:
            owner = f"{kind} {chain[kind]}" if kind in chain else f"no {kind}"
            return None, "foreign_workload", f"{key} is {printable(value, 80)}; {who}, owned by {owner}"
    if name is not None or uid is not None or ip is not None:
        return ObjectRef("pods", pod.namespace, pod.name), "", ""
    deployment = claim("k8s.deployment.name")
    if deployment is not None:
        return ObjectRef("deployments.apps", pod.namespace, deployment), "", ""
    if node is not None:
        return (
            None,
            "foreign_node",
            f"k8s.node.name without k8s.pod.name makes the points about node {node_name}; {who}, which "
            "writes only about itself, its Deployment or its namespace",
        )
    if ns is not None:
        return ObjectRef("", pod.namespace, ""), "", ""
    return ObjectRef("pods", pod.namespace, pod.name), "", ""


def binder_for(sender: Sender, node_name: str, allow_unbound: bool) -> Binder:
    """How the resources of a request from ``sender`` are bound (see the module docstring)."""
    pod = sender.pod
    if pod is not None:
        return lambda attributes: bind_to_pod(attributes, pod, node_name)
    if allow_unbound:
        return bind_resource
    refusal: Binding = (None, sender.reason, f"{sender.detail} ({_ALLOW_FLAG} accepts such senders)")
    return lambda attributes: refusal


def sender_key(sender: Sender) -> Hashable:
    """Whose budget a sender's series count against: its pod, or its address when unbound."""
    if sender.pod is not None:
        return ("pod", sender.pod.namespace, sender.pod.name)
    return ("ip", sender.ip)


class SenderSeries:
    """At most ``max_series`` distinct series per sender, each forgotten ``idle`` seconds after its
    last point (the buffer's retention: by then the buffer has dropped it too).

    Series are remembered by hash (8 bytes of key, the hash seed is random per process, so a client
    cannot aim collisions), so the memory is about 100 bytes a series: at most ``max_series`` times
    the senders seen within ``idle``.
    """

    def __init__(self, max_series: int = 1000, idle: float = 300.0) -> None:
        if max_series < 1 or not idle > 0:
            raise ValueError("max_series must be at least 1 and idle positive")
        self.max_series = max_series
        self.idle = idle
        self._seen: dict[Hashable, dict[int, float]] = {}
        self._next_sweep = time.monotonic() + idle / 4

    def count(self, sender: Hashable) -> int:
        """The live series of ``sender``."""
        return len(self._seen.get(sender, ()))

    def __len__(self) -> int:
        return sum(len(s) for s in self._seen.values())

    def admit(self, sender: Hashable, samples: Iterable[Sample]) -> bool:
        """Record the series of one data point's samples for ``sender``; False (nothing recorded)
        when they would take it over ``max_series``."""
        mono = time.monotonic()
        if mono >= self._next_sweep:
            self._sweep(mono)
        seen = self._seen.get(sender)
        if seen is None:
            seen = self._seen[sender] = {}
        keys = {hash((metric, obj, labels)) for metric, obj, labels, _, _ in samples}
        new = sum(1 for k in keys if k not in seen)
        if new and len(seen) + new > self.max_series:
            if not seen:
                del self._seen[sender]
            return False
        for k in keys:
            seen[k] = mono
        return True

    def _sweep(self, mono: float) -> None:
        cutoff = mono - self.idle
        for sender in list(self._seen):
            seen = self._seen[sender]
            for k in [k for k, touched in seen.items() if touched < cutoff]:
                del seen[k]
            if not seen:
                del self._seen[sender]
        self._next_sweep = mono + self.idle / 4
