"""Flags of the separate-process components: `kcms store`, `kcms collector`, `kcms server`.

Leader-election flags have client-go's names and defaults; the store-client flags are shared by the
collector and the server.
"""

from __future__ import annotations

import argparse
import os

from kcms.flags import parse_duration, port, positive_int


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def boolean(text: str) -> bool:
    """Go-style boolean flag values: --leader-elect=false."""
    low = text.strip().lower()
    if low in ("1", "t", "true", "yes"):
        return True
    if low in ("0", "f", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r} (true or false)")


def add_membership_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("store membership")
    g.add_argument(
        "--store-endpoints",
        default="",
        metavar="LIST",
        help="the stores, as name=URL,name=URL or URL,URL (static membership)",
    )
    g.add_argument(
        "--store-service",
        default="",
        metavar="NS/NAME",
        help="the stores are the ready endpoints of this headless Service (EndpointSlices, watched)",
    )
    g.add_argument(
        "--store-port-name", default="", metavar="NAME", help="EndpointSlice port name (default: first)"
    )
    g.add_argument(
        "--store-scheme", choices=("http", "https"), default="https", help="scheme (default https)"
    )
    g.add_argument(
        "--store-ca-file", default="", metavar="FILE", help="CA that signed the stores' certificates"
    )
    g.add_argument(
        "--replicas",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="copies of each key (sharded mode); 0 = every store holds everything (multi-store; default)",
    )


def add_store_client_flags(p: argparse.ArgumentParser) -> None:
    add_membership_flags(p)
    g = p.add_argument_group("store client")
    g.add_argument("--store-token-file", default="", metavar="FILE", help="bearer token the stores accept")
    g.add_argument(
        "--write-quorum", type=non_negative_int, default=0, metavar="W", help="acks per write (0 = N - R + 1)"
    )
    g.add_argument(
        "--read-quorum",
        type=non_negative_int,
        default=0,
        metavar="R",
        help="answers per read (0 = ceil(N/2))",
    )
    g.add_argument(
        "--store-timeout",
        type=parse_duration,
        default=2.0,
        metavar="DURATION",
        help="deadline of one request to one store (default 2s)",
    )
    g.add_argument(
        "--store-quorum-grace",
        type=parse_duration,
        default=0.02,
        metavar="DURATION",
        help="once a quorum answered, how long to wait for the other stores asked (default 20ms)",
    )
    g.add_argument(
        "--store-hedge-delay",
        type=parse_duration,
        default=0.0,
        metavar="DURATION",
        help="multi-store reads ask R stores and the others after this long without a quorum "
        "(default: half of --store-timeout)",
    )
    g.add_argument(
        "--store-retries",
        type=non_negative_int,
        default=1,
        metavar="N",
        help="retries of a request that got no answer (default 1)",
    )


def add_leader_flags(p: argparse.ArgumentParser, resource_name: str, default_on: bool) -> None:
    g = p.add_argument_group("leader election (coordination.k8s.io/v1 Lease)")
    g.add_argument(
        "--leader-elect",
        type=boolean,
        nargs="?",
        const=True,
        default=default_on,
        metavar="BOOL",
        help=f"hold a Lease while active (default {str(default_on).lower()})",
    )
    g.add_argument("--leader-elect-lease-duration", type=parse_duration, default=15.0, metavar="DURATION")
    g.add_argument("--leader-elect-renew-deadline", type=parse_duration, default=10.0, metavar="DURATION")
    g.add_argument("--leader-elect-retry-period", type=parse_duration, default=2.0, metavar="DURATION")
    g.add_argument("--leader-elect-resource-name", default=resource_name, metavar="NAME")
    g.add_argument(
        "--leader-elect-resource-namespace",
        default=os.environ.get("POD_NAMESPACE", "kube-system"),
        metavar="NS",
        help="namespace of the Lease (default $POD_NAMESPACE, else kube-system)",
    )
    g.add_argument("--leader-elect-identity", default="", metavar="ID", help="default hostname_uuid")


