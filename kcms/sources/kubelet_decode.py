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
  ``malformed`` (a line that is not a sample line, or not UTF-8), ``metric_name_too_long`` (a line of another
  family whose name is over 253 characters: skipped as every other family is, but counted).
* The bounds of :mod:`kcms.sources.bounds` (both decoders): a reading more than ``--max-future-skew``
  ahead (``future_timestamp``), a CPU counter or memory beyond any machine (``absurd_value``), a
  namespace, pod or container name over 253 characters (``label_value_too_long``). A refused
  container drops its pod (never a partial pod sum); the node's reading and the other pods are kept.
  Only the response's structure can fail it as a whole, never one sample.
* Whole-response failures raise :class:`kcms.model.DecodeError`: ``too_large`` (body over ``max_bytes``),
  ``malformed`` (no UTF-8 line, empty, or no recognised sample and at least one malformed line),
  ``kubelet_error`` (``resource_scrape_error``/``scrape_error`` is 1 and nothing usable was decoded; if some
  data was usable it is returned and ``rejected["kubelet_error"]`` is 1).

Speed (this is the hot path: 1000 nodes x 30 pods x 2 containers every 15 s). The kubelet writes each
family as one contiguous block of lines with labels sorted (container, namespace, pod) and no escapes.
Each container family's block is found with ``str.find``/``rfind`` and decoded all at once with C-level
string operations (one ``split('"')`` of the block, slicing, ``map(float, ...)``), checked strictly, and
kept as columns; when the three families list the same series in the same order (the usual case) the
points are assembled by position: where each pod's containers lie is worked out once for a node's series
(:class:`kcms.model.PodPlaces`, kept by :class:`DecodeReuse`) and the batch's pod dicts are made only if
read (the store's usual path reads the columns: 243 -> 211 us a template decode in a loop). Any block that
is not exactly in that layout (escapes, other label order, a bad value, a duplicate, ...) is read line by
line with the strict general parser (:func:`kcms.sources.promtext.parse_sample_line`), which gives the
same result for good lines and the per-sample rejections for bad ones (a property test checks both paths
agree on mutated bodies). ``pod_*`` blocks are skipped as a whole. The bounds are checked a column at a
time on that path (maxima and minima of the columns; point by point with
:func:`kcms.sources.bounds.screen_batch` only if one is off).

Across scrapes (:class:`DecodeReuse`, one per ``KubeletClient``): a node's ``container_start_time_seconds``
block that is the same text as at its last scrape (or the same but for one timestamp common to all its
lines) is not parsed again; its previous parse is used, with the same result. Bounded, per node, forgotten
when the node is not scraped for a whole cycle.

Whole bodies (:mod:`kcms.sources.decode_template`, in clusters of up to 16384 nodes): a node's body that is
its last clean body with other numbers in the same places is checked against that template in C, on the
bytes as received, before any UTF-8 decoding (``bytes.split``, one tuple hash), and only its numbers are
converted, all in one call of msgspec's JSON number reader, which rounds as ``float()`` does (211 -> 179
us; a token outside JSON's number syntax sends them all through ``float()``); the batch is then assembled
and screened exactly as for a full decode (:func:`_from_template`). Anything else is decoded in full.
``bench/scrape_cpu.py`` (simulator bodies, 50 nodes): decode 209-217 -> 160-164 us a body (23 Nov);
checked as bytes instead of text, 265-279 -> 227-244 us (26 Nov, a slower machine).

A batch made here carries the future limit it was screened against (``NodeBatch.screened``), so that
the store does not screen it again (~40 us a node of 60 containers).

``python bench/decode.py`` (30 pods x 2 containers, 259 lines, best of several runs, 2 shared cores):
155-165 us a body with timestamps, 132-137 without (prometheus_client's parser: ~3200 / ~3050 us);
``/stats/summary`` of the same size ~144 us; a plain line-by-line parser ~250 us.
"""

from __future__ import annotations

import math
import time
from itertools import repeat
from operator import mul, sub, truediv
from typing import Any

import msgspec

from kcms import limits
from kcms.model import DecodeError, NodeBatch
from kcms.sources.decode_batch import Acc, assemble, bump, template_batch
from kcms.sources.decode_reuse import DecodeReuse
from kcms.sources.decode_template import Template, build
from kcms.sources.exposition import utf8_lines
from kcms.sources.kubelet_blocks import CPU_FAMILY as _CPU
from kcms.sources.kubelet_blocks import MEM_FAMILY as _MEM
from kcms.sources.kubelet_blocks import NS_FAST_LIMIT as _NS_FAST_LIMIT
from kcms.sources.kubelet_blocks import NUM_BYTES as _NUM_BYTES
from kcms.sources.kubelet_blocks import fast_block as _fast_block
from kcms.sources.kubelet_blocks import find_block as _find_block
from kcms.sources.kubelet_blocks import seconds_to_ns
from kcms.sources.kubelet_blocks import seconds_to_ns_each as _seconds_to_ns_each
from kcms.sources.promtext import LineError, parse_sample_line, parse_timestamp, parse_value
from kcms.sources.summary_decode import decode_summary as _decode_summary

try:  # the template path in C (kcms/sources/_bodyscan.c); Template.scan is None without it
    from kcms.sources._bodyscan import read as _scan_read
except ImportError:  # pragma: no cover - exercised by installs without a C compiler
    _scan_read = None

__all__ = ["DEFAULT_MAX_BYTES", "DecodeReuse", "decode_resource_metrics", "decode_summary", "seconds_to_ns"]

DEFAULT_MAX_BYTES = 10 * 1024 * 1024

_START = "container_start_time_seconds"
_NODE_CPU = "node_cpu_usage_seconds_total"
_NODE_MEM = "node_memory_working_set_bytes"
_ERROR_NAMES = ("resource_scrape_error", "scrape_error")
_UNLABELED = frozenset((_NODE_CPU, _NODE_MEM, *_ERROR_NAMES))
_NO_LABELS: dict[str, str] = {}

_FAMILIES = (_CPU, _MEM, _START)
_SKIPPED = ("pod_cpu_usage_seconds_total", "pod_memory_working_set_bytes")  # unused, skipped as blocks
# the blocks looked for, in the kubelet's (alphabetical) order, with the start of their first line
_HEADS = tuple((f, f + '{container="') for f in _FAMILIES) + tuple((f, f + '{namespace="') for f in _SKIPPED)


def _slow_lines(text: str, acc: Acc) -> None:
    """Decode lines one at a time with the strict general parser."""
    rejected = acc.rejected
    for line in text.split("\n"):
        if not line:
            continue
        c0 = line[0]
        if c0 == "#" or (c0 == "p" and line.startswith("pod_")):
            continue  # pod_* families are not used (the container samples carry the same data)
        if c0 == " " or c0 == "\t":
            line = line.strip(" \t")
            if not line or line[0] == "#":
                continue
        parts = line.split(" ")
        if 2 <= len(parts) <= 3 and parts[0] in _UNLABELED and "" not in parts and "\t" not in line:
            # "name value [timestamp]" (node and error gauges): no need for the general parser
            name, vt, tt, labels = parts[0], parts[1], parts[2] if len(parts) == 3 else None, _NO_LABELS
        else:
            try:
                name, labels, vt, tt = parse_sample_line(line)
            except LineError:
                acc.malformed += 1
                continue
        if name in acc.tables:
            acc.recognised += 1
            ns = labels.get("namespace", "")
            pod = labels.get("pod", "")
            c = labels.get("container", "")
            if not (ns and pod and c):
                bump(rejected, "missing_label")
                continue
            key = (ns, pod, c)
            table = acc.table(name)
            if key in table:
                bump(rejected, "duplicate")
                continue
        elif name == _NODE_CPU or name == _NODE_MEM:
            acc.recognised += 1
            if (acc.node_cpu if name == _NODE_CPU else acc.node_mem) is not None:
                bump(rejected, "duplicate")
                continue
        elif name in _ERROR_NAMES:
            acc.recognised += 1
            try:
                acc.scrape_error = parse_value(vt)
            except ValueError:
                bump(rejected, "bad_value")
            continue
        else:
            if len(name) > limits.MAX_METRIC_NAME_LENGTH:
                bump(rejected, limits.METRIC_NAME_TOO_LONG)  # unused, but say a kubelet sends it
            continue  # another family
        try:
            v = parse_value(vt)
            ms = None if tt is None else parse_timestamp(tt)
        except ValueError:
            bump(rejected, "bad_value")
            continue
        if not math.isfinite(v):
            bump(rejected, "non_finite")
            continue
        if v < 0:
            bump(rejected, "negative")
            continue
        if ms is not None and ms <= 0:
            bump(rejected, "bad_value")
            continue
        ts = acc.now if ms is None else ms / 1000.0
        if name == _CPU:
            table[key] = (seconds_to_ns(vt, v), ts)
        elif name == _MEM:
            table[key] = round(v)
        elif name == _START:
            table[key] = v
        elif name == _NODE_CPU:
            acc.node_cpu = (seconds_to_ns(vt, v), ts)
        else:
            acc.node_mem = round(v)


def decode_resource_metrics(
    node: str,
    body: bytes,
    *,
    now: float | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    reuse: DecodeReuse | None = None,
) -> NodeBatch:
    """Decode a kubelet ``/metrics/resource`` body into a :class:`NodeBatch` (see the module docstring).

    ``now`` (seconds since the epoch, default ``time.time()``) is the timestamp of samples without one.
    ``reuse``: the caller's :class:`DecodeReuse` (one per scraper), to skip re-reading an unchanged
    start-time block; the result is the same with or without it.
    Raises :class:`DecodeError` for a response that cannot be used at all.
    """
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise DecodeError("malformed", f"kubelet response from {node} is not bytes")
    if len(body) > max_bytes:
        raise DecodeError("too_large", f"kubelet response from {node} is {len(body)} bytes, over {max_bytes}")
    now_ = time.time() if now is None else float(now)
    if reuse is not None and type(body) is bytes:
        # the body's bytes against the node's template, before any decoding (decode_template.py)
        template = reuse.templates.get(node)
        if template is not None:
            batch = _from_template(node, body, now_, template, reuse)
            if batch is not None:
                reuse.templates.hits += 1
                template.uses += 1
                reuse.touch(node)
                return batch
            reuse.templates.drop(node, template)
    not_utf8 = 0
    try:
        text = str(body, "utf-8")
    except UnicodeDecodeError as e:
        # One bad line costs that line (counted as malformed), not the node's every other reading.
        text, not_utf8 = utf8_lines(bytes(body))
        if not text or text.isspace():
            raise DecodeError("malformed", f"kubelet response from {node} is not UTF-8 text: {e}") from None
    crlf = "\r" in text
    if crlf:
        text = text.replace("\r\n", "\n")
    if not text or text.isspace():
        raise DecodeError("malformed", f"kubelet response from {node} is empty")
    acc = Acc(now_, node, reuse)
    acc.malformed = not_utf8

    spans = []
    hint = 0
    for fam, head in _HEADS:
        span = _find_block(text, head, hint)
        if span is not None:
            spans.append((span[0], span[1], fam))
            hint = span[1]
    spans.sort()
    pos = 0
    for s, e, fam in spans:
        if s < pos:
            # interleaved families (not valid exposition): no fast path at all
            acc = Acc(acc.now, node, reuse)
            acc.malformed = not_utf8
            _slow_lines(text, acc)
            break
        if pos < s:
            _slow_lines(text[pos:s], acc)
        if fam in _SKIPPED:
            # skip the whole span if every line in it is of this (unused) family
            if text.count("\n", s, e) != text.count("\n" + fam + "{", s, e):
                _slow_lines(text[s:e], acc)
            pos = e
            continue
        block = text[s:e]
        if acc.tables[fam]:
            cols = None
        elif fam == _START and reuse is not None:
            found = reuse.lookup(node, block)
            if found is not None:
                cols, acc.names_checked = found
                acc.start_block = block
            else:
                cols = _fast_block(block, fam, acc.now)
                if cols is not None:
                    reuse.remember(node, block, cols)
        else:
            cols = _fast_block(block, fam, acc.now)
        if cols is None:
            _slow_lines(block, acc)
        else:
            acc.columns[fam] = cols
            acc.recognised += len(cols[3])
        pos = e
    else:
        if pos < len(text):
            _slow_lines(text[pos:], acc)
    batch = assemble(node, acc)
    if (
        reuse is not None
        and type(body) is bytes
        and not (batch.rejected or not_utf8 or crlf)
        and reuse.templates.want(node)
    ):
        reuse.templates.put(node, build(text))  # a template of the text is one of these very bytes
    return batch


_ZERO = ord("0")
_NUM_BYTES_AND_COMMA = _NUM_BYTES + b","
_DIGITS_AND_BLANK = b"0123456789 "
_JSON_FLOATS = msgspec.json.Decoder(list[float])


def _from_template(node: str, body: bytes, now: float, t: Template, reuse: DecodeReuse) -> NodeBatch | None:
    """The batch of ``body`` if it is ``t``'s body with other valid numbers (None: decode it in
    full); built by :func:`_assemble` from the template's columns, as a full decode builds it
    from the fast path's (see kcms/sources/decode_template.py). The numbers are bytes here:
    ``float`` and ``int`` read them as they read text. C reads them first where it can
    (kcms/sources/_bodyscan.c: the same checks and values, ~30 against ~100 us a body); a body it
    leaves (False: a number it refuses, or in a spelling or size it does not read) is read here."""
    if t.scan is not None:
        got = _scan_read(body, *t.scan)  # type: ignore[misc]
        if got is None:
            return None
        if got is not False:
            # read_node: [cpu ns, seconds or None, bytes] or None; bounds: (min, max) of each column
            cpu_ns, times, mem, read_node, bounds = got
            node_cpu = node_mem = None
            if read_node is not None:
                node_cpu = (read_node[0], now if read_node[1] is None else read_node[1])
                node_mem = read_node[2]
            if not t.stamped:
                times = [now] * t.n
                bounds = bounds[:4] + ((now, now) if t.n else (None, None))
            return template_batch(node, now, t, reuse, cpu_ns, times, mem, node_cpu, node_mem, bounds)
    vt = t.numbers(body)
    # an empty token (a line ending "V " keeps the token count) is no number either
    if vt is None or b"" in vt:
        return None
    # one join serves the character check and the JSON array read below; a comma inside a token
    # passes the check but makes an element of its own (or no JSON), so the count is checked there
    joined = b",".join(vt)
    if joined.translate(None, _NUM_BYTES_AND_COMMA):
        return None
    n = t.n
    cv = vt[:n]
    if t.stamped:
        tss = vt[n : 2 * n] + vt[3 * n : 5 * n]
        rest = vt[5 * n :]
    else:
        tss = ()
        rest = vt[2 * n :]
    if t.node_stamped:
        tss += rest[1::2]
    if tss:
        stamps = b" ".join(tss)  # digits only, none with a leading zero, at most 18 each
        if stamps.translate(None, _DIGITS_AND_BLANK) or stamps[0] == _ZERO or b" 0" in stamps:
            return None
        if max(map(len, tss)) > 18:
            return None
    try:
        # every token at once, in C (~15 us against ~45 for float() token by token, 60 containers);
        # msgspec rounds as float() does, and reads "-0" as 0.0, which every use below rounds alike
        values: list[float] = _JSON_FLOATS.decode(b"[" + joined + b"]")
    except msgspec.DecodeError:
        # not all JSON numbers ("1.", "+1", out of range): float() reads each as it reads text (the
        # timestamps among them are digits, checked above, so only a value can fail)
        try:
            values = list(map(float, vt))
        except ValueError:
            return None
    if len(values) != len(vt):
        return None  # a comma inside a token: its own element (float() refuses it too)
    cpu = values[:n]
    mem = values[2 * n : 3 * n] if t.stamped else values[n : 2 * n]
    node_values = values[len(vt) - len(rest) :: 2 if t.node_stamped else 1]
    if not (0.0 <= min(cpu) and max(cpu) < math.inf and 0.0 <= min(mem) and max(mem) < math.inf):
        return None  # also false for NaN
    if node_values and not (0.0 <= min(node_values) and max(node_values) < math.inf):
        return None
    if max(cpu) < _NS_FAST_LIMIT:
        xs = list(map(mul, cpu, repeat(1e9)))
        cpu_ns: list[Any] = list(map(round, xs))
        if max(map(abs, map(sub, xs, cpu_ns))) >= 0.25:
            cpu_ns = _seconds_to_ns_each(list(cv), cpu)
    else:
        cpu_ns = _seconds_to_ns_each(list(cv), cpu)
    times = list(map(truediv, values[n : 2 * n], repeat(1000.0))) if t.stamped else [now] * n
    node_cpu = node_mem = None
    if t.node:
        node_cpu = (seconds_to_ns(rest[0], node_values[0]), int(rest[1]) / 1000.0 if t.node_stamped else now)
        node_mem = round(node_values[1])
    return template_batch(node, now, t, reuse, cpu_ns, times, list(map(round, mem)), node_cpu, node_mem)


def decode_summary(node: str, body: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> NodeBatch:
    """Decode a kubelet ``/stats/summary`` JSON body into a :class:`NodeBatch`.

    See :mod:`kcms.sources.summary_decode`; raises :class:`DecodeError` if the body cannot be used at all.
    """
    return _decode_summary(node, body, max_bytes=max_bytes)
