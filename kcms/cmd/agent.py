"""`kcms agent`: the node agent (a DaemonSet) — flags and the main coroutine.

``add_agent_arguments(parser)`` adds the flags; ``await agent_main(args)`` validates what argparse
cannot (a message naming the flag, exit status 2) and runs until SIGTERM or SIGINT.
Also runnable on its own: ``python -m kcms.cmd.agent --node-name NODE ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
import sys
from collections.abc import Sequence

from kcms.agent.buffer import SampleBuffer
from kcms.agent.server import Agent, ServingTLS, _parse_listen
from kcms.flags import csv_list, parse_duration, port, positive_int
from kcms.tokenfile import TokenFile

__all__ = ["add_agent_arguments", "agent_main", "main"]

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def _duration(text: str) -> float:
    value = parse_duration(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _listen(text: str) -> str:
    try:
        _parse_listen(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _push_urls(text: str) -> list[str]:
    from urllib.parse import urlsplit

    urls = csv_list(text)
    if not urls:
        raise argparse.ArgumentTypeError("expected one or more URLs, comma-separated")
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise argparse.ArgumentTypeError(f"{url!r} is not an http(s) URL")
        try:
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{url!r}: {e}") from None
    return urls


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``kcms agent`` flags to ``p``."""
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name (default: $NODE_NAME, set from spec.nodeName by the DaemonSet)",
    )
    p.add_argument(
        "--kubeconfig",
        default="",
        help="kubeconfig to reach the API server (default: the in-cluster service account)",
    )
    p.add_argument(
        "--listen",
        type=_listen,
        default="0.0.0.0:9102",
        metavar="HOST:PORT",
        help="address to serve /metrics on (default 0.0.0.0:9102): HTTPS, callers authenticated and "
        "authorized (get nodes/metrics of this node), unless --insecure-serving",
    )
    p.add_argument(
        "--tls-cert-file", default="", help="serving certificate (PEM); required unless --insecure-serving"
    )
    p.add_argument("--tls-private-key-file", default="", help="the private key of --tls-cert-file (PEM)")
    p.add_argument(
        "--client-ca-file",
        default="",
        metavar="FILE",
        help="also accept /metrics callers with a client certificate signed by this CA (mutual TLS; "
        "user = common name, groups = organizations); they are authorized like token callers",
    )
    p.add_argument(
        "--max-pending-reviews",
        type=positive_int,
        default=32,
        metavar="N",
        help="/metrics requests of callers not yet authenticated that may wait for TokenReview and "
        "SubjectAccessReview at once; more are answered 429 (default 32; known callers never wait)",
    )
    p.add_argument(
        "--insecure-serving",
        action="store_true",
        help="serve plain HTTP and let anyone read /metrics (every pod's metrics on the node): tests "
        "and simulations only",
    )
    p.add_argument(
        "--otlp-listen",
        type=_listen,
        default=None,
        metavar="HOST:PORT",
        help="also accept OTLP pushes (/v1/metrics) over plain HTTP here, so applications need not "
        "trust the agent's certificate (default: only on --listen)",
    )
    p.add_argument(
        "--interval", type=_duration, default=10.0, metavar="DURATION", help="collection period (default 10s)"
    )
    p.add_argument(
        "--retention",
        type=_duration,
        default=300.0,
        metavar="DURATION",
        help="how long points stay in the buffer (default 5m)",
    )
    p.add_argument(
        "--max-series-per-pod", type=positive_int, default=1000, help="series limit per pod (default 1000)"
    )
    p.add_argument(
        "--max-series-per-node",
        type=positive_int,
        default=20000,
        help="series limit of the whole buffer (default 20000)",
    )
    p.add_argument(
        "--scrape-timeout",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="timeout of one application scrape (default 5s, or --interval if shorter)",
    )
    p.add_argument("--cgroup-root", default="/sys/fs/cgroup", help="cgroup v2 mount (default /sys/fs/cgroup)")
    p.add_argument("--no-cgroups", action="store_true", help="do not read pod and container cgroups")
    p.add_argument("--no-apps", action="store_true", help="do not scrape annotated application endpoints")
    p.add_argument("--no-node", action="store_true", help="do not collect node metrics")
    p.add_argument("--no-otlp", action="store_true", help="do not accept OTLP/HTTP metrics on /v1/metrics")
    p.add_argument(
        "--otlp-allow-unbound",
        action="store_true",
        help="accept OTLP pushes from senders that are not exactly one pod of this node (host-network "
        "pods, node processes, other nodes, shared IPs) and trust their k8s.* resource attributes. "
        "Default: refused (partial_success; kcms_agent_otlp_rejected_total{reason=unbound_sender|"
        "host_network_sender|ambiguous_sender}); a pod's points are always bound to that pod",
    )
    p.add_argument(
        "--no-kubelet", action="store_true", help="do not scrape the local kubelet's /metrics/resource"
    )
    p.add_argument(
        "--kubelet-address",
        default=os.environ.get("NODE_IP", "127.0.0.1"),
        help="the local kubelet's address (default: $NODE_IP, set from status.hostIP by the DaemonSet)",
    )
    p.add_argument("--kubelet-port", type=port, default=10250, help="the kubelet's port (default 10250)")
    p.add_argument(
        "--kubelet-certificate-authority",
        default="",
        metavar="FILE",
        help="CA of the kubelet's serving certificate (default: the cluster CA of the kubeconfig)",
    )
    p.add_argument(
        "--kubelet-insecure-tls", action="store_true", help="do not verify the kubelet's certificate"
    )
    p.add_argument(
        "--push",
        type=_push_urls,
        default=None,
        metavar="URL[,URL...]",
        help="push mode: POST node/pod usage and custom series every --push-interval to the first of "
        "these KCMS servers that accepts (a standby answers 503 and the next is tried)",
    )
    p.add_argument(
        "--push-interval",
        type=_duration,
        default=15.0,
        metavar="DURATION",
        help="push period (default 15s)",
    )
    p.add_argument(
        "--push-timeout",
        type=_duration,
        default=5.0,
        metavar="DURATION",
        help="timeout of one push to one server (default 5s)",
    )
    p.add_argument(
        "--push-token-file",
        default=None,
        metavar="FILE",
        help="bearer token for the pushes, re-read before each (default: the pod's service-account "
        "token, if present)",
    )
    p.add_argument(
        "--push-ca-file",
        default="",
        metavar="FILE",
        help="CA that signed the servers' certificates (default: the system trust store)",
    )
    if not any("-v" in a.option_strings for a in p._actions):
        p.add_argument(
            "-v", "--v", type=int, default=0, metavar="LEVEL", help="log verbosity (0-10; 2+ is debug)"
        )


