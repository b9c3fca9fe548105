"""`kcms collector`: scrape kubelets and node agents, write to the stores by quorum.

One collector of a group leads at a time (a ``coordination.k8s.io/v1`` Lease, client-go's
timings); standbys are cold: they watch the inventory but neither scrape nor write. A leader that
cannot renew within the renew deadline stops writing at once (the sink's gate asks
``is_leader()`` before every send) and stops scraping; the next leader's first agent scrape
fetches the agents' 5-minute history, so the gap is refilled and stores drop the duplicates.

Health on a plain-HTTP port: ``/healthz`` (the process runs), ``/readyz`` (inventory synced; a
standby is ready too: it is ready to take over), ``/metrics``, and ``/status`` (JSON: leader or not,
what was written).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kcms.cmd.flags_ha import leader_elector_factory
from kcms.collector.agents import AgentCollector, agent_access
from kcms.collector.kubelet import KubeletClient
from kcms.collector.scheduler import Collector
from kcms.heap import HeapFreezer
from kcms.httpguard import GuardedRunner, GuardOptions
from kcms.selectors import parse_label_selector
from kcms.store.cluster import StoreCluster
from kcms.store.sink import ClusterSink

log = logging.getLogger(__name__)


class CollectorProcess:
    """The scrapers, the sink and (optionally) the election, started and stopped together."""

    def __init__(
        self,
        args: argparse.Namespace,
        inventory: Any,
        kubelets: KubeletClient,
        cluster: StoreCluster,
        kube: Any | None,
        elector_factory: Any | None = None,
    ) -> None:
        self.args = args
        self.inventory = inventory
        self.cluster = cluster
        self.kubelets = kubelets
        self.elector = None
        if elector_factory is not None:
            self.elector = elector_factory(self._started_leading, self._stopped_leading)
        gate = self.elector.is_leader if self.elector is not None else (lambda: True)
        self.sink = ClusterSink(cluster, gate=gate)
        selector = parse_label_selector(args.node_selector or "")
        heap = HeapFreezer()
        self.collector = Collector(
            inventory,
            kubelets,
            self.sink.store,
            resolution=args.metric_resolution,
            timeout=min(0.9 * args.metric_resolution, args.kubelet_request_timeout),
            max_in_flight=kubelets.config.max_in_flight,
            node_filter=None if selector.empty else (lambda n: selector.matches(n.labels)),
            on_cycle=heap.after_cycle,
        )
        self.agents: AgentCollector | None = None
        if args.agent_selector:
            self.agents = AgentCollector(
                kube,
                self.sink,
                selector=args.agent_selector,
                port=args.agent_port,
                interval=args.agent_scrape_interval,
                access=agent_access(args, kube),
                inventory=inventory,  # each agent's samples bound to its node (kcms/nodescope.py)
            )
        self.scraping = False
        self._switch = asyncio.Lock()
        self._runner: web.AppRunner | None = None
        self.health_port = 0

    # ---- leadership ------------------------------------------------------------------------------

    def _started_leading(self) -> None:
        asyncio.ensure_future(self._set_scraping(True))

    def _stopped_leading(self) -> None:
        dropped = self.sink.drop()  # stop writing at once, before the loops wind down
        log.warning("lost the lease: stopped writing (%d unsent items dropped)", dropped)
        asyncio.ensure_future(self._set_scraping(False))

    async def _set_scraping(self, on: bool) -> None:
        async with self._switch:
            if on == self.scraping:
                return
            self.scraping = on
            if on:
                log.info("scraping kubelets%s", " and agents" if self.agents else "")
                self.sink.start()
                self.collector.start()
                if self.agents is not None:
                    self.agents.start()
            else:
                await self.collector.stop()
                if self.agents is not None:
                    await self.agents.stop()
                    self.agents._since.clear()  # a later term starts from the agents' history
                await self.sink.stop()

    # ---- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        await self._serve_health()
        if self.elector is None:
            await self._set_scraping(True)
        else:
            self.elector.start()

    async def stop(self) -> None:
        # Scraping stops and what was scraped is sent while the Lease is still held; only then is
        # the Lease released, so a graceful handover loses nothing and never overlaps.
        await self._set_scraping(False)
        if self.elector is not None:
            await self.elector.stop()
        await self.kubelets.close()
        await self.cluster.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def is_leader(self) -> bool:
        return self.elector.is_leader() if self.elector is not None else True

    def status(self) -> dict[str, Any]:
        return {
            "leader": self.is_leader(),
            "holder": self.elector.leader if self.elector is not None else "",
            "scraping": self.scraping,
            "ackedSamples": self.sink.acked_samples,
            "ackedNodes": self.sink.acked_nodes,
            "failedWrites": self.sink.failed_writes,
            "kubeletCycles": self.collector.cycles,
            "agentCycles": self.agents.cycles if self.agents is not None else 0,
        }

    async def _serve_health(self) -> None:
        app = web.Application()

        async def healthz(_: web.Request) -> web.Response:
            if self.scraping:
                ok, why = self.collector.healthy()
                if not ok:
                    return web.Response(status=500, text=why)
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            if not self.inventory.has_synced():
                return web.Response(status=503, text="nodes and pods not listed yet")
            return web.Response(text="ok")

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def status(_: web.Request) -> web.Response:
            return web.Response(body=orjson.dumps(self.status()), content_type="application/json")

        app.router.add_get("/healthz", healthz)
        app.router.add_get("/livez", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/status", status)
        self._runner = GuardedRunner(app, GuardOptions(listener="collector"), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.args.health_bind_address, self.args.health_port, reuse_address=True
        )
        await site.start()
        self.health_port = self._runner.addresses[0][1]


async def run_collector(args: argparse.Namespace) -> int:
    from kcms.cmd.standalone import kubelet_config
    from kcms.cmd.store import cluster_from_flags, members_from_flags
    from kcms.kube.client import KubeClient, KubeConfigError
    from kcms.kube.inventory import KubeInventory, StaticInventory

    kube = None
    try:
        if not args.inventory_file or args.kubeconfig or args.leader_elect or args.store_service:
            kube = await KubeClient.load(args.kubeconfig or None)
    except KubeConfigError as e:
        log.error("%s", e)
        return 1
    if args.inventory_file:
        inventory = StaticInventory.from_file(args.inventory_file)
    else:
        # Node names of pods are needed only to bind agent samples to their node.
        inventory = KubeInventory(
            kube, node_selector=args.node_selector, pod_node_names=bool(args.agent_selector)
        )
    members = await members_from_flags(args, kube)
    cluster = cluster_from_flags(args, members)
    process = CollectorProcess(
        args,
        inventory,
        KubeletClient(kubelet_config(args, kube)),
        cluster,
        kube,
        leader_elector_factory(args, kube) if args.leader_elect else None,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await members.start()
        if isinstance(inventory, KubeInventory):
            await inventory.start(wait_for_pods=False)  # scraping needs only the nodes
        await process.start()
        log.info("collector health on http://%s:%d", args.health_bind_address, process.health_port)
        await stop.wait()
    finally:
        await process.stop()
        await members.stop()
        if isinstance(inventory, KubeInventory):
            await inventory.stop()
        if kube is not None:
            await kube.close()
    return 0
