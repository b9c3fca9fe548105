"""Quorum writes and reads over store replicas: multi-store and sharded modes.

Every key (the object a series is about; a node for its readings, see :mod:`kcms.store.ring`)
lives on ``n = replicas`` stores (all stores when ``replicas`` is 0). A write succeeds for a key
when ``W`` of its owners acknowledged it; a read asks the owners (all stores for a wildcard or a
list) and needs ``R`` answers per key, merging by the newest timestamp per series. Defaults as in
Katalyst: ``R = ceil(n / 2)``, ``W = n - R + 1``, so ``R + W > n`` and every quorum read meets
every acknowledged write.

Read repair: a replica that answered an older point (or none) for a key it owns gets that key's
raw points copied from the replica that had the newest, in the background, a bounded number of
keys per query.

A read returns once every replica asked has answered, or once the quorum is met and
``grace`` seconds more have passed: a hung replica (SIGSTOP) costs the grace, not the timeout. In
multi-store mode a read asks only R replicas, in turns (as Katalyst reads R), and asks the others
when one of those fails or ``hedge`` (half the timeout) passes; a replica that failed or was slow is
asked last for the next 10 s, so a hung one costs one hedge, not one per read. Any answer from a
replica — to a read (a hedged one too), a write (one finishing in the background too) or a
``/readyz`` probe — lifts that mark at once: a store that restarted is trusted again as soon as it
answers, so a second store hanging soon after costs one hedged read, not one every other read.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
from prometheus_client import Counter

from kcms.model import Labels, NodeBatch, ObjectRef
from kcms.store import wire
from kcms.store.client import StoreClient, StoreError, client_ssl_context, session_limits
from kcms.store.query import readings
from kcms.store.ring import Key, Ring, node_key
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

T = TypeVar("T")

WRITES = Counter("kcms_store_cluster_writes_total", "Quorum writes, by outcome.", ["outcome"])
READS = Counter("kcms_store_cluster_reads_total", "Quorum reads, by kind and outcome.", ["kind", "outcome"])
REPLICA_ERRORS = Counter(
    "kcms_store_replica_errors_total", "Requests to a store replica that failed.", ["store"]
)
REPAIRS = Counter("kcms_store_read_repairs_total", "Keys copied to a replica found behind by a read.")

MAX_REPAIR_KEYS = 256  # per read: repairs must never cost more than the read itself
SUSPECT_SECONDS = 10.0  # a replica that failed or was slow is asked last for this long


class QuorumError(Exception):
    """Too few replicas answered for a quorum."""


def default_quorum(copies: int) -> tuple[int, int]:
    """(R, W) for ``copies`` copies of each key: R = ceil(n/2), W = n - R + 1."""
    read = max(1, math.ceil(copies / 2))
    return read, max(1, copies - read + 1)


@dataclass(slots=True)
class WriteResult:
    acked_nodes: int = 0
    acked_samples: int = 0
    failed_nodes: int = 0
    failed_samples: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed_nodes and not self.failed_samples


@dataclass(slots=True)
class SeriesValue:
    obj: ObjectRef
    labels: Labels
    value: float
    timestamp: float
    window: float | None


Sample = tuple[str, ObjectRef, Labels, float, float]


class StoreCluster:
    """The stores named by ``members`` (a :class:`kcms.kube.members` source: ``members()`` of
    ``Member(name, url)``), addressed as one store. ``tls_name(member name)``: the name a store's
    certificate is checked against (default: the URL's host)."""

    def __init__(
        self,
        members: Any,
        *,
        replicas: int = 0,
        write_quorum: int = 0,
        read_quorum: int = 0,
        token: Callable[[], str | None] = lambda: None,
        ca_file: str | None = None,
        timeout: float = 2.0,
        retries: int = 1,
        grace: float = 0.02,
        hedge: float | None = None,
        tls_name: Callable[[str], str | None] | None = None,
    ) -> None:
        self.source = members
        self.tls_name = tls_name
        self.replicas = replicas
        self._write_quorum = write_quorum
        self._read_quorum = read_quorum
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.grace = grace
        self._ssl = client_ssl_context(ca_file)
        self._session: aiohttp.ClientSession | None = None
        self._clients: dict[str, StoreClient] = {}
        self.ring = Ring([], replicas)
        self._repairing: set[tuple[str, Key]] = set()
        self._tasks: set[asyncio.Task] = set()
        self._metrics_cache: tuple[float, list[tuple[str, str]]] = (0.0, [])
        # a multi-store read asks the spare replicas after this long without a quorum
        self.hedge = timeout / 2 if hedge is None else hedge
        self._suspect: dict[str, float] = {}  # store -> until when it is asked last (it failed lately)
        self._turn = 0

    # ---- membership ----------------------------------------------------------------------------

    def _refresh(self) -> None:
        members = list(self.source.members())
        names = sorted(m.name for m in members)
        if tuple(names) != self.ring.members:
            self.ring = Ring(names, self.replicas)
            log.info("store members: %s", ", ".join(names) or "(none)")
        session = self._get_session()
        wanted = {m.name: m.url for m in members}
        for name in list(self._clients):
            if name not in wanted or self._clients[name].url != wanted[name].rstrip("/"):
                del self._clients[name]
        for name, url in wanted.items():
            if name not in self._clients:
                self._clients[name] = StoreClient(
                    name,
                    url,
                    session,
                    self.token,
                    timeout=self.timeout,
                    retries=self.retries,
                    ssl_context=self._ssl,
                    server_hostname=self.tls_name(name) if self.tls_name is not None else None,
                )

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=32, ttl_dns_cache=30),
                auto_decompress=True,
                **session_limits(),
            )
        return self._session

    @property
    def quorum(self) -> tuple[int, int]:
        """(R, W) in force for the current membership."""
        read, write = default_quorum(self.ring.copies)
        read = min(self._read_quorum or read, max(1, self.ring.copies))
        write = min(self._write_quorum or write, max(1, self.ring.copies))
        return read, write

    def client(self, name: str) -> StoreClient:
        return self._clients[name]

    async def close(self) -> None:
        for task in list(self._tasks):
            await cancel_and_wait(task)
        if self._session is not None:
            await self._session.close()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- fan-out -------------------------------------------------------------------------------

    async def _gather(
        self,
        targets: Sequence[str],
        call: Callable[[StoreClient], Awaitable[T]],
        enough: Callable[[set[str], set[str]], bool] | None = None,
        finish_late: bool = False,
        spare: Sequence[str] = (),
    ) -> tuple[dict[str, T], dict[str, str]]:
        """Call every target; return (answers, errors) once all are in, or once ``enough(answered,
        failed)`` and ``grace`` more seconds passed. The calls still running then are cancelled,
        or, with ``finish_late`` (writes), left to finish in the background within their own
        timeout, so a slow replica still gets the write. ``spare`` targets are called only when a
        target fails or ``hedge`` seconds pass without enough answers (a hedged read)."""
        tasks = {asyncio.ensure_future(call(self._clients[name])): name for name in targets}
        answers: dict[str, T] = {}
        errors: dict[str, str] = {}
        pending = set(tasks)
        deadline = None
        hedge_at = time.monotonic() + self.hedge if spare else None
        try:
            while pending:
                waits = [t for t in (deadline, hedge_at) if t is not None]
                timeout = None if not waits else max(0.0, min(waits) - time.monotonic())
                done, pending = await asyncio.wait(
                    pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    name = tasks[task]
                    exc = task.exception()
                    if exc is None:
                        answers[name] = task.result()
                        self._suspect.pop(name, None)  # it answers again: trust it again
                    else:
                        errors[name] = str(exc)
                        REPLICA_ERRORS.labels(name).inc()
                        self._suspect[name] = time.monotonic() + SUSPECT_SECONDS
                satisfied = enough is not None and enough(set(answers), set(errors))
                if hedge_at is not None and not satisfied and (errors or time.monotonic() >= hedge_at):
                    for name in spare:  # a target failed or is slow: ask the others too
                        task = asyncio.ensure_future(call(self._clients[name]))
                        tasks[task] = name
                        pending.add(task)
                    for task, name in tasks.items():
                        if task in pending and name not in spare:
                            self._suspect[name] = time.monotonic() + SUSPECT_SECONDS
                    hedge_at = None
                    continue
                if not done and (deadline is not None and time.monotonic() >= deadline or hedge_at is None):
                    break
                if deadline is None and satisfied:
                    deadline = time.monotonic() + self.grace
        finally:
            for task in pending:
                errors.setdefault(tasks[task], f"store {tasks[task]}: no answer within the quorum grace")
                if finish_late:
                    self._tasks.add(task)
                    task.add_done_callback(functools.partial(self._late_done, name=tasks[task]))
                else:
                    task.cancel()
            if pending and not finish_late:
                await asyncio.gather(*pending, return_exceptions=True)
        return answers, errors

    def _late_done(self, task: asyncio.Task, name: str) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        if task.exception() is not None:
            REPLICA_ERRORS.labels(name).inc()
        else:  # a slow replica that acknowledged after all is trusted again
            self._suspect.pop(name, None)

    def _covered(self, keys: Iterable[Key] | None, answered: set[str]) -> bool:
        """True when every key (None: any key) has R of its owners among ``answered``."""
        read, _ = self.quorum
        if keys is None:
            missing = len(self.ring.members) - len(answered)
            return len(answered) >= read and missing <= self.ring.copies - read
        return all(sum(o in answered for o in self.ring.owners(k)) >= read for k in keys)

    # ---- writes --------------------------------------------------------------------------------

    async def write(self, nodes: Sequence[NodeBatch] = (), samples: Sequence[Sample] = ()) -> WriteResult:
        """Send node readings and samples to their owners; a key is acknowledged when W owners
        stored it."""
        self._refresh()
        _, write_quorum = self.quorum
        result = WriteResult()
        if not self.ring.members:
            result.failed_nodes, result.failed_samples = len(nodes), len(samples)
            result.errors.append("no store members")
            WRITES.labels("failed").inc()
            return result
        bodies: dict[str, wire.Write] = {}
        groups: dict[tuple[str, ...], list[int]] = {}  # owners -> [nodes, samples]
        if self.ring.everywhere:
            body = wire.Write([wire.node_to_wire(b) for b in nodes], block=wire.block_of_samples(samples))
            bodies = dict.fromkeys(self.ring.members, body)
            groups[self.ring.members] = [len(nodes), len(samples)]
        else:
            for batch in nodes:
                owners = self.ring.owners(node_key(batch.node))
                w = wire.node_to_wire(batch)
                for o in owners:
                    bodies.setdefault(o, wire.Write()).nodes.append(w)
                groups.setdefault(owners, [0, 0])[0] += 1
            # One block for the batch; each store gets the shared tables and its own rows.
            block = wire.block_of_samples(samples)
            strings, owners_of = block.strings, self.ring.owners
            per_store: dict[str, list] = {}
            for row in block.rows:
                owners = owners_of((strings[row[1]], strings[row[2]], strings[row[3]]))
                for o in owners:
                    per_store.setdefault(o, []).append(row)
                groups.setdefault(owners, [0, 0])[1] += 1
            for o, rows in per_store.items():
                bodies.setdefault(o, wire.Write()).block = wire.SampleBlock(block.strings, block.labels, rows)
        encoded: dict[int, bytes] = {}
        for body in bodies.values():  # multi-store: one body for all, encoded once
            if id(body) not in encoded:
                encoded[id(body)] = wire.encode(body)

        def enough(answered: set[str], _failed: set[str]) -> bool:
            return all(sum(o in answered for o in owners) >= write_quorum for owners in groups)

        answers, errors = await self._gather(
            list(bodies), lambda c: c.write_encoded(encoded[id(bodies[c.name])]), enough, finish_late=True
        )
        for owners, (n_nodes, n_samples) in groups.items():
            if sum(o in answers for o in owners) >= write_quorum:
                result.acked_nodes += n_nodes
                result.acked_samples += n_samples
            else:
                result.failed_nodes += n_nodes
                result.failed_samples += n_samples
        result.errors.extend(errors.values())
        WRITES.labels("ok" if result.ok else "failed").inc()
        return result

    # ---- reads ---------------------------------------------------------------------------------

    def _targets(self, keys: list[Key] | None) -> list[str]:
        if keys is None or self.ring.everywhere:
            return list(self.ring.members)
        return sorted({o for k in keys for o in self.ring.owners(k)})

    async def _read(
        self, kind: str, keys: list[Key] | None, call: Callable[[StoreClient], Awaitable[T]]
    ) -> dict[str, T]:
        self._refresh()
        targets = self._targets(keys)
        spare: list[str] = []
        read, _ = self.quorum
        if self.ring.everywhere and len(targets) > read:
            # Multi-store: ask R stores, not all (as Katalyst does), taking turns and passing over
            # the ones that failed lately; the others are asked if one of these fails or is slow.
            self._turn += 1
            now = time.monotonic()
            order = sorted(
                range(len(targets)),
                key=lambda i: (self._suspect.get(targets[i], 0.0) > now, (i - self._turn) % len(targets)),
            )
            spare = [targets[i] for i in order[read:]]
            targets = [targets[i] for i in order[:read]]
        answers, errors = await self._gather(
            targets, call, lambda ok, _failed: self._covered(keys, ok), spare=spare
        )
        if not self._covered(keys, set(answers)):
            READS.labels(kind, "failed").inc()
            read, _ = self.quorum
            raise QuorumError(
                f"read quorum not met: {len(answers)} of {len(targets)} stores answered, {read} needed per key"
                + (f" ({'; '.join(sorted(errors.values()))[:500]})" if errors else "")
            )
        READS.labels(kind, "ok").inc()
        return answers

    async def query_series(
        self,
        resource: str,
        namespace: str,
        names: Collection[str] | None,
        metric: str,
        selector: str = "",
    ) -> list[SeriesValue]:
        """The merged answer of a series query (newest timestamp per series wins)."""
        q = wire.SeriesQuery(resource, namespace, None if names is None else list(names), metric, selector)
        keys = None if names is None else [(resource, namespace, n) for n in names]
        answers = await self._read("series", keys, lambda c: c.query_series(q))
        best: dict[tuple[str, Labels], tuple[Any, str]] = {}
        seen: dict[tuple[str, Labels], dict[str, float]] = {}
        for store, rows in answers.items():
            for row in rows:
                k = (row[0], row[1])
                seen.setdefault(k, {})[store] = row[3]
                old = best.get(k)
                if old is None or row[3] > old[0][3]:
                    best[k] = (row, store)
        order = {n: i for i, n in enumerate(names)} if names is not None else None
        items = sorted(best.values(), key=lambda rs: (order[rs[0][0]], rs[0][1])) if order else best.values()
        out = [SeriesValue(ObjectRef(resource, namespace, r[0]), r[1], r[2], r[3], r[4]) for r, _ in items]
        self._schedule_series_repair(resource, namespace, metric, answers, best, seen)
        return out

    async def query_nodes(self, names: Collection[str] | None) -> dict[str, wire.WireUsage]:
        q = wire.ResourceQuery("nodes", None, None if names is None else list(names))
        keys = None if names is None else [node_key(n) for n in names]
        answers = await self._read("nodes", keys, lambda c: c.query_resource(q))
        best: dict[str, tuple[wire.WireUsage, str]] = {}
        seen: dict[str, dict[str, float]] = {}
        for store, rows in answers.items():
            for name, usage in rows.nodes:
                seen.setdefault(name, {})[store] = usage[0]
                old = best.get(name)
                if old is None or usage[0] > old[0][0]:
                    best[name] = (usage, store)
        self._schedule_node_repair({n: s for n, (_, s) in best.items()}, answers.keys(), seen)
        return {n: u for n, (u, _) in best.items()}

    async def query_pods(
        self, namespace: str | None, names: Collection[str] | None
    ) -> dict[tuple[str, str], tuple[float, float, list[tuple[str, wire.WireUsage]]]]:
        """Pod usage by (namespace, name). Pods are stored with their node, so this asks every store."""
        q = wire.ResourceQuery("pods", namespace, None if names is None else list(names))
        answers = await self._read("pods", None, lambda c: c.query_resource(q))
        best: dict[tuple[str, str], tuple] = {}
        for rows in answers.values():
            for ns, name, _node, ts, window, containers in rows.pods:
                old = best.get((ns, name))
                if old is None or ts > old[0]:
                    best[(ns, name)] = (ts, window, containers)
        return best

    async def metrics(self, max_age: float = 1.0) -> list[tuple[str, str]]:
        """(resource, metric) pairs any store holds (union of the answers), cached ``max_age`` s."""
        at, cached = self._metrics_cache
        if time.monotonic() - at < max_age:
            return cached
        self._refresh()
        answers, _ = await self._gather(list(self.ring.members), lambda c: c.metrics())
        found = sorted({tuple(p) for rows in answers.values() for p in rows})  # type: ignore[misc]
        if answers:
            self._metrics_cache = (time.monotonic(), found)  # type: ignore[assignment]
        return found  # type: ignore[return-value]

    async def ready_members(self) -> list[str]:
        """The members whose ``/readyz`` answers 200. A ready one is trusted again for reads at once;
        one that is not ready (refilling, unreachable) is asked last for a while, as a failed one."""
        self._refresh()

        async def probe(client: StoreClient) -> bool:
            if not await client.ready():
                raise StoreError(client.name, "/readyz: not ready or unreachable")
            return True

        answers, _ = await self._gather(list(self.ring.members), probe)
        return list(answers)

    # ---- read repair ---------------------------------------------------------------------------

    def _schedule_series_repair(self, resource, namespace, metric, answers, best, seen) -> None:
        # every series the name may have read (the literal one, or the counter behind a rate):
        # copying one more series of the same objects is cheaper than missing the one that answered
        series_names = list(dict.fromkeys(q.series for q in readings(metric, 1e9)))
        found = (((resource, namespace, k[0]), source, seen[k]) for k, (_, source) in best.items())
        self._start_repairs(self._behind(found, list(answers)), series_names, series=True)

    def _schedule_node_repair(self, sources: dict[str, str], asked: Iterable[str], seen) -> None:
        found = ((node_key(node), source, seen[node]) for node, source in sources.items())
        self._start_repairs(self._behind(found, list(asked)), None, series=False)

    def _behind(
        self, found: Iterable[tuple[Key, str, dict[str, float]]], asked: list[str]
    ) -> dict[tuple[str, str], set[Key]]:
        """``(behind, source) -> keys`` for owners asked whose newest timestamp of a key (``stamps``:
        store -> timestamp) is older than the source's. Keys every store agrees on, and points newer
        than the timeout (their write may still be on its way), need nothing."""
        todo: dict[tuple[str, str], set[Key]] = {}
        settled = time.time() - self.timeout
        for key, source, stamps in found:
            newest = stamps[source]
            if newest > settled or (len(stamps) == len(asked) and min(stamps.values()) == newest):
                continue
            for store in asked:
                if (
                    store != source
                    and stamps.get(store, -1.0) < newest
                    and self.ring.owns(store, key)
                    and (store, key) not in self._repairing
                ):
                    todo.setdefault((store, source), set()).add(key)
        return todo

    def _start_repairs(
        self, todo: dict[tuple[str, str], set[Key]], metrics: list[str] | None, series: bool
    ) -> None:
        budget = MAX_REPAIR_KEYS
        for (behind, source), keys in todo.items():
            chosen = list(keys)[:budget]
            budget -= len(chosen)
            if not chosen:
                break
            for k in chosen:
                self._repairing.add((behind, k))
            self._spawn(self._repair(behind, source, chosen, metrics, series))

    async def _repair(
        self, behind: str, source: str, keys: list[Key], metrics: list[str] | None, series: bool
    ) -> None:
        try:
            req = wire.ExportRequest(keys=keys, metrics=metrics, resources=not series, series=series)
            data = await self._clients[source].export(req)
            await self._clients[behind].write(data)
            REPAIRS.inc(len(keys))
        except (StoreError, KeyError) as e:
            log.debug("read repair of %d keys on %s failed: %s", len(keys), behind, e)
        finally:
            for k in keys:
                self._repairing.discard((behind, k))
