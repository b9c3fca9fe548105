"""The agent's /metrics as a hostile tenant meets it: real TLS on loopback, the fake API server's
TokenReview and SubjectAccessReview, a real `kcms agent` process, and the real agent collector.

Every pod's metrics on a node are in its agent's buffer. A reader must present a token (or a client
certificate) that the API server accepts *and* that RBAC lets `get` `nodes/metrics` of that node,
as for the kubelet's own /metrics. The collector, in turn, must refuse an agent whose certificate
does not verify before it sends its token.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import ssl
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
import trustme
from _http_helpers import serve_app
from _process_helpers import stop_process
from _stores import free_port
from aiohttp import web
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from kcms.agent.auth import MetricsAuth
from kcms.agent.buffer import SampleBuffer
from kcms.agent.server import Agent, ServingTLS
from kcms.collector.agents import DEFAULT_AGENT_SERVER_NAME, AgentAccess, AgentCollector, TokenFile
from kcms.kube.client import KubeClient
from kcms.kube.reviews import AccessReviewer, TokenReviewer
from kcms.model import ObjectRef
from kcms.store.series import SeriesStore

REPO = Path(__file__).resolve().parent.parent
NODE = "node-a"
COLLECTOR = "collector-token"
POD = "pod-token"
COLLECTOR_USER = "system:serviceaccount:kube-system:kcms-collector"
POD_USER = "system:serviceaccount:shop:web"
SECRET_METRIC = "shop_orders_total"  # what a tenant must not learn about another tenant
WANTED_ATTRIBUTES = {
    "verb": "get",
    "version": "v1",
    "resource": "nodes",
    "subresource": "metrics",
    "name": NODE,
}


def refusals(reason: str) -> float:
    return REGISTRY.get_sample_value("kcms_agent_metrics_refusals_total", {"reason": reason}) or 0.0


def allow_collector(spec: dict) -> tuple[bool, str]:
    """RBAC as a ClusterRole with nodes/metrics get bound to the collector (and to cert group ops)."""
    grant = spec.get("resourceAttributes") == WANTED_ATTRIBUTES and (
        spec.get("user") == COLLECTOR_USER or "kcms:metrics-readers" in spec.get("groups", [])
    )
    return (True, "allowed by ClusterRole kcms-collector") if grant else (False, "no RBAC policy matched")


@pytest.fixture
def client_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def agent(ca: trustme.CA, client_ca: trustme.CA, fake_kube, tmp_path: Path):
    """An agent serving real TLS (the name deploy/agent's certificate has) with the reviews on."""
    fake_kube.tokens[COLLECTOR] = {
        "username": COLLECTOR_USER,
        "uid": "1",
        "groups": ["system:serviceaccounts"],
    }
    fake_kube.tokens[POD] = {"username": POD_USER, "uid": "2", "groups": ["system:serviceaccounts"]}
    fake_kube.authorize = allow_collector
    cert = ca.issue_cert(DEFAULT_AGENT_SERVER_NAME, "127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "agent.pem"))
    client_ca.cert_pem.write_to_path(str(tmp_path / "client-ca.pem"))
    pem = str(tmp_path / "agent.pem")
    buffer = SampleBuffer()
    now = time.time()
    buffer.add(SECRET_METRIC, ObjectRef("pods", "shop", "web-1"), (("tenant", "shop"),), now - 1, 42.0)
    buffer.add("node_load1", ObjectRef("nodes", "", NODE), (), now - 1, 0.5)

    async def push(request: web.Request) -> web.Response:  # an open route, like the OTLP receiver
        return web.Response(text="pushed")

    kube = await KubeClient.load(str(fake_kube.kubeconfig))
    tls = ServingTLS(pem, pem, str(tmp_path / "client-ca.pem"))
    auth = MetricsAuth(NODE, TokenReviewer(kube, 120, failure_ttl=10, max_entries=50), AccessReviewer(kube))
    a = Agent(
        buffer, {}, interval=3600, listen="127.0.0.1:0", extra_routes=[("POST", "/v1/push", push)],
        ssl_context=tls, auth=auth,
    )  # fmt: skip
    await a.start()
    a.base = f"https://127.0.0.1:{a.port}"  # type: ignore[attr-defined]
    try:
        yield a
    finally:
        await a.stop()
        await kube.close()


def trusting(ca: trustme.CA, client: trustme.LeafCert | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    ctx.check_hostname = False  # these reads go to 127.0.0.1; the collector tests check the name
    if client is not None:
        client.configure_cert(ctx)
    return ctx


async def get(url: str, ctx: ssl.SSLContext | bool, token: str | None = None) -> tuple[int, bytes, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as s, s.get(url, ssl=ctx, headers=headers) as r:
        return r.status, await r.read(), dict(r.headers)


def assert_refused(status: int, body: bytes, code: int) -> dict:
    assert status == code, body
    assert SECRET_METRIC.encode() not in body and b"node_load1" not in body
    doc = orjson.loads(body)
    assert doc["kind"] == "Status" and doc["code"] == code and doc["status"] == "Failure"
    return doc


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text
    assert "Traceback" not in caplog.text


async def test_anonymous_and_forged_tokens_get_401_and_no_metrics(agent, ca, fake_kube, caplog) -> None:
    caplog.set_level(logging.INFO)
    ctx = trusting(ca)
    before = refusals("unauthenticated"), refusals("invalid_token")
    status, body, headers = await get(f"{agent.base}/metrics", ctx)
    assert_refused(status, body, 401)
    assert headers["WWW-Authenticate"].startswith("Bearer")
    for header in ("Basic YWRtaW46YWRtaW4=", "Bearer", "Bearer    ", "bearer\tx y"):
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{agent.base}/metrics", ssl=ctx, headers={"Authorization": header}) as r:
                assert_refused(r.status, await r.read(), 401)
    # A flood of made-up tokens: each refused; the review cache stays at its bound.
    for _ in range(120):
        status, body, _ = await get(f"{agent.base}/metrics?since=0", ctx, secrets.token_urlsafe(24))
        assert_refused(status, body, 401)
    assert len(agent.auth.tokens._cache) <= 50
    assert refusals("unauthenticated") - before[0] == 5
    assert refusals("invalid_token") - before[1] == 120
    assert not fake_kube.access_reviews  # nobody got as far as authorization
    # The other endpoints are unaffected: probes and pushes need no credential, the collector reads.
    status, body, _ = await get(f"{agent.base}/healthz", ctx)
    assert (status, body) == (200, b"ok\n")
    async with aiohttp.ClientSession() as s, s.post(f"{agent.base}/v1/push", ssl=ctx) as r:
        assert (r.status, await r.text()) == (200, "pushed")
    status, body, _ = await get(f"{agent.base}/metrics", ctx, COLLECTOR)
    assert status == 200 and SECRET_METRIC.encode() in body
    no_traceback(caplog)
    # One escaped line per refusal, naming the reason.
    lines = [r.getMessage() for r in caplog.records if r.name == "kcms.agent.auth"]
    assert len(lines) == 125 and all("\n" not in line for line in lines)


async def test_a_pods_token_without_nodes_metrics_gets_403(agent, ca, fake_kube, caplog) -> None:
    caplog.set_level(logging.INFO)
    ctx = trusting(ca)
    before = refusals("forbidden")
    status, body, _ = await get(f"{agent.base}/metrics?since=0", ctx, POD)
    doc = assert_refused(status, body, 403)
    assert POD_USER in doc["message"] and "nodes/metrics" in doc["message"]
    # The review asked what the kubelet asks for its own /metrics: get nodes/metrics of this node.
    (review,) = fake_kube.access_reviews
    assert review["spec"]["user"] == POD_USER
    assert review["spec"]["resourceAttributes"] == WANTED_ATTRIBUTES
    # Asked again: the denial is cached (no second review), and still refused.
    status, body, _ = await get(f"{agent.base}/metrics", ctx, POD)
    assert_refused(status, body, 403)
    assert len(fake_kube.access_reviews) == 1 and refusals("forbidden") - before == 2
    # The collector's token, reviewed the same way, reads everything.
    status, body, headers = await get(f"{agent.base}/metrics?since=0", ctx, COLLECTOR)
    assert status == 200 and SECRET_METRIC.encode() in body and "X-KCMS-Agent-Time" in headers
    assert [r["spec"]["user"] for r in fake_kube.access_reviews] == [POD_USER, COLLECTOR_USER]
    status, _, _ = await get(f"{agent.base}/healthz", ctx)
    assert status == 200
    no_traceback(caplog)


async def test_mutual_tls_trusted_untrusted_and_unauthorized_certificates(
    agent, ca, client_ca, fake_kube, caplog
) -> None:
    caplog.set_level(logging.INFO)
    reader = client_ca.issue_cert(common_name="ops-reader", organization_name="kcms:metrics-readers")
    status, body, _ = await get(f"{agent.base}/metrics", trusting(ca, reader))
    assert status == 200 and SECRET_METRIC.encode() in body
    review = fake_kube.access_reviews[-1]["spec"]
    assert (review["user"], review["groups"]) == ("ops-reader", ["kcms:metrics-readers"])
    assert review["resourceAttributes"] == WANTED_ATTRIBUTES

    # A certificate from a CA the agent does not trust (with the same names) is refused in the
    # handshake, token or not: no HTTP response at all.
    forger = trustme.CA().issue_cert(common_name="ops-reader", organization_name="kcms:metrics-readers")
    with pytest.raises(aiohttp.ClientError):
        await get(f"{agent.base}/metrics", trusting(ca, forger))
    with pytest.raises(aiohttp.ClientError):
        await get(f"{agent.base}/metrics", trusting(ca, forger), COLLECTOR)

    # A trusted certificate whose user RBAC does not let read nodes/metrics: 403.
    tenant = client_ca.issue_cert(common_name="tenant", organization_name="shop")
    status, body, _ = await get(f"{agent.base}/metrics", trusting(ca, tenant))
    assert_refused(status, body, 403)
    status, _, _ = await get(f"{agent.base}/healthz", trusting(ca))
    assert status == 200
    no_traceback(caplog)


async def test_plain_http_to_the_tls_port_gets_nothing(agent, caplog) -> None:
    caplog.set_level(logging.INFO)
    port = agent.port
    with pytest.raises(aiohttp.ClientError):
        await get(f"http://127.0.0.1:{port}/metrics", False, COLLECTOR)
    # A raw plain-text request: the connection is closed without a byte of metrics.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {COLLECTOR}\r\n\r\n".encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), 10)
    writer.close()
    assert SECRET_METRIC.encode() not in answer and b"200 OK" not in answer
    no_traceback(caplog)


async def test_review_outage_gives_503_never_metrics(ca, tmp_path, caplog) -> None:
    """The API server cannot be reached: nothing is served on a guess, and the caller may retry."""
    caplog.set_level(logging.INFO)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    (tmp_path / "dead.kubeconfig").write_text(
        orjson.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": f"https://127.0.0.1:{dead}",
                                              "certificate-authority": str(tmp_path / "ca.pem")}}
                ],
                "users": [{"name": "u", "user": {"token": "agent-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        ).decode()
    )  # fmt: skip
    kube = await KubeClient.load(str(tmp_path / "dead.kubeconfig"))
    cert = ca.issue_cert(DEFAULT_AGENT_SERVER_NAME, "127.0.0.1")
    pem = str(tmp_path / "agent.pem")
    cert.private_key_and_cert_chain_pem.write_to_path(pem)
    buffer = SampleBuffer()
    buffer.add(SECRET_METRIC, ObjectRef("pods", "shop", "web-1"), (), time.time() - 1, 1.0)
    agent = Agent(
        buffer, {}, interval=3600, listen="127.0.0.1:0", ssl_context=ServingTLS(pem, pem),
        auth=MetricsAuth.from_client(NODE, kube),
    )  # fmt: skip
    await agent.start()
    before = refusals("review_unavailable")
    try:
        status, body, headers = await get(f"https://127.0.0.1:{agent.port}/metrics", trusting(ca), COLLECTOR)
        assert_refused(status, body, 503)
        assert headers["Retry-After"] == "1"
        assert refusals("review_unavailable") - before == 1
        status, body, _ = await get(f"https://127.0.0.1:{agent.port}/healthz", trusting(ca))
        assert status == 200
    finally:
        await agent.stop()
        await kube.close()
    no_traceback(caplog)


# ----- the collector's side -------------------------------------------------------------------------


def collector_for(agent_or_port, ca_file: str, token_source, **access) -> AgentCollector:
    port = agent_or_port if isinstance(agent_or_port, int) else agent_or_port.port
    return AgentCollector(
        None,
        SeriesStore(),
        selector="",
        targets=lambda: [("kube-system/kcms-agent-a", f"127.0.0.1:{port}")],
        access=AgentAccess(ca_file=ca_file, token_source=token_source, **access),
    )


async def test_collector_verifies_the_agent_and_sends_its_token(agent, ca, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO)
    ca_file = str(tmp_path / "agent-ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    collector = collector_for(agent, ca_file, lambda: COLLECTOR)
    try:
        assert await collector.run_cycle() == 0
        got = collector.store.query("pods", "shop", ["web-1"], SECRET_METRIC)
        assert [r.obj.name for r in got] == ["web-1"]
    finally:
        await collector.stop()

    # A pod's token: refused by the agent, counted by the collector, nothing stored.
    collector = collector_for(agent, ca_file, lambda: POD)
    try:
        assert await collector.run_cycle() == 1
        assert collector.failures == {("kube-system/kcms-agent-a", "http_403"): 1}
        assert collector.store.stats()["points"] == 0
    finally:
        await collector.stop()

    # The token file is re-read when it changes (projected tokens rotate): wrong, then right.
    token_file = tmp_path / "token"
    token_file.write_text("expired-token\n")
    collector = collector_for(agent, ca_file, TokenFile(str(token_file)))
    try:
        assert await collector.run_cycle() == 1
        assert ("kube-system/kcms-agent-a", "http_401") in collector.failures
        token_file.write_text(COLLECTOR + "\n")
        os.utime(token_file, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))  # a new mtime, surely
        assert await collector.run_cycle() == 0
        assert collector.store.stats()["points"] > 0
    finally:
        await collector.stop()
    no_traceback(caplog)


async def test_collector_with_a_client_certificate_needs_no_token(
    agent, ca, client_ca, tmp_path, caplog
) -> None:
    """Mutual TLS from the collector's side: its certificate (from the agent's client CA, in a group
    RBAC lets read nodes/metrics) is its identity; a certificate from another CA is refused."""
    caplog.set_level(logging.INFO)
    ca_file = str(tmp_path / "agent-ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    for i, (issuer, expected) in enumerate(((client_ca, 0), (trustme.CA(), 1))):
        pem = str(tmp_path / f"collector-{i}.pem")
        cert = issuer.issue_cert(common_name="kcms-collector", organization_name="kcms:metrics-readers")
        cert.private_key_and_cert_chain_pem.write_to_path(pem)
        collector = collector_for(agent, ca_file, None, client_cert_file=pem, client_key_file=pem)
        try:
            assert await collector.run_cycle() == expected
            if expected:  # refused in the handshake: nothing stored, counted
                assert collector.store.stats()["points"] == 0
                assert {reason for _, reason in collector.failures} <= {"tls", "connection"}
            else:
                assert collector.store.stats()["points"] > 0
        finally:
            await collector.stop()
    no_traceback(caplog)


async def start_impostor(pem: str, seen: list[str]) -> tuple[web.AppRunner, int]:
    """A server on the agent's address that answers /metrics to anyone and records the token."""

    async def steal(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.Response(text='# TYPE fake gauge\nfake{kcms_resource="nodes",kcms_name="x"} 1\n')

    app = web.Application()
    app.router.add_get("/metrics", steal)
    return await serve_app(app, ssl_context=ServingTLS(pem, pem).context)


async def test_collector_refuses_an_impostor_agent_before_sending_its_token(ca, tmp_path, caplog) -> None:
    """A MITM on the node IP:port with a certificate for the right name from another CA, and one from
    the right CA for another name: both fail verification and never see a request."""
    caplog.set_level(logging.INFO)
    ca_file = str(tmp_path / "agent-ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    seen: list[str] = []
    cases = [
        ("wrong CA", trustme.CA(), [DEFAULT_AGENT_SERVER_NAME, "127.0.0.1"]),
        ("wrong name", ca, ["evil.example", "127.0.0.1"]),
    ]
    for i, (name, issuer, identities) in enumerate(cases):
        pem = str(tmp_path / f"mitm-{i}.pem")
        issuer.issue_cert(*identities).private_key_and_cert_chain_pem.write_to_path(pem)
        runner, port = await start_impostor(pem, seen)
        collector = collector_for(port, ca_file, lambda: COLLECTOR)
        try:
            assert await collector.run_cycle() == 1, name
            assert collector.failures == {("kube-system/kcms-agent-a", "tls_verify"): 1}, name
            assert collector.store.stats()["points"] == 0
            assert seen == [], f"{name}: the impostor got a request"
        finally:
            await collector.stop()
            await runner.cleanup()
    # Verification off (the test-only flag): the same impostor is believed; this is what it prevents.
    pem = str(tmp_path / "mitm-0.pem")
    runner, port = await start_impostor(pem, seen)
    collector = collector_for(port, ca_file, lambda: COLLECTOR, insecure_tls=True)
    try:
        assert await collector.run_cycle() == 0
        assert seen == [f"Bearer {COLLECTOR}"]
    finally:
        await collector.stop()
        await runner.cleanup()
    no_traceback(caplog)


async def test_collector_with_a_missing_ca_file_fails_cleanly_then_recovers(
    agent, ca, tmp_path, caplog
) -> None:
    """The CA's Secret not mounted yet: counted as tls_config, no traceback; it appears: scraped."""
    caplog.set_level(logging.INFO)
    ca_file = tmp_path / "later" / "ca.crt"
    collector = collector_for(agent, str(ca_file), lambda: COLLECTOR)
    try:
        assert await collector.run_cycle() == 1
        assert collector.failures == {("kube-system/kcms-agent-a", "tls_config"): 1}
        ca_file.parent.mkdir()
        ca.cert_pem.write_to_path(str(ca_file))
        assert await collector.run_cycle() == 0
        assert collector.store.stats()["points"] > 0
    finally:
        await collector.stop()
    no_traceback(caplog)


# ----- the real process -----------------------------------------------------------------------------


def open_log(path: Path):
    return open(path, "wb")  # noqa: SIM115 - closed by the caller's with


def test_the_agent_will_not_serve_plain_http_unless_told() -> None:
    env = {**os.environ, "NODE_NAME": NODE}
    run = subprocess.run(
        [sys.executable, "-m", "kcms.cmd.agent", "--no-cgroups", "--no-apps", "--no-kubelet"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "--tls-cert-file" in run.stderr and "--insecure-serving" in run.stderr
    assert "Traceback" not in run.stderr


async def test_agent_process_guards_metrics_and_keeps_probes_and_otlp_open(ca, fake_kube, tmp_path) -> None:
    fake_kube.tokens[COLLECTOR] = {
        "username": COLLECTOR_USER,
        "uid": "1",
        "groups": ["system:serviceaccounts"],
    }
    fake_kube.tokens[POD] = {"username": POD_USER, "uid": "2", "groups": ["system:serviceaccounts"]}
    fake_kube.authorize = allow_collector
    pem = str(tmp_path / "agent.pem")
    ca.issue_cert(DEFAULT_AGENT_SERVER_NAME, "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(pem)
    port, otlp_port = free_port(), free_port()
    log_path = tmp_path / "agent.log"
    with open_log(log_path) as log_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kcms.cmd.agent", f"--node-name={NODE}",
            f"--kubeconfig={fake_kube.kubeconfig}", "--no-cgroups", "--no-apps", "--no-kubelet",
            f"--listen=127.0.0.1:{port}", f"--otlp-listen=127.0.0.1:{otlp_port}", "--interval=200ms",
            f"--tls-cert-file={pem}", f"--tls-private-key-file={pem}",
            cwd=REPO, stderr=log_file,
        )  # fmt: skip
    ctx = trusting(ca)
    base = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        body = b""
        while b"node_load1" not in body:
            assert proc.returncode is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            await asyncio.sleep(0.1)
            try:
                status, body, _ = await get(f"{base}/metrics", ctx, COLLECTOR)
            except aiohttp.ClientError:
                continue
        status, body, _ = await get(f"{base}/metrics", ctx)
        assert_refused(status, body, 401)
        status, body, _ = await get(f"{base}/metrics", ctx, POD)
        assert_refused(status, body, 403)
        with pytest.raises(aiohttp.ClientError):
            await get(f"http://127.0.0.1:{port}/metrics", False, COLLECTOR)
        status, body, _ = await get(f"{base}/healthz", ctx)
        assert (status, body) == (200, b"ok\n")
        # OTLP needs no reader credential: on the TLS port and on the plain push port alike it is
        # answered by the receiver (which may refuse an empty body), never by the /metrics guard.
        for url, tls in ((f"{base}/v1/metrics", ctx), (f"http://127.0.0.1:{otlp_port}/v1/metrics", False)):
            async with aiohttp.ClientSession() as s:
                async with s.post(
                    url, ssl=tls, data=b"", headers={"Content-Type": "application/x-protobuf"}
                ) as r:
                    assert r.status not in (401, 403, 404, 405), (url, r.status)
        # The plain push port never serves /metrics.
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{otlp_port}/metrics") as r:
                assert r.status == 404 and b"node_load1" not in await r.read()
            async with s.get(f"http://127.0.0.1:{otlp_port}/healthz") as r:
                assert r.status == 200
    finally:
        assert await stop_process(proc) == 0
    log = log_path.read_text()
    assert "Traceback" not in log, log
    assert "refused (unauthenticated" in log and "refused (forbidden" in log


async def test_standalone_pipeline_scrapes_the_guarded_agent_with_its_flags(
    agent, ca, fake_kube, tmp_path
) -> None:
    """`kcms standalone` as its flags build it (--agent-selector, --agent-ca-file, --agent-token-file):
    discovers the agent pod, verifies the agent, authenticates, and the agent's series reach the store;
    the same pipeline with a tenant's token stores nothing."""
    from _pipeline import start_env, stop_env
    from fakeobjects import make_node, make_pod

    from kcms.sim import SimulatedCluster

    ca_file, token_file = tmp_path / "agent-ca.pem", tmp_path / "agent-token"
    ca.cert_pem.write_to_path(str(ca_file))
    fake_kube.upsert(make_pod("kube-system", "kcms-agent-x", NODE, labels={"app": "kcms-agent"}))
    # The agent reports for its node: the inventory must place the node and the pod it reports on it.
    fake_kube.upsert(make_node(NODE))
    fake_kube.upsert(make_pod("shop", "web-1", NODE))
    sim = SimulatedCluster(nodes=1, pods_per_node=1, containers_per_pod=1, seed=4, ca=ca)
    await sim.start()
    try:
        for token, stored in ((POD, False), (COLLECTOR, True)):
            token_file.write_text(token)
            env = await start_env(
                ca, fake_kube, tmp_path, sim, agent_selector="app=kcms-agent", agent_port=agent.port,
                agent_ca_file=str(ca_file), agent_token_file=str(token_file), agent_scrape_interval=3600.0,
            )  # fmt: skip
            try:
                collector = env.pipeline.agents
                await collector.sync()
                assert collector.targets() == [("kube-system/kcms-agent-x", f"127.0.0.1:{agent.port}")]
                assert await collector.run_cycle() == (0 if stored else 1)
                got = env.pipeline.series.query("pods", "shop", ["web-1"], SECRET_METRIC)
                assert bool(got) is stored
                if not stored:
                    # (the pipeline's own loop may have scraped too: every failure is this one)
                    assert set(collector.failures) == {("kube-system/kcms-agent-x", "http_403")}
            finally:
                await stop_env(env)
    finally:
        await sim.stop()


class Relay:
    """A TCP relay in front of the fake API server that can be frozen: a hung API server."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.thawed = asyncio.Event()
        self.thawed.set()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self.thawed.wait()  # frozen: bytes are held, nothing is answered
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def stop(self) -> None:
        self.thawed.set()
        if self.server is not None:
            self.server.close()


async def test_a_flood_of_unknown_tokens_on_a_hung_api_server_cannot_lock_the_collector_out(
    ca, fake_kube, tmp_path, caplog
) -> None:
    """Reviews of unknown callers are bounded (--max-pending-reviews): past the bound they get 429 at
    once instead of piling up; the collector, known from an earlier review, is served throughout."""
    caplog.set_level(logging.INFO)
    fake_kube.tokens[COLLECTOR] = {
        "username": COLLECTOR_USER,
        "uid": "1",
        "groups": ["system:serviceaccounts"],
    }
    fake_kube.authorize = allow_collector
    relay = Relay(fake_kube.port)
    await relay.start()
    kubeconfig = tmp_path / "relayed.kubeconfig"
    kubeconfig.write_text(
        fake_kube.kubeconfig.read_text().replace(f"127.0.0.1:{fake_kube.port}", f"127.0.0.1:{relay.port}")
    )
    kube = await KubeClient.load(str(kubeconfig))
    pem = str(tmp_path / "agent.pem")
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(pem)
    buffer = SampleBuffer()
    buffer.add(SECRET_METRIC, ObjectRef("pods", "shop", "web-1"), (), time.time() - 1, 1.0)
    auth = MetricsAuth.from_client(NODE, kube, max_pending=2)
    agent = Agent(
        buffer, {}, interval=3600, listen="127.0.0.1:0", ssl_context=ServingTLS(pem, pem), auth=auth
    )
    await agent.start()
    url, ctx = f"https://127.0.0.1:{agent.port}", trusting(ca)
    before = refusals("too_many_reviews")
    try:
        status, body, _ = await get(f"{url}/metrics", ctx, COLLECTOR)
        assert status == 200 and SECRET_METRIC.encode() in body
        relay.thawed.clear()  # the API server hangs from now on
        stuck = [asyncio.create_task(get(f"{url}/metrics", ctx, secrets.token_urlsafe(16))) for _ in range(2)]
        deadline = time.monotonic() + 20
        while auth.pending < 2:  # noqa: ASYNC110 (polling a condition nothing signals)
            assert time.monotonic() < deadline, "the reviews never started"
            await asyncio.sleep(0.01)
        for _ in range(5):
            status, body, headers = await get(f"{url}/metrics", ctx, secrets.token_urlsafe(16))
            assert_refused(status, body, 429)
            assert headers["Retry-After"] == "1"
        assert refusals("too_many_reviews") - before == 5
        # The collector's token is known: it never waits behind the flood, even with the API hung.
        status, body, _ = await get(f"{url}/metrics", ctx, COLLECTOR)
        assert status == 200 and SECRET_METRIC.encode() in body
        status, _, _ = await get(f"{url}/healthz", ctx)
        assert status == 200
        relay.thawed.set()  # the API server answers again: the stuck reviews finish, refused
        for status, body, _ in await asyncio.gather(*stuck):
            assert_refused(status, body, 401)
        assert auth.pending == 0
    finally:
        await agent.stop()
        await kube.close()
        await relay.stop()
    no_traceback(caplog)


async def test_the_agents_own_counters_are_served_to_the_collector_only(agent, ca, caplog) -> None:
    """/metrics/agent serves the refusal counters (so an operator sees the attacks), guarded like
    /metrics: an anonymous caller or a pod learns nothing."""
    caplog.set_level(logging.INFO)
    ctx = trusting(ca)
    status, body, _ = await get(f"{agent.base}/metrics/agent", ctx)
    assert status == 401 and b"kcms_agent" not in body
    status, body, _ = await get(f"{agent.base}/metrics/agent", ctx, POD)
    assert status == 403 and b"kcms_agent" not in body
    status, body, headers = await get(f"{agent.base}/metrics/agent", ctx, COLLECTOR)
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    refused = {
        s.labels["reason"]: s.value
        for s in families["kcms_agent_metrics_refusals"].samples
        if s.name.endswith("_total")
    }
    assert refused["unauthenticated"] >= 1 and refused["forbidden"] >= 1  # the two calls above
    assert SECRET_METRIC.encode() not in body  # counters only, no pod's data
    # A since= that is not a number: a short, escaped 400, not the caller's text echoed at length.
    status, body, _ = await get(f"{agent.base}/metrics?since=" + "9x\x1b[31m" * 500, ctx, COLLECTOR)
    assert status == 400 and len(body) < 200 and b"\x1b" not in body
    no_traceback(caplog)
