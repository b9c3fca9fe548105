"""The bounds every ingestion path applies to a sample, in one place.

The kubelet scrape, the summary API, the agent's buffer and OTLP receiver, the metric and node
pushes and the store's writes all refuse the same things for the same reasons, so a refusal means
the same wherever it is counted:

* **time**: a timestamp more than ``max_future_skew()`` seconds ahead of this process's wall clock
  (``--max-future-skew``, default 60 s, the same flag on every command) is ``future_timestamp``;
* **size**: a metric name longer than :data:`MAX_METRIC_NAME_LENGTH` (253, a DNS subdomain's
  length) is ``metric_name_too_long``; more than :data:`MAX_LABELS` labels on one series is
  ``too_many_labels``; a label name over :data:`MAX_LABEL_NAME_LENGTH` or a value over
  :data:`MAX_LABEL_VALUE_LENGTH` characters is ``label_name_too_long`` / ``label_value_too_long``.

Paths may be stricter (the metric push keeps its own, smaller label limits); none is looser.

:func:`printable` bounds and escapes a request-derived string for a log line or an error message.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable

__all__ = [
    "DEFAULT_MAX_FUTURE_SKEW",
    "FUTURE_TIMESTAMP",
    "LABEL_NAME_TOO_LONG",
    "LABEL_VALUE_TOO_LONG",
    "MAX_LABELS",
    "MAX_LABEL_NAME_LENGTH",
    "MAX_LABEL_VALUE_LENGTH",
    "MAX_METRIC_NAME_LENGTH",
    "REASONS",
    "METRIC_NAME_TOO_LONG",
    "TOO_MANY_LABELS",
    "DNS_LABEL_RE",
    "DNS_SUBDOMAIN_RE",
    "LABEL_NAME_RE",
    "METRIC_NAME_RE",
    "configure",
    "future_limit",
    "labels_problem",
    "max_future_skew",
    "metric_name_problem",
    "printable",
]

DEFAULT_MAX_FUTURE_SKEW = 60.0  # seconds; --max-future-skew
MAX_METRIC_NAME_LENGTH = 253
MAX_LABELS = 32
MAX_LABEL_NAME_LENGTH = 128
MAX_LABEL_VALUE_LENGTH = 1024

# The syntax of names, for every path that checks them (use ``fullmatch``).
METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*", re.ASCII)  # Prometheus metric names
LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*", re.ASCII)  # Prometheus label names
DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)  # namespaces (<= 63 characters)
DNS_SUBDOMAIN_RE = re.compile(  # object names and group-resources (<= 253 characters)
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII
)

# Refusal reasons (stable: Prometheus label values and words in answers).
FUTURE_TIMESTAMP = "future_timestamp"
METRIC_NAME_TOO_LONG = "metric_name_too_long"
TOO_MANY_LABELS = "too_many_labels"
LABEL_NAME_TOO_LONG = "label_name_too_long"
LABEL_VALUE_TOO_LONG = "label_value_too_long"

# Every reason above, for the refusal counters that pre-create their label values.
REASONS = (FUTURE_TIMESTAMP, METRIC_NAME_TOO_LONG, TOO_MANY_LABELS, LABEL_NAME_TOO_LONG, LABEL_VALUE_TOO_LONG)

_max_future_skew = DEFAULT_MAX_FUTURE_SKEW


def configure(*, max_future_skew: float) -> None:
    """Set the process-wide future skew (``--max-future-skew``); called once at start-up."""
    global _max_future_skew
    if not (math.isfinite(max_future_skew) and max_future_skew >= 0):
        raise ValueError(f"max_future_skew must be a finite number >= 0, not {max_future_skew!r}")
    _max_future_skew = float(max_future_skew)


def max_future_skew() -> float:
    """Seconds a timestamp may be ahead of this process's clock."""
    return _max_future_skew


def future_limit(now: float | None = None) -> float:
    """The latest acceptable timestamp (seconds since the epoch): ``now + max_future_skew()``."""
    return (time.time() if now is None else now) + _max_future_skew


def metric_name_problem(name: str) -> tuple[str, str] | None:
    """``(reason, message)`` when a metric name is over the length bound, else None (syntax is
    each path's own check: Prometheus names, OTLP names before mapping, ...)."""
    if len(name) > MAX_METRIC_NAME_LENGTH:
        return (
            METRIC_NAME_TOO_LONG,
            f"metric name of {len(name)} characters ({printable(name, 40)}); at most {MAX_METRIC_NAME_LENGTH}",
        )
    return None


def labels_problem(labels: Iterable[tuple[str, str]], max_labels: int = MAX_LABELS) -> tuple[str, str] | None:
    """``(reason, message)`` when a label set is over a size bound, else None."""
    n = 0
    for k, v in labels:
        n += 1
        if len(k) > MAX_LABEL_NAME_LENGTH:
            return (
                LABEL_NAME_TOO_LONG,
                f"label name of {len(k)} characters ({printable(k, 40)}); at most {MAX_LABEL_NAME_LENGTH}",
            )
        if len(v) > MAX_LABEL_VALUE_LENGTH:
            return (
                LABEL_VALUE_TOO_LONG,
                f"label {printable(k, 40)} has a value of {len(v)} characters; at most {MAX_LABEL_VALUE_LENGTH}",
            )
    if n > max_labels:
        return TOO_MANY_LABELS, f"{n} labels on one series; at most {max_labels}"
    return None


def printable(value: object, limit: int = 120) -> str:
    """``value`` as a quoted, escaped string of at most about ``limit`` characters: safe in a log line
    (no newlines, control characters or terminal escapes from a client reach the log)."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) > limit
    out = repr(text[:limit]).encode("ascii", "backslashreplace").decode("ascii")
    return f"{out}...({len(text)} chars)" if cut else out
