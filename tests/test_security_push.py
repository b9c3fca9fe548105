"""The metric push (POST /push/v1/samples) against hostile writers.

A real aggregated API server over TLS with the custom and external metrics APIs and the push
endpoint; authentication (TokenReview) and authorization (SubjectAccessReview) are delegated to the
fake Kubernetes API, which decides reviews from the small RBAC table below by RBAC's rules
(tests/_rbac.py). Reads go through the real API as the HPA controller's ServiceAccount, with
``kubectl get --raw``. Every test checks that the attack is refused with the right reason, that the
other tenants' data is unchanged, that the server stays ready and that no traceback is logged.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _rbac as rbac
import aiohttp
import orjson
import pytest
from _kubectl import KUBECTL, get_raw
from fakeobjects import make_pod
from prometheus_client import REGISTRY

from kcms.apis.custom import CustomMetricsAPI
from kcms.apis.external import ExternalMetricsAPI
from kcms.apis.objects import ObjectLabels
from kcms.apis.provider import StoreProvider
from kcms.apis.push import PUSH_PATH, PushAPI, PushLimits
from kcms.apis.quota import SeriesQuota
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions
from kcms.kube.client import KubeClient
from kcms.kube.reviews import AccessReviewer, TokenReviewer
from kcms.quantity import parse_quantity
from kcms.store.series import SeriesStore

HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
TOKENS = {  # token -> TokenReview user
    "a-token": {
        "username": "system:serviceaccount:a:reporter",
        "uid": "1",
        "groups": ["system:serviceaccounts"],
    },
    "b-token": {
        "username": "system:serviceaccount:b:reporter",
        "uid": "2",
        "groups": ["system:serviceaccounts"],
    },
    "narrow-token": {"username": "system:serviceaccount:a:narrow", "uid": "3"},
    "legacy-token": {"username": "system:serviceaccount:legacy:pusher", "uid": "4"},
    "hpa-token": {"username": HPA_USER, "uid": "5"},
    "admin-token": {"username": "kubernetes-admin", "uid": "6", "groups": ["system:masters"]},
}


def _sa(ns: str, name: str) -> dict[str, str]:
    return {"kind": "ServiceAccount", "namespace": ns, "name": name}


def _pusher_role(ns: str) -> dict[str, Any]:
    return {
        "kind": "Role",
        "metadata": {"name": "pusher", "namespace": ns},
        "rules": [
            {
                "apiGroups": ["custom.metrics.k8s.io"],
                "resources": [
                    "pods/queue_depth",
                    "deployments.apps/queue_depth",
                    "pods/jobs_total",
                    "pods/jobs_per_second",
                ],
                "verbs": ["create"],
            },
            {"apiGroups": ["external.metrics.k8s.io"], "resources": ["queue_backlog"], "verbs": ["create"]},
        ],
    }


def _binding(kind: str, name: str, ns: str | None, role_kind: str, role: str, subjects: list) -> dict:
    meta = {"name": name} if ns is None else {"name": name, "namespace": ns}
    return {
        "kind": kind,
        "metadata": meta,
        "roleRef": {"kind": role_kind, "name": role},
        "subjects": subjects,
    }


RBAC = [
    # each namespace's reporter may push its own namespace's metrics
    _pusher_role("a"),
    _binding("RoleBinding", "pusher", "a", "Role", "pusher", [_sa("a", "reporter")]),
    _pusher_role("b"),
    _binding("RoleBinding", "pusher", "b", "Role", "pusher", [_sa("b", "reporter")]),
    # a:narrow may push queue_depth of the pod pod-1 only
    {
        "kind": "Role",
        "metadata": {"name": "narrow", "namespace": "a"},
        "rules": [
            {
                "apiGroups": ["custom.metrics.k8s.io"],
                "resources": ["pods/queue_depth"],
                "resourceNames": ["pod-1"],
                "verbs": ["create"],
            }
        ],
    },
    _binding("RoleBinding", "narrow", "a", "Role", "narrow", [_sa("a", "narrow")]),
    # the legacy grant: post on the push path
    {
        "kind": "ClusterRole",
        "metadata": {"name": "legacy-pusher"},
        "rules": [{"nonResourceURLs": [PUSH_PATH], "verbs": ["post"]}],
    },
    _binding("ClusterRoleBinding", "legacy-pusher", None, "ClusterRole", "legacy-pusher", [_sa("legacy", "pusher")]),
    # the HPA controller reads custom and external metrics everywhere; everyone may discover
    {
        "kind": "ClusterRole",
        "metadata": {"name": "metrics-reader"},
        "rules": [
            {
                "apiGroups": ["custom.metrics.k8s.io", "external.metrics.k8s.io"],
                "resources": ["*"],
                "verbs": ["get", "list"],
            },
            {"nonResourceURLs": ["/apis", "/apis/*"], "verbs": ["get"]},
        ],
    },
    _binding(
        "ClusterRoleBinding", "hpa", None, "ClusterRole", "metrics-reader", [_sa("kube-system", "horizontal-pod-autoscaler")]
    ),
]  # fmt: skip


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@dataclass
class Stack:
    server: AggregatedAPIServer
    api: PushAPI
    store: SeriesStore
    fake: Any
    ctx: ssl.SSLContext
    kubeconfig: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    async def post(
        self, body: Any, token: str | None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        async with aiohttp.ClientSession() as s:
            async with s.post(self.url + PUSH_PATH, data=data, headers=hdrs, ssl=self.ctx) as r:
                return r.status, await r.json(content_type=None)

    async def push(self, token: str, samples: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
        status, answer = await self.post({"samples": samples}, token, **kw)
        assert status == 200, answer
        return answer

    async def ready(self) -> bool:
        async with aiohttp.ClientSession() as s:
            async with s.get(self.url + "/readyz", ssl=self.ctx) as r:
                return r.status == 200

    def reviews(self) -> list[dict[str, Any]]:
        return [r["spec"] for r in self.fake.access_reviews]


def write_kubeconfig(path: Path, port: int, ca_file: str, token: str) -> Path:
    """A kubeconfig for kubectl: this server, its serving certificate as the CA, a bearer token."""
    ca_data = base64.b64encode(Path(ca_file).read_bytes()).decode()
    cluster = {"server": f"https://127.0.0.1:{port}", "certificate-authority-data": ca_data}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kcms", "cluster": cluster}],
        "users": [{"name": "hpa", "user": {"token": token}}],
        "contexts": [{"name": "kcms", "context": {"cluster": "kcms", "user": "hpa"}}],
        "current-context": "kcms",
    }
    path.write_text(json.dumps(doc))
    return path


async def start_stack(
    fake: Any,
    tmp: Path,
    *,
    limits: PushLimits | None = None,
    allow_nonresource_grant: bool = False,
    allow_anonymous: bool = False,
) -> tuple[Stack, Any]:
    fake.authorize = rbac.authorizer(RBAC)
    fake.tokens.update(TOKENS)
    for ns in ("a", "b"):
        for name in ("worker-1", "worker-2"):
            fake.upsert(make_pod(ns, name, "node-1", labels={"app": "worker"}))
    kube = await KubeClient.load(str(fake.kubeconfig))
    store = SeriesStore()
    objects = ObjectLabels(kube=kube)
    provider = StoreProvider(store, objects.namespaced)
    server = AggregatedAPIServer(
        ServingOptions(secure_port=0, bind_address="127.0.0.1", cert_dir=str(tmp / "certs")),
        AuthnOptions(skip_lookup=True, token_reviewer=TokenReviewer(kube), allow_anonymous=allow_anonymous),
        AuthzOptions(access_reviewer=AccessReviewer(kube)),
    )
    for gv in CustomMetricsAPI([provider], objects).group_versions():
        server.install(gv)
    server.install(ExternalMetricsAPI([provider]).group_version())
    push = PushAPI(store, limits, allow_nonresource_grant=allow_nonresource_grant)
    push.install(server)
    await server.start()
    ctx = ssl.create_default_context(cafile=server.serving_cert_file)
    kubeconfig = write_kubeconfig(tmp / "hpa.kubeconfig", server.port, server.serving_cert_file, "hpa-token")
    return Stack(server, push, store, fake, ctx, kubeconfig), kube


@pytest.fixture
async def stack(ca, fake_kube, tmp_path):
    s, kube = await start_stack(fake_kube, tmp_path)
    try:
        yield s
    finally:
        await s.server.stop()
        await kube.close()


@pytest.fixture(autouse=True)
def clean_log(caplog: pytest.LogCaptureFixture):
    """Every test here: no traceback and no ERROR from KCMS's own code in the log."""
    caplog.set_level(logging.INFO)
    yield
    for record in caplog.records:
        if record.name.startswith("kcms"):
            assert record.exc_info is None, record.getMessage()
    assert "Traceback" not in caplog.text


