"""KCMS: a Kubernetes metrics pipeline serving metrics.k8s.io, custom.metrics.k8s.io and
external.metrics.k8s.io through the API aggregation layer."""

__version__ = "0.1.0"
