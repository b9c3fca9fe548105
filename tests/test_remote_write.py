"""Prometheus remote write in (kcms/sources/remote_write.py, kcms/apis/remote_write.py).

The decoder and the binding of series to objects on their own; then writes over real HTTPS to an
in-process aggregated API server (delegated TokenReview and SubjectAccessReview through the fake
Kubernetes API, RBAC from tests/_remote_write_helpers.py) read back through the custom and external
metrics APIs with kubectl; and a REAL Prometheus (/usr/bin/prometheus) scraping the simulated
exporter (kcms/sim/prometheus.py) with ``remote_write`` to a ``kcms server`` process over TLS with
a bearer token file, ending in values served by the custom-metrics API equal to what Prometheus
itself answers. The hostile side is tests/test_security_remote_write.py.
"""

from __future__ import annotations

import asyncio
import base64
import calendar
import json
import math
import signal
import ssl
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from _kubectl import get_raw
from _remote_write_helpers import WRITER, clean_log_fixture, counter, setup_fake, stack_fixture  # noqa: F401 - fixtures clean_log, stack
from _stores import free_port

from kcms import limits
from kcms.apis.remote_write import REMOTE_WRITE_PATH, RemoteWriteAPI, SeriesBinder
from kcms.model import ObjectRef
from kcms.quantity import parse_quantity
from kcms.sim.prometheus import RealPrometheus, SimExporter, ThreadedExporter
from kcms.sources import remote_write as rw
from kcms.store.series import SeriesStore

STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]


def key(*pairs: tuple[str, str]) -> tuple[bytes, ...]:
    """The label key of a series, as the decoder yields it."""
    return rw.decode(rw.encode([(list(pairs), [(1, 1.0)])]))[0][0]


# ---- decoding ----------------------------------------------------------------------------------------


def test_decode_round_trip_and_what_is_counted_not_decoded() -> None:
    series = [
        ([("__name__", "a"), ("namespace", "default"), ("pod", "p")], [(1000, 1.5), (2000, -2.0)]),
        ([("__name__", "b"), ("le", "+Inf"), ("x", "ünïcode")], [(3000, 0.0)]),
    ]
    out = rw.decode(rw.encode(series))
    assert [(rw.parse_labels(k), s) for k, s, _ in out] == [(list(lb), s) for lb, s in series]
    # histograms are counted without being decoded; exemplars and metadata (field 3) are skipped
    req = rw.WriteRequest()
    ts = req.timeseries.add()
    ts.histograms.append(b"\x08\x01")
    ts.histograms.append(b"\x08\x02")
    ts.exemplars.append(b"\x12\x00")
    raw = req.SerializeToString() + b"\x1a\x04\x08\x01\x12\x00"  # + one MetricMetadata (field 3)
    import cramjam

    [(labels, samples, histograms)] = rw.decode(bytes(cramjam.snappy.compress_raw(raw)))
    assert (labels, samples, histograms) == ((), [], 2)


def test_snappy_length_header_is_read_before_decompressing() -> None:
    assert rw.snappy_length(b"\x00") == 0
    assert rw.snappy_length(b"\xe4\x00") == 0x64
    assert rw.snappy_length(b"\x80\x80\x04") == 1 << 16
    for bad in (b"", b"\x80", b"\xff\xff\xff\xff\xff\x01", b"\xff\xff\xff\xff\x7f"):
        with pytest.raises(rw.Malformed):
            rw.snappy_length(bad)
    lim = rw.WriteLimits(max_decompressed_bytes=1000)
    with pytest.raises(rw.TooLarge) as e:
        rw.decompress(b"\xe9\x07" + b"\x00" * 100, lim)  # declares 1001
    assert e.value.reason == "decompressed_too_large" and e.value.code == 413
    with pytest.raises(rw.Malformed) as m:  # declares 900 bytes, 10 bytes can hold at most 213
        rw.decompress(b"\x84\x07" + b"\x00" * 10, lim)
    assert m.value.reason == "malformed_snappy" and "cannot hold" in str(m.value)


# ---- binding -----------------------------------------------------------------------------------------


