"""The agent collector against simulated agents over real HTTP on loopback: values land in a real
SeriesStore and are served by custom.metrics.k8s.io / external.metrics.k8s.io over real HTTPS;
``?since=`` limits what agents send; duplicates are never stored; slow, broken and garbage agents are
counted and do not hold up the others; agent pods are discovered from the fake API server."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
from _pipeline import start_env, stop_env, wait_ready
from fakeobjects import make_pod
from prometheus_client import REGISTRY

from kcms.collector.agents import AgentAccess, AgentCollector
from kcms.kube.client import KubeClient
from kcms.quantity import parse_quantity
from kcms.sim import SimulatedCluster
from kcms.sim.agents import SimulatedAgents
from kcms.sim.apps import backlog, requests_rate
from kcms.sources.exposition import parse_exposition
from kcms.store.series import SeriesStore

PERIOD = 0.2
PLAIN = AgentAccess(insecure_http=True)  # simulated agents serve plain HTTP (no credentials)


async def eventually(cond, limit: float = 20.0) -> None:
    """Poll ``cond`` until it holds; fail after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while not cond():  # noqa: ASYNC110 (polling a condition nothing signals)
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def wait_next_ticks(agents: SimulatedAgents, n: int = 1) -> None:
    """Sleep until at least ``n`` new ticks of the agents' grid have passed."""
    start = len(agents.tick_times())
    await eventually(lambda: len(agents.tick_times()) >= start + n)


@pytest.fixture
async def agents():
    cluster = SimulatedCluster(nodes=4, pods_per_node=3, containers_per_pod=1, seed=5, one_port_per_node=True)
    async with SimulatedAgents(cluster, period=PERIOD, slow_seconds=60.0) as a:
        yield a


async def fetch(url: str) -> tuple[int, bytes, dict]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.read(), dict(r.headers)


def sample_lines(body: bytes) -> int:
    return sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))


async def test_agents_serve_the_format_and_since_limits_what_is_sent(agents: SimulatedAgents):
    node = agents.cluster.nodes[1]
    status, body, headers = await fetch(agents.url(node.name) + "/metrics")
    assert status == 200 and abs(int(headers["X-KCMS-Agent-Time"]) / 1000 - time.time()) < 60
    samples, rejected = parse_exposition(body)
    assert rejected == {}
    # The newest point of every series: this node's pods' counters and the node gauges, once each,
    # and the Deployment and namespace series homed on this node: only of namespaces it runs pods of.
    series = {(m, o, lb) for m, o, lb, _, _ in samples}
    others = [o for _, o, _, _, _ in samples if o.resource not in ("pods", "nodes")]
    assert len(series) == len(samples) == sample_lines(body) == len(node.pods) + 2 + len(others)
    assert all(any(p.namespace == o.namespace for p in node.pods) for o in others)
    assert {o.name for m, o, _, _, _ in samples if m == "http_requests_total"} == {p.name for p in node.pods}
    for m, o, _, ts, value in samples:
        if m == "http_requests_total":
            pod = agents.cluster.pod(o.namespace, o.name)
            assert value == pytest.approx(requests_rate(pod.rate) * (ts - pod.start_time), abs=0.01)
    since = round(max(s[3] for s in samples) * 1000)

    await wait_next_ticks(agents, 3)
    status, body, _ = await fetch(agents.url(node.name) + f"/metrics?since={since}")
    newer, rejected = parse_exposition(body)
    assert status == 200 and rejected == {}
    ticks = {s[3] for s in newer}
    assert len(ticks) >= 3 and min(ticks) * 1000 > since
    # Every series once per new tick, oldest first per series.
    assert len(newer) == sample_lines(body) == len(series) * len(ticks)
    for key in series:
        stamps = [s[3] for s in newer if s[:3] == key]
        assert stamps == sorted(ticks)
    # Asking from the newest point on sends nothing.
    status, body, _ = await fetch(agents.url(node.name) + f"/metrics?since={round(max(ticks) * 1000)}")
    assert status == 200 and sample_lines(body) == 0 or agents.tick_times()[-1] > max(ticks)
    status, _, _ = await fetch(agents.url(node.name) + "/metrics?since=yesterday")
    assert status == 400


