"""`kcms standalone`: kubelet collector, resource store and API server in one process (the kubelet
scrapes optionally in child processes: ``--scrape-workers``, kcms/collector/scrapeloop.py)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from dataclasses import dataclass
from typing import Any

from kcms.apis import remote_write
from kcms.apis.custom import CustomMetricsAPI
from kcms.apis.external import ExternalMetricsAPI
from kcms.apis.history import HistoryAPI
from kcms.apis.history.series import SeriesHistory
from kcms.apis.metrics.api import MetricsAPI
from kcms.apis.objects import ObjectLabels, guess_info
from kcms.apis.provider import StoreProvider
from kcms.apis.push import PushAPI, PushLimits
from kcms.apis.routing import route
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions
from kcms.collector.agents import AgentCollector, agent_access
from kcms.collector.kubelet import KubeletClient, KubeletClientConfig
from kcms.collector.scrapeloop import ScrapeLoop, scrape_loop
from kcms.heap import HeapFreezer
from kcms.model import Inventory
from kcms.selectors import parse_label_selector
from kcms.store.history import HistoryStore
from kcms.store.resource import ResourceStore
from kcms.store.series import SeriesStore
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def kubelet_config(
    args: argparse.Namespace, kube=None, extra_ca_pem: list[str] | None = None
) -> KubeletClientConfig:
    """Kubelet client settings from the flags; credentials default to the kubeconfig's, as in metrics-server."""
    cert = args.kubelet_client_certificate or None
    key = args.kubelet_client_key or None
    token_source = None
    ca = args.kubelet_certificate_authority or None
    if kube is not None:
        if cert is None and kube.client_cert_files() is not None:
            cert, key = kube.client_cert_files()
        if cert is None:
            token_source = kube.bearer_token  # re-read every cycle: tokens rotate
    return KubeletClientConfig(
        port=args.kubelet_port,
        use_node_status_port=args.kubelet_use_node_status_port,
        preferred_address_types=tuple(args.kubelet_preferred_address_types),
        insecure_tls=args.kubelet_insecure_tls,
        ca_file=ca,
        client_cert_file=cert,
        client_key_file=key,
        token_source=token_source,
        endpoint=args.kubelet_endpoint,
        max_body_bytes=args.kubelet_max_body_bytes,
        max_in_flight=args.kubelet_max_in_flight,
        extra_ca_pem=list(extra_ca_pem or []),
    )


@dataclass
class Pipeline:
    """The running parts of a standalone process."""

    inventory: Inventory
    store: ResourceStore
    kubelets: KubeletClient
    collector: ScrapeLoop
    server: AggregatedAPIServer
    series: SeriesStore
    push: PushAPI
    agents: AgentCollector | None = None
    bridge: Any = None  # the Prometheus bridge (kcms/apis/prometheus/bridge.py), with --prometheus-url
    _gc: asyncio.Task | None = None

    async def start(self) -> None:
        self.collector.start()
        if self.agents is not None:
            self.agents.start()
        self._gc = asyncio.create_task(self._collect_series_garbage(), name="kcms-series-gc")
        if self.bridge is not None:  # its first relist before serving: discovery has its metrics at once
            await self.bridge.start()
        await self.server.start()

    async def stop(self) -> None:
        self.server.set_shutting_down()
        await self.server.stop()
        if self.bridge is not None:
            await self.bridge.stop()
        await self.collector.stop()
        if self.agents is not None:
            await self.agents.stop()
        await cancel_and_wait(self._gc)
        await self.kubelets.close()

    async def _collect_series_garbage(self) -> None:
        """Retention for custom series: bounded steps at a cadence that follows the store's size
        (one every 30 s while it is small or empty, one a second at a million series); see
        SeriesStore.gc_interval."""
        await self.series.collect_garbage_forever()


