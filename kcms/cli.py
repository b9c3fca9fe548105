"""The one `kcms` command: a sub-command per component.

Flags that mean what a metrics-server flag means have its name and default.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from kcms import __version__, limits
from kcms.flags import csv_list, parse_duration, port, positive_int

ADDRESS_TYPES = ("Hostname", "InternalDNS", "InternalIP", "ExternalDNS", "ExternalIP")
TLS_VERSIONS = ("VersionTLS12", "VersionTLS13")  # TLS 1.0 and 1.1 are off in OpenSSL 3 anyway


def _address_types(text: str) -> list[str]:
    types = csv_list(text)
    bad = [t for t in types if t not in ADDRESS_TYPES]
    if bad or not types:
        raise argparse.ArgumentTypeError(
            f"unknown address type(s) {','.join(bad) or '(none)'}; allowed: {','.join(ADDRESS_TYPES)}"
        )
    return types


def add_kubelet_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("kubelet scraping (metrics-server flags)")
    g.add_argument(
        "--metric-resolution",
        type=parse_duration,
        default=15.0,
        metavar="DURATION",
        help="how often metrics are scraped from kubelets; at least 10s (default 15s)",
    )
    g.add_argument(
        "--kubelet-port", type=port, default=10250, help="the port kubelets serve on (default 10250)"
    )
    g.add_argument(
        "--kubelet-use-node-status-port",
        action="store_true",
        help="use the port in the node's status.daemonEndpoints instead of --kubelet-port",
    )
    g.add_argument(
        "--kubelet-preferred-address-types",
        type=_address_types,
        default=list(ADDRESS_TYPES),
        metavar="TYPES",
        help="node address types to connect to, in order "
        "(default Hostname,InternalDNS,InternalIP,ExternalDNS,ExternalIP)",
    )
    g.add_argument(
        "--kubelet-insecure-tls",
        action="store_true",
        help="do not verify kubelets' serving certificates (testing only)",
    )
    g.add_argument(
        "--kubelet-certificate-authority",
        default="",
        metavar="FILE",
        help="CA bundle that kubelets' serving certificates chain to",
    )
    g.add_argument(
        "--kubelet-client-certificate",
        default="",
        metavar="FILE",
        help="client certificate for talking to kubelets",
    )
    g.add_argument(
        "--kubelet-client-key", default="", metavar="FILE", help="key of --kubelet-client-certificate"
    )
    g.add_argument(
        "--kubelet-request-timeout",
        type=parse_duration,
        default=10.0,
        metavar="DURATION",
        help="cap on one kubelet request; the per-node deadline is min(this, 90%% of the resolution)",
    )
    g.add_argument(
        "--kubelet-endpoint",
        choices=("resource", "summary"),
        default="resource",
        help="scrape /metrics/resource (default) or /stats/summary",
    )
    g.add_argument(
        "--kubelet-max-body-bytes",
        type=positive_int,
        default=10 * 1024 * 1024,
        metavar="BYTES",
        help="a kubelet response larger than this is refused and counted (default 10 MiB)",
    )
    g.add_argument(
        "--kubelet-max-in-flight",
        type=positive_int,
        default=200,
        metavar="N",
        help="kubelet requests in flight at once (default 200)",
    )
    g.add_argument(
        "--node-selector",
        default="",
        metavar="SELECTOR",
        help="label selector: only nodes matching it are scraped and served",
    )


def scrape_workers(text: str) -> int | None:
    """``--scrape-workers``: ``auto`` (None) or a number of worker processes, 0 to 64."""
    if text == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be auto or a whole number from 0 to 64, not {text!r}") from None
    if not 0 <= n <= 64:
        raise argparse.ArgumentTypeError(f"must be auto or a whole number from 0 to 64, not {n}")
    return n


def add_scrape_worker_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scrape-workers",
        type=scrape_workers,
        default=None,
        metavar="auto|N",
        help="processes that scrape kubelets, each for a share of the nodes, so that serving never "
        "delays a scrape and decoding runs on another core; 0: scrape in the serving process. "
        "auto (default): 1 when the first node list has 1000 nodes or more (after --node-selector) and "
        "this process may run on 4 CPUs or more, else 0 (a worker costs ~30-40 MB of memory, too much "
        "for a small cluster, and on 2 CPUs it measured more CPU and no gain)",
    )


MAX_HISTORY = 86400.0  # --history: a day at most (memory grows with it: docs/history.md)


def add_history_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--history",
        type=parse_duration,
        default=600.0,
        metavar="DURATION",
        help="how long node, pod and container usage is kept and served by history.kcms.io/v1alpha1 "
        "(default 10m; 0 turns history off and the API group is not served; at most 24h)",
    )


def validate_history_flag(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    h = args.history
    if h != 0 and not (args.metric_resolution <= h <= MAX_HISTORY):
        p.error(
            f"argument --history: must be 0 (off) or from --metric-resolution ({args.metric_resolution:g}s) "
            f"to 24h, got {h:g}s"
        )


def add_series_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("custom and external metrics (series store)")
    g.add_argument(
        "--series-retention",
        type=parse_duration,
        default=600.0,
        metavar="DURATION",
        help="how long points of custom and external series are kept (default 10m)",
    )
    g.add_argument(
        "--series-stale-after",
        type=parse_duration,
        default=300.0,
        metavar="DURATION",
        help="a series with no point for this long is not served (default 5m)",
    )
    g.add_argument(
        "--series-default-window",
        type=parse_duration,
        default=60.0,
        metavar="DURATION",
        help="window of <metric>_agg_<fn> without an explicit window (default 1m)",
    )
    g.add_argument(
        "--push-max-series",
        type=positive_int,
        default=100_000,
        metavar="N",
        help="pushed series in total beyond which new ones are refused (default 100000)",
    )
    g.add_argument(
        "--push-max-series-per-metric",
        type=positive_int,
        default=10_000,
        metavar="N",
        help="pushed series of one metric beyond which new ones are refused (default 10000)",
    )
    g.add_argument(
        "--push-max-series-per-writer",
        type=positive_int,
        default=10_000,
        metavar="N",
        help="pushed series one authenticated writer may create beyond which its new ones are refused "
        "(default 10000)",
    )
    g.add_argument(
        "--push-allow-nonresource-grant",
        action="store_true",
        help="let the legacy non-resource grant (post on /push/v1/samples) push samples about any "
        "target; off: each target needs `create` on custom.metrics.k8s.io <resource>/<metric> or "
        "external.metrics.k8s.io <metric> in its namespace",
    )
    # Prometheus remote write in (POST /api/v1/write, kcms/apis/remote_write.py, docs/remote-write.md)
    g.add_argument(
        "--remote-write-max-body-bytes",
        type=positive_int,
        default=8 << 20,
        metavar="BYTES",
        help="largest snappy-compressed remote-write body; larger: 413 (default 8388608)",
    )
    g.add_argument(
        "--remote-write-max-decompressed-bytes",
        type=positive_int,
        default=64 << 20,
        metavar="BYTES",
        help="largest decompressed size a remote-write body may declare; larger: 413 (default 67108864)",
    )
    g.add_argument(
        "--remote-write-max-samples",
        type=positive_int,
        default=100_000,
        metavar="N",
        help="samples (and series) in one remote-write request; more: 413 (default 100000)",
    )


def add_agent_collector_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("node agents (custom metrics)")
    g.add_argument(
        "--agent-selector",
        default="",
        metavar="SELECTOR",
        help="label selector of `kcms agent` pods to scrape (e.g. app=kcms-agent); empty: none",
    )
    g.add_argument(
        "--agent-port", type=port, default=9102, help="port agents serve /metrics on (default 9102)"
    )
    g.add_argument(
        "--agent-scrape-interval",
        type=parse_duration,
        default=5.0,
        metavar="DURATION",
        help="how often agents are scraped (default 5s); the per-agent timeout is 90%% of it",
    )
    g.add_argument(
        "--agent-ca-file",
        default="",
        metavar="FILE",
        help="CA of the agents' serving certificate (default: the system trust store); read again when "
        "it changes; while it is missing, scrapes fail (reason tls_config)",
    )
    g.add_argument(
        "--agent-tls-server-name",
        default="kcms-agent.kube-system.svc",
        metavar="NAME",
        help="name the agents' certificate must carry (default kcms-agent.kube-system.svc, the name of "
        "deploy/agent's certificate); empty: the agent's node IP",
    )
    g.add_argument(
        "--agent-token-file",
        default="",
        metavar="FILE",
        help="bearer token sent to agents, read again when it changes (default: this process's "
        "Kubernetes credential, in a cluster its ServiceAccount token); it needs get on nodes/metrics",
    )
    g.add_argument(
        "--agent-client-certificate",
        default="",
        metavar="FILE",
        help="client certificate presented to agents (mutual TLS), with --agent-client-key",
    )
    g.add_argument("--agent-client-key", default="", metavar="FILE", help="key of --agent-client-certificate")
    g.add_argument(
        "--agent-insecure-tls",
        action="store_true",
        help="do not verify the agents' certificates (tests only: an impostor would get the token)",
    )
    g.add_argument(
        "--agent-insecure-http",
        action="store_true",
        help="scrape agents over plain HTTP and send no credential (`kcms agent --insecure-serving`, "
        "simulated agents)",
    )


def validate_agent_collector_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The agent TLS flags: consistent, and the collector's own client certificate loadable."""
    if args.agent_insecure_http:
        for flag in ("agent_ca_file", "agent_token_file", "agent_client_certificate", "agent_insecure_tls"):
            if getattr(args, flag):
                p.error(f"argument --agent-insecure-http: not allowed with --{flag.replace('_', '-')}")
    if bool(args.agent_client_certificate) != bool(args.agent_client_key):
        p.error("argument --agent-client-certificate: give it with --agent-client-key")
    if args.agent_client_certificate:
        import ssl

        try:
            ssl.create_default_context().load_cert_chain(args.agent_client_certificate, args.agent_client_key)
        except (OSError, ssl.SSLError) as e:
            p.error(f"argument --agent-client-certificate: cannot load it with --agent-client-key: {e}")