def _kubelet_source(args: argparse.Namespace, client) -> object:
    """The local kubelet, reached as the collector reaches kubelets (the kubeconfig's identity)."""
    from kcms.agent.kubelet import KubeletSource
    from kcms.collector.kubelet import KubeletClient, KubeletClientConfig
    from kcms.model import NodeInfo

    config = KubeletClientConfig(
        port=args.kubelet_port,
        preferred_address_types=("InternalIP",),
        insecure_tls=args.kubelet_insecure_tls,
        ca_file=args.kubelet_certificate_authority or (client.ca_file() if client is not None else None),
        token_source=client.bearer_token if client is not None else None,
    )
    node = NodeInfo(args.node_name, {}, [("InternalIP", args.kubelet_address)], 0, "")
    return KubeletSource(KubeletClient(config), node)


def _usage_error(message: str) -> int:
    print(f"kcms agent: error: {message}", file=sys.stderr)
    return 2


def _validate(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags beyond their types, naming the flag; None if nothing."""
    needs_pods = not (args.no_cgroups and args.no_apps)
    needs_node = needs_pods or not args.no_node or not args.no_kubelet or not args.insecure_serving
    if not args.node_name and needs_node:
        return "argument --node-name: required (or set NODE_NAME)"
    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        return "arguments --tls-cert-file and --tls-private-key-file must be given together"
    if args.insecure_serving and (args.tls_cert_file or args.client_ca_file):
        return "argument --insecure-serving: not allowed with --tls-cert-file or --client-ca-file"
    if not args.insecure_serving and not args.tls_cert_file:
        return (
            "argument --tls-cert-file: required: /metrics is served over TLS to authorized callers "
            "(give --tls-cert-file and --tls-private-key-file, or --insecure-serving for tests)"
        )
    if args.otlp_listen and args.no_otlp:
        return "argument --otlp-listen: not allowed with --no-otlp"
    if args.otlp_allow_unbound and args.no_otlp:
        return "argument --otlp-allow-unbound: not allowed with --no-otlp"
    for flag in (
        "kubeconfig",
        "tls_cert_file",
        "tls_private_key_file",
        "client_ca_file",
        "kubelet_certificate_authority",
        "push_token_file",
        "push_ca_file",
    ):
        path = getattr(args, flag)
        if path and not os.path.isfile(path):
            return f"argument --{flag.replace('_', '-')}: no such file: {path}"
    if args.retention < args.interval:
        return (
            f"argument --retention: must be at least --interval ({args.interval:g}s), got {args.retention:g}s"
        )
    if args.scrape_timeout is not None and args.scrape_timeout > args.interval:
        return f"argument --scrape-timeout: must not exceed --interval ({args.interval:g}s)"
    if not args.no_cgroups and not os.path.isdir(args.cgroup_root):
        return f"argument --cgroup-root: no such directory: {args.cgroup_root}"
    if args.push:
        if args.no_kubelet:
            return "argument --push: needs the kubelet's readings (drop --no-kubelet)"
        if args.push_timeout > args.push_interval:
            return f"argument --push-timeout: must not exceed --push-interval ({args.push_interval:g}s)"
    return None


def _token_source(path: str | None) -> TokenFile | None:
    """The push token from ``path`` (default: the service-account token, if present), re-read when
    the file changes (projected tokens rotate in place); a torn rewrite keeps the last good token."""
    if path is None:
        if not os.path.isfile(SERVICE_ACCOUNT_TOKEN):
            return None
        path = SERVICE_ACCOUNT_TOKEN
    return TokenFile(path)


def _push_reporter(args: argparse.Namespace, client, buffer: SampleBuffer):
    """The reporter of ``--push``: its own kubelet scrape per push, the buffer's series along."""
    from kcms.agent.push import PushReporter
    from kcms.store.wire import Write, node_to_wire

    source = _kubelet_source(args, client)

    async def collect() -> Write:
        batch = await source.scrape_batch()  # type: ignore[attr-defined]
        if batch is None:
            log.warning("kubelet scrape failed (%s): pushing custom series only", source.errors)  # type: ignore[attr-defined]
            return Write()
        return Write(nodes=[node_to_wire(batch)])

    reporter = PushReporter(
        args.push,
        interval=args.push_interval,
        timeout=args.push_timeout,
        token_source=_token_source(args.push_token_file),
        ca_file=args.push_ca_file or None,
        collect=collect,
        buffer=buffer,
    )
    return reporter, source


async def agent_main(args: argparse.Namespace) -> int:
    """Run the agent with the parsed ``args`` until SIGTERM/SIGINT; 2 for bad flags."""
    problem = _validate(args)
    if problem is not None:
        return _usage_error(problem)
    tls = None
    if args.tls_cert_file:
        try:
            tls = ServingTLS(args.tls_cert_file, args.tls_private_key_file)
        except (OSError, ssl.SSLError) as e:
            return _usage_error(f"argument --tls-cert-file: cannot load the certificate and key: {e}")
        if args.client_ca_file:
            try:
                tls.trust_clients(args.client_ca_file)
            except (OSError, ssl.SSLError) as e:
                return _usage_error(f"argument --client-ca-file: cannot load {args.client_ca_file}: {e}")
    if args.push and args.push_ca_file:
        try:
            ssl.create_default_context(cafile=args.push_ca_file)
        except (OSError, ssl.SSLError) as e:
            return _usage_error(f"argument --push-ca-file: cannot load {args.push_ca_file}: {e}")

    buffer = SampleBuffer(args.retention, args.max_series_per_pod, args.max_series_per_node)
    sources: dict[str, object] = {}
    client = informer = None
    needs_pods = not (args.no_cgroups and args.no_apps)
    needs_api = needs_pods or not args.insecure_serving  # /metrics callers are reviewed by the API server
    if needs_api or not args.no_kubelet or not args.no_otlp:  # OTLP binds senders to the pods it lists
        from kcms.kube.client import KubeClient, KubeConfigError

        try:
            client = await KubeClient.load(args.kubeconfig or None)
        except KubeConfigError as e:
            if needs_api or args.kubeconfig:
                return _usage_error(f"argument --kubeconfig: {e}")
            # Only the kubelet source wanted the cluster's identity: try it without credentials.
            log.warning("no Kubernetes credentials (%s): the kubelet is scraped anonymously", e)
    # the OTLP receiver binds senders to this node's pods: it uses the informer whenever it can
    if needs_pods or (not args.no_otlp and client is not None and args.node_name):
        from kcms.agent.pods import pod_informer

        assert client is not None
        informer = pod_informer(client, args.node_name)
    if not args.no_kubelet:
        sources["kubelet"] = _kubelet_source(args, client)
    if not args.no_cgroups:
        from kcms.agent.cgroups import CgroupSource

        assert informer is not None
        sources["cgroups"] = CgroupSource(informer.values, args.cgroup_root)
    if not args.no_node:
        from kcms.agent.node import NodeSource

        sources["node"] = NodeSource(args.node_name)
    if not args.no_apps:
        from kcms.agent.apps import AppSource

        assert informer is not None
        sources["apps"] = AppSource(informer.values, timeout=args.scrape_timeout or min(5.0, args.interval))
    routes = []
    if not args.no_otlp:
        from kcms.agent.otlp import otlp_routes
        from kcms.agent.pods import PodsByIP

        pods = None
        if informer is not None:  # the node's own address ($NODE_IP) is a host-network sender
            pods = PodsByIP.of_informer(informer, node_ips=[args.kubelet_address])
        elif not args.otlp_allow_unbound:
            log.warning("no pod list (no Kubernetes credentials): every OTLP push is refused as unbound")
        routes = otlp_routes(
            buffer,
            pods=pods,
            node_name=args.node_name,
            allow_unbound=args.otlp_allow_unbound,
            max_series_per_sender=args.max_series_per_pod,
            series_idle=args.retention,
        )

    auth = None
    if not args.insecure_serving:
        from kcms.agent.auth import MetricsAuth

        auth = MetricsAuth.from_client(args.node_name, client, args.max_pending_reviews)
    agent = Agent(
        buffer, sources, args.interval, args.listen, routes, tls, auth=auth, extra_listen=args.otlp_listen
    )
    reporter = push_source = None
    if args.push:
        reporter, push_source = _push_reporter(args, client, buffer)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    informer_start = None
    try:
        if informer is not None:  # in the background: the server answers while the first list is pending
            informer_start = asyncio.create_task(informer.start(), name="agent pod informer")
        try:
            await agent.start()
        except OSError as e:
            flags = "--listen" if not args.otlp_listen else "--listen or --otlp-listen"
            return _usage_error(f"argument {flags}: cannot listen: {e}")
        if reporter is not None:
            reporter.start()
            log.info("pushing to %s every %gs", ", ".join(args.push), args.push_interval)
        await stop.wait()
        log.info("stopping")
        return 0
    finally:
        if reporter is not None:
            await reporter.stop()
        if push_source is not None:
            await push_source.close()  # type: ignore[attr-defined]
        await agent.stop()
        if informer is not None:
            await informer.stop()
        if informer_start is not None:
            informer_start.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await informer_start
        if client is not None:
            await client.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kcms.cmd.agent``: parse ``argv`` and run the agent."""
    parser = argparse.ArgumentParser(prog="kcms agent", description="KCMS node agent")
    add_agent_arguments(parser)
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.v >= 2 else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname).1s %(name)s: %(message)s")
    return asyncio.run(agent_main(args))


if __name__ == "__main__":
    sys.exit(main())
