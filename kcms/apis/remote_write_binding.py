"""Binding remote-written series to Kubernetes objects (see :mod:`kcms.apis.remote_write`).

:class:`SeriesBinder` turns a series' label key (its serialized labels, as
:mod:`kcms.sources.remote_write` decodes them) into a :class:`Binding` -- metric, object, remaining
labels, authorization target, quota key -- or a refusal ``(reason, message)``, with
prometheus-adapter's label association: with ``--config`` (:func:`config_mapper`), the
``kcms.apis.prometheus`` ``ResourceMapper`` of the first rule whose ``seriesQuery`` selects the
series (:class:`RuleResources`, :func:`parse_selector`), else :class:`DefaultResources`. Answers are
cached per label key.
"""

from __future__ import annotations

import codecs
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol

from kcms import limits
from kcms.model import Labels, ObjectRef
from kcms.sources.remote_write import LabelKey, RawSeries, parse_labels

from .objects import WELL_KNOWN
from .prometheus.resources import GroupResource
from .pushauth import Target

log = logging.getLogger(__name__)

__all__ = [
    "Binding",
    "DefaultResources",
    "Refusal",
    "ResourceMapper",
    "RuleResources",
    "SeriesBinder",
    "config_mapper",
    "default_namespaced",
    "parse_selector",
]

# Refusal reasons of a series' labels (stable: Prometheus label values).
INVALID_METRIC_NAME = "invalid_metric_name"
INVALID_LABEL_NAME = "invalid_label_name"
MALFORMED_LABELS = "malformed_labels"
INVALID_OBJECT = "invalid_object"
NO_OBJECT = "no_object"
NO_RULE = "no_rule"


class ResourceMapper(Protocol):
    """The part of prometheus-adapter's label association used here
    (``kcms.apis.prometheus.resources.ResourceMapper``, or :class:`DefaultResources`)."""

    namespace_label: str | None

    def label_for(self, gr: Any) -> str | None: ...

    def resources_in(self, labels: Mapping[str, str]) -> Sequence[Any]: ...


class DefaultResources:
    """The label association without ``--config``: prometheus-adapter's ``namespace`` label plus the
    ``<<.Resource>>`` template over the well-known resources (``kcms.apis.objects.WELL_KNOWN``):
    a label named after a kind in lower case (``pod``, ``node``, ``deployment``, ...) names an
    object of it. ``job`` is not ``jobs.batch``: Prometheus puts its scrape job there."""

    namespace_label = "namespace"
    namespaced = True

    def __init__(self) -> None:
        self._by_label: dict[str, GroupResource] = {}
        for info in WELL_KNOWN.values():
            if (info.group, info.resource) == ("batch", "jobs"):
                continue
            self._by_label[info.kind.lower()] = GroupResource(info.group, info.resource)
        self._labels = {gr: label for label, gr in self._by_label.items()}

    def label_for(self, gr: Any) -> str | None:
        return self._labels.get(GroupResource(gr.group, gr.resource))

    def resource_for_label(self, label: str) -> GroupResource | None:
        return self._by_label.get(label)

    def resources_in(self, labels: Mapping[str, str]) -> list[GroupResource]:
        by_label = self._by_label
        return [by_label[k] for k in labels if k in by_label]


def default_namespaced(group_resource: str) -> bool:
    """Whether objects of ``group_resource`` live in namespaces (the well-known table; True else)."""
    info = WELL_KNOWN.get(group_resource)
    return True if info is None else info.namespaced


@dataclass(slots=True, eq=False)
class Binding:
    """What one series is: a metric about one object (``obj.resource == ""``: external), its labels."""

    metric: str
    obj: ObjectRef
    labels: Labels
    target: Target
    key: int  # the quota's series key: hash((metric, obj, labels)), as pushes compute it
    recorded: float = -math.inf  # when the quota was last told of a write of it (monotonic seconds)


Refusal = tuple[str, str]  # (reason, message)


