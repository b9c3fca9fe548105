"""Kubernetes Node and Pod objects (v1 JSON) that describe a simulated cluster."""

from __future__ import annotations

import random
import uuid

from kcms.sim.workload import SimNode, SimPod, rfc3339

KUBELET_VERSION = "v1.29.4"


def _uid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def node_object(node: SimNode) -> dict:
    """A full v1 Node object for ``node``."""
    zone = f"sim-zone-{'abc'[node.index % 3]}"
    created = rfc3339(node.created)
    heartbeat = rfc3339(node.start_time)
    conditions = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": node.name,
            "uid": node.uid,
            "resourceVersion": str(1000 + node.index),
            "creationTimestamp": created,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "sim.large",
                "topology.kubernetes.io/zone": zone,
                "topology.kubernetes.io/region": "sim-region",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "podCIDR": f"10.244.{node.index % 256}.0/24",
            "podCIDRs": [f"10.244.{node.index % 256}.0/24"],
            "providerID": f"sim://{node.name}",
        },
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"},
            "allocatable": {"cpu": "7800m", "memory": "31Gi", "pods": "110", "ephemeral-storage": "95Gi"},
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "lastHeartbeatTime": heartbeat,
                    "lastTransitionTime": heartbeat,
                    "reason": r,
                    "message": m,
                }
                for t, s, r, m in conditions
            ],
            "addresses": [
                {"type": "InternalIP", "address": node.address},
                {"type": "Hostname", "address": node.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": node.port}},
            "nodeInfo": {
                "machineID": node.uid.replace("-", ""),
                "systemUUID": node.uid,
                "bootID": node.uid,
                "kernelVersion": "6.1.0-sim",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.13",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def pod_object(
    *,
    namespace: str,
    name: str,
    uid: str,
    app: str,
    node: SimNode | None,
    containers: list[str],
    phase: str,
    created: float,
    started: float | None,
    index: int,
) -> dict:
    """A full v1 Pod object."""
    template_hash = name.split("-")[-2] if name.count("-") >= 2 else "0"
    running = phase == "Running"
    meta = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "resourceVersion": str(5000 + index),
        "creationTimestamp": rfc3339(created),
        "labels": {"app": app, "pod-template-hash": template_hash},
    }
    spec: dict = {
        "containers": [
            {
                "name": c,
                "image": f"registry.example/{app}/{c}:1.0",
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            }
            for c in containers
        ],
        "restartPolicy": "Always" if phase != "Succeeded" else "Never",
        "schedulerName": "default-scheduler",
    }
    status: dict = {"phase": phase, "qosClass": "Burstable"}
    if node is not None:
        spec["nodeName"] = node.name
        status["hostIP"] = node.address
        status["hostIPs"] = [{"ip": node.address}]
        status["podIP"] = f"10.244.{node.index % 256}.{index % 250 + 2}"
    if started is not None:
        status["startTime"] = rfc3339(started)
    ready = "True" if running else "False"
    status["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "True" if node else "False",
            "lastTransitionTime": rfc3339(created),
        },
        {"type": "Ready", "status": ready, "lastTransitionTime": rfc3339(started or created)},
    ]
    if started is not None:
        if running:
            state = {"running": {"startedAt": rfc3339(started)}}
        else:
            state = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": rfc3339(started)}}
        status["containerStatuses"] = [
            {
                "name": c,
                "ready": running,
                "restartCount": 0,
                "image": f"registry.example/{app}/{c}:1.0",
                "containerID": f"containerd://{uuid.uuid5(uuid.NAMESPACE_OID, uid + c).hex}",
                "started": running,
                "state": state,
            }
            for c in containers
        ]
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": status}


def _running_pod(pod: SimPod, node: SimNode, index: int) -> dict:
    return pod_object(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        app=pod.app,
        node=node,
        containers=[c.name for c in pod.containers],
        phase="Running",
        created=pod.start_time - 2,
        started=pod.start_time,
        index=index,
    )


def inventory_objects(nodes: list[SimNode], *, seed: int, non_running_pods: bool) -> list[dict]:
    """Every Node, then every Pod, of the simulated cluster.

    With ``non_running_pods``, each node also has a finished job pod (``Succeeded``), and a
    few unscheduled ``Pending`` pods exist; kubelets do not report those.
    """
    out = [node_object(n) for n in nodes]
    index = 0
    for n in nodes:
        for p in n.pods:
            out.append(_running_pod(p, n, index))
            index += 1
    if non_running_pods:
        rng = random.Random(f"{seed}/non-running")
        for n in nodes:
            t = n.start_time + 600
            out.append(
                pod_object(
                    namespace="default",
                    name=f"report-job-{n.index}-{rng.randrange(10**5):05d}",
                    uid=_uid(rng),
                    app="report-job",
                    node=n,
                    containers=["report"],
                    phase="Succeeded",
                    created=t,
                    started=t + 1,
                    index=index,
                )
            )
            index += 1
        for k in range(max(1, len(nodes) // 10)):
            out.append(
                pod_object(
                    namespace="team-a",
                    name=f"pending-{k}-{rng.randrange(10**5):05d}",
                    uid=_uid(rng),
                    app="pending",
                    node=None,
                    containers=["app"],
                    phase="Pending",
                    created=nodes[0].start_time + 60,
                    started=None,
                    index=index,
                )
            )
            index += 1
    return out
