"""Push reporting from nodes (Koordinator's NodeMetric design): agents POST their kubelet's readings
and their custom series to the active server, which stores them in-process and serves them.

``POST /push/v1/nodes`` takes a :class:`kcms.store.wire.Write` in MessagePack (``Content-Type:
application/vnd.kcms.store.v1+msgpack``, optionally ``Content-Encoding: gzip``; the size limit
applies to the decoded body) and answers a :class:`~kcms.store.wire.WriteAck` in MessagePack. Each
``WireNode`` replaces what the resource store holds for that node (rates come from two consecutive
pushes); each sample goes to the series store. A sample that cannot be used (a bad metric name,
object or labels, a non-finite number) is refused and counted without failing the rest; a sample
not newer than its series' last point is skipped silently (retries and repeated buffers are
harmless). A body that is not a ``Write`` is refused as a whole with a 400 ``Status`` naming the
problem; a body over the limit with a 413; another content type with a 415.

Every answer carries ``X-KCMS-Push-Epoch``: an id that changes whenever this server starts holding
data afresh (a new process, or active again after a standby period). A reporter that sends only the
points new since its last push names the epoch it continues in the same request header; if that is
not the current epoch the push is refused with ``409 Conflict`` and nothing is stored, and the
reporter sends its whole buffer instead (the older points would otherwise be refused as older than
the newest one of their series).

Active and standby: with ``active()`` false (a standby that does not hold the Lease) a push is
answered ``503`` (reason ``ServiceUnavailable``, message ``standby: not the active server``) and
nothing is stored; the reporter then tries its next endpoint. A server that stops being active
forgets its nodes: when it becomes active again it starts empty, like a new process.

Stale nodes: a node whose last accepted push is older than ``node_stale_after`` seconds (monotonic
clock) is *stale*: its readings are dropped from the resource store (so neither ``node_usage`` nor
the store's own ``max_age`` serve it), it is listed by :meth:`NodePushAPI.stale_nodes` and on
``GET /push/v1/status``, and counted (gauge ``kcms_push_stale_nodes``, counter
``kcms_push_nodes_marked_stale_total``). Nodes of the inventory (``known_nodes()``) that never
reported are stale too, once ``node_stale_after`` has passed since this server became active (the
agents' first pushes need that long to arrive); a silent node that left the inventory is
forgotten rather than listed. A stale node that pushes again is fresh at once.
Staleness is checked on every push and status request, on :meth:`NodePushAPI.stale_nodes`, and every
``node_stale_after / 4`` seconds by the sweep task (:meth:`~NodePushAPI.start` / ``stop``, or
:meth:`~NodePushAPI.attach` to run it with the aiohttp application).

The resource store should be built with ``max_age >= node_stale_after`` (else it hides a node
before it counts as stale) and ``max_age`` at least twice the agents' ``--push-interval``.

``GET /push/v1/status`` answers JSON::

    {"active": true, "nodes": {"fresh": 12, "stale": ["node-7"]}, "nodeStaleAfterSeconds": 60.0}

Access: the API server's middleware authenticates every request and authorizes it with a
SubjectAccessReview. The paths are not under ``/apis``, so they are non-resource requests with the
HTTP verb in lower case. The agents' service account needs::

    apiVersion: rbac.authorization.k8s.io/v1
    kind: ClusterRole
    metadata: {name: kcms-node-pusher}
    rules:
      - nonResourceURLs: ["/push/v1/nodes"]
        verbs: ["post"]
      - nonResourceURLs: ["/push/v1/status"]   # only for whoever reads the status
        verbs: ["get"]

bound with a ClusterRoleBinding (non-resource rules only take effect from cluster bindings). The
grant lets a pusher report readings for any node name.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import Counter, Gauge

from kcms.apiserver import StatusError, bad_request
from kcms.apiserver.discovery import Route
from kcms.apiserver.responses import bytes_response, json_response
from kcms.httpbody import BodyTooLarge, read_body
from kcms.model import Labels, ObjectRef
from kcms.sources.exposition import object_problem
from kcms.store.resource import ResourceStore
from kcms.store.series import SeriesStore
from kcms.store.wire import CONTENT_TYPE, Write, WriteAck, decode, encode, node_from_wire
from kcms.tasks import cancel_and_wait

__all__ = ["EPOCH_HEADER", "NODES_PATH", "STATUS_PATH", "NodePushAPI"]

log = logging.getLogger(__name__)

NODES_PATH = "/push/v1/nodes"
STATUS_PATH = "/push/v1/status"
EPOCH_HEADER = "X-KCMS-Push-Epoch"
STANDBY_MESSAGE = "standby: not the active server"

PUSHES = Counter(
    "kcms_push_node_requests",
    "Node pushes received, by outcome (accepted, standby, epoch_changed, bad_request, too_large, "
    "unsupported_media_type).",
    ["outcome"],
)
NODES_STORED = Counter("kcms_push_nodes_stored", "Node readings stored from pushes.")
PUSH_SAMPLES = Counter(
    "kcms_push_node_samples",
    "Samples of node pushes, by result (accepted; duplicate: not newer than the series' last point; "
    "refused: malformed).",
    ["result"],
)
STALE = Gauge("kcms_push_stale_nodes", "Nodes not heard from within --node-stale-after.")
MARKED_STALE = Counter("kcms_push_nodes_marked_stale", "Times a node became stale.")

_METRIC_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*", re.ASCII)
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*", re.ASCII)
_MEDIA_TYPE = CONTENT_TYPE.lower()


def _labels(labels: Iterable[tuple[str, str]]) -> Labels | None:
    """Labels sorted by key, or None if a name is invalid or repeated."""
    out = tuple(sorted(labels))
    previous = None
    for k, _ in out:
        if k == previous or not _LABEL_RE.fullmatch(k):
            return None
        previous = k
    return out


class NodePushAPI:
    """The node push endpoint over an in-process resource store and series store.

    Mount :meth:`routes` on the API server's ``app`` (or call :meth:`attach`), and run the sweep
    with :meth:`start` / :meth:`stop` unless :meth:`attach` does it.
    """

    def __init__(
        self,
        resources: ResourceStore,
        series: SeriesStore,
        *,
        active: Callable[[], bool] = lambda: True,
        node_stale_after: float = 60.0,
        max_body_bytes: int = 16 << 20,
        known_nodes: Callable[[], Iterable[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``active()``: whether this server holds the Lease now. ``known_nodes()``: the names of
        the nodes in the inventory (None: only nodes that pushed are tracked). ``clock``: monotonic
        seconds, the clock of :meth:`ResourceStore.store`."""
        if not node_stale_after > 0:
            raise ValueError(f"node_stale_after must be positive, not {node_stale_after!r}")
        self.resources = resources
        self.series = series
        self.active = active
        self.node_stale_after = float(node_stale_after)
        self.max_body_bytes = int(max_body_bytes)
        self.known_nodes = known_nodes
        self.clock = clock
        if resources.max_age < self.node_stale_after:
            log.warning(
                "the resource store's max_age (%gs) is shorter than node_stale_after (%gs): "
                "nodes stop being served before they count as stale",
                resources.max_age,
                self.node_stale_after,
            )
        self.epoch = uuid.uuid4().hex
        self._last_seen: dict[str, float] = {}  # node -> clock time of its last accepted push
        self._stale: set[str] = set()
        self._was_active = False
        self._active_since = clock()
        self._task: asyncio.Task[None] | None = None

    # ---- mounting ----------------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        """``[(method, path, handler)]`` to add to the server's router (full paths)."""
        return [("POST", NODES_PATH, self.handle_push), ("GET", STATUS_PATH, self.handle_status)]

    def attach(self, app: web.Application) -> None:
        """Add the routes to ``app`` and run the sweep while it runs (before the app starts)."""
        for method, path, handler in self.routes():
            app.router.add_route(method, path, handler)

        async def on_startup(_: web.Application) -> None:
            self.start()

        async def on_cleanup(_: web.Application) -> None:
            await self.stop()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)

    def start(self) -> None:
        """Start the periodic staleness sweep (every ``node_stale_after / 4`` seconds)."""
        if self._task is None:
            self._task = asyncio.create_task(self._sweep_loop(), name="node push sweep")

    async def stop(self) -> None:
        """Stop the sweep."""
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _sweep_loop(self) -> None:
        period = max(0.05, self.node_stale_after / 4)
        while True:
            await asyncio.sleep(period)
            try:
                self.stale_nodes()
            except Exception:  # an inventory that fails now may work next time
                log.exception("node staleness sweep failed")

    # ---- state -------------------------------------------------------------------------------------

    def _check_active(self, now: float) -> bool:
        """``active()``, noticing transitions: a server becoming active starts empty with a new epoch."""
        active = bool(self.active())
        if active and not self._was_active:
            self._active_since = now
            self.epoch = uuid.uuid4().hex
        elif not active and self._was_active:
            for node in self._last_seen:
                self.resources.forget_node(node)
            self._last_seen.clear()
            self._stale.clear()
            STALE.set(0)
        self._was_active = active
        return active

    def stale_nodes(self, now: float | None = None) -> list[str]:
        """Mark and return (sorted) the nodes not heard from within ``node_stale_after``."""
        now = self.clock() if now is None else now
        if not self._check_active(now):
            return []
        horizon = now - self.node_stale_after
        stale = {n for n, seen in self._last_seen.items() if seen < horizon}
        if self.known_nodes is not None:
            known = set(self.known_nodes())
            for node in stale - known:  # silent and gone from the inventory: deleted, forget it
                del self._last_seen[node]
                self.resources.forget_node(node)
            stale &= known
            if self._active_since < horizon:
                stale.update(n for n in known if n not in self._last_seen)
        newly = stale - self._stale
        for node in newly:
            self.resources.forget_node(node)
            log.info("node %s is stale: no push for more than %gs", node, self.node_stale_after)
        if newly:
            MARKED_STALE.inc(len(newly))
        self._stale = stale
        STALE.set(len(stale))
        return sorted(stale)

    def fresh_nodes(self, now: float | None = None) -> list[str]:
        """The nodes that pushed within ``node_stale_after`` (sorted)."""
        stale = set(self.stale_nodes(now))
        return sorted(n for n in self._last_seen if n not in stale)

    # ---- handlers ----------------------------------------------------------------------------------

    async def handle_status(self, request: web.Request) -> web.StreamResponse:
        """``GET /push/v1/status``."""
        now = self.clock()
        stale = self.stale_nodes(now)
        fresh = sum(1 for n in self._last_seen if n not in self._stale)
        body = {
            "active": self._was_active,
            "nodes": {"fresh": fresh, "stale": stale},
            "nodeStaleAfterSeconds": self.node_stale_after,
        }
        return json_response(request, body, headers={EPOCH_HEADER: self.epoch})

    async def handle_push(self, request: web.Request) -> web.StreamResponse:
        """``POST /push/v1/nodes``."""
        try:
            return await self._push(request)
        except StatusError as e:
            outcome = {
                400: "bad_request",
                409: "epoch_changed",
                413: "too_large",
                415: "unsupported_media_type",
                503: "standby",
            }.get(e.code, "error")
            PUSHES.labels(outcome).inc()
            raise

    async def _push(self, request: web.Request) -> web.StreamResponse:
        now = self.clock()
        if not self._check_active(now):
            raise StatusError(503, "ServiceUnavailable", STANDBY_MESSAGE)
        media = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if media != _MEDIA_TYPE:
            raise StatusError(
                415,
                "UnsupportedMediaType",
                f"the body must be {CONTENT_TYPE} (a kcms.store.wire.Write), not {media or 'untyped'!r}",
            )
        body = await self._read_limited(request)
        try:
            write = decode(body, Write)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise bad_request(f"malformed push body (expected a MessagePack Write): {e}") from None
        if not self._check_active(self.clock()):  # lost the Lease while reading
            raise StatusError(503, "ServiceUnavailable", STANDBY_MESSAGE)
        continues = request.headers.get(EPOCH_HEADER)
        if continues is not None and continues != self.epoch:
            raise StatusError(
                409,
                "Conflict",
                f"push epoch {continues[:64]!r} is over (now {self.epoch}): send every buffered point",
                {"name": self.epoch, "kind": "epoch"},
            )

        nodes = 0
        for wire_node in write.nodes:
            if not wire_node.node:
                continue
            self.resources.store(node_from_wire(wire_node))
            seen = self.clock()
            self._last_seen[wire_node.node] = seen
            if wire_node.node in self._stale:
                self._stale.discard(wire_node.node)
                STALE.set(len(self._stale))
                log.info("node %s reports again", wire_node.node)
            nodes += 1
        NODES_STORED.inc(nodes)
        accepted, refused, duplicate = self._store_samples(write)
        PUSH_SAMPLES.labels("accepted").inc(accepted)
        PUSH_SAMPLES.labels("refused").inc(refused)
        PUSH_SAMPLES.labels("duplicate").inc(duplicate)
        PUSHES.labels("accepted").inc()
        ack = encode(WriteAck(nodes=nodes, samples=accepted, refused=refused))
        return bytes_response(request, ack, content_type=CONTENT_TYPE, headers={EPOCH_HEADER: self.epoch})

    def _store_samples(self, write: Write) -> tuple[int, int, int]:
        """Check and store the write's samples; ``(accepted, refused, duplicate)``."""
        good: list[tuple[str, ObjectRef, Labels, float, float]] = []
        refused = 0
        metrics_ok: dict[str, bool] = {}
        objects: dict[tuple[str, str, str], ObjectRef | None] = {}
        labels_ok: dict[Any, Labels | None] = {(): ()}
        isfinite = math.isfinite
        samples = list(write.samples)
        bad_rows = 0
        if write.block is not None:  # the compact form store writers use; accepted here too
            strings, labelsets = write.block.strings, write.block.labels
            for row in write.block.rows:
                try:
                    m, r, ns, n, lb, ts, value = row
                    samples.append(
                        (strings[m], strings[r], strings[ns], strings[n], labelsets[lb], ts, value)
                    )
                except IndexError:
                    bad_rows += 1
        for metric, resource, namespace, name, labels, ts, value in samples:
            ok = metrics_ok.get(metric)
            if ok is None:
                ok = metrics_ok[metric] = _METRIC_RE.fullmatch(metric) is not None
            key = (resource, namespace, name)
            obj = objects.get(key, False)
            if obj is False:
                obj = objects[key] = None if object_problem(resource, namespace, name) else ObjectRef(*key)
            lb = labels_ok.get(labels, False)
            if lb is False:
                lb = labels_ok[labels] = _labels(labels)
            if not ok or obj is None or lb is None or not (isfinite(ts) and isfinite(value)):
                refused += 1
                continue
            good.append((metric, obj, lb, float(ts), float(value)))
        try:
            accepted = self.series.append_many(good)
        except ValueError:  # not expected after the checks above: store one by one, counting refusals
            accepted = 0
            for sample in good:
                try:
                    accepted += self.series.append(*sample)
                except ValueError:
                    refused += 1
        return accepted, refused + bad_rows, len(samples) - accepted - refused

    async def _read_limited(self, request: web.Request) -> bytes:
        try:
            return await read_body(request, self.max_body_bytes)
        except BodyTooLarge as e:
            raise StatusError(413, "RequestEntityTooLarge", str(e)) from None
        except Exception as e:  # a broken gzip stream, a truncated body
            encoded = request.headers.get("Content-Encoding", "identity")
            raise bad_request(f"cannot read the request body ({encoded}): {e}") from None
