"""The agent's HTTP server, collection loop and command line (real sockets, a real subprocess)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import trustme
from _process_helpers import stop_process
from _stores import free_port
from aiohttp import web
from test_agent_buffer import parse_agent_text
from test_agent_cgroups import pod, write_cgroup

from kcms.agent.buffer import SampleBuffer
from kcms.agent.cgroups import CgroupSource
from kcms.agent.server import AGENT_TIME_HEADER, Agent
from kcms.model import ObjectRef

NODE = ObjectRef("nodes", "", "node-a")
REPO = Path(__file__).resolve().parent.parent


class Ticker:
    """A source whose value counts its collections."""

    def __init__(self) -> None:
        self.n = 0
        self.types = {"ticks": "counter"}

    def collect(self, now: float) -> list:
        self.n += 1
        return [("ticks", NODE, (), now, float(self.n))]


class AsyncTicker(Ticker):
    async def collect(self, now: float) -> list:  # type: ignore[override]
        await asyncio.sleep(0)
        return [("async_ticks", NODE, (), now, 1.0)]


class Broken:
    def collect(self, now: float) -> list:
        raise RuntimeError("this source is broken")


async def test_metrics_since_healthz_and_extra_routes() -> None:
    buffer = SampleBuffer()
    t0 = int(time.time()) - 10  # recent: the loop's first cycle expires points older than the retention
    for i in range(3):
        buffer.add("temp", NODE, (), t0 + i, 20.0 + i)

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    agent = Agent(
        buffer, {}, interval=3600, listen="127.0.0.1:0", extra_routes=[("POST", "/v1/hello", hello)]
    )
    await agent.start()
    base = f"http://127.0.0.1:{agent.port}"
    try:
        async with aiohttp.ClientSession() as s:
            before = int(time.time() * 1000)
            async with s.get(f"{base}/metrics") as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                agent_time = int(r.headers[AGENT_TIME_HEADER])
                text = await r.text()
            assert before <= agent_time <= int(time.time() * 1000)
            assert parse_agent_text(text)[1] == [("temp", NODE, (), 22.0, (t0 + 2) * 1000)]
            async with s.get(f"{base}/metrics", params={"since": str(t0 * 1000)}) as r:
                _, samples = parse_agent_text(await r.text())
            assert [v for *_, v, _ in samples] == [21.0, 22.0]
            async with s.get(f"{base}/metrics", params={"since": "soon"}) as r:
                assert r.status == 400 and "since" in await r.text()
            async with s.get(f"{base}/healthz") as r:
                assert r.status == 200 and (await r.text()).strip() == "ok"
            async with s.post(f"{base}/v1/hello") as r:
                assert await r.text() == "hello"
    finally:
        await agent.stop()


async def test_collection_loop_runs_sources_and_survives_a_broken_one(tmp_path: Path) -> None:
    web1 = pod("default", "web-1", ("app",))
    pod_dir = tmp_path / "kubepods" / f"pod{web1.uid}"
    write_cgroup(pod_dir)
    ticker = Ticker()
    sources = {
        "broken": Broken(),
        "ticker": ticker,
        "async": AsyncTicker(),
        "cgroups": CgroupSource(lambda: [web1], str(tmp_path)),
    }
    buffer = SampleBuffer(retention=60)
    agent = Agent(buffer, sources, interval=0.05, listen="127.0.0.1:0")
    await agent.start()
    try:
        while ticker.n < 3:
            await agent.wait_cycle()
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{agent.port}/metrics", params={"since": "0"}) as r:
                types, samples = parse_agent_text(await r.text())
    finally:
        await agent.stop()
    ticks = [v for m, _, _, v, _ in samples if m == "ticks"]
    assert ticks[:3] == [1.0, 2.0, 3.0]
    assert types["ticks"] == "counter"
    assert any(m == "async_ticks" for m, *_ in samples)
    usage = [v for m, o, lb, v, _ in samples if m == "container_cpu_usage_seconds_total"]
    assert usage and usage[0] == 1.5
    assert agent.last_accepted["cgroups"] > 0 and "broken" not in agent.last_accepted


async def test_tls_serving(ca: trustme.CA) -> None:
    cert = ca.issue_cert("127.0.0.1")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    buffer = SampleBuffer()
    buffer.add("up", NODE, (), time.time(), 1)
    agent = Agent(buffer, {}, interval=3600, listen="127.0.0.1:0", ssl_context=server_ctx)
    await agent.start()
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"https://127.0.0.1:{agent.port}/metrics", ssl=client_ctx) as r:
                assert "up{" in await r.text()
            with pytest.raises(aiohttp.ClientError):
                async with s.get(f"http://127.0.0.1:{agent.port}/metrics") as r:
                    await r.read()
    finally:
        await agent.stop()


def served_serial(port: int, ca: trustme.CA) -> int:
    """The serial number of the certificate a new TLS connection to ``port`` gets."""
    from cryptography import x509

    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_a_renewed_serving_certificate_is_loaded_and_a_torn_one_is_not(
    ca: trustme.CA, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from cryptography import x509

    from kcms.agent.server import ServingTLS

    pem = tmp_path / "tls.pem"
    first = ca.issue_cert("127.0.0.1")
    first.private_key_and_cert_chain_pem.write_to_path(str(pem))
    agent = Agent(
        SampleBuffer(), {}, interval=3600, listen="127.0.0.1:0", ssl_context=ServingTLS(str(pem), str(pem))
    )
    await agent.start()
    try:
        serial = x509.load_pem_x509_certificate(first.cert_chain_pems[0].bytes()).serial_number
        assert await asyncio.to_thread(served_serial, agent.port, ca) == serial
        # A renewal written in place (as the kubelet updates a Secret volume): the next cycle loads it.
        second = ca.issue_cert("127.0.0.1")
        second.private_key_and_cert_chain_pem.write_to_path(str(pem))
        os.utime(pem, ns=(time.time_ns() + 10**9,) * 2)
        await agent.collect_once()
        renewed = x509.load_pem_x509_certificate(second.cert_chain_pems[0].bytes()).serial_number
        assert await asyncio.to_thread(served_serial, agent.port, ca) == renewed
        # A torn write: kept out, the last good pair is still served, one warning.
        pem.write_bytes(second.private_key_and_cert_chain_pem.bytes()[:200])
        os.utime(pem, ns=(time.time_ns() + 2 * 10**9,) * 2)
        await agent.collect_once()
        assert await asyncio.to_thread(served_serial, agent.port, ca) == renewed
        assert "cannot reload the serving certificate" in caplog.text and "Traceback" not in caplog.text
    finally:
        await agent.stop()


async def test_extra_listener_serves_pushes_and_probes_never_metrics() -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    buffer = SampleBuffer()
    buffer.add("up", NODE, (), time.time(), 1)
    agent = Agent(
        buffer, {}, interval=3600, listen="127.0.0.1:0", extra_routes=[("POST", "/v1/hello", hello)],
        extra_listen="127.0.0.1:0",
    )  # fmt: skip
    await agent.start()
    try:
        assert agent.extra_port not in (0, agent.port)
        extra = f"http://127.0.0.1:{agent.extra_port}"
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{extra}/v1/hello") as r:
                assert await r.text() == "hello"
            async with s.get(f"{extra}/healthz") as r:
                assert r.status == 200
            async with s.get(f"{extra}/metrics") as r:
                assert r.status == 404 and b"up{" not in await r.read()
    finally:
        await agent.stop()


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The agent command; plain serving unless the arguments are about TLS."""
    if not any(a.startswith(("--tls-", "--client-ca-file", "--insecure-serving")) for a in args):
        args = ("--insecure-serving", *args)
    return subprocess.run(
        [sys.executable, "-m", "kcms.cmd.agent", *args],
        cwd=REPO,
        env=env if env is not None else {**os.environ, "NODE_NAME": "node-a"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--interval", "0s"], "--interval"),
        (["--interval", "soon"], "--interval"),
        (["--retention", "1s", "--interval", "10s"], "--retention"),
        (["--max-series-per-pod", "-3"], "--max-series-per-pod"),
        (["--listen", "nowhere"], "--listen"),
        (["--tls-cert-file", "/nonexistent.pem"], "--tls-cert-file"),
        (["--tls-cert-file", "/etc/hostname", "--tls-private-key-file", "/etc/hostname"], "--tls-cert-file"),
        (
            [
                "--tls-cert-file",
                "/etc/hostname",
                "--tls-private-key-file",
                "/etc/hostname",
                "--client-ca-file",
                "/x.pem",
            ],
            "--client-ca-file",
        ),
        (
            [
                "--insecure-serving",
                "--tls-cert-file",
                "/etc/hostname",
                "--tls-private-key-file",
                "/etc/hostname",
            ],
            "--insecure-serving",
        ),
        (["--insecure-serving", "--client-ca-file", "/etc/hostname"], "--insecure-serving"),
        (["--otlp-listen", "nowhere"], "--otlp-listen"),
        (["--max-pending-reviews", "0"], "--max-pending-reviews"),
        (["--otlp-listen", "127.0.0.1:0", "--no-otlp"], "--otlp-listen"),
        (["--cgroup-root", "/nonexistent/cgroup", "--no-apps"], "--cgroup-root"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig"),
    ],
)
def test_cli_bad_flags_exit_2_naming_the_flag(args: list[str], flag: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert flag in result.stderr


def test_cli_requires_a_node_name() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    result = run_cli("--no-cgroups", "--no-apps", env=env)
    assert result.returncode == 2 and "--node-name" in result.stderr


def test_cli_serves_node_metrics_and_stops_on_sigterm() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kcms.cmd.agent",
            "--node-name",
            "node-a",
            "--no-cgroups",
            "--no-apps",
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            "200ms",
            "--insecure-serving",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        text = ""
        while "node_load1" not in text:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the agent never served node metrics"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                time.sleep(0.1)
        types, samples = parse_agent_text(text)
        assert types["node_cpu_seconds_total"] == "counter"
        assert {o for _, o, _, _, _ in samples} == {NODE}
        otlp = urllib.request.Request(f"http://127.0.0.1:{port}/v1/metrics", data=b"", method="POST")
        try:
            with urllib.request.urlopen(otlp, timeout=5) as r:
                status = r.status
        except urllib.error.HTTPError as e:  # an empty OTLP body may be refused, but not unrouted
            status = e.code
        assert status not in (404, 405)  # the OTLP receiver is mounted
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


async def test_cli_end_to_end_with_api_server_cgroups_and_an_app(fake_kube, tmp_path: Path) -> None:
    """`python -m kcms.cmd.agent` against the fake API server, a cgroup tree and a real app endpoint."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text='# TYPE jobs_done_total counter\njobs_done_total{queue="q"} 41\n')

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    app_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    from fakeobjects import make_pod

    obj = make_pod("shop", "worker-1", "node-a")
    obj["status"]["podIP"] = "127.0.0.1"
    obj["metadata"]["annotations"] = {"prometheus.io/scrape": "true", "prometheus.io/port": str(app_port)}
    container_id = "7f" * 32  # containerd IDs are 64 hex digits
    obj["status"]["containerStatuses"][0]["containerID"] = f"containerd://{container_id}"
    stored = fake_kube.upsert(obj)
    uid = stored["metadata"]["uid"]
    pod_dir = tmp_path / "cg" / "kubepods.slice" / "kubepods-burstable.slice"
    pod_dir = pod_dir / f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
    write_cgroup(pod_dir)
    write_cgroup(pod_dir / f"cri-containerd-{container_id}.scope")

    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kcms.cmd.agent",
        "--node-name=node-a",
        f"--kubeconfig={fake_kube.kubeconfig}",
        f"--cgroup-root={tmp_path / 'cg'}",
        f"--listen=127.0.0.1:{port}",
        "--interval=200ms",
        "--insecure-serving",
        cwd=REPO,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        wanted = {"jobs_done_total", "container_cpu_usage_seconds_total", "node_load1"}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        seen: set[str] = set()
        async with aiohttp.ClientSession() as s:
            while not wanted <= seen:
                assert proc.returncode is None, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
                assert loop.time() < deadline, f"only saw {sorted(seen)}"
                await asyncio.sleep(0.2)
                try:
                    async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                        types, samples = parse_agent_text(await r.text())
                except aiohttp.ClientError:
                    continue
                seen = {m for m, *_ in samples}
        worker = ObjectRef("pods", "shop", "worker-1")
        got = {(m, o, lb): v for m, o, lb, v, _ in samples}
        assert got[("jobs_done_total", worker, (("queue", "q"),))] == 41
        assert got[("container_cpu_usage_seconds_total", worker, (("container", "app"),))] == 1.5
        assert got[("container_cpu_usage_seconds_total", worker, ())] == 1.5
        assert types["jobs_done_total"] == "counter"
    finally:
        try:
            assert await stop_process(proc) == 0
        finally:
            await runner.cleanup()


def test_cli_unloadable_certificate_or_client_ca_names_the_flag(ca: trustme.CA, tmp_path: Path) -> None:
    pem = tmp_path / "agent.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    tls = ["--no-cgroups", "--no-apps", "--no-kubelet", "--no-node"]
    for args, flag in (
        ([f"--tls-cert-file={garbage}", f"--tls-private-key-file={pem}"], "--tls-cert-file"),
        (
            [f"--tls-cert-file={pem}", f"--tls-private-key-file={pem}", f"--client-ca-file={garbage}"],
            "--client-ca-file",
        ),
    ):
        result = run_cli(*tls, *args)
        assert result.returncode == 2 and f"argument {flag}" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
