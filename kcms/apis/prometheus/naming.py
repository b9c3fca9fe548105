"""A prometheus-adapter rule compiled: series filtering, metric names, and the PromQL for a request.

:class:`MetricNamer` is one ``rules``/``externalRules`` entry (prometheus-adapter's ``metricNamer`` in
``pkg/naming/metric_namer.go`` + ``metrics_query.go``); :class:`ResourceRules` is ``resourceRules``
(its ``pkg/resourceprovider``). Both are pure: they turn names and selectors into strings and never talk
to Prometheus, so a provider (PC) runs the queries and a test can check every rendered character.

Rules followed exactly:

- ``seriesFilters`` and ``name.matches`` are unanchored Go regexps (``MatchString``); ``name.matches`` is
  also a filter (a series whose name it does not match is not listed); default ``.*``.
- ``name.as`` is expanded with Go's ``ExpandString`` on the leftmost match; its default is ``$0`` when
  ``matches`` has no capture group, ``$1`` when it has one, and an error when it has more.
- The query template gets ``Series``, ``LabelMatchers`` (comma-joined), ``LabelValuesByName`` (label ->
  values joined with ``|``), ``GroupBy`` (comma-joined) and ``GroupBySlice``. For an object query the
  matchers are, in order: the ``metricLabelSelector`` requirements (sorted by key, see
  :mod:`~kcms.apis.prometheus.matchers`), ``<namespace label>="<ns>"`` when a namespace is given, and the
  object names (``pod="a"`` / ``pod=~"a|b"``); ``GroupBy`` is the object label. For an external query:
  the ``labelSelector`` requirements, then the namespace matcher only when the rule is ``namespaced``
  (default true) and a namespace is given; ``GroupBy`` is empty.
- Resource rules render ``containerQuery`` with ``Series`` empty, the pod's namespace and pod names, and
  ``GroupBy`` = ``<pod label>,<containerLabel>``; ``nodeQuery`` with the node names and ``GroupBy`` =
  ``<node label>``.

A query that cannot be built for a request raises :class:`~kcms.apis.prometheus.matchers.QueryBuildError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kcms.apis.prometheus.gotemplate import Template, TemplateError, parse
from kcms.apis.prometheus.matchers import (
    QueryBuildError,
    compile_go_regexp,
    go_expand,
    label_eq,
    names_matcher,
    selector_parts,
)
from kcms.apis.prometheus.resources import NAMESPACES, NODES, GroupResource, ResourceMapper, resolve_known
from kcms.apis.prometheus.rules import ConfigError, DiscoveryRule, ResourceMapping, ResourceRuleConfig
from kcms.selectors import LabelSelector

__all__ = ["QUERY_FIELDS", "MetricNamer", "ResourceRules", "render_query"]

QUERY_FIELDS = frozenset({"Series", "LabelMatchers", "LabelValuesByName", "GroupBy", "GroupBySlice"})
LABEL_FIELDS = frozenset({"Group", "Resource"})
PODS = GroupResource("", "pods")
Resolver = Callable[[str, str], GroupResource | None]

_SAMPLE_ARGS = {
    "Series": "sample_metric_total",
    "LabelMatchers": 'namespace="default",pod="sample"',
    "LabelValuesByName": {"namespace": "default", "pod": "sample"},
    "GroupBy": "pod",
    "GroupBySlice": ["pod"],
}


def _compile(text: str, where: str, fields: frozenset[str], sample: Mapping[str, Any]) -> Template:
    """Parse a config template and try it once on sample values: every error is a ConfigError at load."""
    try:
        template = parse(text)
        read = template.top_level_fields()
    except TemplateError as exc:
        raise ConfigError(f"{where}: template does not parse: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: template does not parse: nested too deeply") from None
    unknown = sorted(read - fields)
    if unknown:
        raise ConfigError(
            f"{where}: unknown template field .{unknown[0]} (the fields are {', '.join('.' + f for f in sorted(fields))})"
        )
    try:
        rendered = template.render(sample)
    except (TemplateError, RecursionError) as exc:
        raise ConfigError(f"{where}: template fails on sample values: {exc}") from None
    if not rendered.strip():
        raise ConfigError(f"{where}: the template produces an empty text")
    return template


def _mapper(resources: ResourceMapping, where: str, resolve: Resolver) -> ResourceMapper:
    template = None
    if resources.template:
        template = _compile(
            resources.template, f"{where}.template", LABEL_FIELDS, {"Group": "apps", "Resource": "deployment"}
        )
    try:
        return ResourceMapper(
            {label: (group, resource) for label, group, resource in resources.overrides},
            template,
            namespaced=resources.namespaced is not False,
            resolve=resolve,
        )
    except ValueError as exc:
        raise ConfigError(f"{where}.template: {exc}") from None


def render_query(
    template: Template, series: str, matchers: list[str], values: dict[str, str], group_by: list[str]
) -> str:
    """Execute a query template with prometheus-adapter's arguments; an empty result is an error, as there."""
    args = {
        "Series": series,
        "LabelMatchers": ",".join(matchers),
        "LabelValuesByName": dict(values),
        "GroupBy": ",".join(group_by),
        "GroupBySlice": list(group_by),
    }
    try:
        query = template.render(args)
    except (TemplateError, RecursionError) as exc:
        raise QueryBuildError(f"the metrics query template fails: {exc}") from None
    if not query:
        raise QueryBuildError("empty query produced by metrics query template")
    return query


