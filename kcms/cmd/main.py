"""The one `kcms` command: a sub-command per component.

Flags that mean what a metrics-server flag means have its name and default.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from kcms import __version__
from kcms.cmd.flags import (
    FILE_FLAGS,
    add_auth_flags,
    add_history_flag,
    add_ingest_flags,
    add_kube_flags,
    add_kubelet_flags,
    add_logging_flags,
    add_scrape_worker_flags,
    add_serving_flags,
    apply_ingest_flags,
    check_files,
    validate_history_flag,
    validate_kubelet_flags,
    validate_serving_flags,
)
from kcms.cmd.flags_sources import (
    add_agent_collector_flags,
    add_prometheus_flags,
    add_series_flags,
    validate_agent_collector_flags,
    validate_prometheus_flags,
    validate_series_flags,
)
from kcms.flags import StartupError, parse_duration, port, positive_int

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
        from kcms.cmd import flags_ha

        flags_ha.add_store_flags(p)
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
        from kcms.cmd import flags_ha

        add_kube_flags(p)
        add_kubelet_flags(p)
        add_agent_collector_flags(p)
        flags_ha.add_store_client_flags(p)
        flags_ha.add_leader_flags(p, "kcms-collector", default_on=True)
        flags_ha.add_collector_health_flags(p)
        add_ingest_flags(p)
        add_logging_flags(p)

    p = sub.add_parser(
        "server",
        help="the API server alone: reads the stores, or (--active-standby) takes agents' pushes",
        description="Serve metrics.k8s.io, custom.metrics.k8s.io and external.metrics.k8s.io from store "
        "replicas, or in push mode from an in-process store while holding a Lease.",
    )
    if wanted("server"):
        from kcms.cmd import flags_ha

        add_kube_flags(p)
        add_series_flags(p)
        flags_ha.add_store_client_flags(p)
        flags_ha.add_push_server_flags(p)
        flags_ha.add_leader_flags(p, "kcms-server", default_on=True)
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
        from kcms.cmd.agent import add_agent_arguments

        add_agent_arguments(p)
        add_ingest_flags(p)

    p = sub.add_parser("simulate", help="fake kubelets on loopback, for demos, tests and benchmarks")
    if wanted("simulate"):
        from kcms.cmd.simulate import add_simulate_arguments

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
    """The ``kcms`` command; a :class:`~kcms.flags.StartupError` ends it with its message, exit 1."""
    try:
        return _main(argv)
    except StartupError as e:
        command = (sys.argv[1:] if argv is None else list(argv))[:1]
        print(f"kcms {' '.join(command)}: error: {e}", file=sys.stderr)
        return 1


def _main(argv: Sequence[str] | None) -> int:
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
        check_files(sub, args, FILE_FLAGS)
        validate_prometheus_flags(sub, args)
        from kcms.cmd.standalone import run_standalone

        return asyncio.run(run_standalone(args))
    if args.command in ("store", "collector", "server"):
        return _run_ha(sub, args)
    if args.command == "agent":
        from kcms.cmd.agent import agent_main

        return asyncio.run(agent_main(args))
    if args.command == "simulate":
        from kcms.cmd.simulate import simulate_main

        return asyncio.run(simulate_main(args))
    if args.command == "demo":
        if args.metric_resolution < 10:
            sub.error(f"argument --metric-resolution: must be at least 10s, got {args.metric_resolution:g}s")
        validate_history_flag(sub, args)
        if not 0 <= args.down_nodes <= args.nodes:
            sub.error(f"argument --down-nodes: must be between 0 and --nodes ({args.nodes}), got {args.down_nodes}")
        from kcms.cmd.demo_prometheus import flag_problem

        if problem := flag_problem(args):  # --prometheus, --prometheus-config
            sub.error(problem)
        from kcms.cmd.demo import run_demo

        return asyncio.run(run_demo(args, build_parser("standalone")))
    parser.error(f"unknown command {args.command}")
    return 2


def _run_ha(sub: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from kcms.cmd import flags_ha

    if args.command == "store":
        flags_ha.validate_store(sub, args)
        check_files(sub, args, ("tls_cert_file", "tls_private_key_file", "store_ca_file", "kubeconfig"))
        from kcms.cmd.store import run_store

        return asyncio.run(run_store(args))
    if args.command == "collector":
        validate_kubelet_flags(sub, args)
        flags_ha.validate_store_client(sub, args, required=True)
        if args.leader_elect:
            flags_ha.validate_leader_flags(sub, args)
        if args.agent_scrape_interval < 1:
            sub.error("argument --agent-scrape-interval: must be at least 1s")
        validate_agent_collector_flags(sub, args)
        check_files(sub, args, FILE_FLAGS + ("store_ca_file",))
        from kcms.cmd.collector import run_collector

        return asyncio.run(run_collector(args))
    validate_serving_flags(sub, args)
    flags_ha.validate_store_client(sub, args, required=not args.active_standby)
    if args.active_standby and args.leader_elect:
        flags_ha.validate_leader_flags(sub, args)
    if args.node_stale_after <= 0:
        sub.error("argument --node-stale-after: must be positive")
    check_files(sub, args, FILE_FLAGS + ("store_ca_file",))
    validate_prometheus_flags(sub, args)
    from kcms.cmd.server import run_server

    return asyncio.run(run_server(args))


if __name__ == "__main__":
    sys.exit(main())