def build_pipeline(
    args: argparse.Namespace,
    inventory: Inventory,
    kubelets: KubeletClient,
    serving: ServingOptions,
    authn: AuthnOptions,
    authz: AuthzOptions,
    kube_client=None,
    agent_targets=None,
) -> Pipeline:
    """Wire the parts; ``agent_targets`` (a callable of (name, "host:port")) replaces agent discovery."""
    resolution = args.metric_resolution
    store = ResourceStore(resolution)
    selector = parse_label_selector(getattr(args, "node_selector", "") or "")
    # --history: every stored scrape is recorded too (kcms/store/history.py); 0: off
    history = HistoryStore(args.history, resolution) if getattr(args, "history", 0) > 0 else None
    store.history = history

    heap = HeapFreezer()

    def after_cycle() -> None:
        store.expire()
        if history is not None:
            history.expire(present=inventory.node)
        store.publish_stats()
        heap.after_cycle()

    # --scrape-workers: in this process (0), in N child processes, or auto (kcms/collector/scrapeloop.py)
    collector = scrape_loop(
        getattr(args, "scrape_workers", 0),
        inventory,
        kubelets,
        store.store,
        resolution=resolution,
        timeout=min(0.9 * resolution, args.kubelet_request_timeout),
        node_filter=None if selector.empty else (lambda n: selector.matches(n.labels)),
        on_cycle=after_cycle,
    )
    objects = ObjectLabels(inventory, kube_client)
    bridge = None
    if getattr(args, "prometheus_url", ""):  # the Prometheus bridge (docs/prometheus.md)
        from kcms.apis.prometheus.bridge import PrometheusBridge

        bridge = PrometheusBridge.from_args(args, objects)
        if bridge is not None and bridge.resources_from_prometheus:  # metrics.k8s.io from resourceRules
            collector = bridge.resource_feed(inventory, store, resolution, after_cycle)
    series = SeriesStore(
        retention=args.series_retention,
        stale_after=args.series_stale_after,
        default_window=args.series_default_window,
    )
    server = AggregatedAPIServer(serving, authn, authz, kube_client=kube_client)
    server.install(MetricsAPI(inventory, store).group_version())
    if history is not None:
        scrapes = collector if hasattr(collector, "status") else None  # a kubelet scrape loop
        kinds = lambda r: objects.cached_info(r) or guess_info(r)  # noqa: E731 (describedObject kinds)
        series_history = SeriesHistory(series, history, kinds)  # custom/external series kept here
        server.install(HistoryAPI(inventory, history, scrapes, series_history).group_version())
    # custom.metrics.k8s.io and external.metrics.k8s.io over the series store: one server for
    # all three groups (Kubernetes allows one backend per group; here they share one process).
    provider = StoreProvider(series, objects.namespaced)
    # One source per metric: the first in --metric-sources order that lists it (kcms/apis/routing.py).
    available: dict[str, Any] = {"store": provider}
    if bridge is not None:
        available["prometheus"] = bridge.provider
        bridge.add_checks(server)
    served = route(getattr(args, "metric_sources", None), available)
    served.install(server)  # GET /debug/metric-sources
    for gv in CustomMetricsAPI([served], objects).group_versions():
        server.install(gv)
    server.install(ExternalMetricsAPI([served]).group_version())
    push = PushAPI(
        series,
        PushLimits(
            max_series_total=args.push_max_series,
            max_series_per_metric=args.push_max_series_per_metric,
            max_series_per_writer=args.push_max_series_per_writer,
        ),
        allow_nonresource_grant=args.push_allow_nonresource_grant,
    )
    push.install(server)  # authorized per target by the handler, with the server's authorizer
    # Prometheus remote write in: authorized like pushes, sharing their series quota (docs/remote-write.md)
    remote_write.install_from_args(server, series, args, quota=push.quota, namespaced=objects.namespaced)
    server.add_check("metric-collection-timely", collector.healthy, livez=True, readyz=False)
    server.add_check("nodes-scraped", collector.missing_check, livez=False, readyz=True, report=True)
    server.add_check(
        "metric-storage-ready",
        lambda: (True, "ok") if store.ready() else (False, "no metrics scraped yet"),
        livez=False,
        readyz=True,
    )
    server.add_check(
        "informer-sync",
        lambda: (True, "ok") if inventory.has_synced() else (False, "nodes and pods not listed yet"),
        livez=False,
        readyz=True,
    )
    agents = None
    if agent_targets is not None or getattr(args, "agent_selector", ""):
        agents = AgentCollector(
            kube_client,
            series,
            selector=args.agent_selector,
            port=args.agent_port,
            interval=args.agent_scrape_interval,
            targets=agent_targets,
            access=agent_access(args, kube_client),
            inventory=inventory,  # each agent's samples bound to its node (kcms/nodescope.py)
        )
        server.add_check("agent-collection-timely", agents.healthy, livez=True, readyz=False)
    return Pipeline(inventory, store, kubelets, collector, server, series, push, agents, bridge)


