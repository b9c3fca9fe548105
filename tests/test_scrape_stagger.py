"""Scrape starts are staggered as metrics-server staggers its fetches (up to 8 ms a node, at most
4 s), from the third cycle on, each node by a delay fixed by its name (so each node is still read
once a resolution); the first two cycles, which make nodes servable after a start, are not."""

from __future__ import annotations

import time
import zlib

import trustme

from kcms.collector import scheduler
from kcms.collector.kubelet import KubeletClient, KubeletClientConfig
from kcms.collector.scheduler import Collector, start_delays
from kcms.kube.inventory import StaticInventory
from kcms.model import NodeBatch
from kcms.sim import SimulatedCluster


def test_delays_are_fixed_by_name_spread_over_the_window_and_bounded():
    names = [f"node-{i:05d}" for i in range(5000)]
    memo: dict[str, float] = {}
    delays = start_delays(names, 4.0, memo)
    assert all(0 <= d < 4.0 for d in delays)
    assert start_delays(list(reversed(names)), 4.0, memo) == list(reversed(delays))  # fixed by name
    assert start_delays(names, 2.0, {}) == [d / 2 for d in delays]
    # uniform enough: every tenth of the window holds 8-12 % of the nodes, and so does each
    # scrape worker's share (CRC32 of the name mod 2), so no worker's nodes bunch up
    for share in (names, [n for n in names if zlib.crc32(n.encode()) % 2 == 0]):
        d = start_delays(share, 4.0, {})
        counts = [sum(1 for x in d if k * 0.4 <= x < (k + 1) * 0.4) for k in range(10)]
        assert all(0.08 * len(share) <= c <= 0.12 * len(share) for c in counts), counts
    # the memo holds only the names of the last call: nodes that left are forgotten
    start_delays(names[:10], 4.0, memo)
    assert set(memo) == set(names[:10])
    assert start_delays(names, 0.0, memo) == [0.0] * len(names)


async def test_the_third_cycle_on_starts_each_scrape_after_its_delay(ca: trustme.CA, monkeypatch):
    monkeypatch.setattr(scheduler, "STAGGER_PER_NODE", 0.4)  # 5 nodes: a 2 s window
    sim = SimulatedCluster(nodes=5, pods_per_node=2, containers_per_pod=1, seed=3, ca=ca, one_port_per_node=True,
                           token="kubelet-token")  # fmt: skip
    await sim.start()
    client = KubeletClient(
        KubeletClientConfig(
            use_node_status_port=True,
            preferred_address_types=("InternalIP",),
            extra_ca_pem=[ca.cert_pem.bytes().decode()],
            token_source=lambda: "kubelet-token",
        )
    )
    arrived: list[tuple[float, str]] = []

    def sink(batch: NodeBatch) -> None:
        arrived.append((time.monotonic(), batch.node))

    collector = Collector(StaticInventory(sim.inventory_objects()), client, sink, resolution=60.0, timeout=30.0)
    names = sim.node_names()
    delays = dict(zip(names, start_delays(names, 2.0, {}), strict=True))
    assert max(delays.values()) > 1.0  # the test means something only if some delay is long
    try:
        for cycle in range(3):
            arrived.clear()
            assert await collector.run_cycle() == 0
            assert sorted(node for _, node in arrived) == sorted(names)
            started = collector.last_cycle_started
            if cycle < 2:
                # not staggered: every node is in long before the longest delay (a generous bound)
                assert collector.last_cycle_seconds < max(delays.values())
            else:
                for at, node in arrived:  # never before its delay (asyncio's sleep is never short)
                    assert at - started >= delays[node] - 0.001, (node, at - started, delays[node])
    finally:
        await client.close()
        await sim.stop()
