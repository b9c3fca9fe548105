"""The `kcms` command as a user runs it: real subprocesses, real flags, real kubectl."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from _kubectl import KUBECTL
from _process_helpers import wait_readyz
from _stores import free_port

BASE = "/apis/metrics.k8s.io/v1beta1"


def kcms(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kcms", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["standalone", "--metric-resolution", "5s"], "--metric-resolution"),
        (["standalone", "--metric-resolution", "fifteen"], "--metric-resolution"),
        (
            ["standalone", "--kubelet-preferred-address-types", "InternalIP,Bogus"],
            "--kubelet-preferred-address-types",
        ),
        (["standalone", "--kubelet-port", "70000"], "--kubelet-port"),
        (["standalone", "--kubelet-client-certificate", "/etc/hostname"], "--kubelet-client-key"),
        (["standalone", "--tls-min-version", "VersionTLS99"], "--tls-min-version"),
        (["standalone", "--node-selector", "a in (b"], "--node-selector"),
        (["standalone", "--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig"),
        (["standalone", "--kubelet-endpoint", "cadvisor"], "--kubelet-endpoint"),
        (["demo", "--nodes", "0"], "--nodes"),
        (["simulate", "--nodes", "many"], "--nodes"),
        (["store"], "--token-file"),
        (["store", "--token-file", "/nonexistent/token"], "--token-file"),
        (["store", "--token-file", "/etc/hostname", "--replicas", "-1"], "--replicas"),
        (["store", "--token-file", "/etc/hostname", "--store-endpoints", "ftp://x"], "--store-endpoints"),
        (["store", "--token-file", "/etc/hostname", "--refill-timeout", "0s"], "--refill-timeout"),
        (["collector"], "--store-endpoints"),
        (["collector", "--store-endpoints", "a=http://a:1,b=http://b:1", "--replicas", "3"], "--replicas"),
        (["collector", "--store-endpoints", "http://a:1", "--write-quorum", "2"], "--write-quorum"),
        (["collector", "--store-service", "no-namespace"], "--store-service"),
        (["collector", "--store-endpoints", "http://a:1", "--store-service", "ns/s"], "--store-service"),
        (["collector", "--store-endpoints", "http://a:1", "--leader-elect=maybe"], "--leader-elect"),
        (
            ["collector", "--store-endpoints", "http://a:1", "--leader-elect-renew-deadline", "20s"],
            "--leader-elect-lease-duration",
        ),
        (["collector", "--store-endpoints", "http://a:1", "--store-timeout", "0s"], "--store-timeout"),
        (["server", "--store-endpoints", "http://a:1", "--store-hedge-delay", "soon"], "--store-hedge-delay"),
        (
            ["server", "--store-endpoints", "http://a:1", "--store-token-file", "/nonexistent"],
            "--store-token-file",
        ),
        (["server", "--active-standby", "--node-stale-after", "0s"], "--node-stale-after"),
        (["server"], "--store-endpoints"),
    ],
)
def test_bad_flags_stop_startup_naming_the_flag(argv, flag):
    result = kcms(*argv)
    assert result.returncode == 2, result.stderr
    assert flag in result.stderr


def test_a_port_in_use_stops_startup_naming_the_flags(tmp_path):
    """The serving port is taken by another listener: one line naming --secure-port, exit 1, no
    traceback (it used to end in an OSError traceback from asyncio)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = kcms(
            "demo", "--secure-port", str(port), "--nodes", "1", "--no-dashboard", "--work-dir", str(tmp_path)
        )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    line = [x for x in result.stderr.splitlines() if "error:" in x]
    assert len(line) == 1 and "--secure-port" in line[0] and f"127.0.0.1:{port}" in line[0], result.stderr


def test_help_lists_metrics_server_flags():
    out = kcms("standalone", "--help").stdout
    for flag in (
        "--kubeconfig", "--metric-resolution", "--kubelet-port", "--kubelet-use-node-status-port",
        "--kubelet-preferred-address-types", "--kubelet-insecure-tls", "--kubelet-certificate-authority",
        "--kubelet-client-certificate", "--kubelet-client-key", "--kubelet-request-timeout", "--node-selector",
        "--secure-port", "--bind-address", "--cert-dir", "--tls-cert-file", "--tls-private-key-file",
        "--tls-min-version", "--authentication-kubeconfig", "--authorization-kubeconfig",
        "--authentication-skip-lookup", "--client-ca-file", "--requestheader-client-ca-file",
        "--requestheader-allowed-names", "--requestheader-username-headers", "--requestheader-group-headers",
        "--requestheader-extra-headers-prefix", "--authorization-always-allow-paths", "--kubelet-endpoint",
    ):  # fmt: skip
        assert flag in out, flag


