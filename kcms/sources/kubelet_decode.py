"""Decoders from kubelet responses (bytes) to :class:`kcms.model.NodeBatch`.

* :func:`decode_resource_metrics` reads ``/metrics/resource`` (Prometheus text, Kubernetes >= 1.19).
* :func:`decode_summary` reads ``/stats/summary`` (JSON) via :mod:`kcms.sources.summary_decode`.

Semantics (shared by both):

* Node point: cumulative CPU (core-seconds converted to integer core-nanoseconds, rounded exactly from
  the decimal text) and working-set memory; the timestamp of the CPU sample; start time 0.0 (text) or
  ``node.startTime`` (summary).
* Container point: needs both CPU and memory (the CPU sample's timestamp); start time from
  ``container_start_time_seconds`` (0.0 if absent). A container lacking one of them is dropped and counted
  as ``incomplete_container``.
* Zero values, following metrics-server's ``decode.go``: it treats a zero CPU counter or zero memory as
  "not known yet". A node whose CPU or memory is 0 is dropped (``zero_value``); a container whose CPU or
  memory is 0 drops its whole pod (metrics-server drops the pod, so that a pod's sum is never partial),
  counted once per pod as ``zero_value``.
* Per-sample rejections, counted in ``NodeBatch.rejected`` by reason: ``non_finite`` (NaN, +-Inf),
  ``negative``, ``bad_value`` (value or timestamp not a number, or a timestamp <= 0), ``missing_label``
  (namespace, pod or container absent or empty), ``duplicate`` (the same series twice: the first wins),
  ``malformed`` (a line that is not a sample line).
* Whole-response failures raise :class:`kcms.model.DecodeError`: ``too_large`` (body over ``max_bytes``),
  ``malformed`` (not UTF-8 text, empty, or no recognised sample and at least one malformed line),
  ``kubelet_error`` (``resource_scrape_error``/``scrape_error`` is 1 and nothing usable was decoded; if some
  data was usable it is returned and ``rejected["kubelet_error"]`` is 1).

Speed: well-formed container lines in the kubelet's own layout (labels sorted: container, namespace, pod;
no escapes) are recognised by one compiled regular expression over the whole body (``re.findall`` runs in
C); every other line goes through the strict general parser :func:`kcms.sources.promtext.parse_sample_line`.

Measured with ``python bench/decode.py`` on the 2-core development machine (Python 3.11, 30 pods x 2
containers, 271 lines, with timestamps):
    FIGURES_PLACEHOLDER
"""

from __future__ import annotations

import math
import re
import time
from decimal import Decimal

from kcms.model import DecodeError, NodeBatch, ResourcePoint
from kcms.sources.promtext import LineError, parse_sample_line, parse_timestamp, parse_value

__all__ = ["DEFAULT_MAX_BYTES", "decode_resource_metrics", "decode_summary", "seconds_to_ns"]

DEFAULT_MAX_BYTES = 10 * 1024 * 1024

_CPU = "container_cpu_usage_seconds_total"
_MEM = "container_memory_working_set_bytes"
_START = "container_start_time_seconds"
_NODE_CPU = "node_cpu_usage_seconds_total"
_NODE_MEM = "node_memory_working_set_bytes"
_ERROR_NAMES = ("resource_scrape_error", "scrape_error")

# One alternative per line: the fast container form, or anything else (handled in Python).
_LINE_RE = re.compile(
    r"^(?:(container_cpu_usage_seconds_total|container_memory_working_set_bytes|container_start_time_seconds)"
    r'\{container="([^"\\\n]+)",namespace="([^"\\\n]+)",pod="([^"\\\n]+)"\}'
    r" ([0-9][0-9.eE+\-]*)(?: ([1-9][0-9]{0,17}))?"
    r"|([^\n]*))$",
    re.M,
)

_NS_FAST_LIMIT = 1048576.0  # 2**20 s: below it float arithmetic rounds to the exact nanosecond (see seconds_to_ns)


