"""A kubelet body's decoded parts (:class:`Acc`) made into a :class:`kcms.model.NodeBatch`: the
pods (a column at a time when the three container families line up, as they do in the kubelet's
layout), then the screening every reading goes through. Shared by the full decode and the body
templates' path (:mod:`kcms.sources.kubelet_decode`)."""

from __future__ import annotations

import time
from typing import Any

from kcms import limits
from kcms.model import ContainerColumns, DecodeError, NodeBatch, ResourcePoint
from kcms.sources.bounds import MAX_CPU_NS, MAX_MEMORY_BYTES, MAX_NAME_LENGTH, screen_batch, screen_node_point
from kcms.sources.decode_reuse import DecodeReuse, pod_places
from kcms.sources.decode_template import Template
from kcms.sources.kubelet_blocks import CPU_FAMILY as _CPU
from kcms.sources.kubelet_blocks import MEM_FAMILY as _MEM
from kcms.sources.kubelet_blocks import Columns
from kcms.sources.kubelet_blocks import fast_block as _fast_block

_START = "container_start_time_seconds"


def bump(rejected: dict[str, int], reason: str, n: int = 1) -> None:
    rejected[reason] = rejected.get(reason, 0) + n


class Acc:
    """What a decode has gathered so far."""

    __slots__ = (
        "tables",
        "columns",
        "node_cpu",
        "node_mem",
        "scrape_error",
        "recognised",
        "malformed",
        "rejected",
        "now",
        "start_block",
        "names_checked",
        "node",
        "reuse",
        "bounds",
    )

    def __init__(self, now: float, node: str = "", reuse: DecodeReuse | None = None) -> None:
        # family -> (namespace, pod, container) -> cpu (core-ns, timestamp) | memory bytes | start time
        self.tables: dict[str, dict[tuple[str, str, str], Any]] = {_CPU: {}, _MEM: {}, _START: {}}
        # family -> a block decoded by the fast path, not yet turned into a table
        self.columns: dict[str, Columns] = {}
        self.node_cpu: tuple[int, float] | None = None
        self.node_mem: int | None = None
        self.scrape_error: float | None = None
        self.recognised = 0
        self.malformed = 0
        self.rejected: dict[str, int] = {}
        self.now = now
        # the start-time block whose parse was reused (its label columns are only read again if the
        # three families do not line up, see DecodeReuse)
        self.start_block: str | None = None
        # the reused start-time block's names are all within MAX_NAME_LENGTH (checked when remembered)
        self.names_checked = False
        # the node and its DecodeReuse, which keeps where its pods lie (PodPlaces) across scrapes
        self.node = node
        self.reuse = reuse
        # (min, max) of the CPU, memory and timestamp columns, when the C reader gave them
        # (template_batch): the screening then takes no min() or max() of its own
        self.bounds: tuple[Any, ...] | None = None

    def table(self, fam: str) -> dict[tuple[str, str, str], Any]:
        """The family's table, with any fast-path columns merged in (first occurrence wins)."""
        table = self.tables[fam]
        cols = self.columns.pop(fam, None)
        if cols is not None and cols[0] is None and self.start_block is not None:
            cols = _fast_block(self.start_block, fam, self.now)  # a reused parse: the labels again
        if cols is not None:
            namespaces, pods, containers, values, times, _ = cols
            if fam == _CPU:
                values = zip(values, times, strict=False)
            for key, v in zip(zip(namespaces, pods, containers, strict=True), values, strict=False):
                if key in table:
                    bump(self.rejected, "duplicate")
                else:
                    table[key] = v
        return table


def template_batch(
    node: str,
    now: float,
    t: Template,
    reuse: DecodeReuse,
    cpu_ns: list[int],
    times: list[float],
    mem: list[int],
    node_cpu: tuple[int, float] | None,
    node_mem: int | None,
    bounds: tuple[Any, ...] | None = None,
) -> NodeBatch:
    """The batch of a body read from template ``t`` (the numbers read, in series order);
    ``bounds``: the columns' (min, max) as the C reader gives them, or None."""
    acc = Acc(now, node, reuse)
    sig = t.signature
    acc.columns = {
        _CPU: (t.namespaces, t.pods, t.containers, cpu_ns, times, sig),
        _MEM: (t.namespaces, t.pods, t.containers, mem, None, sig),
        _START: (t.namespaces, t.pods, t.containers, t.start, None, sig),
    }
    acc.node_cpu = node_cpu
    acc.node_mem = node_mem
    acc.scrape_error = t.scrape_error
    acc.recognised = t.recognised
    acc.names_checked = True  # every name of a template is within MAX_NAME_LENGTH
    acc.bounds = bounds
    return assemble(node, acc)


