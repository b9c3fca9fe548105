"""Running a store replica (`kcms store`) and building store clusters from flags."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import ssl
from typing import Any

from aiohttp import web

from kcms.heap import HeapFreezer
from kcms.httpguard import GuardedRunner, GuardOptions
from kcms.store import wire
from kcms.store.client import StoreClient, StoreError, client_ssl_context
from kcms.store.cluster import StoreCluster
from kcms.store.resource import ResourceStore
from kcms.store.ring import Ring
from kcms.store.series import SeriesStore
from kcms.store.service import StoreService, TokenFile
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def default_store_name() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()


async def members_from_flags(args: argparse.Namespace, kube: Any | None) -> Any:
    """The membership source the flags name: a static list or a Service's EndpointSlices."""
    from kcms.kube.members import EndpointSliceMembers, StaticMembers, parse_static_members

    if args.store_endpoints:
        return StaticMembers(parse_static_members(args.store_endpoints))
    if args.store_service:
        namespace, _, service = args.store_service.partition("/")
        if kube is None:
            raise ValueError("--store-service needs Kubernetes access (--kubeconfig or in-cluster)")
        return EndpointSliceMembers(
            kube, namespace, service, port_name=args.store_port_name, scheme=args.store_scheme
        )
    return StaticMembers([])


def tls_name_from_flags(args: argparse.Namespace) -> Any:
    """With ``--store-service NS/NAME`` stores are reached at pod IPs; their certificates name the
    pods' stable DNS names, ``<pod>.<NAME>.<NS>.svc`` (a StatefulSet behind a headless Service)."""
    if not args.store_service:
        return None
    namespace, _, service = args.store_service.partition("/")
    return lambda member: f"{member}.{service}.{namespace}.svc"


def cluster_from_flags(args: argparse.Namespace, members: Any) -> StoreCluster:
    token = TokenFile(args.store_token_file) if args.store_token_file else None
    return StoreCluster(
        members,
        replicas=args.replicas,
        write_quorum=args.write_quorum,
        read_quorum=args.read_quorum,
        token=(token.read if token is not None else lambda: None),
        ca_file=args.store_ca_file or None,
        timeout=args.store_timeout,
        retries=args.store_retries,
        grace=args.store_quorum_grace,
        hedge=args.store_hedge_delay or None,
        tls_name=tls_name_from_flags(args),
    )


