"""Shared pieces of the remote-write tests (tests/test_remote_write.py, tests/test_security_remote_write.py):
the RBAC table the fake API's SubjectAccessReviews are decided by (tests/_rbac.py), the tokens its
TokenReview knows, and an in-process aggregated API server over real TLS with the custom and
external metrics APIs, the push API and ``POST /api/v1/write`` installed as ``kcms server`` does.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _rbac as rbac
import aiohttp
import pytest
from fakeobjects import make_node, make_pod
from prometheus_client import REGISTRY

from kcms.apis.custom import CustomMetricsAPI
from kcms.apis.external import ExternalMetricsAPI
from kcms.apis.objects import ObjectLabels
from kcms.apis.provider import StoreProvider
from kcms.apis.push import PushAPI, PushLimits
from kcms.apis.remote_write import REMOTE_WRITE_PATH, RemoteWriteAPI, SeriesBinder
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions
from kcms.kube.client import KubeClient
from kcms.kube.reviews import AccessReviewer, TokenReviewer
from kcms.sources.remote_write import WriteLimits
from kcms.store.series import SeriesStore

WRITER = "system:serviceaccount:monitoring:prometheus"
HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
TOKENS = {  # token -> TokenReview user
    "writer-token": {"username": WRITER, "uid": "1", "groups": ["system:serviceaccounts"]},
    "other-token": {"username": "system:serviceaccount:team-a:agent", "uid": "2"},
    "nobody-token": {"username": "system:serviceaccount:x:nobody", "uid": "3"},
    "hpa-token": {"username": HPA_USER, "uid": "4"},
    "admin-token": {"username": "kubernetes-admin", "uid": "5", "groups": ["system:masters"]},
}
NAMESPACES = ("default", "team-a")
NODES = ("node-1", "node-2")


def _binding(kind: str, name: str, ns: str | None, role_kind: str, role: str, subjects: list) -> dict:
    meta = {"name": name} if ns is None else {"name": name, "namespace": ns}
    return {
        "kind": kind,
        "metadata": meta,
        "roleRef": {"kind": role_kind, "name": role},
        "subjects": subjects,
    }


def _sa(ns: str, name: str) -> dict[str, str]:
    return {"kind": "ServiceAccount", "namespace": ns, "name": name}


RBAC = [
    # what a Prometheus writing to KCMS needs: the push grant, per namespace (docs/remote-write.md)
    {
        "kind": "ClusterRole",
        "metadata": {"name": "kcms-remote-writer"},
        "rules": [
            {"apiGroups": ["custom.metrics.k8s.io"], "resources": ["*"], "verbs": ["create"]},
            {"apiGroups": ["external.metrics.k8s.io"], "resources": ["*"], "verbs": ["create"]},
        ],
    },
    # bound in "default" only: the writer may not write team-a's metrics
    _binding("RoleBinding", "rw", "default", "ClusterRole", "kcms-remote-writer", [_sa("monitoring", "prometheus")]),
    # node metrics are cluster-scoped: a ClusterRoleBinding to a role naming nodes only
    {
        "kind": "ClusterRole",
        "metadata": {"name": "kcms-node-metrics-writer"},
        "rules": [{"apiGroups": ["custom.metrics.k8s.io"], "resources": ["nodes/temperature", "nodes/node_temperature_celsius"], "verbs": ["create"]}],  # RBAC has no "nodes/*"
    },
    _binding("ClusterRoleBinding", "rw-nodes", None, "ClusterRole", "kcms-node-metrics-writer",
             [_sa("monitoring", "prometheus")]),
    # team-a's own agent writes team-a only
    _binding("RoleBinding", "agent", "team-a", "ClusterRole", "kcms-remote-writer", [_sa("team-a", "agent")]),
    # the HPA controller reads everything
    {
        "kind": "ClusterRole",
        "metadata": {"name": "metrics-reader"},
        "rules": [
            {"apiGroups": ["custom.metrics.k8s.io", "external.metrics.k8s.io"], "resources": ["*"],
             "verbs": ["get", "list"]},
            {"nonResourceURLs": ["/apis", "/apis/*"], "verbs": ["get"]},
        ],
    },
    _binding("ClusterRoleBinding", "hpa", None, "ClusterRole", "metrics-reader",
             [_sa("kube-system", "horizontal-pod-autoscaler")]),
]  # fmt: skip


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def setup_fake(fake: Any, pods: list[tuple[str, str, str]] | None = None) -> None:
    """Tokens, RBAC and objects (pods as ``(namespace, name, node)``) in the fake API."""
    fake.authorize = rbac.authorizer(RBAC)
    fake.tokens.update(TOKENS)
    for node in NODES:
        fake.upsert(make_node(node))
    for ns, name, node in pods or [(ns, f"web-{i}", NODES[i % 2]) for ns in NAMESPACES for i in range(3)]:
        fake.upsert(make_pod(ns, name, node, labels={"app": name.rsplit("-", 1)[0]}))


@dataclass
class Stack:
    server: AggregatedAPIServer
    api: RemoteWriteAPI
    push: PushAPI
    store: SeriesStore
    fake: Any
    ctx: ssl.SSLContext
    kube: KubeClient

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    async def post(
        self,
        body: bytes,
        token: str | None = "writer-token",
        headers: dict[str, str] | None = None,
        method: str = "POST",
    ) -> tuple[int, dict[str, str], bytes]:
        hdrs = {
            "Content-Type": "application/x-protobuf",
            "Content-Encoding": "snappy",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
            **(headers or {}),
        }
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.request(
                method, self.url + REMOTE_WRITE_PATH, data=body, headers=hdrs, ssl=self.ctx
            ) as r:
                return r.status, dict(r.headers), await r.read()

    async def ready(self) -> bool:
        async with aiohttp.ClientSession() as s:
            async with s.get(self.url + "/readyz", ssl=self.ctx) as r:
                return r.status == 200

    def values(self, metric: str, resource: str, namespace: str, name: str = "") -> list[tuple[tuple, float]]:
        """``(labels, latest value)`` of the stored series of ``metric`` about one object (external:
        ``resource`` and ``name`` empty)."""
        names = None if not resource else [name]
        return [(r.labels, r.value) for r in self.store.query(resource, namespace, names, metric)]


async def start_stack(
    fake: Any, tmp: Path, *, limits: WriteLimits | None = None, push_limits: PushLimits | None = None
) -> Stack:
    setup_fake(fake)
    kube = await KubeClient.load(str(fake.kubeconfig))
    store = SeriesStore()
    objects = ObjectLabels(kube=kube)
    provider = StoreProvider(store, objects.namespaced)
    server = AggregatedAPIServer(
        ServingOptions(secure_port=0, bind_address="127.0.0.1", cert_dir=str(tmp / "certs")),
        AuthnOptions(skip_lookup=True, token_reviewer=TokenReviewer(kube)),
        AuthzOptions(access_reviewer=AccessReviewer(kube)),
    )
    for gv in CustomMetricsAPI([provider], objects).group_versions():
        server.install(gv)
    server.install(ExternalMetricsAPI([provider]).group_version())
    push = PushAPI(store, push_limits)
    push.install(server)
    lim = limits or WriteLimits()
    api = RemoteWriteAPI(store, lim, binder=SeriesBinder(max_labels=lim.max_labels), quota=push.quota)
    api.install(server)
    await server.start()
    ctx = ssl.create_default_context(cafile=server.serving_cert_file)
    return Stack(server, api, push, store, fake, ctx, kube)


@pytest.fixture(name="clean_log")
def clean_log_fixture(caplog: pytest.LogCaptureFixture):
    """No traceback and no exception record from KCMS's own code in the log."""
    caplog.set_level(logging.INFO)
    yield caplog
    for record in caplog.records:
        if record.name.startswith("kcms"):
            assert record.exc_info is None, record.getMessage()
    assert "Traceback" not in caplog.text


@pytest.fixture(name="stack")
async def stack_fixture(ca, fake_kube, tmp_path):
    s = await start_stack(fake_kube, tmp_path)
    try:
        yield s
    finally:
        await s.server.stop()
        await s.kube.close()
