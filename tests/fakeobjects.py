"""Kubernetes object builders for the tests: Nodes and Pods shaped like a real API server returns them.

Used with the fake API server (tests/fakeapi.py re-exports them) and on their own, e.g. for inventories.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any


def rfc3339_now() -> str:
    """The current UTC time as the API server writes timestamps (seconds, trailing Z)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_node(
    name: str,
    labels: dict[str, str] | None = None,
    addresses: list[tuple[str, str]] | None = None,
    kubelet_port: int = 10250,
) -> dict:
    """A Node object shaped like what a real API server returns."""
    addrs = addresses if addresses is not None else [("InternalIP", "127.0.0.1"), ("Hostname", name)]
    base_labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
    }
    base_labels.update(labels or {})
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "labels": base_labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]},
        "status": {
            "capacity": {
                "cpu": "4",
                "memory": "16318156Ki",
                "pods": "110",
                "ephemeral-storage": "102626232Ki",
            },
            "allocatable": {
                "cpu": "4",
                "memory": "16215756Ki",
                "pods": "110",
                "ephemeral-storage": "94580335255",
            },
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": rfc3339_now(),
                    "lastTransitionTime": rfc3339_now(),
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "addresses": [{"type": t, "address": a} for t, a in addrs],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
            "nodeInfo": {
                "machineID": uuid.uuid4().hex,
                "systemUUID": str(uuid.uuid4()),
                "bootID": str(uuid.uuid4()),
                "kernelVersion": "6.1.0",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.13",
                "kubeletVersion": "v1.32.0",
                "kubeProxyVersion": "v1.32.0",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def make_pod(
    namespace: str,
    name: str,
    node: str,
    labels: dict[str, str] | None = None,
    phase: str = "Running",
    containers: tuple[str, ...] | list[str] = ("app",),
) -> dict:
    """A Pod object shaped like what a real API server returns."""
    now = rfc3339_now()
    running = phase == "Running"
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": name.rsplit("-", 1)[0],
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": c,
                    "image": f"registry.example/{c}:1.0",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
                for c in containers
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "nodeName": node,
            "schedulerName": "default-scheduler",
            "priority": 0,
        },
        "status": {
            "phase": phase,
            "conditions": [
                {"type": "Ready", "status": "True" if running else "False", "lastTransitionTime": now}
            ],
            "hostIP": "127.0.0.1",
            "podIP": "10.244.0.10",
            "startTime": now,
            "containerStatuses": [
                {
                    "name": c,
                    "ready": running,
                    "restartCount": 0,
                    "image": f"registry.example/{c}:1.0",
                    "imageID": "",
                    "containerID": "containerd://" + uuid.uuid4().hex,
                    "started": running,
                    "state": {"running": {"startedAt": now}} if running else {"terminated": {"exitCode": 0}},
                }
                for c in containers
            ],
            "qosClass": "Burstable",
        },
    }


def make_endpointslice(
    namespace: str,
    service: str,
    endpoints: list[tuple[str, str, bool | None]],
    port: int,
    port_name: str = "",
    *,
    name: str | None = None,
    address_type: str = "",
) -> dict:
    """A discovery.k8s.io/v1 EndpointSlice of ``service`` as the EndpointSlice controller writes it.

    ``endpoints`` are (pod name, address, ready): an empty pod name leaves out the targetRef, ready None
    leaves out the condition (which means ready). ``name`` defaults to "<service>-<5 random chars>";
    ``address_type`` defaults to IPv6 when the first address has a colon, else IPv4.
    """
    if not address_type:
        address_type = "IPv6" if endpoints and ":" in endpoints[0][1] else "IPv4"
    eps = []
    for pod, address, ready in endpoints:
        conditions = {} if ready is None else {"ready": ready, "serving": ready, "terminating": False}
        ep: dict[str, Any] = {"addresses": [address], "conditions": conditions, "nodeName": "node-1"}
        if pod:
            ep["targetRef"] = {"kind": "Pod", "namespace": namespace, "name": pod, "uid": str(uuid.uuid4())}
        eps.append(ep)
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name or f"{service}-{uuid.uuid4().hex[:5]}",
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service, "uid": "svc-uid"}],
        },
        "addressType": address_type,
        "endpoints": eps,
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }
