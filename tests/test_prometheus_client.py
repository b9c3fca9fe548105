"""kcms/sources/prometheus_api.py: the Prometheus HTTP API client.

Against a REAL Prometheus (Debian's 2.x binary, scraping kcms/sim/prometheus.py's exporter): the
series and query answers equal Prometheus's own (read independently with urllib) and the
exporter's known rates; TLS with a client certificate and a route prefix on the real server too.
A small aiohttp fake stands in for a BROKEN backend only (down, slow, 5xx, error and malformed
bodies, huge answers, gzip bombs, redirects, and to see what the client sends: tenant header,
token, POST form, path prefix). After every failure the same client answers a good request.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import os
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psutil
import pytest
import trustme
from _http_helpers import serve_app
from _prometheus_helpers import PromEnv, prom_fixture  # noqa: F401  (pytest fixture)
from aiohttp import web

from kcms.sim.prometheus import PrometheusNotInstalled, RealPrometheus, prometheus_binary
from kcms.sources.prometheus_api import REASONS, PrometheusClient, PrometheusError, api_url

# ---- against the real Prometheus ------------------------------------------------------------


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


async def test_series_equal_prometheus_and_the_exporter(prom: PromEnv) -> None:
    matchers = ['http_requests_total{job="sim"}', '{__name__="node_temperature_celsius"}']
    async with PrometheusClient(prom.url) as client:
        got = await client.series(matchers)
    own = prom.api("series", **{"match[]": matchers[0]}) + prom.api("series", **{"match[]": matchers[1]})
    assert sorted(map(_key, got)) == sorted(map(_key, own))
    exp = prom.exporter
    pods = {
        (s["namespace"], s["pod"], s["deployment"]) for s in got if s["__name__"] == "http_requests_total"
    }
    assert pods == {(p.namespace, p.name, p.deployment) for p in exp.pods}
    nodes = {s["node"] for s in got if s["__name__"] == "node_temperature_celsius"}
    assert nodes == set(exp.nodes)
    # every series the exporter serves (plus Prometheus's 5 per-target ones) is listed
    async with PrometheusClient(prom.url) as client:
        everything = await client.series(['{job="sim"}'])
    assert len(everything) == exp.series_count + 5


async def test_series_time_range_and_no_match(prom: PromEnv) -> None:
    async with PrometheusClient(prom.url) as client:
        before = await client.series(["http_requests_total"], start=1_000_000.0, end=1_000_060.0)
        none = await client.series(['http_requests_total{pod="no-such-pod"}'])
        recent = await client.series(["http_requests_total"], start=time.time() - 60, end=time.time())
    assert before == [] and none == []
    assert len(recent) == len(prom.exporter.pods)


async def test_rates_equal_known_rates_and_prometheus_own_answer(prom: PromEnv) -> None:
    exp = prom.exporter
    window = prom.rate_window()
    promql = f"sum by (namespace, pod) (rate(http_requests_total[{window}]))"
    at = time.time()
    async with PrometheusClient(prom.url) as client:
        got = await client.query(promql, at=at)
    own = prom.api("query", query=promql, time=f"{at:.3f}")["result"]
    assert {_key(s.labels): s.value for s in got} == {_key(r["metric"]): float(r["value"][1]) for r in own}
    assert all(s.timestamp == pytest.approx(at, abs=0.001) for s in got)
    by_pod = {(p.namespace, p.name): p for p in exp.pods}
    assert len(got) == len(exp.pods)
    for s in got:
        # the counter is linear: extrapolation and scrape-time jitter stay well under 2 %
        assert s.value == pytest.approx(
            exp.request_rate(by_pod[s.labels["namespace"], s.labels["pod"]]), rel=0.02
        )


async def test_resource_queries_as_resource_rules_write_them(prom: PromEnv) -> None:
    """The default prometheus-adapter resourceRules' queries give the exporter's cAdvisor values."""
    exp = prom.exporter
    window = prom.rate_window()
    async with PrometheusClient(prom.url) as client:
        cpu = await client.query(
            f'sum(rate(container_cpu_usage_seconds_total{{namespace="default",container!=""}}[{window}]))'
            " by (pod, container)"
        )
        mem = await client.query(
            'sum(container_memory_working_set_bytes{namespace="team-a",container!=""}) by (pod, container)'
        )
        node_cpu = await client.query(
            f'sum(rate(container_cpu_usage_seconds_total{{id="/"}}[{window}])) by (node)'
        )
        node_mem = await client.query('sum(container_memory_working_set_bytes{id="/"}) by (node)')
    pods = {(p.namespace, p.name): p for p in exp.pods}
    assert len(cpu) == len([p for p in exp.pods if p.namespace == "default"]) * len(exp.containers)
    for s in cpu:
        assert s.value == pytest.approx(
            exp.cpu_rate(pods["default", s.labels["pod"]], s.labels["container"]), rel=0.02
        )
    assert {(s.labels["pod"], s.labels["container"]): s.value for s in mem} == {
        (p.name, c): exp.memory(p, c) for p in exp.pods if p.namespace == "team-a" for c in exp.containers
    }
    assert {s.labels["node"]: s.value for s in node_mem} == {n: exp.node_memory(n) for n in exp.nodes}
    for s in node_cpu:
        assert s.value == pytest.approx(exp.node_cpu_rate(s.labels["node"]), rel=0.02)


async def test_scalars_nan_inf_and_empty(prom: PromEnv) -> None:
    async with PrometheusClient(prom.url) as client:
        (inf,) = await client.query("1/0")
        (ninf,) = await client.query("-1/0")
        (nan,) = await client.query("0/0")
        vec_nan = await client.query('http_requests_in_flight{pod="web-0",namespace="default"} * NaN')
        (gauge,) = await client.query('queue_depth{queue="invoices"}')
        empty = await client.query('queue_depth{queue="nope"}')
        (scalar,) = await client.query('scalar(queue_depth{queue="emails"})')
    assert inf.value == float("inf") and ninf.value == float("-inf") and inf.labels == {}
    assert nan.value != nan.value and vec_nan[0].value != vec_nan[0].value
    assert gauge.value == prom.exporter.queue_depth("invoices") and gauge.labels["queue"] == "invoices"
    assert scalar.value == prom.exporter.queue_depth("emails") and scalar.labels == {}
    assert empty == []


async def test_prometheus_errors_become_query_errors(prom: PromEnv) -> None:
    async with PrometheusClient(prom.url) as client:
        with pytest.raises(PrometheusError) as bad:
            await client.query("sum(rate(x[1m])")
        with pytest.raises(PrometheusError) as matrix:
            await client.query("http_requests_total[1m]")
        with pytest.raises(PrometheusError) as bad_matcher:
            await client.series(['{pod="web-0"'])
        assert (await client.query("vector(7)"))[0].value == 7.0  # the client goes on
    assert (
        bad.value.reason == "query_error" and bad.value.status == 400 and bad.value.error_type == "bad_data"
    )
    assert "parse error" in str(bad.value)
    assert matrix.value.reason == "query_error" and "matrix" in str(matrix.value)
    assert bad_matcher.value.reason == "query_error" and bad_matcher.value.status == 400


async def test_post_verb_gives_the_same_answers(prom: PromEnv) -> None:
    promql = 'sum by (deployment) (http_requests_in_flight{namespace="team-a"})'
    async with PrometheusClient(prom.url) as get, PrometheusClient(prom.url, method="post") as post:
        assert sorted(map(_key, await post.series(["kube_pod_info"]))) == sorted(
            map(_key, await get.series(["kube_pod_info"]))
        )
        assert {_key(s.labels): s.value for s in await post.query(promql)} == {
            _key(s.labels): s.value for s in await get.query(promql)
        }
        # a matcher list too long for a URL goes in a POST body
        many = [f'kube_pod_info{{pod="p{i:05d}-{"x" * 40}"}}' for i in range(2000)] + ["kube_pod_info"]
        assert len(await post.series(many)) == len(prom.exporter.pods)


def _write_pem(tmp_path, name: str, blob) -> str:
    path = str(tmp_path / name)
    blob.write_to_path(path)
    return path


async def test_tls_with_ca_and_client_certificate_against_real_prometheus(ca: trustme.CA, tmp_path) -> None:
    """Prometheus's own TLS (--web.config.file) requiring a client certificate from our CA."""
    server = ca.issue_cert("127.0.0.1")
    client_cert = ca.issue_cert("kcms-prometheus-client")
    ca_file = _write_pem(tmp_path, "ca.pem", ca.cert_pem)
    cert_file = _write_pem(tmp_path, "client.pem", client_cert.cert_chain_pems[0])
    key_file = _write_pem(tmp_path, "client.key", client_cert.private_key_pem)
    both = _write_pem(tmp_path, "client-both.pem", client_cert.private_key_and_cert_chain_pem)
    web_config = {
        "tls_server_config": {
            "cert_file": _write_pem(tmp_path, "server.pem", server.cert_chain_pems[0]),
            "key_file": _write_pem(tmp_path, "server.key", server.private_key_pem),
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": ca_file,
        }
    }
    own = ssl.create_default_context(cafile=ca_file)
    own.load_cert_chain(both)
    async with RealPrometheus(web_config=web_config, client_ssl=own) as p:
        assert p.url.startswith("https://")
        async with PrometheusClient(p.url, ca_file=ca_file, cert_file=cert_file, key_file=key_file) as c:
            assert (await c.query("vector(3)"))[0].value == 3.0
        async with PrometheusClient(p.url, ca_file=ca_file, cert_file=both) as c:  # key in the cert file
            assert (await c.query("vector(4)"))[0].value == 4.0
        async with PrometheusClient(p.url, ca_file=ca_file) as c:  # no client certificate
            with pytest.raises(PrometheusError) as no_cert:
                await c.query("vector(1)")
        async with PrometheusClient(p.url, cert_file=both) as c:  # the system trust store
            with pytest.raises(PrometheusError) as untrusted:
                await c.query("vector(1)")
        async with PrometheusClient(p.url, cert_file=both, insecure_skip_tls_verify=True) as c:
            assert (await c.query("vector(5)"))[0].value == 5.0
    assert no_cert.value.reason == "unavailable"
    assert untrusted.value.reason == "unavailable" and "certificate" in str(untrusted.value).lower()


async def test_route_prefix_against_real_prometheus() -> None:
    """Prometheus under --web.route-prefix: the client joins api/v1 under any prefix."""
    async with RealPrometheus(route_prefix="select/0/prometheus") as p:
        assert p.url.endswith("/select/0/prometheus")
        for base in (p.url, p.url + "/"):
            async with PrometheusClient(base) as c:
                assert (await c.query("vector(9)"))[0].value == 9.0
                assert await c.series(["up"]) == []
        async with PrometheusClient(p.url.removesuffix("/select/0/prometheus")) as c:
            with pytest.raises(PrometheusError) as wrong:
                await c.query("vector(1)")
    assert wrong.value.reason == "http_404"


# ---- a broken backend (aiohttp fake on loopback) --------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

GOOD_SERIES = {"status": "success", "data": [{"__name__": "up", "job": "x"}]}
GOOD_VECTOR = {
    "status": "success",
    "data": {"resultType": "vector", "result": [{"metric": {"pod": "a"}, "value": [1700000000.5, "+Inf"]}]},
}


class FakeBackend:
    """Answers with ``self.handler`` (default: a good answer) and records every request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.handler: Handler | None = None
        self.sent = 0  # bytes a streaming handler managed to write
        self.url = ""
        self.release = asyncio.Event()  # what a hanging handler waits for (set when the fake stops)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "raw_path": request.raw_path,
                "query": list(request.query.items()),
                "headers": dict(request.headers),
                "body": body,
                "form": list((await request.post()).items()) if request.method == "POST" else [],
            }
        )
        if self.handler is not None:
            return await self.handler(request)
        doc = GOOD_SERIES if request.path.endswith("/series") else GOOD_VECTOR
        return web.json_response(doc)

    async def __aenter__(self) -> FakeBackend:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner, port = await serve_app(app, access_log=None)
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        await self._runner.cleanup()
        self.release = asyncio.Event()


@pytest.fixture
async def fake():
    async with FakeBackend() as backend:
        yield backend


async def _still_good(client: PrometheusClient, fake: FakeBackend) -> None:
    """The client that just failed answers the next good request (nothing stuck or poisoned)."""
    fake.handler = None
    assert await client.series(["up"]) == GOOD_SERIES["data"]
    (sample,) = await client.query("up")
    assert sample.value == float("inf") and sample.labels == {"pod": "a"}


def _clean_log(caplog) -> None:
    assert not any(r.exc_info for r in caplog.records) and "Traceback" not in caplog.text


async def _refused(client: PrometheusClient, call: str = "query") -> PrometheusError:
    with pytest.raises(PrometheusError) as err:
        if call == "query":
            await client.query("up")
        else:
            await client.series(["up"])
    assert err.value.reason in REASONS or re.fullmatch(r"http_[1-5]\d\d", err.value.reason)
    msg = str(err.value)
    assert "\n" not in msg and "\x1b" not in msg and len(msg) < 1500  # printable: <= 300 escaped
    return err.value


async def test_backend_down_is_unavailable(fake: FakeBackend, caplog) -> None:
    port = int(fake.url.rsplit(":", 1)[1])
    await fake.__aexit__(None, None, None)  # nothing listens there any more
    async with PrometheusClient(f"http://127.0.0.1:{port}") as client:
        err = await _refused(client)
        assert err.reason == "unavailable" and "cannot reach" in str(err)
        assert (await _refused(client, "series")).reason == "unavailable"
    await fake.__aenter__()
    async with PrometheusClient(fake.url) as client:
        await _still_good(client, fake)
    _clean_log(caplog)


async def test_slow_backend_times_out(fake: FakeBackend, caplog) -> None:
    async def slow(request: web.Request) -> web.Response:
        await fake.release.wait()
        return web.json_response(GOOD_VECTOR)

    async def slow_body(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"status":"success",')  # headers and a start, then nothing
        await fake.release.wait()
        return resp

    async with PrometheusClient(fake.url, timeout=0.5) as client:
        for handler in (slow, slow_body):
            fake.handler = handler
            err = await _refused(client)
            assert err.reason == "timeout" and "0.5s" in str(err)
        await _still_good(client, fake)
    _clean_log(caplog)


async def test_http_errors_are_http_reasons_with_escaped_text(fake: FakeBackend, caplog) -> None:
    hostile = "<html>\x1b[31mBad Gateway\r\nSet-Cookie: x=1" + "A" * 5000 + "</html>"
    cases = [
        (500, "text/html", hostile, "http_500"),
        (503, "text/plain", "upstream connect error", "http_503"),
        (502, "application/json", '{"message":"no healthy upstream"}', "http_502"),  # JSON, not Prometheus's
        (429, "text/plain", "", "http_429"),
    ]
    async with PrometheusClient(fake.url) as client:
        for status, ctype, body, reason in cases:

            async def answer(request: web.Request, status=status, ctype=ctype, body=body) -> web.Response:
                return web.Response(status=status, text=body, content_type=ctype)

            fake.handler = answer
            err = await _refused(client)
            assert err.reason == reason and err.status == status, (status, err)
            assert f"HTTP {status}" in str(err)
        await _still_good(client, fake)
    _clean_log(caplog)


async def test_prometheus_error_bodies(fake: FakeBackend, caplog) -> None:
    cases = [
        (
            400,
            {"status": "error", "errorType": "bad_data", "error": "parse error"},
            "query_error",
            "bad_data",
        ),
        (
            422,
            {"status": "error", "errorType": "execution", "error": "too many samples"},
            "query_error",
            "execution",
        ),
        (503, {"status": "error", "errorType": "timeout", "error": "query timed out"}, "timeout", "timeout"),
        (
            503,
            {"status": "error", "errorType": "unavailable", "error": "no store"},
            "unavailable",
            "unavailable",
        ),
        # hostile: an errorType that is not a word, a huge error with control characters
        (
            400,
            {"status": "error", "errorType": "x\x1b[2J" * 50, "error": "\n\x1b]0;pwn\x07" * 2000},
            "query_error",
            "other",
        ),
        # an error body over 64 KiB is not read: an HTTP error, its text not parsed
        (400, {"status": "error", "errorType": "bad_data", "error": "x" * 70000}, "http_400", ""),
        (200, {"status": "error", "errorType": 7, "error": ["not", "text"]}, "query_error", "other"),
    ]
    async with PrometheusClient(fake.url) as client:
        for status, doc, reason, etype in cases:

            async def answer(request: web.Request, status=status, doc=doc) -> web.Response:
                return web.json_response(doc, status=status)

            fake.handler = answer
            err = await _refused(client)
            assert (err.reason, err.error_type, err.status) == (reason, etype, status)
        await _still_good(client, fake)
    _clean_log(caplog)


async def test_malformed_answers_are_bad_response(fake: FakeBackend, caplog) -> None:
    vector = lambda result: {"status": "success", "data": {"resultType": "vector", "result": result}}  # noqa: E731
    bodies: list[tuple[str, bytes, str]] = [
        ("query", b"{not json", "application/json"),
        ("query", b"", "application/json"),
        ("query", b'{"status":"success"}', "application/json"),
        ("query", b"[1,2,3]", "application/json"),
        ("query", json.dumps({"status": "success", "data": []}).encode(), "application/json"),
        (
            "query",
            json.dumps({"status": "success", "data": {"resultType": "weird", "result": []}}).encode(),
            "application/json",
        ),
        ("query", json.dumps(vector({"not": "a list"})).encode(), "application/json"),
        ("query", json.dumps(vector(["x"])).encode(), "application/json"),
        ("query", json.dumps(vector([{"metric": {"a": 1}, "value": [1, "2"]}])).encode(), "application/json"),
        ("query", json.dumps(vector([{"metric": {}, "value": [1, "two"]}])).encode(), "application/json"),
        ("query", json.dumps(vector([{"metric": {}, "value": ["1", "2"]}])).encode(), "application/json"),
        ("query", json.dumps(vector([{"metric": {}, "value": [1]}])).encode(), "application/json"),
        ("query", json.dumps(vector([{"metric": {}}])).encode(), "application/json"),
        (
            "query",
            json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [1, None]}}).encode(),
            "application/json",
        ),
        ("series", json.dumps({"status": "success", "data": {"a": "b"}}).encode(), "application/json"),
        ("series", json.dumps({"status": "success", "data": [{"a": 1}]}).encode(), "application/json"),
        ("series", json.dumps({"status": "success", "data": ["up"]}).encode(), "application/json"),
        # the right JSON with the wrong content type (a proxy's page, a misrouted URL)
        ("query", json.dumps(GOOD_VECTOR).encode(), "text/html"),
        ("series", b"<html><body>Sign in</body></html>", "text/html"),
    ]
    async with PrometheusClient(fake.url) as client:
        for call, body, ctype in bodies:

            async def answer(request: web.Request, body=body, ctype=ctype) -> web.Response:
                return web.Response(body=body, content_type=ctype)

            fake.handler = answer
            err = await _refused(client, call)
            assert err.reason == "bad_response", (body, err)
            if ctype == "text/html":
                assert "text/html" in str(err)
        await _still_good(client, fake)
    _clean_log(caplog)


async def test_native_histograms_are_skipped(fake: FakeBackend) -> None:
    doc = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"pod": "h"}, "histogram": [1, {"count": "2", "sum": "3", "buckets": []}]},
                {"metric": {"pod": "v"}, "value": [1, "NaN"]},
            ],
        },
    }

    async def answer(request: web.Request) -> web.Response:
        return web.json_response(doc)

    fake.handler = answer
    async with PrometheusClient(fake.url) as client:
        (sample,) = await client.query("x")
    assert sample.labels == {"pod": "v"} and sample.value != sample.value


def _rss() -> int:
    return psutil.Process().memory_info().rss


async def test_huge_answers_are_too_large_in_bounded_memory(fake: FakeBackend, caplog) -> None:
    """A series list far over the cap: chunked without a length, with a declared length, and a
    gzip bomb. Each is refused as too_large having read at most the cap; the backend could not
    push its whole body; memory stays bounded."""
    cap = 1 << 20
    entry = b'{"__name__":"up","namespace":"default","pod":"web-0000000","job":"x"},'
    chunk = entry * (64 * 1024 // len(entry))

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"status":"success","data":[')
        with contextlib.suppress(ConnectionError):  # the client hangs up: that is the point
            for _ in range(8192):  # 512 MiB if anyone read it all
                await resp.write(chunk)
                fake.sent += len(chunk)
        return resp

    async def declared(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = 256 << 20
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(4096):
                await resp.write(chunk)
                fake.sent += len(chunk)
        return resp

    bomb = gzip.compress(b'{"status":"success","data":[' + chunk * 1600 + b"{}]}", 9)  # ~100 MiB inflated

    async def gzipped(request: web.Request) -> web.Response:
        return web.Response(
            body=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
        )

    before = _rss()
    async with PrometheusClient(fake.url, max_response_bytes=cap) as client:
        for handler in (endless, declared, gzipped):
            fake.handler, fake.sent = handler, 0
            err = await _refused(client, "series")
            assert err.reason == "too_large" and str(cap) in str(err)
            # the connection was dropped: the fake could not write far past the cap (socket buffers)
            assert fake.sent < 64 << 20, (handler.__name__, fake.sent)
        await _still_good(client, fake)
    assert len(bomb) < 1 << 20
    assert _rss() - before < 100 << 20
    _clean_log(caplog)


async def test_redirects_are_not_followed(fake: FakeBackend, tmp_path, caplog) -> None:
    token = tmp_path / "token"
    token.write_text("secret-token\n")

    async def redirect(request: web.Request) -> web.Response:
        if request.path.startswith("/elsewhere"):
            return web.json_response(GOOD_VECTOR)
        raise web.HTTPFound(f"{fake.url}/elsewhere/api/v1/query")

    fake.handler = redirect
    async with PrometheusClient(fake.url, token_file=str(token)) as client:
        err = await _refused(client)
        assert err.reason == "http_302" and "/elsewhere/" in str(err)
        assert [r["path"] for r in fake.requests] == ["/api/v1/query"]
        await _still_good(client, fake)
    _clean_log(caplog)


# ---- what the client sends --------------------------------------------------------------------


async def test_token_file_rotation_is_picked_up(fake: FakeBackend, tmp_path, caplog) -> None:
    token = tmp_path / "token"
    token.write_text("first-token\n")
    async with PrometheusClient(fake.url, token_file=str(token)) as client:
        await client.query("up")
        new = tmp_path / "token.new"
        new.write_text("second-token")
        os.replace(new, token)  # as a projected token is swapped
        await client.series(["up"])
        token.write_text("")  # a half-written rotation: the last good token stays
        await client.query("up")
        token.write_text("third-token")
        await client.query("up")
        seen = [r["headers"].get("Authorization") for r in fake.requests]
        assert seen == [
            "Bearer first-token",
            "Bearer second-token",
            "Bearer second-token",
            "Bearer third-token",
        ]
    # a token file that never held a token: refused before anything is sent
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    fake.requests.clear()
    async with PrometheusClient(fake.url, token_file=str(empty)) as client:
        err = await _refused(client)
        assert err.reason == "unavailable" and "token" in str(err)
        assert fake.requests == []
        empty.write_text("late-token")
        await client.query("up")
    assert fake.requests[-1]["headers"]["Authorization"] == "Bearer late-token"
    assert "Traceback" not in caplog.text


async def test_headers_tenant_and_basic_auth(fake: FakeBackend) -> None:
    async with PrometheusClient(
        fake.url, headers={"X-Scope-OrgID": "team-a|team-b", "X-Extra": "1"}
    ) as client:
        await client.series(["up"])
    sent = fake.requests[-1]["headers"]
    assert sent["X-Scope-OrgID"] == "team-a|team-b" and sent["X-Extra"] == "1"
    assert sent["Accept"] == "application/json" and "Authorization" not in sent
    with_user = fake.url.replace("http://", "http://user:p%40ss@")
    client = PrometheusClient(with_user)
    assert "p%40ss" not in client.url and "user" not in client.url
    async with client:
        await client.query("up")
    assert fake.requests[-1]["headers"]["Authorization"] == "Basic dXNlcjpwQHNz"  # user:p@ss
    for bad in ({"X-Bad": "a\r\nInjected: 1"}, {"Bad Name": "x"}, {"": "x"}):
        with pytest.raises(ValueError):
            PrometheusClient(fake.url, headers=bad)


async def test_path_prefix_and_query_are_joined(fake: FakeBackend) -> None:
    bases = [
        ("/select/0/prometheus", "/select/0/prometheus/api/v1/"),
        ("/select/0/prometheus/", "/select/0/prometheus/api/v1/"),
        ("", "/api/v1/"),
        ("/", "/api/v1/"),
        ("/a%20b/prom", "/a%20b/prom/api/v1/"),
    ]
    for suffix, expected in bases:
        fake.requests.clear()
        async with PrometheusClient(fake.url + suffix) as client:
            await client.series(['up{job="a b"}', "x"], start=10.5, end=20)
            await client.query('sum(rate(x{a="b&c"}[1m]))', at=1700000000.25)
        series, query = fake.requests
        assert series["raw_path"].split("?")[0] == expected + "series"
        assert query["raw_path"].split("?")[0] == expected + "query"
        assert series["query"] == [
            ("match[]", 'up{job="a b"}'),
            ("match[]", "x"),
            ("start", "10.500"),
            ("end", "20.000"),
        ]
        assert query["query"] == [("query", 'sum(rate(x{a="b&c"}[1m]))'), ("time", "1700000000.250")]
    fake.requests.clear()
    async with PrometheusClient(fake.url + "/prom?tenant=t1") as client:  # a gateway's parameter kept
        await client.query("up")
    assert fake.requests[0]["path"] == "/prom/api/v1/query"
    assert fake.requests[0]["query"] == [("tenant", "t1"), ("query", "up")]
    assert str(api_url("http://vm:8428", "api/v1/series")) == "http://vm:8428/api/v1/series"


async def test_post_verb_sends_a_form(fake: FakeBackend) -> None:
    async with PrometheusClient(fake.url + "/prefix", method="POST") as client:
        await client.series(["up", 'x{a="1"}'], end=5)
        await client.query("vector(1)", at=3)
    series, query = fake.requests
    assert series["method"] == query["method"] == "POST"
    assert series["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    assert series["path"] == "/prefix/api/v1/series" and series["query"] == []
    assert series["form"] == [("match[]", "up"), ("match[]", 'x{a="1"}'), ("end", "5.000")]
    assert query["form"] == [("query", "vector(1)"), ("time", "3.000")]


def test_bad_construction_is_a_value_error(tmp_path) -> None:
    for url in ("prometheus:9090", "ftp://h/", "/api", "http://h/#x", ""):
        with pytest.raises(ValueError):
            PrometheusClient(url)
    with pytest.raises(ValueError, match="GET or POST"):
        PrometheusClient("http://h", method="PUT")
    for timeout in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            PrometheusClient("http://h", timeout=timeout)
    with pytest.raises(ValueError, match="max_response_bytes"):
        PrometheusClient("http://h", max_response_bytes=10)
    with pytest.raises(ValueError, match="TLS files"):
        PrometheusClient("https://h", ca_file=str(tmp_path / "missing.pem"))
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    with pytest.raises(ValueError, match="TLS files"):
        PrometheusClient("https://h", cert_file=str(not_pem))


async def test_many_concurrent_calls_share_one_client(fake: FakeBackend, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    async with PrometheusClient(fake.url) as client:
        results = await asyncio.gather(*(client.query(f"up{i}") for i in range(200)))
    assert all(len(r) == 1 for r in results) and len(fake.requests) == 200
    _clean_log(caplog)


def test_missing_prometheus_binary_says_how_to_install(tmp_path) -> None:
    """Without the binary the bridge's tests fail with the install command (they never skip)."""
    with pytest.raises(PrometheusNotInstalled, match=r"sh tests/system-deps\.sh"):
        prometheus_binary(search_path=str(tmp_path))
    assert os.access(prometheus_binary(), os.X_OK)


async def test_queries_uncompressed_series_lists_gzip(fake: FakeBackend) -> None:
    async with PrometheusClient(fake.url) as client:
        await client.query("up")
        await client.series(["up"])
    query, series = fake.requests
    assert query["headers"]["Accept-Encoding"] == "identity"
    assert "gzip" in series["headers"]["Accept-Encoding"]
    fake.requests.clear()
    async with PrometheusClient(fake.url, headers={"Accept-Encoding": "gzip"}) as client:  # the user's wins
        await client.query("up")
        await client.series(["up"])
    assert [r["headers"]["Accept-Encoding"] for r in fake.requests] == ["gzip", "gzip"]