def serving_options(args: argparse.Namespace) -> ServingOptions:
    return ServingOptions(
        secure_port=args.secure_port,
        bind_address=args.bind_address,
        cert_dir=args.cert_dir,
        tls_cert_file=args.tls_cert_file,
        tls_private_key_file=args.tls_private_key_file,
        tls_min_version=args.tls_min_version,
        request_header_timeout=args.request_header_timeout,
        max_requests_inflight=args.max_requests_inflight,
        max_mutating_requests_inflight=args.max_mutating_requests_inflight,
        executing_requests=args.max_executing_requests,
    )


@dataclass
class KubeAccess:
    """The Kubernetes clients and the delegated authentication/authorization built from the flags."""

    kube: Any
    authn_kube: Any
    authz_kube: Any
    inventory: Any
    authn: AuthnOptions
    authz: AuthzOptions

    async def close(self) -> None:
        for client in {c for c in (self.kube, self.authn_kube, self.authz_kube) if c is not None}:
            await client.close()


async def kube_access(args: argparse.Namespace, need_kube: bool = False) -> KubeAccess | None:
    """Load kubeconfigs and build the inventory and auth options; None (logged) on a bad kubeconfig."""
    from kcms.kube.client import KubeClient, KubeConfigError
    from kcms.kube.inventory import KubeInventory, StaticInventory
    from kcms.kube.reviews import AccessReviewer, TokenReviewer

    kube = authn_kube = authz_kube = None
    try:
        if not args.inventory_file or args.kubeconfig or need_kube:
            kube = await KubeClient.load(args.kubeconfig or None)
        if args.authentication_kubeconfig:
            authn_kube = await KubeClient.load(args.authentication_kubeconfig)
        if args.authorization_kubeconfig:
            authz_kube = await KubeClient.load(args.authorization_kubeconfig)
    except KubeConfigError as e:
        log.error("%s", e)
        return None
    authn_kube = authn_kube or kube
    authz_kube = authz_kube or kube

    if args.inventory_file:
        inventory = StaticInventory.from_file(args.inventory_file)
    else:
        # Pods as metadata only (PartialObjectMetadata, as metrics-server lists them: ~3x fewer
        # bytes and half the CPU of the first list at 150 000 pods) unless something binds pods to
        # their node: agent scrapes (standalone --agent-selector) and node pushes (kcms server).
        needs_node_names = bool(getattr(args, "agent_selector", "") or getattr(args, "active_standby", False))
        inventory = KubeInventory(
            kube, node_selector=getattr(args, "node_selector", ""), pod_node_names=needs_node_names
        )
    authn = AuthnOptions(
        client_ca_file=args.client_ca_file,
        requestheader_client_ca_file=args.requestheader_client_ca_file,
        requestheader_allowed_names=args.requestheader_allowed_names,
        requestheader_username_headers=args.requestheader_username_headers,
        requestheader_group_headers=args.requestheader_group_headers,
        requestheader_extra_headers_prefix=args.requestheader_extra_headers_prefix,
        skip_lookup=args.authentication_skip_lookup or authn_kube is None,
        token_reviewer=TokenReviewer(authn_kube) if authn_kube is not None else None,
    )
    authz = AuthzOptions(
        access_reviewer=AccessReviewer(authz_kube) if authz_kube is not None else None,
        always_allow_paths=args.authorization_always_allow_paths,
    )
    return KubeAccess(kube, authn_kube, authz_kube, inventory, authn, authz)


async def run_standalone(args: argparse.Namespace) -> int:
    from kcms.kube.inventory import KubeInventory

    access = await kube_access(args)
    if access is None:
        return 1
    kube, authn_kube, inventory = access.kube, access.authn_kube, access.inventory
    authn, authz = access.authn, access.authz
    kubelets = KubeletClient(kubelet_config(args, kube))
    pipeline = build_pipeline(
        args, inventory, kubelets, serving_options(args), authn, authz, kube_client=authn_kube
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if isinstance(inventory, KubeInventory):
            # Scraping needs only the nodes: the first cycle starts while the pods are still being
            # listed (readiness still waits for both).
            await inventory.start(wait_for_pods=False)
        await pipeline.start()
        log.info("serving metrics.k8s.io on https://%s:%d", args.bind_address, pipeline.server.port)
        await stop.wait()
    finally:
        await pipeline.stop()
        if isinstance(inventory, KubeInventory):
            await inventory.stop()
        await access.close()
    return 0