def seconds_to_ns(text: str, value: float) -> int:
    """Seconds (decimal text and its float value, finite and >= 0) to integer nanoseconds, rounded half-even.

    Below 2**20 s the float product is within 0.12 ns of the exact decimal product, so when it is within
    0.25 of an integer that integer is the exactly rounded answer; otherwise the text is evaluated in decimal.
    """
    if value < _NS_FAST_LIMIT:
        x = value * 1e9
        n = round(x)
        if abs(x - n) < 0.25:
            return n
    return int(Decimal(text).scaleb(9).to_integral_value())


def _bump(rejected: dict[str, int], reason: str, n: int = 1) -> None:
    rejected[reason] = rejected.get(reason, 0) + n


def _check(value_text: str, rejected: dict[str, int]) -> float | None:
    """A sample value that is a finite, non-negative float, or None (counted)."""
    try:
        v = parse_value(value_text)
    except ValueError:
        _bump(rejected, "bad_value")
        return None
    if not math.isfinite(v):
        _bump(rejected, "non_finite")
        return None
    if v < 0:
        _bump(rejected, "negative")
        return None
    return v


def decode_resource_metrics(
    node: str, body: bytes, *, now: float | None = None, max_bytes: int = DEFAULT_MAX_BYTES
) -> NodeBatch:
    """Decode a kubelet ``/metrics/resource`` body into a :class:`NodeBatch` (see the module docstring).

    ``now`` (seconds since the epoch, default ``time.time()``) is the timestamp of samples without one.
    Raises :class:`DecodeError` for a response that cannot be used at all.
    """
    if len(body) > max_bytes:
        raise DecodeError("too_large", f"kubelet response from {node} is {len(body)} bytes, over {max_bytes}")
    try:
        text = body.decode("utf-8") if isinstance(body, (bytes, bytearray, memoryview)) else None
    except UnicodeDecodeError as e:
        raise DecodeError("malformed", f"kubelet response from {node} is not UTF-8 text: {e}") from None
    if text is None:
        raise DecodeError("malformed", f"kubelet response from {node} is not bytes")
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if not text.strip():
        raise DecodeError("malformed", f"kubelet response from {node} is empty")
    now_s = time.time() if now is None else float(now)

    rejected: dict[str, int] = {}
    # (namespace, pod, container) -> value
    cpu: dict[tuple[str, str, str], tuple[int, float]] = {}
    mem: dict[tuple[str, str, str], int] = {}
    start: dict[tuple[str, str, str], float] = {}
    node_cpu: tuple[int, float] | None = None
    node_mem: int | None = None
    scrape_error: float | None = None
    recognised = 0
    malformed = 0
    fast_limit = _NS_FAST_LIMIT

    for name, c, ns, pod, vt, tt, other in _LINE_RE.findall(text):
        if name:
            # fast path: well-formed container sample in the kubelet's layout
            recognised += 1
            try:
                v = float(vt)
            except ValueError:
                _bump(rejected, "bad_value")
                continue
            if v != v or v == math.inf:
                _bump(rejected, "non_finite")
                continue
            if tt:
                ts = int(tt) / 1000.0
            else:
                ts = now_s
            key = (ns, pod, c)
            if name == _CPU:
                if key in cpu:
                    _bump(rejected, "duplicate")
                    continue
                if v < fast_limit:
                    x = v * 1e9
                    n = round(x)
                    if not abs(x - n) < 0.25:
                        n = seconds_to_ns(vt, v)
                else:
                    n = seconds_to_ns(vt, v)
                cpu[key] = (n, ts)
            elif name == _MEM:
                if key in mem:
                    _bump(rejected, "duplicate")
                    continue
                mem[key] = round(v)
            else:
                if key in start:
                    _bump(rejected, "duplicate")
                    continue
                start[key] = v
            continue
        # everything else: comments, blank lines, other families, unusual layouts
        line = other.strip(" \t")
        if not line or line[0] == "#":
            continue
        c0 = line[0]
        if c0 == "p" and line.startswith("pod_"):
            continue  # pod_* families are not used (the container samples carry the same data)
        try:
            mname, labels, vt, tt = parse_sample_line(line)
        except LineError:
            malformed += 1
            continue
        if mname in (_CPU, _MEM, _START):
            recognised += 1
            ns = labels.get("namespace", "")
            pod = labels.get("pod", "")
            c = labels.get("container", "")
            if not (ns and pod and c):
                _bump(rejected, "missing_label")
                continue
            key = (ns, pod, c)
            table = cpu if mname == _CPU else mem if mname == _MEM else start
            if key in table:
                _bump(rejected, "duplicate")
                continue
        elif mname in (_NODE_CPU, _NODE_MEM):
            recognised += 1
            if (node_cpu if mname == _NODE_CPU else node_mem) is not None:
                _bump(rejected, "duplicate")
                continue
        elif mname in _ERROR_NAMES:
            recognised += 1
            try:
                scrape_error = parse_value(vt)
            except ValueError:
                _bump(rejected, "bad_value")
            continue
        else:
            continue
        v = _check(vt, rejected)
        if v is None:
            continue
        if tt is None:
            ts = now_s
        else:
            try:
                ms = parse_timestamp(tt)
            except ValueError:
                _bump(rejected, "bad_value")
                continue
            if ms <= 0:
                _bump(rejected, "bad_value")
                continue
            ts = ms / 1000.0
        if mname == _CPU:
            cpu[key] = (seconds_to_ns(vt, v), ts)
        elif mname == _MEM:
            mem[key] = round(v)
        elif mname == _START:
            start[key] = v
        elif mname == _NODE_CPU:
            node_cpu = (seconds_to_ns(vt, v), ts)
        else:
            node_mem = round(v)

    if recognised == 0 and malformed:
        raise DecodeError("malformed", f"kubelet response from {node} is not Prometheus text ({malformed} bad lines)")
    if malformed:
        _bump(rejected, "malformed", malformed)

    batch = NodeBatch(node=node, rejected=rejected)
    if node_cpu is not None and node_mem is not None:
        if node_cpu[0] == 0 or node_mem == 0:
            _bump(rejected, "zero_value")
        else:
            batch.node_point = ResourcePoint(0.0, node_cpu[1], node_cpu[0], node_mem)
    elif node_cpu is not None or node_mem is not None:
        _bump(rejected, "incomplete_node")

    pods = batch.pods
    zero_pods: set[tuple[str, str]] = set()
    for key, (n, ts) in cpu.items():
        m = mem.get(key)
        if m is None:
            _bump(rejected, "incomplete_container")
            continue
        ns, pod, c = key
        pk = (ns, pod)
        if n == 0 or m == 0:
            zero_pods.add(pk)
            continue
        containers = pods.get(pk)
        if containers is None:
            containers = pods[pk] = {}
        containers[c] = ResourcePoint(start.get(key, 0.0), ts, n, m)
    for key in mem:
        if key not in cpu:
            _bump(rejected, "incomplete_container")
    for key in start:
        if key not in cpu and key not in mem:
            _bump(rejected, "incomplete_container")
    for pk in zero_pods:
        pods.pop(pk, None)
    if zero_pods:
        _bump(rejected, "zero_value", len(zero_pods))

    if scrape_error is not None and scrape_error != 0:
        if batch.node_point is None and not pods:
            raise DecodeError("kubelet_error", f"kubelet on {node} reported an error getting resource metrics")
        _bump(rejected, "kubelet_error")
    return batch


def decode_summary(node: str, body: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> NodeBatch:
    """Decode a kubelet ``/stats/summary`` JSON body into a :class:`NodeBatch` (see the module docstring)."""
    from kcms.sources.summary_decode import decode_summary as _decode

    return _decode(node, body, max_bytes=max_bytes)
