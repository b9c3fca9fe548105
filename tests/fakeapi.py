"""The one fake Kubernetes API server used by the tests.

`FakeKubeAPI` is a real HTTPS server on 127.0.0.1 that speaks the kube-apiserver JSON protocol for the
parts KCMS uses: LIST and WATCH (resourceVersion, bookmarks, 410 Expired) of nodes, pods, configmaps,
leases and endpointslices, GET/POST/PUT of leases with optimistic concurrency (every accepted write is
appended to `lease_writes`), TokenReview and SubjectAccessReview.

    async with FakeKubeAPI(ca) as fake:
        fake.upsert(make_node("n1"))
        fake.write_kubeconfig(tmp_path / "kubeconfig")

Test controls: `expire_history()`, `send_bookmarks()`, `drop_watches()`, `stop()` / `start()` (same port),
`list_gates[plural] = asyncio.Event()` (LISTs of that resource wait until it is set).
The object builders `make_node` and `make_pod` live in tests/fakeobjects.py and are re-exported here;
`make_endpointslice` lives in tests/fakeobjects.py too.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import re
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import trustme
from aiohttp import web
from fakeobjects import make_endpointslice, make_node, make_pod, rfc3339_now  # noqa: F401

from kcms.selectors import LabelSelector, parse_label_selector

# plural -> (api prefix, kind, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "nodes": ("/api/v1", "Node", False),
    "pods": ("/api/v1", "Pod", True),
    "configmaps": ("/api/v1", "ConfigMap", True),
    "leases": ("/apis/coordination.k8s.io/v1", "Lease", True),
    "endpointslices": ("/apis/discovery.k8s.io/v1", "EndpointSlice", True),
}
_API_VERSION = {
    "/api/v1": "v1",
    "/apis/coordination.k8s.io/v1": "coordination.k8s.io/v1",
    "/apis/discovery.k8s.io/v1": "discovery.k8s.io/v1",
}

_PATH = re.compile(
    r"^(?P<prefix>/api/v1|/apis/[^/]+/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?$"
)


@functools.lru_cache(maxsize=256)
def _label_selector(text: str) -> LabelSelector:
    return parse_label_selector(text)


def _match_labels(selector: str, labels: dict[str, str]) -> bool:
    """Match Kubernetes label selector syntax (equality and set-based); SelectorError if malformed."""
    return not selector or _label_selector(selector).matches(labels)


_FIELDS: dict[str, Callable[[dict], str]] = {
    "metadata.name": lambda o: o["metadata"].get("name", ""),
    "metadata.namespace": lambda o: o["metadata"].get("namespace", ""),
    "spec.nodeName": lambda o: o.get("spec", {}).get("nodeName", ""),
    "status.phase": lambda o: o.get("status", {}).get("phase", ""),
}


def _parse_fields(selector: str) -> list[tuple[str, bool, str]]:
    """Parse a field selector into (field, equal, value) triples; ValueError when unsupported."""
    out = []
    for req in (r.strip() for r in selector.split(",") if r.strip()):
        neg = "!=" in req
        fld, _, value = req.replace("==", "=").partition("!=" if neg else "=")
        if fld.strip() not in _FIELDS:
            raise ValueError(f'field label not supported: "{fld.strip()}"')
        out.append((fld.strip(), not neg, value.strip()))
    return out


def _match_fields(reqs: list[tuple[str, bool, str]], obj: dict) -> bool:
    return all((_FIELDS[f](obj) == v) == eq for f, eq, v in reqs)


def _as_metadata(request: web.Request, kind: str) -> bool:
    """Whether the Accept header asks for ``kind`` (PartialObjectMetadata[List]) in JSON, as the
    metadata client of client-go (and metrics-server) does."""
    for media in request.headers.get("Accept", "").split(","):
        parts = [p.strip() for p in media.split(";")]
        if parts[0] == "application/json" and f"as={kind}" in parts and "g=meta.k8s.io" in parts:
            return True
    return False


def _partial(obj: dict) -> dict:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def status_body(code: int, reason: str, message: str, **details: Any) -> dict:
    """A metav1.Status failure object as the API server sends it."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def _status(code: int, reason: str, message: str, **details: Any) -> web.Response:
    return web.Response(
        status=code,
        body=orjson.dumps(status_body(code, reason, message, **details)),
        content_type="application/json",
    )


