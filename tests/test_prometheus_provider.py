"""The Prometheus source served by the standalone pipeline (in process, real HTTPS, the fake API for
objects, TokenReview and SubjectAccessReview) against a REAL Prometheus scraping the simulated
exporter: for each prometheus-adapter rule feature, the served values equal the PromQL result this
test computes independently (Prometheus's own API, read with urllib); and a hostile backend (down,
slow, erroring, malformed, huge) gives clean Status errors while discovery, the store's metrics,
metrics.k8s.io and /readyz are unaffected and the log holds no traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from _bridge_helpers import RATE, HostilePrometheus, close, exporter_objects, promql, write_config
from _pipeline import Env, start_env, stop_env, wait_ready
from _prometheus_helpers import prom_fixture  # noqa: F401 (the module's real Prometheus: `prom`)

from kcms.sim import SimulatedCluster

CUSTOM = "/apis/custom.metrics.k8s.io"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"


async def _env(ca, fake_kube, tmp_path, url: str, **over) -> tuple[Env, SimulatedCluster]:
    sim = SimulatedCluster(
        nodes=1, pods_per_node=2, containers_per_pod=1, seed=5, ca=ca, one_port_per_node=True
    )
    await sim.start()
    settings = dict(
        prometheus_url=url,
        config=write_config(tmp_path),
        metrics_relist_interval=1.0,
        metrics_max_age=600.0,
        prometheus_query_timeout=2.0,
    )
    settings.update(over)
    env = await start_env(ca, fake_kube, tmp_path, sim, **settings)
    return env, sim


@pytest.fixture
async def env(ca, fake_kube, tmp_path, prom):
    exporter_objects(fake_kube, prom.exporter)
    e, sim = await _env(ca, fake_kube, tmp_path, prom.url)
    try:
        await wait_ready(e)
        yield e
    finally:
        await stop_env(e)
        await sim.stop()


def _values(body: dict, key: str = "value") -> dict[str, str]:
    return {i["describedObject"]["name"]: i[key] for i in body["items"]}


async def test_discovery_lists_each_rule_metric_once_and_filters_apply(env: Env):
    status, body = await env.get(f"{CUSTOM}/v1beta2")
    assert status == 200
    names = {r["name"]: r["namespaced"] for r in body["resources"]}
    for wanted in (
        "pods/requests_per_second",
        "namespaces/requests_per_second",
        "pods/http_requests_in_flight",
        "deployments.apps/http_requests_in_flight",
        "namespaces/http_requests_in_flight",
        "deployments.apps/messages_waiting",
        "nodes/node_temperature_celsius",
    ):
        assert wanted in names, (wanted, sorted(names))
    assert names["pods/requests_per_second"] is True and names["nodes/node_temperature_celsius"] is False
    assert names["namespaces/requests_per_second"] is False  # as prometheus-adapter lists it
    # name.as renamed these: the series names are not metrics
    assert "deployments.apps/queue_messages_ready" not in names
    assert not [n for n in names if n.endswith("/http_requests_total")]
    status, body = await env.get(EXTERNAL)
    assert {r["name"] for r in body["resources"]} >= {"queue_depth", "jobs_pending"}


async def test_pods_metric_with_label_selector_equals_promql(env: Env, prom):
    """The HPA's Pods metric: /namespaces/ns/pods/*/m?labelSelector=app%3Dweb (seriesFilters,
    overrides, name.as with a capture group, LabelMatchers, GroupBy)."""
    path = f"{CUSTOM}/v1beta2/namespaces/default/pods/*/requests_per_second?labelSelector=app%3Dweb"
    status, body = await env.get(path)
    assert status == 200, body
    served = _values(body)
    expected = promql(
        prom, f'sum(rate(http_requests_total{{namespace="default",pod=~"web-0|web-1|web-2"}}{RATE})) by (pod)'
    )
    assert sorted(served) == ["web-0", "web-1", "web-2"]
    for labels, value in expected.items():
        pod = dict(labels)["pod"]
        assert close(served[pod], value), (pod, served[pod], value)
        # and the exporter's known rate (the in-flight gauge, sorted first, would give 0)
        exporter_pod = next(p for p in prom.exporter.pods if p.namespace == "default" and p.name == pod)
        assert close(served[pod], prom.exporter.request_rate(exporter_pod), rel=0.05)
    item = body["items"][0]
    assert item["describedObject"] == {
        "kind": "Pod",
        "namespace": "default",
        "name": "web-0",
        "apiVersion": "/v1",
    }  # as the upstream adapters write it
    assert item["metric"] == {"name": "requests_per_second"}

    # v1beta1: the same values under metricName
    status, old = await env.get(path.replace("v1beta2", "v1beta1"))
    assert status == 200 and {i["metricName"] for i in old["items"]} == {"requests_per_second"}
    assert sorted(_values(old)) == ["web-0", "web-1", "web-2"]

    # a wildcard without a selector: every pod of the namespace the fake API lists
    status, body = await env.get(f"{CUSTOM}/v1beta2/namespaces/team-a/pods/*/requests_per_second")
    assert status == 200
    assert sorted(_values(body)) == sorted(p.name for p in prom.exporter.pods if p.namespace == "team-a")


async def test_metric_label_selector_becomes_matchers(env: Env, prom):
    base = f"{CUSTOM}/v1beta2/namespaces/default/pods/*/requests_per_second?labelSelector=app%3Dweb"
    status, body = await env.get(base + "&metricLabelSelector=method%3DGET")
    assert status == 200 and sorted(_values(body)) == ["web-0", "web-1", "web-2"]
    assert body["items"][0]["metric"]["selector"] == {"matchLabels": {"method": "GET"}}
    expected = promql(
        prom, f'sum(rate(http_requests_total{{namespace="default",pod="web-1",method="GET"}}{RATE})) by (pod)'
    )
    assert close(_values(body)["web-1"], next(iter(expected.values())))
    status, body = await env.get(base + "&metricLabelSelector=method%3DPOST")
    assert status == 200 and body["items"] == []  # no series has method=POST
    status, body = await env.get(
        f"{CUSTOM}/v1beta2/namespaces/default/pods/web-1/requests_per_second?metricLabelSelector=method+notin+%28GET%29"
    )
    assert status == 404 and body["kind"] == "Status"


async def test_object_metric_on_a_deployment_template_and_overrides(env: Env, prom):
    """The HPA's Object metric on deployments.apps/<name>: a template rule (label ``deployment``)
    and an override rule with a group and a renamed gauge."""
    status, body = await env.get(
        f"{CUSTOM}/v1beta2/namespaces/default/deployments.apps/web/http_requests_in_flight"
    )
    assert status == 200, body
    (item,) = body["items"]
    assert item["describedObject"]["name"] == "web" and item["describedObject"]["kind"] == "Deployment"
    expected = promql(
        prom, 'sum(http_requests_in_flight{namespace="default",deployment="web"}) by (deployment)'
    )
    assert close(item["value"], next(iter(expected.values())), rel=0)

    status, body = await env.get(
        f"{CUSTOM}/v1beta1/namespaces/team-a/deployments.apps/worker/messages_waiting"
    )
    assert status == 200, body
    (item,) = body["items"]
    assert item["metricName"] == "messages_waiting"
    expected = promql(
        prom, 'max(queue_messages_ready{namespace="team-a",deployment="worker"}) by (deployment)'
    )
    assert close(item["value"], next(iter(expected.values())), rel=0)
    assert close(item["value"], prom.exporter.deployment_queue("team-a", "worker"), rel=0)


async def test_cluster_scoped_and_namespace_metrics(env: Env, prom):
    status, body = await env.get(f"{CUSTOM}/v1beta2/nodes/node-2/node_temperature_celsius")
    assert status == 200, body
    assert body["items"][0]["describedObject"]["kind"] == "Node"
    assert close(body["items"][0]["value"], prom.exporter.node_temperature("node-2"), rel=0)
    status, body = await env.get(f"{CUSTOM}/v1beta2/namespaces/team-a/metrics/requests_per_second")
    assert status == 200, body
    expected = promql(prom, f'sum(rate(http_requests_total{{namespace="team-a"}}{RATE})) by (namespace)')
    assert close(body["items"][0]["value"], next(iter(expected.values())))
    status, body = await env.get(f"{CUSTOM}/v1beta2/nodes/node-9/node_temperature_celsius")
    assert status == 404 and body["reason"] == "NotFound"


async def test_external_metrics_label_selector_and_namespacing(env: Env, prom):
    status, body = await env.get(f"{EXTERNAL}/namespaces/anywhere/queue_depth?labelSelector=queue%3Demails")
    assert status == 200, body
    (item,) = body["items"]
    assert item["metricLabels"] == {"queue": "emails"} and item["metricName"] == "queue_depth"
    assert close(
        item["value"],
        promql(prom, 'sum(queue_depth{queue="emails"}) by (queue)')[(("queue", "emails"),)],
        rel=0,
    )
    status, body = await env.get(f"{EXTERNAL}/namespaces/default/queue_depth")  # namespaced: false
    assert {i["metricLabels"]["queue"] for i in body["items"]} == {"emails", "invoices"}

    for ns in ("default", "team-a"):  # namespaced: the request's namespace is a matcher
        status, body = await env.get(f"{EXTERNAL}/namespaces/{ns}/jobs_pending")
        assert status == 200, body
        expected = promql(prom, f'sum(jobs_pending{{namespace="{ns}"}}) by (queue)')
        served = {i["metricLabels"]["queue"]: i["value"] for i in body["items"]}
        assert sorted(served) == sorted(dict(k)["queue"] for k in expected)
        for labels, value in expected.items():
            assert close(served[dict(labels)["queue"]], value, rel=0)
    status, body = await env.get(
        f"{EXTERNAL}/namespaces/team-a/jobs_pending?labelSelector=queue+in+%28invoices%29"
    )
    assert [i["metricLabels"] for i in body["items"]] == [{"queue": "invoices"}]
    assert close(body["items"][0]["value"], prom.exporter.jobs_pending("team-a", "invoices"), rel=0)


async def test_a_selector_promql_cannot_express_is_the_clients_400(env: Env, prom):
    """``k>5`` parses as a Kubernetes selector but has no PromQL matcher (prometheus-adapter refuses
    it too): the client's mistake, a 400 Status, on both APIs; the metric itself still answers."""
    for path in (
        f"{EXTERNAL}/namespaces/team-a/jobs_pending?labelSelector=queue%3E5",
        f"{CUSTOM}/v1beta2/namespaces/default/pods/*/requests_per_second?metricLabelSelector=method%3E5",
    ):
        status, body = await env.get(path)
        assert status == 400 and body["kind"] == "Status" and body["reason"] == "BadRequest", body
        assert "operator not supported" in body["message"]
    status, body = await env.get(f"{EXTERNAL}/namespaces/team-a/jobs_pending")
    assert status == 200 and body["items"]


