"""A scrape cycle runs at most ``max_in_flight`` scrapes at once (metrics-server's and KCMS's
``--kubelet-max-in-flight``), by that many workers taking the nodes in turn: against slow TLS
kubelets on loopback the most requests open at any moment is exactly the bound, every node is
scraped once a cycle, in the inventory's order, and failures are counted; a cycle of many nodes
starts that many scrapes, not a task per node. The first cycle scrapes each node that answered
again once every node has had its first scrape and FIRST_RESCRAPE_DELAY has passed since its own
(not that long after the whole pass), and again with doubled waits while its kubelet serves the
same reading."""

from __future__ import annotations

import asyncio
import copy
import ssl
import time

import trustme

from kcms.collector import scheduler
from kcms.collector.kubelet import KubeletClient, KubeletClientConfig
from kcms.collector.scheduler import FIRST_RESCRAPES, Collector
from kcms.kube.inventory import StaticInventory
from kcms.model import NodeBatch
from kcms.sim import SimulatedCluster, render_resource_metrics


class SlowKubelets:
    """One raw TLS server per simulated node: each request is held ``delay`` seconds, then answered
    with the node's /metrics/resource body (the node ``failing`` answers 500; the nodes ``frozen``
    serve their first body again and again, as a kubelet between two housekeepings). Records the
    order and time requests came in and the most open at once."""

    def __init__(
        self, cluster: SimulatedCluster, ctx: ssl.SSLContext, delay: float, failing: str, frozen: frozenset[str] = frozenset()
    ) -> None:
        self.cluster, self.ctx, self.delay, self.failing, self.frozen = cluster, ctx, delay, failing, frozen
        self.open = self.most_open = 0
        self.order: list[str] = []
        self.times: list[tuple[str, float]] = []  # (node, when its request came in)
        self.bodies: dict[str, bytes] = {}
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
                self.times.append((node.name, time.monotonic()))
                self.open += 1
                self.most_open = max(self.most_open, self.open)
                await asyncio.sleep(self.delay)
                self.open -= 1
                if node.name == self.failing:
                    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
                else:
                    body = self.bodies.get(node.name) or render_resource_metrics(node, time.time())
                    if node.name in self.frozen:
                        self.bodies[node.name] = body
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


def inventory_of(cluster: SimulatedCluster, kubelets: SlowKubelets) -> StaticInventory:
    """The cluster's nodes and pods, each node's kubelet at its SlowKubelets port on 127.0.0.1."""
    objects = cluster.inventory_objects()
    for obj in objects:
        if obj["kind"] == "Node":
            obj["status"]["addresses"] = [{"type": "InternalIP", "address": "127.0.0.1"}]
            obj["status"]["daemonEndpoints"] = {
                "kubeletEndpoint": {"Port": kubelets.ports[obj["metadata"]["name"]]}
            }
    return StaticInventory(copy.deepcopy(objects))


def client_for(ca: trustme.CA) -> KubeletClient:
    return KubeletClient(
        KubeletClientConfig(
            use_node_status_port=True,
            preferred_address_types=("InternalIP",),
            extra_ca_pem=[ca.cert_pem.bytes().decode()],
        )
    )