class MetricNamer:
    """One compiled ``rules``/``externalRules`` entry (see the module docstring for the rules it follows)."""

    def __init__(
        self,
        *,
        path: str,
        series_query: str,
        query: Template,
        resources: ResourceMapper,
        name_re: re.Pattern[str],
        name_as: str,
        filters: Sequence[tuple[re.Pattern[str], bool]],
        external: bool,
    ) -> None:
        self.path = path
        self.series_query = series_query
        self.query_template = query
        self.resources = resources
        self.name_re = name_re
        self.name_as = name_as
        self.filters = tuple(filters)
        self.external = external

    @classmethod
    def from_rule(
        cls, rule: DiscoveryRule, *, external: bool, resolve: Resolver = resolve_known
    ) -> MetricNamer:
        """Compile ``rule``; :class:`ConfigError` names the field at fault (``rules[2].name.matches: ...``)."""
        path = rule.path
        resources = _mapper(rule.resources, f"{path}.resources", resolve)
        sample = dict(_SAMPLE_ARGS)
        if external:
            sample.update(GroupBy="", GroupBySlice=[])
        query = _compile(rule.metrics_query, f"{path}.metricsQuery", QUERY_FIELDS, sample)
        filters: list[tuple[re.Pattern[str], bool]] = []
        for i, f in enumerate(rule.series_filters):
            where = f"{path}.seriesFilters[{i}]"
            if f.is_ and f.is_not:
                raise ConfigError(
                    f"{where}: cannot have both an `is` ({f.is_!r}) and `isNot` ({f.is_not!r}) expression in a single filter"
                )
            if not f.is_ and not f.is_not:
                raise ConfigError(f"{where}: must have either an `is` or `isNot` expression in a filter")
            key, text = ("is", f.is_) if f.is_ else ("isNot", f.is_not)
            try:
                filters.append((compile_go_regexp(text), bool(f.is_)))
            except ValueError as exc:
                raise ConfigError(f"{where}.{key}: {exc}") from None
        if rule.name.matches:
            try:
                name_re = compile_go_regexp(rule.name.matches)
            except ValueError as exc:
                raise ConfigError(f"{path}.name.matches: {exc}") from None
            filters.append((name_re, True))  # the adapter appends the name pattern as an `is` filter
        else:
            name_re = compile_go_regexp(".*")
        name_as = rule.name.as_
        if not name_as:
            if name_re.groups == 0:
                name_as = "$0"
            elif name_re.groups == 1:
                name_as = "$1"
            else:
                raise ConfigError(
                    f"{path}.name.as: required: name.matches {rule.name.matches!r} has {name_re.groups} capture groups"
                )
        return cls(
            path=path,
            series_query=rule.series_query,
            query=query,
            resources=resources,
            name_re=name_re,
            name_as=name_as,
            filters=filters,
            external=external,
        )

    # -- discovery

    def accepts(self, series_name: str) -> bool:
        """Whether a series name passes ``seriesFilters`` and ``name.matches``."""
        return all(bool(rx.search(series_name)) == positive for rx, positive in self.filters)

    def filter_series(self, series: Iterable[Mapping[str, str]]) -> list[Mapping[str, str]]:
        """The series (label maps with ``__name__``) that pass ``seriesFilters`` and ``name.matches``."""
        return [s for s in series if self.accepts(s.get("__name__", ""))]

    def metric_name_for(self, series_name: str) -> str | None:
        """The API metric name of a series (``name.as`` expanded), or None if ``name.matches`` does not match."""
        m = self.name_re.search(series_name)
        if m is None:
            return None
        return go_expand(self.name_as, m)

    # -- queries

    def _selector(self, selector: LabelSelector | None) -> tuple[list[str], dict[str, str]]:
        exprs: list[str] = []
        values: dict[str, str] = {}
        for label, text, joined in selector_parts(selector):
            exprs.append(text)
            values[label] = joined
        return exprs, values

    def _namespace_matcher(self, namespace: str) -> tuple[str, str]:
        label = self.resources.namespace_label
        if label is None:
            raise QueryBuildError(
                f"{self.path}: the rule has no label for namespaces (resources.overrides or template)"
            )
        return label, label_eq(label, namespace)

    def query_for_objects(
        self,
        series_name: str,
        gr: GroupResource,
        namespace: str,
        names: Sequence[str],
        metric_selector: LabelSelector | None = None,
    ) -> str:
        """The PromQL for ``series_name`` about the objects ``names`` of ``gr`` (in ``namespace``; ``""`` for
        cluster-scoped objects and for the namespace-itself metrics, where ``gr`` is ``namespaces`` and
        ``names`` is the namespace). ``metric_selector`` is the request's ``metricLabelSelector``."""
        if not names:
            raise QueryBuildError("no object names to query")
        exprs, values = self._selector(metric_selector)
        if namespace:
            label, text = self._namespace_matcher(namespace)
            exprs.append(text)
            values[label] = namespace
        object_label = self.resources.label_for(gr)
        if object_label is None:
            raise QueryBuildError(f"{self.path}: the rule has no label for {gr}")
        exprs.append(names_matcher(object_label, names))
        values[object_label] = "|".join(names)
        return render_query(self.query_template, series_name, exprs, values, [object_label])

    def query_for_external(
        self, series_name: str, namespace: str, selector: LabelSelector | None = None
    ) -> str:
        """The PromQL for an external metric: ``selector`` (the request's ``labelSelector``) as matchers,
        plus the namespace when the rule is ``namespaced`` and ``namespace`` is not empty."""
        exprs, values = self._selector(selector)
        if self.resources.namespaced and namespace:
            label, text = self._namespace_matcher(namespace)
            exprs.append(text)
            values[label] = namespace
        return render_query(self.query_template, series_name, exprs, values, [])

    def object_label(self, gr: GroupResource) -> str | None:
        """The label that names objects of ``gr`` in this rule's query results (to map values back)."""
        return self.resources.label_for(gr)


