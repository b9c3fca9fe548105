"""A scrape worker process of `kcms standalone --scrape-workers N` (run as
``python -m kcms.collector.worker``; the parent is :mod:`kcms.collector.workers`).

It runs the ordinary scrape loop (:class:`~kcms.collector.scheduler.Collector` over a
:class:`~kcms.collector.kubelet.KubeletClient`) with its own timing, for the nodes the parent
sends it, and streams every decoded :class:`~kcms.model.NodeBatch` back within 20 ms of decoding,
plus a summary per cycle (frames: :mod:`kcms.collector.workerproto`). So a parent busy rendering
a large list never delays a scrape or makes one time out: at worst batches wait in the pipe.

It never talks to the Kubernetes API (the parent lists nodes once for everyone), listens on no
socket, and exits when its stdin closes (the parent stopped or died): no orphans.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Iterable

from kcms import limits
from kcms.collector.kubelet import KubeletClient, KubeletClientConfig
from kcms.collector.scheduler import Collector
from kcms.collector.workerproto import (
    Batch,
    CycleEnd,
    CycleStart,
    FrameError,
    FrameReader,
    Hello,
    Nodes,
    Token,
    ToWorker,
    frame,
)
from kcms.heap import HeapFreezer
from kcms.model import NodeBatch, NodeInfo, PodInfo

log = logging.getLogger("kcms.collector.worker")

# Batches the parent has not read yet, beyond the pipe's own buffer, before new ones are dropped
# (and counted): a parent stuck for a whole cycle at 5000 nodes leaves ~15 MB here.
MAX_UNSENT_BYTES = 64 << 20
PIPE_SIZE = 1 << 20  # asked of Linux for the pipe to the parent (F_SETPIPE_SZ), best effort
FLUSH_DELAY = 0.02  # seconds a decoded batch may wait to be written with the next ones
FLUSH_BYTES = 256 << 10  # ... or until this many bytes are waiting


class PushedInventory:
    """The nodes the parent sent (no pods: the scrape loop needs none)."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeInfo] = {}
        self._synced = False

    def set(self, nodes: Iterable[tuple[str, list[tuple[str, str]], int]]) -> None:
        self._nodes = {
            name: NodeInfo(name, {}, [tuple(a) for a in addrs], port, "") for name, addrs, port in nodes
        }
        self._synced = True

    def has_synced(self) -> bool:
        return self._synced

    nodes_synced = has_synced

    def nodes(self) -> Iterable[NodeInfo]:
        return self._nodes.values()

    def node(self, name: str) -> NodeInfo | None:
        return self._nodes.get(name)

    def pods(self, namespace: str | None = None) -> Iterable[PodInfo]:
        return ()

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        return None


class TimedKubeletClient(KubeletClient):
    """Records how long each successful scrape took (the parent's scrape-duration histogram)."""

    def __init__(self, config: KubeletClientConfig) -> None:
        super().__init__(config)
        self.durations: list[float] = []

    async def scrape(self, node: NodeInfo) -> NodeBatch:
        t0 = time.monotonic()
        batch = await super().scrape(node)
        self.durations.append(time.monotonic() - t0)
        return batch