async def test_readyz_reports_discovery_and_metrics_count_it(env: Env):
    status, text = await env.get("/readyz?verbose", token=None, accept=None)
    assert status == 200
    line = next(ln for ln in text.splitlines() if "prometheus-discovery" in ln)
    assert line.startswith("[+]prometheus-discovery ok: ") and "custom and" in line and "relisted" in line
    status, text = await env.get("/metrics", accept=None)
    assert status == 200
    assert "kcms_prometheus_relist_last_success_timestamp_seconds" in text
    assert 'kcms_prometheus_discovered_metrics{api="custom"}' in text


# ---- a hostile backend ------------------------------------------------------------------------


@pytest.fixture
async def hostile():
    h = HostilePrometheus()
    h.series = [
        {"__name__": "queue_depth", "queue": "emails"},
        {"__name__": "http_requests_in_flight", "namespace": "default", "pod": "p-0", "deployment": "web"},
        # names no API can serve: a backend may send anything (left out, counted)
        {"__name__": "http_requests_in_flight/../x", "namespace": "default", "pod": "p-0"},
        {"__name__": "queue_depth" + "x" * 300, "queue": "emails"},
    ]
    h.rows = [{"metric": {"queue": "emails"}, "value": [time.time(), "42"]}]
    await h.start()
    yield h
    await h.down()