def _assemble_aligned(acc: Acc, batch: NodeBatch) -> Columns | None:
    """Build the pods when the three families list the same series in the same order (the usual case).

    Returns the CPU columns the pods were built from (for :func:`_screened_aligned`), or None (and no
    pod) when the general path must do it. With no zero value, the batch gets the columns
    (``NodeBatch.columns``) and its pods are made from them only when read (:class:`kcms.model.PodPlaces`).
    """
    cols = acc.columns
    if len(cols) != 3 or any(acc.tables.values()):
        return None
    cpu, mem, start = cols[_CPU], cols[_MEM], cols[_START]
    namespaces, names, containers, cpu_ns, times, signature = cpu
    if signature != mem[5] or signature != start[5]:
        return None
    reuse = acc.reuse
    places = (
        pod_places(signature, namespaces, names, containers)
        if reuse is None
        else reuse.places(acc.node, start[5], namespaces, names, containers)  # see places()
    )
    if places is None:
        return None  # a duplicate series: let the general path count it
    memory = mem[3]
    columns = ContainerColumns(signature, start[3], times, cpu_ns, memory, places)  # no readings made yet
    bounds = acc.bounds
    if not (0 in (bounds[0], bounds[2]) if bounds is not None else 0 in cpu_ns or 0 in memory):
        # every series is one container of the batch's pods: what the store compares a column at a time
        batch.columns = columns
        batch.pods = None  # type: ignore[assignment]  # made from the columns when read
    else:
        pods = batch.pods
        pods.update(columns.pods())
        zero_pods = {
            pk
            for pk, n, m in zip(zip(namespaces, names, strict=True), cpu_ns, memory, strict=True)
            if n == 0 or m == 0
        }
        for pk in zero_pods:
            del pods[pk]
        bump(acc.rejected, "zero_value", len(zero_pods))
    cols.clear()
    return namespaces, names, containers, cpu_ns, times, memory  # type: ignore[return-value]


def _screened_aligned(
    batch: NodeBatch, cols: Columns, latest: float, names_checked: bool = False, bounds: tuple[Any, ...] | None = None
) -> dict[str, int] | None:
    """:func:`kcms.sources.bounds.screen_batch` for a batch built by :func:`_assemble_aligned`, a column
    at a time: the counts if every container is within the bounds (then only the node point can be
    refused), or None when some container may not be (the caller screens the batch point by point).

    The fast path already made every value a finite number >= 0 and every timestamp positive (or
    ``now``); what is left is the upper bounds and the name lengths (~4 us instead of ~10 for 60
    containers). Zero-value pods were dropped before, as screen_batch sees them. ``names_checked``: the
    names are a reused start-time block's, already checked (the families line up: the same labels).
    ``bounds``: the columns' (min, max) as the C reader gave them (:func:`template_batch`); without
    them they are taken here. (The C reader gives None only for an empty column, and a template's
    columns are all as long as its CPU column, which is not empty here.)
    """
    namespaces, names, containers, cpu_ns, times, memory = cols
    if not cpu_ns:
        return None
    if bounds is None:
        bounds = (None, max(cpu_ns), None, max(memory), min(times), max(times))  # type: ignore[type-var]
    _, max_cpu, _, max_memory, min_time, max_time = bounds
    if not (
        0 < min_time
        and max_time <= latest
        and max_cpu <= MAX_CPU_NS
        and max_memory <= MAX_MEMORY_BYTES
        and (names_checked or max(map(len, containers)) <= MAX_NAME_LENGTH)
        and (names_checked or max(map(len, names)) <= MAX_NAME_LENGTH)
        and (names_checked or max(map(len, namespaces)) <= MAX_NAME_LENGTH)
    ):
        return None
    counts: dict[str, int] = {}
    screen_node_point(batch, latest, counts)
    return counts


def assemble(node: str, acc: Acc) -> NodeBatch:
    rejected = acc.rejected
    if acc.recognised == 0 and acc.malformed:
        raise DecodeError(
            "malformed", f"kubelet response from {node} is not Prometheus text ({acc.malformed} bad lines)"
        )
    if acc.malformed:
        bump(rejected, "malformed", acc.malformed)

    batch = NodeBatch(node=node, rejected=rejected)
    node_cpu, node_mem = acc.node_cpu, acc.node_mem
    if node_cpu is not None and node_mem is not None:
        if node_cpu[0] == 0 or node_mem == 0:
            bump(rejected, "zero_value")
        else:
            batch.node_point = ResourcePoint(0.0, node_cpu[1], node_cpu[0], node_mem)
    elif node_cpu is not None or node_mem is not None:
        bump(rejected, "incomplete_node")

    aligned = _assemble_aligned(acc, batch)
    if aligned is None:
        pods = batch.pods
        cpu, mem, start = acc.table(_CPU), acc.table(_MEM), acc.table(_START)
        zero_pods: set[tuple[str, str]] = set()
        incomplete = 0
        for key, (n, ts) in cpu.items():
            m = mem.get(key)
            if m is None:
                incomplete += 1
                continue
            ns, pod, c = key
            if n == 0 or m == 0:
                zero_pods.add((ns, pod))
                continue
            containers = pods.get((ns, pod))
            if containers is None:
                containers = pods[(ns, pod)] = {}
            containers[c] = ResourcePoint(start.get(key, 0.0), ts, n, m)
        incomplete += sum(1 for key in mem if key not in cpu)
        incomplete += sum(1 for key in start if key not in cpu and key not in mem)
        if incomplete:
            bump(rejected, "incomplete_container", incomplete)
        if zero_pods:
            for pk in zero_pods:
                pods.pop(pk, None)
            bump(rejected, "zero_value", len(zero_pods))

    # Future, absurd or oversized readings are refused one by one (the rest of the node is kept).
    latest = limits.future_limit(max(time.time(), acc.now))
    counts = None if aligned is None else _screened_aligned(batch, aligned, latest, acc.names_checked, acc.bounds)
    if counts is None:
        batch.columns = None  # columns only for a batch whose every container is kept
        counts = screen_batch(batch, latest)
    for reason, n in counts.items():
        bump(rejected, reason, n)
    batch.screened = latest
    if acc.scrape_error is not None and acc.scrape_error != 0:
        if batch.node_point is None and not batch.pods:
            raise DecodeError(
                "kubelet_error", f"kubelet on {node} reported an error getting resource metrics"
            )
        bump(rejected, "kubelet_error")
    return batch
