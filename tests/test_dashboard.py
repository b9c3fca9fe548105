"""The dashboard's local server (kcms/dashboard): its protection and its allow-listed API proxy, for real
over loopback HTTP against the fake Kubernetes API (tests/fakeapi.py) with a real kubeconfig; the
installed package carries the page's files. The page itself is tested in a real browser in
tests/test_dashboard_browser.py."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest
from fakeapi import make_node
from yarl import URL

from kcms.dashboard import default_kubeconfig, open_dashboard, run_dashboard, serve_dashboard
from kcms.dashboard.proxy import Refused, check
from kcms.dashboard.server import CSP, REFUSED, STATIC_FILES
from kcms.kube.client import KubeClient

ROOT = Path(__file__).resolve().parent.parent


def refused(reason: str) -> float:
    return REFUSED.labels(reason)._value.get()


@pytest.fixture
async def dashboard(fake_kube):
    kube = await KubeClient.load(str(fake_kube.kubeconfig))
    server = await serve_dashboard(kube, context="fake")
    try:
        yield server
    finally:
        await server.stop()
        await kube.close()


async def get(url: str | URL, *, host: str | None = None, method: str = "GET") -> tuple[int, dict, bytes]:
    headers = {"Host": host} if host is not None else {}
    async with aiohttp.ClientSession() as s:
        async with s.request(method, url, headers=headers, allow_redirects=False) as r:
            return r.status, dict(r.headers), await r.read()


def raw(server, tail: str) -> URL:
    """A URL sent exactly as written (no normalisation of "..", "%2e" or "//" by the client)."""
    return URL(f"http://127.0.0.1:{server.port}/{server.token}/{tail}", encoded=True)


def assert_no_traceback(caplog) -> None:
    for record in caplog.records:
        assert record.exc_info is None, record.getMessage()
        assert "Traceback" not in record.getMessage()


# ---- the allow-list ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/apis/metrics.k8s.io/v1beta1/nodes",
        "/apis/metrics.k8s.io/v1beta1/nodes/sim-node-0000",
        "/apis/metrics.k8s.io/v1beta1/pods",
        "/apis/metrics.k8s.io/v1beta1/namespaces/team-b/pods",
        "/apis/metrics.k8s.io/v1beta1/namespaces/team-b/pods/checkout-1",
        "/apis/history.kcms.io/v1alpha1",
        "/apis/history.kcms.io/v1alpha1/nodes",
        "/apis/history.kcms.io/v1alpha1/nodes/n1",
        "/apis/history.kcms.io/v1alpha1/pods",
        "/apis/history.kcms.io/v1alpha1/scrapes",
        "/apis/history.kcms.io/v1alpha1/series",
        "/apis/history.kcms.io/v1alpha1/namespaces/a/pods/p",
        "/apis/history.kcms.io/v1alpha1/namespaces/a/series",
        "/apis/custom.metrics.k8s.io/v1beta2",
        "/apis/custom.metrics.k8s.io/v1beta2/nodes/*/node_load1",
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/a/pods/*/http_requests_per_second",
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/a/deployments.apps/web/queue_backlog",
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/a/metrics/queue_backlog",
        "/apis/external.metrics.k8s.io/v1beta1",
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/a/queue_backlog",
        "/api/v1/nodes",
    ],
)
def test_allow_list_forwards_what_the_page_reads(path):
    assert check(path, {}).path == path


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/secrets",
        "/api/v1/namespaces/kube-system/secrets/token",
        "/api/v1/nodes/n1/proxy/metrics",  # the node proxy reaches kubelets: never
        "/api/v1/nodes/n1",
        "/api/v1/pods",
        "/apis",
        "/apis/metrics.k8s.io/v1beta1/nodes/../../../../api/v1/secrets",
        "/apis/metrics.k8s.io/v1beta1/nodes/%2e%2e/%2e%2e",
        "/apis/metrics.k8s.io/v1beta1/nodes/a%2Fb",
        "/apis/metrics.k8s.io/v1beta1//nodes",
        "/apis/metrics.k8s.io/v1beta1/nodes/./x",
        "/apis/metrics.k8s.io/v1beta1/nodes/",
        "/apis/metrics.k8s.io/v1beta1/nodes/UPPER",
        "/apis/history.kcms.io/v1alpha1/nodes/n1/status",
        "/apis/custom.metrics.k8s.io/v1beta1/nodes/*/x",  # only the version the page reads
        "/apis/apps/v1/deployments",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        "/apis/metrics.k8s.io/v1beta1/nodes" + "/n" * 600,
        "/version",
        "",
    ],
)
def test_allow_list_refuses_everything_else(path):
    with pytest.raises(Refused) as e:
        check(path, {})
    assert e.value.reason == "path"


def test_allow_list_query_parameters():
    from multidict import MultiDict

    ok = check("/apis/metrics.k8s.io/v1beta1/pods", MultiDict(labelSelector="app=web", fieldSelector="x=y"))
    assert ok.params == {"labelSelector": "app=web", "fieldSelector": "x=y"}
    for query in (
        MultiDict(watch="true"),  # a watch would hold a connection and stream everything
        MultiDict(labelSelector="a=b", continue_="x"),
        MultiDict([("labelSelector", "a=b"), ("labelSelector", "c=d")]),
        MultiDict(labelSelector="a" * 2000),
    ):
        with pytest.raises(Refused) as e:
            check("/apis/metrics.k8s.io/v1beta1/pods", query)
        assert e.value.reason == "query"
    with pytest.raises(Refused):
        check("/api/v1/nodes", MultiDict(labelSelector="a=b"))


# ---- the server ----------------------------------------------------------------------------------
async def test_page_and_files_served_with_security_headers(dashboard):
    assert dashboard.url == f"http://127.0.0.1:{dashboard.port}/{dashboard.token}/"
    for url_path, name, ctype in STATIC_FILES:
        status, headers, body = await get(dashboard.url + url_path)
        assert status == 200, url_path
        assert headers["Content-Type"] == ctype
        assert body == (ROOT / "kcms/dashboard/static" / name).read_bytes()
        assert headers["Content-Security-Policy"] == CSP
        assert "'unsafe-inline'" not in CSP and "'unsafe-eval'" not in CSP
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "no-referrer"
        assert headers["X-Frame-Options"] == "DENY"
        assert not [h for h in headers if h.lower().startswith("access-control-")]
    status, _, body = await get(dashboard.url + "config.json")
    assert status == 200 and orjson.loads(body)["context"] == "fake"
    status, headers, _ = await get(dashboard.url[:-1])  # /<token> -> /<token>/
    assert status == 302 and headers["Location"] == f"/{dashboard.token}/"
    status, _, _ = await get(dashboard.url + "nothing.js")
    assert status == 404


async def test_bound_to_loopback_only(dashboard):
    assert dashboard._runner.addresses == [("127.0.0.1", dashboard.port)]
    # Another address of this machine (here 127.0.0.2, as a LAN address would be) gets no answer.
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.2", dashboard.port)
    for host in ("0.0.0.0", "localhost", "::1", "192.168.1.10"):
        with pytest.raises(ValueError, match="127.0.0.1 only"):
            await serve_dashboard(dashboard.kube, host=host)


async def test_no_token_or_wrong_token_is_refused(dashboard, fake_kube, caplog):
    caplog.set_level(logging.INFO)
    before = refused("token")
    seen = len(fake_kube.requests)
    base = f"http://127.0.0.1:{dashboard.port}"
    wrong = dashboard.token[:-1] + ("A" if dashboard.token[-1] != "A" else "B")
    for url in (
        base + "/",
        base + "/index.html",
        base + "/k8s/api/v1/nodes",
        f"{base}/{wrong}/",
        f"{base}/{wrong}/k8s/api/v1/nodes",
        f"{base}/{dashboard.token[:10]}/k8s/api/v1/nodes",
        f"{base}/x{dashboard.token}/",
        f"{base}/k8s/{dashboard.token}/api/v1/nodes",
    ):
        status, headers, body = await get(url)
        assert status == 403, url
        assert orjson.loads(body)["reason"] == "Forbidden"
        assert headers["Content-Security-Policy"] == CSP
    assert refused("token") == before + 8
    assert len(fake_kube.requests) == seen  # nothing reached the API server
    # The log names the refusals but never the token.
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "needs its token" in logged and dashboard.token not in logged
    assert_no_traceback(caplog)
    status, _, _ = await get(dashboard.url)
    assert status == 200  # still serving


async def test_wrong_host_is_refused(dashboard, fake_kube, caplog):
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 reaches the socket,
    with its own host name in the Host header, even holding the token it cannot know."""
    before = refused("host")
    seen = len(fake_kube.requests)
    for host in (
        "evil.example",
        f"evil.example:{dashboard.port}",
        f"127.0.0.1:{dashboard.port + 1}",
        "127.0.0.1",
        f"127.0.0.2:{dashboard.port}",
        f"localhost.evil.example:{dashboard.port}",
        "",
    ):
        status, headers, body = await get(dashboard.url + "k8s/api/v1/nodes", host=host)
        assert status == 403, host
        assert "Host header" in orjson.loads(body)["message"]
        assert not [h for h in headers if h.lower().startswith("access-control-")]
    assert refused("host") == before + 7
    assert len(fake_kube.requests) == seen
    for host in (f"127.0.0.1:{dashboard.port}", f"localhost:{dashboard.port}"):
        status, _, _ = await get(dashboard.url, host=host)
        assert status == 200
    assert_no_traceback(caplog)