async def _push(env: Env, fake_kube, namespace: str, pod: str) -> None:
    import aiohttp

    fake_kube.tokens["pusher"] = {"username": "pusher", "groups": ["pushers"]}
    sample = {"metric": "jobs_done", "resource": "pods", "namespace": namespace, "name": pod, "value": 3}
    sample["timestamp"] = time.time()
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": "Bearer pusher"}
        async with s.post(
            env.url + "/push/v1/samples", json={"samples": [sample]}, headers=headers, ssl=env.ssl
        ) as r:
            assert r.status == 200, await r.text()


async def test_hostile_prometheus_gives_clean_statuses_and_nothing_else_is_affected(
    ca, fake_kube, tmp_path, hostile, caplog
):
    caplog.set_level(logging.INFO)
    e, sim = await _env(ca, fake_kube, tmp_path, hostile.url, prometheus_max_response_bytes=1 << 20)
    try:
        await wait_ready(e)
        pod = e.sim.nodes[0].pods[0]
        await _push(e, fake_kube, pod.namespace, pod.name)
        ext = f"{EXTERNAL}/namespaces/default/queue_depth"
        status, body = await e.get(ext)
        assert status == 200 and body["items"][0]["value"] == "42"
        status, disc = await e.get(EXTERNAL)
        ext_names = [r["name"] for r in disc["resources"]]  # every rule sees the same series here
        assert "queue_depth" in ext_names and all(len(n) < 100 and "/" not in n for n in ext_names), ext_names
        status, disc = await e.get(f"{CUSTOM}/v1beta2")
        assert not [r["name"] for r in disc["resources"] if "/.." in r["name"] or r["name"].count("/") != 1]
        status, text = await e.get("/metrics", accept=None)
        assert "kcms_prometheus_refused_metric_names_total" in text
        assert "kcms_prometheus_refused_metric_names_total 0.0" not in text
        node = sim.node_names()[0]
        for mode, code, reason in (
            ("error", 503, "ServiceUnavailable"),
            ("http500", 503, "ServiceUnavailable"),
            ("malformed", 503, "ServiceUnavailable"),
            ("wrong_shape", 503, "ServiceUnavailable"),
            ("huge", 503, "ServiceUnavailable"),
            ("slow", 504, "Timeout"),
            ("down", 503, "ServiceUnavailable"),
        ):
            if mode == "down":
                await hostile.down()
            else:
                hostile.mode = mode
            await asyncio.sleep(1.5)  # a relist runs against the broken backend too
            status, body = await e.get(ext)
            assert (status, body.get("reason")) == (code, reason), (mode, status, body)
            assert body["kind"] == "Status" and "queue_depth" in body["message"]
            assert "\x1b" not in body["message"]  # the backend's text is escaped
            # the last good discovery is kept
            status, disc = await e.get(EXTERNAL)
            assert "queue_depth" in {r["name"] for r in disc["resources"]}, mode
            status, disc = await e.get(f"{CUSTOM}/v1beta2")
            assert "pods/http_requests_in_flight" in {r["name"] for r in disc["resources"]}, mode
            # the store's metrics and metrics.k8s.io are served as before
            status, body = await e.get(
                f"{CUSTOM}/v1beta2/namespaces/{pod.namespace}/pods/{pod.name}/jobs_done"
            )
            assert status == 200 and body["items"][0]["value"] == "3", mode
            status, body = await e.get(f"/apis/metrics.k8s.io/v1beta1/nodes/{node}")
            assert status == 200 and body["kind"] == "NodeMetrics", mode
            # ready, and readiness says what is wrong
            status, text = await e.get("/readyz?verbose", token=None, accept=None)
            assert status == 200, text
            line = next(ln for ln in text.splitlines() if "prometheus-discovery" in ln)
            if mode != "slow":  # a slow relist may still be running
                assert "failing" in line and "serving the last good list" in line, (mode, line)
        await hostile.up()
        hostile.mode = "ok"
        await asyncio.sleep(2.5)
        status, body = await e.get(ext)
        assert status == 200 and body["items"][0]["value"] == "42"
        status, text = await e.get("/readyz?verbose", token=None, accept=None)
        assert "failing" not in next(ln for ln in text.splitlines() if "prometheus-discovery" in ln)
        status, text = await e.get("/metrics", accept=None)
        for reason in ("query_error", "http_500", "bad_response", "too_large", "timeout", "unavailable"):
            assert f'kcms_prometheus_relist_failures_total{{reason="{reason}"}}' in text, reason
            assert f'kcms_prometheus_query_failures_total{{api="external",reason="{reason}"}}' in text, reason
    finally:
        await stop_env(e)
        await sim.stop()
    assert not [r for r in caplog.records if r.exc_info], [
        r.getMessage() for r in caplog.records if r.exc_info
    ]
    assert "Traceback" not in caplog.text
    failures = [
        r.getMessage() for r in caplog.records if "query" in r.getMessage() and "failed" in r.getMessage()
    ]
    assert failures and all("\x1b" not in m and "\n" not in m for m in failures)


