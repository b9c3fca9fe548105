"""The API server under abuse, as a hostile client would try it: real HTTPS on loopback and raw
TLS sockets for half-sent headers, idle crowds and bodies that never arrive, overload past
max-in-flight, huge-number selectors, watches, a broken own credential and log injection
(protocol errors: test_apiserver_protocol.py).

Each test checks the refusal (code and ``Status`` reason), that the server stays ready and its
other answers are unaffected, and that the captured log has no traceback and no raw control
characters from the client.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from _abuse_helpers import (
    Gate,
    assert_clean_log,
    closed_by_server,
    eventually,
    raw,
    ready,
    refusals,
    serving,
)
from _apiserver_helpers import (
    GROUP,
    PKI,
    admin_fixture,  # noqa: F401  (pytest fixture)
    fetch,
    pki_fixture,  # noqa: F401  (pytest fixture)
    running,
)
from prometheus_client import REGISTRY

from kcms.apis.metrics.api import MetricsAPI
from kcms.apiserver import APIGroupVersion, AuthzOptions
from kcms.kube.client import KubeClient
from kcms.kube.inventory import StaticInventory
from kcms.store.resource import ResourceStore

# ---- slow and idle connections --------------------------------------------------------------------


async def test_half_sent_headers_are_dropped_and_the_server_stays_ready(
    pki: PKI, admin: ssl.SSLContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    before = refusals("apiserver", "header_timeout")
    async with running(pki, serving=serving(pki, request_header_timeout=0.5)) as server:
        # slowloris: half the headers, then nothing
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=pki.client_ctx())
        writer.write(b"GET /apis HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        await writer.drain()
        # a trickler: one byte at a time, each within any per-read timeout; the deadline still holds
        r2, w2 = await asyncio.open_connection("127.0.0.1", server.port, ssl=pki.client_ctx())

        async def trickle() -> None:
            w2.write(b"GET /apis HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            while not w2.is_closing():
                w2.write(b"X")
                try:
                    await w2.drain()
                except (ConnectionError, ssl.SSLError):
                    return
                await asyncio.sleep(0.1)

        trickler = asyncio.create_task(trickle())
        assert await closed_by_server(reader) == b""  # closed, nothing answered
        assert await closed_by_server(r2) == b""
        trickler.cancel()
        writer.close()
        w2.close()
        assert refusals("apiserver", "header_timeout") >= before + 2
        await ready(server, pki.client_ctx())
        status, _, body = await fetch(server, admin, f"/apis/{GROUP}/v1/widgets")
        assert status == 200 and len(body["items"]) == 3
    assert_clean_log(caplog)


async def test_many_idle_connections_are_closed_and_do_not_block_others(
    pki: PKI, admin: ssl.SSLContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running(pki, serving=serving(pki, request_header_timeout=1.0)) as server:
        conns = [
            await asyncio.open_connection("127.0.0.1", server.port, ssl=pki.client_ctx()) for _ in range(100)
        ]
        # the idle crowd does not keep anyone else waiting
        await ready(server, pki.client_ctx())
        status, _, _ = await fetch(server, admin, f"/apis/{GROUP}/v1/widgets")
        assert status == 200
        # every idle connection is closed by the server (none sent a request in time)
        results = await asyncio.gather(*(closed_by_server(r) for r, _ in conns))
        assert results == [b""] * 100
        await eventually(lambda: server._runner is not None and len(server._runner.server.connections) == 0)
        for _, w in conns:
            w.close()
        await ready(server, pki.client_ctx())
    assert_clean_log(caplog)


async def test_a_body_that_never_arrives_closes_its_connection(
    pki: PKI, admin: ssl.SSLContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    gate = Gate()
    gate.open.set()
    before = refusals("apiserver", "body_timeout")
    async with running(pki, serving=serving(pki, body_timeout=0.5), group=gate.group()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=admin)
        writer.write(
            f"POST /apis/{GROUP}/v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n{".encode()
        )
        await writer.drain()
        await closed_by_server(reader)
        writer.close()
        assert refusals("apiserver", "body_timeout") == before + 1
        # a whole body is fine
        async with aiohttp.ClientSession() as s:
            async with s.post(
                f"https://127.0.0.1:{server.port}/apis/{GROUP}/v1/echo", data=b"x" * 1000, ssl=admin
            ) as r:
                assert r.status == 200 and (await r.json())["size"] == 1000
        await ready(server, pki.client_ctx())
    assert_clean_log(caplog)


# ---- overload ---------------------------------------------------------------------------------------


async def test_over_max_inflight_is_429_with_retry_after_while_probes_answer(
    pki: PKI, admin: ssl.SSLContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    gate = Gate()
    opts = serving(pki, max_requests_inflight=2, max_mutating_requests_inflight=1, executing_requests=1)
    dropped = (
        REGISTRY.get_sample_value(
            "kcms_apiserver_dropped_requests_total", {"request_kind": "readOnly", "reason": "inflight"}
        )
        or 0.0
    )
    async with running(pki, serving=opts, group=gate.group()) as server:
        url = f"/apis/{GROUP}/v1/slow"
        held = [asyncio.create_task(fetch(server, admin, url)) for _ in range(2)]
        await eventually(lambda: server.limiter.current["readOnly"] == 2)
        status, headers, body = await fetch(server, admin, url)
        assert status == 429, body
        assert headers["Retry-After"] == "1"
        assert body["reason"] == "TooManyRequests" and body["code"] == 429
        assert body["details"] == {"retryAfterSeconds": 1}
        assert (
            REGISTRY.get_sample_value(
                "kcms_apiserver_dropped_requests_total", {"request_kind": "readOnly", "reason": "inflight"}
            )
            == dropped + 1
        )
        # mutating requests have their own budget: one is admitted (and queues for the one seat) ...
        posted = asyncio.create_task(fetch(server, admin, url, method="POST"))
        await eventually(lambda: server.limiter.current["mutating"] == 1)
        # ... the next is refused
        status, headers, body = await fetch(server, admin, url, method="POST")
        assert status == 429 and headers["Retry-After"] == "1" and body["reason"] == "TooManyRequests"
        # probes are exempt and do not wait for the seat the first request holds
        await ready(server, pki.client_ctx())
        for path in ("/readyz/ping", "/livez?verbose"):
            assert (await fetch(server, admin, path))[0] == 200
        gate.open.set()
        for status, _, body in await asyncio.gather(*held, posted):
            assert status == 200 and body["kind"] == "SlowList"
        assert server.limiter.current == {"readOnly": 0, "mutating": 0}
        status, _, _ = await fetch(server, admin, url)
        assert status == 200
    assert_clean_log(caplog)


async def test_a_request_that_waits_too_long_for_a_seat_is_429(
    pki: PKI, admin: ssl.SSLContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    gate = Gate()
    labels = {"request_kind": "readOnly", "reason": "queue_wait"}
    before = REGISTRY.get_sample_value("kcms_apiserver_dropped_requests_total", labels) or 0.0
    async with running(pki, serving=serving(pki, executing_requests=1), group=gate.group()) as server:
        server.limiter.queue_wait = 0.3  # kube's is 15 s; short here, no timing is asserted
        url = f"/apis/{GROUP}/v1/slow"
        holder = asyncio.create_task(fetch(server, admin, url))
        await eventually(lambda: server.limiter.current["readOnly"] == 1)
        status, headers, body = await fetch(server, admin, url)
        assert status == 429 and headers["Retry-After"] == "1" and body["reason"] == "TooManyRequests"
        assert REGISTRY.get_sample_value("kcms_apiserver_dropped_requests_total", labels) == before + 1
        await ready(server, pki.client_ctx())  # probes never wait for a seat
        gate.open.set()
        assert (await holder)[0] == 200
        assert server.limiter.current == {"readOnly": 0, "mutating": 0}
    assert_clean_log(caplog)


# ---- selectors and watches --------------------------------------------------------------------------


def metrics_group() -> APIGroupVersion:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p1", "namespace": "a", "labels": {"app": "web", "n": "5"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {}}}
    return MetricsAPI(StaticInventory([node, pod]), ResourceStore(15.0)).group_version()


@pytest.mark.parametrize(
    "query",
    [
        "labelSelector=n>99999999999999999999999999",
        "labelSelector=n<-" + "9" * 5000,
        "labelSelector=n>" + "9" * 5000,
        "labelSelector=n+in+(" + ",".join(["a"] * 300) + ",",
        "labelSelector=" + "k" * 3000 + "=v",
        "fieldSelector=metadata.uid=1",
        "fieldSelector=metadata.name%3D%5C",
    ],
)
async def test_hostile_selectors_are_400(
    pki: PKI, admin: ssl.SSLContext, caplog: pytest.LogCaptureFixture, query: str
) -> None:
    caplog.set_level(logging.INFO)
    async with running(pki, group=metrics_group()) as server:
        for path in ("/apis/metrics.k8s.io/v1beta1/pods", "/apis/metrics.k8s.io/v1beta1/nodes"):
            status, _, body = await fetch(server, admin, f"{path}?{query}")
            assert status == 400, body
            assert body["reason"] == "BadRequest" and len(body["message"]) < 600
        status, _, body = await fetch(server, admin, "/apis/metrics.k8s.io/v1beta1/pods?labelSelector=n>3")
        assert status == 200 and body["kind"] == "PodMetricsList"
        await ready(server, pki.client_ctx())
    assert_clean_log(caplog)


async def test_watch_is_405_where_the_resource_cannot_be_watched(
    pki: PKI, admin: ssl.SSLContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running(pki, group=metrics_group()) as server:
        for path, kind in (
            ("/apis/metrics.k8s.io/v1beta1/pods?watch=true", "pods.metrics.k8s.io"),
            ("/apis/metrics.k8s.io/v1beta1/namespaces/a/pods?watch=1", "pods.metrics.k8s.io"),
            ("/apis/metrics.k8s.io/v1beta1/nodes?watch=true&resourceVersion=0", "nodes.metrics.k8s.io"),
        ):
            status, _, body = await fetch(server, admin, path)
            assert status == 405, body
            assert body["reason"] == "MethodNotAllowed"
            assert body["message"] == f'watch is not supported on resources of kind "{kind}"'
        # watch=false is a list
        status, _, body = await fetch(server, admin, "/apis/metrics.k8s.io/v1beta1/pods?watch=false")
        assert status == 200 and body["kind"] == "PodMetricsList"
        await ready(server, pki.client_ctx())
    gate = Gate()
    gate.open.set()
    async with running(pki, group=gate.group()) as server:  # a resource that lists watch is served
        status, _, body = await fetch(server, admin, f"/apis/{GROUP}/v1/watched?watch=true")
        assert status == 200, body
    assert_clean_log(caplog)


# ---- the server's own credential ------------------------------------------------------------------


async def test_a_half_written_or_empty_own_token_file_is_401_or_503_never_500(
    pki: PKI, fake_kube: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    token_file = tmp_path / "sa-token"
    token_file.write_text(fake_kube.admin_token)
    kubeconfig = tmp_path / "own-kubeconfig"
    fake_kube.write_kubeconfig(kubeconfig)
    doc = orjson.loads(kubeconfig.read_bytes())
    doc["users"][0]["user"] = {"tokenFile": str(token_file)}
    kubeconfig.write_bytes(orjson.dumps(doc))
    kube = await KubeClient.load(str(kubeconfig))
    fake_kube.authorize = lambda spec: (True, "allowed")
    try:
        async with running(pki, authz=AuthzOptions(always_allow_groups=[]), kube_client=kube) as server:
            n = 0

            async def outcome(token: str) -> tuple[int, str, int, str]:
                nonlocal n
                n += 1  # a new user and token each time: no cached review answers
                fake_kube.tokens[f"{token}-{n}"] = {"username": f"tok-{n}", "groups": []}
                s1, _, b1 = await fetch(
                    server,
                    pki.client_ctx(),
                    f"/apis/{GROUP}/v1/widgets",
                    {"Authorization": f"Bearer {token}-{n}"},
                )
                user = pki.client_ca.issue_cert(f"kim-{n}", common_name=f"kim-{n}")
                s2, _, b2 = await fetch(server, pki.client_ctx(user), f"/apis/{GROUP}/v1/widgets")
                return s1, b1["reason"] if s1 != 200 else "", s2, b2["reason"] if s2 != 200 else ""

            assert await outcome("t") == (200, "", 200, "")
            # the credential rotates while its file is being written: half of it, then nothing
            fake_kube.api_tokens = {"rotated-token-0123456789"}
            token_file.write_text("rotated-tok")
            assert await outcome("t") == (401, "Unauthorized", 503, "ServiceUnavailable")
            token_file.write_text("")
            assert await outcome("t") == (401, "Unauthorized", 503, "ServiceUnavailable")
            await ready(server, pki.client_ctx())
            # the whole token lands: everything works again
            token_file.write_text("rotated-token-0123456789")
            assert await outcome("t") == (200, "", 200, "")
    finally:
        await kube.close()
    assert_clean_log(caplog)


# ---- log injection --------------------------------------------------------------------------------


async def test_client_strings_reach_the_log_escaped(pki: PKI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    evil_cn = "evil\n\x1b[31mroot"
    evil = pki.client_ctx(pki.client_ca.issue_cert("evil", common_name=evil_cn))
    async with running(pki, authz=AuthzOptions(always_allow_groups=[])) as server:
        # a denied request: the 'forbidden' line names the user and the (decoded) path
        status, _, body = await fetch(server, evil, f"/apis/{GROUP}/v1/widgets%0Afake%20line%1B%5B2J")
        assert status == 403, body
        # a front-proxy identity with a terminal escape (no HTTP library sends one: raw bytes)
        status, _, _ = await raw(
            server,
            evil,
            f"GET /apis/{GROUP}/v1/widgets HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
            + b"X-Remote-User: x\x1b[2Jy\r\n\r\n",
        )
        assert status in (400, 403)
        # protocol errors quoting the request line
        status, _, _ = await raw(server, evil, b"G\x1b[31mET /\r\n\x1b[2J HTTP/1.1\r\n\r\n")
        assert status == 400
        await ready(server, pki.client_ctx())
    messages = [r.getMessage() for r in caplog.records]
    forbidden = [m for m in messages if m.startswith("forbidden:")]
    assert len(forbidden) >= 1
    assert "\\n" in forbidden[0] and "\\x1b" in forbidden[0]  # there, escaped
    assert any("refused a request" in m for m in messages)
    assert_clean_log(caplog)
