"""`kcms store`: one replica of the in-memory store behind an authenticated HTTP API.

Authentication is a shared bearer token read from a file (``--token-file``; re-read when the file
changes, so a rotated Secret takes effect without a restart). Every path but the probes and
``/metrics`` answers 401 without it. TLS is optional (``--tls-cert-file``); use it whenever the
stores are reached over a network that others share.

Bodies are MessagePack (:mod:`kcms.store.wire`), optionally gzip-compressed, at most
``--max-request-bytes`` after decompression (413 beyond). Errors are JSON Kubernetes ``Status``
objects.

A replica that starts while peers exist copies what the ring gives it from them (refill) before it
reports ready on ``/readyz``; when membership changes later it copies the keys it newly owns.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

from kcms.model import ObjectRef
from kcms.selectors import SelectorError, parse_label_selector
from kcms.store import wire
from kcms.store.resource import ResourceStore
from kcms.store.ring import Ring, node_key
from kcms.store.series import SeriesStore

log = logging.getLogger(__name__)

REQUESTS = Counter("kcms_store_requests_total", "Store API requests, by path and code.", ["path", "code"])
LATENCY = Histogram(
    "kcms_store_request_seconds",
    "Store API request handling time, by path.",
    ["path"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
SAMPLES = Counter("kcms_store_samples_total", "Samples written to this replica, by outcome.", ["outcome"])
REFILLED = Counter("kcms_store_refilled_total", "What refills and repairs copied in, by kind.", ["kind"])
SERIES = Gauge("kcms_store_series", "Custom-metric series held by this replica.")


class TokenFile:
    """A bearer token kept in a file, re-read when the file's modification time changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mtime = -1.0
        self._token = ""
        self.read()

    def read(self) -> str:
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            return self._token  # keep the last good token while a Secret is being swapped
        if mtime != self._mtime:
            with open(self.path, encoding="utf-8") as f:
                token = f.read().strip()
            if not token:
                raise ValueError(f"token file {self.path} is empty")
            self._token, self._mtime = token, mtime
        return self._token


def status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


def _msgpack(obj: Any) -> web.Response:
    return web.Response(body=wire.encode(obj), content_type=wire.CONTENT_TYPE)


_OPEN_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/metrics"})


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
                got = request.headers.get("Authorization", "")
                want = "Bearer " + self.token()
                if not hmac.compare_digest(got.encode(), want.encode()):
                    return self._count(path, status(401, "Unauthorized", "a valid bearer token is required"))
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
                response = status(400, "BadRequest", f"malformed request body: {e}")
            return self._count(path, response)
        finally:
            LATENCY.labels(path if path.startswith("/store/") else "other").observe(
                time.perf_counter() - started
            )

    @staticmethod
    def _count(path: str, response: web.StreamResponse) -> web.StreamResponse:
        REQUESTS.labels(path if path.startswith("/store/") else "other", str(response.status)).inc()
        return response

    async def handle_ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def handle_ready(self, request: web.Request) -> web.Response:
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
        for metric, resource, namespace, name, labels, packed in body.series:
            try:
                added = self.series.merge(metric, ObjectRef(resource, namespace, name), labels, packed)
            except ValueError as e:
                refused += 1
                log.warning("refused a copied series %s: %s", metric, e)
                continue
            REFILLED.labels("points").inc(added)
        return wire.WriteAck(len(body.nodes), accepted, refused)

    def _append(self, block: wire.SampleBlock) -> tuple[int, int]:
        accepted, refused = self.series.append_block(block.strings, block.labels, block.rows)
        SAMPLES.labels("accepted").inc(accepted)
        if refused:
            SAMPLES.labels("refused").inc(refused)
        return accepted, refused

    # ---- queries -------------------------------------------------------------------------------

    async def handle_query_series(self, request: web.Request) -> web.Response:
        q = wire.decode(await request.read(), wire.SeriesQuery)
        try:
            selector = parse_label_selector(q.selector) if q.selector else None
        except SelectorError as e:
            return status(400, "BadRequest", str(e))
        results = self.series.query(q.resource, q.namespace, q.names, q.metric, label_selector=selector)
        rows = [(r.obj.name, r.labels, r.value, r.timestamp, r.window) for r in results]
        return _msgpack(rows)

    async def handle_query_resource(self, request: web.Request) -> web.Response:
        q = wire.decode(await request.read(), wire.ResourceQuery)
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
            raise web.HTTPBadRequest(text=f'unknown kind "{q.kind}": nodes or pods')
        return out

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return _msgpack(self.series.metrics())

    async def handle_export(self, request: web.Request) -> web.Response:
        req = wire.decode(await request.read(), wire.ExportRequest)
        response = _msgpack(self.export(req))
        if len(response.body) > 256 << 10 and "gzip" in request.headers.get("Accept-Encoding", ""):  # type: ignore[arg-type]
            response.enable_compression()
        return response

    def export(self, req: wire.ExportRequest) -> wire.Write:
        """What ``req`` asks for: keys the ring gives ``req.owner`` (and, with ``previous_members``,
        did not give it before), or the listed keys, or everything."""
        select = _selector(req)
        out = wire.Write()
        if req.resources:
            nodes = self.resources.export_nodes(None if select is None else (lambda n: select(*node_key(n))))
            out.history = [(wire.node_to_wire(prev), wire.node_to_wire(last)) for prev, last in nodes]
        if req.series:
            out.series = list(self.series.export(select, req.metrics))
        return out


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
