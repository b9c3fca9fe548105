"""`kubectl kcms` against servers that are down, refuse, hang or answer garbage: the installed plugin,
run as a real process, ends with one escaped line on stderr and exit code 1 (never a traceback), and
degrades without failing where only the decoration (history, allocatable) is missing.

The hostile server is a real HTTPS server on loopback (aiohttp, a trustme certificate) whose answers
each test chooses; it stands for a broken or malicious API server, not for Kubernetes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme
from _http_helpers import serve_app
from _kubectl import KUBECTL
from aiohttp import web
from test_kubectl_plugin import SCRIPTS, plugin_env

GROUPS = {
    "kind": "APIGroupList",
    "apiVersion": "v1",
    "groups": [
        {
            "name": "metrics.k8s.io",
            "versions": [{"groupVersion": "metrics.k8s.io/v1beta1", "version": "v1beta1"}],
        },
        {
            "name": "history.kcms.io",
            "versions": [{"groupVersion": "history.kcms.io/v1alpha1", "version": "v1alpha1"}],
        },
    ],
}
POD = {
    "metadata": {"name": "web-1", "namespace": "default"},
    "timestamp": "2026-01-01T00:00:00Z",
    "window": "15s",
    "containers": [{"name": "web", "usage": {"cpu": "1500000n", "memory": "3Mi"}}],
}


def status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


class Hostile:
    """A loopback HTTPS server answering each path with the handler a test put in ``routes``."""

    def __init__(self, ca: trustme.CA, tmp: Path) -> None:
        self.routes: dict[str, Callable[[], Any]] = {}  # path -> a fresh answer (or a coroutine) per request
        self.requests: list[str] = []
        self.tokens: list[str] = []  # the Authorization header of each request
        self.ca, self.tmp = ca, tmp

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path)
        self.tokens.append(request.headers.get("Authorization", ""))
        route = self.routes.get(request.path)
        if route is None:
            return status(404, "NotFound", "the server could not find the requested resource")
        answer = route()
        return await answer if asyncio.iscoroutine(answer) else answer

    async def __aenter__(self) -> Hostile:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self.handle)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1").configure_cert(ctx)
        self.runner, self.port = await serve_app(app, ssl_context=ctx, access_log=None)
        self.kubeconfig = write_kubeconfig(self.tmp / "kubeconfig", f"https://127.0.0.1:{self.port}", self.ca)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


def write_kubeconfig(
    path: Path, server: str, ca: trustme.CA, user: dict | None = None, namespace: str = "default"
) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server,
                      "certificate-authority-data": base64.b64encode(ca.cert_pem.bytes()).decode()}}],
        "users": [{"name": "u", "user": user or {"token": "some-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": namespace}}],
        "current-context": "c",
    }  # fmt: skip
    path.write_text(json.dumps(doc))
    return str(path)


async def run_plugin(*argv: str, wait: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(SCRIPTS / "kubectl-kcms"), *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL, env=plugin_env(),
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), wait)
    return proc.returncode or 0, out.decode(), err.decode()


def one_line(rc: int, out: str, err: str) -> str:
    assert rc == 1, (rc, out, err)
    assert out == "" and "Traceback" not in err
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1, err
    assert "\x1b" not in err  # a server's terminal escapes are written escaped
    return lines[0]


@pytest.fixture
async def hostile(ca, tmp_path):
    async with Hostile(ca, tmp_path) as server:
        yield server


async def test_garbage_answers_are_one_line_errors(hostile):
    hostile.routes["/apis"] = lambda: web.Response(
        text="<html>\x1b[2Jnot an API server\n</html>", content_type="text/html"
    )
    line = one_line(*await run_plugin("top", "pods", "--kubeconfig", hostile.kubeconfig))
    assert line.startswith("error: the answer to GET /apis is not JSON (text/html")
    assert "\\x1b[2J" in line
    hostile.routes["/apis"] = lambda: web.json_response(["not", "a", "group", "list"])
    line = one_line(*await run_plugin("top", "nodes", "--kubeconfig", hostile.kubeconfig))
    assert line == "error: the answer to GET /apis is not an APIGroupList"
    hostile.routes["/apis"] = lambda: web.json_response(GROUPS)
    hostile.routes["/apis/metrics.k8s.io/v1beta1/namespaces/default/pods"] = lambda: web.json_response(
        {"items": "x"}
    )
    line = one_line(*await run_plugin("top", "pods", "--kubeconfig", hostile.kubeconfig))
    assert (
        line
        == "error: the answer to GET /apis/metrics.k8s.io/v1beta1/namespaces/default/pods is not a PodMetricsList"
    )
    bad = {**POD, "containers": [{"name": "web", "usage": {"cpu": "lots\nof", "memory": "1Mi"}}]}
    hostile.routes["/apis/metrics.k8s.io/v1beta1/namespaces/default/pods"] = lambda: web.json_response(
        {"items": [bad]}
    )
    line = one_line(*await run_plugin("top", "pods", "--kubeconfig", hostile.kubeconfig))
    assert line == "error: pod web-1 container web cpu: lots\\nof is not a quantity"
    huge = {**POD, "containers": [{"name": "web", "usage": {"cpu": "9" * 100_000, "memory": "1Mi"}}]}
    hostile.routes["/apis/metrics.k8s.io/v1beta1/namespaces/default/pods"] = lambda: web.json_response(
        {"items": [huge]}
    )
    line = one_line(*await run_plugin("top", "pods", "--kubeconfig", hostile.kubeconfig))
    assert line.startswith("error: pod web-1 container web cpu: 999") and line.endswith(
        "(over 64 characters)"
    )
    assert len(line) < 200


async def test_refusals_are_kubectl_style_lines(hostile):
    hostile.routes["/apis"] = lambda: web.json_response(GROUPS)
    hostile.routes["/apis/metrics.k8s.io/v1beta1/nodes"] = lambda: status(
        403, "Forbidden", 'nodes.metrics.k8s.io is forbidden: User "u" cannot list\nresource "nodes"'
    )
    line = one_line(*await run_plugin("top", "nodes", "--kubeconfig", hostile.kubeconfig))
    assert line == (
        'Error from server (Forbidden): nodes.metrics.k8s.io is forbidden: User "u" cannot list\\nresource "nodes"'
    )
    hostile.routes["/apis"] = lambda: status(401, "Unauthorized", "Unauthorized")
    line = one_line(*await run_plugin("top", "pods", "--kubeconfig", hostile.kubeconfig))
    assert line == "Error from server (Unauthorized): Unauthorized"
    assert hostile.requests.count("/apis") == 3  # a 401 is retried once (a rotated credential), then reported
    hostile.routes["/apis"] = lambda: web.Response(status=500, text="x" * 5000)
    line = one_line(*await run_plugin("top", "pods", "--kubeconfig", hostile.kubeconfig))
    assert line.startswith("Error from server (InternalError): xxx") and len(line) < 400


async def test_no_metrics_group_is_metrics_api_not_available(hostile):
    hostile.routes["/apis"] = lambda: web.json_response({"kind": "APIGroupList", "groups": []})
    for argv in (["top", "pods"], ["top", "nodes"]):
        assert (
            one_line(*await run_plugin(*argv, "--kubeconfig", hostile.kubeconfig))
            == "error: Metrics API not available"
        )
    line = one_line(*await run_plugin("metrics", "--kubeconfig", hostile.kubeconfig))
    assert line.startswith("error: the cluster serves no custom.metrics.k8s.io or external.metrics.k8s.io")
    line = one_line(*await run_plugin("get", "m", "--external", "--kubeconfig", hostile.kubeconfig))
    assert line.startswith("error: the cluster serves no external.metrics.k8s.io/v1beta1")


async def test_a_server_that_hangs_is_a_timeout(hostile):
    async def hang() -> web.Response:
        await asyncio.sleep(5)  # beyond the 1 s --request-timeout; short, so the server stops soon
        return web.json_response(GROUPS)

    hostile.routes["/apis"] = hang
    line = one_line(
        *await run_plugin("top", "pods", "--request-timeout", "1s", "--kubeconfig", hostile.kubeconfig)
    )
    assert (
        line
        == f"error: the API server at https://127.0.0.1:{hostile.port} did not answer GET /apis within 1s (--request-timeout)"
    )


async def test_unreachable_and_unverifiable_servers(ca, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = write_kubeconfig(tmp_path / "down", f"https://127.0.0.1:{port}", ca)
    line = one_line(*await run_plugin("top", "nodes", "--kubeconfig", kubeconfig))
    assert line.startswith(f"error: cannot reach the API server at https://127.0.0.1:{port}")
    async with Hostile(ca, tmp_path) as server:
        server.routes["/apis"] = lambda: web.json_response(GROUPS)
        other = write_kubeconfig(tmp_path / "other-ca", f"https://127.0.0.1:{server.port}", trustme.CA())
        line = one_line(*await run_plugin("top", "nodes", "--kubeconfig", other))
        assert line.startswith(f"error: cannot verify the API server at https://127.0.0.1:{server.port}")
        assert server.requests == []
    broken = tmp_path / "broken"
    broken.write_text("clusters: [")
    line = one_line(*await run_plugin("top", "pods", "--kubeconfig", str(broken)))
    assert line.startswith(f"error: kubeconfig {broken}: not YAML")
    # KUBECONFIG is honoured as kubectl does, its namespace too (the hostile server sees default).
    env_line = await asyncio.create_subprocess_exec(
        str(SCRIPTS / "kubectl-kcms"), "top", "pods", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**plugin_env(), "KUBECONFIG": os.pathsep.join(["/nonexistent", kubeconfig])},
    )  # fmt: skip
    _, err = await env_line.communicate()
    assert env_line.returncode == 1 and err.decode().startswith("error: cannot reach the API server")


async def test_history_and_node_list_refusals_only_drop_the_decoration(hostile):
    hostile.routes["/apis"] = lambda: web.json_response(GROUPS)
    hostile.routes["/apis/metrics.k8s.io/v1beta1/namespaces/default/pods"] = lambda: web.json_response(
        {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "items": [POD]}
    )
    hostile.routes["/apis/history.kcms.io/v1alpha1/namespaces/default/pods"] = lambda: status(
        403, "Forbidden", "no history for you"
    )
    rc, out, err = await run_plugin("top", "pods", "--kubeconfig", hostile.kubeconfig)
    assert rc == 0, err
    assert out.split("\n")[:2] == [
        "NAME    CPU(cores)   MEMORY(bytes)   ",
        "web-1   2m           3Mi             ",
    ]
    assert err == "warning: no history: Error from server (Forbidden): no history for you\n"
    # A name with a terminal escape is printed escaped.
    evil = {**POD, "metadata": {"name": "web\x1b[2J\nfake-row", "namespace": "default"}}
    hostile.routes["/apis/metrics.k8s.io/v1beta1/namespaces/default/pods"] = lambda: web.json_response(
        {"items": [evil]}
    )
    rc, out, _ = await run_plugin("top", "pods", "--sparkline", "off", "--kubeconfig", hostile.kubeconfig)
    assert rc == 0 and "\x1b" not in out and out.count("\n") == 2
    assert out.split("\n")[1].split()[0] == "web\\x1b[2J\\nfake-row"
    hostile.routes["/apis/metrics.k8s.io/v1beta1/namespaces/default/pods"] = lambda: web.json_response(
        {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "items": [POD]}
    )
    # History that is garbage is dropped the same way; garbage points inside a good list are skipped.
    hostile.routes["/apis/history.kcms.io/v1alpha1/namespaces/default/pods"] = lambda: web.json_response(
        {"items": [{"metadata": {"name": "web-1", "namespace": "default"}, "containers": [{"name": "web", "points": [
            {"timestamp": "yesterday", "usage": {"cpu": "1"}}, {"timestamp": "2026-01-01T00:00:00Z", "usage": {"cpu": "x"}},
            {"timestamp": "2026-01-01T00:00:00Z", "usage": {"cpu": "2m"}}, "junk"]}]}]}
    )  # fmt: skip
    rc, out, err = await run_plugin("top", "pods", "--kubeconfig", hostile.kubeconfig)
    assert rc == 0 and err == "", err
    header, row = out.split("\n")[:2]
    assert header.split() == ["NAME", "CPU(cores)", "MEMORY(bytes)", "CPU-HISTORY(5m)"]
    assert row.split() == ["web-1", "2m", "3Mi", "█"] and row.rstrip().endswith("█")
    # Nodes: a node list that is refused leaves the percentages unknown, with one warning.
    hostile.routes["/apis/metrics.k8s.io/v1beta1/nodes"] = lambda: web.json_response(
        {
            "kind": "NodeMetricsList",
            "items": [{"metadata": {"name": "n1"}, "usage": {"cpu": "250m", "memory": "1Gi"}}],
        }
    )
    hostile.routes["/api/v1/nodes"] = lambda: status(403, "Forbidden", "nodes is forbidden")
    rc, out, err = await run_plugin("top", "nodes", "--sparkline", "off", "--kubeconfig", hostile.kubeconfig)
    assert rc == 0
    assert out.split("\n")[1].split() == ["n1", "250m", "<unknown>", "1024Mi", "<unknown>"]
    assert err == (
        "warning: CPU(%) and MEMORY(%) are <unknown>: cannot read /api/v1/nodes: "
        "Error from server (Forbidden): nodes is forbidden\n"
    )


async def test_exec_credential_plugin_and_context_namespace(hostile, tmp_path):
    """A kubeconfig whose user runs an exec credential plugin (the kubernetes_asyncio path, as EKS/GKE
    kubeconfigs do): its token is sent; the context's namespace is the default namespace."""

    def pods():
        return web.json_response(
            {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "items": [POD]}
        )

    hostile.routes["/apis"] = lambda: web.json_response(
        {"kind": "APIGroupList", "groups": GROUPS["groups"][:1]}
    )
    hostile.routes["/apis/metrics.k8s.io/v1beta1/namespaces/team-x/pods"] = pods
    credential = {"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {"token": "exec-token"}}  # fmt: skip
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": ["-c", f"print({json.dumps(json.dumps(credential))})"],
        }
    }
    kubeconfig = write_kubeconfig(
        tmp_path / "exec", f"https://127.0.0.1:{hostile.port}", hostile.ca, user, "team-x"
    )
    rc, out, err = await run_plugin("top", "pods", "--kubeconfig", kubeconfig)
    assert rc == 0, err
    assert out.split("\n")[1].split() == ["web-1", "2m", "3Mi"]
    assert "/apis/metrics.k8s.io/v1beta1/namespaces/team-x/pods" in hostile.requests
    assert hostile.tokens[-1] == "Bearer exec-token"


