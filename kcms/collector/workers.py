"""Scrape worker processes for `kcms standalone --scrape-workers N` (the parent's side).

With N >= 1 the serving process scrapes no kubelet itself: N child processes
(``python -m kcms.collector.worker``, :mod:`kcms.collector.worker`) each run the ordinary scrape
loop with its own timing for its shard of the nodes (crc32 of the node name mod N), so a parent
busy rendering a 150 000-pod list for seconds never delays a scrape or makes one time out, and
decoding (TLS, HTTP, the Prometheus text) runs on another core.

parent -> worker (its stdin): the kubelet client settings, resolution, timeout, max in flight
(divided among the workers), then its nodes whenever the inventory changes (compared each second,
sent on change) and the kubelet bearer token whenever it changes (the parent keeps reading the
kubeconfig's token or token file; the worker never lists or calls the Kubernetes API).
worker -> parent (its stdout): each :class:`~kcms.model.NodeBatch` as soon as it is decoded, fed
to the sink (``ResourceStore.store``), and a summary per cycle, from which the parent keeps
``kcms_kubelet_scrape_*``, ``kcms_scrape_cycle_*``, ``kcms_kubelet_nodes_missing`` and the
``nodes-scraped`` readiness detail exactly as the in-process :class:`Collector` does. The sink's
after-cycle work (``on_cycle``) runs once per round, when every running worker has ended a cycle.

A worker that exits (or is killed) is restarted (logged, ``kcms_scrape_worker_restarts_total``),
after a back-off if it keeps dying young; its nodes are scraped again by the new process's first
cycle. A worker that starts no cycle for 2 resolutions plus the timeout is killed and restarted.
What a worker sends is checked like any input: frames are bounded and typed (a bad frame kills
it), a batch for a node outside its shard is dropped and counted, metric labels it names are
checked. The parent's shutdown closes the workers' stdin (they exit on EOF), then kills any left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

from prometheus_client import Counter, Gauge

import kcms
from kcms import limits
from kcms.collector.kubelet import KubeletClientConfig
from kcms.collector.scheduler import (
    CYCLE_DURATION,
    LAST_CYCLE,
    MISSING,
    REJECTED,
    SCRAPE_DURATION,
    SCRAPE_FAILURES,
    SCRAPES,
    Collector,
)
from kcms.collector.status import ScrapeStatus
from kcms.collector.workerproto import (
    MIN_MAX_FRAME,
    Batch,
    CycleEnd,
    CycleStart,
    FrameError,
    FrameReader,
    FromWorker,
    Hello,
    Nodes,
    Token,
    WireNodeInfo,
    frame,
)
from kcms.model import Inventory, NodeBatch, NodeInfo
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

MAX_WORKERS = 64
FEED_INTERVAL = 1.0  # seconds between looks at the inventory (and the token) for changes
STOP_GRACE = 5.0  # seconds a worker has to exit after its stdin closes, before it is killed
_LABEL = re.compile(r"[a-z0-9_]{1,64}")  # a reason label a worker may name

RESTARTS = Counter(
    "kcms_scrape_worker_restarts_total",
    "Scrape worker processes restarted, by reason (exited: it died or was killed; protocol: it sent "
    "a malformed frame; stuck: it started no cycle for two resolutions plus the timeout).",
    ["reason"],
)
WORKER_PID = Gauge("kcms_scrape_worker_pid", "Process id of each running scrape worker.", ["worker"])
WORKERS = Gauge(
    "kcms_scrape_workers", "Scrape worker processes (0: kubelets scraped in the serving process)."
)
REFUSED_BATCHES = Counter(
    "kcms_scrape_worker_refused_batches_total",
    "Node batches from a scrape worker for a node not (or no longer) in its shard, dropped.",
)
DROPPED_BATCHES = Counter(
    "kcms_scrape_worker_dropped_batches_total",
    "Node batches a scrape worker dropped because this process had not read its pipe for too long.",
)
for _reason in ("exited", "protocol", "stuck"):
    RESTARTS.labels(_reason)


def shard_of(name: str, workers: int) -> int:
    """The worker that scrapes node ``name``: stable across restarts and processes."""
    return zlib.crc32(name.encode()) % workers


def _wire(node: NodeInfo) -> WireNodeInfo:
    return (node.name, node.addresses, node.kubelet_port)


def _worker_env() -> dict[str, str]:
    """Our environment, with this package's directory first on the path (so that
    ``-m kcms.collector.worker`` runs this very code whatever the working directory)."""
    env = dict(os.environ)
    root = str(Path(kcms.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


class _Worker:
    """One worker slot: the current process (if any) and what it was sent."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.transport: asyncio.SubprocessTransport | None = None
        self.stdin: asyncio.WriteTransport | None = None
        self.pid = 0
        self.reader: FrameReader | None = None
        self.finished = asyncio.Event()
        self.kill_reason = ""
        self.running = False  # a process is up and may send
        self.shard: list[WireNodeInfo] | None = None
        self.names: frozenset[str] = frozenset()
        self.spawned = 0.0  # monotonic
        self.fed_at = 0.0  # monotonic time the current process got its first node list
        self.last_cycle_started = 0.0  # monotonic; of any of this slot's processes

    def send(self, msg) -> None:
        if self.stdin is not None and not self.stdin.is_closing():
            self.stdin.write(frame(msg))


