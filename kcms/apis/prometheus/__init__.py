"""The Prometheus bridge's API side: prometheus-adapter's configuration (:mod:`.config`), its semantics
(:mod:`.naming`, :mod:`.resources`, :mod:`.matchers`, the ``<< >>`` Go templates in :mod:`.gotemplate`),
and the provider that serves custom, external and resource metrics from a Prometheus-compatible backend.

The configuration modules are pure (no I/O besides reading the file): they turn a request -- a metric,
a group-resource, a namespace, object names, a selector -- into the PromQL prometheus-adapter would send.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# The names below, from their modules on first use: `kcms.apis.prometheus.resources` is imported by
# every server (remote write binds series with it), the rest only when a --config is read.
_EXPORTS = {
    "AdapterConfig": "config",
    "ConfigError": "config",
    "DiscoveryRule": "config",
    "load_adapter_config": "config",
    "read_adapter_config": "config",
    "QueryBuildError": "matchers",
    "MetricNamer": "naming",
    "ResourceRules": "naming",
    "GroupResource": "resources",
    "ResourceMapper": "resources",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)


__all__ = [
    "AdapterConfig",
    "ConfigError",
    "DiscoveryRule",
    "GroupResource",
    "MetricNamer",
    "QueryBuildError",
    "ResourceMapper",
    "ResourceRules",
    "load_adapter_config",
    "read_adapter_config",
]
