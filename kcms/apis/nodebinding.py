"""Node pushes bound to their sender: which node a credential speaks for, and what that node may report.

:func:`node_identity` derives the caller's node from the authenticated user (never from the body),
trying in order:

1. the **node claim** of a bound ServiceAccount token: TokenReview's
   ``user.extra["authentication.kubernetes.io/node-name"]`` (set for tokens projected into pods since
   Kubernetes 1.30, feature ServiceAccountTokenPodNodeInfo);
2. the **pod claim**: ``extra["authentication.kubernetes.io/pod-name"]`` of a ServiceAccount user
   ``system:serviceaccount:<namespace>:<name>``; the pod ``<namespace>/<pod-name>`` must be in the
   inventory, and its ``spec.nodeName`` is the node (older clusters, or tokens without the node claim);
3. a **node user**: ``system:node:<name>`` in group ``system:nodes`` (a kubelet's client certificate
   issued by the client CA, or the same identity from another authenticator).

A claim must carry exactly one value that is a valid node (or pod) name. A node claim and a pod
claim that disagree (the inventory places the pod elsewhere) name no node. A caller with no node
identity is refused as a whole (:class:`NoNodeIdentity`, a 403).

:class:`~kcms.nodescope.NodeScope` (:mod:`kcms.nodescope`, shared with the collector's agent scrape)
then decides each item of the push: ``other_node``, ``unknown_node`` (and then every item of the push
is refused so), ``unknown_pod``, ``pod_not_on_node``, ``object_not_bound`` and
``namespace_not_on_node``, as that module's docstring says. Namespaced objects other than pods
(a Deployment, or an external metric of a namespace) are allowed only with ``kcms server
--node-push-allow-namespaced-objects``, and then only in a namespace where the inventory places at
least one pod on the caller's node: the agent's OTLP receiver's Deployment and namespace series.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kcms import limits
from kcms.apis.quota import SeriesQuota
from kcms.model import Inventory, Labels, NodeBatch, ObjectRef, ResourcePoint, UserInfo
from kcms.nodescope import (
    NAMESPACE_NOT_ON_NODE,
    OBJECT_NOT_BOUND,
    OTHER_NODE,
    POD_NOT_ON_NODE,
    UNKNOWN_NODE,
    UNKNOWN_POD,
    NodeScope,
)
from kcms.sources.bounds import point_problem
from kcms.sources.exposition import object_problem
from kcms.store.wire import WireNode, WirePoint

__all__ = [
    "NAMESPACE_NOT_ON_NODE",
    "NODE_NAME_EXTRA",
    "OBJECT_NOT_BOUND",
    "OTHER_NODE",
    "POD_NAME_EXTRA",
    "POD_NOT_ON_NODE",
    "UNKNOWN_NODE",
    "UNKNOWN_POD",
    "NoNodeIdentity",
    "NodeIdentity",
    "NodeScope",
    "bound_node",
    "bound_samples",
    "node_identity",
]

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
NODE_USER_PREFIX = "system:node:"
NODES_GROUP = "system:nodes"

# Refusal reasons of the items' contents (stable: Prometheus label values); those of the binding
# are kcms.nodescope's, re-exported above.
INVALID_CONTAINER_NAME = "invalid_container_name"
TOO_MANY_CONTAINERS = "too_many_containers"
INVALID_METRIC_NAME = "invalid_metric_name"
INVALID_LABEL_NAME = "invalid_label_name"
INVALID_OBJECT = "invalid_object"
NON_FINITE_VALUE = "non_finite_value"
BAD_ROW = "bad_row"
UNSUPPORTED = "unsupported"

_METRIC_RE = limits.METRIC_NAME_RE
_LABEL_NAME_RE = limits.LABEL_NAME_RE

_DNS_SUBDOMAIN_RE = limits.DNS_SUBDOMAIN_RE
_DNS_LABEL_RE = limits.DNS_LABEL_RE


def _subdomain(name: str) -> bool:
    return 0 < len(name) <= 253 and _DNS_SUBDOMAIN_RE.fullmatch(name) is not None


def _label(name: str) -> bool:
    return 0 < len(name) <= 63 and _DNS_LABEL_RE.fullmatch(name) is not None


class NoNodeIdentity(Exception):
    """The credential names no node (the message says why; it is safe to show the caller)."""


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    node: str
    via: str  # "node_claim", "pod_claim" or "node_user"


def _single(extra: dict[str, tuple[str, ...]], key: str) -> str | None:
    """The one value of an extra key; NoNodeIdentity if the key is there with several or none."""
    values = extra.get(key)
    if values is None:
        return None
    if len(values) != 1:
        raise NoNodeIdentity(f"the credential's {key} claim has {len(values)} values, not one")
    return values[0]


def node_identity(user: UserInfo, inventory: Inventory) -> NodeIdentity:
    """The node ``user`` speaks for (see the module docstring); :class:`NoNodeIdentity` otherwise.
    Messages never echo claim values (they could be anything a front proxy was told)."""
    extra = dict(user.extra)
    node = _single(extra, NODE_NAME_EXTRA)
    pod_name = _single(extra, POD_NAME_EXTRA)
    if node is not None and not _subdomain(node):
        raise NoNodeIdentity(f"the credential's {NODE_NAME_EXTRA} claim is not a node name")
    pod_node = None
    if pod_name is not None and user.name.startswith(SERVICE_ACCOUNT_PREFIX):
        namespace = user.name[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")[0]
        if not (_label(namespace) and _subdomain(pod_name)):
            raise NoNodeIdentity(f"the credential's {POD_NAME_EXTRA} claim is not a pod name")
        pod = inventory.pod(namespace, pod_name)
        if pod is not None and pod.node_name:
            pod_node = pod.node_name
        elif node is None:
            raise NoNodeIdentity(
                "the credential's pod claim names a pod the inventory does not place on a node "
                "(not listed yet, or not running)"
            )
    if node is not None:
        if pod_node is not None and pod_node != node:
            raise NoNodeIdentity("the credential's node claim and the node of its pod disagree")
        return NodeIdentity(node, "node_claim")
    if pod_node is not None:
        return NodeIdentity(pod_node, "pod_claim")
    if user.name.startswith(NODE_USER_PREFIX) and NODES_GROUP in user.groups:
        name = user.name[len(NODE_USER_PREFIX) :]
        if not _subdomain(name):
            raise NoNodeIdentity("the node user's name is not a node name")
        return NodeIdentity(name, "node_user")
    raise NoNodeIdentity(
        "the credential names no node: push with the agent's bound ServiceAccount token (node or pod "
        f"claim) or as {NODE_USER_PREFIX}<name> in group {NODES_GROUP}"
    )


# ---- the items of one push ------------------------------------------------------------------------

Refusals = Counter  # (item, reason) -> count; item is "node", "pod", "container" or "sample"


def _reading(point: WirePoint, future: float) -> ResourcePoint | str:
    """A ``(start_time, timestamp, cpu_ns, memory)`` reading, or why it is refused: the bounds every
    way in applies (:func:`kcms.sources.bounds.point_problem`: ``future_timestamp``, ``negative``,
    ``non_finite``, ``absurd_value``, ``bad_value``)."""
    p = ResourcePoint(*point)
    return point_problem(p, future) or p


def bound_node(
    wire: WireNode, scope: NodeScope, future: float, max_containers: int, refusals: Refusals
) -> NodeBatch | None:
    """The part of ``wire`` its sender may report, or None (the whole reading refused); every
    refusal counted in ``refusals``. ``future``: the latest acceptable timestamp."""
    reason = scope.node_reason(wire.node)
    if reason is not None:
        refusals["node", reason] += 1
        return None
    point = None
    if wire.point is not None:
        got = _reading(wire.point, future)
        if isinstance(got, str):
            refusals["node", got] += 1
        else:
            point = got
    pods: dict[tuple[str, str], dict[str, ResourcePoint]] = {}
    for pod in wire.pods:
        reason = scope.pod_reason(pod.namespace, pod.name)
        if reason is None and len(pod.containers) > max_containers:
            reason = TOO_MANY_CONTAINERS
        if reason is not None:
            refusals["pod", reason] += 1
            continue
        containers: dict[str, ResourcePoint] = {}
        whole = True
        for name, p in pod.containers:
            got = _reading(p, future) if _label(name) else INVALID_CONTAINER_NAME
            if isinstance(got, str):
                refusals["container", got] += 1
                whole = False
                continue
            containers[name] = got
        # a pod's usage is the sum of its containers: never served partial (as metrics-server)
        if containers and whole:
            pods[(pod.namespace, pod.name)] = containers
    return NodeBatch(wire.node, point, pods)


def _labels(labels: Iterable[tuple[str, str]]) -> Labels | str:
    """Labels sorted by key, or the reason they are refused."""
    out = tuple(sorted(labels))
    problem = limits.labels_problem(out)
    if problem is not None:
        return problem[0]
    previous = None
    for k, _ in out:
        if k == previous or not _LABEL_NAME_RE.fullmatch(k):
            return INVALID_LABEL_NAME
        previous = k
    return out


def _metric_problem(metric: str) -> str | None:
    problem = limits.metric_name_problem(metric)
    if problem is not None:
        return problem[0]
    return None if _METRIC_RE.fullmatch(metric) else INVALID_METRIC_NAME


def _series_verdict(
    metric: str,
    resource: str,
    namespace: str,
    name: str,
    labels: Any,
    scope: NodeScope,
    metrics: dict[str, str | None],
    objects: dict[tuple[str, str, str], ObjectRef | str],
) -> tuple[str, ObjectRef, Labels] | str:
    """A series' metric name, object and labels as the store takes them, or why they are refused."""
    reason = metrics.get(metric, "")
    if reason == "":
        reason = metrics[metric] = _metric_problem(metric)
    if reason is not None:
        return reason
    key = (resource, namespace, name)
    obj = objects.get(key)
    if obj is None:
        if object_problem(resource, namespace, name) is not None:
            obj = INVALID_OBJECT
        else:
            obj = scope.object_reason(resource, namespace, name) or ObjectRef(resource, namespace, name)
        objects[key] = obj
    if isinstance(obj, str):
        return obj
    lb = _labels(labels)
    if isinstance(lb, str):
        return lb
    return metric, obj, lb