@dataclass(eq=False)
class _Watcher:
    plural: str
    namespace: str
    labels: str
    fields: list[tuple[str, bool, str]]
    bookmarks: bool
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    request: web.Request | None = None


class FakeKubeAPI:
    """A small, real-protocol Kubernetes API server on loopback HTTPS (see module docstring)."""

    def __init__(
        self, ca: trustme.CA, admin_token: str = "admin-token", history_limit: int = 100_000
    ) -> None:
        self.ca = ca
        self.api_tokens: set[str] = {admin_token}
        self.admin_token = admin_token
        self.port = 0
        self.kubeconfig: Path | None = None
        self.tokens: dict[str, dict] = {}
        self.authorize: Callable[[dict], tuple[bool, str]] = lambda spec: (True, "allowed by fake")
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.token_reviews: list[dict] = []
        self.access_reviews: list[dict] = []
        # every accepted POST/PUT of a lease:
        # (namespace, name, resourceVersion, holderIdentity, renewTime, leaseTransitions)
        self.lease_writes: list[tuple[str, str, str, str, str, int]] = []
        self.lease_write_delay = 0.0  # seconds a lease POST/PUT waits before it is applied (to force races)
        self.list_gates: dict[str, asyncio.Event] = {}  # plural -> its LISTs wait until the event is set
        self.rv = 1
        self.history_floor = 1  # the oldest RV one may watch from; below it: 410 Expired
        self.history_limit = history_limit
        self._objects: dict[str, dict[tuple[str, str], dict]] = {p: {} for p in RESOURCES}
        self._history: list[tuple[int, str, str, dict | None, dict | None]] = []
        self._watchers: set[_Watcher] = set()
        self._snapshots: dict[str, list[dict]] = {}  # continue token -> the listed objects
        self._runner: web.AppRunner | None = None
        self._cert = ca.issue_cert("127.0.0.1", "localhost")

    # ---- lifecycle -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Start serving (again, on the same port after a stop())."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            app, handle_signals=False, shutdown_timeout=0.5, handler_cancellation=True
        )
        await self._runner.setup()
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._cert.configure_cert(ctx)
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=ctx, reuse_address=True)
        await site.start()
        if not self.port:
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        """Stop serving; open watches are cut. Objects and history are kept for a later start()."""
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeKubeAPI:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def write_kubeconfig(self, path: str | Path, token: str | None = None) -> Path:
        """Write a real kubeconfig (server URL, CA data, bearer token) usable by kubectl and clients."""
        path = Path(path)
        ca_b64 = base64.b64encode(self.ca.cert_pem.bytes()).decode()
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "fake", "cluster": {"server": self.url, "certificate-authority-data": ca_b64}}
            ],
            "users": [{"name": "fake-admin", "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake-admin"}}],
            "current-context": "fake",
            "preferences": {},
        }
        path.write_bytes(orjson.dumps(doc))  # JSON is valid YAML
        if self.kubeconfig is None:
            self.kubeconfig = path
        return path

    # ---- object helpers --------------------------------------------------------------------------
    def _bump(self) -> int:
        self.rv += 1
        return self.rv

    def _record(self, plural: str, typ: str, old: dict | None, new: dict | None) -> None:
        self._history.append((self.rv, plural, typ, old, new))
        if len(self._history) > self.history_limit:
            drop = len(self._history) - self.history_limit
            self.history_floor = self._history[drop - 1][0]
            del self._history[:drop]
        for w in list(self._watchers):
            if w.plural == plural:
                ev = self._event_for(w, typ, old, new)
                if ev is not None:
                    w.queue.put_nowait(ev)

    def upsert(self, obj: dict, plural: str | None = None) -> dict:
        """Create or replace an object; fills metadata and notifies watchers. Returns the stored object."""
        plural = plural or _plural_of(obj)
        meta = obj.setdefault("metadata", {})
        key = (meta.get("namespace", ""), meta["name"])
        old = self._objects[plural].get(key)
        meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", old["metadata"]["creationTimestamp"] if old else rfc3339_now())
        meta["resourceVersion"] = str(self._bump())
        self._objects[plural][key] = obj
        self._record(plural, "MODIFIED" if old else "ADDED", old, obj)
        return obj

    def delete(self, plural: str, namespace: str, name: str) -> dict | None:
        """Delete an object (namespace "" for cluster-scoped); notifies watchers."""
        old = self._objects[plural].pop((namespace, name), None)
        if old is not None:
            gone = orjson.loads(orjson.dumps(old))
            gone["metadata"]["resourceVersion"] = str(self._bump())
            self._record(plural, "DELETED", old, gone)
        return old

    def get(self, plural: str, namespace: str, name: str) -> dict | None:
        return self._objects[plural].get((namespace, name))

    def objects(self, plural: str) -> list[dict]:
        return list(self._objects[plural].values())

    # ---- test controls ---------------------------------------------------------------------------
    def expire_history(self) -> None:
        """Forget the change history (like an etcd compaction): watches from any RV before now get 410."""
        self._history.clear()
        self.history_floor = self._bump()

    def send_bookmarks(self) -> None:
        """Send a BOOKMARK with the current resourceVersion to every watch that allowed bookmarks."""
        for w in list(self._watchers):
            if w.bookmarks:
                kind, api = RESOURCES[w.plural][1], _API_VERSION[RESOURCES[w.plural][0]]
                w.queue.put_nowait(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": kind,
                            "apiVersion": api,
                            "metadata": {"resourceVersion": str(self.rv)},
                        },
                    }
                )

    def drop_watches(self) -> int:
        """Abruptly close every open watch connection (no terminating chunk). Returns how many."""
        n = 0
        for w in list(self._watchers):
            if w.request is not None and w.request.transport is not None:
                w.request.transport.abort()
                n += 1
            w.queue.put_nowait(None)
        self._watchers.clear()
        return n

    @property
    def open_watches(self) -> int:
        return len(self._watchers)

    # ---- HTTP ------------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append((request.method, request.path, query))
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in self.api_tokens:
            return _status(401, "Unauthorized", "Unauthorized")
        path = request.path.rstrip("/")
        if path == "/version":
            return web.json_response({"major": "1", "minor": "32", "gitVersion": "v1.32.0-fake"})
        if path == "/apis/authentication.k8s.io/v1/tokenreviews" and request.method == "POST":
            return await self._token_review(request)
        if path == "/apis/authorization.k8s.io/v1/subjectaccessreviews" and request.method == "POST":
            return await self._access_review(request)
        m = _PATH.match(path)
        if not m or m["plural"] not in RESOURCES or RESOURCES[m["plural"]][0] != m["prefix"]:
            return _status(404, "NotFound", "the server could not find the requested resource")
        plural, ns, name = m["plural"], m["ns"] or "", m["name"]
        if ns and not RESOURCES[plural][2]:
            return _status(404, "NotFound", "the server could not find the requested resource")
        if request.method == "GET" and name:
            obj = self._objects[plural].get((ns, name))
            if obj is None:
                return _status(404, "NotFound", f'{plural} "{name}" not found', name=name, kind=plural)
            return web.Response(body=orjson.dumps(obj), content_type="application/json")
        if request.method == "GET":
            try:
                fields = _parse_fields(query.get("fieldSelector", ""))
                if query.get("labelSelector"):
                    _match_labels(query["labelSelector"], {})
            except ValueError as e:
                return _status(400, "BadRequest", str(e))
            if query.get("watch") in ("1", "true"):
                return await self._watch(request, plural, ns, query, fields)
            if (gate := self.list_gates.get(plural)) is not None:
                await gate.wait()  # a test holds this resource's LISTs (e.g. a slow 150 000-pod list)
            return self._list(plural, ns, query, fields, _as_metadata(request, "PartialObjectMetadataList"))
        if request.method in ("POST", "PUT") and plural == "leases":
            return await self._write_lease(request, ns, name)
        return _status(405, "MethodNotAllowed", f"method {request.method} not allowed on {plural}")

    def _selected(self, plural: str, ns: str, labels: str, fields: list) -> list[dict]:
        objects = self._objects[plural]
        out = []
        for key in sorted(objects):
            obj = objects[key]
            if ns and key[0] != ns:
                continue
            if _match_fields(fields, obj) and _match_labels(labels, obj["metadata"].get("labels") or {}):
                out.append(obj)
        return out

    def _list(self, plural: str, ns: str, query: dict, fields: list, meta_only: bool = False) -> web.Response:
        prefix, kind, _ = RESOURCES[plural]
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        start, snap = 0, ""
        if query.get("continue"):
            try:
                tok = orjson.loads(base64.urlsafe_b64decode(query["continue"]))
                start, meta["resourceVersion"], snap = tok["start"], tok["rv"], tok["snap"]
                items = self._snapshots.pop(snap)
            except (ValueError, KeyError, TypeError):
                return _status(410, "Expired", "the provided continue parameter is too old or invalid")
        else:
            items = self._selected(plural, ns, query.get("labelSelector", ""), fields)
        limit = int(query.get("limit") or 0)
        if limit > 0:
            end = start + limit
            if end < len(items):
                snap = snap or uuid.uuid4().hex
                self._snapshots[snap] = items  # a consistent snapshot, like paging from etcd at one revision
                while len(self._snapshots) > 16:
                    self._snapshots.pop(next(iter(self._snapshots)))
                tok = {"start": end, "rv": meta["resourceVersion"], "snap": snap}
                meta["continue"] = base64.urlsafe_b64encode(orjson.dumps(tok)).decode()
                meta["remainingItemCount"] = len(items) - end
            items = items[start:end]
        body = {"kind": kind + "List", "apiVersion": _API_VERSION[prefix], "metadata": meta, "items": items}
        if meta_only:
            body.update(kind="PartialObjectMetadataList", apiVersion="meta.k8s.io/v1", items=[_partial(o) for o in items])
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    def _event_for(self, w: _Watcher, typ: str, old: dict | None, new: dict | None) -> dict | None:
        def sel(o: dict | None) -> bool:
            if o is None or (w.namespace and o["metadata"].get("namespace", "") != w.namespace):
                return False
            return _match_fields(w.fields, o) and _match_labels(w.labels, o["metadata"].get("labels") or {})

        if typ == "DELETED":
            return {"type": "DELETED", "object": new} if sel(old) else None
        was, now = sel(old), sel(new)
        if was and now:
            return {"type": "MODIFIED", "object": new}
        if now:
            return {"type": "ADDED", "object": new}
        if was:
            return {"type": "DELETED", "object": new}
        return None

    async def _watch(
        self, request: web.Request, plural: str, ns: str, query: dict, fields: list
    ) -> web.StreamResponse:
        w = _Watcher(
            plural, ns, query.get("labelSelector", ""), fields, query.get("allowWatchBookmarks") == "true"
        )
        w.request = request
        meta_only = _as_metadata(request, "PartialObjectMetadata")
        resp = web.StreamResponse(
            headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
        )
        await resp.prepare(request)
        rv_text = query.get("resourceVersion", "")
        if rv_text in ("", "0"):
            for obj in self._selected(plural, ns, w.labels, fields):
                w.queue.put_nowait({"type": "ADDED", "object": obj})
        else:
            rv = int(rv_text)
            if rv < self.history_floor:
                err = status_body(410, "Expired", f"too old resource version: {rv} ({self.history_floor})")
                await resp.write(orjson.dumps({"type": "ERROR", "object": err}) + b"\n")
                await resp.write_eof()
                return resp
            for ev_rv, ev_plural, typ, old, new in self._history:
                if ev_rv > rv and ev_plural == plural:
                    ev = self._event_for(w, typ, old, new)
                    if ev is not None:
                        w.queue.put_nowait(ev)
        self._watchers.add(w)
        timeout = float(query.get("timeoutSeconds") or 1800)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    ev = await asyncio.wait_for(w.queue.get(), remaining)
                except TimeoutError:
                    break
                if ev is None:
                    return resp
                if meta_only and ev["type"] != "ERROR":
                    ev = {"type": ev["type"], "object": _partial(ev["object"])}
                await resp.write(orjson.dumps(ev) + b"\n")
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self._watchers.discard(w)
        return resp

    async def _write_lease(self, request: web.Request, ns: str, name: str | None) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            meta = body["metadata"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _status(400, "BadRequest", "invalid Lease body")
        if self.lease_write_delay:
            await asyncio.sleep(self.lease_write_delay)
        meta["namespace"] = ns
        key = (ns, meta.get("name", ""))
        current = self._objects["leases"].get(key)
        if request.method == "POST":
            if name:
                return _status(405, "MethodNotAllowed", "POST to a named lease")
            if current is not None:
                return _status(409, "AlreadyExists", f'leases.coordination.k8s.io "{key[1]}" already exists')
            meta.pop("resourceVersion", None)
            body.setdefault("apiVersion", "coordination.k8s.io/v1")
            body.setdefault("kind", "Lease")
            return web.json_response(self._lease_written(self.upsert(body, "leases")), status=201)
        if name != key[1]:
            return _status(400, "BadRequest", "name in body does not match the URL")
        if current is None:
            return _status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        sent_rv = meta.get("resourceVersion")
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                name=name,
                group="coordination.k8s.io",
                kind="leases",
            )
        meta.pop("resourceVersion", None)
        meta["uid"] = current["metadata"]["uid"]
        meta["creationTimestamp"] = current["metadata"]["creationTimestamp"]
        return web.json_response(self._lease_written(self.upsert(body, "leases")))

    def _lease_written(self, lease: dict) -> dict:
        meta, spec = lease["metadata"], lease.get("spec") or {}
        self.lease_writes.append(
            (
                meta["namespace"],
                meta["name"],
                meta["resourceVersion"],
                spec.get("holderIdentity") or "",
                spec.get("renewTime") or "",
                int(spec.get("leaseTransitions") or 0),
            )
        )
        return lease

    async def _token_review(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.token_reviews.append(body)
        user = self.tokens.get(body.get("spec", {}).get("token", ""))
        status: dict[str, Any] = {"authenticated": user is not None, "user": user or {}}
        if user is None:
            status["error"] = "invalid bearer token"
        body["status"] = status
        return web.Response(body=orjson.dumps(body), status=201, content_type="application/json")

    async def _access_review(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.access_reviews.append(body)
        allowed, reason = self.authorize(body.get("spec", {}))
        body["status"] = {"allowed": allowed, "reason": reason}
        if not allowed:
            body["status"]["denied"] = True
        return web.Response(body=orjson.dumps(body), status=201, content_type="application/json")


def _plural_of(obj: dict) -> str:
    for plural, (_, kind, _) in RESOURCES.items():
        if obj.get("kind") == kind:
            return plural
    raise ValueError(f"unknown kind {obj.get('kind')!r}")
