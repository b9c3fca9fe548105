"""``PrometheusProvider``: custom.metrics.k8s.io and external.metrics.k8s.io from a Prometheus-compatible
backend, with prometheus-adapter's configuration (``rules`` and ``externalRules``).

Discovery is a **background relist**, never per request: every ``relist_interval`` seconds each
rule's ``seriesQuery`` goes to ``/api/v1/series`` (series seen in the last ``max_age`` seconds),
``seriesFilters`` drop series, ``name.matches``/``as`` name them, ``resources`` say which objects
each describes; the result is a prebuilt list, so ``list_metrics()`` answers in microseconds
whatever the number of series. A rule whose relist fails keeps its last good series (the other
rules' are replaced as usual), the failure is counted in
``kcms_prometheus_relist_failures_total{reason}`` and shown by :meth:`relist_check` (a reporting
``/readyz`` check: a broken Prometheus never makes the server unready, its store and
metrics.k8s.io are still served).

Reads query per request: the rule's ``metricsQuery`` rendered by PA's namer for the requested
objects (``query_for_objects``) or namespace and label selector (``query_for_external``), sent to
``/api/v1/query``; each result row is mapped back to its object through the rule's resource label
(last row wins for an object, as in prometheus-adapter). Values leave through the existing
custom-metrics conversion (canonical quantities). A failed query is a ``Status``: 504 ``Timeout``
when the backend did not answer in time, 503 ``ServiceUnavailable`` otherwise (down, HTTP error,
malformed or oversized answer, PromQL error), with one escaped log line and
``kcms_prometheus_query_failures_total{api,reason}``; never a 500, never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from kcms.apis.objects import ObjectLookupError
from kcms.apis.prometheus.config import AdapterConfig
from kcms.apis.prometheus.naming import MetricNamer
from kcms.apis.prometheus.resources import GroupResource
from kcms.apis.provider import MetricInfo, MetricValue
from kcms.apiserver import StatusError
from kcms.limits import MAX_METRIC_NAME_LENGTH, METRIC_NAME_RE, printable
from kcms.model import ObjectRef
from kcms.selectors import LabelSelector
from kcms.sources.prometheus_api import PrometheusClient, PrometheusError
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

__all__ = ["PrometheusProvider", "status_for"]

RELIST_FAILURES = Counter(
    "kcms_prometheus_relist_failures",
    "Rule relists (seriesQuery to /api/v1/series) that failed, by reason; the rule's last good series are kept.",
    ["reason"],
)
RELIST_LAST_SUCCESS = Gauge(
    "kcms_prometheus_relist_last_success_timestamp_seconds",
    "When every rule last relisted successfully (seconds since the epoch; 0: never).",
)
DISCOVERED = Gauge(
    "kcms_prometheus_discovered_metrics",
    "Metrics the Prometheus source lists in discovery, by API (custom: resource/metric pairs).",
    ["api"],
)
DISCOVERED_SERIES = Gauge(
    "kcms_prometheus_discovered_series", "Series the last relists returned, after seriesFilters."
)
QUERIES = Counter("kcms_prometheus_queries", "Queries sent to Prometheus for reads, by API.", ["api"])
QUERY_FAILURES = Counter(
    "kcms_prometheus_query_failures",
    "Reads answered with an error because the Prometheus query failed, by API and reason.",
    ["api", "reason"],
)
NON_FINITE = Counter(
    "kcms_prometheus_non_finite_values",
    "Result rows dropped because their value was NaN or infinite, by API.",
    ["api"],
)
REFUSED_NAMES = Counter(
    "kcms_prometheus_refused_metric_names",
    "Metric names a relist produced that the APIs cannot serve (not [a-zA-Z_:][a-zA-Z0-9_:]*, or over "
    "253 characters): left out of discovery, counted once per relist.",
)
RENDER = "render"  # a rule's template failed on a request's values (a configuration problem)
for _api in ("custom", "external"):
    QUERIES.labels(_api)
    NON_FINITE.labels(_api)

YIELD_EVERY = 2000  # series handled between two yields to the event loop during a relist
MAX_CONCURRENT_RELISTS = 4  # rules relisted at once


def status_for(e: PrometheusError, what: str) -> StatusError:
    """The ``Status`` a failed Prometheus call becomes: 504 for a timeout, 503 for anything else."""
    if e.reason == "timeout":
        return StatusError(504, "Timeout", f"{what}: Prometheus did not answer in time: {e}")
    return StatusError(503, "ServiceUnavailable", f"{what}: Prometheus query failed ({e.reason}): {e}")


@dataclass(slots=True, frozen=True)
class _Custom:
    namer: MetricNamer
    series: str  # the Prometheus series name the metric comes from
    gr: GroupResource
    namespaced: bool


@dataclass(slots=True, frozen=True)
class _External:
    namer: MetricNamer
    series: str


@dataclass(slots=True)
class _RuleState:
    """One rule's last good relist, as metrics (the series themselves are not kept)."""

    custom: dict[tuple[str, str], _Custom]
    external: dict[str, _External]
    series: int  # how many series it had after seriesFilters
    at: float  # wall-clock time of that relist


