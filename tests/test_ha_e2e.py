"""Multi-store mode end to end, every component a real process: simulated kubelets (TLS) -> two
leader-elected `kcms collector`s -> three `kcms store`s -> `kcms server`, read with the real kubectl.
The Lease lives in the fake API server; the leader is killed with SIGKILL and the standby must take
over within the lease duration, with the Lease history showing one holder at a time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import sys
import time
from datetime import datetime

import aiohttp
import pytest
from _kubectl import KUBECTL, get_raw
from _stores import Stores, free_port

LEASE = 3.0  # seconds; renew deadline 2 s, retry period 0.5 s
BASE = "/apis/metrics.k8s.io/v1beta1"


def _kubeconfig(path, port: int) -> str:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "k",
                        "cluster": {"server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True},
                    }
                ],
                "users": [{"name": "u", "user": {"token": "reader"}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return str(path)


async def _spawn(tmp_path, name: str, *argv: str) -> asyncio.subprocess.Process:
    log = open(tmp_path / f"{name}.log", "wb")  # noqa: ASYNC230, SIM115 - the child writes to it
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kcms", *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    log.close()
    return proc


async def _wait(predicate, limit: float, what: str) -> float:
    t0 = time.monotonic()
    while True:
        got = await predicate()
        if got:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < limit, f"{what}: not within {limit}s"
        await asyncio.sleep(0.1)


def _micro(ts: str) -> float:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


class HAEnv:
    """Simulated kubelets and agents, three stores, two collectors (c1, c2) and a server, all real
    processes but the simulator and the fake API server."""

    def __init__(self, fake, ca, tmp_path) -> None:
        self.fake, self.ca, self.tmp = fake, ca, tmp_path
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.stopped: set[str] = set()
        self.health = {c: free_port() for c in ("c1", "c2")}
        self.server_port = free_port()

    async def start(self) -> None:
        from fakeobjects import make_pod

        from kcms.sim import SimulatedCluster
        from kcms.sim.agents import SimulatedAgents

        self.sim = SimulatedCluster(
            nodes=3,
            pods_per_node=2,
            containers_per_pod=1,
            seed=5,
            ca=self.ca,
            port=free_port(),
            address_base="127.3.0.1",
        )
        await self.sim.start()
        agent_port = free_port()
        self.agents = SimulatedAgents(self.sim, history=10.0, port_per_agent=False, port=agent_port)
        await self.agents.start()
        for obj in self.sim.inventory_objects():
            self.fake.upsert(obj)
        for i, node in enumerate(self.sim.nodes):  # the agents' DaemonSet pods, found by label
            pod = make_pod("kcms", f"kcms-agent-{i}", node.name, labels={"app": "kcms-agent"})
            pod["status"]["hostIP"] = node.address
            self.fake.upsert(pod)
        self.fake.tokens["reader"] = {"username": "reader", "groups": ["readers"]}
        kubelet_ca = self.tmp / "kubelet-ca.pem"
        kubelet_ca.write_bytes(self.ca.cert_pem.bytes())
        self.stores = Stores(self.tmp, 3)
        self.stores.start_all()
        store_flags = [
            f"--store-endpoints={self.stores.endpoints()}",
            f"--store-token-file={self.stores.token_file}",
        ]
        kubeconfig = str(self.fake.kubeconfig)
        for c in ("c1", "c2"):
            self.procs[c] = await _spawn(
                self.tmp, c, "collector", "--kubeconfig", kubeconfig, *store_flags,
                "--kubelet-certificate-authority", str(kubelet_ca), "--kubelet-use-node-status-port",
                "--kubelet-preferred-address-types", "InternalIP", "--metric-resolution", "10s",
                "--agent-selector=app=kcms-agent", f"--agent-port={agent_port}", "--agent-scrape-interval=1s",
                "--agent-insecure-http",  # simulated agents serve plain HTTP
                f"--leader-elect-lease-duration={LEASE}s", "--leader-elect-renew-deadline=2s",
                "--leader-elect-retry-period=0.5s", "--leader-elect-resource-namespace=kube-system",
                f"--leader-elect-identity={c}", "--health-bind-address=127.0.0.1", f"--health-port={self.health[c]}",
            )  # fmt: skip
        self.procs["server"] = await _spawn(
            self.tmp, "server", "server", "--kubeconfig", kubeconfig, *store_flags,
            "--secure-port", str(self.server_port), "--bind-address", "127.0.0.1",
            "--cert-dir", str(self.tmp / "certs"), "--authentication-skip-lookup",
        )  # fmt: skip
        self.http = aiohttp.ClientSession()
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE

        async def ready() -> bool:
            self.check_alive()
            try:
                async with self.http.get(f"https://127.0.0.1:{self.server_port}/readyz", ssl=ctx) as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await _wait(ready, 40, "server ready")
        self.raw = get_raw(_kubeconfig(self.tmp / "kcms.kubeconfig", self.server_port))

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            assert name in self.stopped or p.returncode is None, (
                f"{name} exited: {(self.tmp / f'{name}.log').read_text()[-2000:]}"
            )

    async def get(self, path: str) -> dict:
        self.check_alive()
        return await asyncio.to_thread(self.raw, path)

    async def status(self, collector: str) -> dict:
        async with self.http.get(f"http://127.0.0.1:{self.health[collector]}/status") as r:
            return await r.json()

    def holder(self) -> str:
        lease = self.fake.get("leases", "kube-system", "kcms-collector")
        return (lease or {}).get("spec", {}).get("holderIdentity", "")

    async def node_times(self) -> dict[str, str]:
        return {i["metadata"]["name"]: i["timestamp"] for i in (await self.get(f"{BASE}/nodes"))["items"]}

    async def stop(self) -> None:
        for p in self.procs.values():
            if p.returncode is None:
                try:
                    p.send_signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
                p.send_signal(signal.SIGTERM)
        for name, p in self.procs.items():
            try:
                await asyncio.wait_for(p.wait(), 20)
            except TimeoutError:
                p.kill()
                print(name, "did not stop on SIGTERM")
        if hasattr(self, "http"):
            await self.http.close()
        self.stores.stop_all()
        await self.agents.stop()
        await self.sim.stop()


def _one_holder_at_a_time(fake, changes: int) -> None:
    """From the fake API server's record of Lease writes: a new holder writes only after the old
    holder's last renewal plus the lease duration, and transitions count the holder changes."""
    writes = [w for w in fake.lease_writes if w[1] == "kcms-collector"]
    holders = [w[3] for w in writes if w[3]]
    assert sum(1 for a, b in zip(holders, holders[1:], strict=False) if a != b) == changes
    assert writes[-1][5] == changes
    for prev, cur in zip(writes, writes[1:], strict=False):
        if prev[3] and cur[3] and prev[3] != cur[3]:
            assert _micro(cur[4]) - _micro(prev[4]) >= LEASE - 0.05


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")
async def test_multi_store_pipeline_survives_losing_the_leading_collector(fake_kube, ca, tmp_path) -> None:
    from kcms.quantity import parse_quantity
    from kcms.sim.apps import requests_rate

    env = HAEnv(fake_kube, ca, tmp_path)
    try:
        await env.start()

        async def all_nodes() -> bool:
            return len(await env.node_times()) == 3

        await _wait(all_nodes, 40, "three nodes served")
        pods = await env.get(f"{BASE}/pods")
        assert len(pods["items"]) == 6
        # custom metrics from the agents, through the collector and the stores, both versions
        pod = env.sim.nodes[1].pods[0]
        for version in ("v1beta2", "v1beta1"):
            base = f"/apis/custom.metrics.k8s.io/{version}"

            async def rate_served(base=base) -> bool:
                body = await env.get(
                    f"{base}/namespaces/{pod.namespace}/pods/{pod.name}/http_requests_per_second"
                )
                return len(body["items"]) == 1

            await _wait(rate_served, 20, f"{version} pod metric served")
            body = await env.get(
                f"{base}/namespaces/{pod.namespace}/pods/{pod.name}/http_requests_per_second"
            )
            assert float(parse_quantity(body["items"][0]["value"])) == pytest.approx(
                requests_rate(pod.rate), rel=1e-6
            )
            body = await env.get(f"{base}/nodes/*/node_load1")
            assert {i["describedObject"]["name"] for i in body["items"]} == set(env.sim.node_names())

        leader = env.holder()
        standby = "c2" if leader == "c1" else "c1"
        assert (await env.status(standby))["leader"] is False
        before = await env.node_times()

        env.stopped.add(leader)
        env.procs[leader].send_signal(signal.SIGKILL)
        await env.procs[leader].wait()

        async def taken_over() -> bool:
            return env.holder() == standby

        took = await _wait(taken_over, 3 * LEASE, "standby takes the lease")
        print(f"collector takeover {took:.2f}s after SIGKILL (lease {LEASE}s)")
        assert took <= LEASE + 2.0, f"takeover took {took:.1f}s"

        async def fresh() -> bool:  # the new leader scrapes: every node gets a newer reading
            now = await env.node_times()
            return len(now) == 3 and all(now[n] > before[n] for n in now)

        await _wait(fresh, 30, "new leader's readings served")
        status = await env.status(standby)
        assert status["leader"] is True and status["ackedNodes"] > 0 and status["ackedSamples"] > 0
        _one_holder_at_a_time(fake_kube, changes=1)
    finally:
        await env.stop()