def validate_series_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.series_retention <= 0:
        p.error("argument --series-retention: must be positive")
    if not 0 < args.series_stale_after <= args.series_retention:
        p.error("argument --series-stale-after: must be positive and at most --series-retention")
    if not 0 < args.series_default_window <= args.series_retention:
        p.error("argument --series-default-window: must be positive and at most --series-retention")
    if args.agent_scrape_interval < 1:
        p.error("argument --agent-scrape-interval: must be at least 1s")
    validate_agent_collector_flags(p, args)
    if args.agent_selector and args.inventory_file and not args.kubeconfig:
        p.error("argument --agent-selector: agents are found through the Kubernetes API; give --kubeconfig")
    if args.agent_selector:
        from kcms.selectors import SelectorError, parse_label_selector

        try:
            parse_label_selector(args.agent_selector)
        except SelectorError as e:
            p.error(f"argument --agent-selector: {e}")


def add_kube_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Kubernetes API")
    g.add_argument(
        "--kubeconfig",
        default="",
        metavar="FILE",
        help="kubeconfig of the cluster; default the in-cluster service account",
    )
    g.add_argument(
        "--inventory-file",
        default="",
        metavar="FILE",
        help="read nodes and pods from a v1 List JSON file (as `kcms simulate --write-inventory` "
        "writes) instead of watching the Kubernetes API; for simulations",
    )