class PrometheusProvider:
    """Both provider interfaces over ``client`` and the adapter ``config``; see the module docstring.

    Discovery's ``namespaced`` flag follows prometheus-adapter (``ResourceMapper.metrics_in``).
    ``object_names(resource, namespace)`` lists the objects of a wildcard read without a label
    selector (prometheus-adapter lists them from the Kubernetes API too; without it such a read
    finds nothing). ``max_age``: a relist asks for series seen in this last period
    (prometheus-adapter's ``--metrics-max-age``; default the relist interval).
    """

    def __init__(
        self,
        client: PrometheusClient,
        config: AdapterConfig,
        *,
        relist_interval: float = 60.0,
        object_names: Callable[[str, str], Awaitable[Collection[str]]] | None = None,
        max_age: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.config = config
        self.relist_interval = relist_interval
        self.max_age = max_age if max_age else relist_interval
        self.object_names = object_names
        self.clock = clock
        # compiled by load_adapter_config; compiled here for a config built by hand
        self.custom_namers = list(config.namers) or [
            MetricNamer.from_rule(r, external=False) for r in config.rules
        ]
        self.external_namers = list(config.external_namers) or [
            MetricNamer.from_rule(r, external=True) for r in config.external_rules
        ]
        self._states: dict[int, _RuleState] = {}  # id(namer) -> last good relist
        self._custom: dict[tuple[str, str], _Custom] = {}
        self._external: dict[str, _External] = {}
        self._infos: tuple[MetricInfo, ...] = ()
        self._external_names: tuple[str, ...] = ()
        self._last_success = 0.0  # every rule relisted fine at this time
        self._last_attempt = 0.0
        self._failing: dict[int, str] = {}  # id(namer) -> "reason: message" of its last failure
        self._task: asyncio.Task[None] | None = None

    # ---- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the background relist and wait for its first round, at most about one query
        timeout (a slow Prometheus with many rules must not hold start-up: discovery fills in
        when the round ends)."""
        first = asyncio.Event()
        self._task = asyncio.create_task(self._relist_forever(first), name="kcms-prometheus-relist")
        try:
            await asyncio.wait_for(first.wait(), self.client.timeout + 1.0)
        except TimeoutError:
            log.warning(
                "the first Prometheus relist is still running; serving without its metrics until it ends"
            )

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _relist_forever(self, first: asyncio.Event | None = None) -> None:
        while True:
            try:
                await self.relist()
            except Exception:  # never let the relist loop die; the last good list stays
                log.exception("relisting Prometheus series failed")
            if first is not None:
                first.set()
                first = None
            await asyncio.sleep(self.relist_interval)

    # ---- discovery ------------------------------------------------------------------------------
    async def relist(self) -> bool:
        """Relist every rule; rebuild the discovery tables. True when every rule relisted."""
        now = self.clock()
        self._last_attempt = now
        namers = [*self.custom_namers, *self.external_namers]
        gate = asyncio.Semaphore(MAX_CONCURRENT_RELISTS)
        failed: list[tuple[MetricNamer, PrometheusError]] = []

        async def one(namer: MetricNamer) -> None:
            async with gate:
                try:
                    found = await self.client.series([namer.series_query], start=now - self.max_age, end=now)
                except PrometheusError as e:
                    RELIST_FAILURES.labels(e.reason).inc()
                    self._failing[id(namer)] = f"{e.reason}: {e}"
                    failed.append((namer, e))
                    return
                self._states[id(namer)] = await self._derive(namer, namer.filter_series(found))
                del found
                self._failing.pop(id(namer), None)

        await asyncio.gather(*(one(n) for n in namers))
        if failed:  # one line a relist, however many rules failed
            namer, e = failed[0]
            log.warning(
                "relist of %d of %d rules failed (keeping their last good series); %s: %s",
                len(failed),
                len(namers),
                printable(namer.path, 60),
                e,  # PrometheusError's text is escaped and bounded already
            )
        self._rebuild()
        if not self._failing:
            self._last_success = now
            RELIST_LAST_SUCCESS.set(now)
        return not self._failing

    async def _derive(self, namer: MetricNamer, series: list[Mapping[str, str]]) -> _RuleState:
        """What one rule's series give: its metrics (name -> series, resources), in series order.
        Only this is kept (not the series themselves: ~10x less memory at 10 000 series)."""
        custom: dict[tuple[str, str], _Custom] = {}
        external: dict[str, _External] = {}
        names: dict[str, str | None] = {}  # series name -> metric name (None: none)
        resources: dict[tuple[str, ...], list[tuple[GroupResource, bool]]] = {}  # label names ->
        for handled, labels in enumerate(series, 1):
            if handled % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # 10 000 series must not stall the serving loop
            name = labels.get("__name__", "")
            if name not in names:
                names[name] = self._servable(namer.metric_name_for(name))
            metric = names[name]
            if metric is None:
                continue
            if namer.external:
                if metric not in external:
                    external[metric] = _External(namer, name)
                continue
            # A series' resources depend only on which labels it has (its label names).
            key = tuple(sorted(labels))
            grs = resources.get(key)
            if grs is None:
                grs = resources[key] = namer.resources.metrics_in(key)
            for gr, namespaced in grs:
                entry = (str(gr), metric)
                if entry not in custom:  # the first series naming it wins
                    custom[entry] = _Custom(namer, name, gr, namespaced)
        return _RuleState(custom, external, len(series), self.clock())

    def _rebuild(self) -> None:
        """Merge the rules' last good results, in config order (the first rule naming a metric wins)."""
        custom: dict[tuple[str, str], _Custom] = {}
        external: dict[str, _External] = {}
        series_total = 0
        for namer in (*self.custom_namers, *self.external_namers):
            state = self._states.get(id(namer))
            if state is None:
                continue
            series_total += state.series
            for key, entry in state.custom.items():
                custom.setdefault(key, entry)
            for metric, ext in state.external.items():
                external.setdefault(metric, ext)
        infos = tuple(MetricInfo(r, m, custom[r, m].namespaced) for r, m in sorted(custom))
        self._custom, self._external = custom, external
        self._infos, self._external_names = infos, tuple(sorted(external))
        DISCOVERED.labels("custom").set(len(infos))
        DISCOVERED.labels("external").set(len(external))
        DISCOVERED_SERIES.set(series_total)

    @staticmethod
    def _servable(metric: str | None) -> str | None:
        """``metric`` when the APIs can serve that name (a backend may send any ``__name__``, and
        ``name.as`` may make anything of it), else None (counted)."""
        if metric is None:
            return None
        if len(metric) > MAX_METRIC_NAME_LENGTH or not METRIC_NAME_RE.fullmatch(metric):
            REFUSED_NAMES.inc()
            return None
        return metric

    def relist_check(self) -> tuple[bool, str]:
        """For ``/readyz?verbose`` (a reporting check that never fails readiness: the other sources
        are served whatever Prometheus does): what discovery holds and how old it is."""
        now = self.clock()
        held = f"{len(self._infos)} custom and {len(self._external_names)} external metrics"
        if not self._failing:
            if not self._last_success:
                return True, "not relisted yet"
            return True, f"{held}, relisted {now - self._last_success:.0f}s ago"
        reason = next(iter(self._failing.values()))
        since = (
            f"last full success {now - self._last_success:.0f}s ago"
            if self._last_success
            else "never relisted"
        )
        return True, (
            f"relist of {len(self._failing)} rule(s) failing ({reason[:300]}); "
            f"serving the last good list: {held}; {since}"
        )

    def list_metrics(self) -> Iterable[MetricInfo]:
        """The prebuilt custom discovery list (no I/O)."""
        return self._infos

    def list_external_metrics(self) -> Iterable[str]:
        """The prebuilt external discovery list (no I/O)."""
        return self._external_names

    # ---- reads ----------------------------------------------------------------------------------
    async def _query(self, api: str, promql: str, what: str) -> list[Any]:
        QUERIES.labels(api).inc()
        try:
            return await self.client.query(promql)
        except PrometheusError as e:
            QUERY_FAILURES.labels(api, e.reason).inc()
            log.warning("%s: query %s failed: %s", printable(what, 300), printable(promql, 300), e)
            raise status_for(e, what) from None

    def _render_failed(self, api: str, what: str, e: Exception) -> StatusError:
        """A query that cannot be built: the client's mistake (a selector operator PromQL matchers
        cannot express, such as ``k>5``) is a 400; a rule whose template fails on these values is
        the server's configuration, a 503."""
        if getattr(e, "client_error", False):
            log.info("%s: bad selector: %s", printable(what, 300), printable(e))
            return StatusError(400, "BadRequest", f"{what}: {printable(e)}")
        QUERY_FAILURES.labels(api, RENDER).inc()
        log.warning("%s: the rule's query did not render: %s", printable(what, 300), printable(e))
        return StatusError(
            503, "ServiceUnavailable", f"{what}: the rule's query did not render: {printable(e)}"
        )

    async def get_metrics(
        self,
        resource: str,
        namespace: str,
        names: Collection[str] | None,
        metric: str,
        metric_selector: LabelSelector,
    ) -> list[MetricValue]:
        """Query the metric's rule for ``names`` (None: every object in the answer) and map the rows
        back to objects. An unlisted metric: an empty list (the API answers 404)."""
        found = self._custom.get((resource, metric))
        if found is None:
            return []
        what = f"metric {metric} for {resource}"
        if names is None:  # a wildcard without a label selector: the objects that exist
            names = await self._all_objects(resource, namespace, what)
        if not names:
            return []
        wanted = sorted(names)
        try:
            promql = found.namer.query_for_objects(found.series, found.gr, namespace, wanted, metric_selector)
        except ValueError as e:
            raise self._render_failed("custom", what, e) from None
        samples = await self._query("custom", promql, what)
        label = found.namer.resources.label_for(found.gr)
        if label is None:
            return []
        allowed = set(wanted)
        by_name: dict[str, MetricValue] = {}
        dropped = 0
        for s in samples:
            name = s.labels.get(label)
            if not name or name not in allowed:
                continue
            if not math.isfinite(s.value):
                dropped += 1
                continue
            by_name[name] = MetricValue(
                ObjectRef(resource, namespace, name), metric, (), s.value, s.timestamp, None
            )
        if dropped:
            NON_FINITE.labels("custom").inc(dropped)
        return list(by_name.values())

    async def _all_objects(self, resource: str, namespace: str, what: str) -> Collection[str]:
        if self.object_names is None:
            return ()
        try:
            return await self.object_names(resource, namespace)
        except ObjectLookupError as e:
            log.warning("%s: listing the objects failed: %s", printable(what, 300), printable(e))
            reason = "NotFound" if e.code == 404 else "ServiceUnavailable"
            raise StatusError(e.code, reason, f"{what}: {printable(e)}") from None

    async def get_external_metrics(
        self, namespace: str, metric: str, selector: LabelSelector
    ) -> list[MetricValue]:
        """Query the metric's external rule in ``namespace`` with ``selector`` as label matchers; one
        value per result row, its labels as ``metricLabels``."""
        found = self._external.get(metric)
        if found is None:
            return []
        what = f"external metric {metric}"
        try:
            promql = found.namer.query_for_external(found.series, namespace, selector)
        except ValueError as e:
            raise self._render_failed("external", what, e) from None
        samples = await self._query("external", promql, what)
        out = []
        dropped = 0
        for s in samples:
            if not math.isfinite(s.value):
                dropped += 1
                continue
            labels = tuple(sorted(s.labels.items()))
            out.append(MetricValue(ObjectRef("", namespace, ""), metric, labels, s.value, s.timestamp, None))
        if dropped:
            NON_FINITE.labels("external").inc(dropped)
        return out

    # ---- for the debug endpoint and tests ----------------------------------------------------------
    def source_series(self, resource: str, metric: str) -> str | None:
        """The Prometheus series a custom metric is read from (None when not listed)."""
        found = self._custom.get((resource, metric))
        return None if found is None else found.series
