"""prometheus-adapter's configuration file, read unchanged: ``rules``, ``externalRules``, ``resourceRules``.

The file is the one prometheus-adapter reads with ``--config`` (``pkg/config/config.go``, decoded with
``yaml.UnmarshalStrict``). :func:`load_adapter_config` parses it with PyYAML and checks it the way the
adapter does when it starts -- and a little earlier: every problem the adapter would only meet on the
first request (a template that reads a field that does not exist, a missing ``metricsQuery``) is found
here. Any problem is a :class:`ConfigError` whose message starts with the place in the file, e.g.
``rules[2].name.matches: error parsing regexp: ...`` or ``externalRules[0].resources.overrides.pod:
resource is required``.

Top level::

    rules:          [DiscoveryRule]   # custom.metrics.k8s.io
    externalRules:  [DiscoveryRule]   # external.metrics.k8s.io
    resourceRules:                    # metrics.k8s.io (optional)
      cpu:    {containerQuery, nodeQuery, resources, containerLabel}
      memory: {containerQuery, nodeQuery, resources, containerLabel}
      window: 1m                      # Prometheus duration; default 1m

DiscoveryRule::

    seriesQuery:   'http_requests_total{namespace!="",pod!=""}'   # required
    seriesFilters: [{is: <regexp>} | {isNot: <regexp>}]
    resources:     {overrides: {<label>: {group: <g>, resource: <r>}}, template: "<<.Resource>>",
                    namespaced: true}                              # namespaced: external rules
    name:          {matches: "^(.*)_total$", as: "${1}_per_second"}
    metricsQuery:  'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'   # required

The compiled forms (what a provider uses) are :class:`~kcms.apis.prometheus.naming.MetricNamer` (one per
rule) and :class:`~kcms.apis.prometheus.naming.ResourceRules`; :class:`AdapterConfig` holds both the rules
as written and, in ``resource_rules``, the compiled resource rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from kcms.apis.prometheus.naming import MetricNamer, ResourceRules
from kcms.apis.prometheus.resources import GroupResource
from kcms.apis.prometheus.rules import (
    ConfigError,
    DiscoveryRule,
    NameMapping,
    RegexFilter,
    ResourceMapping,
    ResourceRuleConfig,
)

__all__ = [
    "AdapterConfig",
    "ConfigError",
    "DiscoveryRule",
    "GroupResource",
    "MetricNamer",
    "NameMapping",
    "RegexFilter",
    "ResourceMapping",
    "ResourceRuleConfig",
    "ResourceRules",
    "load_adapter_config",
    "parse_duration",
    "read_adapter_config",
]


MAX_CONFIG_BYTES = 4 << 20  # a real config is a few kB; a mounted file this big is a mistake
DEFAULT_WINDOW = 60.0


@dataclass(frozen=True)
class AdapterConfig:
    """A loaded configuration: the rules as written, the compiled namers and resource rules.

    ``warnings`` lists what the adapter accepts but that cannot work (an external rule that is namespaced
    but has no namespace label: every request for it fails)."""

    rules: tuple[DiscoveryRule, ...] = ()
    external_rules: tuple[DiscoveryRule, ...] = ()
    resource_rules: ResourceRules | None = None
    namers: tuple[MetricNamer, ...] = ()
    external_namers: tuple[MetricNamer, ...] = ()
    warnings: tuple[str, ...] = ()
    source: str = "<config>"


# ------------------------------------------------------------------------------------------------
# durations (prometheus/common model.ParseDuration)

_DURATION_RE = re.compile(
    r"(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?(?:([0-9]+)ms)?"
)
_UNITS = (365 * 86400.0, 7 * 86400.0, 86400.0, 3600.0, 60.0, 1.0, 0.001)


def parse_duration(text: str) -> float:
    """A Prometheus duration (``1m``, ``1h30m``, ``500ms``, ``0``) in seconds; ``ValueError`` otherwise."""
    if text == "0":
        return 0.0
    m = _DURATION_RE.fullmatch(text)
    if not text or not m or not any(m.groups()):
        raise ValueError(f'not a valid duration string: "{text}"')
    return sum(float(v) * unit for v, unit in zip(m.groups(), _UNITS, strict=True) if v)


# ------------------------------------------------------------------------------------------------
# YAML reading, strict as yaml.UnmarshalStrict


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (yaml.v2's UnmarshalStrict does)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise yaml.constructor.ConstructorError(None, None, "unhashable key", key_node.start_mark)
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"mapping key {key!r} already defined", key_node.start_mark
            )
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


class _Reader:
    """Typed access to one YAML mapping with its path; keys other than ``fields`` are refused."""

    def __init__(self, value: Any, path: str, fields: tuple[str, ...]) -> None:
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {_kind(value)}")
        self.value = value
        self.path = path
        # unknown keys first: a misspelt key is more often the cause than the "required" it leads to
        for key in value:
            if key not in fields:
                raise ConfigError(f"{self.at(str(key))}: unknown field {str(key)!r}")

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str) -> Any:
        return self.value.get(key)

    def string(self, key: str) -> str:
        value = self.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise ConfigError(f"{self.at(key)}: expected a string, got {_kind(value)}")
        return value

    def boolean(self, key: str) -> bool | None:
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise ConfigError(f"{self.at(key)}: expected true or false, got {_kind(value)}")
        return value

    def items(self, key: str) -> list[Any]:
        value = self.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise ConfigError(f"{self.at(key)}: expected a list, got {_kind(value)}")
        return value


def _kind(value: Any) -> str:
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)


def _resource_mapping(r: _Reader) -> ResourceMapping:
    m = _Reader(r.get("resources"), r.at("resources"), ("template", "overrides", "namespaced"))
    template = m.string("template")
    overrides: list[tuple[str, str, str]] = []
    raw = m.get("overrides")
    if raw is not None:
        if not isinstance(raw, Mapping):
            raise ConfigError(
                f"{m.at('overrides')}: expected a mapping of label to {{group, resource}}, got {_kind(raw)}"
            )
        for label, target in raw.items():
            where = f"{m.at('overrides')}.{label}"
            if not isinstance(label, str) or not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", label):
                raise ConfigError(f"{where}: {label!r} is not a Prometheus label name")
            t = _Reader(target, where, ("group", "resource"))
            group, resource = t.string("group"), t.string("resource")
            if not resource:
                raise ConfigError(f"{where}.resource: required (the group-resource the label names)")
            overrides.append((label, group, resource))
    namespaced = m.boolean("namespaced")
    return ResourceMapping(template=template, overrides=tuple(overrides), namespaced=namespaced)


_RULE_FIELDS = ("seriesQuery", "seriesFilters", "resources", "name", "metricsQuery")


def _discovery_rule(value: Any, path: str) -> DiscoveryRule:
    r = _Reader(value, path, _RULE_FIELDS)
    series_query = r.string("seriesQuery")
    if not series_query.strip():
        raise ConfigError(f"{r.at('seriesQuery')}: required (the series selector for /api/v1/series)")
    filters = []
    for i, raw in enumerate(r.items("seriesFilters")):
        f = _Reader(raw, f"{r.at('seriesFilters')}[{i}]", ("is", "isNot"))
        filters.append(RegexFilter(is_=f.string("is"), is_not=f.string("isNot")))
    resources = _resource_mapping(r)
    n = _Reader(r.get("name"), r.at("name"), ("matches", "as"))
    name = NameMapping(matches=n.string("matches"), as_=n.string("as"))
    metrics_query = r.string("metricsQuery")
    if not metrics_query:
        raise ConfigError(
            f"{r.at('metricsQuery')}: required (the query template, e.g. 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)')"
        )
    return DiscoveryRule(series_query, metrics_query, tuple(filters), resources, name, path)


def _resource_rule(value: Any, path: str) -> ResourceRuleConfig:
    if value is None:
        raise ConfigError(f"{path}: required when resourceRules is set")
    r = _Reader(value, path, ("containerQuery", "nodeQuery", "resources", "containerLabel"))
    container_query, node_query = r.string("containerQuery"), r.string("nodeQuery")
    container_label = r.string("containerLabel")
    resources = _resource_mapping(r)
    for key, text in (
        ("containerQuery", container_query),
        ("nodeQuery", node_query),
        ("containerLabel", container_label),
    ):
        if not text:
            raise ConfigError(f"{r.at(key)}: required")
    return ResourceRuleConfig(container_query, node_query, container_label, resources, path)


def load_adapter_config(text: str, source: str = "<config>") -> AdapterConfig:
    """Parse and check a prometheus-adapter configuration; :class:`ConfigError` names what is wrong."""
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - _StrictLoader is a SafeLoader
    except RecursionError:
        raise ConfigError(f"{source}: not valid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}: not valid YAML{where}: {problem}") from None
    top = _Reader(doc, "", ("rules", "externalRules", "resourceRules"))
    rules = tuple(_discovery_rule(v, f"rules[{i}]") for i, v in enumerate(top.items("rules")))
    external = tuple(
        _discovery_rule(v, f"externalRules[{i}]") for i, v in enumerate(top.items("externalRules"))
    )
    resource_rules = None
    raw_rr = top.get("resourceRules")
    if raw_rr is not None:
        rr = _Reader(raw_rr, "resourceRules", ("cpu", "memory", "window"))
        cpu = _resource_rule(rr.get("cpu"), "resourceRules.cpu")
        memory = _resource_rule(rr.get("memory"), "resourceRules.memory")
        window_raw = rr.get("window")
        window = DEFAULT_WINDOW
        if window_raw is not None:
            if not isinstance(window_raw, str):
                raise ConfigError(
                    f"resourceRules.window: expected a duration such as 1m, got {_kind(window_raw)}"
                )
            try:
                window = parse_duration(window_raw)
            except ValueError as exc:
                raise ConfigError(f"resourceRules.window: {exc}") from None
            if window == 0:
                # the adapter reports a missing or zero window as "0s", a rate over no time;
                # KCMS reports 1m, its documented default (docs/migration-from-prometheus-adapter.md)
                window = DEFAULT_WINDOW
        resource_rules = ResourceRules.from_config(cpu, memory, window)
    namers = tuple(MetricNamer.from_rule(rule, external=False) for rule in rules)
    external_namers = tuple(MetricNamer.from_rule(rule, external=True) for rule in external)
    warnings = tuple(
        f"{n.path}: namespaced external rule without a label for namespaces: every request for its metrics fails "
        "(add resources.overrides.<label>: {resource: namespace}, or namespaced: false)"
        for n in external_namers
        if n.resources.namespaced and n.resources.namespace_label is None
    )
    return AdapterConfig(rules, external, resource_rules, namers, external_namers, warnings, source)


def read_adapter_config(path: str) -> AdapterConfig:
    """Read and load the file at ``path``; an unreadable, oversized or non-UTF-8 file is a :class:`ConfigError`."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the adapter configuration: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not an adapter configuration")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return load_adapter_config(text, source=path)
