"""The agent's HTTP server and collection loop.

``GET /metrics`` serves the buffer in the agent exposition format (``?since=<ms>``: every point
newer than ``since``), with the header ``X-KCMS-Agent-Time`` (the agent's clock, milliseconds, when
the body was made). ``GET /metrics/agent`` serves the agent's own Prometheus counters (refusals by
reason, source errors, push outcomes), guarded like ``/metrics``. ``GET /healthz`` answers ``ok``. Other routes (the OTLP receiver) plug in with
``extra_routes``.

``/metrics`` holds every pod's metrics on the node, so ``kcms agent`` serves it over TLS
(``--tls-cert-file``, ``--tls-private-key-file``) to authenticated and authorized callers only
(``auth``: :class:`kcms.agent.auth.MetricsAuth`, a bearer token or a client certificate, then a
SubjectAccessReview for ``get`` on ``nodes/metrics`` of this node, as the kubelet's own ``/metrics``).
``/healthz`` and the ``extra_routes`` stay open: probes carry no credentials, and OTLP senders are
applications, bound by their own rules (:mod:`kcms.agent.otlp`). ``extra_listen`` serves the
``extra_routes`` and ``/healthz`` (never ``/metrics``) on a second, plain-HTTP address as well, so
applications can push OTLP without the agent's CA. Without ``ssl_context`` and ``auth``
(``--insecure-serving``: tests, simulations) ``/metrics`` is open to anyone who reaches the port, and
:meth:`Agent.start` says so in a warning.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import prometheus_client
from aiohttp import web
from prometheus_client import Counter

from kcms.agent.auth import MetricsAuth
from kcms.agent.buffer import Sample, SampleBuffer
from kcms.httpguard import GuardedRunner, GuardOptions
from kcms.limits import printable
from kcms.tasks import cancel_and_wait, run_every

__all__ = ["AGENT_TIME_HEADER", "OWN_METRICS_PATH", "Agent", "ServingTLS", "Source", "make_app"]

log = logging.getLogger(__name__)

AGENT_TIME_HEADER = "X-KCMS-Agent-Time"
OWN_METRICS_PATH = "/metrics/agent"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SOURCE_ERRORS = Counter("kcms_agent_source_errors", "Source collections that raised, by source.", ["source"])


class Source(Protocol):
    """A source of samples: ``collect(now)`` returns them (sync sources run in a thread)."""

    def collect(self, now: float) -> Iterable[Sample] | Awaitable[Iterable[Sample]]: ...


def make_app(
    buffer: SampleBuffer,
    extra_routes: Sequence[tuple[str, str, Handler]] = (),
    clock: Callable[[], float] = time.time,
    auth: MetricsAuth | None = None,
) -> web.Application:
    """The agent's aiohttp application: ``/metrics`` (guarded by ``auth`` when given), ``/healthz``
    and ``extra_routes``."""

    async def metrics(request: web.Request) -> web.Response:
        if auth is not None:  # before anything else: an anonymous caller learns nothing, not even a 400
            refusal = await auth.check(request)
            if refusal is not None:
                return refusal
        since_text = request.query.get("since")
        since: int | None = None
        if since_text is not None:
            try:
                since = int(since_text)
            except ValueError:
                return web.Response(
                    status=400,
                    text=f"since must be an integer (milliseconds), not {printable(since_text, 40)}\n",
                )
        agent_time = int(clock() * 1000)
        body = buffer.render(since)
        return web.Response(
            body=body,
            headers={"Content-Type": CONTENT_TYPE, AGENT_TIME_HEADER: str(agent_time)},
        )

    async def own_metrics(request: web.Request) -> web.Response:
        """The agent's own counters (refusals by reason, source errors, push outcomes), in the
        Prometheus text format; guarded like ``/metrics``."""
        if auth is not None:
            refusal = await auth.check(request)
            if refusal is not None:
                return refusal
        body = prometheus_client.generate_latest(prometheus_client.REGISTRY)
        return web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get(OWN_METRICS_PATH, own_metrics)
    _add_open_routes(app, extra_routes)
    return app


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def _add_open_routes(app: web.Application, extra_routes: Sequence[tuple[str, str, Handler]]) -> None:
    app.router.add_get("/healthz", _healthz)
    for method, path, handler in extra_routes:
        app.router.add_route(method, path, handler)


class ServingTLS:
    """The agent's TLS server context from certificate files; the pair is re-read when it changes.

    cert-manager renews the Secret in place; :meth:`reload_if_changed` (called every collection
    cycle) loads the new pair into the same context, so new connections get it without a restart.
    ``client_ca_file``: client certificates are requested and, when sent, must verify against it
    (mutual TLS); read once at start. Without it, client certificates are not asked for.
    """

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str | None = None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.load_cert_chain(cert_file, key_file)  # raises OSError / ssl.SSLError
        if client_ca_file:
            self.trust_clients(client_ca_file)
        self._stamp = self._stat()

    def trust_clients(self, client_ca_file: str) -> None:
        """Ask for client certificates and verify those sent against ``client_ca_file``."""
        self.context.load_verify_locations(cafile=client_ca_file)  # raises OSError / ssl.SSLError
        self.context.verify_mode = ssl.CERT_OPTIONAL  # bearer-token callers send no certificate

    def _stat(self) -> tuple[int, ...]:
        out: list[int] = []
        for path in (self.cert_file, self.key_file):
            try:
                st = os.stat(path)
            except OSError:
                return ()
            out += [st.st_mtime_ns, st.st_size, st.st_ino]
        return tuple(out)

    def reload_if_changed(self) -> bool:
        """Load the pair again if either file changed; True if it was reloaded."""
        stamp = self._stat()
        if not stamp or stamp == self._stamp:
            return False
        try:
            # Into a scratch context first: a failed load into the live one can leave it with the new
            # certificate and no key, and then every handshake fails.
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert_file, self.key_file)
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:  # half-written by a renewal: keep the old pair, try again
            log.warning("cannot reload the serving certificate %s: %s", self.cert_file, e)
            return False
        self._stamp = stamp
        log.info("reloaded the serving certificate %s", self.cert_file)
        return True


def _parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, not {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


async def _serve(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, int]:
    """Start serving ``app``; the runner and the port bound (``port`` 0: an ephemeral one)."""
    runner = GuardedRunner(app, GuardOptions(listener="agent"), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    sockets = site._server.sockets if site._server is not None else ()  # type: ignore[union-attr]
    return runner, sockets[0].getsockname()[1] if sockets else port


class Agent:
    """The buffer, its sources and the server, run together.

    Every ``interval`` seconds each source is collected (``await source.acollect(now)`` if it has
    one, else async ``collect`` on the loop, else sync ``collect`` in a worker thread), its samples go
    to the buffer, and the buffer expires old points. Sources with a
    ``types`` mapping (metric -> exposition type) have it declared to the buffer.
    """

    def __init__(
        self,
        buffer: SampleBuffer,
        sources: dict[str, Any],
        interval: float = 10.0,
        listen: str = "0.0.0.0:9102",
        extra_routes: Sequence[tuple[str, str, Handler]] = (),
        ssl_context: ssl.SSLContext | ServingTLS | None = None,
        auth: MetricsAuth | None = None,
        extra_listen: str | None = None,
    ) -> None:
        self.buffer = buffer
        self.sources = sources
        self.interval = interval
        self.host, self.port = _parse_listen(listen)
        self.tls = ssl_context if isinstance(ssl_context, ServingTLS) else None
        self.ssl_context = ssl_context.context if isinstance(ssl_context, ServingTLS) else ssl_context
        self.auth = auth
        self.app = make_app(buffer, extra_routes, auth=auth)
        self.extra_host, self.extra_port = _parse_listen(extra_listen) if extra_listen else ("", 0)
        self.extra_app: web.Application | None = None
        if extra_listen:
            self.extra_app = web.Application()
            _add_open_routes(self.extra_app, extra_routes)
        self.cycles = 0
        self.last_accepted: dict[str, int] = {}
        self._runner: web.AppRunner | None = None
        self._extra_runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None
        self._cycle_done = asyncio.Event()

    async def collect_once(self, now: float | None = None) -> int:
        """Run every source once, buffer the samples, expire old points; samples accepted."""
        now = time.time() if now is None else now
        total = 0
        for name, source in self.sources.items():
            try:
                acollect = getattr(source, "acollect", None)
                if acollect is not None:
                    samples = await acollect(now)
                elif inspect.iscoroutinefunction(source.collect):
                    samples = await source.collect(now)
                else:
                    samples = await asyncio.to_thread(lambda s=source: list(s.collect(now)))
            except Exception:  # a broken source must not stop the others
                SOURCE_ERRORS.labels(name).inc()
                log.exception("source %s failed", name)
                continue
            for metric, kind in list(getattr(source, "types", {}).items()):
                self.buffer.declare(metric, kind)
            accepted = self.buffer.add_many(samples)
            self.last_accepted[name] = accepted
            total += accepted
        self.buffer.expire(time.time())
        if self.tls is not None:
            self.tls.reload_if_changed()
        self.cycles += 1
        self._cycle_done.set()
        self._cycle_done = asyncio.Event()
        return total

    async def wait_cycle(self) -> None:
        """Wait for the next collection cycle to finish."""
        await self._cycle_done.wait()

    async def _loop(self) -> None:
        await run_every(self.interval, self.collect_once, "collection cycle")

    async def start(self) -> None:
        """Bind the server(s) and start the collection loop."""
        self._runner, self.port = await _serve(self.app, self.host, self.port, self.ssl_context)
        if self.extra_app is not None:
            self._extra_runner, self.extra_port = await _serve(
                self.extra_app, self.extra_host, self.extra_port
            )
            log.info("plain-HTTP listener for pushes on %s:%d", self.extra_host, self.extra_port)
        self._task = asyncio.create_task(self._loop(), name="agent collection loop")
        scheme = "https" if self.ssl_context is not None else "http"
        log.info(
            "agent listening on %s://%s:%d, collecting every %gs", scheme, self.host, self.port, self.interval
        )
        if self.ssl_context is None or self.auth is None:
            log.warning(
                "/metrics is served %s%s: every pod's metrics on this node are readable by anyone who "
                "reaches port %d (tests and simulations only)",
                "over plain HTTP" if self.ssl_context is None else "over TLS",
                " without authentication" if self.auth is None else "",
                self.port,
            )

    async def stop(self) -> None:
        """Stop the loop and the server; close sources that have ``close()``."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        for runner in (self._extra_runner, self._runner):
            if runner is not None:
                await runner.cleanup()
        self._runner = self._extra_runner = None
        for source in self.sources.values():
            close = getattr(source, "close", None)
            if close is not None:
                result = close()
                if inspect.isawaitable(result):
                    await result
