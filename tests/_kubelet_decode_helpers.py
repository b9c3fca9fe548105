"""Data and builders shared by the kubelet decoder tests (test_kubelet_decode*.py): the recorded
kubelet bodies, the bench body builders, line/body/container builders for /metrics/resource text, and
the sanity check every decoded batch must pass."""

from __future__ import annotations

import math
import pathlib
import sys

from kcms import limits
from kcms.model import NodeBatch
from kcms.sources.bounds import MAX_CPU_NS, MAX_MEMORY_BYTES

__all__ = [
    "CPU",
    "DATA",
    "MEM",
    "RESOURCE",
    "START",
    "SUMMARY",
    "_assert_sane",
    "body",
    "build_resource_body",
    "build_summary_body",
    "container",
    "line",
]

DATA = pathlib.Path(__file__).parent / "data" / "kubelet"
RESOURCE = (DATA / "resource_metrics.txt").read_bytes()
SUMMARY = (DATA / "summary.json").read_bytes()

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "bench"))
from decode import build_resource_body, build_summary_body  # noqa: E402

CPU = "container_cpu_usage_seconds_total"
MEM = "container_memory_working_set_bytes"
START = "container_start_time_seconds"


def line(name: str, container: str, ns: str, pod: str, value: str, ts: str | None = "1700000000123") -> str:
    tail = f" {ts}" if ts is not None else ""
    return f'{name}{{container="{container}",namespace="{ns}",pod="{pod}"}} {value}{tail}\n'


def body(*lines: str, node: bool = True, error: str | None = "0") -> bytes:
    text = "".join(lines)
    if node:
        text += "node_cpu_usage_seconds_total 357.35491 1700000000123\n"
        text += "node_memory_working_set_bytes 1.616273408e+09 1700000000123\n"
    if error is not None:
        text += f"resource_scrape_error {error}\n"
    return text.encode()


def container(
    ns: str = "default",
    pod: str = "p",
    c: str = "c",
    cpu: str = "1.5",
    mem: str = "1024",
    start: str | None = "1.6999e+09",
    ts: str | None = "1700000000123",
) -> list[str]:
    out = [line(CPU, c, ns, pod, cpu, ts), line(MEM, c, ns, pod, mem, ts)]
    if start is not None:
        out.append(line(START, c, ns, pod, start, ts))
    return out


def _assert_sane(batch: NodeBatch) -> None:
    """Everything a decoder may give: within kcms.sources.bounds, never served otherwise."""
    latest = limits.future_limit()
    points = [batch.node_point] if batch.node_point else []
    points += [p for cs in batch.pods.values() for p in cs.values()]
    for p in points:
        assert isinstance(p.cpu_ns, int) and isinstance(p.memory, int)
        assert 0 < p.cpu_ns <= MAX_CPU_NS and 0 < p.memory <= MAX_MEMORY_BYTES
        assert math.isfinite(p.timestamp) and math.isfinite(p.start_time) and p.start_time >= 0
        assert 0 < p.timestamp <= latest
    for (ns, pod), cs in batch.pods.items():
        assert ns and pod and all(cs)
        assert max(len(ns), len(pod), *map(len, cs)) <= 253
    assert all(isinstance(v, int) and v > 0 for v in batch.rejected.values())
