"""What moving scrapes into worker processes (`kcms standalone --scrape-workers N`) costs and saves.

Batches are real: simulated kubelets' ``/metrics/resource`` bodies (``--pods`` pods x
``--containers`` containers a node) decoded by the real decoder. Printed, per batch and per cycle
of ``--nodes`` nodes:

* decode of the kubelet text (the work a worker takes off the serving process), for reference;
* encode of a frame (worker side) and decode of it back into a NodeBatch (parent side), and the
  frame's size;
* the parent's CPU to receive a whole cycle through a real pipe from a real child process (asyncio
  subprocess protocol, the same frame reader the parent uses), the child writing each frame on its
  own (a wake-up of the parent per batch) or 40 at a time (what the worker's 20 ms gathering gives).

Run: ``python bench/scrape_ipc.py [--nodes 5000] [--pods 30] [--containers 2] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from kcms.collector.workerproto import Batch, FrameReader, FromWorker, frame
from kcms.sim.kubelet import render_resource_metrics
from kcms.sim.workload import generate_nodes, node_addresses
from kcms.sources.kubelet_decode import decode_resource_metrics

GROUPS = (1, 40)  # frames a worker writes at once: 1 each, or what 20 ms of scrapes gather at 5000 nodes
DISTINCT = 50  # distinct nodes generated; the cycle repeats them (the costs do not depend on names)

# The child writes the cycle in writes of --group frames, pausing 0.3 ms between writes (scrapes
# finish one by one): --group 1 is a write, and a wake-up of the parent, per batch.
_CHILD = r"""
import os, struct, sys, time
group = int(sys.argv[1])
data = sys.stdin.buffer.read()
out = os.fdopen(1, "wb", 0)
view = memoryview(data)
pos, n, start = 0, 0, 0
while pos < len(data):
    pos += 4 + struct.unpack_from(">I", data, pos)[0]
    n += 1
    if n % group == 0 or pos == len(data):
        out.write(view[start:pos])
        start = pos
        time.sleep(0.0003)
"""


def batches(nodes: int, pods: int, containers: int):
    sim = generate_nodes(
        nodes=DISTINCT,
        pods_per_node=pods,
        containers_per_pod=(containers, containers),
        seed=7,
        now=time.time() - 3600,
        addresses=node_addresses("127.60.0.1", DISTINCT),
        ports=[10250] * DISTINCT,
        restart_every=None,
    )
    now = time.time()
    bodies = [(n.name, render_resource_metrics(n, now)) for n in sim]
    t0 = time.process_time()
    decoded = [decode_resource_metrics(name, body) for name, body in bodies]
    decode_us = (time.process_time() - t0) / len(bodies) * 1e6
    return [decoded[i % DISTINCT] for i in range(nodes)], decode_us


def encode_decode(cycle) -> tuple[float, float, int, bytes]:
    t0 = time.process_time()
    frames = [frame(Batch.of(b)) for b in cycle]
    encode = time.process_time() - t0
    stream = b"".join(frames)
    reader = FrameReader(FromWorker, 16 << 20)
    (first,) = [m.node_batch() for m in reader.feed(frames[0])]
    assert first == cycle[0]
    # Each batch is dropped as soon as it is decoded: the store keeps (and drops) the same objects
    # whether they come from a pipe or from an in-process decode.
    t0 = time.process_time()
    got = 0
    for i in range(0, len(stream), 256 << 10):  # the pipe transport's read size
        got += sum(1 for m in reader.feed(stream[i : i + (256 << 10)]) if m.node_batch())
    decode = time.process_time() - t0
    assert got == len(cycle)
    return encode, decode, len(stream), stream


class _Proto(asyncio.SubprocessProtocol):
    def __init__(self, done: asyncio.Future) -> None:
        self.reader = FrameReader(FromWorker, 16 << 20)
        self.frames = 0
        self.done = done

    def pipe_data_received(self, fd: int, data: bytes) -> None:  # fd 1: stderr is not a pipe
        self.frames += sum(1 for _ in self.reader.feed(data))

    def process_exited(self) -> None:
        pass

    def connection_lost(self, exc) -> None:
        self.done.set_result(None)


async def through_pipe(stream: bytes, expect: int, group: int) -> tuple[float, float]:
    """(parent CPU seconds, wall seconds) to receive and decode ``stream`` from a child process."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    transport, proto = await loop.subprocess_exec(
        lambda: _Proto(done),
        sys.executable,
        "-c",
        _CHILD,
        str(group),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=None,
    )
    await asyncio.sleep(0.3)  # let it start before we measure
    cpu0, wall0 = time.process_time(), time.perf_counter()
    stdin = transport.get_pipe_transport(0)
    stdin.write(stream)
    stdin.close()
    await done
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    transport.close()
    assert proto.frames == expect, (proto.frames, expect)
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=30)
    ap.add_argument("--containers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    cycle, decode_text_us = batches(a.nodes, a.pods, a.containers)
    n = len(cycle)
    print(f"{n} nodes x {a.pods} pods x {a.containers} containers a cycle")
    print(f"kubelet text decode (moved off the serving process): {decode_text_us:.0f} µs/batch, "
          f"{decode_text_us * n / 1e3:.0f} ms/cycle")  # fmt: skip
    enc, dec = [], []
    pipe_cpu: dict[int, list[float]] = {g: [] for g in GROUPS}
    stream = b""
    for _ in range(a.repeat):
        e, d, size, stream = encode_decode(cycle)
        enc.append(e)
        dec.append(d)
        for group in GROUPS:
            cpu, _wall = asyncio.run(through_pipe(stream, n, group))
            pipe_cpu[group].append(cpu)

    def show(what: str, secs: list[float]) -> None:
        lo, med, hi = min(secs), statistics.median(secs), max(secs)
        print(
            f"{what}: {med / n * 1e6:.1f} µs/batch ({lo / n * 1e6:.1f}-{hi / n * 1e6:.1f}), {med * 1e3:.0f} ms/cycle"
        )

    print(f"frame size: {len(stream) / n:.0f} bytes/batch, {len(stream) / 1e6:.1f} MB/cycle")
    show("encode (worker)", enc)
    show("decode (parent)", dec)
    for group in GROUPS:
        show(
            f"parent CPU to receive a cycle from a child writing {group} frame(s) at a time", pipe_cpu[group]
        )


if __name__ == "__main__":
    main()
