"""NodeMetricsList and PodMetricsList bodies made of cached JSON byte pieces, sent as they are made.

Listing 150 000 pods by building a dict per pod and serializing the whole list kept the event loop
busy for seconds. Here each item is three byte strings::

    head     ,{"metadata":{"name":"web-1","namespace":"team-a","creationTimestamp":
    created  "2026-05-01T10:00:00Z"                     (the request time, shared by all items)
    body     ,"labels":{"app":"web"}},"timestamp":"...","window":"15s","containers":[...]}

``head`` and the metadata part of ``body`` depend only on the object's metadata and are cached by
the identity of its :class:`~kcms.model.PodInfo` / :class:`~kcms.model.NodeInfo` (the inventories
never change one in place: a changed object is a new one); the usage part depends only on the
readings and is cached by the identity of the store's :class:`~kcms.store.resource.PodUsage`
(the same object until the pod's node is scraped again) or by the usage's values (nodes, whose
usage is computed per call, and pods read from store replicas, a new snapshot per request). A
list is then a loop that filters, looks usage up and appends pieces.

The output is byte for byte what ``orjson.dumps`` of :mod:`.convert`'s dicts gives (same keys,
order, escaping): strings that could need escaping (names, labels, container names) go through
``orjson.dumps``; the rest (timestamps, durations, quantities) are ASCII letters, digits and ``.:-``
(and ``µ``, which orjson writes as UTF-8 too).

The items are produced in chunks of :data:`SLICE`, handing the event loop back between them
once a list has held it :data:`YIELD_AFTER` (the process also scrapes kubelets; see there). A
list of at most :data:`STREAM_BYTES` is joined and sent with a ``Content-Length``; a larger one
is streamed (chunked transfer encoding, gzip when accepted:
:func:`kcms.apiserver.responses.stream_response`), so that rendering overlaps the
socket and no whole 56 MB body is held. The caches are bounded: an entry whose object left the
inventory is dropped by a sweep that runs when the cache has doubled since the last one
(amortized constant work per entry).

The list of every pod is made of per-node blocks of these pieces instead: :mod:`.blocks`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from time import perf_counter
from typing import Any

import orjson
from aiohttp import web

from kcms.apis.metrics.convert import API_VERSION, TimeFormatter, go_duration
from kcms.apiserver.responses import GZIP_RATIO, gzipped_body_response, list_body_response
from kcms.model import Inventory, NodeInfo, PodInfo
from kcms.quantity import format_bytes, format_cpu_nanocores
from kcms.store.usage import PodUsage, Usage
from kcms.tasks import LoopShare

# Items looked at between two checks of whether to hand the event loop back, and the items of one
# chunk of a streamed body (~190 KB of pods): ~1 ms of work from the cache, ~8 ms when every usage
# is new, ~0.3 ms when a selector keeps few of them.
SLICE = 500
# A list hands the event loop back once it has run this long since it last did. Lists yielded
# after every SLICE items before: the HPA's query at 5000 nodes looks at a namespace's 34 420 pods
# for its 3318, so it yielded 68 times, and each yield during a scrape cycle waited for its turn
# to come back: 245-310 ms against 37-46 between cycles (bench/resource_pipeline.py, 29 Nov 09:15);
# by time held, 77-91 ms at the median during cycles against 502-538 (a query every 0.3 s, runs
# alternated).
# The list of every pod (blocks.py) yielded every 500 blocks: ~1.5 ms of work, each yield during
# a 5000-node cycle waiting 5-17 ms (ten a list: 26-170 ms of the list's 65-240 ms in process,
# instrumented runs, 28 Nov).
YIELD_AFTER = 0.005
# ... unless lists have held the loop in such stretches for less than LIST_SHARE of the last
# ~second (LIST_SHARE_WINDOW, decayed): then a list runs on, up to HOLD_MAX, rather than hand back
# a turn it waits 6-19 ms to get again during a 5000-node cycle (the scrapes wait in their sockets
# meanwhile; a cycle takes that much longer). A list of every pod during a cycle needs 40-90 ms of
# work, a share of ~10 % while one comes a second; clients listing in a loop take the share, then
# are sliced as before, so they can take at most that much more of the loop from the scrapes.
LIST_SHARE = 0.25
LIST_SHARE_WINDOW = 1.0
HOLD_MAX = 0.05
LIST_HOLDS = LoopShare(LIST_SHARE, LIST_SHARE_WINDOW)
# A list whose items exceed this many bytes is streamed (chunked) rather than joined and sent.
STREAM_BYTES = 1 << 20
# A sweep runs when the cache holds more than 2x the entries it kept at the last one, plus this.
SWEEP_SLACK = 1000

POD_LIST_HEAD = (
    b'{"kind":"PodMetricsList","apiVersion":"' + API_VERSION.encode() + b'","metadata":{},"items":['
)
_NODE_LIST_HEAD = (
    b'{"kind":"NodeMetricsList","apiVersion":"' + API_VERSION.encode() + b'","metadata":{},"items":['
)

_dumps = orjson.dumps


def cpu_text(nanocores: int) -> str:
    """``format_cpu_nanocores``, with its common case (not a multiple of ten: ``<n>n``) inline."""
    return f"{nanocores}n" if nanocores % 10 else format_cpu_nanocores(nanocores)


def memory_text(n: int) -> str:
    """``format_bytes``, with its common cases inline: not a multiple of 1024 (plain digits), or a
    multiple of 1024 but not of 1024² (``<n>Ki``; working sets are whole pages)."""
    if n % 1024:
        return str(n)
    if n >= 1024 and (n >> 10) % 1024:
        return f"{n >> 10}Ki"
    return format_bytes(n)


def _head(name: str, namespace: str) -> bytes:
    """The start of an item, with the separator before it (removed from a list's first item)."""
    ns = b',"namespace":' + _dumps(namespace) if namespace else b""
    return b',{"metadata":{"name":' + _dumps(name) + ns + b',"creationTimestamp":'


def _meta_tail(labels: dict[str, str]) -> bytes:
    if labels:  # omitted when empty, as ObjectMeta's omitempty does
        return b',"labels":' + _dumps(labels) + b"},"
    return b"},"


class Texts:
    """Memo of the JSON text of container names and of windows, bounded (names come from kubelets)."""

    __slots__ = ("names", "windows")

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.windows: dict[float, str] = {}

    def name(self, name: str) -> str:
        text = self.names.get(name)
        if text is None:
            if len(self.names) > 4096:
                self.names.clear()
            text = self.names[name] = _dumps(name).decode()
        return text

    def window(self, seconds: float) -> str:
        text = self.windows.get(seconds)
        if text is None:
            if len(self.windows) > 4096:
                self.windows.clear()
            text = self.windows[seconds] = go_duration(seconds)
        return text


class UsageText:
    """The JSON text of a pod's usage (``"timestamp":..,"window":..,"containers":[..]}``, the rest
    of a PodMetrics after its metadata), as :func:`kcms.store.resource.pod_rates`'s ``container``
    and ``pod`` callbacks: the list of every pod renders straight from the readings with them, and
    :func:`pod_usage_fragment` from a PodUsage, so both give the same bytes."""

    __slots__ = ("fmt", "name", "window")

    def __init__(self, texts: Texts, fmt: TimeFormatter) -> None:
        self.name = texts.name
        self.window = texts.window
        self.fmt = fmt

    def container(self, name: str, timestamp: float, window: float, nanocores: int, memory: int) -> str:
        return (
            f'{{"name":{self.name(name)},"usage":{{"cpu":"{cpu_text(nanocores)}",'
            f'"memory":"{memory_text(memory)}"}}}}'
        )

    def pod(self, timestamp: float, window: float, containers: list[str]) -> bytes:
        return (
            f'"timestamp":"{self.fmt(timestamp)}","window":"{self.window(window)}",'
            f'"containers":[{",".join(containers)}]}}'
        ).encode()


def pod_usage_fragment(usage: PodUsage, text: UsageText) -> bytes:
    """``"timestamp":..,"window":..,"containers":[..]}`` - the rest of a PodMetrics after its metadata."""
    container = text.container
    return text.pod(
        usage.timestamp,
        usage.window,
        [container(name, u.timestamp, u.window, u.cpu_nanocores, u.memory) for name, u in usage.containers],
    )


def node_usage_fragment(usage: Usage, texts: Texts, fmt: TimeFormatter) -> bytes:
    """``"timestamp":..,"window":..,"usage":{..}}`` - the rest of a NodeMetrics after its metadata."""
    return (
        f'"timestamp":"{fmt(usage.timestamp)}","window":"{texts.window(usage.window)}",'
        f'"usage":{{"cpu":"{cpu_text(usage.cpu_nanocores)}","memory":"{memory_text(usage.memory)}"}}}}'
    ).encode()


async def list_response(request: web.Request, kind: str, chunks: AsyncIterator[bytes]) -> web.StreamResponse:
    """The ``<kind>`` list of the items in ``chunks``: joined and sent when small, streamed when not."""
    head = POD_LIST_HEAD if kind == "PodMetricsList" else _NODE_LIST_HEAD
    return await list_body_response(request, head, chunks, stream_above=STREAM_BYTES)


async def gzipped_list_response(request: web.Request, chunks: AsyncIterator[bytes]) -> web.StreamResponse:
    """A list whose ``chunks`` are one gzip member already, head and tail included
    (:meth:`kcms.apis.metrics.blocks.NodeBlocks.items` with ``gzip_head``)."""
    return await gzipped_body_response(request, chunks, stream_above=STREAM_BYTES // GZIP_RATIO)


class ListTurn:
    """A list's stretch of the event loop since it last handed it back: :meth:`check` hands it
    back once the stretch has run YIELD_AFTER, unless LIST_HOLDS lets it run on (to HOLD_MAX).
    Every list (:meth:`ListRenderer.pods`, :meth:`ListRenderer.nodes`, the list of every pod in
    :meth:`kcms.apis.metrics.blocks.NodeBlocks.items`) keeps its turns with one."""

    __slots__ = ("since",)

    def __init__(self) -> None:
        self.since = perf_counter()

    def begin(self) -> None:
        """A stretch starts here (the list has its turn back after handing a chunk over)."""
        self.since = perf_counter()

    def end(self) -> None:
        """The stretch ends here (the list is done, or hands a chunk over, which may wait)."""
        at = perf_counter()
        LIST_HOLDS.add(at - self.since, at)

    async def check(self) -> None:
        """Hand the loop back (one turn) if the stretch has run long enough; see the class."""
        at = perf_counter()
        held = at - self.since
        if held >= YIELD_AFTER and (held >= HOLD_MAX or not LIST_HOLDS.allows(held, at)):
            LIST_HOLDS.add(held, at)
            await asyncio.sleep(0)
            self.since = perf_counter()


class ListRenderer:
    """Pre-rendered pieces of every listed node and pod, and the list items made of them."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        # id(PodInfo) -> [pod, head, meta tail, usage, body]; the entry holds the PodInfo, so its id
        # cannot be reused by another object while the entry exists.
        self._pods: dict[int, list[Any]] = {}
        # id(NodeInfo) -> [node, head, meta tail, (timestamp, window, cpu, memory), body]
        self._nodes: dict[int, list[Any]] = {}
        self.texts = Texts()
        self._pods_kept = 0
        self._nodes_kept = 0
        self._sweeping = False

    def pod_pieces(self, pod: PodInfo) -> list[Any]:
        """The cache entry of ``pod``: ``[pod, head, meta tail, usage, body]``, made (with no usage
        rendered yet) when absent; its ``head`` and ``meta tail`` are what a node block needs."""
        entry = self._pods.get(id(pod))
        if entry is None:
            entry = self._pods[id(pod)] = [pod, _head(pod.name, pod.namespace), _meta_tail(pod.labels), None, b""]
        return entry

    async def sweep_if_grown(self) -> None:
        """Sweep the pod cache when it has doubled since the last sweep (see the module docstring)."""
        if len(self._pods) > 2 * self._pods_kept + SWEEP_SLACK:
            await self._sweep_pods()

    def cached(self) -> tuple[int, int]:
        """How many pod and node entries the caches hold."""
        return len(self._pods), len(self._nodes)

    async def pods(
        self,
        pods: Iterable[PodInfo],
        usage_of: Callable[..., PodUsage | None],
        now: float,
        keep: Callable[[PodInfo], bool] | None,
        created: str,
        by_value: bool = False,
    ) -> AsyncIterator[bytes]:
        """The items (comma-separated JSON, in chunks of up to :data:`SLICE`) of the Running pods of
        ``pods`` that ``keep`` accepts (all when None) and that have usage (``usage_of(namespace,
        name, now)``). ``by_value``: the usages are new objects on every request (a replica
        snapshot), so a cached rendering is reused when the values are equal."""
        pods = list(pods)  # a snapshot: the inventory may change while this yields
        cache = self._pods
        text = UsageText(self.texts, TimeFormatter())
        created_json = _dumps(created)
        first = True
        turn = ListTurn()
        for start in range(0, len(pods), SLICE):
            if start:
                await turn.check()
            pieces: list[bytes] = []
            append = pieces.append
            for pod in pods[start : start + SLICE]:
                if pod.phase != "Running":
                    continue
                if keep is not None and not keep(pod):
                    continue
                usage = usage_of(pod.namespace, pod.name, now)
                if usage is None:
                    continue
                entry = cache.get(id(pod))
                if entry is None:
                    tail = _meta_tail(pod.labels)
                    body = tail + pod_usage_fragment(usage, text)
                    entry = cache[id(pod)] = [pod, _head(pod.name, pod.namespace), tail, usage, body]
                elif entry[3] is not usage:
                    if not (by_value and entry[3] == usage):
                        entry[4] = entry[2] + pod_usage_fragment(usage, text)
                    entry[3] = usage
                append(entry[1])
                append(created_json)
                append(entry[4])
            if pieces:
                if first:
                    pieces[0] = pieces[0][1:]  # no separator before the first item
                    first = False
                turn.end()
                yield b"".join(pieces)  # written, maybe drained: the loop may run other work meanwhile
                turn.begin()
        turn.end()
        await self.sweep_if_grown()

    async def nodes(
        self,
        nodes: Iterable[NodeInfo],
        usage_of: Callable[..., Usage | None],
        now: float,
        keep: Callable[[NodeInfo], bool] | None,
        created: str,
    ) -> AsyncIterator[bytes]:
        """The items (in chunks) of ``nodes`` that ``keep`` accepts and that have usage."""
        nodes = list(nodes)
        cache = self._nodes
        texts = self.texts
        fmt = TimeFormatter()
        created_json = _dumps(created)
        first = True
        turn = ListTurn()
        for start in range(0, len(nodes), SLICE):
            if start:
                await turn.check()
            pieces: list[bytes] = []
            append = pieces.append
            for node in nodes[start : start + SLICE]:
                if keep is not None and not keep(node):
                    continue
                usage = usage_of(node.name, now)
                if usage is None:
                    continue
                # node_usage computes a new Usage per call: compare the values instead.
                values = (usage.timestamp, usage.window, usage.cpu_nanocores, usage.memory)
                entry = cache.get(id(node))
                if entry is None:
                    tail = _meta_tail(node.labels)
                    body = tail + node_usage_fragment(usage, texts, fmt)
                    entry = cache[id(node)] = [node, _head(node.name, ""), tail, values, body]
                elif entry[3] != values:
                    entry[3] = values
                    entry[4] = entry[2] + node_usage_fragment(usage, texts, fmt)
                append(entry[1])
                append(created_json)
                append(entry[4])
            if pieces:
                if first:
                    pieces[0] = pieces[0][1:]
                    first = False
                turn.end()
                yield b"".join(pieces)
                turn.begin()
        turn.end()
        if len(cache) > 2 * self._nodes_kept + SWEEP_SLACK:
            self._sweep_nodes()

    async def _sweep_pods(self) -> None:
        """Drop the entries of pods the inventory no longer holds (deleted, or replaced by a newer
        object), in slices; concurrent requests may add entries meanwhile."""
        if self._sweeping:
            return
        self._sweeping = True
        try:
            cache = self._pods
            lookup = self.inventory.pod
            items = list(cache.items())
            for start in range(0, len(items), SLICE):
                if start:
                    await asyncio.sleep(0)
                for key, entry in items[start : start + SLICE]:
                    pod = entry[0]
                    if lookup(pod.namespace, pod.name) is not pod and cache.get(key) is entry:
                        del cache[key]
            self._pods_kept = len(cache)
        finally:
            self._sweeping = False

    def _sweep_nodes(self) -> None:
        cache = self._nodes
        lookup = self.inventory.node
        for key, entry in list(cache.items()):
            if lookup(entry[0].name) is not entry[0]:
                del cache[key]
        self._nodes_kept = len(cache)
