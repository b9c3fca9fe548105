"""`kcms standalone` as a real process serving a REAL Prometheus through prometheus-adapter's
configuration: the HPA's exact paths and parameters (Pods metric with ``labelSelector=app%3Dweb``,
Object metric on ``deployments.apps/<name>``, External with ``labelSelector``; v1beta1 and v1beta2)
read by the real kubectl and the official ``kubernetes`` client, and ``metrics.k8s.io`` from the
config's ``resourceRules`` (``--resource-metrics-source prometheus``, what ``kubectl top`` reads),
each value compared with the PromQL this test sends to Prometheus itself. Bad flags and configs stop
start-up with a message naming the flag, the rule and the field.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from _bridge_helpers import ADAPTER_CONFIG, RATE, close, exporter_objects, promql, write_config
from _kubectl import KUBECTL, get_raw
from _process_helpers import wait_readyz
from _prometheus_helpers import prom_fixture  # noqa: F401 (the module's real Prometheus: `prom`)
from _stores import free_port

from kcms.quantity import parse_quantity

READER = "reader-token"
V2 = "/apis/custom.metrics.k8s.io/v1beta2"
V1 = "/apis/custom.metrics.k8s.io/v1beta1"
EXT = "/apis/external.metrics.k8s.io/v1beta1"
RES = "/apis/metrics.k8s.io/v1beta1"


def _kubeconfig(path: Path, port: int) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "kcms",
                        "cluster": {"server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True},
                    }
                ],
                "users": [{"name": "reader", "user": {"token": READER}}],
                "contexts": [{"name": "kcms", "context": {"cluster": "kcms", "user": "reader"}}],
                "current-context": "kcms",
            }
        )
    )
    return path


@contextlib.asynccontextmanager
async def _serving(tmp_path: Path, *argv: str):
    """`kcms <argv>` as a process on a free port until ready; yields (kubeconfig, log path); at the
    end SIGTERM, exit code 0 and no traceback in its log."""
    port = free_port()
    log_path = tmp_path / f"kcms-{argv[0]}.log"
    err = open(log_path, "wb")  # noqa: SIM115, ASYNC230 (closed below; a local file)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kcms", *argv,
        "--secure-port", str(port), "--bind-address", "127.0.0.1", "--cert-dir", str(tmp_path / "certs"),
        "--authentication-skip-lookup",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=err,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as s:
            await wait_readyz(s, port, proc, 60, log_path.read_text)
        yield _kubeconfig(tmp_path / f"kcms-{argv[0]}.kubeconfig", port), log_path
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
        err.close()
    assert code == 0
    log = log_path.read_text()
    assert "Traceback" not in log, log


def _bridge_flags(tmp_path: Path, prom) -> list[str]:
    return [
        "--prometheus-url", prom.url, "--config", write_config(tmp_path), "--metrics-relist-interval", "2s",
        "--metrics-max-age", "10m", "--prometheus-verb", "POST",
    ]  # fmt: skip


@pytest.fixture
async def kcms(fake_kube, tmp_path, prom):
    """`kcms standalone` against the fake API, Prometheus for custom, external and resource metrics."""
    exporter_objects(fake_kube, prom.exporter)
    fake_kube.tokens[READER] = {"username": "reader", "groups": ["readers"]}
    argv = ["standalone", "--kubeconfig", str(fake_kube.kubeconfig), "--metric-resolution", "10s"]
    argv += [*_bridge_flags(tmp_path, prom), "--resource-metrics-source", "prometheus"]
    async with _serving(tmp_path, *argv) as served:
        yield served


async def test_kcms_server_serves_prometheus_beside_its_push_store(fake_kube, tmp_path, prom):
    """`kcms server --active-standby` (its own store fed by pushes) with the bridge, as a process."""
    exporter_objects(fake_kube, prom.exporter)
    fake_kube.tokens[READER] = {"username": "reader", "groups": ["readers"]}
    argv = ["server", "--active-standby", "--leader-elect=false", "--kubeconfig", str(fake_kube.kubeconfig)]
    async with _serving(tmp_path, *argv, *_bridge_flags(tmp_path, prom)) as (kubeconfig, _):
        raw = get_raw(kubeconfig)
        body = await asyncio.to_thread(
            raw, f"{EXT}/namespaces/team-a/jobs_pending?labelSelector=queue%3Demails"
        )
        expected = promql(prom, 'sum(jobs_pending{namespace="team-a",queue="emails"}) by (queue)')
        assert [i["metricLabels"] for i in body["items"]] == [{"queue": "emails"}]
        assert close(body["items"][0]["value"], next(iter(expected.values())), rel=0)
        body = await asyncio.to_thread(
            raw, f"{V2}/namespaces/default/deployments.apps/worker/messages_waiting"
        )
        assert close(body["items"][0]["value"], prom.exporter.deployment_queue("default", "worker"), rel=0)
        doc = await asyncio.to_thread(raw, "/debug/metric-sources")
        assert doc["order"] == ["store", "prometheus"]
        assert any(e["metric"] == "messages_waiting" and e["source"] == "prometheus" for e in doc["custom"])


def _by_name(body: dict) -> dict[str, str]:
    return {i["describedObject"]["name"]: i["value"] for i in body["items"]}


async def test_hpa_paths_through_kcms_standalone_with_kubectl(kcms, prom):
    assert KUBECTL is not None, "kubectl is needed (tests/system-deps.sh)"
    kubeconfig, _ = kcms
    raw = get_raw(kubeconfig)

    # Pods metric, as the HPA asks for it (v1beta2 and v1beta1)
    for base in (V2, V1):
        body = await asyncio.to_thread(
            raw, f"{base}/namespaces/team-a/pods/*/requests_per_second?labelSelector=app%3Dworker"
        )
        expected = promql(
            prom,
            f'sum(rate(http_requests_total{{namespace="team-a",pod=~"worker-0|worker-1|worker-2"}}{RATE})) by (pod)',
        )
        served = _by_name(body)
        assert sorted(served) == ["worker-0", "worker-1", "worker-2"]
        for labels, value in expected.items():
            assert close(served[dict(labels)["pod"]], value), (base, labels, served, value)

    # Object metric on deployments.apps/<name>
    body = await asyncio.to_thread(
        raw, f"{V1}/namespaces/team-a/deployments.apps/web/http_requests_in_flight"
    )
    (item,) = body["items"]
    assert item["describedObject"]["kind"] == "Deployment" and item["metricName"] == "http_requests_in_flight"
    expected = promql(
        prom, 'sum(http_requests_in_flight{namespace="team-a",deployment="web"}) by (deployment)'
    )
    assert close(item["value"], next(iter(expected.values())), rel=0)

    # External metric with a labelSelector
    body = await asyncio.to_thread(
        raw, f"{EXT}/namespaces/default/queue_depth?labelSelector=queue%3Dinvoices"
    )
    assert [(i["metricLabels"], i["value"]) for i in body["items"]] == [({"queue": "invoices"}, "200")]
    assert close(
        "200", next(iter(promql(prom, 'sum(queue_depth{queue="invoices"}) by (queue)').values())), rel=0
    )

    # which source serves what
    doc = await asyncio.to_thread(raw, "/debug/metric-sources")
    assert {e["metric"]: e["source"] for e in doc["external"]} == {
        "jobs_pending": "prometheus",
        "queue_depth": "prometheus",
    }


async def test_hpa_paths_with_the_official_python_client(kcms, prom):
    import kubernetes

    kubeconfig, _ = kcms

    def read() -> tuple[dict, dict]:
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        with kubernetes.client.ApiClient(cfg) as client:

            def call(path: str, path_params: dict, query: list) -> dict:
                method, url, headers, body, post = client.param_serialize(
                    "GET", path, path_params=path_params, query_params=query,
                    header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
                )  # fmt: skip
                response = client.call_api(method, url, headers, body, post)
                response.read()
                return json.loads(response.data)

            pods = call(
                "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/{name}/{metric}",
                {"namespace": "default", "name": "*", "metric": "requests_per_second"},
                [("labelSelector", "app=web"), ("metricLabelSelector", "method=GET")],
            )
            external = call(
                "/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}",
                {"namespace": "team-a", "metric": "jobs_pending"},
                [("labelSelector", "queue=emails")],
            )
            return pods, external

    pods, external = await asyncio.to_thread(read)
    expected = promql(
        prom,
        f'sum(rate(http_requests_total{{namespace="default",pod=~"web-0|web-1|web-2",method="GET"}}{RATE})) by (pod)',
    )
    served = {i["describedObject"]["name"]: i["value"] for i in pods["items"]}
    assert sorted(served) == ["web-0", "web-1", "web-2"]
    for labels, value in expected.items():
        assert close(served[dict(labels)["pod"]], value)
    assert pods["items"][0]["metric"]["selector"] == {"matchLabels": {"method": "GET"}}
    (item,) = external["items"]
    assert item["metricLabels"] == {"queue": "emails"}
    expected = promql(prom, 'sum(jobs_pending{namespace="team-a",queue="emails"}) by (queue)')
    assert close(item["value"], next(iter(expected.values())), rel=0)


async def test_resource_metrics_from_resource_rules(kcms, prom):
    """metrics.k8s.io from containerQuery/nodeQuery: the numbers `kubectl top` shows."""
    kubeconfig, _ = kcms
    raw = get_raw(kubeconfig)
    nodes = await asyncio.to_thread(raw, f"{RES}/nodes")
    cpu = promql(
        prom, f'sum(rate(container_cpu_usage_seconds_total{{node=~"node-1|node-2",id="/"}}{RATE})) by (node)'
    )
    mem = promql(prom, 'sum(container_memory_working_set_bytes{node=~"node-1|node-2",id="/"}) by (node)')
    served = {i["metadata"]["name"]: i for i in nodes["items"]}
    assert sorted(served) == ["node-1", "node-2"]
    for labels, value in cpu.items():
        node = dict(labels)["node"]
        usage = served[node]["usage"]
        # the feed's reading is up to one period old: compare with the exporter's known rates too
        assert abs(float(parse_quantity(usage["cpu"])) - value) <= 0.05 * value + 0.002, (node, usage, value)
        assert abs(float(parse_quantity(usage["cpu"])) - prom.exporter.node_cpu_rate(node)) <= 0.05 * value
        assert float(parse_quantity(usage["memory"])) == mem[(("node", node),)]
        assert served[node]["window"] == "5s"
    pod = await asyncio.to_thread(raw, f"{RES}/namespaces/team-a/pods/web-1")
    containers = {c["name"]: c["usage"] for c in pod["containers"]}
    assert sorted(containers) == ["app", "sidecar"]
    expected_mem = promql(
        prom,
        'sum(container_memory_working_set_bytes{namespace="team-a",pod="web-1",container!=""}) by (pod,container)',
    )
    exporter_pod = next(p for p in prom.exporter.pods if (p.namespace, p.name) == ("team-a", "web-1"))
    for labels, value in expected_mem.items():
        name = dict(labels)["container"]
        assert float(parse_quantity(containers[name]["memory"])) == value
        rate = prom.exporter.cpu_rate(exporter_pod, name)
        assert abs(float(parse_quantity(containers[name]["cpu"])) - rate) <= 0.05 * rate, (
            name,
            containers[name],
        )
    listed = await asyncio.to_thread(raw, f"{RES}/pods")
    assert len(listed["items"]) == len(prom.exporter.pods)


def _start(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kcms", "standalone", "--inventory-file", str(_inventory(tmp_path)), *argv],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": []}))
    return path


@pytest.mark.parametrize(
    ("config", "flags", "message"),
    [
        (
            ADAPTER_CONFIG.replace('matches: "^queue_(.*)_ready$"', 'matches: "^queue_(.*_ready$"'),
            (),
            "argument --config: rules[2].name.matches",
        ),
        (ADAPTER_CONFIG.replace("seriesFilters:", "seriesFilterz:"), (), "argument --config: rules[0]"),
        (
            ADAPTER_CONFIG.replace("<<.GroupBy>>)'\n# template", "<<.GroupBy>)'\n# template"),
            (),
            "rules[0].metricsQuery",
        ),
        ("rules: [", (), "argument --config: "),
        (None, (), "argument --config: "),  # no such file
        (ADAPTER_CONFIG, ("--prometheus-url", "ftp://x"), "argument --prometheus-url: must be an http"),
        (
            ADAPTER_CONFIG,
            ("--prometheus-header", "X-Scope-OrgID"),
            "argument --prometheus-header: expected NAME=VALUE",
        ),
        (
            ADAPTER_CONFIG,
            ("--prometheus-query-timeout", "0s"),
            "argument --prometheus-query-timeout: must be positive",
        ),
        (
            ADAPTER_CONFIG,
            ("--metrics-relist-interval", "100ms"),
            "argument --metrics-relist-interval: must be at least 1s",
        ),
        (ADAPTER_CONFIG, ("--prometheus-client-cert", "/etc/hostname"), "argument --prometheus-client-cert"),
        (ADAPTER_CONFIG, ("--metric-sources", "store,store"), "argument --metric-sources"),
        (
            ADAPTER_CONFIG[: ADAPTER_CONFIG.index("resourceRules:")],
            ("--resource-metrics-source", "prometheus"),
            "argument --resource-metrics-source: prometheus needs resourceRules",
        ),
    ],
)
def test_bad_flags_and_configs_stop_start_up_naming_them(tmp_path, config, flags, message):
    path = tmp_path / "missing.yaml"
    if config is not None:
        path = Path(write_config(tmp_path, config))
    out = _start(tmp_path, "--prometheus-url", "http://127.0.0.1:9", "--config", str(path), *flags)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert message in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_prometheus_url_needs_a_config_and_the_resource_source_a_url(tmp_path):
    out = _start(tmp_path, "--prometheus-url", "http://127.0.0.1:9")
    assert out.returncode == 2 and "argument --prometheus-url: give --config" in out.stderr
    out = _start(tmp_path, "--resource-metrics-source", "prometheus")
    assert (
        out.returncode == 2
        and "argument --resource-metrics-source: prometheus needs --prometheus-url" in out.stderr
    )
