"""history.kcms.io/v1alpha1 end to end: simulated kubelets over TLS -> collector -> resource store and
history -> aggregated API server, with nodes and pods from the fake API server and delegated
authn/authz through its TokenReview and SubjectAccessReview; read with aiohttp and the real kubectl
binary, against the in-process pipeline and against real `kcms demo` processes."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
import time
from urllib.parse import quote

import aiohttp
import pytest
from _kubectl import KUBECTL, kubectl_json
from _pipeline import READER, Env, start_env, stop_env, wait_ready
from _stores import free_port

from kcms.apis.history import api as history_api
from kcms.quantity import parse_quantity
from kcms.sim import SimulatedCluster

H = "/apis/history.kcms.io/v1alpha1"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@pytest.fixture
async def env(ca, fake_kube, tmp_path):
    sim = SimulatedCluster(
        nodes=3, pods_per_node=4, containers_per_pod=(1, 3), seed=11, ca=ca, one_port_per_node=True
    )
    await sim.start()
    e = await start_env(ca, fake_kube, tmp_path, sim)
    try:
        yield e
    finally:
        await stop_env(e)
        await sim.stop()


async def filled(env: Env, cycles: int = 2) -> None:
    """Ready, then a few more scrape cycles: several points per object."""
    await wait_ready(env)
    for _ in range(cycles):
        await asyncio.sleep(1.05)  # the simulated kubelets' clock moves in whole seconds
        await env.pipeline.collector.run_cycle()


def no_traceback(caplog) -> None:
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert "Traceback" not in caplog.text


async def test_node_and_pod_history_are_the_true_rates_oldest_first(env: Env):
    await filled(env, cycles=3)
    status, body = await env.get(f"{H}/nodes")
    assert status == 200, body
    assert body["kind"] == "NodeMetricsHistoryList" and body["apiVersion"] == "history.kcms.io/v1alpha1"
    assert {i["metadata"]["name"] for i in body["items"]} == set(env.sim.node_names())
    for item in body["items"]:
        assert item["window"] == "10s"
        assert item["metadata"]["labels"]["kubernetes.io/hostname"] == item["metadata"]["name"]
        points = item["points"]
        assert len(points) >= 3
        stamps = [p["timestamp"] for p in points]
        assert all(RFC3339.match(s) for s in stamps) and stamps == sorted(stamps)
        true = env.sim.true_node_rate(item["metadata"]["name"])
        for p in points:
            assert float(parse_quantity(p["usage"]["cpu"])) == pytest.approx(true, rel=0.01)
            assert parse_quantity(p["usage"]["memory"]) > 0

    status, body = await env.get(f"{H}/pods")
    assert status == 200 and body["kind"] == "PodMetricsHistoryList"
    assert len(body["items"]) == 12
    for item in body["items"]:
        ns, name = item["metadata"]["namespace"], item["metadata"]["name"]
        columns = [[p["timestamp"] for p in c["points"]] for c in item["containers"]]
        assert columns[0] and all(col == columns[0] for col in columns)  # aligned, as promised
        for c in item["containers"]:
            true = env.sim.true_container_rate(ns, name, c["name"])
            for p in c["points"]:
                assert float(parse_quantity(p["usage"]["cpu"])) == pytest.approx(true, rel=0.01, abs=2e-9)

    # the newest point is what metrics.k8s.io serves now
    node = env.sim.node_names()[0]
    _, now = await env.get(f"/apis/metrics.k8s.io/v1beta1/nodes/{node}")
    status, one = await env.get(f"{H}/nodes/{node}")
    assert (
        status == 200
        and one["kind"] == "NodeMetricsHistory"
        and one["apiVersion"] == "history.kcms.io/v1alpha1"
    )
    assert one["points"][-1] == {"timestamp": now["timestamp"], "usage": now["usage"]}


async def test_selectors_namespace_label_field_and_since(env: Env):
    await filled(env, cycles=2)
    _, everything = await env.get(f"{H}/pods")
    first = everything["items"][0]["metadata"]
    ns, name, app = first["namespace"], first["name"], first["labels"]["app"]
    in_ns = {i["metadata"]["name"] for i in everything["items"] if i["metadata"]["namespace"] == ns}

    status, body = await env.get(f"{H}/namespaces/{ns}/pods")
    assert status == 200 and {i["metadata"]["name"] for i in body["items"]} == in_ns
    status, body = await env.get(f"{H}/pods?fieldSelector=metadata.namespace%3D{ns}")
    assert {i["metadata"]["namespace"] for i in body["items"]} == {ns}
    status, body = await env.get(f"{H}/pods?fieldSelector=metadata.namespace%21%3D{ns}")
    assert ns not in {i["metadata"]["namespace"] for i in body["items"]} and body["items"]
    status, body = await env.get(f"{H}/namespaces/{ns}/pods?fieldSelector=metadata.name%3D{name}")
    assert [i["metadata"]["name"] for i in body["items"]] == [name]
    status, body = await env.get(f"{H}/namespaces/{ns}/pods?labelSelector=app%3D{app}")
    assert name in {i["metadata"]["name"] for i in body["items"]}
    assert all(i["metadata"]["labels"]["app"] == app for i in body["items"])
    status, body = await env.get(f"{H}/namespaces/{ns}/pods?labelSelector=app+notin+%28{app}%29")
    assert name not in {i["metadata"]["name"] for i in body["items"]}
    status, body = await env.get(f"{H}/namespaces/{ns}/pods/{name}")
    assert status == 200 and body["kind"] == "PodMetricsHistory" and body["metadata"]["namespace"] == ns

    node = env.sim.node_names()[1]
    status, body = await env.get(f"{H}/nodes?fieldSelector=metadata.name%3D{node}")
    assert [i["metadata"]["name"] for i in body["items"]] == [node]
    status, body = await env.get(f"{H}/nodes?labelSelector=kubernetes.io%2Fhostname%3D{node}")
    assert [i["metadata"]["name"] for i in body["items"]] == [node]
    status, body = await env.get(f"{H}/scrapes?fieldSelector=metadata.name%3D{node}")
    assert [i["metadata"]["name"] for i in body["items"]] == [node]

    # since: only the recent points; a huge since is bounded by --history (all that is kept)
    _, full = await env.get(f"{H}/nodes/{node}")
    _, huge = await env.get(f"{H}/nodes/{node}?since=100000h")
    assert huge["points"] == full["points"] and len(full["points"]) >= 3
    newest = full["points"][-1]["timestamp"]
    age = time.time() - time.mktime(time.strptime(newest, "%Y-%m-%dT%H:%M:%SZ")) + time.timezone
    _, recent = await env.get(f"{H}/nodes/{node}?since={age + 0.6:.3f}s")
    assert 1 <= len(recent["points"]) < len(full["points"])
    assert recent["points"] == full["points"][-len(recent["points"]) :]
    _, pods_recent = await env.get(f"{H}/namespaces/{ns}/pods/{name}?since={age + 0.6:.3f}s")
    assert 1 <= len(pods_recent["containers"][0]["points"]) < len(full["points"])


async def test_deleted_pod_and_node_are_not_served(env: Env):
    await filled(env, cycles=1)
    _, body = await env.get(f"{H}/pods")
    gone = body["items"][0]["metadata"]
    env.fake.delete("pods", gone["namespace"], gone["name"])
    node = env.sim.node_names()[2]
    env.fake.delete("nodes", "", node)
    for _ in range(50):  # the watch brings the deletions within moments
        status_p, _ = await env.get(f"{H}/namespaces/{gone['namespace']}/pods/{gone['name']}")
        status_n, _ = await env.get(f"{H}/nodes/{node}")
        if status_p == status_n == 404:
            break
        await asyncio.sleep(0.1)
    assert (status_p, status_n) == (404, 404)
    _, body = await env.get(f"{H}/pods")
    assert (gone["namespace"], gone["name"]) not in {
        (i["metadata"]["namespace"], i["metadata"]["name"]) for i in body["items"]
    }
    # the next cycle's expiry frees the node's history (it left the inventory)
    await env.pipeline.collector.run_cycle()
    assert node not in env.pipeline.store.history.node_names()
    _, scrapes = await env.get(f"{H}/scrapes")
    assert node not in {i["metadata"]["name"] for i in scrapes["items"]}


async def test_scrape_status_failures_recovery_and_stale(env: Env):
    await filled(env, cycles=0)
    names = env.sim.node_names()
    status, body = await env.get(f"{H}/scrapes")
    assert status == 200 and body["kind"] == "ScrapeStatusList"
    assert [i["metadata"]["name"] for i in body["items"]] == sorted(names)
    for item in body["items"]:
        assert RFC3339.match(item["lastSuccess"]) and item["lastError"] is None
        assert item["consecutiveFailures"] == 0 and item["stale"] is False

    env.sim.set_node_mode(names[0], "garbage")
    collector = env.pipeline.collector
    await collector.run_cycle()
    await collector.run_cycle()
    status, one = await env.get(f"{H}/scrapes/{names[0]}")
    assert status == 200 and one["kind"] == "ScrapeStatus"
    assert one["consecutiveFailures"] == 2 and one["lastError"] and RFC3339.match(one["lastSuccess"])
    assert re.fullmatch(r"[a-z0-9_]{1,64}", one["lastError"])
    # stale once it has had no success for over a resolution plus the timeout
    collector.resolution, collector.timeout = 0.2, 0.2
    await asyncio.sleep(0.5)
    _, one = await env.get(f"{H}/scrapes/{names[0]}")
    assert one["stale"] is True
    env.sim.set_node_mode(names[0], "ok")
    await collector.run_cycle()
    _, one = await env.get(f"{H}/scrapes/{names[0]}")
    assert (one["consecutiveFailures"], one["lastError"], one["stale"]) == (0, None, False)
    # the other nodes were never affected
    _, body = await env.get(f"{H}/scrapes")
    assert all(i["consecutiveFailures"] == 0 for i in body["items"] if i["metadata"]["name"] != names[0])
    status, body = await env.get(f"{H}/scrapes/no-such-node")
    assert status == 404 and body["kind"] == "Status" and body["reason"] == "NotFound"


async def test_authz_403_without_the_grant_per_resource(env: Env, caplog):
    await filled(env, cycles=0)
    ns = next(iter(env.inventory.pods())).namespace
    # the reader may read metrics.k8s.io but not history.kcms.io
    env.fake.authorize = lambda spec: (
        spec.get("resourceAttributes", {}).get("group") != "history.kcms.io",
        "no history for you",
    )
    for path, resource, verb, namespace in (
        (f"{H}/nodes", "nodes", "list", ""),
        (f"{H}/namespaces/{ns}/pods", "pods", "list", ns),
        (f"{H}/pods", "pods", "list", ""),
        (f"{H}/scrapes", "scrapes", "list", ""),
        (f"{H}/nodes/{env.sim.node_names()[0]}", "nodes", "get", ""),
    ):
        status, body = await env.get(path)
        assert status == 403, path
        assert body["kind"] == "Status" and body["reason"] == "Forbidden" and body["code"] == 403
        attrs = env.fake.access_reviews[-1]["spec"]["resourceAttributes"]
        assert (attrs["group"], attrs["resource"], attrs["verb"], attrs.get("namespace", "")) == (
            "history.kcms.io", resource, verb, namespace,
        )  # fmt: skip
    status, _ = await env.get("/apis/metrics.k8s.io/v1beta1/nodes")
    assert status == 200  # other groups unaffected
    # a user granted one namespace only (SAR decides per namespace; decisions are cached per user)
    env.fake.tokens["ns-reader"] = {"username": "ns-reader", "uid": "7", "groups": ["readers"]}
    env.fake.authorize = lambda spec: (
        spec["user"] == "ns-reader" and spec.get("resourceAttributes", {}).get("namespace") == ns,
        "",
    )
    status, _ = await env.get(f"{H}/namespaces/{ns}/pods", token="ns-reader")
    assert status == 200
    status, _ = await env.get(f"{H}/pods", token="ns-reader")
    assert status == 403
    status, _ = await env.get("/readyz", token=None, accept=None)
    assert status == 200
    status, _ = await env.get(f"{H}/nodes", token=None)
    assert status == 401
    no_traceback(caplog)


async def test_discovery_and_openapi_include_the_group(env: Env):
    await wait_ready(env)
    status, groups = await env.get("/apis")
    assert status == 200
    (group,) = [g for g in groups["groups"] if g["name"] == "history.kcms.io"]
    assert group["preferredVersion"]["groupVersion"] == "history.kcms.io/v1alpha1"
    status, res = await env.get(H)
    assert status == 200 and res["kind"] == "APIResourceList"
    kinds = {r["name"]: (r["kind"], r["namespaced"], r["verbs"]) for r in res["resources"]}
    assert kinds["nodes"] == ("NodeMetricsHistory", False, ["get", "list"])
    assert kinds["pods"] == ("PodMetricsHistory", True, ["get", "list"])
    assert kinds["scrapes"] == ("ScrapeStatus", False, ["get", "list"])
    assert kinds["series"] == ("MetricSeriesHistory", True, ["list"])
    status, v2 = await env.get("/openapi/v2")
    assert status == 200
    for path in (
        "/nodes",
        "/nodes/{name}",
        "/pods",
        "/namespaces/{namespace}/pods/{name}",
        "/scrapes",
        "/series",
    ):
        assert H + path in v2["paths"], path
    for kind in ("NodeMetricsHistoryList", "PodMetricsHistory", "ScrapeStatusList", "UsagePoint"):
        assert f"io.kcms.history.v1alpha1.{kind}" in v2["definitions"]
    refs = json.dumps(v2["definitions"])
    for ref in re.findall(r'"#/definitions/([^"]+)"', refs):  # no dangling reference
        assert ref in v2["definitions"], ref
    params = {p["name"] for p in v2["paths"][H + "/pods"]["get"]["parameters"]}
    assert {"labelSelector", "fieldSelector", "since"} <= params
    status, v3 = await env.get("/openapi/v3/apis/history.kcms.io/v1alpha1")
    assert status == 200 and v3["paths"]
    status, table = await env.get(f"{H}/nodes", accept="application/json;as=Table;v=v1;g=meta.k8s.io")
    assert status == 200 and table["kind"] == "Table" and len(table["rows"]) == 3


async def test_hostile_parameters_and_names_are_400_or_404_statuses(env: Env, caplog):
    await filled(env, cycles=0)
    caplog.set_level(logging.INFO)
    _, before = await env.get("/apis/metrics.k8s.io/v1beta1/nodes")
    for query in (
        "since=-5m", "since=0", "since=abc", "since=1e400", "since=nan", "since=inf", "since=-inf",
        "since=" + "9" * 5000, "since=5m%00", "since=%20", "since=",
        "labelSelector=app+in+%28a", "labelSelector=" + quote("a" * 70000),
        "labelSelector=%3D%3D%3D", "fieldSelector=spec.nodeName%3Dx", "fieldSelector=metadata.name",
    ):  # fmt: skip
        for path in (f"{H}/nodes", f"{H}/pods", f"{H}/namespaces/default/pods"):
            status, body = await env.get(f"{path}?{query}")
            assert status in (400, 414, 431), (path, query, status)
            if status == 400:
                assert body["kind"] == "Status" and body["reason"] == "BadRequest", (query, body)
    # a repeated parameter: the first one counts, as in Kubernetes (url.Values.Get)
    status, _ = await env.get(f"{H}/nodes?since=5m&since=1x")
    assert status == 200
    status, _ = await env.get(f"{H}/nodes?since=1x&since=5m")
    assert status == 400
    for path in (
        f"{H}/nodes/" + "n" * 300, f"{H}/nodes/%00", f"{H}/nodes/..%2F..%2Fetc",
        f"{H}/namespaces/%00/pods/x", f"{H}/namespaces/default/pods/" + quote("é\u202e"), f"{H}/scrapes/%0A",
    ):  # fmt: skip
        status, body = await env.get(path)
        assert status in (400, 404), (path, status)
        assert body["kind"] == "Status"
    status, _ = await env.get("/readyz", token=None, accept=None)
    assert status == 200
    _, after = await env.get("/apis/metrics.k8s.io/v1beta1/nodes")
    assert {i["metadata"]["name"] for i in after["items"]} == {i["metadata"]["name"] for i in before["items"]}
    status, body = await env.get(f"{H}/nodes")
    assert status == 200 and len(body["items"]) == 3
    no_traceback(caplog)


def without_request_time(body: dict) -> dict:
    """``body`` with each item's creationTimestamp (the time of the request, as in metrics-server)
    checked and removed: two reads a second apart differ only there."""
    for item in body["items"]:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", item["metadata"].pop("creationTimestamp"))
    return body


async def test_large_lists_are_streamed_and_equal_the_joined_body(env: Env, monkeypatch):
    await filled(env, cycles=1)
    _, joined = await env.get(f"{H}/pods")
    joined = without_request_time(joined)
    monkeypatch.setattr(history_api, "STREAM_BYTES", 64)
    monkeypatch.setattr(history_api, "CHUNK_BYTES", 16)
    _, streamed = await env.get(f"{H}/pods")
    assert without_request_time(streamed) == joined and len(streamed["items"]) == 12
    async with aiohttp.ClientSession() as s:
        async with s.get(
            env.url + f"{H}/pods", headers={"Authorization": f"Bearer {READER}"}, ssl=env.ssl
        ) as r:
            assert r.headers.get("Transfer-Encoding") == "chunked"
            assert without_request_time(json.loads(await r.read())) == joined


async def test_kubectl_get_raw_in_process(env: Env):
    await filled(env, cycles=1)
    assert KUBECTL is not None, "kubectl is needed (tests/system-deps.sh)"
    node = env.sim.node_names()[0]
    # in a thread: the server runs on this test's event loop
    body = await asyncio.to_thread(kubectl_json, env.kubeconfig, "get", "--raw", f"{H}/nodes/{node}?since=5m")
    assert body["kind"] == "NodeMetricsHistory" and body["points"]
    body = await asyncio.to_thread(kubectl_json, env.kubeconfig, "get", "--raw", f"{H}/scrapes")
    assert len(body["items"]) == 3


async def test_history_zero_means_no_group(ca, fake_kube, tmp_path):
    sim = SimulatedCluster(nodes=1, pods_per_node=2, seed=3, ca=ca, one_port_per_node=True)
    await sim.start()
    e = await start_env(ca, fake_kube, tmp_path, sim, history=0.0)
    try:
        await wait_ready(e)
        assert e.pipeline.store.history is None
        _, groups = await e.get("/apis")
        assert "history.kcms.io" not in {g["name"] for g in groups["groups"]}
        for path in (H, f"{H}/nodes", "/apis/history.kcms.io"):
            status, body = await e.get(path)
            assert status == 404 and body["kind"] == "Status", path
        _, v2 = await e.get("/openapi/v2")
        assert not [p for p in v2["paths"] if "history.kcms.io" in p]
        status, _ = await e.get("/apis/metrics.k8s.io/v1beta1/nodes")
        assert status == 200
    finally:
        await stop_env(e)
        await sim.stop()


async def test_history_with_scrape_workers(ca, fake_kube, tmp_path):
    """--scrape-workers 1: readings come from a child process into the parent's store and history."""
    sim = SimulatedCluster(nodes=2, pods_per_node=2, seed=5, ca=ca, one_port_per_node=True)
    await sim.start()
    e = await start_env(ca, fake_kube, tmp_path, sim, scrape_workers=1)
    try:
        await wait_ready(e, limit=40.0)
        deadline = time.monotonic() + 40
        while True:
            _, body = await e.get(f"{H}/nodes")
            _, scrapes = await e.get(f"{H}/scrapes")
            if len(body["items"]) == 2 and all(i["lastSuccess"] for i in scrapes["items"]):
                break
            assert time.monotonic() < deadline, (body, scrapes)
            await asyncio.sleep(0.5)
        assert {i["metadata"]["name"] for i in scrapes["items"]} == set(sim.node_names())
        assert all(i["consecutiveFailures"] == 0 for i in scrapes["items"])
    finally:
        await stop_env(e)
        await sim.stop()


