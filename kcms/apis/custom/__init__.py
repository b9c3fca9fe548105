"""custom.metrics.k8s.io: metrics about Kubernetes objects (v1beta2 and v1beta1)."""

from kcms.apis.custom.api import CustomMetricsAPI

__all__ = ["CustomMetricsAPI"]