def server_context(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    return ctx


async def test_a_cycle_keeps_max_in_flight_scrapes_open_and_scrapes_every_node_once(ca: trustme.CA) -> None:
    cluster = SimulatedCluster(nodes=12, pods_per_node=2, containers_per_pod=1, seed=5)
    failing = cluster.nodes[7].name
    kubelets = SlowKubelets(cluster, server_context(ca), delay=0.15, failing=failing)
    await kubelets.start()
    inventory = inventory_of(cluster, kubelets)
    client = client_for(ca)
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


async def test_the_first_cycle_scrapes_each_node_again_after_its_own_scrape_until_its_reading_is_new(
    ca: trustme.CA,
) -> None:
    """One scrape at a time, each held 0.2 s, eight nodes: the first pass takes 1.6 s, by when the
    nodes scraped first are past their 0.6 s wait, so their rescrapes follow the pass at once (a
    second pass 0.6 s after the first, as before, left that gap), in the order they are due; no
    rescrape goes before the pass is done. A node whose kubelet serves the same reading again is
    scraped again after 1.2 s, then 2.4 s: FIRST_RESCRAPES in all; the failing node is not
    scraped again. A later cycle scrapes each node once."""
    cluster = SimulatedCluster(nodes=8, pods_per_node=2, containers_per_pod=1, seed=7)
    kubelets = SlowKubelets(cluster, server_context(ca), delay=0.2, failing="")
    await kubelets.start()
    inventory = inventory_of(cluster, kubelets)
    names = [n.name for n in inventory.nodes()]
    failing, frozen = names[7], names[1]  # the pass's last node, and its second
    kubelets.failing, kubelets.frozen = failing, frozenset({frozen})
    client = client_for(ca)
    stored: list[NodeBatch] = []
    collector = Collector(inventory, client, stored.append, resolution=60.0, timeout=5.0, max_in_flight=1)
    wait = 0.6
    try:
        started = client.decode_turns.clock()
        failures = await collector.run_cycle(rescrape_after=wait)
        # the rescrapes' decodes are spread as a cycle's start's are, from the pass's end (>= 1.6 s)
        assert client.decode_turns.until >= started + 1.6 + collector.resolution / 3
        order = kubelets.order
        counts = {n: order.count(n) for n in names}
        assert counts == {**dict.fromkeys(names, 2), frozen: 1 + FIRST_RESCRAPES, failing: 1}, order
        assert failures == 1
        assert order[:8] == names  # every first scrape before any rescrape
        assert order[8:10] == names[:2]  # then the rescrapes, by when they are due
        at: dict[str, list[float]] = {}
        for node, when in kubelets.times:
            at.setdefault(node, []).append(when)
        for node in set(names) - {failing}:
            gaps = [b - a for a, b in zip(at[node], at[node][1:], strict=False)]
            # each wait (doubled after the same reading) runs from the answer, 0.2 s after the request
            assert all(g >= 0.2 + wait * 2**i for i, g in enumerate(gaps)), (node, gaps)
        # the first node's rescrape follows the pass's last answer without a wait of its own
        assert at[names[0]][1] - (at[names[7]][0] + 0.2) < wait, at
        assert len(stored) == 2 * 6 + 1 + FIRST_RESCRAPES  # every answer reaches the sink
        order.clear()
        assert await collector.run_cycle() == 1
        assert sorted(order) == sorted(names)  # once each
    finally:
        await client.close()
        await kubelets.stop()


async def test_the_loop_stays_live_through_a_first_cycle_longer_than_the_liveness_limit(ca: trustme.CA, monkeypatch) -> None:
    """/livez's check fails when neither a cycle nor a scrape started within 2 resolutions plus the
    timeout (3.5 s here). A frozen kubelet keeps the first cycle going for 5.6 s and more (waits of
    0.6, 1.2 and 2.4 s after its answers), past that limit: the loop is live throughout, as scrapes
    keep starting, and once the cycle ends too."""
    monkeypatch.setattr(scheduler, "FIRST_RESCRAPE_DELAY", 0.6)
    cluster = SimulatedCluster(nodes=4, pods_per_node=2, containers_per_pod=1, seed=9)
    kubelets = SlowKubelets(cluster, server_context(ca), delay=0.2, failing="")
    await kubelets.start()
    inventory = inventory_of(cluster, kubelets)
    kubelets.frozen = frozenset({next(iter(inventory.nodes())).name})
    client = client_for(ca)
    collector = Collector(inventory, client, lambda b: None, resolution=1.0, timeout=1.5, max_in_flight=1)
    checks: list[tuple[bool, str]] = []
    collector.start()
    try:
        started = time.monotonic()
        while collector.cycles == 0:
            checks.append(collector.healthy())
            await asyncio.sleep(0.05)
        assert time.monotonic() - started > 2 * collector.resolution + collector.timeout  # past the limit
        assert all(ok for ok, _ in checks), [c for c in checks if not c[0]][:3]
        assert collector.healthy()[0]
    finally:
        await collector.stop()
        await client.close()
        await kubelets.stop()
