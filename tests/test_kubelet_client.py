"""The kubelet client against simulated kubelets: TLS trust, bearer tokens, size limits, endpoints."""

from __future__ import annotations

import pytest

from kcms.collector.kubelet import KubeletClient, KubeletClientConfig, ScrapeError, node_address
from kcms.kube.objects import node_from_json
from kcms.model import NodeInfo
from kcms.sim import SimulatedCluster


@pytest.fixture
async def sim(ca):
    cluster = SimulatedCluster(nodes=2, pods_per_node=3, containers_per_pod=2, seed=5, ca=ca, one_port_per_node=True,
                               token="kubelet-token")  # fmt: skip
    await cluster.start()
    yield cluster
    await cluster.stop()


def nodes_of(sim: SimulatedCluster) -> list[NodeInfo]:
    return [node_from_json(o) for o in sim.inventory_objects() if o["kind"] == "Node"]


def config(ca, **over) -> KubeletClientConfig:
    base = dict(
        use_node_status_port=True,
        preferred_address_types=("InternalIP",),
        extra_ca_pem=[ca.cert_pem.bytes().decode()],
        token_source=lambda: "kubelet-token",
    )
    base.update(over)
    return KubeletClientConfig(**base)


async def scrape(cfg: KubeletClientConfig, node: NodeInfo):
    client = KubeletClient(cfg)
    try:
        client.refresh_credentials()
        return await client.scrape(node)
    finally:
        await client.close()


async def test_token_from_source_is_sent_and_refreshed(sim, ca):
    node = nodes_of(sim)[0]
    batch = await scrape(config(ca), node)
    assert batch.node == node.name and batch.node_point is not None
    assert sum(len(c) for c in batch.pods.values()) == 6
    with pytest.raises(ScrapeError) as err:
        await scrape(config(ca, token_source=lambda: "stale"), node)
    assert err.value.reason == "http_401"
    tokens = iter(["stale", "kubelet-token"])
    client = KubeletClient(config(ca, token_source=lambda: next(tokens)))
    try:
        client.refresh_credentials()
        with pytest.raises(ScrapeError):
            await client.scrape(node)
        client.refresh_credentials()  # the next cycle sees the rotated token
        assert (await client.scrape(node)).node_point is not None
    finally:
        await client.close()


async def test_untrusted_kubelet_certificate_fails_unless_insecure(sim, ca):
    node = nodes_of(sim)[0]
    with pytest.raises(ScrapeError) as err:
        await scrape(config(ca, extra_ca_pem=[]), node)  # system CAs only: the simulator's CA is unknown
    assert err.value.reason == "tls"
    batch = await scrape(config(ca, extra_ca_pem=[], insecure_tls=True), node)
    assert batch.node_point is not None


async def test_oversized_body_is_refused(sim, ca):
    node = nodes_of(sim)[0]
    with pytest.raises(ScrapeError) as err:
        await scrape(config(ca, max_body_bytes=1000), node)
    assert err.value.reason == "too_large"


async def test_summary_endpoint_gives_the_same_containers(sim, ca):
    node = nodes_of(sim)[1]
    resource = await scrape(config(ca), node)
    summary = await scrape(config(ca, endpoint="summary"), node)
    assert summary.pods.keys() == resource.pods.keys()
    for key, containers in summary.pods.items():
        assert containers.keys() == resource.pods[key].keys()
        for name, point in containers.items():
            assert point.start_time == pytest.approx(resource.pods[key][name].start_time, abs=1.0)


async def test_failure_modes_are_scrape_errors(sim, ca):
    node = nodes_of(sim)[0]
    sim.set_node_mode(node.name, "error")
    with pytest.raises(ScrapeError) as err:
        await scrape(config(ca), node)
    assert err.value.reason == "http_500"
    sim.set_node_mode(node.name, "down")
    with pytest.raises(ScrapeError) as err:
        await scrape(config(ca), node)
    assert err.value.reason == "connection"


async def test_address_and_port_choice():
    node = NodeInfo(
        "n", {}, [("Hostname", "n.example"), ("InternalIP", "fd00::1"), ("ExternalIP", "1.2.3.4")], 10255, ""
    )
    assert node_address(node, ("InternalIP", "Hostname")) == "fd00::1"
    assert node_address(node, ("ExternalDNS", "ExternalIP")) == "1.2.3.4"
    assert node_address(node, ("InternalDNS",)) is None
    client = KubeletClient(KubeletClientConfig(preferred_address_types=("InternalIP",)))
    try:
        assert client.url(node) == "https://[fd00::1]:10250/metrics/resource"
        client.config.use_node_status_port = True
        assert client.url(node) == "https://[fd00::1]:10255/metrics/resource"
        client.config.preferred_address_types = ("InternalDNS",)
        with pytest.raises(ScrapeError) as err:
            client.url(node)
        assert err.value.reason == "no_address"
    finally:
        await client.close()
