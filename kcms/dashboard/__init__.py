"""The KCMS dashboard: a local web page on 127.0.0.1 that reads the cluster through the user's
kubeconfig (nothing new is exposed in the cluster). See docs/dashboard.md.

Entry points (used by ``kubectl kcms dashboard`` in kcms/kubectl and by ``kcms demo``)::

    async def serve_dashboard(
        kube: kcms.kube.client.KubeClient,   # a loaded client (KubeClient.load(kubeconfig, context))
        host: str = "127.0.0.1",             # the only address accepted (ValueError otherwise)
        port: int = 0,                        # 0: a free port
        *,
        refresh: float | None = None,         # seconds between page refreshes; None: the metrics'
                                              # window (the metric resolution), 5-300 s
        context: str = "",                    # shown in the page header (the kubeconfig context)
    ) -> DashboardServer                      # started; .url (with the token), .port, .token,
                                              # await .stop() (does not close ``kube``)

    async def open_dashboard(                 # what `kcms demo` uses: loads the client itself,
        kubeconfig: str | None, port: int = 0,  # and .stop() closes it
        *, context: str | None = None, refresh: float | None = None,
    ) -> DashboardServer                      # KubeConfigError for an unusable kubeconfig

    def run_dashboard(
        kubeconfig: str | None = None,        # None: $KUBECONFIG's first file, else ~/.kube/config,
                                              # else the in-cluster service account
        context: str | None = None,           # the kubeconfig context (default: current-context)
        port: int = 0,
        *,
        open_browser: bool = False,           # also open the URL with Python's webbrowser module
        refresh: float | None = None,
        out: TextIO | None = None,            # where the URL is printed (default sys.stdout)
    ) -> int                                  # blocking until SIGINT/SIGTERM; 0, or 1 when the
                                              # kubeconfig is unusable (message on stderr)

The printed URL holds a random per-run token: every request without it is refused (403).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from kcms.dashboard.server import DashboardServer
    from kcms.kube.client import KubeClient

__all__ = ["serve_dashboard", "open_dashboard", "run_dashboard", "default_kubeconfig"]


async def serve_dashboard(
    kube: KubeClient,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    refresh: float | None = None,
    context: str = "",
) -> DashboardServer:
    """Start the dashboard for ``kube`` on 127.0.0.1:``port`` and return it (see the module docstring)."""
    from kcms.dashboard.server import LOOPBACK, DashboardServer

    if host != LOOPBACK:
        # A local tool: any other address (0.0.0.0, a LAN address, even ::1 or localhost) is refused
        # rather than interpreted, so a typo can never expose the user's credentials on a network.
        raise ValueError(f"the dashboard binds {LOOPBACK} only, not {host!r}")
    if refresh is not None and not 1.0 <= refresh <= 3600.0:
        raise ValueError(f"refresh must be between 1 and 3600 seconds, not {refresh!r}")
    server = DashboardServer(kube, port, refresh=refresh, context=context)
    await server.start()
    return server


async def open_dashboard(
    kubeconfig: str | None, port: int = 0, *, context: str | None = None, refresh: float | None = None
) -> DashboardServer:
    """Load ``kubeconfig`` (``context``) and serve the dashboard for it; its `stop` closes the client."""
    from kcms.dashboard.server import DashboardServer
    from kcms.kube.client import KubeClient

    kube = await KubeClient.load(kubeconfig, context)
    server = DashboardServer(kube, port, refresh=refresh, context=context or "", owns_kube=True)
    try:
        await server.start()
    except BaseException:
        await kube.close()
        raise
    return server


def default_kubeconfig() -> str | None:
    """The kubeconfig file kubectl would read: $KUBECONFIG's first existing file, else ~/.kube/config
    when it exists, else None (the in-cluster service account)."""
    env = os.environ.get("KUBECONFIG", "")
    for path in env.split(os.pathsep):
        if path and os.path.isfile(path):
            return path
    home = os.path.join(os.path.expanduser("~"), ".kube", "config")
    return home if os.path.isfile(home) else None


def run_dashboard(
    kubeconfig: str | None = None,
    context: str | None = None,
    port: int = 0,
    *,
    open_browser: bool = False,
    refresh: float | None = None,
    out: TextIO | None = None,
) -> int:
    """Serve the dashboard until SIGINT/SIGTERM (see the module docstring); returns the exit code."""
    return asyncio.run(_run(kubeconfig, context, port, open_browser, refresh, out or sys.stdout))


async def _run(
    kubeconfig: str | None,
    context: str | None,
    port: int,
    open_browser: bool,
    refresh: float | None,
    out: TextIO,
) -> int:
    from kcms.kube.client import KubeClient
    from kcms.kube.kubeconfig import KubeConfigError

    path = kubeconfig if kubeconfig is not None else default_kubeconfig()
    try:
        kube = await KubeClient.load(path, context)
    except KubeConfigError as e:
        print(f"kcms dashboard: {e}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (ValueError, RuntimeError):  # not the main thread (an embedding program): no signals
            pass
    try:
        try:
            server = await serve_dashboard(kube, port=port, refresh=refresh, context=context or "")
        except OSError as e:
            print(f"kcms dashboard: cannot listen on 127.0.0.1:{port}: {e.strerror or e}", file=sys.stderr)
            return 1
        except ValueError as e:  # a refresh out of range
            print(f"kcms dashboard: {e}", file=sys.stderr)
            return 1
        try:
            print(f"KCMS dashboard for {kube.host}: {server.url}", file=out, flush=True)
            print(
                "Open it in a browser on this machine; the URL holds this run's access token.",
                file=out,
                flush=True,
            )
            if open_browser:
                import webbrowser

                await loop.run_in_executor(None, webbrowser.open, server.url)
            await stop.wait()
        finally:
            await server.stop()
    finally:
        await kube.close()
    return 0
