"""`kcms server`: the aggregated API server as its own process.

Two ways to run it:

* **over stores** (multi-store and sharded modes): it holds no data; every request reads a quorum of
  `kcms store` replicas (:mod:`kcms.store.cluster`). Any number of servers can run side by side.
* **active-standby** (push mode, Koordinator's design): it keeps an in-process store fed by
  `kcms agent --push`; of the servers sharing the Lease, the holder serves and reports ready, the
  others answer 503 on pushes and are not ready (so a Service routes agents and the aggregator to
  the active one only). Nodes silent for ``--node-stale-after`` are not served and are listed on
  ``GET /push/v1/status``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

from kcms.apis import remote_write
from kcms.apis.custom import CustomMetricsAPI
from kcms.apis.external import ExternalMetricsAPI
from kcms.apis.metrics.api import MetricsAPI
from kcms.apis.objects import ObjectLabels
from kcms.apis.push import PushAPI, PushLimits
from kcms.apis.routing import route
from kcms.apiserver import AggregatedAPIServer
from kcms.cmd.standalone import KubeAccess, kube_access, serving_options
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# --resource-metrics-source prometheus in `kcms server` (no --metric-resolution there): seconds between
# resourceRules queries.
PROMETHEUS_RESOURCE_INTERVAL = 15.0


class ServerProcess:
    """An API server over stores, or an active-standby push server; see the module docstring."""

    def __init__(self, args: argparse.Namespace, access: KubeAccess, members: Any = None) -> None:
        self.args = args
        self.access = access
        self.inventory = access.inventory
        self.server = AggregatedAPIServer(
            serving_options(args), access.authn, access.authz, kube_client=access.authn_kube
        )
        objects = ObjectLabels(self.inventory, access.authn_kube)
        self.elector = None
        self.cluster = None
        self.provider: Any = None
        self._tasks: list[asyncio.Task] = []
        limits = PushLimits(
            max_series_total=args.push_max_series,
            max_series_per_metric=args.push_max_series_per_metric,
            max_series_per_writer=args.push_max_series_per_writer,
        )
        if args.active_standby:
            from kcms.apis.nodepush import NodePushAPI
            from kcms.apis.provider import StoreProvider
            from kcms.apis.quota import SeriesQuota
            from kcms.store.resource import ResourceStore
            from kcms.store.series import SeriesStore

            # readings arrive every push interval (agents' default 15 s); staleness is the push API's job
            self.resources = ResourceStore(15.0, max_age=max(args.node_stale_after, 30.0))
            self.series = SeriesStore(
                retention=args.series_retention,
                stale_after=args.series_stale_after,
                default_window=args.series_default_window,
            )
            self.provider = StoreProvider(self.series, objects.namespaced)
            metrics_store: Any = self.resources
            writer: Any = self.series
            if args.leader_elect:
                from kcms.cmd.flags_ha import leader_elector_factory

                self.elector = leader_elector_factory(args, access.kube)(self._started, self._stopped)
            active = self.elector.is_leader if self.elector is not None else (lambda: True)
            self.node_push = NodePushAPI(
                self.resources,
                self.series,
                active=active,
                node_stale_after=args.node_stale_after,
                inventory=self.inventory,  # pushes are checked against it: own node, pods on it
                quota=SeriesQuota(
                    max_total=args.node_push_max_series,
                    max_per_writer=args.node_push_max_series_per_node,
                    max_per_metric=args.node_push_max_series_per_metric or None,
                    ttl=args.series_retention,
                ),
                allow_namespaced=args.node_push_allow_namespaced_objects,
            )
            self.node_push.attach(self.server.app)  # its routes, and the stale-node sweep
            self.server.add_check(
                "leader",
                lambda: (True, "ok") if active() else (False, "standby: not holding the lease"),
                livez=False,
                readyz=True,
            )
        else:
            from kcms.apis.cluster_provider import ClusterProvider
            from kcms.apis.metrics.remote import RemoteResources
            from kcms.cmd.store import cluster_from_flags
            from kcms.store.sink import ClusterSink

            self.cluster = cluster_from_flags(args, members)
            self.provider = ClusterProvider(self.cluster, objects.namespaced, retention=args.series_retention)
            metrics_store = RemoteResources(self.cluster)
            self.sink = ClusterSink(self.cluster)
            writer = self.sink
            self.server.add_check("stores", self._stores_check, livez=False, readyz=True)
            self._store_state: tuple[bool, str] = (False, "stores not asked yet")
        self.bridge: Any = None  # the Prometheus bridge (docs/prometheus.md), with --prometheus-url
        self.resource_feed: Any = None
        available: dict[str, Any] = {"store": self.provider}
        if getattr(args, "prometheus_url", ""):
            from kcms.apis.prometheus.bridge import PrometheusBridge
            from kcms.store.resource import ResourceStore

            self.bridge = PrometheusBridge.from_args(args, objects)
            available["prometheus"] = self.bridge.provider
            self.bridge.add_checks(self.server)
            if self.bridge.resources_from_prometheus:  # metrics.k8s.io from resourceRules, in-process
                metrics_store = ResourceStore(PROMETHEUS_RESOURCE_INTERVAL)
                self.resource_feed = self.bridge.resource_feed(
                    self.inventory, metrics_store, PROMETHEUS_RESOURCE_INTERVAL, metrics_store.expire
                )
        self.server.install(MetricsAPI(self.inventory, metrics_store).group_version())
        # One source per metric: the first in --metric-sources order that lists it (kcms/apis/routing.py).
        served = route(getattr(args, "metric_sources", None), available)
        served.install(self.server)  # GET /debug/metric-sources
        for gv in CustomMetricsAPI([served], objects).group_versions():
            self.server.install(gv)
        self.server.install(ExternalMetricsAPI([served]).group_version())
        self.push = PushAPI(writer, limits, allow_nonresource_grant=args.push_allow_nonresource_grant)
        self.push.install(self.server)  # authorized per target by the handler, with the server's authorizer
        # Prometheus remote write in: authorized like pushes, sharing their series quota (docs/remote-write.md)
        remote_write.install_from_args(
            self.server, writer, args, quota=self.push.quota, namespaced=objects.namespaced
        )
        self.server.add_check(
            "informer-sync",
            lambda: (True, "ok") if self.inventory.has_synced() else (False, "nodes and pods not listed yet"),
            livez=False,
            readyz=True,
        )

    # ---- active-standby ---------------------------------------------------------------------------

    def _started(self) -> None:
        log.info("holding the lease: serving and accepting pushes")

    def _stopped(self) -> None:
        log.warning("lost the lease: standby (not ready, pushes refused)")

    # ---- over stores ------------------------------------------------------------------------------

    def _stores_check(self) -> tuple[bool, str]:
        return self._store_state

    async def _watch_stores(self) -> None:
        """Ready while a read quorum of stores reports ready (asked every 2 s)."""
        assert self.cluster is not None
        while True:
            ready = await self.cluster.ready_members()
            read, _ = self.cluster.quorum
            total = len(self.cluster.ring.members)
            if total and len(ready) >= read:
                self._store_state = (True, f"{len(ready)} of {total} stores ready")
            else:
                self._store_state = (False, f"{len(ready)} of {total} stores ready, {read} needed")
            await asyncio.sleep(2.0)

    # ---- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        from kcms.kube.inventory import KubeInventory

        if isinstance(self.inventory, KubeInventory):
            await self.inventory.start()
        if self.cluster is not None:
            self.sink.start()
            self.provider.start()
            self._tasks.append(asyncio.create_task(self._watch_stores(), name="kcms-server-stores"))
        else:
            self._tasks.append(asyncio.create_task(self._series_gc(), name="kcms-server-series-gc"))
        if self.elector is not None:
            self.elector.start()
        if self.bridge is not None:  # its first relist before serving
            await self.bridge.start()
        if self.resource_feed is not None:
            self.resource_feed.start()
        await self.server.start()

    async def _series_gc(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.series.collect_garbage(budget=10_000)

    async def stop(self) -> None:
        from kcms.kube.inventory import KubeInventory

        self.server.set_shutting_down()
        await self.server.stop()
        if self.resource_feed is not None:
            await self.resource_feed.stop()
        if self.bridge is not None:
            await self.bridge.stop()
        if self.elector is not None:
            await self.elector.stop()
        for task in self._tasks:
            await cancel_and_wait(task)
        if self.cluster is not None:
            await self.provider.stop()
            await self.sink.stop()
            await self.cluster.close()
        if isinstance(self.inventory, KubeInventory):
            await self.inventory.stop()


async def run_server(args: argparse.Namespace) -> int:
    access = await kube_access(
        args, need_kube=bool(args.active_standby and args.leader_elect or args.store_service)
    )
    if access is None:
        return 1
    members = None
    if not args.active_standby:
        from kcms.cmd.store import members_from_flags

        members = await members_from_flags(args, access.kube)
        await members.start()
    process = ServerProcess(args, access, members)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await process.start()
        log.info("serving on https://%s:%d", args.bind_address, process.server.port)
        await stop.wait()
    finally:
        await process.stop()
        if members is not None:
            await members.stop()
        await access.close()
    return 0
