"""external.metrics.k8s.io: metrics about nothing in the cluster (v1beta1)."""

from kcms.apis.external.api import ExternalMetricsAPI

__all__ = ["ExternalMetricsAPI"]