@pytest.mark.skipif(KUBECTL is None, reason="kubectl binary not installed")
async def test_ties_keep_the_api_order_as_kubectl_top(hostile):
    """With --sort-by, equal values stay in the order the API listed them, as in `kubectl top`."""

    def pod(name: str, cpu: str, memory: str) -> dict:
        containers = [{"name": c, "usage": {"cpu": cpu, "memory": memory}} for c in ("z-side", "a-main")]
        return {**POD, "metadata": {"name": name, "namespace": "default"}, "containers": containers}

    items = [
        pod("c-pod", "2m", "8Mi"),
        pod("a-pod", "2m", "8Mi"),
        pod("b-pod", "5m", "1Mi"),
        pod("d-pod", "1m", "8Mi"),
    ]
    hostile.routes["/apis"] = lambda: web.json_response(
        {"kind": "APIGroupList", "groups": GROUPS["groups"][:1]}
    )
    hostile.routes["/apis/metrics.k8s.io/v1beta1/namespaces/default/pods"] = lambda: web.json_response(
        {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {}, "items": items}
    )
    for flags in ([], ["--sort-by", "cpu"], ["--sort-by", "memory"], ["--sort-by", "cpu", "--containers"]):
        theirs = await asyncio.create_subprocess_exec(
            KUBECTL, "top", "pods", *flags, "--kubeconfig", hostile.kubeconfig,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        expected, problem = await theirs.communicate()
        assert theirs.returncode == 0, problem
        rc, out, err = await run_plugin("top", "pods", *flags, "--kubeconfig", hostile.kubeconfig)
        assert (rc, out, err) == (0, expected.decode(), ""), flags


async def test_many_rows_leave_out_the_history_unless_asked(hostile):
    """Over 1000 rows, --sparkline auto drops the history read (its answer would be huge); asked for
    with --sparkline cpu, it is read and shown."""
    items = [{**POD, "metadata": {"name": f"p{i:04d}", "namespace": "default"}} for i in range(1001)]
    history_items = [
        {"metadata": {"name": p["metadata"]["name"], "namespace": "default"},
         "containers": [{"name": "web", "points": [{"timestamp": "2026-01-01T00:00:00Z", "usage": {"cpu": "1m"}}]}]}
        for p in items
    ]  # fmt: skip
    hostile.routes["/apis"] = lambda: web.json_response(GROUPS)
    hostile.routes["/apis/metrics.k8s.io/v1beta1/namespaces/default/pods"] = lambda: web.json_response(
        {"kind": "PodMetricsList", "items": items}
    )
    hostile.routes["/apis/history.kcms.io/v1alpha1/namespaces/default/pods"] = lambda: web.json_response(
        {"kind": "PodMetricsHistoryList", "items": history_items}
    )
    rc, out, err = await run_plugin("top", "pods", "--kubeconfig", hostile.kubeconfig)
    assert rc == 0 and out.count("\n") == 1002 and "HISTORY" not in out
    assert err == (
        "warning: no history column for 1001 rows (over 1000): narrow with -n or -l, "
        "or ask for it with --sparkline cpu|memory\n"
    )
    rc, out, err = await run_plugin("top", "pods", "--sparkline", "cpu", "--kubeconfig", hostile.kubeconfig)
    assert rc == 0 and err == ""
    lines = out.rstrip("\n").split("\n")
    assert lines[0].split()[-1] == "CPU-HISTORY(5m)" and len(lines) == 1002
    assert all(line.rstrip().endswith("█") for line in lines[1:])
