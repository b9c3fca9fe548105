"""The agent's HTTP server and collection loop.

``GET /metrics`` serves the buffer in the agent exposition format (``?since=<ms>``: every point
newer than ``since``), with the header ``X-KCMS-Agent-Time`` (the agent's clock, milliseconds, when
the body was made). ``GET /healthz`` answers ``ok``. Other routes (the OTLP receiver) plug in with
``extra_routes``.

The agent serves plain HTTP by default (``--listen 0.0.0.0:9102``): it is meant to be reached only
from inside the cluster (the KCMS collector; restrict it with a NetworkPolicy). ``--tls-cert-file``
and ``--tls-private-key-file`` switch it to HTTPS.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import Counter

from kcms.agent.buffer import Sample, SampleBuffer
from kcms.tasks import cancel_and_wait, run_every

__all__ = ["AGENT_TIME_HEADER", "Agent", "Source", "make_app"]

log = logging.getLogger(__name__)

AGENT_TIME_HEADER = "X-KCMS-Agent-Time"
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
) -> web.Application:
    """The agent's aiohttp application: ``/metrics``, ``/healthz`` and ``extra_routes``."""

    async def metrics(request: web.Request) -> web.Response:
        since_text = request.query.get("since")
        since: int | None = None
        if since_text is not None:
            try:
                since = int(since_text)
            except ValueError:
                return web.Response(
                    status=400, text=f"since must be an integer (milliseconds), not {since_text!r}\n"
                )
        agent_time = int(clock() * 1000)
        body = buffer.render(since)
        return web.Response(
            body=body,
            headers={"Content-Type": CONTENT_TYPE, AGENT_TIME_HEADER: str(agent_time)},
        )

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    for method, path, handler in extra_routes:
        app.router.add_route(method, path, handler)
    return app


def _parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, not {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


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
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.buffer = buffer
        self.sources = sources
        self.interval = interval
        self.host, self.port = _parse_listen(listen)
        self.ssl_context = ssl_context
        self.app = make_app(buffer, extra_routes)
        self.cycles = 0
        self.last_accepted: dict[str, int] = {}
        self._runner: web.AppRunner | None = None
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
        """Bind the server and start the collection loop."""
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
        await site.start()
        sockets = site._server.sockets if site._server is not None else ()  # type: ignore[union-attr]
        if sockets:
            self.port = sockets[0].getsockname()[1]
        self._task = asyncio.create_task(self._loop(), name="agent collection loop")
        log.info("agent listening on %s:%d, collecting every %gs", self.host, self.port, self.interval)

    async def stop(self) -> None:
        """Stop the loop and the server; close sources that have ``close()``."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for source in self.sources.values():
            close = getattr(source, "close", None)
            if close is not None:
                result = close()
                if inspect.isawaitable(result):
                    await result