class _Protocol(asyncio.SubprocessProtocol):
    def __init__(self, pool: ScrapeWorkers, worker: _Worker) -> None:
        self.pool, self.worker = pool, worker

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self.pool._received(self.worker, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.worker.finished.set()


class ScrapeWorkers:
    """The scrape loop of :class:`~kcms.collector.scheduler.Collector` (same interface: start,
    stop, healthy, missing_nodes, missing_check, cycles, ...) run by ``workers`` child processes."""

    def __init__(
        self,
        inventory: Inventory,
        config: KubeletClientConfig,
        sink: Callable[[NodeBatch], None],
        *,
        workers: int,
        resolution: float = 15.0,
        timeout: float | None = None,
        max_in_flight: int = 200,
        node_filter: Callable[[NodeInfo], bool] | None = None,
        on_cycle: Callable[[], None] | None = None,
    ) -> None:
        if not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"workers must be 1 to {MAX_WORKERS}")
        self.inventory = inventory
        self.config = config
        self.sink = sink
        self.resolution = resolution
        self.timeout = timeout if timeout is not None else 0.9 * resolution
        self.max_in_flight = max(1, math.ceil(max_in_flight / workers))
        self.node_filter = node_filter
        self.on_cycle = on_cycle
        self.max_frame = max(MIN_MAX_FRAME, 2 * config.max_body_bytes)
        self.workers = [_Worker(i) for i in range(workers)]
        self.command = [sys.executable, "-m", "kcms.collector.worker"]  # what each worker runs
        self._tasks: list[asyncio.Task] = []
        self._wire: list[WireNodeInfo] | None = None
        self._token: str | None = None
        self._last_success: dict[str, float] = {}
        self.status = ScrapeStatus()  # per node: last success, last error, failures in a row
        self._round: dict[int, tuple[float, int]] = {}  # worker -> (cycle seconds, failures)
        self.last_cycle_started = 0.0
        self.cycles = 0
        self.last_cycle_seconds = 0.0
        self.last_cycle_failures = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._tasks:
            return
        WORKERS.set(len(self.workers))
        self._token = self._current_token()
        self._tasks = [asyncio.create_task(self._feed(), name="kcms-scrape-workers-feed")]
        self._tasks += [
            asyncio.create_task(self._supervise(w), name=f"kcms-scrape-worker-{w.index}")
            for w in self.workers
        ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            await cancel_and_wait(task)
        live = [w for w in self.workers if w.transport is not None]
        for w in live:
            w.running = False
            if w.stdin is not None:
                w.stdin.close()  # the worker exits when its stdin closes
        if live:
            _, late = await asyncio.wait(
                [asyncio.ensure_future(w.finished.wait()) for w in live], timeout=STOP_GRACE
            )
            for task in late:
                task.cancel()
        for w in live:
            if not w.finished.is_set():
                log.warning("scrape worker %d (pid %d) did not exit; killing it", w.index, w.pid)
            self._close(w)
        for w in live:  # kill() above: the exit comes within moments
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(w.finished.wait(), 2.0)

    def _close(self, w: _Worker) -> None:
        if w.transport is not None:
            w.transport.close()  # kills the process if it still runs
        w.transport = w.stdin = None
        w.running = False
        if w.pid:
            with contextlib.suppress(KeyError):  # already removed
                WORKER_PID.remove(str(w.index))
        w.pid = 0

    def healthy(self) -> tuple[bool, str]:
        """Liveness: every worker slot started a cycle recently (a stuck worker is killed and
        restarted well before this fails; a worker that keeps failing to start makes it fail)."""
        if not self._tasks or any(t.done() for t in self._tasks):
            return False, "scrape workers are not running"
        if self._wire is None:
            return True, "waiting for the first cycle"
        now = time.monotonic()
        limit = 2 * (2 * self.resolution + self.timeout)
        for w in self.workers:
            since = max(w.last_cycle_started, self._fed_at)
            if now - since > limit:
                return (
                    False,
                    f"scrape worker {w.index}: no cycle started for {now - since:.1f}s (limit {limit:.1f}s)",
                )
        return True, "ok"

    # the same rule and report as in-process scraping (both read _last_success, resolution, timeout)
    missing_nodes = Collector.missing_nodes
    missing_check = Collector.missing_check

    # -- the parent's loops ------------------------------------------------------------------

    _fed_at = 0.0  # monotonic time the first node list was sent

    async def _feed(self) -> None:
        """Send each worker its shard of the inventory, and the token, when they change."""
        while not self.inventory.nodes_synced():  # noqa: ASYNC110 (the Inventory protocol has no event)
            await asyncio.sleep(0.1)
        self._fed_at = time.monotonic()
        while True:
            self._sync_nodes()
            self._sync_token()
            self._check_stuck()
            await asyncio.sleep(FEED_INTERVAL)

    def _sync_nodes(self) -> None:
        keep = self.node_filter
        wire = [_wire(n) for n in self.inventory.nodes() if keep is None or keep(n)]
        if wire == self._wire:
            return
        self._wire = wire
        now = time.monotonic()
        seen = self._last_success
        # nodes gone are forgotten; a new node counts as missing a resolution after it appeared
        self._last_success = {n[0]: seen.get(n[0], now) for n in wire}
        self.status.retain(self._last_success)
        count = len(self.workers)
        shards: list[list[WireNodeInfo]] = [[] for _ in range(count)]
        for node in wire:
            shards[shard_of(node[0], count)].append(node)
        for w, shard in zip(self.workers, shards, strict=True):
            if shard != w.shard:
                w.shard, w.names = shard, frozenset(n[0] for n in shard)
                if w.running:
                    self._send_nodes(w)

    def _current_token(self) -> str | None:
        source = self.config.token_source
        if source is None or self.config.client_cert_file:
            return None
        return source()

    def _sync_token(self) -> None:
        token = self._current_token()
        if token != self._token:
            self._token = token
            for w in self.workers:
                if w.running:
                    w.send(Token(token))

    def _check_stuck(self) -> None:
        now = time.monotonic()
        limit = 2 * self.resolution + self.timeout
        for w in self.workers:
            if w.running and w.fed_at and now - max(w.last_cycle_started, w.fed_at) > limit:
                log.error(
                    "scrape worker %d (pid %d) started no cycle for %.0fs; killing it", w.index, w.pid, limit
                )
                self._kill(w, "stuck")

    def _kill(self, w: _Worker, reason: str) -> None:
        if not w.running:
            return
        w.running = False
        w.kill_reason = reason
        if w.transport is not None:
            try:
                w.transport.kill()
            except ProcessLookupError:
                pass

    async def _supervise(self, w: _Worker) -> None:
        """Run worker ``w``, restarting it whenever it ends."""
        loop = asyncio.get_running_loop()
        delay = 0.0
        env = _worker_env()
        while True:
            w.finished = asyncio.Event()
            w.kill_reason = ""
            try:
                transport, _ = await loop.subprocess_exec(
                    lambda: _Protocol(self, w),
                    *self.command,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None, env=env,
                )  # fmt: skip
            except OSError as e:
                log.error("cannot start scrape worker %d: %s", w.index, e)
                delay = min(max(1.0, 2 * delay), self.resolution)
                await asyncio.sleep(delay)
                continue
            w.transport, w.stdin = transport, transport.get_pipe_transport(0)  # type: ignore[assignment]
            w.pid = transport.get_pid()
            w.reader = FrameReader(FromWorker, self.max_frame)
            w.spawned = time.monotonic()
            w.running = True
            WORKER_PID.labels(str(w.index)).set(w.pid)
            self._hello(w)
            log.info("scrape worker %d started: pid %d, %d nodes", w.index, w.pid, len(w.shard or ()))
            await w.finished.wait()
            code = transport.get_returncode()
            reason = w.kill_reason or "exited"
            ran = time.monotonic() - w.spawned
            self._close(w)
            self._worker_gone(w)
            RESTARTS.labels(reason).inc()
            # restart at once after a long run; back off while it keeps dying young
            delay = 0.0 if ran > 2 * self.resolution else min(max(1.0, 2 * delay), self.resolution)
            log.warning(
                "scrape worker %d ended (%s, exit code %s) after %.0fs; restarting in %.0fs",
                w.index, reason, code, ran, delay,
            )  # fmt: skip
            await asyncio.sleep(delay)

    def _hello(self, w: _Worker) -> None:
        # the settings, not the token source (a method of the parent's Kubernetes client)
        kubelet = {
            f.name: getattr(self.config, f.name) for f in fields(self.config) if f.name != "token_source"
        }
        w.send(
            Hello(
                w.index,
                len(self.workers),
                kubelet,
                self.config.token_source is not None,
                self._token,
                self.resolution,
                self.timeout,
                self.max_in_flight,
                limits.max_future_skew(),
                logging.getLogger().getEffectiveLevel(),
                self.max_frame,
            )
        )
        w.fed_at = 0.0
        if self._wire is not None:  # else the feeder sends it once the inventory has synced
            self._send_nodes(w)

    def _send_nodes(self, w: _Worker) -> None:
        w.send(Nodes(w.shard or []))
        if not w.fed_at:  # its first node list: from now on it must start cycles
            w.fed_at = time.monotonic()

    # -- what the workers send ---------------------------------------------------------------

    def _received(self, w: _Worker, data: bytes) -> None:
        if not w.running or w.reader is None:
            return  # killed: whatever it still sends is ignored
        try:
            for msg in w.reader.feed(data):
                if type(msg) is Batch:
                    self._batch(w, msg.node_batch())
                elif type(msg) is CycleStart:
                    w.last_cycle_started = self.last_cycle_started = time.monotonic()
                    LAST_CYCLE.set(time.time())
                else:
                    self._cycle_end(w, msg)
        except FrameError as e:
            log.error("scrape worker %d (pid %d): %s; killing it", w.index, w.pid, limits.printable(str(e)))
            self._kill(w, "protocol")

    def _batch(self, w: _Worker, batch: NodeBatch) -> None:
        if batch.node not in w.names:  # a node deleted since, or a worker that misbehaves
            REFUSED_BATCHES.inc()
            return
        if batch.node in self._last_success:
            self._last_success[batch.node] = time.monotonic()
        self.status.success(batch.node)
        try:
            self.sink(batch)
        except Exception:  # a bug in the sink must not stop the other batches of this read
            log.exception("storing the batch of node %s failed", batch.node)

    def _cycle_end(self, w: _Worker, end: CycleEnd) -> None:
        most = max(len(w.names), 1)  # nothing a worker says outweighs its shard
        durations = [d for d in end.durations[:most] if 0.0 <= d < math.inf]
        for d in durations:
            SCRAPE_DURATION.observe(d)
        if durations:
            SCRAPES.labels("success").inc(len(durations))
        failed = [(n, r) for n, r in end.failed[:most] if n in w.names]
        if failed:
            SCRAPES.labels("failure").inc(len(failed))
        for node, reason in failed:
            reason = reason if _LABEL.fullmatch(reason) else "invalid"
            SCRAPE_FAILURES.labels(node, reason).inc()
            self.status.failure(node, reason)
        for reason, count in list(end.rejected.items())[:32]:
            if count > 0 and _LABEL.fullmatch(reason):
                REJECTED.labels(reason).inc(count)
        if end.dropped > 0:
            DROPPED_BATCHES.inc(end.dropped)
        if w.index in self._round:  # another worker is behind: do not hold up the round
            self._finish_round()
        self._round[w.index] = (end.duration if 0.0 <= end.duration < math.inf else 0.0, len(failed))
        self._maybe_finish_round()

    def _worker_gone(self, w: _Worker) -> None:
        self._maybe_finish_round()

    def _maybe_finish_round(self) -> None:
        if self._round and all(w.index in self._round for w in self.workers if w.running):
            self._finish_round()

    def _finish_round(self) -> None:
        seconds = max(d for d, _ in self._round.values())
        failures = sum(f for _, f in self._round.values())
        self._round = {}
        CYCLE_DURATION.observe(seconds)
        self.cycles += 1
        self.last_cycle_seconds = seconds
        self.last_cycle_failures = failures
        MISSING.set(len(self.missing_nodes()))
        if self.on_cycle is not None:
            try:
                self.on_cycle()
            except Exception:
                log.exception("after-cycle work failed")