def test_default_binding_follows_the_namespace_label_and_resource_template() -> None:
    b = SeriesBinder()
    got = b.bind(key(("__name__", "m"), ("namespace", "default"), ("pod", "web-0"), ("job", "sim")))
    assert got.obj == ObjectRef("pods", "default", "web-0") and got.labels == (("job", "sim"),)
    assert got.target == ("m", "pods", "default", "web-0")
    # a pod wins over the other objects it names; the others stay labels
    got = b.bind(
        key(("__name__", "m"), ("deployment", "web"), ("namespace", "n"), ("node", "x"), ("pod", "p"))
    )
    assert got.obj == ObjectRef("pods", "n", "p") and got.labels == (("deployment", "web"), ("node", "x"))
    got = b.bind(key(("__name__", "m"), ("deployment", "web"), ("namespace", "n"), ("node", "x")))
    assert got.obj == ObjectRef("deployments.apps", "n", "web")
    # cluster-scoped objects lose the namespace
    got = b.bind(key(("__name__", "m"), ("namespace", "n"), ("node", "node-1")))
    assert got.obj == ObjectRef("nodes", "", "node-1") and got.labels == ()
    # no object: an external metric in its namespace; `job` is Prometheus's scrape job, not jobs.batch
    got = b.bind(key(("__name__", "m"), ("job", "j"), ("namespace", "n"), ("queue", "q")))
    assert got.obj == ObjectRef("", "n", "") and got.labels == (("job", "j"), ("queue", "q"))
    # an empty label value is no label
    got = b.bind(key(("__name__", "m"), ("namespace", "n"), ("pod", "")))
    assert got.obj == ObjectRef("", "n", "")
    for pairs, reason in [
        ((("__name__", "m"), ("queue", "q")), "no_object"),
        ((("namespace", "n"),), "invalid_metric_name"),
        ((("__name__", "1m"), ("namespace", "n")), "invalid_metric_name"),
        ((("__name__", "m" * 300), ("namespace", "n")), "metric_name_too_long"),
        ((("__name__", "m"), ("namespace", "N_S")), "invalid_object"),
        ((("__name__", "m"), ("pod", "p")), "invalid_object"),  # a pod needs its namespace
        ((("__name__", "m"), ("namespace", "n"), ("pod", "Bad Name")), "invalid_object"),
        ((("__name__", "m"), ("namespace", "n"), ("bad-label", "x")), "invalid_label_name"),
        ((("__name__", "m"), ("namespace", "n"), ("a", "x"), ("a", "y")), "invalid_label_name"),
        ((("__name__", "m"), ("namespace", "n"), ("v", "x" * 2000)), "label_value_too_long"),
        ((("__name__", "m"), ("namespace", "n"), *((f"l{i}", "v") for i in range(40))), "too_many_labels"),
    ]:
        got = b.bind(key(*pairs))
        assert isinstance(got, tuple) and got[0] == reason, (pairs, got)


def test_binding_cache_is_bounded() -> None:
    b = SeriesBinder(max_cached=100)
    for i in range(1000):
        b.bind(key(("__name__", "m"), ("namespace", "n"), ("pod", f"p{i}")))
        assert len(b._cache) <= 100
    got = b.bind(key(("__name__", "m"), ("namespace", "n"), ("pod", "p999")))
    assert got.obj.name == "p999"


# ---- checking and storing -------------------------------------------------------------------------------


def test_ingest_refuses_per_sample_and_keeps_the_rest() -> None:
    store = SeriesStore(retention=600)
    api = RemoteWriteAPI(store, rw.WriteLimits(max_samples_per_series=4))
    now = time.time()
    ms = int(now * 1000)
    future = int((limits.future_limit(now) + 5) * 1000)
    series = rw.decode(
        rw.encode(
            [
                (
                    [("__name__", "m"), ("namespace", "default"), ("pod", "a")],
                    [(ms - 2000, 1.0), (ms - 1500, math.nan), (ms - 1000, STALE_NAN), (ms - 500, 2.0)],
                ),
                (
                    [("__name__", "m"), ("namespace", "default"), ("pod", "b")],
                    [(ms, math.inf), (future, 3.0)],
                ),
                (
                    [("__name__", "m"), ("namespace", "default"), ("pod", "c")],
                    [(ms - 700_000, 4.0), (ms, 5.0)],
                ),
                (
                    [("__name__", "m"), ("namespace", "default"), ("pod", "d")],
                    [(ms - i, 1.0) for i in range(5)],
                ),
                ([("__name__", "m"), ("queue", "q")], [(ms, 6.0)]),
            ]
        )
    )
    accepted, rejected = api.ingest(series, now=now)
    assert accepted == 3
    assert rejected == {
        "non_finite_value": 2,  # NaN and +Inf; the staleness marker is skipped, not refused
        "future_timestamp": 1,
        "too_old": 1,
        "too_many_samples": 5,
        "no_object": 1,
    }
    latest = {r.obj.name: r.value for r in store.query("pods", "default", None, "m", now=now)}
    assert latest == {"a": 2.0, "c": 5.0}
    # the same request again: every point is a resend
    accepted, rejected = api.ingest(series, now=now)
    assert accepted == 0 and rejected["out_of_order"] == 3


