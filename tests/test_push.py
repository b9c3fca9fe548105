"""The push endpoint (kcms/apis/push.py): body parsing, per-sample refusals, cardinality limits and
its counters against a real SeriesStore; then over real HTTPS on the aggregated API server with
delegated authentication (TokenReview) and per-target authorization (SubjectAccessReview) through the
fake Kubernetes API, whose authorizer evaluates the Role shipped in deploy/examples/push-rbac.yaml
(tests/_rbac.py). The hostile side of the push (cross-tenant writes, quotas, outages) is in
tests/test_security_push.py."""

from __future__ import annotations

import logging
import ssl
import time
from pathlib import Path
from typing import Any

import _rbac as rbac
import aiohttp
import orjson
import pytest
from prometheus_client import REGISTRY

from kcms.apis.push import PUSH_PATH, PushAPI, PushLimits, PushSample, parse_body
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions, StatusError
from kcms.kube.client import KubeClient
from kcms.kube.reviews import AccessReviewer, TokenReviewer
from kcms.model import ObjectRef
from kcms.selectors import parse_label_selector
from kcms.store.series import SeriesStore

RBAC = Path(__file__).resolve().parent.parent / "deploy" / "examples" / "push-rbac.yaml"
PUSHER, READER = "pusher-token", "reader-token"


def sample(**kw: Any) -> PushSample:
    base: dict[str, Any] = dict(
        metric="queue_backlog", resource="", namespace="jobs", name="", labels={}, value=1.0, timestamp=None
    )
    base.update(kw)
    return PushSample(**base)


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# ---- parsing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, words",
    [
        (b"{not json", "malformed JSON"),
        (b"[]", "JSON object"),
        (b"{}", "samples: required"),
        (b'{"samples": {}}', "samples: required, must be a list"),
        (b'{"samples": [], "extra": 1}', "unknown field 'extra'"),
        (b'{"samples": [3]}', "samples[0]: must be an object"),
        (b'{"samples": [{"value": 1}]}', "samples[0].metric: required"),
        (b'{"samples": [{"metric": "m"}]}', "samples[0].value: required"),
        (b'{"samples": [{"metric": "m", "value": true}]}', "samples[0].value: must be a number"),
        (b'{"samples": [{"metric": "m", "value": "lots"}]}', "samples[0].value: 'lots' is not a number"),
        (b'{"samples": [{"metric": "m", "value": 1, "labels": []}]}', "samples[0].labels: must be an object"),
        (b'{"samples": [{"metric": "m", "value": 1, "labels": {"a": 1}}]}', "samples[0].labels['a']"),
        (b'{"samples": [{"metric": "m", "value": 1, "timestamp": "now"}]}', "samples[0].timestamp"),
        (b'{"samples": [{"metric": "m", "value": 1, "namespce": "x"}]}', "unknown field 'namespce'"),
        (
            b'{"samples": [{"metric": "m", "value": 1}, {"metric": "m", "value": 1, "name": 5}]}',
            "samples[1].name",
        ),
    ],
)
def test_malformed_bodies_are_refused_whole_naming_the_problem(body: bytes, words: str) -> None:
    with pytest.raises(StatusError) as e:
        parse_body(body)
    assert e.value.code == 400 and e.value.reason == "BadRequest"
    assert words in e.value.message


def test_well_formed_body_parses_with_defaults_and_numeric_strings() -> None:
    body = orjson.dumps(
        {
            "samples": [
                {"metric": "a", "namespace": "jobs", "value": 42},
                {"metric": "b", "resource": "pods", "namespace": "jobs", "name": "p", "value": "1.5",
                 "labels": {"queue": "emails"}, "timestamp": 1700000000.5},
                {"metric": "c", "namespace": "jobs", "value": "NaN", "timestamp": None},
            ]
        }
    )  # fmt: skip
    a, b, c = parse_body(body)
    assert a == sample(metric="a", value=42.0)
    assert b == sample(
        metric="b", resource="pods", name="p", value=1.5, labels={"queue": "emails"}, timestamp=1700000000.5
    )
    assert c.value != c.value and c.timestamp is None  # NaN parses; it is refused later, per sample


# ---- per-sample checks against a real store ---------------------------------------------------------