class Reporter:
    """Sends frames to the parent and tallies what the cycle summary reports.

    Frames are gathered for up to :data:`FLUSH_DELAY` (or :data:`FLUSH_BYTES`) and written
    together: one write, and one wake-up of the parent, for tens of batches instead of one each
    (at 1000 nodes a wake-up per batch cost the parent ~0.1 s of CPU a cycle). A cycle's end
    is written at once."""

    def __init__(self, out: asyncio.WriteTransport) -> None:
        self._out = out
        self._pending = bytearray()
        self._flush: asyncio.TimerHandle | None = None
        self.rejected: dict[str, int] = {}
        self.dropped = 0

    def send(self, msg: Batch | CycleStart | CycleEnd, now: bool = False) -> None:
        self._pending += frame(msg)
        if now or len(self._pending) >= FLUSH_BYTES:
            self.flush()
        elif self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(FLUSH_DELAY, self.flush)

    def flush(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self._pending:
            self._out.write(bytes(self._pending))
            self._pending.clear()

    def sink(self, batch: NodeBatch) -> None:
        """The scrape loop's sink: the batch to the parent (within FLUSH_DELAY)."""
        for reason, n in batch.rejected.items():
            self.rejected[reason] = self.rejected.get(reason, 0) + n
        if self._out.get_write_buffer_size() > MAX_UNSENT_BYTES:
            self.dropped += 1  # the parent has not read for a long while; the next cycle brings it again
            return
        self.send(Batch.of(batch))


class WorkerCollector(Collector):
    """The scrape loop, reporting each cycle's results to the parent."""

    def __init__(self, *args, reporter: Reporter, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._reporter = reporter
        self.failed: list[tuple[str, str]] = []

    async def run_cycle(self, rescrape_after: float | None = None) -> int:
        client: TimedKubeletClient = self.client  # type: ignore[assignment]
        rep = self._reporter
        client.durations = []
        self.failed = []
        started = time.time()
        rep.send(CycleStart(started))
        failures = await super().run_cycle(rescrape_after)
        rep.send(
            CycleEnd(
                started,
                self.last_cycle_seconds,
                len(self._last_success),
                client.durations,
                self.failed,
                rep.rejected,
                rep.dropped,
            ),
            now=True,
        )
        rep.rejected, rep.dropped = {}, 0
        return failures

    def _failed(self, node: str, reason: str, message: str) -> None:  # type: ignore[override]
        self.failed.append((node, reason))
        Collector._failed(node, reason, message)


def _config(hello: Hello, token: list[str | None]) -> KubeletClientConfig:
    fields = dict(hello.kubelet)
    fields["preferred_address_types"] = tuple(fields.get("preferred_address_types", ()))
    fields["max_in_flight"] = hello.max_in_flight
    config = KubeletClientConfig(**fields)
    if hello.dynamic_token:
        config.token_source = lambda: token[0]  # the client asks it at the start of every cycle
    return config


async def run_worker(in_fd: int, out_fd: int) -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(in_fd, "rb", 0))
    try:
        import fcntl

        fcntl.fcntl(out_fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (ImportError, AttributeError, OSError):
        pass  # a smaller pipe only means more, smaller writes
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(out_fd, "wb", 0))

    frames = FrameReader(ToWorker, 1 << 24)

    async def next_frames() -> list | None:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return None
            got = list(frames.feed(data))
            if got:
                return got

    first = await next_frames()
    if not first or not isinstance(first[0], Hello):
        log.error("scrape worker: no Hello frame from the parent; exiting")
        return 2
    hello: Hello = first[0]
    logging.basicConfig(
        level=hello.log_level,
        format=f"%(asctime)s %(levelname).1s [scrape-worker {hello.worker}] %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    limits.configure(max_future_skew=hello.max_future_skew)
    token: list[str | None] = [hello.token]
    client = TimedKubeletClient(_config(hello, token))
    inventory = PushedInventory()
    reporter = Reporter(out)
    collector = WorkerCollector(
        inventory,
        client,
        reporter.sink,
        resolution=hello.resolution,
        timeout=hello.timeout,
        max_in_flight=hello.max_in_flight,
        reporter=reporter,
        # As in the serving process: without it, full collections re-scan the worker's heap (a
        # kept-alive TLS connection per kubelet) over and over; measured at 5000 nodes, the
        # process tree's CPU was 0.064 instead of 0.039 mcore per node.
        on_cycle=HeapFreezer().after_cycle,
    )
    log.info("started: pid %d, worker %d of %d", os.getpid(), hello.worker, hello.workers)
    pending = first[1:]
    collector.start()
    try:
        while True:
            for msg in pending:
                if isinstance(msg, Nodes):
                    inventory.set(msg.nodes)
                elif isinstance(msg, Token):
                    token[0] = msg.token
            pending = await next_frames()
            if pending is None:
                log.info("the parent closed the pipe; exiting")
                return 0
    except FrameError as e:
        log.error("bad frame from the parent (%s); exiting", e)
        return 2
    finally:
        await collector.stop()
        await client.close()
        reporter.flush()
        out.close()


def main() -> int:
    # The frames own fd 1; anything printed by mistake goes to stderr instead of corrupting them.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    # Ctrl-C in a terminal reaches the whole process group: the parent shuts down and closes
    # our stdin, which is how we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname).1s %(name)s: %(message)s")
    return asyncio.run(run_worker(0, out_fd))


if __name__ == "__main__":
    sys.exit(main())