async def test_a_hung_leader_stops_writing_when_it_wakes_without_the_lease(fake_kube, ca, tmp_path) -> None:
    env = HAEnv(fake_kube, ca, tmp_path)
    try:
        await env.start()

        async def elected() -> bool:
            return env.holder() in ("c1", "c2")

        await _wait(elected, 20, "a leader")
        leader = env.holder()
        standby = "c2" if leader == "c1" else "c1"

        async def writing() -> bool:
            return (await env.status(leader))["ackedSamples"] > 0

        await _wait(writing, 20, "the leader writes")
        env.procs[leader].send_signal(signal.SIGSTOP)  # hung, not dead

        async def taken_over() -> bool:
            return env.holder() == standby

        await _wait(taken_over, 3 * LEASE, "standby takes the lease from a hung leader")
        env.procs[leader].send_signal(signal.SIGCONT)
        await asyncio.sleep(0.5)
        woke = await env.status(leader)
        assert woke["leader"] is False  # its renew deadline passed while it slept
        await asyncio.sleep(2.0)
        later = await env.status(leader)
        assert later["leader"] is False and not later["scraping"]
        assert (later["ackedSamples"], later["ackedNodes"]) == (woke["ackedSamples"], woke["ackedNodes"])
        assert (await env.status(standby))["leader"] is True
        _one_holder_at_a_time(fake_kube, changes=1)
    finally:
        await env.stop()
