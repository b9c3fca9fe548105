"""The agent scrape path under a hostile node agent (kcms/collector/agents.py, kcms/nodescope.py).

Every node agent shares one serving certificate, so a compromised agent (or its stolen key) could
once write series about any object of any node through the collector's scrape. The collector now
binds each agent to its node (the agent pod's ``spec.nodeName``, or a static target's node) and
refuses, per sample, what that node may not report. Here a real standalone pipeline (fake API
server's inventory, series store, custom metrics API) scrapes a hostile agent on one node, written
in the test (aiohttp on loopback serving agent exposition text), next to the simulator's honest
agent of the other node.
"""

from __future__ import annotations

import logging
import time

import pytest
from _http_helpers import serve_app
from _pipeline import start_env, stop_env, wait_ready
from aiohttp import web
from fakeobjects import make_pod
from prometheus_client import REGISTRY

from kcms.collector.agents import AgentCollector
from kcms.kube.client import KubeClient
from kcms.kube.inventory import KubeInventory, StaticInventory
from kcms.quantity import parse_quantity
from kcms.sim import SimulatedCluster
from kcms.sim.agents import SimulatedAgents
from kcms.sim.apps import requests_rate
from kcms.store.series import SeriesStore

CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"
OTHER_NAMESPACE = "billing"  # only the honest node runs a pod there
REFUSAL_LINE = "refused samples about objects its node may not report"


def rejected(reason: str) -> float:
    return REGISTRY.get_sample_value("kcms_collector_agent_rejected_samples_total", {"reason": reason}) or 0.0


