"""`kubectl kcms`: a kubectl plugin (the `kubectl-kcms` console script, found by kubectl on PATH), also
run as `kcms top`. See docs/kubectl-plugin.md.

    top nodes [NAME] [-l SEL] [--sort-by cpu|memory] [--show-capacity] [--watch] [--no-headers] [-o json|yaml]
    top pods [NAME] [-n NS | -A] [-l SEL] [--field-selector SEL] [--containers] [--sort-by ...] [--watch] ...
    metrics [--custom | --external] [-o json|yaml]    custom and external metrics from discovery
    get METRIC (--pods [NAME] | --object RESOURCE/NAME | --external) [-l SEL] [-n NS] [-o json|yaml]
    dashboard [--port N]                              the local web dashboard (kcms.dashboard)

It reads the user's kubeconfig (kcms/kubectl/client.py) and goes through the API server as
`kubectl top` does. Every failure is one line on stderr and exit code 1 (argparse's usage errors: 2).
This module imports only argparse at load: the commands import what they need when they run, and
nothing here imports the KCMS server side.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

DEFAULT_TIMEOUT = 30.0
DEFAULT_SINCE = "5m"


def _duration(text: str) -> float:
    from kcms.flags import parse_duration

    value = parse_duration(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {text!r}")
    return value


def _positive_duration(text: str) -> float:
    value = _duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text!r}")
    return value


def _common(p: argparse.ArgumentParser, top_level: bool) -> None:
    """kubectl's connection flags; accepted before or after the command (kubectl passes a plugin's
    flags through untouched). Only the top level sets defaults, so a later position wins."""
    d = {} if top_level else {"default": argparse.SUPPRESS}
    g = p.add_argument_group("connection (as kubectl)")
    g.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file (default: the files in KUBECONFIG, else ~/.kube/config, else in-cluster)",
        **({"default": None} if top_level else d),
    )
    g.add_argument(
        "--context", metavar="NAME", help="kubeconfig context (default: current-context)",
        **({"default": None} if top_level else d),
    )  # fmt: skip
    g.add_argument(
        "-n", "--namespace", metavar="NS", help="namespace (default: the context's, else default)",
        **({"default": None} if top_level else d),
    )  # fmt: skip
    g.add_argument(
        "--request-timeout",
        type=_duration,
        metavar="DURATION",
        help=f"cap on each request to the API server, 0: none (default {DEFAULT_TIMEOUT:g}s)",
        **({"default": DEFAULT_TIMEOUT} if top_level else d),
    )


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o", "--output", choices=("json", "yaml"), default=None,
        help="print the API objects instead of a table (with KCMS, the history objects too)",
    )  # fmt: skip


def _top_flags(p: argparse.ArgumentParser, pods: bool) -> None:
    p.add_argument("name", nargs="?", default="", metavar="NAME", help="one object by name")
    p.add_argument("-l", "--selector", default="", metavar="SELECTOR", help="label selector (e.g. app=web)")
    if pods:
        p.add_argument(
            "--field-selector", default="", metavar="SELECTOR", help="field selector (e.g. metadata.name=x)"
        )
        p.add_argument(
            "-A",
            "--all-namespaces",
            action="store_true",
            help="pods of every namespace (NAMESPACE column first)",
        )
        p.add_argument("--containers", action="store_true", help="one row per container (POD column)")
    else:
        p.add_argument(
            "--show-capacity", action="store_true", help="percentages of capacity instead of allocatable"
        )
    p.add_argument(
        "--sort-by", choices=("cpu", "memory"), default=None, help="biggest first (default: by name)"
    )
    p.add_argument("--no-headers", action="store_true", help="no header line")
    p.add_argument(
        "-w", "--watch", action="store_true", help="print again every --interval until interrupted (Ctrl-C)"
    )
    p.add_argument(
        "--interval", type=_positive_duration, default=15.0, metavar="DURATION",
        help="time between two prints with --watch (default 15s, the metric resolution)",
    )  # fmt: skip
    p.add_argument(
        "--sparkline", choices=("auto", "cpu", "memory", "off"), default="auto",
        help="history column (KCMS's history.kcms.io only): auto (default) is memory with --sort-by memory, "
        "else cpu; off leaves it out",
    )  # fmt: skip
    p.add_argument(
        "--since", default=DEFAULT_SINCE, metavar="DURATION",
        help=f"length of the history column (default {DEFAULT_SINCE}; at most the server's --history)",
    )  # fmt: skip
    _output(p)
    _common(p, False)


def build_parser(prog: str = "kubectl kcms") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Resource usage with its last minutes, and custom and external metrics, through the "
        "Kubernetes API server (KCMS or metrics-server).",
    )
    _common(parser, True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    top = sub.add_parser("top", help="CPU and memory of nodes or pods, as kubectl top, with history")
    _common(top, False)
    what = top.add_subparsers(dest="what", required=True, metavar="nodes|pods")
    _top_flags(what.add_parser("nodes", aliases=["node", "no"], help="nodes"), pods=False)
    _top_flags(what.add_parser("pods", aliases=["pod", "po"], help="pods"), pods=True)

    p = sub.add_parser("metrics", help="custom and external metrics the cluster serves (discovery)")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--custom", action="store_true", help="only custom.metrics.k8s.io")
    kind.add_argument("--external", action="store_true", help="only external.metrics.k8s.io")
    _output(p)
    _common(p, False)

    p = sub.add_parser("get", help="values of one custom or external metric")
    p.add_argument("metric", metavar="METRIC")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--pods", nargs="?", const="*", default=None, metavar="NAME",
        help="the metric of pods: one by NAME, else all of the namespace (narrowed by -l)",
    )  # fmt: skip
    target.add_argument(
        "--object", default=None, metavar="RESOURCE/NAME",
        help="the metric of one object, e.g. deployments.apps/web or nodes/n1 ('*' as NAME: all)",
    )  # fmt: skip
    target.add_argument("--external", action="store_true", help="an external metric")
    p.add_argument(
        "-l", "--selector", default="", metavar="SELECTOR",
        help="label selector: of the objects (custom), of the metric's labels (external)",
    )  # fmt: skip
    p.add_argument(
        "--metric-selector", default="", metavar="SELECTOR",
        help="selector of the metric's labels (custom.metrics.k8s.io/v1beta2's metricLabelSelector)",
    )  # fmt: skip
    p.add_argument("--no-headers", action="store_true", help="no header line")
    _output(p)
    _common(p, False)

    p = sub.add_parser(
        "dashboard", help="serve the KCMS dashboard on 127.0.0.1 (reads through your kubeconfig)"
    )
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default 0: a free one)")
    p.add_argument("--open", action="store_true", help="also open the page in the default browser")
    p.add_argument(
        "--refresh", type=_positive_duration, default=None, metavar="DURATION",
        help="time between page refreshes (default: the metrics' window, the metric resolution)",
    )  # fmt: skip
    _common(p, False)
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """The `kubectl-kcms` entry point (and `kcms top`); returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    if prog is None:
        prog = "kubectl kcms" if os.path.basename(sys.argv[0]).startswith("kubectl-") else "kcms"
    args = build_parser(prog).parse_args(words)
    if args.command == "top" and args.what in ("node", "no"):
        args.what = "nodes"
    elif args.command == "top" and args.what in ("pod", "po"):
        args.what = "pods"
    if args.command == "top":
        from kcms.flags import parse_duration

        try:
            args.since = parse_duration(args.since)
        except argparse.ArgumentTypeError as e:
            print(f"error: argument --since: {e}", file=sys.stderr)
            return 1
        if args.since <= 0:
            print("error: argument --since: must be positive", file=sys.stderr)
            return 1
        args.since_text = _since_text(args.since)
    from kcms.kubectl.run import run

    return run(args)


def _since_text(seconds: float) -> str:
    """A duration as the history API's `since` takes it (e.g. 5m, 90s)."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"
