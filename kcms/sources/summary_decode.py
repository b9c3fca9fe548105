"""Decoder of the kubelet summary API (``/stats/summary``, JSON) to :class:`kcms.model.NodeBatch`.

Fields read (``k8s.io/kubelet/pkg/apis/stats/v1alpha1``):

* ``node.cpu.usageCoreNanoSeconds``, ``node.cpu.time``, ``node.memory.workingSetBytes``, ``node.startTime``
* ``pods[].podRef.{namespace,name}``, ``pods[].containers[].{name, startTime, cpu.usageCoreNanoSeconds,
  cpu.time, memory.workingSetBytes}``

The point's timestamp is ``cpu.time`` (the time of the counter the rates are computed from). The same
semantics and rejection reasons as :func:`kcms.sources.kubelet_decode.decode_resource_metrics` apply; in
addition a wrong JSON type or an unparseable time counts as ``bad_value``, a container or node without CPU
or memory stats (the kubelet omits them until it has them) as ``incomplete_container`` / ``incomplete_node``,
and an unparseable ``startTime`` is counted as ``bad_value`` but keeps the point with start time 0.0.
A time whose year is not four digits is not RFC 3339 and counts as ``bad_value``; the bounds of
:mod:`kcms.sources.bounds` (``future_timestamp``, ``absurd_value``, ``label_value_too_long``) apply
last, one reading at a time.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import orjson

from kcms import limits
from kcms.model import DecodeError, NodeBatch, ResourcePoint
from kcms.sources.bounds import screen_batch

__all__ = ["DEFAULT_MAX_BYTES", "decode_summary", "parse_rfc3339"]

DEFAULT_MAX_BYTES = 10 * 1024 * 1024

_RFC3339_RE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))",
    re.ASCII,
)
_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


@lru_cache(maxsize=8192)
def parse_rfc3339(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 time (``2023-11-14T22:13:20.123456789Z``, ``...+02:00``).

    Up to 9 fractional digits; ``Z`` or a numeric offset. ``ValueError`` for anything else or an
    impossible date. Exact to the float's precision (no datetime round trip).
    """
    m = _RFC3339_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    y, mo, d, h, mi, s = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    if not 1 <= mo <= 12 or h > 23 or mi > 59 or s > 59:
        raise ValueError(f"RFC 3339 time out of range: {text!r}")
    dim = _DAYS_IN_MONTH[mo]
    if mo == 2 and y % 4 == 0 and (y % 100 != 0 or y % 400 == 0):
        dim = 29
    if not 1 <= d <= dim:
        raise ValueError(f"RFC 3339 day out of range: {text!r}")
    secs = _days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s
    if m.group(8):
        oh, om = int(m.group(9)), int(m.group(10))
        if oh > 23 or om > 59:
            raise ValueError(f"RFC 3339 offset out of range: {text!r}")
        off = oh * 3600 + om * 60
        secs -= off if m.group(8) == "+" else -off
    frac = m.group(7)
    if frac:
        return secs + int(frac) / 10 ** len(frac)
    return float(secs)


def _bump(rejected: dict[str, int], reason: str) -> None:
    rejected[reason] = rejected.get(reason, 0) + 1


def _count(obj: Any, rejected: dict[str, int]) -> int | None:
    """A non-negative integer counter from JSON (an integral float is accepted), or None (counted)."""
    if type(obj) is int:
        if obj < 0:
            _bump(rejected, "negative")
            return None
        return obj
    if type(obj) is float and obj.is_integer():
        if obj < 0:
            _bump(rejected, "negative")
            return None
        return int(obj)
    _bump(rejected, "bad_value")
    return None


def _time(obj: Any, rejected: dict[str, int]) -> float | None:
    if type(obj) is str:
        try:
            return parse_rfc3339(obj)
        except ValueError:
            pass
    _bump(rejected, "bad_value")
    return None


