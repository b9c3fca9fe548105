"""A scrape cycle runs at most ``max_in_flight`` scrapes at once (metrics-server's and KCMS's
``--kubelet-max-in-flight``), by that many workers taking the nodes in turn: against slow TLS
kubelets on loopback the most requests open at any moment is exactly the bound, every node is
scraped once a cycle, in the inventory's order, and failures are counted; a cycle of many nodes
starts that many scrapes, not a task per node."""

from __future__ import annotations

import asyncio
import copy
import ssl
import time

import trustme

from kcms.collector.kubelet import KubeletClient, KubeletClientConfig
from kcms.collector.scheduler import Collector
from kcms.kube.inventory import StaticInventory
from kcms.model import NodeBatch
from kcms.sim import SimulatedCluster, render_resource_metrics


class SlowKubelets:
    """One raw TLS server per simulated node: each request is held ``delay`` seconds, then answered
    with the node's /metrics/resource body (the node ``failing`` answers 500). Records the order
    requests came in and the most open at once."""

    def __init__(self, cluster: SimulatedCluster, ctx: ssl.SSLContext, delay: float, failing: str) -> None:
        self.cluster, self.ctx, self.delay, self.failing = cluster, ctx, delay, failing
        self.open = self.most_open = 0
        self.order: list[str] = []
        self.ports: dict[str, int] = {}
        self.servers: list[asyncio.AbstractServer] = []

    async def start(self) -> None:
        for node in self.cluster.nodes:
            server = await asyncio.start_server(
                lambda r, w, node=node: self._handle(node, r, w), "127.0.0.1", 0, ssl=self.ctx
            )
            self.servers.append(server)
            self.ports[node.name] = server.sockets[0].getsockname()[1]

    async def _handle(self, node, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                self.order.append(node.name)
                self.open += 1
                self.most_open = max(self.most_open, self.open)
                await asyncio.sleep(self.delay)
                self.open -= 1
                if node.name == self.failing:
                    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
                else:
                    body = render_resource_metrics(node, time.time())
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        for server in self.servers:
            server.close()
            await server.wait_closed()


async def test_a_cycle_keeps_max_in_flight_scrapes_open_and_scrapes_every_node_once(ca: trustme.CA) -> None:
    cluster = SimulatedCluster(nodes=12, pods_per_node=2, containers_per_pod=1, seed=5)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    failing = cluster.nodes[7].name
    kubelets = SlowKubelets(cluster, server_ctx, delay=0.15, failing=failing)
    await kubelets.start()
    objects = cluster.inventory_objects()
    for obj in objects:
        if obj["kind"] == "Node":
            obj["status"]["addresses"] = [{"type": "InternalIP", "address": "127.0.0.1"}]
            obj["status"]["daemonEndpoints"] = {
                "kubeletEndpoint": {"Port": kubelets.ports[obj["metadata"]["name"]]}
            }
    inventory = StaticInventory(copy.deepcopy(objects))
    client = KubeletClient(
        KubeletClientConfig(
            use_node_status_port=True,
            preferred_address_types=("InternalIP",),
            extra_ca_pem=[ca.cert_pem.bytes().decode()],
        )
    )
    stored: list[NodeBatch] = []
    collector = Collector(inventory, client, stored.append, resolution=60.0, timeout=30.0, max_in_flight=4)
    try:
        for cycle in range(2):
            kubelets.order.clear()
            assert await collector.run_cycle() == 1, cycle  # the failing node, counted once
            assert kubelets.most_open == 4  # the bound, and reached
            assert sorted(kubelets.order) == sorted(n.name for n in cluster.nodes)  # each once
            assert kubelets.order[:4] == [n.name for n in inventory.nodes()][:4]  # in order
            assert sorted(b.node for b in stored) == sorted(
                n.name for n in cluster.nodes if n.name != failing
            )
            stored.clear()
        assert collector.last_cycle_failures == 1
        # 12 scrapes of 0.15 s, 4 at a time: three rounds, not one (no bound) nor twelve (no overlap)
        assert 0.3 < collector.last_cycle_seconds < 1.5
    finally:
        await client.close()
        await kubelets.stop()


async def test_a_cycle_starts_only_as_many_tasks_as_scrapes_may_run(ca: trustme.CA) -> None:
    """With 3000 nodes and a bound of 5, a cycle (every scrape failing fast: no address) runs 5
    workers: the tasks alive at its start are a handful, where a task per node made 3000."""
    objects = [
        {"kind": "Node", "metadata": {"name": f"n{i}", "labels": {}}, "status": {"addresses": []}}
        for i in range(3000)
    ]
    inventory = StaticInventory(objects)
    client = KubeletClient(KubeletClientConfig(preferred_address_types=("InternalIP",)))
    collector = Collector(inventory, client, lambda b: None, resolution=60.0, timeout=5.0, max_in_flight=5)
    before = len(asyncio.all_tasks())
    seen: list[int] = []

    async def watch() -> None:
        while True:
            seen.append(len(asyncio.all_tasks()))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    try:
        assert await collector.run_cycle() == 3000
    finally:
        watcher.cancel()
        await client.close()
    assert max(seen) <= before + 1 + 5 + 1  # the watcher, the workers, the cycle's gather