def add_store_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("store service")
    g.add_argument("--bind-address", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    g.add_argument("--port", type=port, default=10260, help="port (default 10260; 0 picks a free one)")
    g.add_argument("--tls-cert-file", default="", metavar="FILE", help="serve HTTPS with this certificate")
    g.add_argument("--tls-private-key-file", default="", metavar="FILE", help="key of --tls-cert-file")
    g.add_argument(
        "--token-file",
        default="",
        metavar="FILE",
        help="file with the bearer token clients must send (required)",
    )
    g.add_argument(
        "--store-name", default="", metavar="NAME", help="name in the ring (default $POD_NAME or hostname)"
    )
    g.add_argument(
        "--refill-timeout",
        type=parse_duration,
        default=30.0,
        metavar="DURATION",
        help="how long to try copying from peers before reporting ready (default 30s)",
    )
    g.add_argument(
        "--max-request-bytes", type=positive_int, default=64 << 20, metavar="N", help="largest body (64 MiB)"
    )
    g.add_argument(
        "--metric-resolution",
        type=parse_duration,
        default=15.0,
        metavar="DURATION",
        help="the collector's kubelet scrape period (node readings expire after two; default 15s)",
    )
    g.add_argument(
        "--kubeconfig", default="", metavar="FILE", help="for --store-service (default in-cluster)"
    )
    add_membership_flags(p)


def add_collector_health_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("health")
    g.add_argument("--health-bind-address", default="0.0.0.0", help="address of /healthz, /readyz, /metrics")
    g.add_argument("--health-port", type=port, default=8080, help="plain-HTTP health port (default 8080)")


def add_push_server_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("push mode")
    g.add_argument(
        "--active-standby",
        action="store_true",
        help="push mode: keep an in-process store fed by `kcms agent --push`; serve and report ready "
        "only while holding the Lease",
    )
    g.add_argument(
        "--node-stale-after",
        type=parse_duration,
        default=60.0,
        metavar="DURATION",
        help="push mode: nodes silent this long are not served and listed as stale (default 1m)",
    )
    # Node pushes are bound to the node their credential names (kcms/apis/nodebinding.py); these
    # bound what one node, one metric and all nodes may create (kcms/apis/quota.py).
    g.add_argument(
        "--node-push-max-series-per-node",
        type=positive_int,
        default=20_000,
        metavar="N",
        help="push mode: new series one node may create beyond which they are refused (default 20000, "
        "the agent's --max-series-per-node)",
    )
    g.add_argument(
        "--node-push-max-series",
        type=positive_int,
        default=1_000_000,
        metavar="N",
        help="push mode: series from node pushes in total beyond which new ones are refused (default 1000000)",
    )
    g.add_argument(
        "--node-push-max-series-per-metric",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="push mode: series of one metric from node pushes beyond which new ones are refused "
        "(default 0: no limit; kubelet metrics have a series per pod)",
    )
    g.add_argument(
        "--node-push-allow-namespaced-objects",
        action="store_true",
        help="push mode: accept a node's samples about namespaced objects other than pods (Deployments, "
        "external metrics of a namespace) in namespaces where it runs pods (default: refused)",
    )


def validate_store_client(p: argparse.ArgumentParser, args: argparse.Namespace, required: bool) -> None:
    if args.store_endpoints and args.store_service:
        p.error("arguments --store-endpoints and --store-service are mutually exclusive")
    if required and not (args.store_endpoints or args.store_service):
        p.error("argument --store-endpoints or --store-service is required")
    if args.store_endpoints:
        from kcms.kube.members import parse_static_members

        try:
            members = parse_static_members(args.store_endpoints)
        except ValueError as e:
            p.error(f"argument --store-endpoints: {e}")
        copies = args.replicas or len(members)
        if args.replicas > len(members):
            p.error(f"argument --replicas: {args.replicas} is more than the {len(members)} stores listed")
        quorums = (
            ("--write-quorum", getattr(args, "write_quorum", 0)),
            ("--read-quorum", getattr(args, "read_quorum", 0)),
        )
        for flag, value in quorums:
            if value > copies:
                p.error(f"argument {flag}: {value} is more than the {copies} copies of each key")
    if args.store_service and args.store_service.count("/") != 1:
        p.error(f"argument --store-service: expected NAMESPACE/NAME, got {args.store_service!r}")
    if getattr(args, "store_timeout", 1.0) <= 0:
        p.error("argument --store-timeout: must be positive")
    if getattr(args, "store_quorum_grace", 0.0) < 0:
        p.error("argument --store-quorum-grace: must not be negative")
    if getattr(args, "store_hedge_delay", 0.0) < 0:
        p.error("argument --store-hedge-delay: must not be negative")
    if getattr(args, "store_token_file", "") and not os.path.isfile(args.store_token_file):
        p.error(f"argument --store-token-file: no such file: {args.store_token_file}")


def validate_leader_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    lease, renew, retry = (
        args.leader_elect_lease_duration,
        args.leader_elect_renew_deadline,
        args.leader_elect_retry_period,
    )
    if not lease > renew:
        p.error("argument --leader-elect-lease-duration: must be greater than --leader-elect-renew-deadline")
    if not renew > 1.2 * retry:
        p.error(
            "argument --leader-elect-renew-deadline: must be greater than 1.2 x --leader-elect-retry-period"
        )
    if retry <= 0:
        p.error("argument --leader-elect-retry-period: must be positive")


def validate_store(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.token_file:
        p.error("argument --token-file is required")
    if not os.path.isfile(args.token_file):
        p.error(f"argument --token-file: no such file: {args.token_file}")
    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        p.error("arguments --tls-cert-file and --tls-private-key-file must be given together")
    if args.refill_timeout <= 0:
        p.error("argument --refill-timeout: must be positive")
    validate_store_client(p, args, required=False)


def leader_elector_factory(args: argparse.Namespace, kube: object):
    """``make(on_started, on_stopped) -> LeaderElector`` from the ``--leader-elect-*`` flags."""
    from kcms.kube.lease import LeaderElector, default_identity

    def make(started, stopped) -> LeaderElector:
        return LeaderElector(
            kube,  # type: ignore[arg-type]
            args.leader_elect_resource_namespace,
            args.leader_elect_resource_name,
            args.leader_elect_identity or default_identity(),
            lease_duration=args.leader_elect_lease_duration,
            renew_deadline=args.leader_elect_renew_deadline,
            retry_period=args.leader_elect_retry_period,
            on_started_leading=started,
            on_stopped_leading=stopped,
        )

    return make
