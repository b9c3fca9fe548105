"""history.kcms.io/v1alpha1: node, pod and custom-series usage over the last ``--history``, and the
collector's per-node scrape status (docs/history.md)."""

from kcms.apis.history.api import HistoryAPI

__all__ = ["HistoryAPI"]
