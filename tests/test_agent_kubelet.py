"""The agent's kubelet source against a simulated kubelet over TLS, into the agent's buffer."""

from __future__ import annotations

import asyncio
import time

import pytest

from kcms.agent.buffer import SampleBuffer
from kcms.agent.kubelet import KubeletSource
from kcms.collector.kubelet import KubeletClient, KubeletClientConfig
from kcms.kube.objects import node_from_json
from kcms.sim import SimulatedCluster
from kcms.sources.exposition import parse_exposition


async def test_kubelet_readings_become_prefixed_series(ca):
    sim = SimulatedCluster(
        nodes=1, pods_per_node=2, containers_per_pod=2, seed=3, ca=ca, one_port_per_node=True
    )
    await sim.start()
    node = next(node_from_json(o) for o in sim.inventory_objects() if o["kind"] == "Node")
    client = KubeletClient(
        KubeletClientConfig(
            use_node_status_port=True,
            preferred_address_types=("InternalIP",),
            extra_ca_pem=[ca.cert_pem.bytes().decode()],
        )
    )
    source = KubeletSource(client, node)
    buffer = SampleBuffer()
    try:
        first = await source.collect(time.time())
        assert buffer.add_many(first) == len(first) == 2 + 2 * 2 * 2
        sim.set_node_mode(node.name, "error")
        assert await source.collect(time.time()) == [] and source.errors == {"http_500": 1}
        sim.set_node_mode(node.name, "ok")
        await asyncio.sleep(0.2)  # a later kubelet timestamp (they are in milliseconds)
        second = await source.collect(time.time())
        samples, rejected = parse_exposition(buffer.render(None))
        assert not rejected
        names = {m for m, *_ in samples}
        assert names == {
            "kubelet_node_cpu_usage_seconds_total",
            "kubelet_node_memory_working_set_bytes",
            "kubelet_container_cpu_usage_seconds_total",
            "kubelet_container_memory_working_set_bytes",
        }
        # The rate between the two readings is the simulator's true node rate.
        cpu = {s[3]: s[4] for s in first + second if s[0] == "kubelet_node_cpu_usage_seconds_total"}
        (t0, v0), (t1, v1) = sorted(cpu.items())
        assert (v1 - v0) / (t1 - t0) == pytest.approx(sim.true_node_rate(node.name), rel=0.01)
        pods = {(o.namespace, o.name) for _, o, labels, _, _ in samples if o.resource == "pods"}
        assert pods == {(p.namespace, p.name) for p in sim.nodes[0].pods}
    finally:
        await source.close()
        await sim.stop()