def test_each_bad_sample_is_refused_for_its_reason_and_never_fails_the_others() -> None:
    store = SeriesStore()
    api = PushAPI(store, PushLimits(max_labels=2, max_label_value_length=8))
    now = time.time()
    good = [
        sample(value=7.0, labels={"queue": "emails"}, timestamp=now - 1),
        sample(metric="requests", resource="pods", name="worker-1", value=3.0, timestamp=now - 1),
    ]
    bad = {
        "invalid_metric_name": sample(metric="9lives"),
        "invalid_object": sample(resource="", name="oops"),
        "too_many_labels": sample(labels={"a": "1", "b": "2", "c": "3"}),
        "invalid_label_name": sample(labels={"-bad": "1"}),
        "label_value_too_long": sample(labels={"queue": "x" * 9}),
        "non_finite_value": sample(value=float("nan")),
        "future_timestamp": sample(timestamp=now + 3600),
        "too_old": sample(timestamp=now - 10_000),
        "out_of_order": sample(value=8.0, labels={"queue": "emails"}, timestamp=now - 1),  # duplicate
    }
    before = {r: counter("kcms_push_rejected_total", reason=r) for r in bad}
    accepted_before = counter("kcms_push_samples_total", result="accepted")
    rejected_before = counter("kcms_push_samples_total", result="rejected")
    mixed = [good[0], *bad.values(), good[1]]
    summary = api.ingest(mixed, now=now)
    assert summary.accepted == 2
    assert summary.rejected == dict.fromkeys(bad, 1)
    assert [e["index"] for e in summary.errors] == list(range(1, 10))
    for r in bad:
        assert counter("kcms_push_rejected_total", reason=r) == before[r] + 1
    assert counter("kcms_push_samples_total", result="accepted") == accepted_before + 2
    assert counter("kcms_push_samples_total", result="rejected") == rejected_before + 9

    # what was accepted is in the store, the duplicate did not overwrite it
    [ext] = store.query("", "jobs", None, "queue_backlog", now=now)
    assert ext.value == 7.0 and ext.labels == (("queue", "emails"),) and ext.timestamp == now - 1
    [pod] = store.query("pods", "jobs", ["worker-1"], "requests", now=now)
    assert pod.value == 3.0 and pod.obj == ObjectRef("pods", "jobs", "worker-1")
    assert store.stats()["series"] == 2


def test_object_references_are_checked() -> None:
    api = PushAPI(SeriesStore())
    now = time.time()
    cases = {
        "external without namespace": (sample(namespace=""), "invalid_object"),
        "object without name": (sample(resource="pods", name=""), "invalid_object"),
        "bad resource": (sample(resource="Pods", name="p"), "invalid_object"),
        "bad namespace": (sample(namespace="Jobs"), "invalid_object"),
        "bad name": (sample(resource="pods", name="a/b"), "invalid_object"),
        "cluster-scoped node": (sample(resource="nodes", namespace="", name="node-1"), None),
        "deployment": (sample(resource="deployments.apps", name="worker"), None),
    }
    for what, (s, reason) in cases.items():
        summary = api.ingest([s], now=now)
        if reason is None:
            assert summary.accepted == 1, what
        else:
            assert summary.rejected == {reason: 1}, what


def test_default_timestamp_is_now_and_later_points_are_accepted() -> None:
    store = SeriesStore()
    api = PushAPI(store)
    t0 = time.time()
    assert api.ingest([sample(value=1.0, timestamp=t0 - 5)]).accepted == 1
    assert api.ingest([sample(value=2.0)]).accepted == 1  # no timestamp: the time of arrival
    [r] = store.query("", "jobs", None, "queue_backlog")
    assert r.value == 2.0 and t0 <= r.timestamp <= time.time()