async def test_paths_outside_the_allow_list_are_refused(dashboard, fake_kube, caplog):
    fake_kube.upsert(make_node("n1"))
    before = refused("path") + refused("query")
    seen = len(fake_kube.requests)
    tails = (
        "k8s/api/v1/secrets",
        "k8s/api/v1/namespaces/kube-system/secrets",
        "k8s/api/v1/nodes/n1/proxy/metrics",
        "k8s/apis/metrics.k8s.io/v1beta1/nodes/../../../../api/v1/secrets",
        "k8s/apis/metrics.k8s.io/v1beta1/nodes/%2e%2e/%2e%2e/%2e%2e/%2e%2e/api/v1/secrets",
        "k8s/apis/metrics.k8s.io/v1beta1/nodes%2F..%2F..%2Fsecrets",
        "k8s//api/v1/nodes",
        "k8s/api/v1/nodes?watch=true",
        "k8s/apis/metrics.k8s.io/v1beta1/pods?labelSelector=a&labelSelector=b",
    )
    for tail in tails:
        status, _, body = await get(raw(dashboard, tail))
        assert status == 403, tail
        assert "allow-list" in orjson.loads(body)["message"] or "twice" in orjson.loads(body)["message"]
    assert refused("path") + refused("query") == before + len(tails)
    assert len(fake_kube.requests) == seen  # none of them was forwarded
    # Writes are refused whatever the path.
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        status, _, _ = await get(dashboard.url + "k8s/api/v1/nodes", method=method)
        assert status == 405, method
    assert len(fake_kube.requests) == seen
    assert_no_traceback(caplog)
    status, _, _ = await get(dashboard.url + "k8s/api/v1/nodes")
    assert status == 200


