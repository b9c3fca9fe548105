"""The Prometheus bridge's API side: prometheus-adapter's configuration (:mod:`.config`), its semantics
(:mod:`.naming`, :mod:`.resources`, :mod:`.matchers`, the ``<< >>`` Go templates in :mod:`.gotemplate`),
and the provider that serves custom, external and resource metrics from a Prometheus-compatible backend.

The configuration modules are pure (no I/O besides reading the file): they turn a request -- a metric,
a group-resource, a namespace, object names, a selector -- into the PromQL prometheus-adapter would send.
"""

from kcms.apis.prometheus.config import (
    AdapterConfig,
    ConfigError,
    DiscoveryRule,
    load_adapter_config,
    read_adapter_config,
)
from kcms.apis.prometheus.matchers import QueryBuildError
from kcms.apis.prometheus.naming import MetricNamer, ResourceRules
from kcms.apis.prometheus.resources import GroupResource, ResourceMapper

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