# ---- cardinality -----------------------------------------------------------------------------------


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_series_limits_refuse_only_new_series(caplog: pytest.LogCaptureFixture) -> None:
    store = SeriesStore()
    clock = Clock()
    api = PushAPI(store, PushLimits(max_series_per_metric=2, max_series_total=3, series_ttl=60), clock=clock)
    now = time.time()

    def q(n: int, value: float, t: float) -> PushSample:
        return sample(labels={"queue": f"q{n}"}, value=value, timestamp=t)

    with caplog.at_level(logging.WARNING, logger="kcms.apis.push"):
        s = api.ingest([q(1, 1, now - 10), q(2, 2, now - 10), q(3, 3, now - 10)], now=now)
    assert s.accepted == 2 and s.rejected == {"series_limit_metric": 1}
    assert "series_limit_metric" in caplog.text and "queue_backlog" in caplog.text
    assert api.series_count("queue_backlog") == 2

    # existing series keep accepting points; another metric gets the last slot of the total
    s = api.ingest([q(1, 10, now - 5), q(2, 20, now - 5), sample(metric="other", value=5, timestamp=now - 5)])
    assert s.accepted == 3 and not s.rejected
    s = api.ingest([sample(metric="third", value=1, timestamp=now - 5), q(3, 3, now - 5)], now=now)
    assert s.rejected == {"series_limit_total": 1, "series_limit_metric": 1}
    assert api.series_count() == 3
    values = {r.labels: r.value for r in store.query("", "jobs", None, "queue_backlog", now=now)}
    assert values == {(("queue", "q1"),): 10.0, (("queue", "q2"),): 20.0}

    # q1 keeps being pushed; q2 and "other" go quiet for longer than the ttl and stop counting
    clock.t += 40
    assert api.ingest([q(1, 11, now - 4)], now=now).accepted == 1
    clock.t += 30
    assert api.series_count() == 1 and api.series_count("queue_backlog") == 1
    s = api.ingest([q(3, 3, now - 3), sample(metric="third", value=1, timestamp=now - 3)], now=now)
    assert s.accepted == 2 and not s.rejected


def test_series_ttl_defaults_to_the_store_retention() -> None:
    assert PushAPI(SeriesStore(retention=120.0, stale_after=60.0)).series_ttl == 120.0
    assert PushAPI(SeriesStore(), PushLimits(series_ttl=5)).series_ttl == 5.0


# ---- over HTTPS, authenticated and authorized ----------------------------------------------------------


@pytest.fixture
async def push_server(ca, fake_kube, tmp_path):
    fake_kube.authorize = rbac.authorizer(rbac.load(RBAC))
    fake_kube.tokens[PUSHER] = {"username": "system:serviceaccount:jobs:queue-reporter", "uid": "1"}
    fake_kube.tokens[READER] = {"username": "reader", "uid": "2"}
    kube = await KubeClient.load(str(fake_kube.kubeconfig))
    store = SeriesStore()
    push = PushAPI(store, PushLimits(max_body_bytes=400_000, max_samples=3000))
    server = AggregatedAPIServer(
        ServingOptions(secure_port=0, bind_address="127.0.0.1", cert_dir=str(tmp_path / "certs")),
        AuthnOptions(skip_lookup=True, token_reviewer=TokenReviewer(kube)),
        AuthzOptions(access_reviewer=AccessReviewer(kube)),
    )
    push.install(server)
    await server.start()
    ctx = ssl.create_default_context(cafile=server.serving_cert_file)
    try:
        yield server, store, ctx, fake_kube
    finally:
        await server.stop()
        await kube.close()


async def post(
    server, ctx, data: Any, token: str | None = PUSHER, headers: dict | None = None, method="POST"
):
    hdrs = {"Content-Type": "application/json"}
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    hdrs.update(headers or {})
    url = f"https://127.0.0.1:{server.port}{PUSH_PATH}"
    async with aiohttp.ClientSession() as s:
        async with s.request(method, url, data=data, headers=hdrs, ssl=ctx) as r:
            return r.status, await r.json(content_type=None)