async def test_proxy_uses_the_kubeconfig_credentials_and_trims_nodes(dashboard, fake_kube):
    fake_kube.upsert(make_node("n1"))
    fake_kube.upsert(make_node("n2"))
    status, _, body = await get(dashboard.url + "k8s/api/v1/nodes")
    # The fake answers 401 without the kubeconfig's bearer token: a 200 is the credential at work.
    assert status == 200
    assert ("GET", "/api/v1/nodes", {}) in fake_kube.requests
    nodes = orjson.loads(body)
    assert [n["metadata"] for n in nodes["items"]] == [{"name": "n1"}, {"name": "n2"}]
    assert nodes["items"][0]["status"]["allocatable"] == {
        k: v for k, v in make_node("n1")["status"]["allocatable"].items() if k in ("cpu", "memory")
    }
    assert "annotations" not in body.decode() and "addresses" not in body.decode()
    # Cached: the next read within the minute does not list every Node again.
    seen = len(fake_kube.requests)
    status, _, again = await get(dashboard.url + "k8s/api/v1/nodes")
    assert status == 200 and again == body and len(fake_kube.requests) == seen


async def test_upstream_answers_and_failures(dashboard, fake_kube, caplog):
    # The fake serves no metrics groups: its 404 Status comes through as it is (the page's "absent").
    status, _, body = await get(dashboard.url + "k8s/apis/history.kcms.io/v1alpha1")
    assert status == 404 and orjson.loads(body)["kind"] == "Status"
    assert ("GET", "/apis/history.kcms.io/v1alpha1", {}) in fake_kube.requests
    # Query parameters pass through unchanged.
    await get(dashboard.url + "k8s/apis/metrics.k8s.io/v1beta1/pods?labelSelector=app%3Dweb")
    assert ("GET", "/apis/metrics.k8s.io/v1beta1/pods", {"labelSelector": "app=web"}) in fake_kube.requests
    # API server gone: 502, one log line, no traceback, the dashboard keeps serving.
    await fake_kube.stop()
    status, _, body = await get(dashboard.url + "k8s/apis/metrics.k8s.io/v1beta1/nodes")
    assert status == 502 and "cannot reach" in orjson.loads(body)["message"]
    status, _, _ = await get(dashboard.url)
    assert status == 200
    assert_no_traceback(caplog)