def add_serving_flags(p: argparse.ArgumentParser, default_port: int = 443) -> None:
    g = p.add_argument_group("serving")
    g.add_argument(
        "--secure-port",
        type=port,
        default=default_port,
        help=f"HTTPS port (default {default_port}; 0 picks a free one)",
    )
    g.add_argument("--bind-address", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    g.add_argument(
        "--cert-dir",
        default="apiserver.local.config/certificates",
        metavar="DIR",
        help="where a self-signed pair is written when --tls-cert-file is not given",
    )
    g.add_argument(
        "--tls-cert-file", default="", metavar="FILE", help="serving certificate (reloaded on change)"
    )
    g.add_argument("--tls-private-key-file", default="", metavar="FILE", help="key of --tls-cert-file")
    g.add_argument("--tls-min-version", choices=TLS_VERSIONS, default="", help="minimum TLS version")
    g.add_argument(
        "--request-header-timeout",
        type=parse_duration,
        default=32.0,
        metavar="DURATION",
        help="a connection's request line and headers must arrive within this time, else it is closed "
        "(default 32s, as the kube-apiserver); idle keep-alive connections close after 90s, a body "
        "not received within 60s closes its connection",
    )
    g.add_argument(
        "--max-requests-inflight",
        type=int,
        default=400,
        metavar="N",
        help="read-only requests served at once; more are answered 429 with Retry-After (default 400; "
        "0: no limit; health probes are exempt)",
    )
    g.add_argument(
        "--max-mutating-requests-inflight",
        type=int,
        default=200,
        metavar="N",
        help="mutating requests (pushes) served at once; more are answered 429 (default 200; 0: no limit)",
    )
    g.add_argument(
        "--max-executing-requests",
        type=int,
        default=4,
        metavar="N",
        help="admitted requests whose handlers run at once; the others wait in order, so probes and "
        "new connections are read between big list renders (default 4; raise it when handlers mostly "
        "wait on stores or reviews)",
    )


def add_auth_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("delegated authentication and authorization")
    g.add_argument(
        "--authentication-kubeconfig",
        default="",
        metavar="FILE",
        help="kubeconfig for TokenReview and the extension-apiserver-authentication lookup",
    )
    g.add_argument(
        "--authorization-kubeconfig", default="", metavar="FILE", help="kubeconfig for SubjectAccessReview"
    )
    g.add_argument(
        "--authentication-skip-lookup",
        action="store_true",
        help="do not read kube-system/extension-apiserver-authentication",
    )
    g.add_argument(
        "--client-ca-file",
        default="",
        metavar="FILE",
        help="accept client certificates signed by this CA (user = CN, groups = O)",
    )
    g.add_argument(
        "--requestheader-client-ca-file",
        default="",
        metavar="FILE",
        help="CA of the front proxy (the aggregator) whose requests carry the user in headers",
    )
    g.add_argument(
        "--requestheader-allowed-names",
        type=csv_list,
        default=[],
        metavar="NAMES",
        help="front-proxy certificate common names allowed; empty = any",
    )
    g.add_argument(
        "--requestheader-username-headers", type=csv_list, default=["X-Remote-User"], metavar="HEADERS"
    )
    g.add_argument(
        "--requestheader-group-headers", type=csv_list, default=["X-Remote-Group"], metavar="HEADERS"
    )
    g.add_argument(
        "--requestheader-extra-headers-prefix", type=csv_list, default=["X-Remote-Extra-"], metavar="PREFIXES"
    )
    g.add_argument(
        "--authorization-always-allow-paths",
        type=csv_list,
        default=["/healthz", "/readyz", "/livez"],
        metavar="PATHS",
        help="paths served without authorization (default /healthz,/readyz,/livez)",
    )


def add_logging_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-v", "--v", type=int, default=0, metavar="LEVEL", help="log verbosity (0-10; 2+ is debug)"
    )