class HostileAgent:
    """An agent endpoint serving a fixed exposition body, whatever ``since`` asks (loopback, plain HTTP)."""

    def __init__(self, lines: list[str]) -> None:
        self.body = ("\n".join(lines) + "\n").encode()
        self.requests = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def metrics(request: web.Request) -> web.Response:
            self.requests += 1
            return web.Response(body=self.body, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self._runner, self.port = await serve_app(app, access_log=None)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def line(
    metric: str, resource: str, namespace: str, name: str, value: float, ts: float, labels: str = ""
) -> str:
    extra = f",{labels}" if labels else ""
    return (
        f'{metric}{{kcms_resource="{resource}",kcms_namespace="{namespace}",kcms_name="{name}"{extra}}} '
        f"{value} {round(ts * 1000)}"
    )


def attack(sim: SimulatedCluster) -> tuple[list[str], dict[str, int]]:
    """What the hostile agent on node 0 serves, and how many lines of it each reason refuses."""
    mine, theirs = sim.nodes[0], sim.nodes[1]
    own_pod, their_pod = mine.pods[0], theirs.pods[0]
    ns = own_pod.namespace
    ts = time.time() - 0.5  # newer than any honest point: if stored, it would be what is served
    lines = [
        # its own node and pod, a Deployment and an external series of a namespace it runs a pod of
        line("node_load1", "nodes", "", mine.name, 0.25, ts),
        line("http_requests_total", "pods", ns, own_pod.name, 7, ts, 'path="/"'),
        line("queue_backlog", "deployments.apps", ns, "mine", 3, ts),
        line("queue_backlog", "", ns, "", 4, ts, 'queue="mine"'),
        # another node, its pod (twice: two series), a pod nobody runs, cluster-scoped objects,
        # a Deployment and an external series of a namespace where this node runs no pod
        line("node_load1", "nodes", "", theirs.name, 999999, ts),
        line("http_requests_total", "pods", their_pod.namespace, their_pod.name, 1e12, ts, 'path="/"'),
        line("http_requests_total", "pods", their_pod.namespace, their_pod.name, 1e12, ts, 'path="/x"'),
        line("http_requests_total", "pods", ns, "ghost-0", 5, ts),
        line("namespace_quota", "namespaces", "", ns, 1, ts),
        line("pv_used_bytes", "persistentvolumes", "", "pv-1", 1, ts),
        line("queue_backlog", "deployments.apps", OTHER_NAMESPACE, "pay", 1e9, ts),
        line("queue_backlog", "", OTHER_NAMESPACE, "", 1e9, ts, 'queue="payments"'),
    ]
    expected = {
        "other_node": 1,
        "pod_not_on_node": 2,
        "unknown_pod": 1,
        "object_not_bound": 2,
        "namespace_not_on_node": 2,
    }
    return lines, expected


def two_node_sim(ca) -> SimulatedCluster:
    return SimulatedCluster(
        nodes=2, pods_per_node=2, containers_per_pod=1, seed=31, ca=ca, one_port_per_node=True
    )


async def test_hostile_agent_is_refused_per_sample_and_the_other_node_keeps_its_series(
    ca, fake_kube, tmp_path, caplog
) -> None:
    """Node 0's agent writes about node 1, node 1's pods, a pod nobody runs, cluster-scoped objects and
    a namespace node 0 runs nothing in: each sample refused and counted by reason, its own node's,
    pod's and namespace's series stored, node 1's series (from its honest agent) served unchanged."""
    caplog.set_level(logging.INFO)
    sim = two_node_sim(ca)
    await sim.start()
    mine, theirs = sim.nodes[0], sim.nodes[1]
    # A namespace only node 1 runs a pod in, with its honest Deployment series in the store.
    fake_kube.upsert(make_pod(OTHER_NAMESPACE, "pay-7d9f-abcde", theirs.name))
    honest = SimulatedAgents(sim, history=10.0)
    await honest.start()
    lines, expected = attack(sim)
    hostile = HostileAgent(lines)
    await hostile.start()

    def targets() -> list[tuple[str, str, str]]:
        theirs_only = [t for t in honest.bound_targets() if t[2] == theirs.name]
        return [("kube-system/agent-evil", f"127.0.0.1:{hostile.port}", mine.name), *theirs_only]

    before = {r: rejected(r) for r in expected}
    env = await start_env(
        ca, fake_kube, tmp_path, sim, agent_targets=targets, agent_insecure_http=True,
        agent_scrape_interval=3600.0,
    )  # fmt: skip
    try:
        await wait_ready(env)
        agents = env.pipeline.agents
        assert agents is not None and agents.inventory is env.inventory
        assert await agents.run_cycle() == 0
        assert await agents.run_cycle() == 0
        scrapes = hostile.requests
        assert scrapes >= 2  # (the pipeline's own loop scrapes once at start too)

        # Refused per sample, counted by reason (the collector's counts and the Prometheus counter).
        assert {r: agents.rejected.get(r, 0) for r in expected} == {
            r: n * scrapes for r, n in expected.items()
        }
        assert {r: rejected(r) - before[r] for r in expected} == {r: n * scrapes for r, n in expected.items()}
        assert agents.rejected.get("unknown_node", 0) == 0

        # Node 1's series: what its honest agent wrote, not the hostile values.
        series = env.pipeline.series
        (load,) = series.query("nodes", "", [theirs.name], "node_load1")
        assert load.value < 1000 and load.timestamp in honest.tick_times()
        pod = theirs.pods[0]
        got = series.query("pods", pod.namespace, [pod.name], "http_requests_total")
        assert [r.labels for r in got] == [(("path", "/"),)]
        assert got[0].value == pytest.approx(
            requests_rate(pod.rate) * (got[0].timestamp - pod.start_time), abs=0.01
        )
        assert series.query("pods", mine.pods[0].namespace, ["ghost-0"], "http_requests_total") == []
        assert series.query("namespaces", "", None, "namespace_quota") == []
        assert series.query("persistentvolumes", "", None, "pv_used_bytes") == []
        # (the simulator runs no app in that namespace: only the hostile series could be there)
        assert series.query("deployments.apps", OTHER_NAMESPACE, None, "queue_backlog") == []
        assert series.query("", OTHER_NAMESPACE, None, "queue_backlog") == []

        # Node 0's own node, pod, Deployment and namespace series: stored.
        ns = mine.pods[0].namespace
        (own,) = series.query("nodes", "", [mine.name], "node_load1")
        assert own.value == 0.25
        assert [r.value for r in series.query("pods", ns, [mine.pods[0].name], "http_requests_total")] == [7]
        assert [r.value for r in series.query("deployments.apps", ns, ["mine"], "queue_backlog")] == [3]
        assert {
            r.value for r in series.query("", ns, None, "queue_backlog") if r.labels == (("queue", "mine"),)
        } == {4}

        # The same through the custom metrics API, as an HPA reads it.
        status, body = await env.get(f"{CUSTOM}/nodes/{theirs.name}/node_load1")
        assert status == 200 and len(body["items"]) == 1
        assert float(parse_quantity(body["items"][0]["value"])) == pytest.approx(load.value)
        status, body = await env.get(f"{CUSTOM}/namespaces/{ns}/pods/ghost-0/http_requests_total")
        assert status == 404

        # The server stays ready; one escaped warning (rate-limited: several scrapes, one line).
        status, _ = await env.get("/readyz", token=None, accept=None)
        assert status == 200
        warnings = [r.getMessage() for r in caplog.records if REFUSAL_LINE in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert "'kube-system/agent-evil' on node " in warnings[0] and "other_node=1" in warnings[0]
        assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)
    finally:
        await stop_env(env)
        await hostile.stop()
        await honest.stop()
        await sim.stop()


async def test_discovered_agent_is_bound_to_its_pods_node(ca, fake_kube, tmp_path, caplog) -> None:
    """`kcms standalone --agent-selector`: the agent pod's spec.nodeName is the node its samples are
    checked against (not anything in the body); an agent pod without a node is not scraped at all."""
    sim = two_node_sim(ca)
    await sim.start()
    mine = sim.nodes[0]
    lines, expected = attack(sim)
    hostile = HostileAgent(lines)
    await hostile.start()
    agent_pod = make_pod("kube-system", "kcms-agent-0", mine.name, labels={"app": "kcms-agent"})
    unbound = make_pod("kube-system", "kcms-agent-nonode", mine.name, labels={"app": "kcms-agent"})
    del unbound["spec"]["nodeName"]
    fake_kube.upsert(agent_pod)
    fake_kube.upsert(unbound)
    env = await start_env(
        ca, fake_kube, tmp_path, sim, agent_selector="app=kcms-agent", agent_port=hostile.port,
        agent_insecure_http=True, agent_scrape_interval=3600.0,
    )  # fmt: skip
    try:
        await wait_ready(env)
        agents = env.pipeline.agents
        assert agents is not None
        await agents.sync()
        assert agents.bound_targets() == [
            ("kube-system/kcms-agent-0", f"127.0.0.1:{hostile.port}", mine.name)
        ]
        await agents.run_cycle()
        scrapes = hostile.requests
        assert scrapes >= 1
        assert {r: agents.rejected.get(r, 0) for r in expected} == {
            r: n * scrapes for r, n in expected.items()
        }
        (own,) = env.pipeline.series.query("nodes", "", [mine.name], "node_load1")
        assert own.value == 0.25
        assert env.pipeline.series.query("nodes", "", [sim.nodes[1].name], "node_load1") == []
        status, _ = await env.get("/readyz", token=None, accept=None)
        assert status == 200
        assert "Traceback" not in caplog.text
    finally:
        await stop_env(env)
        await hostile.stop()
        await sim.stop()


async def test_simulated_agents_report_only_what_their_nodes_may(ca) -> None:
    """Every simulated agent, bound to its node, has nothing refused: the simulator's Deployment and
    namespace series are served by an agent whose node runs a pod of that namespace."""
    sim = SimulatedCluster(nodes=5, pods_per_node=4, containers_per_pod=1, seed=7, ca=ca)
    await sim.start()
    agents = SimulatedAgents(sim, history=10.0)
    await agents.start()
    store = SeriesStore()
    collector = AgentCollector(
        None, store, selector="", targets=agents.bound_targets,
        access=_plain(), inventory=StaticInventory(sim.inventory_objects()),
    )  # fmt: skip
    try:
        assert await collector.run_cycle() == 0
        assert collector.rejected == {} and collector.stored > 0
        kinds = {r.obj.resource for r in store.query("deployments.apps", "", None, "queue_backlog")}
        assert kinds <= {"deployments.apps"}
        namespaces = {p.namespace for n in sim.nodes for p in n.pods}
        for ns in namespaces:  # every namespace's Deployment and external series arrived
            assert store.query("deployments.apps", ns, None, "queue_backlog")
            assert store.query("", ns, None, "queue_backlog")
    finally:
        await collector.stop()
        await agents.stop()
        await sim.stop()


async def test_nothing_is_scraped_before_the_inventory_is_in(ca, fake_kube) -> None:
    """Until the inventory has listed nodes and pods, every pod would be unknown: the collector waits
    (the agent's buffer is fetched whole once it is in) instead of refusing an honest node's data."""
    sim = two_node_sim(ca)
    await sim.start()
    agents = SimulatedAgents(sim, history=10.0)
    await agents.start()
    for obj in sim.inventory_objects():
        fake_kube.upsert(obj)
    kube = await KubeClient.load(str(fake_kube.kubeconfig))
    inventory = KubeInventory(kube)
    collector = AgentCollector(
        None, SeriesStore(), selector="", targets=agents.bound_targets, access=_plain(), inventory=inventory
    )
    try:
        assert not collector.has_synced()
        assert await collector.run_cycle() == 0
        assert sum(agents.requests.values()) == 0 and collector.rejected == {}
        await inventory.start()
        assert collector.has_synced()
        assert await collector.run_cycle() == 0
        assert sum(agents.requests.values()) == 2 and collector.rejected == {} and collector.stored > 0
    finally:
        await collector.stop()
        await inventory.stop()
        await kube.close()
        await agents.stop()
        await sim.stop()


def _plain():
    from kcms.collector.agents import AgentAccess

    return AgentAccess(insecure_http=True)
