"""The Prometheus bridge as the standalone pipeline and ``kcms server`` mount it, built from the flags
(``kcms.cmd.flags_sources.add_prometheus_flags``; docs/prometheus.md): the client, the
:class:`~kcms.apis.prometheus.provider.PrometheusProvider` (routed beside the store by
:func:`kcms.apis.routing.route`), its readiness report, and optionally
(``--resource-metrics-source prometheus``) the metrics.k8s.io feed from ``resourceRules``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

from kcms.apis.objects import ObjectLabels
from kcms.apis.prometheus.config import AdapterConfig, read_adapter_config
from kcms.apis.prometheus.provider import PrometheusProvider
from kcms.apis.prometheus.resource_source import PrometheusResources
from kcms.apis.provider import EVERYTHING
from kcms.model import Inventory
from kcms.sources.prometheus_api import PrometheusClient
from kcms.store.resource import ResourceStore

log = logging.getLogger(__name__)

__all__ = ["PrometheusBridge", "client_from_args"]


def client_from_args(args: argparse.Namespace) -> PrometheusClient:
    """A client from ``--prometheus-*``. Raises ValueError (bad URL, header, TLS files)."""
    headers: dict[str, str] = {}
    for header in getattr(args, "prometheus_header", []) or []:
        name, _, value = header.partition("=")
        headers[name.strip()] = value
    return PrometheusClient(
        args.prometheus_url,
        ca_file=args.prometheus_ca_file or None,
        cert_file=args.prometheus_client_cert or None,
        key_file=args.prometheus_client_key or None,
        insecure_skip_tls_verify=args.prometheus_insecure_skip_tls_verify,
        token_file=args.prometheus_token_file or None,
        headers=headers,
        timeout=args.prometheus_query_timeout,
        max_response_bytes=args.prometheus_max_response_bytes,
        method=args.prometheus_verb,
    )


def _config(args: argparse.Namespace) -> AdapterConfig | None:
    """The adapter config parsed at flag validation, or read now (in-process pipelines in tests)."""
    config = getattr(args, "adapter_config", None)
    if config is None and getattr(args, "config", ""):
        config = read_adapter_config(args.config)
    return config


class PrometheusBridge:
    """The bridge's running parts; ``from_args`` gives None without ``--prometheus-url``."""

    def __init__(
        self,
        client: PrometheusClient,
        config: AdapterConfig,
        *,
        relist_interval: float,
        max_age: float | None,
        objects: ObjectLabels | None = None,
        resources_from_prometheus: bool = False,
    ) -> None:
        self.client = client
        self.config = config
        self.provider = PrometheusProvider(
            client,
            config,
            relist_interval=relist_interval,
            max_age=max_age,
            object_names=None if objects is None else (lambda r, ns: objects.names(r, ns, EVERYTHING)),
        )
        self.resources_from_prometheus = resources_from_prometheus
        self.resources: PrometheusResources | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, objects: ObjectLabels | None) -> PrometheusBridge | None:
        if not getattr(args, "prometheus_url", ""):
            return None
        config = _config(args)
        if config is None:
            raise ValueError("--prometheus-url needs --config")
        return cls(
            client_from_args(args),
            config,
            relist_interval=args.metrics_relist_interval,
            max_age=args.metrics_max_age or None,
            objects=objects,
            resources_from_prometheus=args.resource_metrics_source == "prometheus",
        )

    def resource_feed(
        self, inventory: Inventory, store: ResourceStore, interval: float, on_cycle: Callable[[], None]
    ) -> PrometheusResources:
        """The metrics.k8s.io feed from ``resourceRules`` (it replaces the kubelet scrape loop)."""
        if self.config.resource_rules is None:
            raise ValueError("--resource-metrics-source prometheus needs resourceRules in --config")
        self.resources = PrometheusResources(
            self.client, self.config.resource_rules, store, inventory, interval=interval, on_cycle=on_cycle
        )
        return self.resources

    def add_checks(self, server: Any) -> None:
        """``prometheus-discovery`` in ``/readyz?verbose`` (reports, never fails readiness)."""
        server.add_check(
            "prometheus-discovery", self.provider.relist_check, livez=False, readyz=True, report=True
        )

    async def start(self) -> None:
        """The first relist (bounded by the query timeout), then the background relist."""
        await self.provider.start()
        log.info(
            "Prometheus source %s: %d custom and %d external metrics discovered",
            self.client.url,
            len(tuple(self.provider.list_metrics())),
            len(tuple(self.provider.list_external_metrics())),
        )

    async def stop(self) -> None:
        await self.provider.stop()
        await self.client.close()
