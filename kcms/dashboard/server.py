"""The dashboard's local web server: the page's files and the allow-listed API proxy, on 127.0.0.1.

Protection (a local tool's, see docs/dashboard.md): the socket is bound to 127.0.0.1 only; every
request must carry the per-run random token as the first path segment (``/<token>/...``, compared in
constant time) or it is refused with 403 — other local users and other pages in the browser cannot
guess it; the Host header must be ``127.0.0.1:<port>`` or ``localhost:<port>`` (a DNS-rebinding page
reaches the socket under its own host name and is refused); only GET and HEAD; no CORS header is ever
sent; every answer carries a strict Content-Security-Policy (scripts and styles from this server
only, no inline script, no framing), ``nosniff``, ``no-referrer`` and ``no-store``. The page itself
puts every API string into the DOM as text (kcms/dashboard/static/app.js never uses innerHTML).

Each refusal is one escaped, bounded log line and counted in
``kcms_dashboard_refused_requests_total{reason}`` (reason: host, token, method, path, query).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from importlib import resources
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import Counter

from kcms.dashboard.proxy import NODES_PATH, NodesCache, Refused, check, trim_nodes
from kcms.kube.client import KubeAPIError, KubeClient
from kcms.limits import printable

log = logging.getLogger(__name__)

REFUSED = Counter(
    "kcms_dashboard_refused_requests_total",
    "Requests the local dashboard server refused, by reason (host, token, method, path, query).",
    ["reason"],
)

LOOPBACK = "127.0.0.1"
MAX_UPSTREAM = 8  # concurrent API requests: the page makes a handful per refresh

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

# (URL path under /<token>/, file in kcms/dashboard/static, content type)
STATIC_FILES = (
    ("", "index.html", "text/html; charset=utf-8"),
    ("app.js", "app.js", "text/javascript; charset=utf-8"),
    ("style.css", "style.css", "text/css; charset=utf-8"),
    ("vendor/uplot/uPlot.iife.min.js", "vendor/uplot/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    ("vendor/uplot/uPlot.min.css", "vendor/uplot/uPlot.min.css", "text/css; charset=utf-8"),
)


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


def load_static() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once from the installed package: URL path -> (content, content type)."""
    root = resources.files("kcms.dashboard") / "static"
    return {url: ((root / name).read_bytes(), ctype) for url, name, ctype in STATIC_FILES}


class DashboardServer:
    """One running dashboard: `url` (with its token) is what the user opens. Closes ``kube`` on
    `stop` only when ``owns_kube``."""

    def __init__(
        self,
        kube: KubeClient,
        port: int = 0,
        *,
        refresh: float | None = None,
        context: str = "",
        owns_kube: bool = False,
    ) -> None:
        self.kube = kube
        self.owns_kube = owns_kube  # stop() closes the client too (open_dashboard loaded it)
        self.requested_port = port
        self.refresh = refresh
        self.context = context
        self.token = secrets.token_urlsafe(32)
        self.port = 0
        self._static = load_static()
        self._nodes = NodesCache()
        self._upstream = asyncio.Semaphore(MAX_UPSTREAM)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/{self.token}/"

    # ---- life cycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application(middlewares=[self._guard], client_max_size=4096)
        app.router.add_route("*", "/{tail:.*}", self._route)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, LOOPBACK, self.requested_port, reuse_address=True)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # noqa: S101 - set by start()
        self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.owns_kube:
            await self.kube.close()

    # ---- protection ----------------------------------------------------------------------------
    def _refuse(self, request: web.Request, reason: str, code: int, message: str) -> web.Response:
        REFUSED.labels(reason).inc()
        # Only refused requests are logged: the path escaped, cut, and with the token masked (the log
        # may be read by others than the person the URL was printed for).
        log.warning(
            "dashboard: refused %s %s from %s: %s",
            printable(request.method, 10),
            printable(request.rel_url.raw_path.replace(self.token, "<token>"), 200),
            printable(request.remote or "?", 60),
            message,
        )
        return _status(code, "Forbidden" if code == 403 else "MethodNotAllowed", message)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response = await self._check(request, handler)
        response.headers.update(SECURITY_HEADERS)
        for name in [h for h in response.headers if h.lower().startswith("access-control-")]:
            del response.headers[name]  # never: the page is same-origin, no other origin may read
        return response

    async def _check(self, request: web.Request, handler: Any) -> web.StreamResponse:
        host = request.headers.get("Host", "")
        if host not in (f"{LOOPBACK}:{self.port}", f"localhost:{self.port}"):
            return self._refuse(
                request, "host", 403, "Host header not allowed (open the URL the dashboard printed)"
            )
        first, _, _ = request.rel_url.raw_path.lstrip("/").partition("/")
        if not hmac.compare_digest(first.encode(), self.token.encode()):
            return self._refuse(
                request, "token", 403, "this dashboard URL needs its token (see the printed URL)"
            )
        if request.method not in ("GET", "HEAD"):
            return self._refuse(request, "method", 405, "the dashboard is read-only: GET only")
        return await handler(request)

    # ---- content -------------------------------------------------------------------------------
    async def _route(self, request: web.Request) -> web.StreamResponse:
        raw = request.rel_url.raw_path
        prefix = f"/{self.token}"
        if raw == prefix:
            raise web.HTTPFound(prefix + "/")
        tail = raw[len(prefix) + 1 :]
        if tail.startswith("k8s/"):
            return await self._proxy(request, raw[len(prefix) + 4 :])
        if tail == "config.json":
            return web.Response(body=orjson.dumps(self._config()), content_type="application/json")
        found = self._static.get(tail)
        if found is None:
            return _status(404, "NotFound", "no such file")
        body, ctype = found
        return web.Response(body=body, headers={"Content-Type": ctype})

    def _config(self) -> dict[str, Any]:
        return {"server": self.kube.host, "context": self.context, "refresh": self.refresh}

    async def _proxy(self, request: web.Request, path: str) -> web.StreamResponse:
        try:
            upstream = check(path, request.rel_url.query)
        except Refused as e:
            return self._refuse(request, e.reason, 403, e.message)
        if upstream.path == NODES_PATH:
            cached = self._nodes.get()
            if cached is not None:
                return web.Response(body=cached, content_type="application/json")
        try:
            async with self._upstream:
                body = await self.kube.get_raw(upstream.path, upstream.params)
            if upstream.path == NODES_PATH:
                body = trim_nodes(body)
                self._nodes.put(body)
        except KubeAPIError as e:
            # The API server's own answer (404 for an absent group, 403 without a grant): the page
            # decides (e.g. no history: tables without charts).
            if isinstance(e.body, dict) and e.body.get("kind") == "Status":
                return web.Response(
                    status=e.status, body=orjson.dumps(e.body), content_type="application/json"
                )
            return _status(e.status, e.reason or "Unknown", printable(e.message, 300))
        except (TimeoutError, asyncio.TimeoutError):  # noqa: UP041 - aiohttp raises either
            return _status(504, "Timeout", "the Kubernetes API server did not answer in time")
        except (aiohttp.ClientError, OSError) as e:
            log.warning(
                "dashboard: cannot reach the API server %s: %s", self.kube.host, printable(str(e), 200)
            )
            return _status(
                502, "ServiceUnavailable", f"cannot reach the Kubernetes API server: {printable(str(e), 200)}"
            )
        except orjson.JSONDecodeError:
            return _status(502, "ServiceUnavailable", "the API server's node list is not JSON")
        return web.Response(body=body, content_type="application/json")