def hpa_reads(stack: Stack, ns: str) -> dict[str, Any]:
    """What an HPA in ``ns`` reads, through the real API with kubectl (Pods, Object, External)."""
    raw = get_raw(stack.kubeconfig)
    pods = raw(
        f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/queue_depth?labelSelector=app%3Dworker"
    )
    obj = raw(f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/deployments.apps/worker/queue_depth")
    ext = raw(f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/queue_backlog")
    return {
        "pods": sorted(
            (i["describedObject"]["name"], float(parse_quantity(i["value"]))) for i in pods["items"]
        ),
        "object": [float(parse_quantity(i["value"])) for i in obj["items"]],
        "external": sorted(
            (tuple(sorted(i["metricLabels"].items())), float(parse_quantity(i["value"])))
            for i in ext["items"]
        ),
    }


def tenant_samples(ns: str, value: float, ts: float, **extra: Any) -> list[dict[str, Any]]:
    """Samples about every target an HPA in ``ns`` reads."""
    return [
        {"metric": "queue_depth", "resource": "pods", "namespace": ns, "name": "worker-1", "value": value,
         "timestamp": ts, **extra},
        {"metric": "queue_depth", "resource": "pods", "namespace": ns, "name": "worker-2", "value": value,
         "timestamp": ts, **extra},
        {"metric": "queue_depth", "resource": "deployments.apps", "namespace": ns, "name": "worker",
         "value": value, "timestamp": ts, **extra},
        {"metric": "queue_backlog", "namespace": ns, "labels": {"queue": "emails"}, "value": value,
         "timestamp": ts, **extra},
    ]  # fmt: skip


# ---- cross-tenant ------------------------------------------------------------------------------------


@pytest.mark.skipif(KUBECTL is None, reason="kubectl binary not installed")
async def test_a_pusher_of_namespace_a_cannot_change_what_an_hpa_in_b_reads(stack: Stack) -> None:
    now = time.time()
    answer = await stack.push("b-token", tenant_samples("b", 5.0, now - 30))
    assert answer["accepted"] == 4, answer
    before = await asyncio.to_thread(hpa_reads, stack, "b")
    assert before == {
        "pods": [("worker-1", 5.0), ("worker-2", 5.0)],
        "object": [5.0],
        "external": [((("queue", "emails"),), 5.0)],
    }
    series_before = stack.store.stats()["series"]
    forbidden_before = counter("kcms_push_rejected_total", reason="forbidden")

    # a's reporter writes newer, huge values about b's targets, a new series in b, and its own data;
    # with impersonation and front-proxy identity headers it has no right to use
    hostile = tenant_samples("b", 1e9, now - 1) + [
        {"metric": "queue_backlog", "namespace": "b", "labels": {"queue": "new"}, "value": 1e9},
        {"metric": "queue_depth", "resource": "pods", "namespace": "a", "name": "worker-1", "value": 3},
    ]
    spoof = {"Impersonate-User": "system:serviceaccount:b:reporter", "X-Remote-User": "system:serviceaccount:b:reporter",
             "X-Remote-Group": "system:masters", "Impersonate-Group": "system:masters"}  # fmt: skip
    for headers in ({}, spoof):
        answer = await stack.push("a-token", hostile, headers=headers)
        assert answer["accepted"] == 1 and answer["rejected"] == {"forbidden": 5}, answer
        assert [e["index"] for e in answer["errors"]] == [0, 1, 2, 3, 4]
        assert answer["errors"][0]["message"] == (
            'User "system:serviceaccount:a:reporter" cannot create resource "pods/queue_depth" in API group '
            '"custom.metrics.k8s.io" in the namespace "b"'
        )
    assert counter("kcms_push_rejected_total", reason="forbidden") == forbidden_before + 10

    after = await asyncio.to_thread(hpa_reads, stack, "b")
    assert after == before
    assert stack.store.stats()["series"] == series_before + 1  # a's own pod series only
    raw = get_raw(stack.kubeconfig)
    mine = await asyncio.to_thread(
        raw, "/apis/custom.metrics.k8s.io/v1beta2/namespaces/a/pods/worker-1/queue_depth"
    )
    assert [parse_quantity(i["value"]) for i in mine["items"]] == [3]
    # every review was about the sender from its token, never about a header
    writes = [r for r in stack.reviews() if r.get("resourceAttributes", {}).get("verb") == "create"]
    assert {r["user"] for r in writes} == {
        "system:serviceaccount:b:reporter",
        "system:serviceaccount:a:reporter",
    }
    assert all("system:masters" not in r.get("groups", []) for r in writes)
    assert await stack.ready()


async def test_reviews_carry_the_attributes_of_a_read_with_the_write_verb(stack: Stack) -> None:
    await stack.push("b-token", tenant_samples("b", 1.0, time.time() - 5))
    attrs = sorted((r["resourceAttributes"] for r in stack.reviews()), key=lambda a: sorted(a.items()))
    assert attrs == sorted(
        [
            {"namespace": "b", "verb": "create", "group": "custom.metrics.k8s.io", "resource": "pods",
             "subresource": "queue_depth", "name": "worker-1"},
            {"namespace": "b", "verb": "create", "group": "custom.metrics.k8s.io", "resource": "pods",
             "subresource": "queue_depth", "name": "worker-2"},
            {"namespace": "b", "verb": "create", "group": "custom.metrics.k8s.io", "resource": "deployments.apps",
             "subresource": "queue_depth", "name": "worker"},
            {"namespace": "b", "verb": "create", "group": "external.metrics.k8s.io", "resource": "queue_backlog"},
        ],
        key=lambda a: sorted(a.items()),
    )  # fmt: skip
    assert all(r["user"] == "system:serviceaccount:b:reporter" for r in stack.reviews())


async def test_resource_names_narrow_a_grant_to_some_objects(stack: Stack) -> None:
    pod = {"metric": "queue_depth", "resource": "pods", "namespace": "a", "value": 1}
    answer = await stack.push("narrow-token", [{**pod, "name": "pod-1"}, {**pod, "name": "pod-2"}])
    assert answer["accepted"] == 1 and answer["rejected"] == {"forbidden": 1}
    assert answer["errors"][0]["index"] == 1
    assert {r["resourceAttributes"].get("name") for r in stack.reviews()} == {"pod-1", "pod-2"}
    # many names: the "all names" probe is denied, then each name is asked and pod-1 still passes
    stack.fake.access_reviews.clear()
    names = ["pod-1"] + [f"pod-{i}" for i in range(2, 10)]
    answer = await stack.push("narrow-token", [{**pod, "name": n, "value": 2} for n in names])
    assert answer["accepted"] == 1 and answer["rejected"] == {"forbidden": 8}
    asked = sorted(r["resourceAttributes"].get("name", "") for r in stack.reviews())
    assert asked == ["", *sorted(names[2:])]  # pod-1 and pod-2: decided by the reviewer's cache
    assert stack.store.stats()["series"] == 1


async def test_privileged_group_writes_without_a_review(stack: Stack) -> None:
    answer = await stack.push("admin-token", tenant_samples("b", 2.0, time.time() - 5))
    assert answer["accepted"] == 4
    assert stack.reviews() == []  # system:masters is allowed by the server's authorizer itself


async def test_a_literal_series_in_a_does_not_hide_a_derived_metric_read_in_b(stack: Stack) -> None:
    now = time.time()
    pod = {"metric": "jobs_total", "resource": "pods", "namespace": "b", "name": "worker-1"}
    counter_points = [
        {**pod, "value": v, "timestamp": now - 20 + 10 * i} for i, v in enumerate((100, 150, 230))
    ]
    assert (await stack.push("b-token", counter_points))["accepted"] == 3
    path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/b/pods/worker-1/jobs_per_second"

    async def read() -> list[float]:
        headers = {"Authorization": "Bearer hpa-token"}
        async with aiohttp.ClientSession() as s, s.get(stack.url + path, headers=headers, ssl=stack.ctx) as r:
            body = await r.json(content_type=None)
            return [float(parse_quantity(i["value"])) for i in body.get("items", [])]

    assert await read() == [8.0]
    # a's reporter may write jobs_per_second in its own namespace: a literal series of that name
    mine = {"metric": "jobs_per_second", "resource": "pods", "namespace": "a", "name": "worker-1", "value": 1}
    assert (await stack.push("a-token", [mine]))["accepted"] == 1
    assert await read() == [8.0]  # b's HPA still reads b's rate


# ---- authentication ----------------------------------------------------------------------------------


async def test_anonymous_and_unknown_callers_are_unauthorized(stack: Stack, ca, fake_kube, tmp_path) -> None:
    body = {"samples": tenant_samples("a", 1.0, time.time())}
    for token in (None, "not-a-token"):
        status, answer = await stack.post(body, token)
        assert status == 401 and answer["kind"] == "Status" and answer["reason"] == "Unauthorized"
    assert stack.store.stats()["series"] == 0 and stack.reviews() == []

    # even where anonymous requests are enabled (and RBAC would let system:anonymous write), a push
    # has no identity to be bound to: 401
    other, kube = await start_stack(fake_kube, tmp_path / "anon", allow_anonymous=True)
    try:
        fake_kube.authorize = lambda spec: (True, "everything allowed")
        status, answer = await other.post(body, None)
        assert status == 401 and answer["reason"] == "Unauthorized"
        assert other.store.stats()["series"] == 0
        assert await other.ready()
    finally:
        await other.server.stop()
        await kube.close()


async def test_identity_in_the_body_is_refused(stack: Stack) -> None:
    sample = tenant_samples("b", 1.0, time.time())[0]
    for extra in ({"user": "system:serviceaccount:b:reporter"}, {"writer": "x"}):
        status, answer = await stack.post({"samples": [{**sample, **extra}]}, "a-token")
        assert status == 400 and answer["reason"] == "BadRequest" and "unknown field" in answer["message"]
    status, answer = await stack.post({"samples": [sample], "user": "b"}, "a-token")
    assert status == 400 and "unknown field 'user'" in answer["message"]
    assert stack.store.stats()["series"] == 0


@pytest.mark.parametrize(
    "field, value, reason",
    [
        ("metric", "queue_depth/../x", "invalid_metric_name"),  # a slash to pose as another subresource
        ("metric", "q" * 300, "metric_name_too_long"),
        ("resource", "pods/queue_depth", "invalid_object"),  # a resource posing with a subresource
        ("resource", "Pods", "invalid_object"),
        ("namespace", "B", "invalid_object"),  # a case variant of another tenant's namespace
        ("namespace", "b\n", "invalid_object"),
        ("namespace", "ｂ", "invalid_object"),  # a look-alike (full-width b)
        ("name", "../worker-1", "invalid_object"),
        ("name", "worker-1/queue_depth", "invalid_object"),
    ],
)
async def test_malformed_targets_are_refused_without_a_review(
    stack: Stack, field: str, value: str, reason: str
) -> None:
    good = tenant_samples("a", 1.0, time.time() - 5)[0]
    answer = await stack.push("a-token", [{**good, field: value}, good])
    assert answer["accepted"] == 1 and answer["rejected"] == {reason: 1}
    # only the good sample's target was asked about: nothing malformed reaches the API server
    assert [r["resourceAttributes"]["namespace"] for r in stack.reviews()] == ["a"]
    assert "\n" not in json.dumps(answer["errors"][0]["message"]).replace("\\n", "")
    assert await stack.ready()


# ---- the legacy non-resource grant ---------------------------------------------------------------------


async def test_legacy_grant_gives_nothing_without_the_flag(stack: Stack) -> None:
    samples = tenant_samples("a", 1.0, time.time() - 5) + tenant_samples("b", 1.0, time.time() - 5)
    answer = await stack.push("legacy-token", samples)
    assert answer["accepted"] == 0 and answer["rejected"] == {"forbidden": 8}
    assert all("nonResourceAttributes" not in r for r in stack.reviews())  # not even asked
    assert stack.store.stats()["series"] == 0
    assert await stack.ready()


async def test_legacy_grant_writes_anywhere_with_the_flag(ca, fake_kube, tmp_path) -> None:
    s, kube = await start_stack(fake_kube, tmp_path, allow_nonresource_grant=True)
    try:
        samples = tenant_samples("a", 1.0, time.time() - 5) + tenant_samples("b", 1.0, time.time() - 5)
        answer = await s.push("legacy-token", samples)
        assert answer["accepted"] == 8 and not answer["rejected"]
        [review] = s.reviews()  # one review of the grant, none per target
        assert review["nonResourceAttributes"] == {"path": PUSH_PATH, "verb": "post"}
        before = counter("kcms_push_authorizations_total", decision="nonresource_grant")
        await s.push("legacy-token", tenant_samples("a", 2.0, time.time()))
        assert counter("kcms_push_authorizations_total", decision="nonresource_grant") == before + 1

        # with the flag, a writer without the grant is still decided per target
        s.fake.access_reviews.clear()
        answer = await s.push("a-token", tenant_samples("b", 9.0, time.time()))
        assert answer["rejected"] == {"forbidden": 4}
        assert sum("nonResourceAttributes" in r for r in s.reviews()) == 1
        assert await s.ready()
    finally:
        await s.server.stop()
        await kube.close()


# ---- per-writer quotas ---------------------------------------------------------------------------------


async def test_one_writer_filling_its_quota_leaves_room_for_others(ca, fake_kube, tmp_path, caplog) -> None:
    limits = PushLimits(max_series_per_writer=50, max_series_total=120, max_series_per_metric=1000)
    s, kube = await start_stack(fake_kube, tmp_path, limits=limits)
    try:

        def series(ns: str, n: int, start: int = 0, value: float = 1.0) -> list[dict[str, Any]]:
            return [{"metric": "queue_backlog", "namespace": ns, "labels": {"queue": f"q{i}"}, "value": value}
                    for i in range(start, start + n)]  # fmt: skip

        before = counter("kcms_push_rejected_total", reason="series_limit_writer")
        answer = await s.push("a-token", series("a", 200))
        assert answer["accepted"] == 50 and answer["rejected"] == {"series_limit_writer": 150}
        assert "already created 50 series" in answer["errors"][0]["message"]
        answer = await s.push("a-token", series("a", 100, start=1000))  # still full: nothing new
        assert answer["accepted"] == 0 and answer["rejected"] == {"series_limit_writer": 100}
        assert counter("kcms_push_rejected_total", reason="series_limit_writer") == before + 250
        [line] = [r.getMessage() for r in caplog.records if "series_limit_writer" in r.getMessage()]
        assert "'system:serviceaccount:a:reporter'" in line  # one rate-limited line, the writer named
        # its existing series keep accepting points
        answer = await s.push("a-token", series("a", 50, value=2.0))
        assert answer["accepted"] == 50 and not answer["rejected"]

        # another writer still has all of its quota
        answer = await s.push("b-token", series("b", 50))
        assert answer["accepted"] == 50 and not answer["rejected"]
        assert s.api.series_count(writer="system:serviceaccount:a:reporter") == 50
        assert s.api.series_count(writer="system:serviceaccount:b:reporter") == 50
        # the total cap still holds over all writers: 20 left
        answer = await s.push("admin-token", series("a", 40, start=5000))
        assert answer["accepted"] == 20 and answer["rejected"] == {"series_limit_total": 20}
        assert s.api.series_count() == 120 and s.store.stats()["series"] == 120
        assert await s.ready()
    finally:
        await s.server.stop()
        await kube.close()


def test_series_quota_accounting_and_expiry() -> None:
    t = [0.0]
    q = SeriesQuota(max_total=6, max_per_writer=3, max_per_metric=4, ttl=16.0, clock=lambda: t[0])
    for i in range(3):
        assert q.check("w1", "m", ("m", i)) is None
        q.record("w1", "m", ("m", i), t[0])
    assert q.check("w1", "m", ("m", 9)) == "series_limit_writer"
    assert q.check("w1", "m", ("m", 0)) is None  # known series are never refused
    assert q.check("w2", "m", ("m", 3)) is None
    q.record("w2", "m", ("m", 3), t[0])
    assert q.check("w2", "m", ("m", 4)) == "series_limit_metric"
    q.record("w2", "m", ("m", 0), t[0])  # w2 writes w1's series: it stays w1's
    assert q.count(writer="w1") == 3 and q.count(writer="w2") == 1 and q.count(metric="m") == 4
    for i in range(2):
        q.record("w2", "other", ("o", i), t[0])
    assert q.check("w3", "third", ("t", 0)) == "series_limit_total"
    # only m0 keeps being written; after the ttl the others stop counting, even if nothing but new
    # series arrive (the refusal path expires too)
    t[0] = 10.0
    q.record("w2", "m", ("m", 0), t[0])
    t[0] = 20.0
    assert q.check("w3", "third", ("t", 0)) is None
    assert q.count() == 1 and q.count(writer="w1") == 1 and q.writers() == {"w1": 1}
    with pytest.raises(ValueError):
        SeriesQuota(ttl=0)


# ---- review cost and failures ----------------------------------------------------------------------------


async def test_reviews_per_push_are_bounded_by_distinct_targets(ca, fake_kube, tmp_path) -> None:
    s, kube = await start_stack(fake_kube, tmp_path, limits=PushLimits(max_body_bytes=4 << 20))
    try:
        now = time.time()
        targets = tenant_samples("a", 0.0, 0.0)[:3]  # three targets
        samples = [
            {
                **targets[i % 3],
                "labels": {"shard": str(i % 20)},
                "value": i,
                "timestamp": now - 100 + i * 0.001,
            }
            for i in range(10_000)
        ]
        answer = await s.push("a-token", samples)
        assert answer["accepted"] == 10_000 and not answer["rejected"]
        assert len(s.reviews()) <= 3
        # the same targets again: cached decisions, no review at all
        s.fake.access_reviews.clear()
        later = [{**x, "timestamp": x["timestamp"] + 50} for x in samples[:300]]
        assert (await s.push("a-token", later))["accepted"] == 300
        assert s.reviews() == []
    finally:
        await s.server.stop()
        await kube.close()


async def test_a_push_naming_many_forbidden_objects_costs_a_bounded_number_of_reviews(
    ca, fake_kube, tmp_path
) -> None:
    s, kube = await start_stack(fake_kube, tmp_path, limits=PushLimits(max_target_reviews=100))
    try:
        pods = [{"metric": "queue_depth", "resource": "pods", "namespace": "b", "name": f"p-{i}", "value": 1}
                for i in range(3000)]  # fmt: skip
        ext = [{"metric": f"m{i}", "namespace": "b", "value": 1} for i in range(500)]
        answer = await s.push("a-token", pods + ext)
        assert answer["accepted"] == 0
        assert answer["rejected"]["forbidden"] + answer["rejected"]["too_many_targets"] == 3500
        assert len(s.reviews()) <= 100
        assert s.store.stats()["series"] == 0
        # a legitimate writer of many objects of one resource and metric: one probe for all names
        s.fake.access_reviews.clear()
        mine = [{**p, "namespace": "a"} for p in pods]
        answer = await s.push("a-token", mine)
        assert answer["accepted"] == 3000
        assert len(s.reviews()) == 1 and "name" not in s.reviews()[0]["resourceAttributes"]
        assert await s.ready()
    finally:
        await s.server.stop()
        await kube.close()


async def test_api_server_down_refuses_per_item_never_the_whole_push(stack: Stack, fake_kube) -> None:
    now = time.time()
    answer = await stack.push("a-token", tenant_samples("a", 1.0, now - 10)[:1])  # token and target cached
    assert answer["accepted"] == 1
    before = counter("kcms_push_rejected_total", reason="authorization_error")
    await fake_kube.stop()
    try:
        samples = tenant_samples("a", 2.0, now - 5)  # worker-1 is cached, the three others are not
        status, answer = await stack.post({"samples": samples}, "a-token")
        assert status == 200, answer
        assert answer["accepted"] == 1 and answer["rejected"] == {"authorization_error": 3}
        assert "retry later" in answer["errors"][0]["message"]
        assert counter("kcms_push_rejected_total", reason="authorization_error") == before + 3
        assert await stack.ready()
    finally:
        await fake_kube.start()
    # a failed review is not remembered: once the API server answers, the same push goes through
    status, answer = await stack.post({"samples": tenant_samples("a", 3.0, now - 1)}, "a-token")
    assert status == 200 and answer["accepted"] == 4, answer


# ---- the flags, on a real `kcms server` process -----------------------------------------------------------


def test_bad_push_flags_stop_start_up_naming_the_flag() -> None:
    for argv, flag in (
        (["--push-max-series-per-writer", "0"], "--push-max-series-per-writer"),
        (["--push-max-series-per-writer", "lots"], "--push-max-series-per-writer"),
        (["--push-allow-nonresource-grant=yes"], "--push-allow-nonresource-grant"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "kcms", "server", "--active-standby", *argv],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert f"argument {flag}" in result.stderr and "Traceback" not in result.stderr


async def test_server_process_flags_decide_the_legacy_grant_and_the_writer_quota(
    ca, fake_kube, tmp_path
) -> None:
    from _stores import free_port
    from test_ha_e2e import _spawn, _wait

    fake_kube.authorize = rbac.authorizer(RBAC)
    fake_kube.tokens.update(TOKENS)
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_file.write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    key_file.write_bytes(cert.private_key_pem.bytes())
    ports = {"default": free_port(), "legacy": free_port()}
    procs = {}
    common = [
        "server", "--active-standby", "--leader-elect=false", "--kubeconfig", str(fake_kube.kubeconfig),
        "--bind-address", "127.0.0.1", f"--tls-cert-file={cert_file}", f"--tls-private-key-file={key_file}",
        "--authentication-skip-lookup", "--push-max-series-per-writer=4",
    ]  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(ca_file(ca, tmp_path)))
    try:
        procs["default"] = await _spawn(tmp_path, "default", *common, "--secure-port", str(ports["default"]))
        procs["legacy"] = await _spawn(
            tmp_path,
            "legacy",
            *common,
            "--secure-port",
            str(ports["legacy"]),
            "--push-allow-nonresource-grant",
        )
        async with aiohttp.ClientSession() as http:

            async def post(which: str, token: str, samples: list[dict[str, Any]]) -> tuple[int, dict]:
                headers = {"Authorization": f"Bearer {token}"}
                url = f"https://127.0.0.1:{ports[which]}{PUSH_PATH}"
                async with http.post(url, json={"samples": samples}, headers=headers, ssl=ctx) as r:
                    return r.status, await r.json(content_type=None)

            async def ready(which: str) -> bool:
                assert procs[which].returncode is None, (tmp_path / f"{which}.log").read_text()[-2000:]
                try:
                    async with http.get(f"https://127.0.0.1:{ports[which]}/readyz", ssl=ctx) as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            for which in ports:
                await _wait(lambda w=which: ready(w), 30, f"the {which} server ready")
            samples = tenant_samples("b", 1.0, time.time() - 5)
            status, answer = await post("default", "legacy-token", samples)
            assert status == 200 and answer["rejected"] == {"forbidden": 4} and answer["accepted"] == 0
            status, answer = await post("legacy", "legacy-token", samples)
            assert status == 200 and answer["accepted"] == 4, answer

            many = [
                {"metric": "queue_backlog", "namespace": "a", "labels": {"q": str(i)}, "value": 1}
                for i in range(6)
            ]
            status, answer = await post("default", "a-token", many)
            assert answer["accepted"] == 4 and answer["rejected"] == {"series_limit_writer": 2}, answer
            status, answer = await post("default", "b-token", samples)  # another writer: its own quota
            assert answer["accepted"] == 4 and not answer["rejected"], answer
            for which in ports:
                assert await ready(which)
    finally:
        for p in procs.values():
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
                await p.wait()
    for which in ports:
        log = (tmp_path / f"{which}.log").read_text()
        assert "Traceback" not in log, log[-3000:]


def ca_file(ca: Any, tmp: Path) -> Path:
    path = tmp / "ca.pem"
    path.write_bytes(ca.cert_pem.bytes())
    return path
