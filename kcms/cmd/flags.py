"""Flags shared by several ``kcms`` sub-commands: kubelet scraping, history, Kubernetes access,
serving, authentication, logging and ingestion bounds; and their start-up checks, each of which
stops start-up with a message naming the flag.

Flags that mean what a metrics-server flag means have its name and default.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kcms import limits
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


def check_files(p: argparse.ArgumentParser, args: argparse.Namespace, names: Sequence[str]) -> None:
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
