"""`kcms store`: one replica of the in-memory store behind an authenticated HTTP API.

Authentication is a shared bearer token read from a file (``--token-file``; re-read when the file
changes, so a rotated Secret takes effect without a restart). Every path but the probes and
``/metrics`` answers 401 without it. A file that is momentarily unusable (empty or truncated
mid-rotation, missing while a Secret's links are swapped, not text) leaves the last good token in
force, as client-go's cached token source does; while no usable token was ever loaded the protected
paths answer 503 and ``/readyz`` is not ready (see :class:`TokenFile`). Refusals are counted in
``kcms_store_auth_failures_total{reason}``. TLS is optional (``--tls-cert-file``); use it whenever
the stores are reached over a network that others share.

Bodies are MessagePack (:mod:`kcms.store.wire`), optionally gzip-compressed: writes at most
``--max-request-bytes`` after decompression, queries and exports at most
:data:`~kcms.store.wire.MAX_QUERY_BYTES` (413 beyond); the lists a query or an export names are
bounded (:func:`kcms.store.wire.request_problem`, 400 beyond). Errors are JSON Kubernetes ``Status``
objects.

A replica that starts while peers exist copies what the ring gives it from them (refill) before it
reports ready on ``/readyz``; when membership changes later it copies the keys it newly owns.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

from kcms.limits import printable
from kcms.model import ObjectRef
from kcms.selectors import SelectorError, parse_label_selector
from kcms.sources.bounds import SAMPLE_REASONS, screen_rows
from kcms.statusbody import status_object
from kcms.store import wire
from kcms.store.resource import ResourceStore
from kcms.store.ring import Ring, node_key
from kcms.store.series import SeriesStore
from kcms.tokenfile import MAX_TOKEN_BYTES as MAX_TOKEN_BYTES  # re-exported: the store's token
from kcms.tokenfile import TokenFile as TokenFile

log = logging.getLogger(__name__)

REQUESTS = Counter("kcms_store_requests_total", "Store API requests, by path and code.", ["path", "code"])
LATENCY = Histogram(
    "kcms_store_request_seconds",
    "Store API request handling time, by path.",
    ["path"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
SAMPLES = Counter("kcms_store_samples_total", "Samples written to this replica, by outcome.", ["outcome"])
SAMPLE_REFUSALS = Counter(
    "kcms_store_refused_samples_total", "Samples a store write refused for a bound, by reason.", ["reason"]
)
for _reason in SAMPLE_REASONS:
    SAMPLE_REFUSALS.labels(_reason)
REFILLED = Counter("kcms_store_refilled_total", "What refills and repairs copied in, by kind.", ["kind"])
SERIES = Gauge("kcms_store_series", "Custom-metric series held by this replica.")
AUTH_FAILURES = Counter(
    "kcms_store_auth_failures_total",
    "Requests refused before their handler: missing or wrong bearer token (401), or no usable "
    "token loaded from --token-file (503).",
    ["reason"],
)


def status(code: int, reason: str, message: str) -> web.Response:
    body = status_object(code, reason, message)
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


def _msgpack(obj: Any) -> web.Response:
    return web.Response(body=wire.encode(obj), content_type=wire.CONTENT_TYPE)


_EXPORT_SLICE = 64  # keys an export decides between two turns of the event loop (~16 ms at most)
_OPEN_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/metrics"})
# The ``path`` label of the request metrics: these, or "other" (a client must not grow /metrics).
_API_PATHS = frozenset(
    {
        "/store/v1/write",
        "/store/v1/query/series",
        "/store/v1/query/resource",
        "/store/v1/metrics",
        "/store/v1/export",
        "/store/v1/status",
    }
)


def _path_label(path: str) -> str:
    return path if path in _API_PATHS else "other"


class StoreService:
    """The HTTP API of one replica over its :class:`ResourceStore` and :class:`SeriesStore`.

    ``peers`` (optional) is what refill needs: ``async peers() -> list[(name, StoreClient)]`` of the
    other members, and ``ring() -> Ring`` of the current membership.
    """

    def __init__(
        self,
        name: str,
        resources: ResourceStore,
        series: SeriesStore,
        token: Callable[[], str],
        *,
        max_request_bytes: int = 64 << 20,
    ) -> None:
        self.name = name
        self.resources = resources
        self.series = series
        self.token = token
        self.ready = False
        self.app = web.Application(client_max_size=max_request_bytes, middlewares=[self._middleware])
        r = self.app.router
        r.add_post("/store/v1/write", self.handle_write)
        r.add_post("/store/v1/query/series", self.handle_query_series)
        r.add_post("/store/v1/query/resource", self.handle_query_resource)
        r.add_post("/store/v1/metrics", self.handle_metrics)
        r.add_post("/store/v1/export", self.handle_export)
        r.add_get("/store/v1/status", self.handle_status)
        r.add_get("/healthz", self.handle_ok)
        r.add_get("/livez", self.handle_ok)
        r.add_get("/readyz", self.handle_ready)
        r.add_get("/metrics", self.handle_prometheus)

    # ---- plumbing ------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler) -> web.StreamResponse:
        path = request.path
        started = time.perf_counter()
        try:
            if path not in _OPEN_PATHS:
                refused = self._authenticate(request)
                if refused is not None:
                    return self._count(path, refused)
            if request.method == "POST" and request.content_type not in (wire.CONTENT_TYPE, ""):
                return self._count(
                    path,
                    status(
                        415, "UnsupportedMediaType", f"send {wire.CONTENT_TYPE}, not {request.content_type}"
                    ),
                )
            try:
                response = await handler(request)
            except web.HTTPRequestEntityTooLarge as e:
                response = status(413, "RequestEntityTooLarge", e.text or "request body too large")
            except web.HTTPException as e:
                if e.status >= 400:
                    response = status(e.status, e.reason.replace(" ", ""), e.text or e.reason)
                else:
                    raise
            except ValueError as e:  # a malformed body (msgspec errors are ValueErrors)
                response = status(400, "BadRequest", f"malformed request body: {printable(str(e), 200)}")
            if response.status == 400:
                log.info("store: refused %s %s: 400", request.method, printable(path, 80))
            return self._count(path, response)
        finally:
            LATENCY.labels(_path_label(path)).observe(time.perf_counter() - started)

    def _authenticate(self, request: web.Request) -> web.Response | None:
        """None when the request carries the token in force, else the answer to send."""
        token = self.token()
        if not token:
            AUTH_FAILURES.labels("no_token_loaded").inc()
            response = status(503, "ServiceUnavailable", "no usable bearer token is loaded from --token-file")
            response.headers["Retry-After"] = "1"
            return response
        got = request.headers.get("Authorization", "")
        # Header values are decoded with surrogateescape: bytes that are not UTF-8 must compare
        # (unequal), not raise.
        if hmac.compare_digest(got.encode("utf-8", "surrogateescape"), b"Bearer " + token.encode()):
            return None
        reason = "missing" if not got else "invalid"
        AUTH_FAILURES.labels(reason).inc()
        log.debug("store: %s bearer token on %s", reason, printable(request.path, 80))
        return status(401, "Unauthorized", "a valid bearer token is required")

    @staticmethod
    def _count(path: str, response: web.StreamResponse) -> web.StreamResponse:
        REQUESTS.labels(_path_label(path), str(response.status)).inc()
        return response

    async def handle_ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def handle_ready(self, request: web.Request) -> web.Response:
        if not self.token():
            return web.Response(status=503, text="no usable bearer token in --token-file")
        if self.ready:
            return web.Response(text="ok")
        return web.Response(status=503, text="refilling from peers")

    async def handle_prometheus(self, request: web.Request) -> web.Response:
        SERIES.set(self.series.stats()["series"])
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_status(self, request: web.Request) -> web.Response:
        nodes, pods, points = self.resources.stats()
        body = {
            "name": self.name,
            "ready": self.ready,
            "series": self.series.stats(),
            "resources": {"nodes": nodes, "pods": pods, "points": points},
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    # ---- writes --------------------------------------------------------------------------------

    async def handle_write(self, request: web.Request) -> web.Response:
        body = wire.decode(await request.read(), wire.Write)
        return _msgpack(self.apply(body))

    def apply(self, body: wire.Write) -> wire.WriteAck:
        """Store a write (or a copy from a peer) and say what was taken."""
        for node in body.nodes:
            self.resources.store(wire.node_from_wire(node))
        for prev, last in body.history:
            if self.resources.merge_node(wire.node_from_wire(prev), wire.node_from_wire(last)):
                REFILLED.labels("nodes").inc()
        accepted = refused = 0
        for block in (body.block, wire.block_of(body.samples) if body.samples else None):
            if block is not None:
                a, r = self._append(block)
                accepted, refused = accepted + a, refused + r
        # A copied series carries at most what a replica keeps; beyond twice that only the newest
        # points are merged (exports are in time order, and the merge trims to ``max_points``): one
        # series of 64 MiB would otherwise become a dict of 4 million points for a moment.
        cap = 32 * self.series.max_points
        for metric, resource, namespace, name, labels, packed in body.series:
            if len(packed) > cap and not len(packed) % 16:
                packed = packed[-cap:]
            try:
                added = self.series.merge(metric, ObjectRef(resource, namespace, name), labels, packed)
            except ValueError as e:
                refused += 1
                log.warning("refused a copied series %s: %s", metric, e)
                continue
            REFILLED.labels("points").inc(added)
        return wire.WriteAck(len(body.nodes), accepted, refused)

    def _append(self, block: wire.SampleBlock) -> tuple[int, int]:
        # The bounds every ingestion path shares (future skew, name and label sizes): whoever holds
        # the store token cannot plant a far-future point that stalls a series, or a huge name.
        rows, bounded = screen_rows(block.strings, block.labels, block.rows)
        for reason, n in bounded.items():
            SAMPLE_REFUSALS.labels(reason).inc(n)
        accepted, refused = self.series.append_block(block.strings, block.labels, rows)
        refused += len(block.rows) - len(rows)
        SAMPLES.labels("accepted").inc(accepted)
        if refused:
            SAMPLES.labels("refused").inc(refused)
        return accepted, refused

    # ---- queries -------------------------------------------------------------------------------

    async def handle_query_series(self, request: web.Request) -> web.Response:
        q = wire.decode(await _body(request, wire.MAX_QUERY_BYTES), wire.SeriesQuery)
        if (problem := wire.request_problem(q)) is not None:
            return status(400, "BadRequest", problem)
        try:
            selector = parse_label_selector(q.selector) if q.selector else None
        except SelectorError as e:
            return status(400, "BadRequest", str(e))
        results = self.series.query(q.resource, q.namespace, q.names, q.metric, label_selector=selector)
        rows = [(r.obj.name, r.labels, r.value, r.timestamp, r.window) for r in results]
        return _msgpack(rows)

    async def handle_query_resource(self, request: web.Request) -> web.Response:
        q = wire.decode(await _body(request, wire.MAX_QUERY_BYTES), wire.ResourceQuery)
        if (problem := wire.request_problem(q)) is not None:
            return status(400, "BadRequest", problem)
        return _msgpack(self.resource_rows(q))

    def resource_rows(self, q: wire.ResourceQuery) -> wire.ResourceRows:
        store = self.resources
        now = time.monotonic()
        out = wire.ResourceRows()
        if q.kind == "nodes":
            names = q.names if q.names is not None else store.node_names()
            for name in names:
                u = store.node_usage(name, now)
                if u is not None:
                    out.nodes.append((name, (u.timestamp, u.window, u.cpu_nanocores, u.memory)))
        elif q.kind == "pods":
            if q.names is not None and q.namespace is not None:
                keys = [(q.namespace, n) for n in q.names]
            else:
                keys = [k for k in store.pod_keys() if q.namespace is None or k[0] == q.namespace]
            for ns, name in keys:
                p = store.pod_usage(ns, name, now)
                if p is None:
                    continue
                containers = [
                    (c, (u.timestamp, u.window, u.cpu_nanocores, u.memory)) for c, u in p.containers
                ]
                out.pods.append((ns, name, store.pod_node(ns, name), p.timestamp, p.window, containers))
        else:
            raise web.HTTPBadRequest(text=f"unknown kind {printable(q.kind, 40)}: nodes or pods")
        return out

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return _msgpack(self.series.metrics())

    async def handle_export(self, request: web.Request) -> web.Response:
        req = wire.decode(await _body(request, wire.MAX_EXPORT_BYTES), wire.ExportRequest)
        if (problem := wire.request_problem(req)) is not None:
            return status(400, "BadRequest", problem)
        response = _msgpack(await self.export(req))
        if len(response.body) > 256 << 10 and "gzip" in request.headers.get("Accept-Encoding", ""):  # type: ignore[arg-type]
            response.enable_compression()
        return response

    async def export(self, req: wire.ExportRequest) -> wire.Write:
        """What ``req`` asks for: keys the ring gives ``req.owner`` (and, with ``previous_members``,
        did not give it before), or the listed keys, or everything."""
        select = _selector(req)
        if select is not None:
            select = await self._decide(select, req)
        out = wire.Write()
        if req.resources:
            nodes = self.resources.export_nodes(None if select is None else (lambda n: select(*node_key(n))))
            out.history = [(wire.node_to_wire(prev), wire.node_to_wire(last)) for prev, last in nodes]
        if req.series:
            out.series = list(self.series.export(select, req.metrics))
        return out

    async def _decide(
        self, select: Callable[[str, str, str], bool], req: wire.ExportRequest
    ) -> Callable[[str, str, str], bool]:
        """``select`` decided for every key held, a slice of keys at a time with the event loop
        served in between: a ring costs one hash per member for each key (~1 µs each), so 100 000
        keys and 256 members would hold the loop for 25 s in one go. (The keys are gathered in one
        cheap pass: a selector that records and refuses copies no points.)"""
        keys: set[tuple[str, str, str]] = set()
        if req.series:
            for _ in self.series.export(lambda r, ns, n: keys.add((r, ns, n)), req.metrics):
                pass
        if req.resources:
            keys.update(node_key(n) for n in self.resources.node_names())
        chosen: set[tuple[str, str, str]] = set()
        for i, key in enumerate(keys):
            if select(*key):
                chosen.add(key)
            if i % _EXPORT_SLICE == _EXPORT_SLICE - 1:
                await asyncio.sleep(0)
        return lambda r, ns, n: (r, ns, n) in chosen


async def _body(request: web.Request, limit: int) -> bytes:
    """The (decompressed) body, at most ``limit`` bytes: 413 beyond, before more is read."""
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(64 << 10):
        size += len(chunk)
        if size > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
        chunks.append(chunk)
    return b"".join(chunks)


def _selector(req: wire.ExportRequest) -> Callable[[str, str, str], bool] | None:
    keys = set(req.keys) if req.keys is not None else None
    ring = Ring(req.members, req.replicas) if req.owner and req.members else None
    before = (
        Ring(req.previous_members, req.replicas)
        if ring is not None and req.previous_members is not None
        else None
    )
    if keys is None and (ring is None or ring.everywhere and before is None):
        return None
    owner = req.owner

    def select(resource: str, namespace: str, name: str) -> bool:
        key = (resource, namespace, name)
        if keys is not None and key not in keys:
            return False
        if ring is not None and not ring.owns(owner, key):
            return False
        return before is None or owner not in before.members or not before.owns(owner, key)

    return select