class _ResourceQuery:
    """``resourceRules.cpu`` or ``.memory`` compiled."""

    def __init__(self, cfg: ResourceRuleConfig, resolve: Resolver) -> None:
        self.path = cfg.path
        self.mapper = _mapper(cfg.resources, f"{cfg.path}.resources", resolve)
        sample = dict(_SAMPLE_ARGS, Series="", GroupBy="pod,container", GroupBySlice=["pod", "container"])
        self.container = _compile(cfg.container_query, f"{cfg.path}.containerQuery", QUERY_FIELDS, sample)
        node_sample = dict(
            _SAMPLE_ARGS,
            Series="",
            LabelMatchers='node="sample"',
            LabelValuesByName={"node": "sample"},
            GroupBy="node",
            GroupBySlice=["node"],
        )
        self.node = _compile(cfg.node_query, f"{cfg.path}.nodeQuery", QUERY_FIELDS, node_sample)
        self.container_label = cfg.container_label
        labels = {}
        for gr in (PODS, NAMESPACES, NODES):
            label = self.mapper.label_for(gr)
            if label is None:
                raise ConfigError(
                    f"{cfg.path}.resources: no label for {gr} (resources.overrides or template)"
                )
            labels[gr] = label
        self.pod_label, self.namespace_label, self.node_label = (
            labels[PODS],
            labels[NAMESPACES],
            labels[NODES],
        )


