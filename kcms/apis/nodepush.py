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
``kcms_push_nodes_marked_stale_total``). Nodes of the inventory that never
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

Binding (:mod:`kcms.apis.nodebinding`): a push speaks for one node, the one its credential names
(the node claim of the agent's bound ServiceAccount token, its pod claim through the inventory, or a
``system:node:<name>`` user in ``system:nodes``); a caller whose credential names no node is refused
as a whole with a 403 ``Status``. Each item is then checked against the inventory: a reading or a
sample about another node (``other_node``), about a node the inventory does not list
(``unknown_node``), about a pod the inventory does not list (``unknown_pod``) or places on another
node (``pod_not_on_node``), about another cluster-scoped object or a namespaced object other than a
pod (``object_not_bound``; the latter allowed with ``allow_namespaced`` in namespaces where the node
runs pods, else ``namespace_not_on_node``) is refused and counted, and the rest is stored. Before the
inventory has listed nodes and pods a push is answered ``503`` (nothing could be checked).

Bounds: readings (of the node, of containers) outside :mod:`kcms.sources.bounds` are refused
(``future_timestamp``: more than ``--max-future-skew`` ahead; ``negative``, ``non_finite``,
``absurd_value``, ``bad_value``; a refused container drops its pod, whose usage is never served
partial), and so are samples timestamped more than ``--max-future-skew`` ahead
(``future_timestamp``, :mod:`kcms.limits`); a pod reading with more than
``max_containers_per_pod`` containers (``too_many_containers``) or a container name that is not a
DNS label (``invalid_container_name``). Samples: Prometheus metric names (``invalid_metric_name``) of
at most 253 characters (``metric_name_too_long``), label names (``invalid_label_name``: malformed or
repeated) and label sizes (``too_many_labels``, ``label_name_too_long``, ``label_value_too_long``),
object references (``invalid_object``), finite values (``non_finite_value``), a block row whose
index is outside its tables (``bad_row``); ``series``/``history`` (store-to-store forms) are not
taken from nodes (``unsupported``). New series are limited per node (the writer is
``system:node:<node>``), per metric and in total by a :class:`kcms.apis.quota.SeriesQuota`
(``series_limit_writer``, ``series_limit_metric``, ``series_limit_total``). Every refusal is counted
in ``kcms_push_node_refused_total{item, reason}`` (item ``node``, ``pod``, ``container`` or
``sample``; ``store_refused`` if the series store still refuses a checked sample), and one escaped
log line per push summarises them (a warning when an item was not the node's own). The answer's
``refused`` counts every refused item, readings and samples.

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
grant lets a pusher report for the node its credential names, and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter as Tally
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import Counter, Gauge

from kcms import limits
from kcms.apis.nodebinding import (
    BAD_ROW,
    UNSUPPORTED,
    NodeScope,
    NoNodeIdentity,
    bound_node,
    bound_samples,
    node_identity,
)
from kcms.apis.quota import SeriesQuota
from kcms.apiserver import StatusError, bad_request
from kcms.apiserver.discovery import Route
from kcms.apiserver.responses import bytes_response, json_response
from kcms.httpbody import BodyTooLarge, read_body
from kcms.model import Inventory, UserInfo
from kcms.store.resource import ResourceStore
from kcms.store.series import SeriesStore
from kcms.store.wire import CONTENT_TYPE, Write, WriteAck, decode, encode
from kcms.tasks import cancel_and_wait

__all__ = ["EPOCH_HEADER", "NODES_PATH", "STATUS_PATH", "NodePushAPI"]

log = logging.getLogger(__name__)

NODES_PATH = "/push/v1/nodes"
STATUS_PATH = "/push/v1/status"
EPOCH_HEADER = "X-KCMS-Push-Epoch"
STANDBY_MESSAGE = "standby: not the active server"

PUSHES = Counter(
    "kcms_push_node_requests",
    "Node pushes received, by outcome (accepted, standby, not_synced, forbidden, epoch_changed, "
    "bad_request, too_large, unsupported_media_type).",
    ["outcome"],
)
NODES_STORED = Counter("kcms_push_nodes_stored", "Node readings stored from pushes.")
PUSH_SAMPLES = Counter(
    "kcms_push_node_samples",
    "Samples of node pushes, by result (accepted; duplicate: not newer than the series' last point; "
    "refused: see kcms_push_node_refused_total).",
    ["result"],
)
REFUSED = Counter(
    "kcms_push_node_refused",
    "Items of node pushes refused, by item (node, pod, container, sample) and reason (see "
    "kcms/apis/nodepush.py).",
    ["item", "reason"],
)
STALE = Gauge("kcms_push_stale_nodes", "Nodes not heard from within --node-stale-after.")
MARKED_STALE = Counter("kcms_push_nodes_marked_stale", "Times a node became stale.")

# New-series limits of node pushes (kcms server --node-push-max-series-per-node, --node-push-max-series,
# --node-push-max-series-per-metric). Per node: the agent's own buffer bound (--max-series-per-node).
DEFAULT_MAX_SERIES_PER_NODE = 20_000
DEFAULT_MAX_SERIES = 1_000_000
DEFAULT_MAX_SERIES_PER_METRIC: int | None = None  # kubelet metrics have a series per pod: no cap


def default_quota(ttl: float, clock: Callable[[], float] = time.monotonic) -> SeriesQuota:
    """The node-push quota with the defaults of ``kcms server``; a series is forgotten ``ttl``
    seconds after its last point (the series store's retention)."""
    return SeriesQuota(
        max_total=DEFAULT_MAX_SERIES,
        max_per_writer=DEFAULT_MAX_SERIES_PER_NODE,
        max_per_metric=DEFAULT_MAX_SERIES_PER_METRIC,
        ttl=ttl,
        clock=clock,
    )


_MEDIA_TYPE = CONTENT_TYPE.lower()
NOT_SYNCED_MESSAGE = "nodes and pods not listed yet: a push cannot be checked"
# Reasons that mean a node reported what is not its own (an attack or a misconfiguration): logged
# as warnings. The others (a pod the inventory has not seen yet, a bad value) are routine: info.
_HOSTILE = frozenset({"other_node", "pod_not_on_node", "object_not_bound", "namespace_not_on_node"})


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
        inventory: Inventory,
        quota: SeriesQuota | None = None,
        allow_namespaced: bool = False,
        max_containers_per_pod: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``active()``: whether this server holds the Lease now. ``inventory``: the nodes and pods
        pushes are checked against (and the nodes expected to report). ``quota``: new-series limits
        per node, per metric and in total (default: :func:`default_quota` over ``series``'
        retention). ``allow_namespaced``: accept samples about namespaced objects other than pods in
        namespaces where the node runs pods. ``clock``: monotonic seconds, the clock of
        :meth:`ResourceStore.store` and of the quota."""
        if not node_stale_after > 0:
            raise ValueError(f"node_stale_after must be positive, not {node_stale_after!r}")
        if max_containers_per_pod < 1:
            raise ValueError(f"max_containers_per_pod must be positive, not {max_containers_per_pod!r}")
        self.resources = resources
        self.series = series
        self.active = active
        self.node_stale_after = float(node_stale_after)
        self.max_body_bytes = int(max_body_bytes)
        self.inventory = inventory
        self.quota = quota if quota is not None else default_quota(series.retention, clock)
        self.allow_namespaced = bool(allow_namespaced)
        self.max_containers_per_pod = int(max_containers_per_pod)
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
        if self.inventory.has_synced():  # the inventory lists the nodes expected to report
            known = {n.name for n in self.inventory.nodes()}
            for node in stale - known:  # silent and gone from the inventory: deleted, forget it
                del self._last_seen[node]
                self.resources.forget_node(node)
            stale &= known
            if self._active_since < horizon:
                stale.update(n for n in known if n not in self._last_seen)
        newly = stale - self._stale
        for node in newly:
            self.resources.forget_node(node)
            log.info("node %s is stale: no push for more than %gs", limits.printable(node, 80), self.node_stale_after)
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
                403: "forbidden",
                409: "epoch_changed",
                413: "too_large",
                415: "unsupported_media_type",
                503: "standby" if e.message == STANDBY_MESSAGE else "not_synced",
            }.get(e.code, "error")
            PUSHES.labels(outcome).inc()
            raise

    def _identity(self, request: web.Request) -> tuple[UserInfo, NodeScope, str]:
        """The caller, what its node may report, and how the node was found; 503 before the
        inventory is listed, 403 when the credential names no node."""
        if not self.inventory.has_synced():
            raise StatusError(503, "ServiceUnavailable", NOT_SYNCED_MESSAGE)
        user = request.get("user")
        if not isinstance(user, UserInfo):  # the middleware always sets one; be safe anyway
            user = UserInfo(name="system:anonymous")
        try:
            identity = node_identity(user, self.inventory)
        except NoNodeIdentity as e:
            log.warning("node push refused: %s cannot report a node: %s", limits.printable(user.name, 80), e)
            raise StatusError(
                403,
                "Forbidden",
                f"User {limits.printable(user.name, 80)} cannot push node readings: {e}",
                {"kind": "nodes"},
            ) from None
        scope = NodeScope(identity.node, self.inventory, allow_namespaced=self.allow_namespaced)
        return user, scope, identity.via

    async def _push(self, request: web.Request) -> web.StreamResponse:
        now = self.clock()
        if not self._check_active(now):
            raise StatusError(503, "ServiceUnavailable", STANDBY_MESSAGE)
        media = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if media != _MEDIA_TYPE:
            raise StatusError(
                415,
                "UnsupportedMediaType",
                f"the body must be {CONTENT_TYPE} (a kcms.store.wire.Write), not {limits.printable(media or 'untyped', 80)}",
            )
        user, scope, via = self._identity(request)  # before reading: a stranger's body is not read
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
                f"push epoch {limits.printable(continues, 64)} is over (now {self.epoch}): send every buffered point",
                {"name": self.epoch, "kind": "epoch"},
            )

        refusals: Tally[tuple[str, str]] = Tally()
        future = limits.future_limit()
        nodes = 0
        for wire_node in write.nodes:
            batch = bound_node(wire_node, scope, future, self.max_containers_per_pod, refusals)
            if batch is None:
                continue
            self.resources.store(batch)
            self._last_seen[batch.node] = self.clock()
            if batch.node in self._stale:
                self._stale.discard(batch.node)
                STALE.set(len(self._stale))
                log.info("node %s reports again", limits.printable(batch.node, 80))
            nodes += 1
        if write.history:  # (previous, last) pairs are for store-to-store copies, not from nodes
            refusals["node", UNSUPPORTED] += len(write.history)
        NODES_STORED.inc(nodes)
        accepted, duplicate = self._store_samples(write, scope, future, refusals)
        refused = sum(refusals.values())
        for (item, reason), n in refusals.items():
            REFUSED.labels(item, reason).inc(n)
        refused_samples = sum(n for (item, _), n in refusals.items() if item == "sample")
        PUSH_SAMPLES.labels("accepted").inc(accepted)
        PUSH_SAMPLES.labels("refused").inc(refused_samples)
        PUSH_SAMPLES.labels("duplicate").inc(duplicate)
        PUSHES.labels("accepted").inc()
        if refusals:
            level = logging.WARNING if any(r in _HOSTILE for _, r in refusals) else logging.INFO
            log.log(
                level,
                "node push of %s for node %s (%s): refused %s",
                limits.printable(user.name, 80),
                limits.printable(scope.node, 80),
                via,
                ", ".join(f"{n} {item} {reason}" for (item, reason), n in sorted(refusals.items())),
            )
        ack = encode(WriteAck(nodes=nodes, samples=accepted, refused=refused))
        return bytes_response(request, ack, content_type=CONTENT_TYPE, headers={EPOCH_HEADER: self.epoch})

    def _store_samples(
        self, write: Write, scope: NodeScope, future: float, refusals: Tally[tuple[str, str]]
    ) -> tuple[int, int]:
        """Check and store the write's samples; ``(accepted, duplicate)``, refusals counted in
        ``refusals``."""
        samples: list[Any] = list(write.samples)
        if write.block is not None:  # the compact form store writers use; accepted here too
            strings, labelsets = write.block.strings, write.block.labels
            for row in write.block.rows:
                try:
                    m, r, ns, n, lb, ts, value = row
                    samples.append(
                        (strings[m], strings[r], strings[ns], strings[n], labelsets[lb], ts, value)
                    )
                except IndexError:
                    refusals["sample", BAD_ROW] += 1
        if write.series:  # packed series are for store-to-store copies, not from nodes
            refusals["sample", UNSUPPORTED] += len(write.series)
        good = bound_samples(
            samples, scope, future, self.quota, f"system:node:{scope.node}", self.clock(), refusals
        )
        try:
            accepted = self.series.append_many(good)
        except ValueError:  # not expected after the checks: store one by one, counting refusals
            accepted = 0
            for sample in good:
                try:
                    accepted += self.series.append(*sample)
                except ValueError:
                    refusals["sample", "store_refused"] += 1
        return accepted, len(good) - accepted - refusals["sample", "store_refused"]

    async def _read_limited(self, request: web.Request) -> bytes:
        try:
            return await read_body(request, self.max_body_bytes)
        except BodyTooLarge as e:
            raise StatusError(413, "RequestEntityTooLarge", str(e)) from None
        except Exception as e:  # a broken gzip stream, a truncated body
            encoded = request.headers.get("Content-Encoding", "identity")
            raise bad_request(f"cannot read the request body ({encoded}): {e}") from None
