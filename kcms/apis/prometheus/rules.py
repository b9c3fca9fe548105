"""The rules of a prometheus-adapter configuration as written (before compiling), and :class:`ConfigError`.

:mod:`.config` reads the YAML into these; :mod:`.naming` compiles them (:class:`~.naming.MetricNamer`,
:class:`~.naming.ResourceRules`). They sit in their own module so that both can import them without
importing each other. ``path`` is where a rule stands in the file (``rules[3]``,
``resourceRules.cpu``), the prefix of every :class:`ConfigError` about it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "ConfigError",
    "DiscoveryRule",
    "NameMapping",
    "RegexFilter",
    "ResourceMapping",
    "ResourceRuleConfig",
]


class ConfigError(ValueError):
    """The configuration cannot be used: the message names the rule and field (``rules[2].name.matches: ...``)."""


@dataclass(frozen=True)
class RegexFilter:
    is_: str = ""
    is_not: str = ""


@dataclass(frozen=True)
class NameMapping:
    matches: str = ""
    as_: str = ""


@dataclass(frozen=True)
class ResourceMapping:
    template: str = ""
    overrides: tuple[tuple[str, str, str], ...] = ()  # (label, group, resource), file order
    namespaced: bool | None = None  # None: not written (true)


@dataclass(frozen=True)
class DiscoveryRule:
    """One entry of ``rules`` or ``externalRules``, as written. ``path`` is where it is (``rules[3]``)."""

    series_query: str
    metrics_query: str
    series_filters: tuple[RegexFilter, ...] = ()
    resources: ResourceMapping = field(default_factory=ResourceMapping)
    name: NameMapping = field(default_factory=NameMapping)
    path: str = "rules[0]"


@dataclass(frozen=True)
class ResourceRuleConfig:
    """``resourceRules.cpu`` or ``resourceRules.memory`` as written."""

    container_query: str
    node_query: str
    container_label: str
    resources: ResourceMapping = field(default_factory=ResourceMapping)
    path: str = "resourceRules.cpu"