async def test_collector_asks_since_and_never_stores_a_duplicate(agents: SimulatedAgents):
    store = SeriesStore()
    collector = AgentCollector(None, store, selector="", targets=agents.targets, interval=1.0, access=PLAIN)
    try:
        assert await collector.run_cycle() == 0
        # A new target is asked for everything it buffers.
        assert set(agents.last_since.values()) == {0}
        first = store.stats()
        n_series = first["series"]
        sent = sum(agents.lines_sent.values())
        assert first["points"] == sent == collector.stored and collector.duplicates == 0
        assert sent % n_series == 0 and sent >= n_series  # whole ticks: every series at every tick

        await wait_next_ticks(agents, 2)
        assert await collector.run_cycle() == 0
        assert all(v for v in agents.last_since.values())
        new_lines = sum(agents.lines_sent.values()) - sent
        # Only the points newer than the last scrape were sent, and all of them were stored.
        assert new_lines == store.stats()["points"] - sent == collector.stored - sent
        assert new_lines % n_series == 0 and new_lines >= 2 * n_series
        assert collector.duplicates == 0

    finally:
        await collector.stop()


async def test_a_collector_without_since_state_gets_only_duplicates():
    # One tick an hour: every answer holds the same points until the hour turns.
    cluster = SimulatedCluster(nodes=2, pods_per_node=2, containers_per_pod=1, seed=9, one_port_per_node=True)
    async with SimulatedAgents(cluster, period=3600.0, buffer_seconds=3600.0) as agents:
        store = SeriesStore()
        first = AgentCollector(None, store, selector="", targets=agents.targets, access=PLAIN)
        second = AgentCollector(None, store, selector="", targets=agents.targets, access=PLAIN)
        before = REGISTRY.get_sample_value("kcms_collector_agent_duplicate_samples_total") or 0.0
        try:
            assert await first.run_cycle() == 0
            points = store.stats()["points"]
            assert points == store.stats()["series"] == first.stored > 0
            assert await first.run_cycle() == 0  # since= the newest point: nothing new is sent
            assert first.duplicates == 0 and first.stored == points
            assert await second.run_cycle() == 0  # since=0: the same points again, all refused
            assert second.duplicates == points and second.stored == 0
            assert store.stats()["points"] == points
            assert (
                REGISTRY.get_sample_value("kcms_collector_agent_duplicate_samples_total") - before == points
            )
        finally:
            await first.stop()
            await second.stop()


async def test_broken_agents_are_counted_and_do_not_hold_up_the_others(agents: SimulatedAgents):
    names = agents.cluster.node_names()
    agents.set_mode(names[0], "slow")
    agents.set_mode(names[1], "error")
    agents.set_mode(names[2], "garbage")
    store = SeriesStore()
    current = agents.targets()
    collector = AgentCollector(
        None, store, selector="", targets=lambda: current, interval=5.0, timeout=2.0, access=PLAIN
    )
    before = REGISTRY.get_sample_value(
        "kcms_agent_scrape_failures_total", {"target": names[0], "reason": "timeout"}
    )
    ok = agents.cluster.node(names[3])
    try:
        cycle = asyncio.create_task(collector.run_cycle())
        # The healthy agent's points are stored while the slow agent's scrape is still outstanding.
        await eventually(lambda: bool(store.query("nodes", "", [ok.name], "node_load1")))
        assert not cycle.done() and agents.requests[names[0]] == 1
        assert await cycle == 3
        # The slow agent would answer after 60 s: the cycle ended at its own deadline instead.
        assert collector.last_cycle_seconds < 30
        assert collector.failures == {
            (names[0], "timeout"): 1,
            (names[1], "http_500"): 1,
            (names[2], "decode_not_utf8"): 1,
        }
        after = REGISTRY.get_sample_value(
            "kcms_agent_scrape_failures_total", {"target": names[0], "reason": "timeout"}
        )
        assert after - (before or 0.0) == 1
        got = store.query("nodes", "", [n for n in names], "node_load1")
        assert [r.obj.name for r in got] == [ok.name]
        assert len(store.query("pods", ok.pods[0].namespace, [ok.pods[0].name], "http_requests_total")) == 1

        # Recovery: the agents answer again and are scraped from scratch (no since yet).
        for name in names[:3]:
            agents.set_mode(name, "ok")
        assert await collector.run_cycle() == 0
        got = store.query("nodes", "", names, "node_load1")
        assert sorted(r.obj.name for r in got) == sorted(names)

        # A target no longer discovered is forgotten, and so is its failure series.
        assert current[0][0] == names[0]
        del current[0]
        assert await collector.run_cycle() == 0
        assert (names[0], "timeout") not in collector.failures and (
            names[1],
            "http_500",
        ) in collector.failures
        labels = {"target": names[0], "reason": "timeout"}
        assert REGISTRY.get_sample_value("kcms_agent_scrape_failures_total", labels) is None
        assert agents.requests[names[0]] == 2
    finally:
        await collector.stop()


