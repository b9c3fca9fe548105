"""Node metrics from this machine's real /proc, through the buffer's exposition."""

from __future__ import annotations

import os
import time

import psutil
from test_agent_buffer import parse_agent_text

from kcms.agent.buffer import SampleBuffer
from kcms.agent.node import NodeSource
from kcms.model import ObjectRef

NODE = ObjectRef("nodes", "", "this-node")


def read(source: NodeSource, now: float) -> dict[tuple[str, tuple], float]:
    b = SampleBuffer()
    assert b.add_many(source.collect(now)) > 0
    types, samples = parse_agent_text(b.render().decode())
    assert types["node_cpu_seconds_total"] == "counter" and types["node_load1"] == "gauge"
    assert {o for _, o, _, _, _ in samples} == {NODE}
    return {(m, lb): v for m, _, lb, v, _ in samples}


def test_node_values_are_present_plausible_and_counters_monotonic() -> None:
    source = NodeSource("this-node")
    first = read(source, time.time())
    # burn a little CPU and I/O so that counters have a reason to move
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    second = read(source, time.time() + 1)
    assert source.errors == 0

    for name in ("node_load1", "node_load5", "node_load15"):
        assert 0 <= first[(name, ())] < 10 * (os.cpu_count() or 1) + 100
    total = first[("node_memory_total_bytes", ())]
    assert total == psutil.virtual_memory().total > 64 << 20
    assert 0 < first[("node_memory_available_bytes", ())] <= total
    assert first[("node_memory_used_bytes", ())] == total - first[("node_memory_available_bytes", ())]

    modes = {dict(lb)["mode"] for m, lb in first if m == "node_cpu_seconds_total"}
    assert {"user", "system", "idle"} <= modes
    user = ("node_cpu_seconds_total", (("mode", "user"),))
    assert first[user] > 0
    interfaces = {dict(lb)["interface"] for m, lb in first if m == "node_network_receive_bytes_total"}
    assert "lo" in interfaces
    assert any(m == "node_disk_read_bytes_total" for m, _ in first) == bool(
        psutil.disk_io_counters(perdisk=True)
    )

    counters = [k for k in first if k[0].endswith("_total")]
    assert len(counters) >= 5
    for key in counters:
        assert second[key] >= first[key], key
    busy = sum(second[k] - first[k] for k in second if k[0] == "node_cpu_seconds_total")
    assert busy > 0  # at least some CPU time passed between the reads