class ResourceRules:
    """``resourceRules``: the queries behind ``metrics.k8s.io`` when it is served from Prometheus."""

    def __init__(self, cpu: _ResourceQuery, memory: _ResourceQuery, window: float) -> None:
        self.cpu = cpu
        self.memory = memory
        self.window = window

    @classmethod
    def from_config(
        cls,
        cpu: ResourceRuleConfig,
        memory: ResourceRuleConfig,
        window: float,
        resolve: Resolver = resolve_known,
    ) -> ResourceRules:
        return cls(_ResourceQuery(cpu, resolve), _ResourceQuery(memory, resolve), window)

    def _rule(self, resource: str) -> _ResourceQuery:
        if resource == "cpu":
            return self.cpu
        if resource == "memory":
            return self.memory
        raise ValueError(f"resource must be 'cpu' or 'memory', not {resource!r}")

    def container_query(self, resource: str, namespace: str, pod_names: Sequence[str]) -> str:
        """``containerQuery`` for these pods of ``namespace`` (``""``: no namespace matcher)."""
        rule = self._rule(resource)
        if not pod_names:
            raise QueryBuildError("no pod names to query")
        exprs: list[str] = []
        values: dict[str, str] = {}
        if namespace:
            exprs.append(label_eq(rule.namespace_label, namespace))
            values[rule.namespace_label] = namespace
        exprs.append(names_matcher(rule.pod_label, pod_names))
        values[rule.pod_label] = "|".join(pod_names)
        return render_query(rule.container, "", exprs, values, [rule.pod_label, rule.container_label])

    def node_query(self, resource: str, node_names: Sequence[str]) -> str:
        """``nodeQuery`` for these nodes."""
        rule = self._rule(resource)
        if not node_names:
            raise QueryBuildError("no node names to query")
        exprs = [names_matcher(rule.node_label, node_names)]
        return render_query(rule.node, "", exprs, {rule.node_label: "|".join(node_names)}, [rule.node_label])

    def pod_of(self, labels: Mapping[str, str], resource: str = "cpu") -> tuple[str, str] | None:
        """``(namespace, pod)`` a container-query sample is about, or None when a label is missing."""
        rule = self._rule(resource)
        namespace, pod = labels.get(rule.namespace_label), labels.get(rule.pod_label)
        if not namespace or not pod:
            return None
        return namespace, pod

    def container_of(self, labels: Mapping[str, str], resource: str = "cpu") -> str | None:
        """The container a sample is about (its ``containerLabel``), or None."""
        return labels.get(self._rule(resource).container_label) or None

    def node_of(self, labels: Mapping[str, str], resource: str = "cpu") -> str | None:
        """The node a node-query sample is about, or None."""
        return labels.get(self._rule(resource).node_label) or None