def add_ingest_flags(p: argparse.ArgumentParser) -> None:
    """Bounds every ingestion path of a component shares (see :mod:`kcms.limits`)."""
    p.add_argument(
        "--max-future-skew",
        type=parse_duration,
        default=limits.DEFAULT_MAX_FUTURE_SKEW,
        metavar="DURATION",
        help="refuse (and count) any sample timestamped more than this ahead of this process's "
        "clock, on every ingestion path (default 60s)",
    )


def apply_ingest_flags(args: argparse.Namespace) -> None:
    """Make the parsed ``--max-future-skew`` the process-wide bound."""
    skew = getattr(args, "max_future_skew", None)
    if skew is not None:
        limits.configure(max_future_skew=skew)


def _metric_sources(text: str) -> tuple[str, ...]:
    from kcms.apis.routing import parse_metric_sources

    try:
        return parse_metric_sources(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_prometheus_flags(p: argparse.ArgumentParser) -> None:
    """The Prometheus bridge (docs/prometheus.md); names follow prometheus-adapter's where they map."""
    g = p.add_argument_group("Prometheus bridge (prometheus-adapter flags where they map)")
    g.add_argument(
        "--prometheus-url",
        default="",
        metavar="URL",
        help="Prometheus-compatible HTTP API to serve custom/external metrics from (Prometheus, Thanos "
        "Query, Mimir/Cortex's /prometheus, VictoriaMetrics); default none",
    )
    g.add_argument(
        "--config",
        default="",
        metavar="FILE",
        help="prometheus-adapter configuration file (rules, externalRules, resourceRules)",
    )
    g.add_argument("--prometheus-ca-file", default="", metavar="FILE", help="CA bundle of Prometheus's certificate")
    g.add_argument(
        "--prometheus-client-cert",
        "--prometheus-client-tls-cert-file",
        dest="prometheus_client_cert",
        default="",
        metavar="FILE",
        help="client certificate for Prometheus",
    )
    g.add_argument(
        "--prometheus-client-key",
        "--prometheus-client-tls-key-file",
        dest="prometheus_client_key",
        default="",
        metavar="FILE",
        help="key of --prometheus-client-cert",
    )
    g.add_argument(
        "--prometheus-insecure-skip-tls-verify",
        action="store_true",
        help="do not verify Prometheus's certificate (testing only)",
    )
    g.add_argument(
        "--prometheus-token-file",
        default="",
        metavar="FILE",
        help="bearer token for Prometheus, re-read when the file changes",
    )
    g.add_argument(
        "--prometheus-header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra header on every Prometheus request, repeatable (e.g. X-Scope-OrgID=tenant for Mimir)",
    )
    g.add_argument(
        "--prometheus-verb",
        choices=("GET", "POST"),
        default="GET",
        type=str.upper,
        help="HTTP method of queries (default GET; POST for long queries)",
    )
    g.add_argument(
        "--prometheus-query-timeout",
        type=parse_duration,
        default=10.0,
        metavar="DURATION",
        help="cap on one Prometheus request; a read that exceeds it is a 504 (default 10s)",
    )
    g.add_argument(
        "--prometheus-max-response-bytes",
        type=positive_int,
        default=64 << 20,
        metavar="BYTES",
        help="a Prometheus response larger than this is refused (default 64 MiB)",
    )
    g.add_argument(
        "--metrics-relist-interval",
        type=parse_duration,
        default=60.0,
        metavar="DURATION",
        help="how often the rules' seriesQuery are relisted in the background for discovery (default 1m)",
    )
    g.add_argument(
        "--metrics-max-age",
        type=parse_duration,
        default=0.0,
        metavar="DURATION",
        help="a relist sees series present in this last period (default: --metrics-relist-interval)",
    )
    g.add_argument(
        "--resource-metrics-source",
        choices=("kubelet", "prometheus"),
        default="kubelet",
        help="where metrics.k8s.io comes from: the kubelets (default) or the config's resourceRules",
    )
    g.add_argument(
        "--metric-sources",
        type=_metric_sources,
        default=("store", "prometheus"),
        metavar="SOURCES",
        help="routing order: each custom/external metric is served by the first of these sources that "
        "lists it; a source left out is not served (default store,prometheus)",
    )


def validate_prometheus_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The bridge's flags, and ``--config`` read and checked now (``args.adapter_config``): a bad
    rule stops start-up naming the rule and field."""
    import os

    args.adapter_config = None
    url = args.prometheus_url
    if url:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            p.error(f"argument --prometheus-url: must be an http:// or https:// URL, not {url!r}")
    for flag in ("prometheus_ca_file", "prometheus_client_cert", "prometheus_client_key", "prometheus_token_file"):
        path = getattr(args, flag)
        if path and not os.path.isfile(path):
            p.error(f"argument --{flag.replace('_', '-')}: no such file: {path}")
    if bool(args.prometheus_client_cert) != bool(args.prometheus_client_key):
        p.error("argument --prometheus-client-cert: give it with --prometheus-client-key")
    if args.prometheus_insecure_skip_tls_verify and args.prometheus_ca_file:
        p.error("argument --prometheus-insecure-skip-tls-verify: not allowed with --prometheus-ca-file")
    for header in args.prometheus_header:
        name, sep, value = header.partition("=")
        if not sep or not name.strip() or any(c in header for c in "\r\n\0"):
            p.error(f"argument --prometheus-header: expected NAME=VALUE, got {header!r}")
    if args.prometheus_query_timeout <= 0:
        p.error("argument --prometheus-query-timeout: must be positive")
    if args.metrics_relist_interval < 1:
        p.error("argument --metrics-relist-interval: must be at least 1s")
    if args.metrics_max_age < 0:
        p.error("argument --metrics-max-age: must not be negative")
    if args.config:
        from kcms.apis.prometheus.config import ConfigError, read_adapter_config

        try:
            args.adapter_config = read_adapter_config(args.config)
        except ConfigError as e:
            p.error(f"argument --config: {e}")
    if url and args.adapter_config is None:
        p.error("argument --prometheus-url: give --config (the prometheus-adapter rules to serve)")
    if url:
        from kcms.apis.prometheus.bridge import client_from_args

        try:
            client_from_args(args)  # URL, headers, TLS files: checked now, no connection made
        except ValueError as e:
            p.error(f"argument --prometheus-url: {e}")
    if args.resource_metrics_source == "prometheus":
        if not url:
            p.error("argument --resource-metrics-source: prometheus needs --prometheus-url")
        if args.adapter_config is None or args.adapter_config.resource_rules is None:
            p.error("argument --resource-metrics-source: prometheus needs resourceRules in --config")


def validate_kubelet_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.metric_resolution < 10:
        p.error(f"argument --metric-resolution: must be at least 10s, got {args.metric_resolution:g}s")
    if args.kubelet_request_timeout <= 0:
        p.error("argument --kubelet-request-timeout: must be positive")
    if bool(args.kubelet_client_certificate) != bool(args.kubelet_client_key):
        p.error("arguments --kubelet-client-certificate and --kubelet-client-key must be given together")
    if args.kubelet_insecure_tls and args.kubelet_certificate_authority:
        p.error("arguments --kubelet-insecure-tls and --kubelet-certificate-authority are mutually exclusive")
    if args.node_selector:
        from kcms.selectors import SelectorError, parse_label_selector

        try:
            parse_label_selector(args.node_selector)
        except SelectorError as e:
            p.error(f"argument --node-selector: {e}")


def validate_serving_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        p.error("arguments --tls-cert-file and --tls-private-key-file must be given together")
    if not args.request_header_timeout > 0:
        p.error("argument --request-header-timeout: must be positive")
    for flag in ("max_requests_inflight", "max_mutating_requests_inflight"):
        if getattr(args, flag) < 0:
            p.error(f"argument --{flag.replace('_', '-')}: must be 0 (no limit) or more")
    if args.max_executing_requests < 1:
        p.error("argument --max-executing-requests: must be at least 1")


def _check_files(p: argparse.ArgumentParser, args: argparse.Namespace, names: Sequence[str]) -> None:
    import os

    for name in names:
        path = getattr(args, name, "")
        if path and not os.path.isfile(path):
            p.error(f"argument --{name.replace('_', '-')}: no such file: {path}")


FILE_FLAGS = (
    "kubeconfig",
    "inventory_file",
    "kubelet_certificate_authority",
    "kubelet_client_certificate",
    "kubelet_client_key",
    "tls_cert_file",
    "tls_private_key_file",
    "authentication_kubeconfig",
    "authorization_kubeconfig",
    "client_ca_file",
    "requestheader_client_ca_file",
)


COMMANDS = ("standalone", "store", "collector", "server", "agent", "simulate", "demo")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or (``command`` given) one whose other sub-commands are listed
    without their flags. Why: their flag modules import the agent, the simulator and the HA
    clients, and through them the Kubernetes client library; building them all cost every
    `kcms standalone` ~40 ms of CPU at start, and `kcms standalone --help` 1.0 s and 87 MB
    (now ~0.25 s and ~23 MB, measured with /usr/bin/time on this 2-core machine)."""

    def wanted(name: str) -> bool:
        return command is None or command == name

    parser = argparse.ArgumentParser(prog="kcms", description="KCMS: Kubernetes metrics pipeline")
    parser.add_argument("--version", action="version", version=f"kcms {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "standalone",
        help="collector, store and API server in one process (metrics-server drop-in)",
        description="Scrape kubelets and serve metrics.k8s.io, as metrics-server does.",
    )
    add_kube_flags(p)
    add_kubelet_flags(p)
    add_scrape_worker_flags(p)
    add_history_flag(p)
    add_series_flags(p)
    add_agent_collector_flags(p)
    add_prometheus_flags(p)
    add_serving_flags(p)
    add_auth_flags(p)
    add_ingest_flags(p)
    add_logging_flags(p)

    p = sub.add_parser(
        "store",
        help="one store replica (multi-store and sharded modes)",
        description="Hold metrics in memory behind an authenticated HTTP API for collectors and servers.",
    )
    if wanted("store"):
        from kcms import cli_ha

        cli_ha.add_store_flags(p)
        add_series_flags(p)
        add_ingest_flags(p)
        add_logging_flags(p)

    p = sub.add_parser(
        "collector",
        help="scrape kubelets and agents, write to the stores (leader-elected)",
        description="Scrape kubelets and node agents and write to store replicas by quorum; one "
        "leader at a time holds a Lease.",
    )
    if wanted("collector"):
        from kcms import cli_ha

        add_kube_flags(p)
        add_kubelet_flags(p)
        add_agent_collector_flags(p)
        cli_ha.add_store_client_flags(p)
        cli_ha.add_leader_flags(p, "kcms-collector", default_on=True)
        cli_ha.add_collector_health_flags(p)
        add_ingest_flags(p)
        add_logging_flags(p)

    p = sub.add_parser(
        "server",
        help="the API server alone: reads the stores, or (--active-standby) takes agents' pushes",
        description="Serve metrics.k8s.io, custom.metrics.k8s.io and external.metrics.k8s.io from store "
        "replicas, or in push mode from an in-process store while holding a Lease.",
    )
    if wanted("server"):
        from kcms import cli_ha

        add_kube_flags(p)
        add_series_flags(p)
        cli_ha.add_store_client_flags(p)
        cli_ha.add_push_server_flags(p)
        cli_ha.add_leader_flags(p, "kcms-server", default_on=True)
        add_prometheus_flags(p)
        add_serving_flags(p)
        add_auth_flags(p)
        add_ingest_flags(p)
        add_logging_flags(p)

    p = sub.add_parser(
        "agent",
        help="node agent (DaemonSet): cgroups, /proc, annotated pods' endpoints, OTLP",
        description="Collect node, pod and application metrics on this node and serve them on "
        "/metrics for the collector (kcms standalone --agent-selector).",
    )
    if wanted("agent"):
        from kcms.agent.cli import add_agent_arguments

        add_agent_arguments(p)
        add_ingest_flags(p)

    p = sub.add_parser("simulate", help="fake kubelets on loopback, for demos, tests and benchmarks")
    if wanted("simulate"):
        from kcms.sim import add_simulate_arguments

        add_simulate_arguments(p)
        add_logging_flags(p)

    p = sub.add_parser(
        "demo",
        help="a simulated cluster plus the whole pipeline, serving on 127.0.0.1",
        description="Start simulated kubelets and a standalone pipeline on loopback; no cluster and "
        "no credentials needed (anonymous reads, 127.0.0.1 only).",
    )
    p.add_argument("--secure-port", type=port, default=8443, help="HTTPS port on 127.0.0.1 (default 8443)")
    p.add_argument("--nodes", type=positive_int, default=5, help="simulated nodes (default 5)")
    p.add_argument("--pods-per-node", type=positive_int, default=6, help="pods per node (default 6)")
    p.add_argument(
        "--metric-resolution",
        type=parse_duration,
        default=15.0,
        metavar="DURATION",
        help="scrape period, at least 10s (default 15s)",
    )
    p.add_argument(
        "--work-dir",
        default="",
        metavar="DIR",
        help="where the demo writes its kubeconfig and certificates (default a temporary dir)",
    )
    p.add_argument(
        "--exit-after",
        type=parse_duration,
        default=0.0,
        metavar="DURATION",
        help="stop after this long (default: run until interrupted)",
    )
    p.add_argument(
        "--dashboard-port",
        type=port,
        default=0,
        help="port of the dashboard on 127.0.0.1 (docs/dashboard.md; default 0: a free port, printed)",
    )
    p.add_argument("--no-dashboard", action="store_true", help="do not serve the dashboard")
    p.add_argument(
        "--down-nodes",
        type=int,
        default=0,
        metavar="N",
        help="the last N simulated kubelets stop answering after two scrapes, to show stale nodes and "
        "scrape errors (default 0)",
    )
    p.add_argument(
        "--prometheus",
        default="",
        metavar="URL",
        help="also serve custom metrics from this Prometheus-compatible URL through the bridge "
        "(docs/prometheus.md; default none)",
    )
    p.add_argument(
        "--prometheus-config",
        default="",
        metavar="FILE",
        help="prometheus-adapter config for --prometheus (default: pod and deployment metrics of every "
        "series with namespace and pod labels)",
    )
    add_history_flag(p)
    add_logging_flags(p)
    # `kcms top` is `kubectl kcms top` (kcms/kubectl, its own flags): listed here, parsed there.
    sub.add_parser("top", help="CPU and memory of nodes or pods with history, as `kubectl kcms top`", add_help=False)
    return parser


def setup_logging(verbosity: int) -> None:
    level = logging.DEBUG if verbosity >= 2 else logging.INFO if verbosity >= 0 else logging.WARNING
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname).1s %(name)s: %(message)s", stream=sys.stderr
    )
    if verbosity < 4:
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    if words and words[0] == "top":  # the kubectl plugin's client only: no server module is imported
        from kcms.kubectl import main as plugin_main

        return plugin_main(words, prog="kcms")
    # Only the chosen sub-command's flags are built (and their modules imported); anything else
    # (no command, --help, --version, a typo) gets the whole parser and its usual message.
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
    setup_logging(args.v)
    apply_ingest_flags(args)
    if args.command == "standalone":
        validate_kubelet_flags(sub, args)
        validate_serving_flags(sub, args)
        validate_series_flags(sub, args)
        validate_history_flag(sub, args)
        _check_files(sub, args, FILE_FLAGS)
        validate_prometheus_flags(sub, args)
        from kcms.standalone import run_standalone

        return asyncio.run(run_standalone(args))
    if args.command in ("store", "collector", "server"):
        return _run_ha(sub, args)
    if args.command == "agent":
        from kcms.agent.cli import agent_main

        return asyncio.run(agent_main(args))
    if args.command == "simulate":
        from kcms.sim import simulate_main

        return asyncio.run(simulate_main(args))
    if args.command == "demo":
        if args.metric_resolution < 10:
            sub.error(f"argument --metric-resolution: must be at least 10s, got {args.metric_resolution:g}s")
        validate_history_flag(sub, args)
        if not 0 <= args.down_nodes <= args.nodes:
            sub.error(f"argument --down-nodes: must be between 0 and --nodes ({args.nodes}), got {args.down_nodes}")
        from kcms.demo_prometheus import flag_problem

        if problem := flag_problem(args):  # --prometheus, --prometheus-config
            sub.error(problem)
        from kcms.demo import run_demo

        return asyncio.run(run_demo(args, build_parser("standalone")))
    parser.error(f"unknown command {args.command}")
    return 2


