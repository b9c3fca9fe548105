"""Prometheus remote write 1.0 in: ``POST /api/v1/write`` feeds the series store like a push.

Prometheus (also in agent mode), vmagent, Grafana Alloy and the OpenTelemetry Collector's
``prometheusremotewrite`` exporter send a snappy-compressed protobuf ``WriteRequest``
(:mod:`kcms.sources.remote_write` decodes and bounds it) with ``Content-Type:
application/x-protobuf`` and ``Content-Encoding: snappy``. Each series becomes points of a metric
about one Kubernetes object, served by ``custom.metrics.k8s.io`` (or an external metric, served by
``external.metrics.k8s.io``):

* the metric is the ``__name__`` label;
* the object comes from the series' labels by prometheus-adapter's label association
  (``resources.overrides`` / ``template``, :mod:`kcms.apis.remote_write_binding`, cached per label
  set): with ``--config``, the ``resources`` of the first ``rules`` entry whose ``seriesQuery``
  (and ``seriesFilters``) select the series -- none: refused, ``no_rule`` --, else
  :class:`DefaultResources` (the ``namespace``
  label holds the namespace, a label named after a resource's kind in lower case -- ``pod``,
  ``node``, ``deployment``, ``statefulset``, ``service`` ... -- names an object of it; ``job`` is
  left alone: it is Prometheus's scrape job, not a ``jobs.batch``);
* a series naming several objects is bound to one: its pod, else the first namespaced object the
  mapper lists, else the first cluster-scoped one (a node); the other labels (``__name__``, the
  namespace label and the object's label removed) stay labels of the series;
* a series naming no object is an external metric in its namespace; one with neither an object
  nor a namespace is refused (``no_object``).

Access is exactly a push's (:mod:`kcms.apis.push`, :mod:`kcms.apis.pushauth`): the caller is the
authenticated user (no credential: 401 from the server's middleware; anonymous: 401 here), each
distinct target (metric, group-resource, namespace, name) of a request is authorized once with a
SubjectAccessReview, verb ``create`` on ``custom.metrics.k8s.io`` ``<resource>/<metric>`` (or
``external.metrics.k8s.io`` ``<metric>``) in the target's namespace, and new series count against
the same per-writer, per-metric and total quotas as pushes (the push API's
:class:`~kcms.apis.quota.SeriesQuota` is shared when given).

Every refusal is per sample, counted by reason in ``kcms_remote_write_rejected`` and never loses
the other series of the request. The answer, for the sender's retry logic (Prometheus retries 5xx
and 429 and drops a batch answered with another 4xx):

* **204** when a sample was stored, or every refusal is one a retry would repeat harmlessly
  (``out_of_order``: a resend; ``too_old``) -- partial refusals are then only in the metrics, the
  rate-limited log and the ``X-Kcms-Rejected`` header (a 4xx would make Prometheus drop the stored
  part's batch for nothing, and it cannot resend only the refused part);
* **503** (``Retry-After``) when a review could not be made (API server unreachable): the
  undecided series are lost otherwise; the allowed ones are stored, so their resend counts as
  ``out_of_order``;
* **403** when nothing was stored and a target was forbidden (the operator sees it in the sender's
  log: a missing RoleBinding);
* **400** when nothing was stored for other reasons (bad names, future timestamps, quotas);
* whole-request refusals: 400 for a body that is not snappy or not a ``WriteRequest``, 413 over a
  size bound, 415 for another content type or encoding (remote write 2.0 included).

Staleness markers (the NaN Prometheus writes when a series disappears) are skipped and counted as
``kcms_remote_write_samples{result="stale_marker"}``; any other NaN or infinity is refused
(``non_finite_value``). Native histograms are refused (``native_histogram``, one per histogram
sample); exemplars and metadata are ignored.
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import Counter

from kcms import limits
from kcms.apiserver import USER, StatusError, unauthorized
from kcms.apiserver.authz import AccessAuthorizer
from kcms.apiserver.responses import status_response
from kcms.httpbody import BodyTooLarge, read_body
from kcms.model import Labels, ObjectRef, UserInfo
from kcms.sources.remote_write import RawSeries, RemoteWriteError, WriteLimits, decode

from .pushauth import AUTHORIZATION_ERROR, FORBIDDEN, TOO_MANY_TARGETS, Target, TargetAuthorizer
from .quota import SeriesQuota
from .remote_write_binding import (
    INVALID_LABEL_NAME,
    INVALID_METRIC_NAME,
    INVALID_OBJECT,
    MALFORMED_LABELS,
    NO_OBJECT,
    Binding,
    DefaultResources,
    Refusal,
    ResourceMapper,
    SeriesBinder,
    config_mapper,
    default_namespaced,
)

__all__ = [
    "INVALID_LABEL_NAME",
    "INVALID_METRIC_NAME",
    "INVALID_OBJECT",
    "MALFORMED_LABELS",
    "NO_OBJECT",
    "REMOTE_WRITE_PATH",
    "Binding",
    "DefaultResources",
    "RemoteWriteAPI",
    "ResourceMapper",
    "SeriesBinder",
    "config_mapper",
    "default_namespaced",
    "install_from_args",
]

log = logging.getLogger(__name__)

REMOTE_WRITE_PATH = "/api/v1/write"

SAMPLES = Counter(
    "kcms_remote_write_samples",
    "Remote-write samples, by result (accepted, rejected, stale_marker: skipped staleness markers).",
    ["result"],
)
REJECTED = Counter(
    "kcms_remote_write_rejected",
    "Remote-write samples refused, by reason (invalid_metric_name, metric_name_too_long, invalid_label_name, "
    "label_name_too_long, label_value_too_long, too_many_labels, malformed_labels, invalid_object, no_object, no_rule, "
    "forbidden, authorization_error, too_many_targets, too_many_samples, non_finite_value, future_timestamp, "
    "too_old, out_of_order, native_histogram, series_limit_writer, series_limit_metric, series_limit_total, "
    "store_refused).",
    ["reason"],
)
REQUESTS = Counter(
    "kcms_remote_write_requests",
    "Remote-write requests by answer code, and requests refused whole by reason (reason is '' for the others: "
    "malformed_snappy, malformed_protobuf, body_too_large, decompressed_too_large, too_many_series, "
    "too_many_samples, unsupported_media_type).",
    ["code", "reason"],
)

# Per-sample refusal reasons of this path (the others are the binding's, kcms.limits', pushauth's and
# quota's).
TOO_MANY_SAMPLES = "too_many_samples"
NON_FINITE_VALUE = "non_finite_value"
TOO_OLD = "too_old"
OUT_OF_ORDER = "out_of_order"
NATIVE_HISTOGRAM = "native_histogram"
STORE_REFUSED = "store_refused"
_BENIGN = frozenset({OUT_OF_ORDER, TOO_OLD})  # refusals a resend repeats harmlessly: still a 204
_AUTHZ = frozenset({FORBIDDEN, TOO_MANY_TARGETS})

STALE_NAN = 0x7FF0000000000002  # Prometheus's staleness marker (value.StaleNaN)
_F64 = struct.Struct("<d")
_U64 = struct.Struct("<Q")
_SERIES_PER_STEP = 5000  # series ingested between two yields to the event loop
_LOG_EVERY = 10.0  # seconds between two log lines about the same reason
_HEADER_REASONS = 8  # reasons listed in X-Kcms-Rejected
RETRY_AFTER = 5  # seconds, on a 503 (a review could not be made)
DECISION_TTL = 2.0  # seconds an authorization answer is reused (on top of the reviewer's cache)
MAX_DECISIONS = 200_000  # targets remembered per user; more: forgotten (asked again)
MAX_DECISION_USERS = 64  # users remembered; more: all forgotten


class SampleSink(Protocol):
    """Where accepted samples go (``SeriesStore`` or ``ClusterSink``)."""

    def append_many(self, samples: Any) -> int: ...


class RemoteWriteAPI:
    """The remote-write endpoint over a series store. Mount it with :meth:`install`."""

    def __init__(
        self,
        store: SampleSink,
        limits: WriteLimits | None = None,
        *,
        binder: SeriesBinder | None = None,
        quota: SeriesQuota | None = None,
        authorizer: AccessAuthorizer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``quota``: the push API's (shared: a writer's series count once across both paths); a
        new one with the push defaults otherwise. ``authorizer``: the server's (taken by
        :meth:`install` when None; without one every target is refused)."""
        self.store = store
        self.limits = limits or WriteLimits()
        self.binder = binder or SeriesBinder(max_labels=self.limits.max_labels)
        retention = getattr(store, "retention", None)
        self.retention: float | None = float(retention) if retention is not None else None
        self.quota = quota or SeriesQuota(ttl=self.retention or 600.0, clock=clock)
        self.clock = clock
        self.targets = TargetAuthorizer(authorizer, path=REMOTE_WRITE_PATH)
        self._last_log: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}
        # user -> (expiry, {target: refusal or None}) (see _refusals)
        self._decided: dict[UserInfo, tuple[float, dict[Target, Refusal | None]]] = {}

    def install(self, server: Any) -> None:
        """Mount on an ``AggregatedAPIServer`` before it starts: the route, the path authorized per
        target by this handler (not by the middleware), and the server's authorizer."""
        server.app.router.add_route("POST", REMOTE_WRITE_PATH, self.handle)
        paths = server.authz_options.handler_authorized_paths
        if REMOTE_WRITE_PATH not in paths:
            paths.append(REMOTE_WRITE_PATH)
        if self.targets.authorizer is None:
            self.targets.authorizer = server.authorizer

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """``POST /api/v1/write``."""
        try:
            response = await self._handle(request)
        except StatusError as e:
            REQUESTS.labels(str(e.code), getattr(e, "_kcms_reason", "")).inc()
            raise
        REQUESTS.labels(str(response.status), "").inc()
        return response

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        user = request.get(USER)
        # identity comes from the credential: an anonymous caller can own no quota and no grant
        if (
            not isinstance(user, UserInfo)
            or user.name == "system:anonymous"
            or "system:unauthenticated" in user.groups
        ):
            raise unauthorized()
        self._check_media(request)
        try:
            body = await read_body(request, self.limits.max_compressed_bytes)
        except BodyTooLarge as e:
            raise self._refused(413, "RequestEntityTooLarge", "body_too_large", str(e)) from None
        try:
            series = decode(body, self.limits)
        except RemoteWriteError as e:
            kind = "RequestEntityTooLarge" if e.code == 413 else "BadRequest"
            raise self._refused(e.code, kind, e.reason, str(e)) from None
        del body
        binder = self.binder
        bindings = binder.bind_all(series)
        refusals = await self._refusals(user, {b.target for b in bindings if b.__class__ is Binding})
        rejected: dict[str, int] = {}
        accepted = stale = 0
        wall = time.time()
        for start in range(0, len(series), _SERIES_PER_STEP):
            if start:
                await asyncio.sleep(0)  # other requests run between the steps of a large write
            end = start + _SERIES_PER_STEP
            a, s = self._ingest(series[start:end], bindings[start:end], refusals, user.name, wall, rejected)
            accepted += a
            stale += s
        return self._answer(request, accepted, stale, rejected, user)

    async def _refusals(self, user: UserInfo, targets: set[Target]) -> dict[Target, Refusal]:
        """The push's per-target authorization, with decisions reused for ``DECISION_TTL`` seconds.

        A sender repeats the same targets request after request: asking the authorizer again for
        each (even with its cached reviews) cost ~1 us a series, as much as storing it. Allowed and
        denied answers are kept per user for ``DECISION_TTL`` seconds, all expiring together, on
        top of the review cache's own 10 s (a revoked grant stops writes within 12 s instead of 10);
        failed reviews are never kept."""
        now = self.clock()
        entry = self._decided.get(user)
        if entry is None or entry[0] <= now or len(entry[1]) > MAX_DECISIONS:
            if len(self._decided) >= MAX_DECISION_USERS:
                self._decided.clear()
            entry = self._decided[user] = (now + DECISION_TTL, {})
        known = entry[1]
        out: dict[Target, Refusal] = {}
        undecided = set()
        missing = object()
        for t in targets:
            hit = known.get(t, missing)
            if hit is missing:
                undecided.add(t)
            elif hit is not None:
                out[t] = hit  # type: ignore[assignment]
        if undecided:
            fresh = await self.targets.refusals(user, undecided)
            for t in undecided:
                r = fresh.get(t)
                if r is None or r[0] != AUTHORIZATION_ERROR:
                    known[t] = r
            out.update(fresh)
        return out

    def ingest(
        self, series: list[RawSeries], writer: str = "", now: float | None = None
    ) -> tuple[int, dict[str, int]]:
        """Bind, check and store decoded series without authorization (for callers inside the
        process and the benchmark); ``(accepted, {reason: refused})``."""
        rejected: dict[str, int] = {}
        bindings = self.binder.bind_all(series)
        accepted, _ = self._ingest(
            series, bindings, {}, writer, time.time() if now is None else now, rejected
        )
        for reason, n in rejected.items():
            REJECTED.labels(reason).inc(n)
        return accepted, rejected

    def _ingest(
        self,
        series: Sequence[RawSeries],
        bindings: Sequence[Binding | Refusal],
        refusals: Mapping[Target, Refusal],
        writer: str,
        wall: float,
        rejected: dict[str, int],
    ) -> tuple[int, int]:
        """Store what may be stored; count refusals in ``rejected``; ``(accepted, stale markers)``."""
        future = limits.future_limit(wall) * 1000.0  # compared in milliseconds: one division less a sample
        oldest = -math.inf if self.retention is None else (wall - self.retention) * 1000.0
        max_per_series = self.limits.max_samples_per_series
        quota = self.quota
        mono = self.clock()
        rows: list[tuple[str, ObjectRef, Labels, float, float]] = []
        add = rows.append
        stale = 0

        def refuse(reason: str, n: int) -> None:
            rejected[reason] = rejected.get(reason, 0) + n

        # The quota learns of writes to a known series at most every ttl / 16 (its expiry's own
        # granularity), not once per request: a series written continuously never expires, and the
        # call (0.24 us) is skipped for most series of most requests.
        refresh = quota.ttl / 16
        record = quota.record
        check = quota.check
        for (_, samples, histograms), b in zip(series, bindings):  # noqa: B905 - same length, built from series
            n = len(samples)
            if not n:
                if histograms:
                    refuse(NATIVE_HISTOGRAM, histograms)
                continue
            if b.__class__ is not Binding:
                refuse(b[0], n)  # type: ignore[index]
                continue
            if refusals:
                r = refusals.get(b.target)
                if r is not None:
                    refuse(r[0], n)
                    continue
            if n > max_per_series:
                refuse(TOO_MANY_SAMPLES, n)
                continue
            metric = b.metric
            over = check(writer, metric, b.key)
            if over is not None:
                refuse(over, n)
                self._log_reason(over, metric, writer)
                continue
            obj, labels = b.obj, b.labels
            kept = len(rows)
            for ts, value in samples:
                if value - value:  # NaN or infinite (x - x is 0.0 only for a finite x)
                    if value != value and _U64.unpack(_F64.pack(value))[0] == STALE_NAN:
                        stale += 1
                    else:
                        refuse(NON_FINITE_VALUE, 1)
                elif ts > future:
                    refuse(limits.FUTURE_TIMESTAMP, 1)
                elif ts < oldest:
                    refuse(TOO_OLD, 1)
                else:
                    add((metric, obj, labels, ts / 1000.0, value))
            if len(rows) > kept and mono - b.recorded >= refresh:
                record(writer, metric, b.key, mono)
                b.recorded = mono
        accepted = 0
        if rows:
            try:
                accepted = self.store.append_many(rows)
            except ValueError as e:  # the store's own checks (not expected after ours): count, never crash
                log.warning("remote write: the store refused a batch: %s", limits.printable(str(e), 200))
                refuse(STORE_REFUSED, len(rows))
            else:
                if accepted < len(rows):
                    refuse(OUT_OF_ORDER, len(rows) - accepted)
        SAMPLES.labels("accepted").inc(accepted)
        if stale:
            SAMPLES.labels("stale_marker").inc(stale)
        return accepted, stale

    def _answer(
        self, request: web.Request, accepted: int, stale: int, rejected: dict[str, int], user: UserInfo
    ) -> web.StreamResponse:
        total = sum(rejected.values())
        if total:
            SAMPLES.labels("rejected").inc(total)
            for reason, n in rejected.items():
                REJECTED.labels(reason).inc(n)
                if reason not in _BENIGN:
                    self._log_reason(reason, "", user.name, n)
        summary = ", ".join(f"{r}={n}" for r, n in sorted(rejected.items())[:_HEADER_REASONS])
        if AUTHORIZATION_ERROR in rejected:
            err = StatusError(
                503,
                "ServiceUnavailable",
                f"the access review of {rejected[AUTHORIZATION_ERROR]} samples could not be made; retry later "
                f"(accepted {accepted}; refused: {summary})",
            )
            resp = status_response(request, err)
            resp.headers["Retry-After"] = str(RETRY_AFTER)
            return resp
        if accepted or stale or not (rejected.keys() - _BENIGN):
            headers = {"X-Kcms-Rejected": summary} if summary else None
            return web.Response(status=204, headers=headers)
        if rejected.keys() & _AUTHZ:
            raise StatusError(
                403,
                "Forbidden",
                f"{limits.printable(user.name, 80)} may not write these series (verb create on custom.metrics.k8s.io "
                f"<resource>/<metric> or external.metrics.k8s.io <metric> in their namespace); refused: {summary}",
            )
        raise StatusError(400, "BadRequest", f"no sample was accepted; refused: {summary}")

    def _check_media(self, request: web.Request) -> None:
        ctype = request.headers.get("Content-Type", "")
        media, _, params = ctype.partition(";")
        proto = ""
        for p in params.split(";"):
            k, _, v = p.strip().partition("=")
            if k.lower() == "proto":
                proto = v.strip()
        if media.strip().lower() != "application/x-protobuf" or proto not in ("", "prometheus.WriteRequest"):
            raise self._refused(
                415,
                "UnsupportedMediaType",
                "unsupported_media_type",
                f"Content-Type {limits.printable(ctype, 80)}: only application/x-protobuf (remote write 1.0, "
                "prometheus.WriteRequest) is accepted",
            )
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding != "snappy":
            raise self._refused(
                415,
                "UnsupportedMediaType",
                "unsupported_media_type",
                f"Content-Encoding {limits.printable(encoding, 40)}: only snappy is accepted",
            )

    def _refused(self, code: int, kind: str, reason: str, message: str) -> StatusError:
        """A whole-request refusal: a Status, a rate-limited escaped log line, a counted reason."""
        self._log_reason(reason, "", "", 1, message)
        err = StatusError(code, kind, message)
        err._kcms_reason = reason  # type: ignore[attr-defined] - read by handle() for the counter
        return err

    def _log_reason(self, reason: str, metric: str, writer: str, n: int = 1, message: str = "") -> None:
        """One log line per reason every few seconds at most, with the count since the last one."""
        now = time.monotonic()
        self._unlogged[reason] = self._unlogged.get(reason, 0) + n
        if now - self._last_log.get(reason, -math.inf) < _LOG_EVERY:
            return
        count = self._unlogged.pop(reason)
        self._last_log[reason] = now
        log.warning(
            "remote write: refused %d (%s)%s%s%s",
            count,
            reason,
            f" e.g. metric {limits.printable(metric, 80)}" if metric else "",
            f" from {limits.printable(writer, 80)}" if writer else "",
            f": {limits.printable(message, 200)}" if message else "",
        )


def install_from_args(
    server: Any,
    store: SampleSink,
    args: Any,
    *,
    quota: SeriesQuota | None = None,
    namespaced: Callable[[str], bool] = default_namespaced,
) -> RemoteWriteAPI:
    """Mount ``POST /api/v1/write`` on ``server`` with the limits of the ``--remote-write-*`` flags
    and the label association of ``--config`` (prometheus-adapter's file) when it is given."""
    max_samples = args.remote_write_max_samples
    lim = WriteLimits(
        max_compressed_bytes=args.remote_write_max_body_bytes,
        max_decompressed_bytes=args.remote_write_max_decompressed_bytes,
        max_series=max_samples,
        max_samples=max_samples,
    )
    # --config: parsed once at flag validation (args.adapter_config), or read now (in-process tests)
    config = getattr(args, "adapter_config", None) or getattr(args, "config", "")
    mapper = config_mapper(config) if config else None
    binder = SeriesBinder(mapper, namespaced=namespaced, max_labels=lim.max_labels)
    api = RemoteWriteAPI(store, lim, binder=binder, quota=quota)
    api.install(server)
    return api
