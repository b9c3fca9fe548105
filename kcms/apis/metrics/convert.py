"""metrics.k8s.io/v1beta1 objects as JSON-ready dicts, in the exact shapes metrics-server serves."""

from __future__ import annotations

import math
import time

from kcms.model import NodeInfo, PodInfo
from kcms.quantity import format_bytes, format_cpu_nanocores
from kcms.sources.bounds import MAX_SERVED_TIMESTAMP, MIN_SERVED_TIMESTAMP
from kcms.store.usage import PodUsage, Usage

GROUP = "metrics.k8s.io"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"

_UNITS = (("h", 3600 * 10**9), ("m", 60 * 10**9))
_MAX_NS = 2**63 - 1  # Go's maxDuration
_MIN_NS = -(2**63)


def go_duration(seconds: float) -> str:
    """A duration as Go's time.Duration.String() prints it ("15s", "1.5s", "1m0.25s", "500ms").

    Rounded to the microsecond: the inputs are differences of float epoch timestamps, whose
    last digits are noise (2.006 s would print as 2.006000042s).
    """
    if not math.isfinite(seconds):  # never from the stores (their timestamps are bounded); a 500 is worse
        seconds = 0.0
    if abs(seconds) > 1e10:  # beyond Go's Duration (int64 ns, ~292 years): saturated, as time.Sub does
        ns = _MAX_NS if seconds > 0 else _MIN_NS
    else:
        ns = min(max(round(seconds * 1e6) * 1000, _MIN_NS), _MAX_NS)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 10**9:  # below a second Go switches to the largest fitting sub-second unit
        for unit, size in (("ms", 10**6), ("µs", 10**3), ("ns", 1)):
            if ns >= size:
                return sign + _fraction(ns, size) + unit
    out = []
    for unit, size in _UNITS:
        if ns >= size or out:
            out.append(f"{ns // size}{unit}")
            ns %= size
    out.append(_fraction(ns, 10**9) + "s")
    return sign + "".join(out)


def _fraction(value: int, unit: int) -> str:
    whole, rest = divmod(value, unit)
    if not rest:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{rest:0{digits}d}".rstrip("0")


_MIN_SECOND = int(MIN_SERVED_TIMESTAMP)
_MAX_SECOND = int(MAX_SERVED_TIMESTAMP)


class TimeFormatter:
    """RFC 3339 (seconds, UTC) as metav1.Time marshals, memoised for the burst of one list.

    The year is always four digits: Go's ``time.Parse`` (kubectl, the HPA) refuses anything else and
    with it the whole list. Ingestion refuses timestamps outside 0001-9999 (``kcms.sources.bounds``
    and ``kcms.limits.future_limit``); should one get this far, it is clamped into that range here
    rather than break a client (and ``strftime("%Y")`` would print year 999 as ``999``).
    """

    __slots__ = ("_second", "_text")

    def __init__(self) -> None:
        self._second: int | None = None
        self._text = ""

    def __call__(self, ts: float) -> str:
        if _MIN_SECOND <= ts <= _MAX_SECOND:  # false for NaN
            second = int(ts)
        else:
            second = _MAX_SECOND if ts > 0 else _MIN_SECOND
        if second != self._second:
            self._second = second
            t = time.gmtime(second)
            self._text = f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}Z"
        return self._text


def usage_dict(cpu_nanocores: int, memory: int) -> dict[str, str]:
    return {"cpu": format_cpu_nanocores(cpu_nanocores), "memory": format_bytes(memory)}


def _meta(name: str, namespace: str, labels: dict[str, str], created: str) -> dict:
    meta: dict = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["creationTimestamp"] = created
    if labels:  # omitted when empty, as ObjectMeta's omitempty does
        meta["labels"] = labels
    return meta


def node_metrics(node: NodeInfo, usage: Usage, created: str, fmt: TimeFormatter) -> dict:
    # metrics-server stamps creationTimestamp with the time of the request: these objects are
    # computed, not stored.
    return {
        "metadata": _meta(node.name, "", node.labels, created),
        "timestamp": fmt(usage.timestamp),
        "window": go_duration(usage.window),
        "usage": usage_dict(usage.cpu_nanocores, usage.memory),
    }


def pod_usage_body(usage: PodUsage, fmt: TimeFormatter) -> dict:
    """The parts of a PodMetrics that depend only on the readings (cacheable until the next scrape)."""
    return {
        "timestamp": fmt(usage.timestamp),
        "window": go_duration(usage.window),
        "containers": [
            {"name": name, "usage": usage_dict(u.cpu_nanocores, u.memory)} for name, u in usage.containers
        ],
    }


def pod_metrics(pod: PodInfo, body: dict, created: str) -> dict:
    """A PodMetrics from the pod's metadata and its ``pod_usage_body``."""
    return {"metadata": _meta(pod.name, pod.namespace, pod.labels, created), **body}


def single(obj: dict, kind: str) -> dict:
    """A lone object carries its kind and apiVersion; list items do not."""
    return {"kind": kind, "apiVersion": API_VERSION, **obj}


def object_list(kind: str, items: list[dict]) -> dict:
    return {"kind": kind, "apiVersion": API_VERSION, "metadata": {}, "items": items}
