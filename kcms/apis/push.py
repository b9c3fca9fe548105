"""An authenticated push endpoint: jobs, queues and other programs publish metric samples into the
series store, to be read back through custom.metrics.k8s.io and external.metrics.k8s.io.

``POST /push/v1/samples`` with a JSON body::

    {"samples": [{"metric": "queue_backlog", "resource": "", "namespace": "jobs", "name": "",
                  "labels": {"queue": "emails"}, "value": 42, "timestamp": 1700000000.5}]}

``resource`` is ``""`` for an external metric (then ``name`` is ``""`` and ``namespace`` is the
namespace the metric is served in) or a group-resource (``pods``, ``deployments.apps``, ``nodes``)
for a metric about a Kubernetes object. ``labels`` (default none), ``timestamp`` (seconds since the
epoch, default: the time the request arrived) and ``resource``/``namespace``/``name`` (default ``""``)
are optional. ``value`` is a JSON number or a numeric string (``"NaN"`` and ``"+Inf"`` parse, and
are refused as samples).

The answer is ``{"accepted": n, "rejected": {reason: count}, "errors": [...first few...]}``.
A malformed body (bad JSON, a field of the wrong type, an unknown field) is refused as a whole with
a 400 ``Status`` naming the field; a body over the size limit with a 413. Everything else is
decided sample by sample: a refused sample is counted under its reason and never fails the others.

Access: the API server's middleware authenticates every request (no credential, or the anonymous
user: 401) and leaves ``/push/v1/samples`` to this handler, which authorizes every distinct target
of the push once (:mod:`kcms.apis.pushauth`): a SubjectAccessReview with verb ``create`` on the
target as a read of it is checked — group ``custom.metrics.k8s.io``, resource = the object's
group-resource, name = the object's name, subresource = the metric; for an external metric group
``external.metrics.k8s.io``, resource = the metric — in the target's namespace. A sample whose
target is denied is refused as ``forbidden``; one whose review could not be made (API server
unreachable) as ``authorization_error``; one needing a review beyond ``max_target_reviews`` for
this push as ``too_many_targets``; the others are stored. A Role in one namespace grants
pushes to that namespace only::

    apiVersion: rbac.authorization.k8s.io/v1
    kind: Role
    metadata: {name: kcms-metrics-pusher, namespace: jobs}
    rules:
      - apiGroups: ["custom.metrics.k8s.io"]
        resources: ["pods/queue_depth", "deployments.apps/queue_depth"]  # <resource>/<metric>, or "*"
        verbs: ["create"]
      - apiGroups: ["external.metrics.k8s.io"]
        resources: ["queue_backlog"]  # the external metric's name
        verbs: ["create"]

bound with a RoleBinding in ``jobs`` (``resourceNames`` may narrow it to some objects). Metrics
about cluster-scoped objects (``nodes``, ``namespaces``) need a ClusterRole and ClusterRoleBinding.
The old grant, the non-resource ``post`` on ``/push/v1/samples`` (a ClusterRole with
``nonResourceURLs``), lets its holder write any target; it counts only with
``--push-allow-nonresource-grant`` (off by default) and otherwise gives nothing.

Cardinality (:mod:`kcms.apis.quota`): a *new* series (metric + object + labels) is refused when its
writer (the authenticated user; a ServiceAccount is ``system:serviceaccount:<ns>:<name>``) already
created ``max_series_per_writer`` series (``series_limit_writer``), its metric has
``max_series_per_metric`` (``series_limit_metric``) or ``max_series_total`` exist
(``series_limit_total``); each refusal is counted and logged. Series already known keep accepting
points, and every other series keeps being served. A series that received no point for
``series_ttl`` seconds (default: the store's retention; checked every ``series_ttl / 16``) no longer
counts against the limits.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from aiohttp import web
from prometheus_client import Counter

from kcms import limits
from kcms.apiserver import USER, StatusError, bad_request, unauthorized
from kcms.apiserver.authz import AccessAuthorizer
from kcms.apiserver.discovery import Route
from kcms.apiserver.responses import json_response
from kcms.httpbody import BodyTooLarge, read_body
from kcms.model import Labels, ObjectRef, UserInfo
from kcms.selectors import validate_label_key

from .pushauth import AUTHORIZATION_ERROR, FORBIDDEN, TOO_MANY_TARGETS, Target, TargetAuthorizer
from .quota import SERIES_LIMIT_METRIC, SERIES_LIMIT_TOTAL, SERIES_LIMIT_WRITER, SeriesQuota

log = logging.getLogger(__name__)

PUSH_PATH = "/push/v1/samples"

SAMPLES = Counter("kcms_push_samples", "Pushed samples, by result (accepted, rejected).", ["result"])
REJECTED = Counter(
    "kcms_push_rejected",
    "Pushed samples refused, by reason (invalid_metric_name, metric_name_too_long, invalid_object, "
    "forbidden, authorization_error, too_many_targets, invalid_label_name, too_many_labels, label_value_too_long, "
    "non_finite_value, future_timestamp, too_old, out_of_order, series_limit_writer, series_limit_metric, "
    "series_limit_total, store_refused).",
    ["reason"],
)

# Refusal reasons (stable: used as Prometheus label values and in the answer).
INVALID_METRIC_NAME = "invalid_metric_name"
INVALID_OBJECT = "invalid_object"
INVALID_LABEL_NAME = "invalid_label_name"
TOO_MANY_LABELS = "too_many_labels"
LABEL_VALUE_TOO_LONG = "label_value_too_long"
NON_FINITE_VALUE = "non_finite_value"
FUTURE_TIMESTAMP = "future_timestamp"
TOO_OLD = "too_old"
OUT_OF_ORDER = "out_of_order"
STORE_REFUSED = "store_refused"
__all__ = [  # the reasons of the other modules are re-exported: one place lists every push refusal
    "AUTHORIZATION_ERROR",
    "FORBIDDEN",
    "PUSH_PATH",
    "SERIES_LIMIT_METRIC",
    "SERIES_LIMIT_TOTAL",
    "SERIES_LIMIT_WRITER",
    "TOO_MANY_TARGETS",
    "PushAPI",
    "PushLimits",
    "PushSample",
    "PushSummary",
    "parse_body",
]

_METRIC_RE = limits.METRIC_NAME_RE
_DNS_LABEL_RE = limits.DNS_LABEL_RE
_DNS_SUBDOMAIN_RE = limits.DNS_SUBDOMAIN_RE
_FIELDS = frozenset({"metric", "resource", "namespace", "name", "labels", "value", "timestamp"})
_MAX_ERRORS = 10  # per-sample explanations returned in one answer
_BATCH = 1000  # samples stored between two yields to the event loop
_LOG_EVERY = 10.0  # seconds between two log lines about the same limit


class SampleSink(Protocol):
    """Where accepted samples go (``kcms.store.series.SeriesStore``)."""

    def append(self, metric: str, obj: ObjectRef, labels: Labels, timestamp: float, value: float) -> bool: ...


@dataclass(slots=True)
class PushLimits:
    """What one push and the pushed series as a whole may hold."""

    max_body_bytes: int = 1 << 20  # larger bodies: 413
    max_samples: int = 10_000  # samples in one request; more: 413
    max_labels: int = 16  # labels of one series
    max_label_value_length: int = 128
    max_series_per_metric: int = 10_000  # distinct pushed series of one metric name
    max_series_total: int = 100_000  # distinct pushed series
    max_series_per_writer: int = 10_000  # distinct pushed series created by one authenticated writer
    max_target_reviews: int = 1000  # access reviews one push may need; targets beyond: too_many_targets
    max_future_skew: float | None = None  # seconds ahead of this server's clock; None: --max-future-skew
    series_ttl: float | None = None  # seconds without a point before a series stops counting; None: retention


@dataclass(slots=True, frozen=True)
class PushSample:
    """One well-formed sample of a push (its fields have the right types; values not yet checked)."""

    metric: str
    resource: str
    namespace: str
    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None


@dataclass(slots=True)
class PushSummary:
    """The outcome of one push."""

    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)  # the first few refusals, explained

    def refuse(self, index: int, reason: str, message: str) -> None:
        """Count a refused sample (and keep the first few explanations)."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        if len(self.errors) < _MAX_ERRORS:
            self.errors.append({"index": index, "reason": reason, "message": message})

    def body(self) -> dict[str, Any]:
        """The JSON answer."""
        return {"accepted": self.accepted, "rejected": dict(self.rejected), "errors": list(self.errors)}