async def test_open_dashboard_closes_its_client(fake_kube):
    server = await open_dashboard(str(fake_kube.kubeconfig), context="fake")
    status, _, _ = await get(server.url + "k8s/api/v1/nodes")
    assert status == 200
    await server.stop()
    assert server.kube._session is None  # closed with the dashboard


async def test_run_dashboard_bad_kubeconfig(tmp_path, capsys):
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [")
    assert await asyncio.to_thread(run_dashboard, str(bad)) == 1
    err = capsys.readouterr().err
    assert "kcms dashboard:" in err and "not YAML" in err and "Traceback" not in err


def test_default_kubeconfig(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    b.write_text("{}")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(a), str(b)]))
    assert default_kubeconfig() == str(b)  # the first file that exists, as kubectl reads
    monkeypatch.setenv("KUBECONFIG", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_kubeconfig() is None
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("{}")
    assert default_kubeconfig() == str(tmp_path / ".kube" / "config")


async def test_run_dashboard_process_serves_until_sigterm(fake_kube):
    """`run_dashboard` as a real process: prints its URL, serves, exits 0 on SIGTERM."""
    from _process_helpers import stop_process

    code = f"import sys; from kcms.dashboard import run_dashboard; sys.exit(run_dashboard({str(fake_kube.kubeconfig)!r}))"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.startswith(f"KCMS dashboard for {fake_kube.url}: http://127.0.0.1:")
        url = line.split(": ", 1)[1].strip()
        status, _, _ = await get(url + "k8s/api/v1/nodes")
        assert status == 200
        status, _, _ = await get(url.rsplit("/", 2)[0] + "/")
        assert status == 403
    finally:
        assert await stop_process(proc) == 0
    err = (await proc.stderr.read()).decode()
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--dashboard-port", "70000"], "--dashboard-port"),
        (["--dashboard-port", "x"], "--dashboard-port"),
        (["--down-nodes", "6"], "--down-nodes"),
        (["--down-nodes", "-1"], "--down-nodes"),
    ],
)
def test_demo_dashboard_flags_bad_values(argv, flag):
    result = subprocess.run(
        [sys.executable, "-m", "kcms", "demo", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert f"argument {flag}" in result.stderr and "Traceback" not in result.stderr


def test_installed_package_ships_the_page(tmp_path):
    """`pip install .` carries the page, the script, the style sheet and the vendored uPlot + LICENSE:
    setuptools' build_py (the step of `pip install .` that lays the package out, run here from
    pyproject.toml without a network) copies them, and the module finds them there, away from the
    source tree."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from setuptools import setup; setup()",
            "-q",
            "build_py",
            "--build-lib",
            str(target),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=600,
    )
    static = target / "kcms" / "dashboard" / "static"
    for _, name, _ in STATIC_FILES:
        assert (static / name).read_bytes() == (ROOT / "kcms/dashboard/static" / name).read_bytes(), name
    assert "MIT License" in (static / "vendor/uplot/LICENSE").read_text()
    assert "1.6.32" in (static / "vendor/uplot/README.md").read_text()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import kcms.dashboard.server as s; print(s.__file__); print(sorted(s.load_static()))",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith(str(target))
    assert "vendor/uplot/uPlot.iife.min.js" in out


def test_page_never_builds_html_from_text():
    """The page puts API strings into the DOM as text only; the browser test proves it with a hostile
    label, this keeps the script free of the HTML-parsing sinks."""
    js = (ROOT / "kcms/dashboard/static/app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in js, sink
    html = (ROOT / "kcms/dashboard/static/index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", html)  # no inline script (the CSP forbids it too)
    assert not re.search(r"\son[a-z]+\s*=", html)  # no inline event handler
    assert "http://" not in html and "https://" not in html  # nothing from a CDN


def test_readme_of_vendored_files():
    vendor = ROOT / "kcms/dashboard/static/vendor/uplot"
    assert sorted(p.name for p in vendor.iterdir()) == [
        "LICENSE",
        "README.md",
        "uPlot.iife.min.js",
        "uPlot.min.css",
    ]
    assert (
        io.StringIO((vendor / "uPlot.iife.min.js").read_text())
        .readline()
        .startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    )


async def test_run_dashboard_refuses_a_taken_port_and_a_bad_refresh(fake_kube, capsys):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        assert await asyncio.to_thread(run_dashboard, str(fake_kube.kubeconfig), port=port) == 1
        assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    finally:
        taken.close()
    assert await asyncio.to_thread(run_dashboard, str(fake_kube.kubeconfig), refresh=0.1) == 1
    err = capsys.readouterr().err
    assert "refresh must be between 1 and 3600 seconds" in err and "Traceback" not in err