def _run_ha(sub: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from kcms import cli_ha

    if args.command == "store":
        cli_ha.validate_store(sub, args)
        _check_files(sub, args, ("tls_cert_file", "tls_private_key_file", "store_ca_file", "kubeconfig"))
        from kcms.store.run import run_store

        return asyncio.run(run_store(args))
    if args.command == "collector":
        validate_kubelet_flags(sub, args)
        cli_ha.validate_store_client(sub, args, required=True)
        if args.leader_elect:
            cli_ha.validate_leader_flags(sub, args)
        if args.agent_scrape_interval < 1:
            sub.error("argument --agent-scrape-interval: must be at least 1s")
        validate_agent_collector_flags(sub, args)
        _check_files(sub, args, FILE_FLAGS + ("store_ca_file",))
        from kcms.collector_process import run_collector

        return asyncio.run(run_collector(args))
    validate_serving_flags(sub, args)
    cli_ha.validate_store_client(sub, args, required=not args.active_standby)
    if args.active_standby and args.leader_elect:
        cli_ha.validate_leader_flags(sub, args)
    if args.node_stale_after <= 0:
        sub.error("argument --node-stale-after: must be positive")
    _check_files(sub, args, FILE_FLAGS + ("store_ca_file",))
    validate_prometheus_flags(sub, args)
    from kcms.server import run_server

    return asyncio.run(run_server(args))


if __name__ == "__main__":
    sys.exit(main())