async def test_values_are_served_by_the_custom_and_external_apis(ca, fake_kube, tmp_path):
    sim = SimulatedCluster(
        nodes=2, pods_per_node=3, containers_per_pod=1, seed=21, ca=ca, one_port_per_node=True
    )
    await sim.start()
    env = await start_env(ca, fake_kube, tmp_path, sim)
    agents = SimulatedAgents(sim, period=PERIOD)
    await agents.start()
    collector = AgentCollector(
        None, env.pipeline.series, selector="", targets=agents.targets, interval=PERIOD, access=PLAIN
    )
    try:
        await wait_ready(env)
        collector.start()
        stats = env.pipeline.series.stats
        await eventually(lambda: collector.cycles >= 3 and stats()["points"] >= 2 * stats()["series"] > 0)
        assert collector.healthy() == (True, "ok")
        await collector.stop()
        pod = sim.nodes[1].pods[0]
        status, body = await env.get(
            f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{pod.namespace}/pods/*/http_requests_per_second"
        )
        assert status == 200, body
        values = {i["describedObject"]["name"]: float(parse_quantity(i["value"])) for i in body["items"]}
        expected = {
            p.name: requests_rate(p.rate) for n in sim.nodes for p in n.pods if p.namespace == pod.namespace
        }
        assert values == pytest.approx(expected, rel=1e-3, abs=0.05)

        node = sim.nodes[0]
        status, body = await env.get(
            f"/apis/custom.metrics.k8s.io/v1beta2/nodes/{node.name}/node_memory_working_set_bytes"
        )
        assert status == 200, body
        (item,) = body["items"]
        assert int(parse_quantity(item["value"])) in {node.memory(t) for t in agents.tick_times()}

        status, body = await env.get(
            f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{pod.namespace}/queue_backlog?labelSelector=queue%3Demails"
        )
        assert status == 200, body
        (item,) = body["items"]
        served = float(parse_quantity(item["value"]))
        assert served in {backlog("emails", t) for t in agents.tick_times()[-20:]}
    finally:
        await collector.stop()
        await agents.stop()
        await stop_env(env)
        await sim.stop()


async def test_agent_pods_are_discovered_through_the_api_server(agents: SimulatedAgents, fake_kube):
    node = agents.cluster.nodes[0]
    port = int(agents.targets()[0][1].rsplit(":", 1)[1])
    fake_kube.upsert(make_pod("kcms", "agent-a", node.name, labels={"app": "kcms-agent"}))
    fake_kube.upsert(
        make_pod("kcms", "agent-pending", node.name, labels={"app": "kcms-agent"}, phase="Pending")
    )
    fake_kube.upsert(make_pod("default", "web", node.name, labels={"app": "web"}))
    no_ip = make_pod("kcms", "agent-no-ip", node.name, labels={"app": "kcms-agent"})
    del no_ip["status"]["hostIP"]
    fake_kube.upsert(no_ip)
    kube = await KubeClient.load(str(fake_kube.kubeconfig))
    store = SeriesStore()
    collector = AgentCollector(
        kube, store, selector="app=kcms-agent", port=port, interval=PERIOD, access=PLAIN
    )
    try:
        collector.start()
        await eventually(lambda: collector.cycles >= 1)
        assert collector.healthy() == (True, "ok")
        assert collector.targets() == [("kcms/agent-a", f"127.0.0.1:{port}")]
        assert collector.last_cycle_failures == 0
        assert [r.obj.name for r in store.query("nodes", "", None, "node_load1")] == [node.name]

        fake_kube.delete("pods", "kcms", "agent-a")
        await eventually(lambda: not collector.targets())
        fake_kube.upsert(make_pod("kcms", "agent-b", node.name, labels={"app": "kcms-agent"}))
        await eventually(lambda: bool(collector.targets()))
        assert collector.targets() == [("kcms/agent-b", f"127.0.0.1:{port}")]
    finally:
        await collector.stop()
        await kube.close()
    assert not collector.healthy()[0]


def test_collector_needs_a_source_of_targets():
    with pytest.raises(ValueError):
        AgentCollector(None, SeriesStore(), selector="")


async def test_one_agent_port_on_every_node_address_as_a_daemonset(fake_kube):
    cluster = SimulatedCluster(
        nodes=3, pods_per_node=1, containers_per_pod=1, seed=3, address_base="127.1.7.1"
    )
    with socket.socket() as s:  # a port free on the first node address (hence, very likely, on all)
        s.bind((cluster.nodes[0].address, 0))
        port = s.getsockname()[1]
    async with SimulatedAgents(cluster, port_per_agent=False, port=port, period=PERIOD) as agents:
        assert agents.targets() == [(n.name, f"{n.address}:{port}") for n in cluster.nodes]
        for i, n in enumerate(cluster.nodes):
            pod = make_pod("kcms", f"agent-{i}", n.name, labels={"app": "kcms-agent"})
            pod["status"]["hostIP"] = n.address
            fake_kube.upsert(pod)
        kube = await KubeClient.load(str(fake_kube.kubeconfig))
        store = SeriesStore()
        collector = AgentCollector(
            kube, store, selector="app=kcms-agent", port=port, interval=PERIOD, access=PLAIN
        )
        try:
            await collector.sync()
            assert sorted(collector.targets()) == [
                (f"kcms/agent-{i}", f"{n.address}:{port}") for i, n in enumerate(cluster.nodes)
            ]
            assert await collector.run_cycle() == 0
            got = store.query("nodes", "", None, "node_load1")
            assert sorted(r.obj.name for r in got) == cluster.node_names()
            assert all(agents.requests[n] == 1 for n in cluster.node_names())
        finally:
            await collector.stop()
            await kube.close()


async def test_by_default_agents_are_scraped_over_verified_tls_only(agents: SimulatedAgents):
    """A collector not told otherwise speaks TLS: a plain-HTTP agent is never sent a request (so no
    credential could leave in clear text), and the failure is counted, not a traceback."""
    store = SeriesStore()
    collector = AgentCollector(None, store, selector="", targets=agents.targets, access=AgentAccess())
    try:
        assert collector.scheme == "https"
        assert await collector.run_cycle() == len(agents.targets())
        assert {reason for _, reason in collector.failures} == {"tls"}  # wrong version number
        assert store.stats()["points"] == 0
        assert sum(agents.requests.values()) == 0
    finally:
        await collector.stop()


def kcms_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kcms", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--agent-insecure-http", "--agent-ca-file=/etc/hostname"], "--agent-insecure-http"),
        (["--agent-insecure-http", "--agent-insecure-tls"], "--agent-insecure-http"),
        (["--agent-insecure-http", "--agent-token-file=/etc/hostname"], "--agent-insecure-http"),
        (["--agent-client-certificate=/etc/hostname"], "--agent-client-certificate"),
        (
            ["--agent-client-certificate=/etc/hostname", "--agent-client-key=/etc/hostname"],
            "--agent-client-certificate",
        ),
    ],
)
@pytest.mark.parametrize("command", ["standalone", "collector"])
def test_bad_agent_tls_flags_stop_start_up_naming_the_flag(command: str, argv: list[str], flag: str) -> None:
    extra = (
        ["--store-endpoints=https://127.0.0.1:1", "--store-token-file=/etc/hostname"]
        if command == "collector"
        else []
    )
    result = kcms_cli(command, *extra, *argv)
    assert result.returncode == 2, result.stderr
    assert f"argument {flag}" in result.stderr and "Traceback" not in result.stderr