# ---- over HTTPS, read back through the API ------------------------------------------------------------


def write_kubeconfig(path: Path, port: int, ca_file: str, token: str) -> Path:
    ca_data = base64.b64encode(Path(ca_file).read_bytes()).decode()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kcms", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                   "certificate-authority-data": ca_data}}],
        "users": [{"name": "hpa", "user": {"token": token}}],
        "contexts": [{"name": "kcms", "context": {"cluster": "kcms", "user": "hpa"}}],
        "current-context": "kcms",
    }  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def served(raw: Any, path: str) -> dict[str, float]:
    """``{object name (or a label value for external metrics): value}`` from a metrics API list."""
    doc = raw(path)
    out = {}
    for item in doc["items"]:
        name = (
            item["describedObject"]["name"]
            if "describedObject" in item
            else item["metricLabels"].get("queue", "")
        )
        out[name] = float(parse_quantity(item["value"]))
    return out


async def test_a_write_is_served_by_the_custom_and_external_metrics_apis(stack, clean_log, tmp_path) -> None:
    ms = int(time.time() * 1000)
    body = rw.encode(
        [
            (
                [("__name__", "in_flight"), ("namespace", "default"), ("pod", f"web-{i}")],
                [(ms - 1000, float(i + 1))],
            )
            for i in range(3)
        ]
        + [
            ([("__name__", "temperature"), ("node", "node-1")], [(ms - 1000, 41.0)]),
            (
                [("__name__", "jobs_pending"), ("namespace", "default"), ("queue", "emails")],
                [(ms - 1000, 7.0)],
            ),
        ]
    )
    before = counter("kcms_remote_write_samples_total", result="accepted")
    status, headers, text = await stack.post(body)
    assert status == 204 and text == b"" and "X-Kcms-Rejected" not in headers
    assert counter("kcms_remote_write_samples_total", result="accepted") == before + 5
    kubeconfig = write_kubeconfig(
        tmp_path / "hpa", stack.server.port, stack.server.serving_cert_file, "hpa-token"
    )
    raw = get_raw(kubeconfig)
    pods = await asyncio.to_thread(
        served, raw, "/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/*/in_flight"
    )
    assert pods == {"web-0": 1.0, "web-1": 2.0, "web-2": 3.0}
    nodes = await asyncio.to_thread(
        served, raw, "/apis/custom.metrics.k8s.io/v1beta2/nodes/node-1/temperature"
    )
    assert nodes == {"node-1": 41.0}
    ext = await asyncio.to_thread(
        served, raw, "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/jobs_pending"
    )
    assert ext == {"emails": 7.0}
    # every target was reviewed as a push of it: verb create, the read's attributes
    specs = [
        r["spec"]["resourceAttributes"] for r in stack.fake.access_reviews if r["spec"].get("user") == WRITER
    ]
    assert {"verb": "create", "group": "custom.metrics.k8s.io", "resource": "nodes", "subresource": "temperature",
            "name": "node-1"}.items() <= next(s for s in specs if s.get("resource") == "nodes").items()  # fmt: skip
    ext_spec = next(s for s in specs if s.get("group") == "external.metrics.k8s.io")
    assert ext_spec["resource"] == "jobs_pending" and ext_spec["namespace"] == "default"
    assert await stack.ready()


# ---- a real Prometheus writing to a `kcms server` process ------------------------------------------------


async def _spawn(tmp: Path, *argv: str) -> asyncio.subprocess.Process:
    log = open(tmp / "server.log", "wb")  # noqa: ASYNC230, SIM115 - the child writes to it
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kcms", *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
    )
    log.close()
    return proc