def _point(obj: dict, rejected: dict[str, int], incomplete: str) -> ResourcePoint | None | bool:
    """The point of a node or container stats object; None if rejected (counted), False if a value is zero."""
    cpu = obj.get("cpu")
    mem = obj.get("memory")
    if cpu is None or mem is None:
        _bump(rejected, incomplete)
        return None
    if type(cpu) is not dict or type(mem) is not dict:
        _bump(rejected, "bad_value")
        return None
    raw_cpu = cpu.get("usageCoreNanoSeconds")
    raw_mem = mem.get("workingSetBytes")
    if raw_cpu is None or raw_mem is None:
        _bump(rejected, incomplete)
        return None
    cpu_ns = _count(raw_cpu, rejected)
    if cpu_ns is None:
        return None
    memory = _count(raw_mem, rejected)
    if memory is None:
        return None
    ts = _time(cpu.get("time"), rejected)
    if ts is None:
        return None
    if cpu_ns == 0 or memory == 0:
        return False
    start = obj.get("startTime")
    start_time = 0.0
    if start is not None:
        st = _time(start, rejected)
        if st is not None:
            start_time = st
    return ResourcePoint(start_time, ts, cpu_ns, memory)


def decode_summary(node: str, body: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> NodeBatch:
    """Decode a kubelet ``/stats/summary`` body. Raises :class:`DecodeError` if it cannot be used at all."""
    if not isinstance(body, (bytes, bytearray, memoryview, str)):
        raise DecodeError("malformed", f"summary from {node} is not bytes")
    if len(body) > max_bytes:
        raise DecodeError("too_large", f"summary from {node} is {len(body)} bytes, over {max_bytes}")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise DecodeError("malformed", f"summary from {node} is not JSON: {e}") from None
    if type(doc) is not dict:
        raise DecodeError("malformed", f"summary from {node} is not a JSON object")
    rejected: dict[str, int] = {}
    batch = NodeBatch(node=node, rejected=rejected)

    nd = doc.get("node")
    if nd is None:
        _bump(rejected, "incomplete_node")
    elif type(nd) is not dict:
        _bump(rejected, "bad_value")
    else:
        point = _point(nd, rejected, "incomplete_node")
        if point is False:
            _bump(rejected, "zero_value")
        elif point is not None:
            batch.node_point = point  # type: ignore[assignment]

    pods = doc.get("pods")
    if pods is None:
        pods = []
    elif type(pods) is not list:
        _bump(rejected, "bad_value")
        pods = []
    seen: set[tuple[str, str]] = set()
    out = batch.pods
    for pod in pods:
        if type(pod) is not dict:
            _bump(rejected, "bad_value")
            continue
        ref = pod.get("podRef")
        if type(ref) is not dict:
            _bump(rejected, "missing_label" if ref is None else "bad_value")
            continue
        ns = ref.get("namespace")
        name = ref.get("name")
        if type(ns) is not str or type(name) is not str or not ns or not name:
            _bump(rejected, "missing_label")
            continue
        pk = (ns, name)
        if pk in seen:
            _bump(rejected, "duplicate")
            continue
        seen.add(pk)
        containers = pod.get("containers")
        if containers is None:
            continue
        if type(containers) is not list:
            _bump(rejected, "bad_value")
            continue
        points: dict[str, ResourcePoint] = {}
        zero = False
        for c in containers:
            if type(c) is not dict:
                _bump(rejected, "bad_value")
                continue
            cname = c.get("name")
            if type(cname) is not str or not cname:
                _bump(rejected, "missing_label")
                continue
            if cname in points:
                _bump(rejected, "duplicate")
                continue
            point = _point(c, rejected, "incomplete_container")
            if point is False:
                zero = True
            elif point is not None:
                points[cname] = point  # type: ignore[assignment]
        if zero:
            _bump(rejected, "zero_value")
        elif points:
            out[pk] = points
    # Future, absurd or oversized readings are refused one by one (the rest of the node is kept).
    latest = limits.future_limit()
    for reason, n in screen_batch(batch, latest).items():
        rejected[reason] = rejected.get(reason, 0) + n
    batch.screened = latest
    return batch
