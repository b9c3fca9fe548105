"""The collector's kubelet client against hostile kubelets: raw TLS servers on loopback that answer with
100 MB of headers, 100 000 header lines, a header that never ends, or a huge status line, scraped in
the same cycle as honest (simulated) kubelets. Each hostile node must fail alone, with its reason
counted, within bounded memory, while every honest node is scraped as usual. The agent collector's
aiohttp client gets the same hostile answers from fake agents next to simulated ones."""

from __future__ import annotations

import asyncio
import copy
import logging
import ssl
import tracemalloc
from collections.abc import Iterator

import pytest
import trustme
from prometheus_client import REGISTRY

from kcms.collector.agents import AgentAccess, AgentCollector
from kcms.collector.http11 import MAX_HEADER_BYTES, MAX_HEADERS
from kcms.collector.kubelet import KubeletClient, KubeletClientConfig
from kcms.collector.scheduler import Collector
from kcms.kube.inventory import StaticInventory
from kcms.model import NodeBatch
from kcms.sim import SimulatedCluster
from kcms.sim.agents import SimulatedAgents
from kcms.store.series import SeriesStore

MB = 1 << 20
PIECE = b"a" * 65536


def huge_headers() -> Iterator[bytes]:
    """100 MB of headers in 64 KiB lines (few lines: the byte bound, not the count, must stop it)."""
    yield b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
    for i in range(100 * MB // len(PIECE)):
        yield b"X-Pad-%d: " % i + PIECE + b"\r\n"
    yield b"Content-Length: 0\r\n\r\n"


def many_header_lines() -> Iterator[bytes]:
    """100 000 tiny header lines (~1 MB: the count must stop it long before the bytes)."""
    yield b"HTTP/1.1 200 OK\r\n"
    for start in range(0, 100_000, 1000):
        yield b"".join(b"X-%d: v\r\n" % i for i in range(start, start + 1000))
    yield b"Content-Length: 0\r\n\r\n"


def endless_header() -> Iterator[bytes]:
    """One header value that never ends (for as long as the connection is open)."""
    yield b"HTTP/1.1 200 OK\r\nX-Endless: "
    while True:
        yield PIECE


def huge_status_line() -> Iterator[bytes]:
    """A status line of 100 MB."""
    yield b"HTTP/1.1 200 "
    for _ in range(100 * MB // len(PIECE)):
        yield PIECE
    yield b"\r\nContent-Length: 0\r\n\r\n"


HOSTILE = {
    "huge-headers": (huge_headers, "headers_too_large"),
    "header-lines": (many_header_lines, "too_many_headers"),
    "endless-header": (endless_header, "headers_too_large"),
    "huge-status": (huge_status_line, "headers_too_large"),
}


class HostileKubelet:
    """A raw TLS server that answers every request with ``stream()``'s bytes, written as fast as the
    client reads them, until the stream ends or the client hangs up. Counts what it sent."""

    def __init__(self, stream, server_ctx: ssl.SSLContext | None) -> None:
        self.stream = stream
        self.ctx = server_ctx
        self.sent = 0
        self.requests = 0
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ctx)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            for piece in self.stream():
                if writer.transport.is_closing():
                    break
                writer.write(piece)
                self.sent += len(piece)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client hung up: what this test wants
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def node_object(template: dict, name: str, port: int) -> dict:
    node = copy.deepcopy(template)
    node["metadata"]["name"] = name
    node["status"]["addresses"] = [{"type": "InternalIP", "address": "127.0.0.1"}]
    node["status"]["daemonEndpoints"] = {"kubeletEndpoint": {"Port": port}}
    return node


def failures(node: str, reason: str) -> float:
    value = REGISTRY.get_sample_value("kcms_kubelet_scrape_failures_total", {"node": node, "reason": reason})
    return value or 0.0


@pytest.fixture
async def sim(ca):
    cluster = SimulatedCluster(nodes=3, pods_per_node=3, containers_per_pod=2, seed=11, ca=ca, one_port_per_node=True,
                               token="kubelet-token")  # fmt: skip
    await cluster.start()
    yield cluster
    await cluster.stop()


async def test_hostile_kubelets_fail_alone_within_bounded_memory(sim, ca: trustme.CA, caplog) -> None:
    caplog.set_level(logging.INFO)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    hostile = {name: HostileKubelet(stream, server_ctx) for name, (stream, _) in HOSTILE.items()}
    for kubelet in hostile.values():
        await kubelet.start()
    objects = sim.inventory_objects()
    template = next(o for o in objects if o["kind"] == "Node")
    honest = [o["metadata"]["name"] for o in objects if o["kind"] == "Node"]
    objects += [node_object(template, f"hostile-{n}", k.port) for n, k in hostile.items()]
    client = KubeletClient(
        KubeletClientConfig(
            use_node_status_port=True,
            preferred_address_types=("InternalIP",),
            extra_ca_pem=[ca.cert_pem.bytes().decode()],
            token_source=lambda: "kubelet-token",
        )
    )
    stored: list[NodeBatch] = []
    collector = Collector(StaticInventory(objects), client, stored.append, resolution=60.0, timeout=30.0)
    before = {n: failures(f"hostile-{n}", reason) for n, (_, reason) in HOSTILE.items()}
    tracemalloc.start()
    try:
        peaks = []
        for cycle in range(2):  # twice: a hostile node fails the same way again, nothing piles up
            tracemalloc.reset_peak()
            assert await collector.run_cycle() == len(HOSTILE)
            peaks.append(tracemalloc.get_traced_memory()[1])
            assert sorted(b.node for b in stored) == sorted(honest), cycle
            assert all(b.node_point is not None and b.pods for b in stored)
            stored.clear()
    finally:
        tracemalloc.stop()
        await client.close()
        for kubelet in hostile.values():
            await kubelet.stop()

    for name, (_, reason) in HOSTILE.items():
        assert failures(f"hostile-{name}", reason) - before[name] == 2, (name, reason)
        assert hostile[name].requests == 2  # one request a cycle: the failed connection was not reused
    sent = {n: k.sent / MB for n, k in hostile.items()}
    print(f"hostile kubelets: MiB sent before the client hung up {sent}; peak traced memory a cycle "
          f"{[round(p / MB, 1) for p in peaks]} MiB (bound {MAX_HEADER_BYTES / MB:.0f} MiB of headers, "
          f"{MAX_HEADERS} fields)")  # fmt: skip
    # what the client held: at most the header bound per hostile connection (plus one TLS record and
    # the copy httptools makes of a growing value), never the 100 MB offered
    assert max(peaks) < len(HOSTILE) * 3 * MAX_HEADER_BYTES, peaks
    assert not any(r.exc_info for r in caplog.records) and "Traceback" not in caplog.text
    failed_lines = [r.getMessage() for r in caplog.records if "hostile-" in r.getMessage()]
    assert len(failed_lines) == 2 * len(HOSTILE)  # one line per failed scrape
    assert all(len(line) < 1000 for line in failed_lines)


async def test_header_bounds_are_exact_for_an_honest_looking_response(ca: trustme.CA) -> None:
    """A response just under both bounds is read; one field more, or one line that crosses the byte
    bound, is refused: the bounds are where the documentation says."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    body = b"# no samples\n"

    def fields(n: int, pad: int = 0) -> Iterator[bytes]:
        yield b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body)
        for i in range(n - 1):
            yield b"X-%d: %s\r\n" % (i, b"p" * pad)
        yield b"\r\n" + body

    from kcms.collector.http11 import HTTPError, KeepAlivePool

    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    pool = KeepAlivePool(client_ctx, max_body_bytes=1 << 20)
    cases = [
        (lambda: fields(MAX_HEADERS), None),
        (lambda: fields(MAX_HEADERS + 1), "too_many_headers"),
        (lambda: fields(40, pad=MAX_HEADER_BYTES // 50), None),  # ~0.8 MiB of headers
        (lambda: fields(60, pad=MAX_HEADER_BYTES // 50), "headers_too_large"),  # ~1.2 MiB
    ]
    try:
        for stream, reason in cases:
            kubelet = HostileKubelet(stream, server_ctx)
            await kubelet.start()
            try:
                if reason is None:
                    assert await pool.get("127.0.0.1", kubelet.port, "/metrics/resource", {}) == (200, body)
                else:
                    with pytest.raises(HTTPError) as err:
                        await pool.get("127.0.0.1", kubelet.port, "/metrics/resource", {})
                    assert err.value.reason == reason
            finally:
                await kubelet.stop()
    finally:
        pool.close()


async def test_hostile_agents_fail_alone_within_bounded_memory(caplog) -> None:
    """The same four answers from fake agents (plain HTTP, as simulated agents serve) next to
    simulated agents: aiohttp's parser limits on the collector's session (8190-byte lines, 128
    fields) cut each one off; the honest agents' samples are stored."""
    caplog.set_level(logging.INFO)
    cluster = SimulatedCluster(nodes=2, pods_per_node=2, containers_per_pod=1, seed=3, one_port_per_node=True)
    hostile = {name: HostileKubelet(stream, None) for name, (stream, _) in HOSTILE.items()}
    for agent in hostile.values():
        await agent.start()
    async with SimulatedAgents(cluster, period=3600.0, buffer_seconds=3600.0) as agents:
        honest = list(agents.targets())
        targets = honest + [(f"hostile/{n}", f"127.0.0.1:{a.port}") for n, a in hostile.items()]
        store = SeriesStore()
        collector = AgentCollector(
            None,
            store,
            selector="",
            targets=lambda: targets,
            timeout=30.0,
            access=AgentAccess(insecure_http=True),
        )
        before = {
            n: REGISTRY.get_sample_value(
                "kcms_agent_scrape_failures_total", {"target": f"hostile/{n}", "reason": "connection"}
            )
            or 0.0
            for n in HOSTILE
        }
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            assert await collector.run_cycle() == len(HOSTILE)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            await collector.stop()
            for agent in hostile.values():
                await agent.stop()
        assert collector.stored > 0 and store.stats()["series"] > 0
        for name in HOSTILE:
            after = REGISTRY.get_sample_value(
                "kcms_agent_scrape_failures_total", {"target": f"hostile/{name}", "reason": "connection"}
            )
            assert after == before[name] + 1, name
    print(
        f"hostile agents: peak traced memory {peak / MB:.1f} MiB; MiB sent {[round(a.sent / MB, 1) for a in hostile.values()]}"
    )
    assert peak < 32 * MB, peak  # 100 MB offered by each of four agents, none of it kept
    assert not any(r.exc_info for r in caplog.records) and "Traceback" not in caplog.text
