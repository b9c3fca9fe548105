"""`kubectl kcms dashboard`: the KCMS dashboard (kcms/dashboard, docs/dashboard.md) on 127.0.0.1, reading
the cluster through the kubeconfig the other commands use (``--kubeconfig``, ``KUBECONFIG``,
``~/.kube/config``, in-cluster; ``--context``). The dashboard package is imported only here, when the
command runs, so the other commands never load its web server."""

from __future__ import annotations

import argparse

from kcms.kubectl.client import PluginError, find_kubeconfig


def run_dashboard(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise PluginError(f"argument --port: {args.port} is not a port (0-65535)")
    path = find_kubeconfig(args.kubeconfig)
    try:
        from kcms import dashboard
    except ImportError as e:
        raise PluginError(f"the dashboard is not part of this installation ({e})") from None
    return dashboard.run_dashboard(
        kubeconfig=path, context=args.context, port=args.port, open_browser=args.open, refresh=args.refresh
    )