class StoreReplica:
    """A store replica: the service, its membership, refill, and retention."""

    def __init__(self, args: argparse.Namespace, members: Any) -> None:
        self.args = args
        self.name = args.store_name or default_store_name()
        self.members = members
        self.token = TokenFile(args.token_file)
        self.resources = ResourceStore(args.metric_resolution)
        self.series = SeriesStore(
            retention=args.series_retention,
            stale_after=args.series_stale_after,
            default_window=args.series_default_window,
        )
        self.service = StoreService(
            self.name, self.resources, self.series, self.token.read, max_request_bytes=args.max_request_bytes
        )
        # Peers are asked with the same token this replica accepts (one shared Secret).
        self.peers = StoreCluster(
            members,
            replicas=args.replicas,
            token=self.token.read,
            ca_file=args.store_ca_file or None,
            timeout=args.refill_timeout,
            retries=0,
            tls_name=tls_name_from_flags(args),
        )
        self._tasks: list[asyncio.Task] = []
        self._runner: web.AppRunner | None = None
        self._known: tuple[str, ...] | None = None
        self._refill_lock = asyncio.Lock()
        self.port = 0

    async def start(self) -> None:
        args = self.args
        ssl_ctx = None
        if args.tls_cert_file:
            ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_ctx.load_cert_chain(args.tls_cert_file, args.tls_private_key_file)
        self._runner = GuardedRunner(
            self.service.app, GuardOptions(listener="store"), access_log=None, handle_signals=False
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, args.bind_address, args.port, ssl_context=ssl_ctx, reuse_address=True
        )
        await site.start()
        self.port = self._runner.addresses[0][1]
        if hasattr(self.members, "start"):
            await self.members.start()
        self._tasks.append(asyncio.create_task(self._first_refill(), name="kcms-store-refill"))
        self._tasks.append(asyncio.create_task(self._retention(), name="kcms-store-retention"))

    async def stop(self) -> None:
        for task in self._tasks:
            await cancel_and_wait(task)
        if hasattr(self.members, "stop"):
            await self.members.stop()
        await self.peers.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def _names(self) -> tuple[str, ...]:
        """The members, this replica included: with EndpointSlices a replica is not listed until
        it is ready, and it must refill before it is ready."""
        return tuple(sorted({m.name for m in self.members.members()} | {self.name}))

    async def _first_refill(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.args.refill_timeout
        while True:
            peers = [n for n in self._names() if n != self.name]
            if not peers:
                break
            copied = await self.refill(None)
            if copied or loop.time() >= deadline:
                break
            await asyncio.sleep(min(1.0, max(0.0, deadline - loop.time())))
        self._known = self._names()
        self.service.ready = True
        log.info("store %s ready (%d series)", self.name, self.series.stats()["series"])
        while True:  # later membership changes: copy the keys this replica newly owns
            await asyncio.sleep(1.0)
            now = self._names()
            if now != self._known:
                before, self._known = self._known, now
                await self.refill(list(before))

    async def refill(self, previous: list[str] | None) -> bool:
        """Copy from every peer the keys the ring gives this replica (with ``previous``: only those
        it did not own under that membership). True when at least one peer answered."""
        async with self._refill_lock:
            self.peers._refresh()
            ring = Ring(self._names(), self.args.replicas)
            req = wire.ExportRequest(
                owner=self.name,
                members=list(ring.members),
                replicas=self.args.replicas,
                previous_members=previous,
            )
            peers = [n for n in ring.members if n != self.name]

            async def one(client: StoreClient) -> int:
                data = await client.export(req, deadline=self.args.refill_timeout)
                ack = self.service.apply(data)
                return len(data.series) + len(data.history) + ack.samples

            answers, errors = await self.peers._gather(peers, one)
            for name, err in errors.items():
                log.warning("refill from %s failed: %s", name, err)
            if answers:
                log.info(
                    "store %s copied %d series/nodes from %s",
                    self.name,
                    sum(answers.values()),
                    ", ".join(answers),
                )
            return bool(answers)

    async def _retention(self) -> None:
        """Custom series: 10 000 series a second; node readings: once a resolution. The heap's
        survivors are frozen every second (see kcms/heap.py): with the collector's default
        thresholds a profiled store spent 3.35 of 8.4 CPU-seconds in full collections of ~53 ms
        each while ingesting, which was also its query p99."""
        ticks = 0
        heap = HeapFreezer()
        while True:
            await asyncio.sleep(1.0)
            heap.after_cycle()
            self.series.collect_garbage(budget=10_000)
            ticks += 1
            if ticks % max(1, int(self.args.metric_resolution)) == 0:
                self.resources.expire()


async def run_store(args: argparse.Namespace) -> int:
    kube = None
    if args.store_service:
        from kcms.kube.client import KubeClient, KubeConfigError

        try:
            kube = await KubeClient.load(args.kubeconfig or None)
        except KubeConfigError as e:
            log.error("%s", e)
            return 1
    try:
        members = await members_from_flags(args, kube)
        replica = StoreReplica(args, members)
    except (ValueError, OSError) as e:
        log.error("%s", e)
        return 1
    # Writes allocate a tuple or two per sample, freed by reference counting; the default first
    # threshold (700) ran a young collection every few hundred samples. With this, the frozen heap
    # (below) and SeriesStore's string-keyed appends, one store went from 305k to 589k acknowledged
    # samples/s in bench/scaleout.py (two writers, 2 cores), and named-query p99 from 54 to 11 ms.
    gc.set_threshold(100_000, 50, 100)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await replica.start()
        scheme = "https" if args.tls_cert_file else "http"
        log.info("store %s serving on %s://%s:%d", replica.name, scheme, args.bind_address, replica.port)
        await stop.wait()
    finally:
        await replica.stop()
        if kube is not None:
            await kube.close()
    return 0


__all__ = [
    "StoreClient",
    "StoreError",
    "StoreReplica",
    "client_ssl_context",
    "cluster_from_flags",
    "members_from_flags",
    "run_store",
]