# ---- 10 000 series ------------------------------------------------------------------------------

BULK_CONFIG = """
rules:
- seriesQuery: '{__name__=~"app_bulk_.*",namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""


async def test_discovery_of_10000_series_stays_served_and_survives_prometheus_going_away(
    ca, fake_kube, tmp_path
):
    from _prometheus_helpers import start_prom_env

    from kcms.sim.prometheus import SimExporter

    exporter = SimExporter.bulk(10_000)
    bulk, served = await asyncio.to_thread(start_prom_env, exporter, 2)
    stopped = False
    try:
        exporter_objects(fake_kube, exporter)
        (tmp_path / "bulk").mkdir()
        config = write_config(tmp_path / "bulk", BULK_CONFIG)
        e, sim = await _env(ca, fake_kube, tmp_path, bulk.url, config=config)
        try:
            await wait_ready(e)
            wanted = {f"pods/app_bulk_{m}" for m in range(exporter.bulk_metrics)}
            assert len(wanted) * len(exporter.pods) >= 9000  # ~10 000 series behind them
            status, body = await e.get(f"{CUSTOM}/v1beta2")
            assert status == 200 and wanted <= {r["name"] for r in body["resources"]}
            pod = exporter.pods[7]
            status, body = await e.get(
                f"{CUSTOM}/v1beta2/namespaces/{pod.namespace}/pods/{pod.name}/app_bulk_3"
            )
            assert status == 200 and body["items"][0]["value"] == str(int(exporter.bulk_value(pod, 3)))
            await asyncio.to_thread(bulk.prometheus.stop)
            stopped = True
            await asyncio.sleep(2.5)  # two failed relists
            for _ in range(20):  # discovery keeps answering, from the last good list
                status, body = await e.get(f"{CUSTOM}/v1beta2")
                assert status == 200 and wanted <= {r["name"] for r in body["resources"]}
            status, body = await e.get(
                f"{CUSTOM}/v1beta2/namespaces/{pod.namespace}/pods/{pod.name}/app_bulk_3"
            )
            assert status == 503 and body["reason"] == "ServiceUnavailable"
            status, text = await e.get("/readyz?verbose", token=None, accept=None)
            assert status == 200 and "serving the last good list" in text
        finally:
            await stop_env(e)
            await sim.stop()
    finally:
        if not stopped:
            await asyncio.to_thread(bulk.prometheus.stop)
        await asyncio.to_thread(served.stop)


# ---- the resourceRules feed against a failing backend ----------------------------------------------


async def test_resource_feed_keeps_readings_on_failure_then_expires_them_never_frozen(hostile, caplog):
    from _bridge_helpers import ADAPTER_CONFIG
    from fakeapi import make_node, make_pod

    from kcms.apis.prometheus.config import load_adapter_config
    from kcms.apis.prometheus.resource_source import PrometheusResources
    from kcms.kube.inventory import StaticInventory
    from kcms.sources.prometheus_api import PrometheusClient
    from kcms.store.resource import ResourceStore

    caplog.set_level(logging.INFO)
    inventory = StaticInventory([make_node("node-1"), make_pod("default", "p-0", "node-1")])
    rules = load_adapter_config(ADAPTER_CONFIG).resource_rules
    assert rules is not None
    # every query answers this one row: 2 cores as cpu, 2 bytes as memory
    labels = {"namespace": "default", "pod": "p-0", "container": "app", "node": "node-1"}
    hostile.rows = [{"metric": labels, "value": [time.time(), "2"]}]
    store = ResourceStore(10.0)
    client = PrometheusClient(hostile.url, timeout=1.0)
    feed = PrometheusResources(client, rules, store, inventory, interval=10.0)
    try:
        assert await feed.cycle()
        node = store.node_usage("node-1")
        assert node is not None and (node.cpu_nanocores, node.memory) == (2 * 10**9, 2)
        assert node.window == rules.window  # served over the rule's window, as the adapter does
        pod = store.pod_usage("default", "p-0")
        assert pod is not None and [name for name, _ in pod.containers] == ["app"]
        for mode in ("error", "malformed", "slow"):
            hostile.mode = mode
            assert not await feed.cycle()
            assert store.node_usage("node-1") is not None  # the previous readings are kept...
            ok, detail = feed.missing_check()
            assert ok and "last cycle failed" in detail, detail
        store.expire(now=time.monotonic() + 3 * 10.0)  # ...until they are too old: never frozen
        assert store.node_usage("node-1") is None and store.pod_usage("default", "p-0") is None
        hostile.mode = "ok"
        assert await feed.cycle() and store.node_usage("node-1") is not None
    finally:
        await client.close()
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.exc_info]


async def test_connection_flags_reach_the_backend(ca, fake_kube, tmp_path, hostile):
    """--prometheus-header, --prometheus-token-file and --prometheus-verb as the pipeline builds
    the client from them (Mimir's tenant header, a projected token, POST for long selectors)."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    e, sim = await _env(
        ca,
        fake_kube,
        tmp_path,
        hostile.url,
        prometheus_header=["X-Scope-OrgID=team-a"],
        prometheus_token_file=str(token),
        prometheus_verb="POST",
    )
    try:
        await wait_ready(e)
        status, body = await e.get(f"{EXTERNAL}/namespaces/default/queue_depth?labelSelector=queue%3Demails")
        assert status == 200
        assert hostile.seen, "no request reached the backend"
        for method, headers, _form in hostile.seen:
            assert method == "POST"
            assert headers["X-Scope-OrgID"] == "team-a"
            assert headers["Authorization"] == "Bearer s3cret"
        queries = [form["query"] for _, _, form in hostile.seen if "query" in form]
        assert 'sum(queue_depth{queue="emails"}) by (queue)' in queries
    finally:
        await stop_env(e)
        await sim.stop()


