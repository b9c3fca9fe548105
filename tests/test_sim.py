"""The kubelet simulator: real HTTPS to simulated kubelets on loopback, decoded like a scraper would.

The `kcms simulate` command line is tested in tests/test_sim_cli.py.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import time
from decimal import Decimal
from pathlib import Path

import aiohttp
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kcms.model import DecodeError
from kcms.sim import SimulatedCluster
from kcms.sim.workload import go_float, go_int, go_ns, node_addresses

try:  # the real decoder, if present; otherwise a plain parse with prometheus_client and orjson
    from kcms.sources.kubelet_decode import decode_resource_metrics, decode_summary
except (ImportError, SyntaxError):  # pragma: no cover - another part of the project, in progress
    decode_resource_metrics = decode_summary = None
if os.environ.get("KCMS_SIM_TEST_PLAIN_PARSE"):  # exercise the fallback parse below
    decode_resource_metrics = decode_summary = None

Key = tuple[str, str, str]
Reading = tuple[tuple[float, float, int], dict[Key, tuple[float, float, int, float]]]


def _base() -> str:
    """A loopback /24 of our own, so parallel test runs do not collide on 10250."""
    return f"127.{random.randrange(100, 250)}.{random.randrange(1, 250)}.1"


def _from_batch(node: str, b) -> Reading:
    assert b.node == node and b.node_point is not None and not b.rejected, b.rejected
    n = b.node_point
    pts = {(ns, pod, c): p for (ns, pod), cs in b.pods.items() for c, p in cs.items()}
    out = {k: (p.timestamp, p.cpu_ns / 1e9, p.memory, p.start_time) for k, p in pts.items()}
    return (n.timestamp, n.cpu_ns / 1e9, n.memory), out


def decode_text(node: str, body: bytes) -> Reading:
    """((ts, node_cpu_s, node_mem), {(ns, pod, container): (ts, cpu_s, mem, start)}) from /metrics/resource."""
    if decode_resource_metrics is not None:
        return _from_batch(node, decode_resource_metrics(node, body))
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    vals = {
        name: {(s.labels["namespace"], s.labels["pod"], s.labels["container"]): s for s in fams[name].samples}
        for name in ("container_cpu_usage_seconds", "container_memory_working_set_bytes")
    }
    starts = {
        (s.labels["namespace"], s.labels["pod"], s.labels["container"]): s.value
        for s in fams["container_start_time_seconds"].samples
    }
    out = {}
    for k, cpu in vals["container_cpu_usage_seconds"].items():
        mem = vals["container_memory_working_set_bytes"][k]
        out[k] = (float(cpu.timestamp), cpu.value, int(mem.value), starts[k])
    ncpu = fams["node_cpu_usage_seconds"].samples[0]
    nmem = fams["node_memory_working_set_bytes"].samples[0]
    return (float(ncpu.timestamp), ncpu.value, int(nmem.value)), out


def decode_json(node: str, body: bytes) -> Reading:
    """Same as :func:`decode_text`, for /stats/summary."""
    if decode_summary is not None:
        try:
            return _from_batch(node, decode_summary(node, body))
        except ImportError:  # the decoder is there but a module it needs is not (yet)
            pass
    from datetime import datetime

    def ts(s: str) -> float:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()

    doc = orjson.loads(body)
    assert doc["node"]["nodeName"] == node
    nd = doc["node"]
    out = {}
    for p in doc["pods"]:
        for c in p["containers"]:
            key = (p["podRef"]["namespace"], p["podRef"]["name"], c["name"])
            out[key] = (
                ts(c["cpu"]["time"]),
                c["cpu"]["usageCoreNanoSeconds"] / 1e9,
                c["memory"]["workingSetBytes"],
                ts(c["startTime"]),
            )
    return (
        ts(nd["cpu"]["time"]),
        nd["cpu"]["usageCoreNanoSeconds"] / 1e9,
        nd["memory"]["workingSetBytes"],
    ), out


def session(cluster: SimulatedCluster, token: str | None = None) -> aiohttp.ClientSession:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=cluster.client_ssl_context()), headers=headers
    )


async def get(s: aiohttp.ClientSession, url: str, limit: float = 10.0) -> tuple[int, bytes]:
    async with s.get(url, timeout=aiohttp.ClientTimeout(total=limit)) as r:
        return r.status, await r.read()


def served_keys(cluster: SimulatedCluster, node: str) -> set[Key]:
    return {(p.namespace, p.name, c.name) for p in cluster.node(node).pods for c in p.containers}


# ----- formatting --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (1.0, "1"),
        (357.35491, "357.35491"),
        (123456.0, "123456"),
        (1e6, "1e+06"),
        (16547840.0, "1.654784e+07"),
        (1696346400.123, "1.696346400123e+09"),
        (0.0001, "0.0001"),
        (1.5e-05, "1.5e-05"),
        (-2.5, "-2.5"),
        (math.inf, "+Inf"),
    ],
)
def test_go_float_matches_strconv_g(value: float, text: str) -> None:
    assert go_float(value) == text
    if not math.isinf(value) and value >= 0 and value == int(value):
        assert go_int(int(value)) == text


@given(st.integers(min_value=0, max_value=10**16))
def test_go_ns_is_exact_and_agrees_with_go_float(ns: int) -> None:
    text = go_ns(ns)
    assert Decimal(text) == Decimal(ns).scaleb(-9)  # exact: a decoder gets the integer back
    if ns < 10**15:  # up to 15 significant digits the exact decimal is also the shortest
        assert text == go_float(ns / 1e9)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_go_float_round_trips(value: float) -> None:
    assert float(go_float(value)) == value


def test_addresses_skip_network_and_broadcast_octets() -> None:
    addrs = node_addresses("127.1.0.253", 4)
    assert addrs == ["127.1.0.253", "127.1.0.254", "127.1.1.1", "127.1.1.2"]
    with pytest.raises(ValueError):
        node_addresses("127.255.255.250", 10)


def test_workload_is_deterministic_per_seed() -> None:
    a = SimulatedCluster(nodes=2, pods_per_node=4, seed=7)
    b = SimulatedCluster(nodes=2, pods_per_node=4, seed=7)
    c = SimulatedCluster(nodes=2, pods_per_node=4, seed=8)

    def shape(x: SimulatedCluster) -> list:
        return [
            (p.namespace, p.name, [(k.name, k.rate) for k in p.containers]) for n in x.nodes for p in n.pods
        ]

    assert shape(a) == shape(b)
    assert shape(a) != shape(c)
    for n in a.nodes:
        assert len(n.pods) == 4
        for p in n.pods:
            assert 1 <= len(p.containers) <= 3
            for k in p.containers:
                assert 0.001 <= k.rate <= 0.5
                assert a.memory_at(p.namespace, p.name, k.name) % 4096 == 0


# ----- serving -----------------------------------------------------------------------------------


async def test_distinct_addresses_serve_their_own_node_and_true_rates(ca) -> None:
    cluster = SimulatedCluster(
        nodes=3, pods_per_node=5, containers_per_pod=(1, 3), seed=1, ca=ca, address_base=_base()
    )
    async with cluster, session(cluster) as s:
        hosts = {cluster.node_url(n) for n in cluster.node_names()}
        assert len(hosts) == 3 and all(u.startswith("https://127.") and u.endswith(":10250") for u in hosts)
        first = {}
        for n in cluster.node_names():
            status, body = await get(s, cluster.node_url(n) + "/metrics/resource")
            assert status == 200
            assert b"# TYPE container_cpu_usage_seconds_total counter" in body
            assert b"resource_scrape_error 0" in body
            first[n] = decode_text(n, body)
            assert set(first[n][1]) == served_keys(cluster, n)
        await asyncio.sleep(0.3)
        for n in cluster.node_names():
            status, body = await get(s, cluster.node_url(n) + "/metrics/resource")
            (t1, c1, _), cs1 = first[n]
            (t2, c2, mem), cs2 = decode_text(n, body)
            assert t2 > t1
            assert (c2 - c1) / (t2 - t1) == pytest.approx(cluster.true_node_rate(n), rel=0.01)
            assert mem == cluster.node_memory_at(n, t2)
            for key, (ts2, cpu2, mem2, start2) in cs2.items():
                ts1, cpu1, _, start1 = cs1[key]
                assert start1 == start2 == pytest.approx(cluster.container_start_time(*key), abs=1e-6)
                assert (cpu2 - cpu1) / (ts2 - ts1) == pytest.approx(
                    cluster.true_container_rate(*key), rel=0.01
                )
                assert mem2 == cluster.memory_at(*key, t=ts2) and mem2 % 4096 == 0
            status, body = await get(s, cluster.node_url(n) + "/healthz")
            assert (status, body) == (200, b"ok")


async def test_prometheus_client_parses_the_body_too(ca) -> None:
    cluster = SimulatedCluster(nodes=1, pods_per_node=3, seed=3, ca=ca, one_port_per_node=True)
    async with cluster, session(cluster) as s:
        n = cluster.node_names()[0]
        _, body = await get(s, cluster.node_url(n) + "/metrics/resource")
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert set(fams) == {
        "container_cpu_usage_seconds",
        "container_memory_working_set_bytes",
        "container_start_time_seconds",
        "node_cpu_usage_seconds",
        "node_memory_working_set_bytes",
        "pod_cpu_usage_seconds",
        "pod_memory_working_set_bytes",
        "resource_scrape_error",
    }
    for f in fams.values():
        for smp in f.samples:
            if f.name != "resource_scrape_error":
                assert smp.timestamp is not None
    pods = {
        (s.labels["namespace"], s.labels["pod"]): s.value
        for s in fams["pod_memory_working_set_bytes"].samples
    }
    for (ns, pod), v in pods.items():
        assert v == cluster.pod_memory_at(
            ns, pod, float(fams["pod_memory_working_set_bytes"].samples[0].timestamp)
        )


async def test_one_port_per_node_and_summary_api(ca) -> None:
    cluster = SimulatedCluster(
        nodes=3, pods_per_node=4, containers_per_pod=2, seed=2, ca=ca, one_port_per_node=True
    )
    async with cluster, session(cluster) as s:
        urls = [cluster.node_url(n) for n in cluster.node_names()]
        assert len({u.rsplit(":", 1)[1] for u in urls}) == 3
        assert all(u.startswith("https://127.0.0.1:") for u in urls)
        first = {}
        for n in cluster.node_names():
            status, body = await get(s, cluster.node_url(n) + "/stats/summary")
            assert status == 200
            doc = orjson.loads(body)
            assert doc["node"]["nodeName"] == n
            for field in ("time", "usageNanoCores", "usageCoreNanoSeconds"):
                assert field in doc["node"]["cpu"]
            for pod in doc["pods"]:
                assert set(pod["podRef"]) == {"name", "namespace", "uid"}
                assert {"cpu", "memory", "startTime", "containers"} <= set(pod)
                assert all({"name", "startTime", "cpu", "memory"} <= set(c) for c in pod["containers"])
            first[n] = decode_json(n, body)
            assert set(first[n][1]) == served_keys(cluster, n)
        await asyncio.sleep(1.05 - time.time() % 1)  # summary times are whole seconds
        for n in cluster.node_names():
            _, body = await get(s, cluster.node_url(n) + "/stats/summary")
            (t1, c1, _), cs1 = first[n]
            (t2, c2, _), cs2 = decode_json(n, body)
            assert t2 >= t1 + 1
            assert (c2 - c1) / (t2 - t1) == pytest.approx(cluster.true_node_rate(n), rel=0.01)
            for key, (ts2, cpu2, _, _) in cs2.items():
                ts1, cpu1, _, _ = cs1[key]
                assert (cpu2 - cpu1) / (ts2 - ts1) == pytest.approx(
                    cluster.true_container_rate(*key), rel=0.01
                )


async def test_self_signed_ca_when_none_is_given() -> None:
    cluster = SimulatedCluster(nodes=2, pods_per_node=1, seed=4, address_base=_base())
    async with cluster:
        assert cluster.ca_pem.startswith(b"-----BEGIN CERTIFICATE-----")
        async with session(cluster) as s:
            for n in cluster.node_names():
                assert (await get(s, cluster.node_url(n) + "/healthz")) == (200, b"ok")
        # A client that does not trust the CA is refused.
        async with aiohttp.ClientSession() as plain:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await get(plain, cluster.node_url(cluster.node_names()[0]) + "/healthz")


async def test_forced_and_scheduled_restarts_reset_counter_and_start_time(ca) -> None:
    cluster = SimulatedCluster(
        nodes=1, pods_per_node=3, containers_per_pod=1, seed=5, ca=ca, one_port_per_node=True
    )
    async with cluster, session(cluster) as s:
        n = cluster.node_names()[0]
        url = cluster.node_url(n) + "/metrics/resource"
        (_, node_cpu1, _), before = decode_text(n, (await get(s, url))[1])
        key = sorted(before)[0]
        assert before[key][1] > 60 * cluster.true_container_rate(*key)  # running for a while
        when = cluster.force_restart(*key)
        await asyncio.sleep(0.05)  # a counter of exactly 0 means "unknown" to metrics-server semantics
        (_, node_cpu2, _), after = decode_text(n, (await get(s, url))[1])
        ts, cpu, _, start = after[key]
        assert start == pytest.approx(when, abs=1e-6) and start > before[key][3]
        assert cpu <= cluster.true_container_rate(*key) * (ts - when) + 1e-9
        assert cpu < before[key][1]
        assert node_cpu2 >= node_cpu1  # the node counter does not reset

    sched = SimulatedCluster(
        nodes=1,
        pods_per_node=4,
        containers_per_pod=1,
        seed=6,
        ca=ca,
        one_port_per_node=True,
        restart_every=0.2,
    )
    async with sched, session(sched) as s:
        n = sched.node_names()[0]
        url = sched.node_url(n) + "/metrics/resource"
        _, first = decode_text(n, (await get(s, url))[1])
        await asyncio.sleep(1.5)
        _, second = decode_text(n, (await get(s, url))[1])
        restarted = [k for k in first if second[k][3] > first[k][3]]
        assert len(restarted) >= 3  # mean 0.2 s between restarts, 1.5 s apart: all but never
        for k in restarted:
            ts, cpu, _, start = second[k]
            assert start <= ts and cpu == pytest.approx(
                sched.true_container_rate(*k) * (ts - start), abs=1e-6
            )


async def test_bearer_token_is_required(ca) -> None:
    cluster = SimulatedCluster(nodes=2, pods_per_node=1, seed=1, ca=ca, address_base=_base(), token="s3cret")
    async with cluster:
        url = cluster.node_url(cluster.node_names()[1]) + "/metrics/resource"
        async with session(cluster) as s:
            assert (await get(s, url))[0] == 401
        async with session(cluster, token="wrong") as s:
            assert (await get(s, url))[0] == 401
        async with session(cluster, token="s3cret") as s:
            status, body = await get(s, url)
            assert status == 200 and b"node_cpu_usage_seconds_total" in body


async def test_failure_modes(ca) -> None:
    cluster = SimulatedCluster(nodes=4, pods_per_node=2, seed=9, ca=ca, address_base=_base())
    slow, err, garbage, down = cluster.node_names()
    async with cluster, session(cluster) as s:
        for n in cluster.node_names():  # open keep-alive connections to every node first
            assert (await get(s, cluster.node_url(n) + "/healthz"))[0] == 200
        cluster.set_node_mode(slow, "slow")
        cluster.set_node_mode(err, "error")
        cluster.set_node_mode(garbage, "garbage")
        cluster.set_node_mode(down, "down")
        with pytest.raises(TimeoutError):
            await get(s, cluster.node_url(slow) + "/metrics/resource", limit=0.5)
        assert (await get(s, cluster.node_url(err) + "/metrics/resource"))[0] == 500
        assert (await get(s, cluster.node_url(err) + "/stats/summary"))[0] == 500
        status, body = await get(s, cluster.node_url(garbage) + "/metrics/resource")
        assert status == 200
        with pytest.raises((DecodeError, ValueError)):
            decode_text(garbage, body)
        status, body = await get(s, cluster.node_url(garbage) + "/stats/summary")
        with pytest.raises((DecodeError, ValueError)):
            decode_json(garbage, body)
        for _ in range(2):  # first on the open connection, then on a new one: both fail
            with pytest.raises(aiohttp.ClientConnectionError):
                await get(s, cluster.node_url(down) + "/metrics/resource")
        with pytest.raises(aiohttp.ClientConnectorError):  # refused outright
            async with session(cluster) as fresh:
                await get(fresh, cluster.node_url(down) + "/healthz")
        for n in cluster.node_names():
            cluster.set_node_mode(n, "ok")
        for n in cluster.node_names():
            status, body = await get(s, cluster.node_url(n) + "/metrics/resource")
            assert status == 200 and set(decode_text(n, body)[1]) == served_keys(cluster, n)
        with pytest.raises(ValueError):
            cluster.set_node_mode(slow, "sideways")


# ----- inventory ---------------------------------------------------------------------------------


async def test_inventory_is_consistent_with_served_data(ca, tmp_path: Path) -> None:
    cluster = SimulatedCluster(
        nodes=3, pods_per_node=6, seed=11, ca=ca, address_base=_base(), non_running_pods=True
    )
    async with cluster, session(cluster) as s:
        path = tmp_path / "inv.json"
        cluster.write_inventory(path)
        doc = orjson.loads(path.read_bytes())
        assert doc["kind"] == "List" and doc["apiVersion"] == "v1"
        items = doc["items"]
        nodes = {o["metadata"]["name"]: o for o in items if o["kind"] == "Node"}
        pods = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in items if o["kind"] == "Pod"}
        assert set(nodes) == set(cluster.node_names())
        assert {o["status"]["phase"] for o in pods.values()} == {"Running", "Pending", "Succeeded"}
        assert len({ns for ns, _ in pods}) >= 3
        for name, obj in nodes.items():
            md, st = obj["metadata"], obj["status"]
            assert md["labels"]["kubernetes.io/hostname"] == name and md["creationTimestamp"].endswith("Z")
            addrs = {a["type"]: a["address"] for a in st["addresses"]}
            url = cluster.node_url(name)
            assert url == f"https://{addrs['InternalIP']}:{st['daemonEndpoints']['kubeletEndpoint']['Port']}"
            assert addrs["Hostname"] == name
            assert {"type": "Ready", "status": "True"}.items() <= {
                k: v for c in st["conditions"] if c["type"] == "Ready" for k, v in c.items()
            }.items()
            status, body = await get(s, url + "/metrics/resource")
            assert status == 200
            _, served = decode_text(name, body)
            served_pods = {(ns, pod) for ns, pod, _ in served}
            for ns, pod, container in served:
                obj_pod = pods[(ns, pod)]
                assert obj_pod["spec"]["nodeName"] == name
                assert obj_pod["status"]["phase"] == "Running"
                assert container in [c["name"] for c in obj_pod["spec"]["containers"]]
                assert obj_pod["metadata"]["labels"]["app"]
            running_here = {
                k
                for k, o in pods.items()
                if o["spec"].get("nodeName") == name and o["status"]["phase"] == "Running"
            }
            assert running_here == served_pods
    # The project's static inventory reads the file the same way.
    from kcms.kube.inventory import StaticInventory

    inv = StaticInventory.from_file(path)
    for name in cluster.node_names():
        info = inv.node(name)
        assert info is not None and info.kubelet_port == cluster.node(name).port
        assert ("InternalIP", cluster.node(name).address) in info.addresses
        for p in cluster.node(name).pods:
            pod = inv.pod(p.namespace, p.name)
            assert pod is not None and pod.node_name == name and pod.phase == "Running"