class SeriesBinder:
    """Binds label sets to objects (see the module docstring) and remembers the answer per label
    key: a sender repeats the same series request after request, so after the first request a
    series costs a dict lookup. At most ``max_cached`` keys are kept (the oldest quarter is forgotten
    when full)."""

    def __init__(
        self,
        mapper: ResourceMapper | RuleResources | None = None,
        *,
        namespaced: Callable[[str], bool] = default_namespaced,
        max_labels: int = limits.MAX_LABELS,
        max_cached: int = 100_000,
    ) -> None:
        self.mapper: ResourceMapper | RuleResources = mapper or DefaultResources()
        self.namespaced = namespaced
        self.max_labels = max_labels
        self.max_cached = max(16, max_cached)
        self._cache: dict[LabelKey, Binding | Refusal] = {}

    def bind_all(self, series: Sequence[RawSeries]) -> list[Binding | Refusal]:
        """The binding of each series (a cache hit costs a dict lookup, no call)."""
        get = self._cache.get
        bind = self.bind
        return [get(s[0]) or bind(s[0]) for s in series]

    def bind(self, key: LabelKey) -> Binding | Refusal:
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        result = self._bind(key)
        cache = self._cache
        if len(cache) >= self.max_cached:
            for old in list(islice(cache, self.max_cached // 4)):
                del cache[old]
        cache[key] = result
        return result

    def _bind(self, key: LabelKey) -> Binding | Refusal:
        if len(key) > self.max_labels:
            return limits.TOO_MANY_LABELS, f"{len(key)} labels on one series; at most {self.max_labels}"
        try:
            pairs = parse_labels(key)
        except ValueError as e:
            return MALFORMED_LABELS, str(e)
        problem = limits.labels_problem(pairs, self.max_labels)
        if problem:
            return problem
        labels: dict[str, str] = {}
        for k, v in pairs:
            if not limits.LABEL_NAME_RE.fullmatch(k):
                return (
                    INVALID_LABEL_NAME,
                    f"label name {limits.printable(k, 60)} is not a Prometheus label name",
                )
            if k in labels:
                return INVALID_LABEL_NAME, f"label {limits.printable(k, 60)} appears twice"
            if v:  # an empty value is no label (Prometheus's rule)
                labels[k] = v
        metric = labels.pop("__name__", "")
        problem = limits.metric_name_problem(metric)
        if problem:
            return problem
        if not limits.METRIC_NAME_RE.fullmatch(metric):
            return INVALID_METRIC_NAME, f"metric name {limits.printable(metric, 80)} is missing or invalid"
        mapper = self.mapper
        if isinstance(mapper, RuleResources):
            mapper = mapper.select(metric, labels)  # type: ignore[assignment]
            if mapper is None:
                return (
                    NO_RULE,
                    f"no rule of --config selects metric {limits.printable(metric, 80)} (seriesQuery)",
                )
        ns_label = mapper.namespace_label
        namespace = labels.get(ns_label, "") if ns_label else ""
        grs = [
            gr for gr in mapper.resources_in(labels) if not (gr.group == "" and gr.resource == "namespaces")
        ]
        resource = name = ""
        obj_label = None
        if grs:
            gr = _pick(grs, self.namespaced)
            obj_label = mapper.label_for(gr)
            resource = str(gr)  # "pods", "deployments.apps"
            name = labels.get(obj_label, "") if obj_label else ""
            if not self.namespaced(resource):
                namespace = ""
        if namespace and (len(namespace) > 63 or not limits.DNS_LABEL_RE.fullmatch(namespace)):
            return (
                INVALID_OBJECT,
                f"namespace {limits.printable(namespace, 80)} is not a valid namespace name",
            )
        if resource:
            if not name or len(name) > 253 or not limits.DNS_SUBDOMAIN_RE.fullmatch(name):
                return (
                    INVALID_OBJECT,
                    f"{resource} name {limits.printable(name, 80)} is not a valid object name",
                )
            if not namespace and self.namespaced(resource):
                return (
                    INVALID_OBJECT,
                    f"a series about {resource} {limits.printable(name, 80)} has no namespace label",
                )
        elif not namespace:
            return NO_OBJECT, "the series names no object and no namespace: it cannot be served"
        rest = tuple(sorted((k, v) for k, v in labels.items() if k != ns_label and k != obj_label))
        obj = ObjectRef(resource, namespace, name)
        return Binding(metric, obj, rest, (metric, resource, namespace, name), hash((metric, obj, rest)))


def _pick(grs: Sequence[Any], namespaced: Callable[[str], bool]) -> Any:
    """The object a series naming several is bound to: its pod, else the first namespaced one, else
    the first (cluster-scoped) one."""
    for gr in grs:
        if gr.group == "" and gr.resource == "pods":
            return gr
    for gr in grs:
        if namespaced(str(gr)):
            return gr
    return grs[0]


class RuleResources:
    """``--config``: the label association of the first ``rules`` entry whose ``seriesQuery`` selects
    the series and whose ``seriesFilters`` / ``name.matches`` accept its name -- the rule that would
    have discovered it in Prometheus. A series no rule selects is refused (``no_rule``), as
    prometheus-adapter would not serve it. A ``seriesQuery`` that is not a plain series selector
    (``name{label op "value", ...}``) selects nothing here (logged once at start-up)."""

    def __init__(self, config: Any) -> None:
        from .prometheus.naming import MetricNamer

        self.rules: list[tuple[list[Matcher], Any]] = []
        for rule in config.rules:
            namer = MetricNamer.from_rule(rule, external=False)
            try:
                matchers = parse_selector(rule.series_query)
            except ValueError as e:
                log.warning(
                    "remote write: %s.seriesQuery %s: %s; the rule binds no remote-written series",
                    rule.path,
                    limits.printable(rule.series_query, 120),
                    e,
                )
                continue
            self.rules.append((matchers, namer))

    def select(self, metric: str, labels: Mapping[str, str]) -> ResourceMapper | None:
        """The ``resources`` of the first rule selecting the series (``labels`` without ``__name__``)."""
        for matchers, namer in self.rules:
            if all(_matches(m, metric if m[0] == "__name__" else labels.get(m[0], "")) for m in matchers):
                if namer.accepts(metric):
                    return namer.resources
        return None


Matcher = tuple[str, str, Any]  # (label, op, value or compiled regexp)

_SELECTOR_TOKEN = re.compile(
    r"""\s*(?:(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)|(?P<op>=~|!~|!=|=)|(?P<punct>[{},])"""
    r"""|(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`))"""
)


def parse_selector(text: str) -> list[Matcher]:
    """The matchers of a PromQL series selector (``name``, ``{...}`` or ``name{...}``); ValueError
    for anything else. Regexps are Go RE2, fully anchored as in PromQL."""
    from .prometheus.matchers import compile_go_regexp

    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _SELECTOR_TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"unexpected {text[pos : pos + 20]!r}")
        kind = m.lastgroup or ""
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    out: list[Matcher] = []
    i = 0
    if tokens and tokens[0][0] == "name":
        out.append(("__name__", "=", tokens[0][1]))
        i = 1
    if i < len(tokens):
        if tokens[i] != ("punct", "{") or tokens[-1] != ("punct", "}"):
            raise ValueError("not a series selector")
        i += 1
        while i < len(tokens) - 1:
            try:
                (k1, label), (k2, op), (k3, raw) = tokens[i : i + 3]
            except ValueError:
                raise ValueError("a label matcher is incomplete") from None
            if k1 != "name" or k2 != "op" or k3 != "str":
                raise ValueError(f"not a label matcher at {label!r}")
            value = raw[1:-1] if raw[0] == "`" else codecs.decode(raw[1:-1], "unicode_escape")
            if op in ("=~", "!~"):
                try:
                    out.append((label, op, compile_go_regexp(value)))
                except ValueError as e:
                    raise ValueError(f"{label}{op}: {e}") from None
            else:
                out.append((label, op, value))
            i += 3
            if i < len(tokens) - 1:
                if tokens[i] != ("punct", ","):
                    raise ValueError("label matchers must be separated by commas")
                i += 1
    if not out:
        raise ValueError("an empty selector")
    return out


def _matches(m: Matcher, value: str) -> bool:
    _, op, want = m
    if op == "=":
        return value == want
    if op == "!=":
        return value != want
    hit = want.fullmatch(value) is not None
    return hit if op == "=~" else not hit


def config_mapper(config: Any) -> RuleResources:
    """The label association of a prometheus-adapter config (an ``AdapterConfig``, or the path of its
    file): per series, its rules' (:class:`RuleResources`; ``ConfigError`` naming the rule and field)."""
    from .prometheus.config import read_adapter_config

    if isinstance(config, str):
        config = read_adapter_config(config)
    return RuleResources(config)