def bound_samples(
    samples: Iterable[tuple[Any, ...]],
    scope: NodeScope,
    future: float,
    quota: SeriesQuota,
    writer: str,
    now: float,
    refusals: Refusals,
) -> list[tuple[str, ObjectRef, Labels, float, float]]:
    """The ``(metric, resource, namespace, name, labels, timestamp, value)`` samples its sender may
    report and that fit the bounds and ``quota``, as series-store samples; every refusal counted in
    ``refusals``. Each distinct series is checked once per push (an agent sending its whole buffer
    carries many points of each), and asked of the quota once, with its first usable point: a new
    series is recorded against ``writer`` at ``now`` as it is admitted, so one push cannot overshoot."""
    good: list[tuple[str, ObjectRef, Labels, float, float]] = []
    metrics: dict[str, str | None] = {}
    objects: dict[tuple[str, str, str], ObjectRef | str] = {}
    verdicts: dict[tuple[Any, ...], tuple[str, ObjectRef, Labels] | str] = {}
    admitted: dict[tuple[Any, ...], str | None] = {}
    isfinite = math.isfinite
    for metric, resource, namespace, name, labels, ts, value in samples:
        series = (metric, resource, namespace, name, labels)
        verdict = verdicts.get(series)
        if verdict is None:
            verdict = verdicts[series] = _series_verdict(
                metric, resource, namespace, name, labels, scope, metrics, objects
            )
        if verdict.__class__ is str:
            refusals["sample", verdict] += 1  # type: ignore[index]
            continue
        if not (isfinite(ts) and isfinite(value)):
            refusals["sample", NON_FINITE_VALUE] += 1
            continue
        if ts > future:
            refusals["sample", limits.FUTURE_TIMESTAMP] += 1
            continue
        try:
            reason = admitted[series]
        except KeyError:
            key = hash(series)
            reason = admitted[series] = quota.check(writer, metric, key)
            if reason is None:
                quota.record(writer, metric, key, now)
        if reason is not None:
            refusals["sample", reason] += 1
            continue
        m, obj, lb = verdict  # type: ignore[misc]
        good.append((m, obj, lb, float(ts), float(value)))
    return good