async def test_push_over_https_is_authorized_per_target(push_server) -> None:
    server, store, ctx, fake = push_server
    now = time.time()
    body = orjson.dumps(
        {"samples": [{"metric": "queue_backlog", "namespace": "jobs", "labels": {"queue": "emails"},
                      "value": 42, "timestamp": now - 1},
                     {"metric": "queue_backlog", "namespace": "jobs", "value": "NaN"}]}
    )  # fmt: skip
    status, answer = await post(server, ctx, body)
    assert status == 200, answer
    assert answer["accepted"] == 1 and answer["rejected"] == {"non_finite_value": 1}
    assert answer["errors"][0]["index"] == 1
    [review] = [r["spec"] for r in fake.access_reviews]  # one target, one review
    assert review["resourceAttributes"] == {
        "namespace": "jobs",
        "verb": "create",
        "group": "external.metrics.k8s.io",
        "resource": "queue_backlog",
    }
    assert review["user"] == "system:serviceaccount:jobs:queue-reporter"
    sel = parse_label_selector("queue=emails")
    [r] = store.query("", "jobs", None, "queue_backlog", label_selector=sel)
    assert r.value == 42.0

    # a user without the Role: each sample refused (before its value is looked at); without a
    # token: unauthorized. Nothing more is stored.
    status, answer = await post(server, ctx, body, token=READER)
    assert status == 200 and answer["accepted"] == 0 and answer["rejected"] == {"forbidden": 2}
    assert answer["errors"][0]["message"] == (
        'User "reader" cannot create resource "queue_backlog" in API group "external.metrics.k8s.io" '
        'in the namespace "jobs"'
    )
    status, answer = await post(server, ctx, body, token=None)
    assert status == 401 and answer["reason"] == "Unauthorized"
    assert store.stats()["points"] == 1


async def test_http_errors_are_status_objects(push_server) -> None:
    server, store, ctx, _ = push_server
    status, answer = await post(server, ctx, b'{"samples": [{"metric": "m"}]}')
    assert status == 400 and answer["kind"] == "Status" and answer["reason"] == "BadRequest"
    assert answer["message"] == "samples[0].value: required"
    status, answer = await post(server, ctx, b"{oops")
    assert status == 400 and answer["message"].startswith("malformed JSON")

    big = orjson.dumps(
        {"samples": [{"metric": "m", "namespace": "jobs", "value": 1, "labels": {"x": "y" * 500_000}}]}
    )
    status, answer = await post(server, ctx, big)
    assert (
        status == 413 and answer["reason"] == "RequestEntityTooLarge" and "400000 bytes" in answer["message"]
    )

    async def chunks():  # no Content-Length: the limit applies while reading
        for _ in range(500):
            yield b" " * 1000

    status, answer = await post(server, ctx, chunks())
    assert status == 413 and answer["code"] == 413

    many = orjson.dumps({"samples": [{"metric": "m", "namespace": "jobs", "value": i} for i in range(3001)]})
    status, answer = await post(server, ctx, many)
    assert status == 413 and "3001 samples" in answer["message"]

    status, answer = await post(server, ctx, b"m 1", headers={"Content-Type": "text/plain"})
    assert status == 400 and answer["message"].startswith("malformed JSON")
    status, answer = await post(server, ctx, None, method="GET")
    assert status == 405 and answer["reason"] == "MethodNotAllowed"
    assert store.stats()["series"] == 0


async def test_a_large_push_is_stored_in_batches_with_the_right_indices(push_server) -> None:
    server, store, ctx, fake = push_server
    now = time.time()
    samples: list[dict[str, Any]] = [
        {
            "metric": "http_requests_total",
            "resource": "pods",
            "namespace": "jobs",
            "name": f"p-{i}",
            "value": i,
            "timestamp": now,
        }
        for i in range(2500)
    ]
    samples[1500]["value"] = "NaN"
    samples[2400]["metric"] = "bad-name"
    status, answer = await post(server, ctx, orjson.dumps({"samples": samples}))
    assert status == 200, answer
    assert answer["accepted"] == 2498
    assert answer["rejected"] == {"non_finite_value": 1, "invalid_metric_name": 1}
    assert [(e["index"], e["reason"]) for e in answer["errors"]] == [
        (1500, "non_finite_value"),
        (2400, "invalid_metric_name"),
    ]
    assert len(store.query("pods", "jobs", None, "http_requests_total")) == 2498
    # 2500 pods of one resource and metric in one namespace: one review for all names
    [review] = [r["spec"]["resourceAttributes"] for r in fake.access_reviews]
    assert review == {"namespace": "jobs", "verb": "create", "group": "custom.metrics.k8s.io",
                      "resource": "pods", "subresource": "http_requests_total"}  # fmt: skip