@pytest.mark.skipif(KUBECTL is None, reason="kubectl binary not installed")
def test_demo_serves_what_it_prints(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kcms", "demo", "--secure-port", str(port), "--nodes", "3", "--pods-per-node", "4",
         "--work-dir", str(tmp_path), "--exit-after", "60s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        lines = []
        assert proc.stdout is not None
        while len(lines) < 20:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "curl" in line:
                break
        text = "".join(lines)
        assert f"https://127.0.0.1:{port}" in text and "Anonymous" in text
        commands = re.findall(r"kubectl --kubeconfig (\S+) get --raw '([^']+)'", text)
        assert len(commands) >= 5
        deadline = time.monotonic() + 30
        while True:  # ready a few seconds after start
            ready = subprocess.run(
                [KUBECTL, "--kubeconfig", commands[0][0], "get", "--raw", "/readyz"],
                capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            if ready.returncode == 0:
                break
            assert time.monotonic() < deadline, ready.stderr
            time.sleep(0.5)
        for kubeconfig, path in commands:
            out = subprocess.run(
                [KUBECTL, "--kubeconfig", kubeconfig, "get", "--raw", path],
                capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            assert out.returncode == 0, (path, out.stderr)
            body = json.loads(out.stdout)
            assert body.get("items", [body]), path  # every printed command returns something
        table = subprocess.run(
            [KUBECTL, "--kubeconfig", commands[0][0], "get", "nodes.metrics.k8s.io"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert table.returncode == 0, table.stderr
        assert table.stdout.split("\n")[0].split() == ["NAME", "CPU", "MEMORY", "WINDOW"]
        assert len(table.stdout.strip().split("\n")) == 4
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


async def test_standalone_process_against_the_fake_api_server(fake_kube, ca, tmp_path):
    """`kcms standalone --kubeconfig` as a process: list+watch, scrape, TokenReview, SAR, SIGTERM."""
    from kcms.sim import SimulatedCluster

    sim = SimulatedCluster(
        nodes=2, pods_per_node=3, containers_per_pod=2, seed=3, ca=ca, one_port_per_node=True
    )
    await sim.start()
    for obj in sim.inventory_objects():
        fake_kube.upsert(obj)
    fake_kube.tokens["reader"] = {"username": "reader", "groups": ["readers"]}
    kubelet_ca = tmp_path / "kubelet-ca.pem"
    kubelet_ca.write_bytes(ca.cert_pem.bytes())
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kcms", "standalone", "--kubeconfig", str(fake_kube.kubeconfig),
        "--secure-port", str(port), "--bind-address", "127.0.0.1", "--cert-dir", str(tmp_path / "certs"),
        "--kubelet-certificate-authority", str(kubelet_ca), "--kubelet-use-node-status-port",
        "--kubelet-preferred-address-types", "InternalIP", "--authentication-skip-lookup",
        "--metric-resolution", "10s", stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        async with aiohttp.ClientSession() as s:
            # how soon it is ready is a figure of bench/resource_pipeline.py, not a test's assertion
            await wait_readyz(s, port, proc, 60)
            # its serving certificate was made by a child process: `cryptography` (~8 MB of RSS
            # in its Rust extension alone) is never loaded into the serving one
            assert (tmp_path / "certs" / "apiserver.crt").exists()
            assert "cryptography" not in await asyncio.to_thread(Path(f"/proc/{proc.pid}/maps").read_text)
            headers = {"Authorization": "Bearer reader"}
            async with s.get(f"https://127.0.0.1:{port}{BASE}/nodes", ssl=ctx, headers=headers) as r:
                assert r.status == 200
                body = await r.json()
            assert sorted(i["metadata"]["name"] for i in body["items"]) == sim.node_names()
            async with s.get(f"https://127.0.0.1:{port}{BASE}/pods", ssl=ctx) as r:
                assert r.status == 401
        assert any(r["spec"]["resourceAttributes"]["resource"] == "nodes" for r in fake_kube.access_reviews)
        assert any(path == "/api/v1/pods" and q.get("watch") for _, path, q in fake_kube.requests)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 20)
        await sim.stop()
    assert code == 0
