"""Serve Nodes and Pods through the test suite's fake Kubernetes API server, for benchmarks.

    python bench/fake_kube_apiserver.py INVENTORY.json KUBECONFIG_OUT
    python bench/fake_kube_apiserver.py --realistic NODES PODS KUBECONFIG_OUT

The first form serves a simulator's inventory (`kcms simulate --write-inventory`), so that a
benchmarked `kcms standalone` learns its nodes and pods the production way (paged LIST, then
WATCH) rather than from a file. The second builds NODES nodes and PODS Running pods shaped like a
real cluster's (managedFields, env, probes, volumes, conditions, container statuses: ~5 KiB of JSON
each; nodes with an image list: ~12 KiB), plus 2 % finished or pending pods that a
``status.phase=Running`` field selector leaves out. Pods share their nested parts in memory (the
wire bytes are the same), so 150 000 of them fit in this process.

Prints "ready" once the kubeconfig is written. Then, in the second form only, it reads commands on
stdin, one per line:

- ``churn K``: relabel K Running pods (K watch MODIFIED events), then print ``done K``;
- ``stats``: print one JSON line: bytes and requests served to LISTs and WATCH events sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import trustme

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fakeapi import FakeKubeAPI  # noqa: E402

TS = "2026-11-01T10:00:00Z"


def _fields(*paths: str) -> dict:
    """A managedFields fieldsV1 tree: {"f:a": {"f:b": {}}} for "a.b" (as the API server writes it)."""
    root: dict = {}
    for p in paths:
        d = root
        for part in p.split("."):
            d = d.setdefault(part if part.startswith(("k:", "v:", ".")) else f"f:{part}", {})
    return root


_ENV = [
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
    {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}},
    {"name": "LOG_LEVEL", "value": "info"},
    {"name": "HTTP_PORT", "value": "8080"},
    {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector.observability:4318"},
    {"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}},
    {"name": "GOMAXPROCS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}}},
]


def _container(name: str, image: str) -> dict:
    probe = {
        "httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
        "initialDelaySeconds": 5,
        "timeoutSeconds": 1,
        "periodSeconds": 10,
        "successThreshold": 1,
        "failureThreshold": 3,
    }
    return {
        "name": name,
        "image": image,
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "env": _ENV,
        "resources": {"limits": {"cpu": "1", "memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
        "volumeMounts": [
            {"name": "config", "readOnly": True, "mountPath": "/etc/app"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "kube-api-access", "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ],
        "livenessProbe": probe,
        "readinessProbe": probe,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
        },
    }


_MANAGED = [
    {
        "manager": "kube-controller-manager",
        "operation": "Update",
        "apiVersion": "v1",
        "time": TS,
        "fieldsType": "FieldsV1",
        "fieldsV1": _fields(
            "metadata.generateName", "metadata.labels..", "metadata.labels.app",
            "metadata.labels.pod-template-hash", "metadata.labels.app.kubernetes.io/name",
            "metadata.annotations..", "metadata.annotations.prometheus.io/scrape",
            "metadata.ownerReferences..", "spec.containers.k:{\"name\":\"app\"}.env..",
            "spec.containers.k:{\"name\":\"app\"}.image", "spec.containers.k:{\"name\":\"app\"}.livenessProbe.httpGet.path",
            "spec.containers.k:{\"name\":\"app\"}.resources.limits.cpu",
            "spec.containers.k:{\"name\":\"app\"}.volumeMounts..",
            "spec.containers.k:{\"name\":\"proxy\"}.image", "spec.dnsPolicy", "spec.enableServiceLinks",
            "spec.restartPolicy", "spec.schedulerName", "spec.securityContext.fsGroup",
            "spec.serviceAccount", "spec.serviceAccountName", "spec.terminationGracePeriodSeconds",
            "spec.volumes.k:{\"name\":\"config\"}.configMap.name", "spec.volumes.k:{\"name\":\"tmp\"}.emptyDir",
        ),
    },
    {
        "manager": "kubelet",
        "operation": "Update",
        "apiVersion": "v1",
        "time": TS,
        "fieldsType": "FieldsV1",
        "fieldsV1": _fields(
            "status.conditions.k:{\"type\":\"ContainersReady\"}.lastTransitionTime",
            "status.conditions.k:{\"type\":\"Initialized\"}.status",
            "status.conditions.k:{\"type\":\"PodReadyToStartContainers\"}.status",
            "status.conditions.k:{\"type\":\"Ready\"}.status", "status.containerStatuses", "status.hostIP",
            "status.hostIPs", "status.phase", "status.podIP", "status.podIPs..", "status.startTime",
        ),
        "subresource": "status",
    },
]

_SPEC_SHARED = {
    "volumes": [
        {"name": "config", "configMap": {"name": "app-config", "defaultMode": 420}},
        {"name": "tmp", "emptyDir": {}},
        {
            "name": "kube-api-access",
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ],
                "defaultMode": 420,
            },
        },
    ],
    "restartPolicy": "Always",
    "terminationGracePeriodSeconds": 30,
    "dnsPolicy": "ClusterFirst",
    "serviceAccountName": "app",
    "serviceAccount": "app",
    "securityContext": {"fsGroup": 2000},
    "schedulerName": "default-scheduler",
    "tolerations": [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    ],
    "priority": 0,
    "enableServiceLinks": True,
    "preemptionPolicy": "PreemptLowerPriority",
}


def _status_shared(app: str, phase: str) -> dict:
    running = phase == "Running"
    cond = [
        {"type": t, "status": "True" if running or t == "PodScheduled" else "False", "lastProbeTime": None,
         "lastTransitionTime": TS}
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]  # fmt: skip
    statuses = [
        {
            "name": c,
            "state": {"running": {"startedAt": TS}} if running else {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": TS, "finishedAt": TS}},
            "lastState": {},
            "ready": running,
            "restartCount": 0,
            "image": f"registry.example/{app}/{c}:1.4.2",
            "imageID": f"registry.example/{app}/{c}@sha256:{hashlib.sha256(c.encode()).hexdigest()}",
            "containerID": f"containerd://{hashlib.sha256(app.encode() + c.encode()).hexdigest()}",
            "started": running,
        }
        for c in ("app", "proxy")
    ]  # fmt: skip
    return {"phase": phase, "conditions": cond, "containerStatuses": statuses, "qosClass": "Burstable", "startTime": TS}


def realistic_pod(i: int, node: str, node_ip: str, phase: str = "Running") -> dict:
    app = f"svc-{i // 10 % 1500}"
    ns = f"team-{i // 10 % 60}"
    template_hash = hashlib.blake2b(app.encode(), digest_size=5).hexdigest()
    containers = _CONTAINERS.setdefault(app, [_container("app", f"registry.example/{app}/app:1.4.2"),
                                              _container("proxy", "registry.example/envoy:1.30.1")])  # fmt: skip
    status = dict(_STATUS.setdefault((app, phase), _status_shared(app, phase)))
    status.update(hostIP=node_ip, hostIPs=[{"ip": node_ip}], podIP=f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
    status["podIPs"] = [{"ip": status["podIP"]}]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": f"{app}-{template_hash}-{i:06x}",
            "generateName": f"{app}-{template_hash}-",
            "namespace": ns,
            "uid": str(uuid.UUID(int=i + (1 << 100))),
            "creationTimestamp": TS,
            "labels": {
                "app": app,
                "app.kubernetes.io/name": app,
                "app.kubernetes.io/instance": f"{app}-prod",
                "app.kubernetes.io/version": "1.4.2",
                "app.kubernetes.io/component": "backend",
                "app.kubernetes.io/part-of": ns,
                "helm.sh/chart": f"{app}-0.3.1",
                "pod-template-hash": template_hash,
            },
            "annotations": {
                "kubectl.kubernetes.io/restartedAt": TS,
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "8080",
                "checksum/config": hashlib.sha256(app.encode()).hexdigest(),
            },
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{app}-{template_hash}",
                 "uid": str(uuid.UUID(int=hash(app) & (2**128 - 1))), "controller": True, "blockOwnerDeletion": True}
            ],  # fmt: skip
            "managedFields": _MANAGED,
        },
        "spec": {**_SPEC_SHARED, "containers": containers, "nodeName": node},
        "status": status,
    }


_CONTAINERS: dict[str, list] = {}
_STATUS: dict[tuple[str, str], dict] = {}


def realistic_node(i: int) -> dict:
    name = f"node-{i:05d}"
    ip = f"127.{60 + i // 65536}.{i // 256 % 256}.{i % 256}"
    images = [
        {"names": [f"registry.example/svc-{k}/app@sha256:{hashlib.sha256(str(k).encode()).hexdigest()}",
                   f"registry.example/svc-{k}/app:1.4.2"], "sizeBytes": 50_000_000 + k}
        for k in range(i % 7, 30 + i % 7)
    ]  # fmt: skip
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": str(uuid.UUID(int=i + (1 << 90))),
            "creationTimestamp": TS,
            "labels": {
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "m6i.2xlarge",
                "topology.kubernetes.io/zone": f"zone-{'abc'[i % 3]}",
                "topology.kubernetes.io/region": "region-1",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24", "providerID": f"aws:///zone/i-{i:017x}"},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"},
            "allocatable": {"cpu": "7910m", "memory": "31Gi", "pods": "110", "ephemeral-storage": "95Gi"},
            "conditions": [
                {"type": t, "status": "True" if t == "Ready" else "False", "lastHeartbeatTime": TS,
                 "lastTransitionTime": TS, "reason": f"Kubelet{t}", "message": f"kubelet {t}"}
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
            ],  # fmt: skip
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.32.0", "containerRuntimeVersion": "containerd://1.7.13",
                         "osImage": "Debian GNU/Linux 12 (bookworm)", "kernelVersion": "6.1.0",
                         "operatingSystem": "linux", "architecture": "amd64"},  # fmt: skip
            "images": images,
        },
    }


def realistic_objects(nodes: int, pods: int) -> list[dict]:
    """NODES nodes, PODS Running pods spread over them, and 2 % more pods not Running."""
    out = [realistic_node(i) for i in range(nodes)]
    ips = [n["status"]["addresses"][0]["address"] for n in out]
    for i in range(pods):
        out.append(realistic_pod(i, f"node-{i % nodes:05d}", ips[i % nodes]))
    for j in range(pods // 50):
        i = pods + j
        out.append(realistic_pod(i, f"node-{i % nodes:05d}", ips[i % nodes], "Succeeded" if j % 2 else "Pending"))
    return out


class _Counting:
    """Counts what the fake server sends: LIST bodies and WATCH events (wrapping its methods)."""

    def __init__(self, fake: FakeKubeAPI) -> None:
        self.list_bytes = self.list_requests = self.watch_events = 0
        inner_list, inner_event = fake._list, fake._event_for

        def counting_list(*a: Any, **kw: Any) -> Any:
            resp = inner_list(*a, **kw)
            self.list_requests += 1
            self.list_bytes += len(resp.body)
            return resp

        def counting_event(*a: Any, **kw: Any) -> Any:
            ev = inner_event(*a, **kw)
            self.watch_events += ev is not None
            return ev

        fake._list, fake._event_for = counting_list, counting_event  # type: ignore[method-assign]


async def _commands(fake: FakeKubeAPI, counts: _Counting) -> None:
    loop = asyncio.get_running_loop()
    generation = 0
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        cmd = line.split()
        if cmd[:1] == ["churn"]:
            generation += 1
            k = int(cmd[1])
            pods = [p for p in fake.objects("pods") if p["status"].get("phase") == "Running"][:k]
            for p in pods:
                p = {**p, "metadata": {**p["metadata"], "labels": {**p["metadata"]["labels"], "churn": str(generation)}}}
                fake.upsert(p)
            print(f"done {len(pods)}", flush=True)
        elif cmd[:1] == ["stats"]:
            print(orjson.dumps(vars(counts)).decode(), flush=True)


async def main(objects: list[dict], kubeconfig: str, commands: bool = False) -> None:
    fake = FakeKubeAPI(trustme.CA(), history_limit=1_000_000)
    for obj in objects:
        fake.upsert(obj)
    counts = _Counting(fake)
    async with fake:
        fake.write_kubeconfig(kubeconfig)
        print("ready", flush=True)
        if commands and sys.stdin is not None:
            await _commands(fake, counts)
        await asyncio.Event().wait()  # serve until killed


if __name__ == "__main__":
    if sys.argv[1:2] == ["--realistic"]:
        objs = realistic_objects(int(sys.argv[2]), int(sys.argv[3]))
        asyncio.run(main(objs, sys.argv[4], commands=True))
    else:
        asyncio.run(main(orjson.loads(Path(sys.argv[1]).read_bytes())["items"], sys.argv[2]))
