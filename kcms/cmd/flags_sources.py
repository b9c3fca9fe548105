"""Flags of the custom-metrics sources: the series store, the collector of node agents and the
Prometheus bridge (``--prometheus-url``, ``--config``: docs/prometheus.md); and their start-up checks.
"""

from __future__ import annotations

import argparse

from kcms.flags import parse_duration, port, positive_int


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