# ---- parsing: the shape of the body (whole-request 400s) --------------------------------------------


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise bad_request(f"{where}: must be a number")
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise bad_request(f"{where}: {value[:64]!r} is not a number") from None
    try:
        return float(value)
    except OverflowError:  # an integer beyond the range of a double
        return math.inf


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad_request(f"{where}.{key}: must be a string")
    return value


def parse_body(body: bytes) -> list[PushSample]:
    """Decode a push body; raise a 400 :class:`StatusError` naming the first malformed part."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"malformed JSON: {e}") from None
    if not isinstance(doc, dict):
        raise bad_request("the body must be a JSON object with a 'samples' list")
    unknown = sorted(set(doc) - {"samples"})
    if unknown:
        raise bad_request(f"unknown field {unknown[0]!r}")
    items = doc.get("samples")
    if not isinstance(items, list):
        raise bad_request("samples: required, must be a list")
    samples = []
    for i, item in enumerate(items):
        where = f"samples[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where}: must be an object")
        unknown = sorted(set(item) - _FIELDS)
        if unknown:
            raise bad_request(f"{where}: unknown field {unknown[0]!r}")
        metric = item.get("metric")
        if not isinstance(metric, str):
            raise bad_request(f"{where}.metric: required, must be a string")
        if "value" not in item:
            raise bad_request(f"{where}.value: required")
        value = _number(item["value"], f"{where}.value")
        ts = item.get("timestamp")
        if isinstance(ts, str):
            raise bad_request(f"{where}.timestamp: must be a number of seconds since the epoch")
        timestamp = None if ts is None else _number(ts, f"{where}.timestamp")
        labels = item.get("labels")
        if labels is None:
            labels = {}
        if not isinstance(labels, dict):
            raise bad_request(f"{where}.labels: must be an object of strings")
        for k, v in labels.items():
            if not isinstance(v, str):
                raise bad_request(f"{where}.labels[{k!r}]: must be a string")
        samples.append(
            PushSample(
                metric=metric,
                resource=_string(item, "resource", where),
                namespace=_string(item, "namespace", where),
                name=_string(item, "name", where),
                labels=labels,
                value=value,
                timestamp=timestamp,
            )
        )
    return samples


def _object_problem(s: PushSample) -> str | None:
    """Why the sample's object reference is not usable, or None."""
    if s.namespace and (len(s.namespace) > 63 or not _DNS_LABEL_RE.fullmatch(s.namespace)):
        return f"namespace {s.namespace[:80]!r} is not a valid namespace name"
    if not s.resource:
        if s.name:
            return 'an external metric (resource "") has no object name'
        if not s.namespace:
            return "an external metric needs the namespace it is served in"
        return None
    if len(s.resource) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(s.resource):
        return f"resource {s.resource[:80]!r} is not a group-resource such as 'pods' or 'deployments.apps'"
    if not s.name:
        return f"a metric about {s.resource} needs the object's name"
    if len(s.name) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(s.name):
        return f"name {s.name[:80]!r} is not a valid object name"
    return None