async def _until(predicate, limit: float, what: str) -> Any:
    deadline = time.monotonic() + limit
    while True:
        got = await predicate()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {limit}s"
        await asyncio.sleep(0.25)


async def test_real_prometheus_remote_write_ends_in_the_values_prometheus_has(
    ca, fake_kube, tmp_path
) -> None:
    exporter = SimExporter()
    setup_fake(fake_kube, [(p.namespace, p.name, p.node) for p in exporter.pods])
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.pem"
    cert_file.write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    key_file.write_bytes(cert.private_key_pem.bytes())
    ca_file.write_bytes(ca.cert_pem.bytes())
    token_file = tmp_path / "token"
    token_file.write_text("writer-token\n")
    port = free_port()
    proc = await _spawn(
        tmp_path,
        "server", "--active-standby", "--leader-elect=false", "--kubeconfig", str(fake_kube.kubeconfig),
        "--bind-address", "127.0.0.1", "--secure-port", str(port), f"--tls-cert-file={cert_file}",
        f"--tls-private-key-file={key_file}", "--authentication-skip-lookup",
    )  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(ca_file))
    url = f"https://127.0.0.1:{port}"
    raw = get_raw(write_kubeconfig(tmp_path / "hpa", port, str(ca_file), "hpa-token"))
    served_exporter = ThreadedExporter(exporter).start()
    prometheus = None
    try:
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                assert proc.returncode is None, (tmp_path / "server.log").read_text()[-3000:]
                try:
                    async with http.get(url + "/readyz", ssl=ctx) as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await _until(ready, 60, "kcms server ready")
            remote_write = {
                "url": url + REMOTE_WRITE_PATH,
                "tls_config": {"ca_file": str(ca_file)},
                "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                "queue_config": {"batch_send_deadline": "500ms", "min_backoff": "100ms", "max_backoff": "1s"},
                # Prometheus's own series name no object: dropped before sending (docs/remote-write.md)
                "write_relabel_configs": [
                    {"source_labels": ["__name__"], "regex": "up|scrape_.*", "action": "drop"}
                ],
            }
            prometheus = await asyncio.to_thread(
                RealPrometheus([served_exporter.target], scrape_interval=1.0,
                               extra_config={"remote_write": [remote_write]}).start
            )  # fmt: skip
            await prometheus.wait_scrapes(3, 90)

            def pods_in_flight() -> dict[str, float]:
                try:
                    return served(
                        raw,
                        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/*/http_requests_in_flight",
                    )
                except AssertionError:
                    return {}

            default_pods = [p for p in exporter.pods if p.namespace == "default"]

            async def all_pods() -> bool:
                got = await asyncio.to_thread(pods_in_flight)
                return len(got) == len(default_pods)

            await _until(all_pods, 90, "remote-written series served")
            # gauges: exactly what Prometheus has
            mine = await asyncio.to_thread(pods_in_flight)
            theirs = prometheus.api("query", query='http_requests_in_flight{namespace="default"}')["result"]
            assert mine == {r["metric"]["pod"]: float(r["value"][1]) for r in theirs}
            assert mine == {p.name: exporter.in_flight(p) for p in default_pods}
            # a counter: KCMS's latest point is a sample Prometheus has, at the same timestamp
            doc = await asyncio.to_thread(
                raw, "/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/web-0/http_requests_total"
            )
            [item] = doc["items"]
            at = calendar.timegm(time.strptime(item["timestamp"], "%Y-%m-%dT%H:%M:%SZ"))
            # the API shows whole seconds; ask Prometheus for the last sample at or before that second + 1
            theirs = prometheus.api(
                "query", query='http_requests_total{namespace="default",pod="web-0"}[5s]', time=str(at + 1)
            )["result"][0]["values"]
            # the API writes a quantity (a few significant digits: 1003.399 -> "1003400m")
            mine_total = float(parse_quantity(item["value"]))
            assert any(math.isclose(mine_total, float(v), rel_tol=1e-5) for _, v in theirs), (
                mine_total,
                theirs,
            )
            # a node and an external metric
            nodes = await asyncio.to_thread(
                served, raw, "/apis/custom.metrics.k8s.io/v1beta2/nodes/node-2/node_temperature_celsius"
            )
            assert nodes == {"node-2": exporter.node_temperature("node-2")}
            ext = await asyncio.to_thread(
                served, raw, "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/jobs_pending"
            )
            assert ext == {q: exporter.jobs_pending("default", q) for q in exporter.queues}
            # team-a is not the writer's: refused per series (counted forbidden), nothing served there
            doc = await asyncio.to_thread(
                raw, "/apis/external.metrics.k8s.io/v1beta1/namespaces/team-a/jobs_pending"
            )
            assert doc["items"] == []
            async with http.get(
                url + "/metrics", ssl=ctx, headers={"Authorization": "Bearer admin-token"}
            ) as r:
                text = await r.text()
            assert 'kcms_remote_write_rejected_total{reason="forbidden"}' in text
            assert 'kcms_remote_write_rejected_total{reason="no_object"}' in text  # queue_depth{queue}
            assert await ready()
    finally:
        if prometheus is not None:
            await asyncio.to_thread(prometheus.stop)
        served_exporter.stop()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def test_bad_remote_write_flags_stop_start_up_naming_the_flag() -> None:
    for argv, flag in (
        (["--remote-write-max-body-bytes", "0"], "--remote-write-max-body-bytes"),
        (["--remote-write-max-decompressed-bytes", "lots"], "--remote-write-max-decompressed-bytes"),
        (["--remote-write-max-samples", "-5"], "--remote-write-max-samples"),
    ):
        for command in (["server", "--active-standby"], ["standalone"]):
            result = subprocess.run(
                [sys.executable, "-m", "kcms", *command, *argv],
                capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            assert result.returncode == 2, result.stderr
            assert f"argument {flag}" in result.stderr and "Traceback" not in result.stderr


def test_adapter_config_the_first_rule_selecting_a_series_decides_its_binding(tmp_path, caplog) -> None:
    from kcms.apis.remote_write import config_mapper

    config = """
rules:
- seriesQuery: '{__name__=~"^container_.*",container!="POD",kubernetes_namespace!="",kubernetes_pod_name!=""}'
  seriesFilters: [{isNot: "^container_spec_.*"}]
  resources:
    overrides:
      kubernetes_namespace: {resource: namespace}
      kubernetes_pod_name: {resource: pod}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
- seriesQuery: 'sum(not_a_selector)'
  resources: {template: "<<.Resource>>"}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
- seriesQuery: '{__name__=~"^kube_.*"}'
  resources: {template: "kube_<<.Group>>_<<.Resource>>"}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
- seriesQuery: 'queue_depth{namespace!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""
    path = tmp_path / "adapter.yaml"
    path.write_text(config)
    b = SeriesBinder(config_mapper(str(path)))
    assert "rules[1].seriesQuery" in caplog.text  # not a selector: that rule binds nothing, said once
    # rule 0: overrides; `pod` is only a label under it
    got = b.bind(
        key(
            ("__name__", "container_cpu"),
            ("container", "app"),
            ("kubernetes_namespace", "default"),
            ("kubernetes_pod_name", "web-0"),
            ("pod", "p"),
        )
    )
    assert got.obj == ObjectRef("pods", "default", "web-0"), got
    assert got.labels == (("container", "app"), ("pod", "p"))
    # rule 0's matchers refuse container="POD" and its filter container_spec_*: no other rule selects them
    for pairs in (
        (
            ("__name__", "container_cpu"),
            ("container", "POD"),
            ("kubernetes_namespace", "d"),
            ("kubernetes_pod_name", "p"),
        ),
        (
            ("__name__", "container_spec_x"),
            ("container", "a"),
            ("kubernetes_namespace", "d"),
            ("kubernetes_pod_name", "p"),
        ),
        (("__name__", "other"), ("namespace", "default"), ("pod", "web-0")),
    ):
        assert b.bind(key(*pairs))[0] == "no_rule", pairs
    # rule 2: a template
    got = b.bind(key(("__name__", "kube_x"), ("kube_apps_deployment", "web"), ("kube__namespace", "team-a")))
    assert got.obj == ObjectRef("deployments.apps", "team-a", "web"), got
    # rule 3: a name and a matcher; no object label: an external metric in its namespace
    got = b.bind(key(("__name__", "queue_depth"), ("namespace", "jobs"), ("queue", "q")))
    assert got.obj == ObjectRef("", "jobs", "") and got.labels == (("queue", "q"),), got
    assert b.bind(key(("__name__", "queue_depth"), ("queue", "q")))[0] == "no_rule"  # namespace!="" fails


def test_series_selectors_parse_as_promql_does() -> None:
    from kcms.apis.remote_write_binding import _matches, parse_selector

    ms = parse_selector("""http_requests_total{job=`api`, code=~"5..", path!~'/health.*',}""")
    assert [(m[0], m[1]) for m in ms] == [("__name__", "="), ("job", "="), ("code", "=~"), ("path", "!~")]
    assert _matches(ms[2], "503") and not _matches(ms[2], "5030")  # anchored, as PromQL
    assert not _matches(ms[3], "/healthz") and _matches(ms[3], "/api")
    assert parse_selector('{a="x\\"y"}') == [("a", "=", 'x"y')]
    for bad in ("", "sum(x)", "{a}", '{a="b" c="d"}', "{a=b}", 'x{a=~"(?<=y)"}', "x y"):
        with pytest.raises(ValueError):
            parse_selector(bad)


async def test_kcms_standalone_serves_remote_write_with_the_push_rules(
    ca, fake_kube, tmp_path, clean_log
) -> None:
    import _rbac as rbac
    from _pipeline import start_env, stop_env, wait_ready
    from _remote_write_helpers import RBAC, TOKENS

    from kcms.sim import SimulatedCluster

    sim = SimulatedCluster(
        nodes=2, pods_per_node=2, containers_per_pod=1, seed=5, ca=ca, one_port_per_node=True
    )
    await sim.start()
    env = await start_env(ca, fake_kube, tmp_path, sim)
    pods = sorted((p.namespace, p.name) for n in sim.nodes for p in n.pods)
    (ns, pod), (other_ns, other_pod) = pods[0], pods[-1]
    assert ns != other_ns
    # the writer may write the first pod's namespace only
    grant = {
        "kind": "RoleBinding",
        "metadata": {"name": "rw", "namespace": ns},
        "roleRef": {"kind": "ClusterRole", "name": "kcms-remote-writer"},
        "subjects": [{"kind": "ServiceAccount", "namespace": "monitoring", "name": "prometheus"}],
    }
    fake_kube.tokens.update(TOKENS)
    fake_kube.authorize = rbac.authorizer([*RBAC, grant])
    try:
        await wait_ready(env)
        now = int(time.time() * 1000)
        body = rw.encode(
            [
                ([("__name__", "queue_depth"), ("namespace", ns), ("pod", pod)], [(now - 1000, 9.0)]),
                (
                    [("__name__", "queue_depth"), ("namespace", other_ns), ("pod", other_pod)],
                    [(now - 1000, 1.0)],
                ),
            ]
        )
        headers = {
            "Authorization": "Bearer writer-token",
            "Content-Type": "application/x-protobuf",
            "Content-Encoding": "snappy",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
        }
        async with aiohttp.ClientSession() as s:
            async with s.post(env.url + REMOTE_WRITE_PATH, data=body, headers=headers, ssl=env.ssl) as r:
                assert r.status == 204 and r.headers["X-Kcms-Rejected"] == "forbidden=1", await r.text()
        assert [x.value for x in env.pipeline.series.query("pods", ns, [pod], "queue_depth")] == [9.0]
        assert env.pipeline.series.query("pods", other_ns, [other_pod], "queue_depth") == []
        status, _ = await env.get("/readyz", token=None, accept=None)
        assert status == 200
    finally:
        await stop_env(env)
        await sim.stop()


def test_the_documented_otel_config_binds_its_labels_to_pods() -> None:
    from kcms.apis.prometheus.config import load_adapter_config
    from kcms.apis.remote_write import config_mapper

    doc = (Path(__file__).resolve().parent.parent / "docs" / "remote-write.md").read_text()
    block = doc.split("# --config for KCMS\n", 1)[1].split("```", 1)[0]
    b = SeriesBinder(config_mapper(load_adapter_config(block)))
    got = b.bind(
        key(("__name__", "m"), ("k8s_namespace_name", "shop"), ("k8s_pod_name", "web-1"), ("x", "y"))
    )
    assert got.obj == ObjectRef("pods", "shop", "web-1") and got.labels == (("x", "y"),)