def test_bad_history_flag_stops_startup_naming_it():
    for argv in (
        ["standalone", "--history", "-1m"], ["standalone", "--history", "5s"], ["standalone", "--history", "48h"],
        ["standalone", "--history", "soon"], ["standalone", "--history", "nan"], ["demo", "--history", "1s"],
        ["demo", "--history", "inf"],
    ):  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-m", "kcms", *argv], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2, (argv, out.stderr)
        assert "--history" in out.stderr and "Traceback" not in out.stderr, argv


def _demo(tmp_path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kcms", "demo", "--secure-port", str(port), "--nodes", "2", "--pods-per-node", "2",
         "--work-dir", str(tmp_path), "--exit-after", "90s", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    kubeconfig = str(tmp_path / "kubeconfig")
    deadline = time.monotonic() + 40
    while True:
        ready = subprocess.run(
            [KUBECTL or "kubectl", "--kubeconfig", kubeconfig, "get", "--raw", "/readyz"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if ready.returncode == 0:
            return proc, kubeconfig
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, ready.stderr
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    return err


def test_kubectl_get_raw_against_kcms_demo(tmp_path):
    assert KUBECTL is not None, "kubectl is needed (tests/system-deps.sh)"
    proc, kubeconfig = _demo(tmp_path)
    try:
        deadline = time.monotonic() + 30
        while True:  # the second reading of each container comes ~2 s after the first
            body = kubectl_json(kubeconfig, "get", "--raw", f"{H}/pods")
            if len(body["items"]) == 4:
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.5)
        item = body["items"][0]
        body = kubectl_json(
            kubeconfig, "get", "--raw",
            f"{H}/namespaces/{item['metadata']['namespace']}/pods/{item['metadata']['name']}?since=10m",
        )  # fmt: skip
        assert body["kind"] == "PodMetricsHistory" and body["containers"][0]["points"]
        assert len(kubectl_json(kubeconfig, "get", "--raw", f"{H}/nodes")["items"]) == 2
        groups = kubectl_json(kubeconfig, "get", "--raw", "/apis")
        assert "history.kcms.io" in {g["name"] for g in groups["groups"]}
        bad = subprocess.run(
            [KUBECTL, "--kubeconfig", kubeconfig, "get", "--raw", f"{H}/nodes?since=yesterday"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert bad.returncode != 0
        assert "BadRequest" in bad.stderr or "since" in bad.stderr, bad.stderr
    finally:
        err = _stop(proc)
    assert "Traceback" not in err


def test_kcms_demo_history_zero_has_no_group(tmp_path):
    assert KUBECTL is not None, "kubectl is needed (tests/system-deps.sh)"
    proc, kubeconfig = _demo(tmp_path, "--history", "0")
    try:
        groups = kubectl_json(kubeconfig, "get", "--raw", "/apis")
        assert "history.kcms.io" not in {g["name"] for g in groups["groups"]}
        out = subprocess.run(
            [KUBECTL, "--kubeconfig", kubeconfig, "get", "--raw", f"{H}/nodes"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert out.returncode != 0
        assert "NotFound" in out.stderr or "not found" in out.stderr.lower(), out.stderr
        assert (
            kubectl_json(kubeconfig, "get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes")["kind"]
            == "NodeMetricsList"
        )
    finally:
        err = _stop(proc)
    assert "Traceback" not in err


async def test_series_history_selectors_and_errors(env: Env, caplog):
    from kcms.model import ObjectRef

    await wait_ready(env)
    series = env.pipeline.series
    now = time.time()
    pod = next(iter(env.inventory.pods()))
    ns, name = pod.namespace, pod.name
    node = env.sim.node_names()[0]
    for i in range(5):
        t = now - 40 + 10 * i
        series.append(
            "http_requests_total", ObjectRef("pods", ns, name), (("handler", "root"),), t, 100.0 * i
        )
        series.append("http_requests_total", ObjectRef("pods", ns, name), (("handler", "api"),), t, 7.0 * i)
        series.append("http_requests_total", ObjectRef("pods", "other-ns", "x"), (), t, 1.0)
        series.append("queue_backlog", ObjectRef("deployments.apps", ns, "web"), (), t, 0.5 * i)
        series.append("queue_backlog", ObjectRef("", ns, ""), (("queue", "emails"),), t, 3.0 * i)
        series.append("node_load1", ObjectRef("nodes", "", node), (), t, 1.25)

    status, body = await env.get(f"{H}/namespaces/{ns}/series?metric=http_requests_total")
    assert status == 200 and body["kind"] == "MetricSeriesHistoryList"
    assert len(body["items"]) == 2  # other-ns's series is not this namespace's
    item = next(i for i in body["items"] if i["metric"]["selector"]["matchLabels"] == {"handler": "root"})
    assert item["describedObject"] == {"kind": "Pod", "namespace": ns, "name": name, "apiVersion": "/v1"}
    assert [p["value"] for p in item["points"]] == ["0", "100", "200", "300", "400"]
    assert all(RFC3339.match(p["timestamp"]) for p in item["points"])
    # labelSelector: the series' metric labels; fieldSelector: the described object
    status, body = await env.get(
        f"{H}/namespaces/{ns}/series?metric=http_requests_total&labelSelector=handler%3Dapi"
    )
    assert [i["metric"]["selector"]["matchLabels"] for i in body["items"]] == [{"handler": "api"}]
    status, body = await env.get(
        f"{H}/namespaces/{ns}/series?metric=http_requests_total&fieldSelector=metadata.name%3Dnope"
    )
    assert body["items"] == []
    # since: only the recent points (bounded by --history)
    status, body = await env.get(f"{H}/namespaces/{ns}/series?metric=http_requests_total&since=25s")
    assert all(len(i["points"]) == 3 for i in body["items"])
    # resource: one kind of object, or the external series only
    status, body = await env.get(f"{H}/namespaces/{ns}/series?metric=queue_backlog")
    assert {i["external"] for i in body["items"]} == {True, False}
    status, body = await env.get(f"{H}/namespaces/{ns}/series?metric=queue_backlog&resource=deployments.apps")
    (item,) = body["items"]
    assert item["describedObject"]["kind"] == "Deployment" and item["describedObject"]["name"] == "web"
    status, body = await env.get(f"{H}/namespaces/{ns}/series?metric=queue_backlog&resource=external")
    (item,) = body["items"]
    assert item["external"] is True and item["metric"]["selector"]["matchLabels"] == {"queue": "emails"}
    assert item["points"][-1]["value"] == "12"
    # cluster-scoped objects on the cluster path
    status, body = await env.get(f"{H}/series?metric=node_load1")
    (item,) = body["items"]
    assert item["describedObject"]["kind"] == "Node" and item["describedObject"]["name"] == node
    assert "namespace" not in item["describedObject"]
    status, body = await env.get(f"{H}/series?metric=http_requests_total")
    assert body["items"] == []

    for query in (
        "", "metric=", "metric=bad-name", "metric=" + "m" * 300, "metric=x&resource=Pods",
        "metric=x&resource=" + "a" * 300, "metric=x&since=-1s", "metric=x&labelSelector=a+in+%28",
        "metric=x&fieldSelector=spec.x%3D1",
    ):  # fmt: skip
        status, body = await env.get(f"{H}/namespaces/{ns}/series?{query}")
        assert status == 400 and body["kind"] == "Status" and body["reason"] == "BadRequest", query
    # authorized as resource "series" of the group, per namespace
    # (a new user: decisions are cached per user)
    env.fake.tokens["no-series"] = {"username": "no-series", "uid": "9", "groups": ["readers"]}
    env.fake.authorize = lambda spec: (spec.get("resourceAttributes", {}).get("resource") != "series", "no")
    status, body = await env.get(f"{H}/namespaces/{ns}/series?metric=queue_backlog", token="no-series")
    assert status == 403 and body["reason"] == "Forbidden"
    attrs = env.fake.access_reviews[-1]["spec"]["resourceAttributes"]
    assert (attrs["group"], attrs["resource"], attrs["verb"], attrs["namespace"]) == (
        "history.kcms.io", "series", "list", ns,
    )  # fmt: skip
    status, _ = await env.get(f"{H}/namespaces/{ns}/pods", token="no-series")
    assert status == 200
    status, _ = await env.get("/readyz", token=None, accept=None)
    assert status == 200
    no_traceback(caplog)


def test_time_cache_matches_the_formatter_and_stays_bounded(monkeypatch):
    from kcms.apis.history.convert import TimeCache, TimeFormatter

    monkeypatch.setattr(TimeCache, "LIMIT", 100)
    cache, plain = TimeCache(), TimeFormatter()
    stamps = [1_700_000_000.0 + 0.5 * i for i in range(1000)] + [-1e300, 1e300, float("nan"), 0.0]
    for ts in stamps + stamps[::-1]:
        assert cache(ts) == plain(ts)
        assert len(cache._texts) <= 100