# ---- the endpoint ------------------------------------------------------------------------------------


class PushAPI:
    """The push endpoint over a series store. Mount it with :meth:`install` (or :meth:`routes`)."""

    def __init__(
        self,
        store: SampleSink,
        limits: PushLimits | None = None,
        *,
        authorizer: AccessAuthorizer | None = None,
        allow_nonresource_grant: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``authorizer`` decides each target of an HTTP push (the API server's ``Authorizer``;
        :meth:`install` takes the server's when none is given; without one every target is refused).
        ``allow_nonresource_grant`` lets the legacy non-resource grant write anywhere.
        ``clock`` (monotonic seconds) times how long a series has gone without a point."""
        self.store = store
        self.clock = clock
        self.limits = limits or PushLimits()
        retention = getattr(store, "retention", None)
        self.retention: float | None = float(retention) if retention is not None else None
        ttl = self.limits.series_ttl
        self.series_ttl = float(ttl if ttl is not None else (self.retention or 600.0))
        self.quota = SeriesQuota(
            max_total=self.limits.max_series_total,
            max_per_writer=self.limits.max_series_per_writer,
            max_per_metric=self.limits.max_series_per_metric,
            ttl=self.series_ttl,
            clock=clock,
        )
        self.targets = TargetAuthorizer(
            authorizer,
            path=PUSH_PATH,
            allow_nonresource_grant=allow_nonresource_grant,
            max_reviews=self.limits.max_target_reviews,
        )
        self._last_log: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def routes(self) -> list[Route]:
        """``[(method, path, handler)]`` to add to the server's router (full paths). The server must
        also leave the path's authorization to the handler (:meth:`install` does both)."""
        return [("POST", PUSH_PATH, self.handle)]

    def install(self, server: Any) -> None:
        """Mount on an ``AggregatedAPIServer`` (before it starts): the route, the path authorized by
        this handler per target instead of by the middleware, and the server's authorizer."""
        for method, path, handler in self.routes():
            server.app.router.add_route(method, path, handler)
        paths = server.authz_options.handler_authorized_paths
        if PUSH_PATH not in paths:
            paths.append(PUSH_PATH)
        if self.targets.authorizer is None:
            self.targets.authorizer = server.authorizer

    def series_count(self, metric: str | None = None, writer: str | None = None) -> int:
        """How many pushed series count against the limits (of one metric, one writer, or in total)."""
        return self.quota.count(writer=writer, metric=metric)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """``POST /push/v1/samples``."""
        user = request.get(USER)
        # Identity comes from the credential: an anonymous caller can own no quota and no grant.
        if (
            not isinstance(user, UserInfo)
            or user.name == "system:anonymous"
            or ("system:unauthenticated" in user.groups)
        ):
            raise unauthorized()
        body = await self._read_limited(request)
        samples = parse_body(body)
        if len(samples) > self.limits.max_samples:
            raise StatusError(
                413,
                "RequestEntityTooLarge",
                f"{len(samples)} samples in one request; at most {self.limits.max_samples} are accepted",
            )
        targets = {_target(s) for s in samples if _valid_target(s)}
        refusals = await self.targets.refusals(user, targets)
        summary = PushSummary()
        wall = time.time()
        for start in range(0, len(samples), _BATCH):
            if start:
                await asyncio.sleep(0)  # let other requests run between batches of a large push
            self._ingest_batch(samples[start : start + _BATCH], start, wall, summary, user.name, refusals)
        return json_response(request, summary.body())

    async def _read_limited(self, request: web.Request) -> bytes:
        try:
            return await read_body(request, self.limits.max_body_bytes)
        except BodyTooLarge as e:
            raise StatusError(413, "RequestEntityTooLarge", str(e)) from None

    def ingest(
        self, samples: Iterable[PushSample], now: float | None = None, *, writer: str = ""
    ) -> PushSummary:
        """Check and store samples one by one (no authorization: for callers inside the process);
        return what was accepted and why others were not. ``writer`` owns the new series."""
        summary = PushSummary()
        self._ingest_batch(samples, 0, time.time() if now is None else now, summary, writer, None)
        return summary

    def _ingest_batch(
        self,
        samples: Iterable[PushSample],
        first: int,
        wall: float,
        summary: PushSummary,
        writer: str,
        refusals: dict[Target, tuple[str, str]] | None,
    ) -> None:
        mono = self.clock()
        accepted = rejected = 0
        for i, s in enumerate(samples, first):
            reason, message = self._ingest_one(s, wall, mono, writer, refusals)
            if reason is None:
                accepted += 1
            else:
                rejected += 1
                summary.refuse(i, reason, message)
                REJECTED.labels(reason).inc()
        summary.accepted += accepted
        SAMPLES.labels("accepted").inc(accepted)
        SAMPLES.labels("rejected").inc(rejected)

    def _ingest_one(
        self,
        s: PushSample,
        wall: float,
        mono: float,
        writer: str,
        refusals: dict[Target, tuple[str, str]] | None,
    ) -> tuple[str | None, str]:
        lim = self.limits
        too_long = limits.metric_name_problem(s.metric)
        if too_long:
            return too_long
        if not _METRIC_RE.fullmatch(s.metric):
            return INVALID_METRIC_NAME, f"metric name {s.metric[:80]!r} must match [a-zA-Z_:][a-zA-Z0-9_:]*"
        problem = _object_problem(s)
        if problem:
            return INVALID_OBJECT, problem
        if refusals:  # before anything else about the sample: a refused writer learns nothing more
            refused = refusals.get(_target(s))
            if refused is not None:
                return refused
        if len(s.labels) > lim.max_labels:
            return TOO_MANY_LABELS, f"{len(s.labels)} labels, at most {lim.max_labels} are allowed"
        for k, v in s.labels.items():
            why = validate_label_key(k)
            if why:
                return INVALID_LABEL_NAME, why
            if len(v) > lim.max_label_value_length:
                return (
                    LABEL_VALUE_TOO_LONG,
                    f"label {k!r} has a value of {len(v)} characters, at most {lim.max_label_value_length}",
                )
        if not math.isfinite(s.value):
            return NON_FINITE_VALUE, f"value {s.value} is not a finite number"
        skew = limits.max_future_skew() if lim.max_future_skew is None else lim.max_future_skew
        ts = wall if s.timestamp is None else s.timestamp
        if not math.isfinite(ts) or ts > wall + skew:
            return FUTURE_TIMESTAMP, f"timestamp {ts} is more than {skew:g}s in the future"
        if self.retention is not None and ts < wall - self.retention:
            return TOO_OLD, f"timestamp {ts} is older than the retention ({self.retention:g}s)"

        obj = ObjectRef(s.resource, s.namespace, s.name)
        labels: Labels = tuple(sorted(s.labels.items()))
        key = hash((s.metric, obj, labels))
        over = self.quota.check(writer, s.metric, key)
        if over is not None:
            return over, self._over_limit(over, writer, s.metric)
        try:
            stored = self.store.append(s.metric, obj, labels, ts, s.value)
        except ValueError as e:  # the store's own checks (not expected after ours)
            return STORE_REFUSED, str(e)
        if not stored:
            return OUT_OF_ORDER, f"timestamp {ts} is not newer than the series' last point"
        self.quota.record(writer, s.metric, key, mono)
        return None, ""

    def _over_limit(self, reason: str, writer: str, metric: str) -> str:
        """Log (rate-limited) and explain a refused new series."""
        lim = self.limits
        if reason == SERIES_LIMIT_WRITER:
            limit = lim.max_series_per_writer
            message = f"{limits.printable(writer, 80)} already created {limit} series; no new one is accepted from it"
        elif reason == SERIES_LIMIT_METRIC:
            limit = lim.max_series_per_metric
            message = f"metric {metric!r} already has {limit} series; no new one is accepted"
        else:
            limit = lim.max_series_total
            message = f"{limit} pushed series exist; no new one is accepted"
        self._log_limit(reason, metric, limit, writer)
        return message

    def _log_limit(self, reason: str, metric: str, limit: int, writer: str) -> None:
        """Log a cardinality refusal, at most once per reason every few seconds (with the count since)."""
        now = time.monotonic()
        self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
        if now - self._last_log.get(reason, -math.inf) < _LOG_EVERY:
            return
        count = self._unlogged.pop(reason)
        self._last_log[reason] = now
        log.warning(
            "push: refused %d new series (%s, limit %d), e.g. of metric %s from %s; existing series still "
            "accept points",
            count,
            reason,
            limit,
            limits.printable(metric, 80),
            limits.printable(writer, 80),
        )


def _target(s: PushSample) -> Target:
    return (s.metric, s.resource, s.namespace, s.name)


def _valid_target(s: PushSample) -> bool:
    """Whether the sample names a target worth a review (malformed ones are refused for that)."""
    return (
        limits.metric_name_problem(s.metric) is None
        and _METRIC_RE.fullmatch(s.metric) is not None
        and _object_problem(s) is None
    )