async def test_a_slow_first_relist_does_not_hold_start_up(hostile, caplog):
    """Six rules, four relisted at a time, each answer slower than the 2.5 s timeout: the first
    round needs two timeouts (5 s) and start() waits at most one timeout and a second. The server
    starts without Prometheus's metrics, which appear once the backend answers."""
    from _bridge_helpers import ADAPTER_CONFIG

    from kcms.apis.prometheus.config import load_adapter_config
    from kcms.apis.prometheus.provider import PrometheusProvider
    from kcms.sources.prometheus_api import PrometheusClient

    hostile.mode, hostile.delay = "slow", 4.0
    client = PrometheusClient(hostile.url, timeout=2.5)
    provider = PrometheusProvider(client, load_adapter_config(ADAPTER_CONFIG), relist_interval=1.0)
    try:
        await provider.start()
        assert "still running" in caplog.text
        assert list(provider.list_external_metrics()) == []
        hostile.mode = "ok"
        for _ in range(100):
            if "queue_depth" in provider.list_external_metrics():
                break
            await asyncio.sleep(0.1)
        assert "queue_depth" in provider.list_external_metrics()
    finally:
        await provider.stop()
        await client.close()
    assert "Traceback" not in caplog.text


async def test_resource_feed_waits_for_the_pods_to_be_listed_before_its_first_cycle(fake_kube, hostile):
    """Start-up starts the feed once the nodes are listed; the queries name the inventory's pods, so
    a first cycle before the pods are listed would leave every pod unserved for a whole period."""
    from _bridge_helpers import ADAPTER_CONFIG
    from _kube_helpers import eventually
    from fakeapi import make_node, make_pod

    from kcms.apis.prometheus.config import load_adapter_config
    from kcms.apis.prometheus.resource_source import PrometheusResources
    from kcms.kube import KubeClient, KubeInventory
    from kcms.sources.prometheus_api import PrometheusClient
    from kcms.store.resource import ResourceStore

    fake_kube.upsert(make_node("node-1"))
    fake_kube.upsert(make_pod("default", "p-0", "node-1"))
    labels = {"namespace": "default", "pod": "p-0", "container": "app", "node": "node-1"}
    hostile.rows = [{"metric": labels, "value": [time.time(), "2"]}]
    rules = load_adapter_config(ADAPTER_CONFIG).resource_rules
    assert rules is not None
    gate = fake_kube.list_gates["pods"] = asyncio.Event()  # the pods' LIST is slow
    kube = await KubeClient.load(str(fake_kube.kubeconfig))
    inventory = KubeInventory(kube)
    store = ResourceStore(60.0)
    client = PrometheusClient(hostile.url, timeout=2.0)
    feed = PrometheusResources(client, rules, store, inventory, interval=60.0)  # one cycle in this test
    try:
        await inventory.start(wait_for_pods=False)  # as start-up does
        assert inventory.nodes_synced() and not inventory.has_synced()
        feed.start()
        await asyncio.sleep(0.5)
        assert store.node_usage("node-1") is None and not store.ready()  # no cycle on half an inventory
        assert feed.missing_check() == (True, "resourceRules not queried yet")
        gate.set()
        await eventually(lambda: store.pod_usage("default", "p-0") is not None)  # the first cycle has it
        assert store.node_usage("node-1") is not None
    finally:
        gate.set()
        await feed.stop()
        await client.close()
        await inventory.stop()
        await kube.close()
