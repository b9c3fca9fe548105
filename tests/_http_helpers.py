"""Small aiohttp servers on loopback for tests: fake kubelets, agents, apps, TLS peers."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from aiohttp import web


async def serve_app(
    app: web.Application, *, ssl_context: ssl.SSLContext | None = None, **runner_options: Any
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on 127.0.0.1 at a free port; return the runner (``cleanup()`` stops it) and
    the port. ``runner_options`` go to :class:`aiohttp.web.AppRunner` (e.g. ``access_log=None``)."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001


async def raw_server(handler, server_ctx) -> tuple[asyncio.AbstractServer, int]:
    """An asyncio stream server on 127.0.0.1 (TLS with ``server_ctx``) and its port."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_ctx)
    return server, server.sockets[0].getsockname()[1]
